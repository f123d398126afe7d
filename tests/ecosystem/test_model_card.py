"""Model cards written from result.json (the Hub's metadata header), `kdbench card`, and
`kdbench push` through huggingface_hub with its HTTP layer replaced by a recording transport."""

from __future__ import annotations

import base64
import json
from pathlib import Path

import pytest
import yaml

from kdbench.cli import main
from kdbench.model_card import model_origin, render_card

MINILM_HUB = "sentence-transformers/all-MiniLM-L6-v2"


def _front_matter(text: str) -> dict:
    assert text.startswith("---\n")
    return yaml.safe_load(text.split("---\n")[1])


def _record(run_dir: Path, **changes) -> dict:
    record = {"schema_version": 1, "status": "completed", "method": "kd", "task": "mrpc", "label": None,
              "teacher": str(run_dir.parent / "teacher" / "model"), "student": "teacher-3l",
              "config": {"method": "kd", "student_init": "teacher", "student_layers": "auto",
                         "method_params": {"alpha": 0.5, "temperature": 2.0}, "data": {"corpus": None}},
              "metrics": {"acc": 75.5, "f1": 83.25}, "student_params": 17_000_000, "teacher_params": 22_700_000,
              "seed": 42, "run_dir": str(run_dir), "stages": [{"name": "kd", "steps": 10, "seconds": 3.5,
                                                             "optimization": {"optimizer": "adamw", "lr": 1e-4}}],
              "data": {"train_rows": 100, "dev_rows": 408}}
    record.update(changes)
    return record


def _fake_teacher_run(runs: Path, minilm_path: Path) -> Path:
    """A teacher made by `kdbench run finetune --student minilm-l6`: a record and a model folder."""
    teacher = runs / "teacher"
    (teacher / "model").mkdir(parents=True)
    (teacher / "result.json").write_text(json.dumps(
        {"schema_version": 1, "status": "completed", "method": "finetune", "task": "mrpc",
         "student": str(minilm_path), "teacher": None, "config": {}, "metrics": {"acc": 80.0}}))
    return teacher


def test_a_distilled_students_card_names_the_teachers_hub_origin_license_data_and_scores(tmp_path, minilm_path):
    runs = tmp_path / "runs"
    _fake_teacher_run(runs, minilm_path)
    run_dir = runs / "kd-mrpc-abc"
    card = render_card(_record(run_dir))
    meta = _front_matter(card)
    # The teacher is a fine-tuned packaged MiniLM: its Hub id and license (from the package's card).
    assert meta["base_model"] == MINILM_HUB and meta["license"] == "apache-2.0"
    assert meta["library_name"] == "transformers" and meta["pipeline_tag"] == "text-classification"
    assert {"knowledge-distillation", "kd", "kdbench"} <= set(meta["tags"])
    assert meta["datasets"] == ["nyu-mll/glue"] and meta["metrics"] == ["accuracy", "f1"]
    (index,) = meta["model-index"]
    assert index["name"] == "kd-mrpc-abc"
    scores = {m["type"]: m["value"] for result in index["results"] for m in result["metrics"]}
    assert scores == {"accuracy": 75.5, "f1": 83.25}
    dataset = index["results"][0]["dataset"]
    assert (dataset["type"], dataset["config"], dataset["split"]) == ("nyu-mll/glue", "mrpc", "validation")
    assert "75.50" in card and "83.25" in card and "(75% of the teacher's 22.7M)" in card
    assert "temperature 2.0" in card


def test_the_card_header_is_what_the_hub_reads(tmp_path, minilm_path):
    from huggingface_hub import ModelCard

    _fake_teacher_run(tmp_path / "runs", minilm_path)
    card = ModelCard(render_card(_record(tmp_path / "runs" / "kd-mrpc-abc")))
    assert card.data.base_model == MINILM_HUB
    assert [r.metric_value for r in card.data.eval_results] == [75.5, 83.25]


def test_model_origins():
    assert model_origin("bert-base-uncased") == {"hub_id": "bert-base-uncased"}
    assert model_origin("teacher-3l") == {}  # a preset shape, not a model
    assert model_origin("minilm-l6")["hub_id"] == MINILM_HUB


def test_a_hub_cache_folder_is_its_hub_id(tmp_path):
    snapshot = tmp_path / "hub" / "models--google--bert_uncased_L-2_H-128_A-2" / "snapshots" / "abc"
    snapshot.mkdir(parents=True)
    (snapshot / "README.md").write_text("---\nlicense: apache-2.0\n---\n# BERT mini\n")
    assert model_origin(str(snapshot)) == {"hub_id": "google/bert_uncased_L-2_H-128_A-2", "license": "apache-2.0"}


def test_a_failed_run_gets_no_card(tmp_path):
    from kdbench.model_card import CardError

    with pytest.raises(CardError, match="'failed', not completed"):
        render_card(_record(tmp_path / "x", status="failed"))


def _write_run(runs: Path, minilm_path: Path, **changes) -> Path:
    _fake_teacher_run(runs, minilm_path) if not (runs / "teacher").exists() else None
    run_dir = runs / "kd-mrpc-abc"
    (run_dir / "model").mkdir(parents=True)
    (run_dir / "model" / "config.json").write_text("{}")
    (run_dir / "model" / "model.safetensors").write_bytes(b"\0" * 64)
    (run_dir / "result.json").write_text(json.dumps(_record(run_dir, **changes)))
    return run_dir


