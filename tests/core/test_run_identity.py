"""A run's identity is its content, not its spelling (issue: trustworthy numbers, §1).

Each case reproduces what a user saw go wrong, on real files: a changed data directory, a training
file rewritten by ``kdbench augment``, one teacher folder written three ways, a teacher retrained in
place, and relative paths stored where they break from another folder.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pytest
import torch
from transformers import AutoTokenizer, BertConfig, BertForMaskedLM

from kdbench.cli import main
from kdbench.config import build_run_config, load_yaml
from kdbench.engine import plan_run
from kdbench.fingerprint import file_digest
from tiny_models import TINY_RUN

FAST = [f"{key}={value}" for key, value in {**TINY_RUN, "max_steps": 2, "eval_steps": 2}.items()]


def _sst2_copy(shared_data: Path, root: Path, rows: int, offset: int = 0) -> Path:
    """A data dir with the real SST-2 files cut to ``rows`` training rows (starting at ``offset``)."""
    source = shared_data / "glue_data" / "SST-2"
    target = root / "glue_data" / "SST-2"
    target.mkdir(parents=True)
    lines = (source / "train.tsv").read_text(encoding="utf-8").splitlines()
    (target / "train.tsv").write_text("\n".join([lines[0], *lines[1 + offset:1 + offset + rows]]) + "\n")
    shutil.copy(source / "dev.tsv", target / "dev.tsv")
    return root


def _run(args: list[str], capsys) -> tuple[Path, dict]:
    assert main(args) == 0
    run_dir = Path(capsys.readouterr().out.strip().splitlines()[-1])
    return run_dir, json.loads((run_dir / "result.json").read_text())


def test_changed_data_dir_makes_a_new_run_and_is_recorded(tiny_teacher, shared_data, tmp_path, monkeypatch, capsys):
    first = _sst2_copy(shared_data, tmp_path / "data-a", rows=40)
    second = _sst2_copy(shared_data, tmp_path / "data-b", rows=40, offset=500)
    base = ["run", "finetune", "--task", "sst2", "--student", str(tiny_teacher), "--output", str(tmp_path / "runs"),
            *FAST]
    monkeypatch.setenv("KDBENCH_DATA_DIR", str(first))
    run_a, record_a = _run(base, capsys)
    monkeypatch.setenv("KDBENCH_DATA_DIR", str(second))
    run_b, record_b = _run(base, capsys)
    assert run_a != run_b  # the second data set trains a new run instead of returning the old score
    assert record_a["config"]["data"]["data_dir"] == str(first.resolve())
    assert record_b["config"]["data"]["data_dir"] == str(second.resolve())
    train_a = next(d for d in record_a["inputs"]["data"] if d["path"].endswith("train.tsv"))
    assert train_a == file_digest(first / "glue_data" / "SST-2" / "train.tsv").as_dict()
    assert train_a["size"] == (first / "glue_data" / "SST-2" / "train.tsv").stat().st_size
    # The same data dir given on the command line instead of the environment is the same run.
    monkeypatch.delenv("KDBENCH_DATA_DIR")
    run_again, _ = _run([*base, "--data-dir", str(first)], capsys)
    assert run_again == run_a


def test_a_reaugmented_train_file_makes_a_new_run(tiny_teacher, shared_data, minilm_path, tmp_path):
    from kdbench.augment_cli import augment_task_file

    tokenizer = AutoTokenizer.from_pretrained(minilm_path)
    torch.manual_seed(0)
    mlm_dir = tmp_path / "mlm"
    BertForMaskedLM(BertConfig(vocab_size=len(tokenizer), hidden_size=32, num_hidden_layers=1, num_attention_heads=4,
                               intermediate_size=37, max_position_embeddings=128)).save_pretrained(mlm_dir)
    tokenizer.save_pretrained(mlm_dir)
    glove = tmp_path / "glove.txt"
    rng = np.random.default_rng(0)
    glove.write_text("".join(f"{w} {' '.join(f'{x:.3f}' for x in rng.normal(size=8))}\n"
                             for w in ("movie", "film", "great", "bad", "story", "dull", "fun")))
    train_file = tmp_path / "sst2_aug.tsv"

    def augment(seed: int) -> None:
        augment_task_file("sst2", mlm_model=str(mlm_dir), out=train_file, glove=str(glove),
                          data_dir=str(shared_data), max_samples=4, n_aug=3, top_k=3, seed=seed,
                          cache_dir=tmp_path / "cache")

    values = {"method": "finetune", "task": "sst2", "student": str(tiny_teacher), "train_file": str(train_file),
              "output": str(tmp_path / "runs"), **TINY_RUN}
    augment(seed=1)
    before = plan_run(build_run_config(values))
    augment(seed=2)  # same file name, new content
    after = plan_run(build_run_config(values))
    assert file_digest(train_file).sha256 != before.inputs["data"][0]["sha256"]
    assert before.run_dir != after.run_dir
    assert after.inputs["data"][0] == file_digest(train_file).as_dict()
    # Rewriting the same content (a new mtime) keeps the run.
    content = train_file.read_bytes()
    train_file.write_bytes(content)
    assert plan_run(build_run_config(values)).run_dir == after.run_dir


def test_one_teacher_spelled_three_ways_is_one_run(tiny_teacher, shared_data, tmp_path, monkeypatch):
    monkeypatch.chdir(tiny_teacher.parent)
    spellings = [str(tiny_teacher), tiny_teacher.name, f"./{tiny_teacher.name}/", f"{tiny_teacher}/"]
    plans = [plan_run(build_run_config({"method": "kd", "task": "sst2", "teacher": teacher, "student": "teacher-1l",
                                        "output": "runs", "data_dir": str(shared_data)}))
             for teacher in spellings]
    assert len({plan.run_dir for plan in plans}) == 1
    assert {plan.config.teacher for plan in plans} == {str(tiny_teacher.resolve())}
    assert plans[0].run_dir.is_absolute()


def test_a_teacher_retrained_in_place_makes_a_new_run(tiny_teacher, shared_data, tmp_path):
    teacher = tmp_path / "teacher"
    shutil.copytree(tiny_teacher, teacher)
    values = {"method": "kd", "task": "sst2", "teacher": str(teacher), "student": "teacher-1l",
              "output": str(tmp_path / "runs"), "data_dir": str(shared_data)}
    before = plan_run(build_run_config(values))
    model = __import__("transformers").AutoModelForSequenceClassification.from_pretrained(teacher)
    with torch.no_grad():
        model.classifier.bias.add_(1.0)
    model.save_pretrained(teacher)  # same folder, new weights
    after = plan_run(build_run_config(values))
    assert before.inputs["teacher"]["sha256"] != after.inputs["teacher"]["sha256"]
    assert before.run_dir != after.run_dir


def test_a_student_from_a_kdbench_run_is_identified_by_that_run(tmp_path):
    """A sweep names the model of a cell that is not trained yet: its run folder's hash stands for it."""
    upstream = tmp_path / "runs" / "finetune-sst2-0123456789ab" / "model"
    plan = plan_run(build_run_config({"method": "finetune", "task": "sst2", "student": str(upstream),
                                      "output": str(tmp_path / "runs")}))
    assert plan.inputs["student"] == {"kdbench_run": "finetune-sst2-0123456789ab"}


