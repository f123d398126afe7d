"""report_to: runs reach TensorBoard (read back from the event files), W&B (offline) and MLflow
(file store) with their loss terms, learning rates, dev metrics, config and result."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from kdbench.config import ConfigError, build_run_config
from kdbench.tracking import REPORT_TARGETS, report_targets

BASE = {"method": "kd", "task": "sst2", "student": "teacher-1l", "output": "runs"}


def test_the_known_trackers_are_transformers_integrations():
    from transformers.integrations.integration_utils import INTEGRATION_TO_CALLBACK

    assert set(REPORT_TARGETS) == set(INTEGRATION_TO_CALLBACK)


def test_report_to_takes_none_a_list_or_commas_and_names_a_bad_tracker():
    assert report_targets("none") == [] and report_targets(None) == []
    assert report_targets("tensorboard") == ["tensorboard"]
    assert report_targets(" tensorboard ,tensorboard") == ["tensorboard"]
    assert build_run_config({**BASE, "report_to": "[tensorboard]"}).train.report_to == ["tensorboard"]
    with pytest.raises(ConfigError, match=r"train.report_to: unknown tracker 'tensorbord'; did you mean 'tensorboard'"):
        build_run_config({**BASE, "report_to": "tensorbord"})
    missing = next((name for name in ("neptune", "comet_ml", "swanlab", "dvclive") if
                    not __import__("importlib.util").util.find_spec(REPORT_TARGETS[name][0])), None)
    if missing:
        with pytest.raises(ConfigError, match=rf"tracker '{missing}' is not installed \(pip install "):
            build_run_config({**BASE, "report_to": missing})


def test_report_to_does_not_change_a_runs_identity():
    plain = build_run_config(BASE)
    tracked = build_run_config({**BASE, "report_to": "tensorboard"})
    assert tracked.train.report_to == "tensorboard"
    assert plain.config_hash() == tracked.config_hash()


def _tiny_run(tiny_teacher: Path, shared_data: Path, output: Path, report_to: str) -> Path:
    from tiny_models import TINY_RUN

    from kdbench.engine import run_experiment

    config = build_run_config({**BASE, "teacher": str(tiny_teacher), "output": str(output),
                               "data_dir": str(shared_data), "report_to": report_to, **TINY_RUN})
    return run_experiment(config)


def _trainer_log(run_dir: Path) -> list[dict]:
    states = sorted((run_dir / "stages").glob("0-*/checkpoint-*/trainer_state.json"),
                    key=lambda p: int(p.parent.name.split("-")[1]))
    return json.loads(states[-1].read_text())["log_history"]


def test_tensorboard_event_files_read_back_with_every_loss_term_the_lr_and_dev_metrics(
        tiny_teacher, shared_data, tmp_path):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    run_dir = _tiny_run(tiny_teacher, shared_data, tmp_path / "runs", "tensorboard")
    record = json.loads((run_dir / "result.json").read_text())
    events = EventAccumulator(str(run_dir / "tensorboard" / "0-kd"))
    events.Reload()
    scalars = {tag: {e.step: e.value for e in events.Scalars(tag)} for tag in events.Tags()["scalars"]}
    terms = set(record["stages"][0]["final_loss_terms"])
    assert terms == {"ce", "kd"}
    assert {"train/loss", "train/learning_rate", "eval/acc", *(f"train/loss/{t}" for t in terms)} <= set(scalars)
    # The event files hold what the Trainer logged, step for step.
    for entry in _trainer_log(run_dir):
        if "loss" in entry:
            assert scalars["train/loss"][entry["step"]] == pytest.approx(entry["loss"], rel=1e-6)
            assert scalars["train/learning_rate"][entry["step"]] == pytest.approx(entry["learning_rate"], rel=1e-6)
            for term in terms:
                assert scalars[f"train/loss/{term}"][entry["step"]] == pytest.approx(entry[f"loss/{term}"], rel=1e-6)
        if "eval_acc" in entry:
            assert scalars["eval/acc"][entry["step"]] == pytest.approx(entry["eval_acc"], rel=1e-6)
    assert sorted(scalars["train/loss"]) == [2, 4]  # logging_steps=2, max_steps=4
    assert not any(tag.endswith("stage") for tag in events.Tags()["tensors"])  # the stage's name is the folder

    result = EventAccumulator(str(run_dir / "tensorboard" / "result"))
    result.Reload()
    assert result.Scalars("result/acc")[0].value == pytest.approx(record["metrics"]["acc"])
    assert result.Scalars("result/student_params")[0].value == record["student_params"]
    assert "config/text_summary" in result.Tags()["tensors"]
    hparams = result.PluginTagToContent("hparams")
    assert "_hparams_/session_start_info" in hparams
    assert b"method_params.temperature" in hparams["_hparams_/session_start_info"]


def test_without_report_to_no_tracker_files_are_written(tiny_teacher, shared_data, tmp_path):
    run_dir = _tiny_run(tiny_teacher, shared_data, tmp_path / "runs", "none")
    assert not (run_dir / "tensorboard").exists()
    assert not list(run_dir.rglob("events.out.tfevents*"))


def _wandb_records(path: Path) -> list:
    """The records of a W&B offline run file (``run-*.wandb``): a 7-byte header, then LevelDB-log
    framed chunks (crc32, length, type: 1 full, 2 first, 3 middle, 4 last) in 32 KiB blocks."""
    import struct

    from wandb.proto import wandb_internal_pb2

    raw, block, position, pending, records = path.read_bytes(), 32768, 7, b"", []
    assert raw[:4] == b":W&B"
    while position + 7 <= len(raw):
        if block - position % block < 7:  # a block's tail too short for a header is padding
            position += block - position % block
            continue
        _, length, kind = struct.unpack("<IHB", raw[position:position + 7])
        chunk = raw[position + 7:position + 7 + length]
        position += 7 + length
        if kind == 0:
            break
        pending = chunk if kind in (1, 2) else pending + chunk
        if kind in (1, 4):
            record = wandb_internal_pb2.Record()
            record.ParseFromString(pending)
            records.append(record)
    return records


def _items(items) -> dict:
    return {item.key or "/".join(item.nested_key): json.loads(item.value_json) for item in items}


def test_wandb_offline_run_gets_loss_terms_and_the_result_summary(tiny_teacher, shared_data, tmp_path, monkeypatch):
    pytest.importorskip("wandb")
    monkeypatch.setenv("WANDB_MODE", "offline")
    monkeypatch.setenv("WANDB_SILENT", "true")
    run_dir = _tiny_run(tiny_teacher, shared_data, tmp_path / "runs", "wandb")
    record = json.loads((run_dir / "result.json").read_text())
    (log_file,) = (run_dir / "wandb").glob("offline-run-*/run-*.wandb")
    records = _wandb_records(log_file)
    (run,) = [r.run for r in records if r.WhichOneof("record_type") == "run"]
    config = _items(run.config.update)
    assert config["method_params.temperature"] == {"value": 2.0} or config["method_params.temperature"] == 2.0
    history = [_items(r.history.item) for r in records if r.WhichOneof("record_type") == "history"]
    logged = {entry["train/global_step"]: entry for entry in history if "train/loss/kd" in entry}
    for entry in _trainer_log(run_dir):
        if "loss" in entry:
            assert logged[entry["step"]]["train/loss/kd"] == pytest.approx(entry["loss/kd"], rel=1e-6)
            assert logged[entry["step"]]["train/loss/ce"] == pytest.approx(entry["loss/ce"], rel=1e-6)
    assert sorted(logged) == [2, 4]
    assert any("eval/acc" in entry for entry in history)
    summary = {}
    for r in records:
        if r.WhichOneof("record_type") == "summary":
            summary.update(_items(r.summary.update))
    assert summary["result/acc"] == pytest.approx(record["metrics"]["acc"])
    assert any(r.WhichOneof("record_type") == "exit" and r.exit.exit_code == 0 for r in records)


def test_mlflow_store_gets_the_config_a_nested_run_per_stage_and_the_result(
        tiny_teacher, shared_data, tmp_path, monkeypatch):
    mlflow = pytest.importorskip("mlflow")
    pytest.importorskip("sqlalchemy")
    # A local SQLite store: MLflow 3's plain-folder store is in maintenance mode (refused unless
    # MLFLOW_ALLOW_FILE_STORE=true) and keeps each metric in a file named after it, so it cannot hold
    # ``loss`` beside ``loss/<term>``.
    store = f"sqlite:///{tmp_path / 'mlflow.db'}"
    monkeypatch.setenv("MLFLOW_TRACKING_URI", store)
    mlflow.set_tracking_uri(store)
    run_dir = _tiny_run(tiny_teacher, shared_data, tmp_path / "runs", "mlflow")
    record = json.loads((run_dir / "result.json").read_text())
    client = mlflow.tracking.MlflowClient(store)
    runs = client.search_runs([e.experiment_id for e in client.search_experiments()])
    (parent,) = [r for r in runs if r.info.run_name == run_dir.name]
    (stage,) = [r for r in runs if r.info.run_name == f"{run_dir.name}/0-kd"]
    assert stage.data.tags["mlflow.parentRunId"] == parent.info.run_id
    assert parent.data.params["method_params.temperature"] == "2.0"
    assert parent.data.metrics["result.acc"] == pytest.approx(record["metrics"]["acc"])
    history = client.get_metric_history(stage.info.run_id, "loss/kd")
    assert [m.step for m in history] == [2, 4]
    assert "eval_acc" in stage.data.metrics
    assert parent.info.status == stage.info.status == "FINISHED"