def test_kdbench_card_rewrites_the_cards_of_existing_runs(tmp_path, minilm_path, capsys):
    runs = tmp_path / "runs"
    run_dir = _write_run(runs, minilm_path)
    failed = runs / "kd-failed"
    failed.mkdir()
    (failed / "result.json").write_text(json.dumps(_record(failed, status="failed", error="ValueError: boom")))
    assert main(["card", str(runs)]) == 0
    out = capsys.readouterr()
    assert out.out.split() == [str(run_dir / "model" / "README.md"), str(runs / "teacher" / "model" / "README.md")]
    assert f"skipped {failed} (failed: ValueError: boom)" in out.err  # said, not dropped
    assert _front_matter((run_dir / "model" / "README.md").read_text())["base_model"] == MINILM_HUB
    # The teacher, a fine-tuning of the packaged MiniLM, names it as its base model too.
    assert _front_matter((runs / "teacher" / "model" / "README.md").read_text())["base_model"] == MINILM_HUB
    assert main(["card", str(tmp_path / "nowhere")]) == 2


class RecordingHub:
    """Stands in for huggingface.co at the HTTP layer: answers the calls create_repo and
    upload_folder make and keeps every request."""

    def __init__(self):
        self.requests = []

    def __call__(self, request):
        import httpx2

        self.requests.append(request)
        path = request.url.path
        if path == "/api/repos/create":
            return httpx2.Response(200, json={"url": "https://huggingface.co/someone/tiny-kd", "name": "tiny-kd"})
        if path == "/api/validate-yaml":  # upload_folder has the Hub check a README.md's metadata first
            return httpx2.Response(200, json={"errors": [], "warnings": []})
        if "/preupload/" in path:
            files = json.loads(request.content)["files"]
            return httpx2.Response(200, json={"files": [{"path": f["path"], "uploadMode": "regular",
                                                          "shouldIgnore": False} for f in files]})
        if "/commit/" in path:
            return httpx2.Response(200, json={"commitUrl": "https://huggingface.co/someone/tiny-kd/commit/abc123",
                                              "commitOid": "abc123", "pullRequestUrl": None})
        return httpx2.Response(404, json={"error": f"unexpected {request.method} {path}"})


@pytest.fixture
def recording_hub(monkeypatch):
    import httpx2
    from huggingface_hub import constants, set_client_factory

    hub = RecordingHub()
    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", False)
    set_client_factory(lambda: httpx2.Client(transport=httpx2.MockTransport(hub)))
    yield hub
    from huggingface_hub.utils._http import default_client_factory

    set_client_factory(default_client_factory)


def test_push_creates_the_repo_and_commits_the_model_folder_with_its_card(tmp_path, minilm_path, recording_hub,
                                                                           capsys):
    run_dir = _write_run(tmp_path / "runs", minilm_path)
    code = main(["push", str(run_dir), "--repo-id", "someone/tiny-kd", "--token", "hf_test", "--private"])
    assert code == 0
    assert capsys.readouterr().out.strip() == "https://huggingface.co/someone/tiny-kd/commit/abc123"
    paths = [r.url.path for r in recording_hub.requests]
    assert paths.index("/api/repos/create") < paths.index("/api/models/someone/tiny-kd/commit/main")
    (create,) = [r for r in recording_hub.requests if r.url.path == "/api/repos/create"]
    body = json.loads(create.content)
    assert (body["name"], body["organization"]) == ("tiny-kd", "someone")
    assert body.get("visibility") == "private" or body.get("private") is True
    assert create.headers["authorization"] == "Bearer hf_test"
    (commit,) = [r for r in recording_hub.requests if "/commit/" in r.url.path]
    assert commit.url.path == "/api/models/someone/tiny-kd/commit/main"
    lines = [json.loads(line) for line in commit.content.decode().splitlines()]
    files = {line["value"]["path"]: base64.b64decode(line["value"]["content"])
             for line in lines if line["key"] == "file"}
    assert set(files) == {"README.md", "config.json", "model.safetensors"}
    assert files["model.safetensors"] == b"\0" * 64
    card = files["README.md"].decode()
    assert _front_matter(card)["base_model"] == MINILM_HUB
    assert "model='someone/tiny-kd'" in card  # the usage snippet names the repo
    (validate,) = [r for r in recording_hub.requests if r.url.path == "/api/validate-yaml"]
    assert json.loads(validate.content)["content"] == card


def test_push_refuses_bad_input_before_any_request(tmp_path, minilm_path, recording_hub, capsys):
    run_dir = _write_run(tmp_path / "runs", minilm_path, status="failed", error="boom")
    assert main(["push", str(run_dir), "--repo-id", "someone/tiny-kd"]) == 2
    assert "not completed" in capsys.readouterr().err
    assert main(["push", str(tmp_path), "--repo-id", "someone/tiny-kd"]) == 2
    assert main(["push", str(run_dir), "--repo-id", "no-namespace"]) == 2
    assert recording_hub.requests == []


def test_push_with_the_hub_offline_says_so(tmp_path, minilm_path, monkeypatch, capsys):
    from huggingface_hub import constants

    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", True)
    run_dir = _write_run(tmp_path / "runs", minilm_path)
    assert main(["push", str(run_dir), "--repo-id", "someone/tiny-kd"]) == 2
    assert "HF_HUB_OFFLINE=1" in capsys.readouterr().err