@pytest.mark.parametrize(("asked", "cuda", "bf16", "expected"), [
    ("auto", False, False, "fp32"), ("auto", True, True, "bf16"), ("auto", True, False, "fp32"),
    ("fp16", True, True, "fp16"), ("fp32", True, True, "fp32")])
def test_auto_precision_is_bf16_on_a_gpu_that_has_it_and_fp32_elsewhere(monkeypatch, asked, cuda, bf16, expected):
    from kdbench.engine import resolved_precision

    monkeypatch.setattr(torch.cuda, "is_available", lambda: cuda)
    monkeypatch.setattr(torch.cuda, "is_bf16_supported", lambda *args, **kwargs: bf16)
    config = build_run_config({"method": "kd", "task": "sst2", "teacher": "t", "student": "teacher-1l",
                               "precision": asked})
    assert resolved_precision(config) == expected


def test_stored_and_printed_paths_are_absolute(tiny_teacher, shared_data, tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    shutil.copytree(tiny_teacher, tmp_path / "teacher")
    shutil.copytree(shared_data / "glue_data" / "SST-2", tmp_path / "data" / "glue_data" / "SST-2")
    run_dir, record = _run(["run", "kd", "--task", "sst2", "--teacher", "teacher/", "--student", "teacher-1l",
                            "--data-dir", "data", "--output", "runs", *FAST], capsys)
    assert run_dir.is_absolute() and run_dir.parent == (tmp_path / "runs").resolve()
    saved = load_yaml(run_dir / "config.yaml")
    assert saved["teacher"] == str((tmp_path / "teacher").resolve())
    assert saved["data"]["data_dir"] == str((tmp_path / "data").resolve())
    assert record["config"]["output"] == str((tmp_path / "runs").resolve())
    # From another folder, the stored config still names the same inputs: the same run, not a new one.
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    monkeypatch.chdir(elsewhere)
    assert plan_run(build_run_config(saved)).run_dir == run_dir
    assert record["kdbench_revision"].keys() == {"commit", "dirty"}
    # what a bit-identical rerun also needs: the processor's kernels and the thread count
    import torch

    assert record["machine"]["cpu_capability"] == torch.backends.cpu.get_cpu_capability()
    assert record["machine"]["torch_threads"] == torch.get_num_threads()
    gpu = torch.cuda.get_device_name(0) if torch.cuda.is_available() else None
    assert record["machine"]["cpu"] and record["machine"]["gpu"] == gpu
    # and where it trained, in which precision (FAST asks for fp32)
    assert record["training"] == {"device": "cuda:0" if torch.cuda.is_available() else "cpu", "precision": "fp32"}


@pytest.mark.parametrize("name", ["bert-base-uncased", "teacher-3l"])
def test_hub_ids_and_presets_are_identified_by_name(name, tmp_path, monkeypatch):
    from kdbench.fingerprint import model_fingerprint

    monkeypatch.chdir(tmp_path)
    assert model_fingerprint(name) == {"name": name}


def test_a_record_stores_the_digest_of_the_weights_it_read_and_wrote(tiny_teacher, shared_data, tmp_path, capsys):
    """A teacher that is a kdbench run is named by its folder; the record also says which weights were in it."""
    from kdbench.fingerprint import content_digest

    run_dir, record = _run(["run", "kd", "--task", "sst2", "--teacher", str(tiny_teacher), "--student", "teacher-1l",
                            "--output", str(tmp_path / "runs"), "--data-dir", str(shared_data), *FAST], capsys)
    digests = record["weights_sha256"]
    assert digests["teacher"] == content_digest(tiny_teacher)["sha256"]
    assert digests["model"] == content_digest(run_dir / "model")["sha256"] != digests["teacher"]
    assert "student" not in digests  # a preset, not a folder


def test_revision_is_dirty_only_when_the_code_changed(tmp_path):
    """A study exports records and re-renders tables inside its checkout; that must not mark its
    runs as made by uncommitted code, while an edit to a method must."""
    import subprocess

    from kdbench.records import kdbench_revision

    def git(*args: str) -> str:
        return subprocess.run(["git", "-C", str(tmp_path), *args], check=True, capture_output=True,
                              text=True).stdout.strip()

    (tmp_path / "methods").mkdir()
    (tmp_path / "results").mkdir()
    (tmp_path / "methods" / "kd.py").write_text("T = 2.0\n")
    (tmp_path / "results" / "table.md").write_text("| a |\n")
    git("init", "-q")
    git("add", ".")
    git("-c", "user.name=t", "-c", "user.email=t@t", "commit", "-q", "-m", "start")
    head = git("rev-parse", "HEAD")
    assert kdbench_revision(tmp_path) == {"commit": head, "dirty": False}

    (tmp_path / "results" / "table.md").write_text("| b |\n")
    (tmp_path / "results" / "new-record.json").write_text("{}\n")
    assert kdbench_revision(tmp_path) == {"commit": head, "dirty": False}

    (tmp_path / "methods" / "kd.py").write_text("T = 4.0\n")
    assert kdbench_revision(tmp_path) == {"commit": head, "dirty": True}


def test_revision_names_method_code_imported_from_another_checkout(tmp_path, monkeypatch):
    """A second checkout's kdbench/ first on PYTHONPATH, beside an editable install of the first:
    the engine is the second's commit, the methods and tasks the first's working tree."""
    import importlib.util
    from types import SimpleNamespace

    from kdbench import records

    root = Path(records.__file__).resolve().parent.parent
    assert records.code_imported_from_elsewhere(root) == []  # this checkout: everything from it
    assert records.kdbench_revision().get("code_from") is None
    other = tmp_path / "other-checkout"
    real_find_spec = importlib.util.find_spec

    def find_spec(name, *args):
        if name == "kdbench.methods":
            return SimpleNamespace(submodule_search_locations=[str(other / "methods")])
        return real_find_spec(name, *args)

    monkeypatch.setattr(importlib.util, "find_spec", find_spec)
    assert records.code_imported_from_elsewhere(root) == [str(other.resolve())]
    revision = records.kdbench_revision()
    if revision["commit"] is not None:  # a source checkout (CI's is one)
        assert revision["dirty"] is True and revision["code_from"] == [str(other.resolve())]


def test_revision_outside_a_checkout_names_no_commit(tmp_path):
    from kdbench.records import kdbench_revision

    assert kdbench_revision(tmp_path) == {"commit": None, "dirty": None}


def test_dataloader_workers_change_the_speed_not_the_run(tiny_teacher, shared_data, tmp_path, capsys):
    """Batches read and padded in worker processes train the same weights (dropout included) into the
    same run folder, which every record written before the option left the identity still names."""
    base = ["run", "kd", "--task", "sst2", "--teacher", str(tiny_teacher), "--student", "teacher-1l",
            "--data-dir", str(shared_data), *FAST]
    main_process, record = _run([*base, "--output", str(tmp_path / "a")], capsys)
    workers, record_workers = _run([*base, "--output", str(tmp_path / "b"), "train.dataloader_workers=2"], capsys)
    assert record_workers["config"]["train"]["dataloader_workers"] == 2
    assert workers.name == main_process.name
    assert record_workers["weights_sha256"]["model"] == record["weights_sha256"]["model"]
    assert record_workers["metrics"] == record["metrics"]
    # The identity holds the value the records hashed, so their names do not move.
    config = build_run_config({"method": "kd", "task": "sst2", "student": "s", "train.dataloader_workers": 3})
    assert config.identity()["train"]["dataloader_workers"] == 0
