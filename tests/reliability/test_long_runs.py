"""Long runs: the run folder's log and per-step loss terms, checkpoints on a time interval and only
the last one kept, a truncated checkpoint falling back to the earlier one, Ctrl-C recorded as
``interrupted`` (not a failure), input errors on an existing run folder hidden from ``results``,
disk use reported and pruned, files readable by the group, ``kdbench status`` on plain runs."""

from __future__ import annotations

import json
import os
import stat
from pathlib import Path

import pytest
from transformers import TrainerCallback

from kdbench.cli import main
from kdbench.disk import folder_bytes

from .helpers import cli_error


def _run(argv: list[str], capsys) -> tuple[Path, str]:
    capsys.readouterr()
    assert main([str(a) for a in argv]) == 0
    captured = capsys.readouterr()
    return Path(captured.out.strip().splitlines()[-1]), captured.out + captured.err


def _stage_dir(run_dir: Path) -> Path:
    (stage,) = sorted((run_dir / "stages").iterdir())
    return stage


def test_run_folder_holds_log_loss_terms_and_only_the_last_checkpoint(tiny_world, tmp_path, capsys):
    run_dir, output = _run(tiny_world.run_args("kd", tmp_path, "logging_steps=2", "max_steps=6", "eval_steps=3"), capsys)
    lines = [json.loads(line) for line in (run_dir / "loss_terms.jsonl").read_text().splitlines()]
    steps = [entry for entry in lines if "loss" in entry]
    evals = [entry for entry in lines if "eval" in entry]
    assert [e["step"] for e in steps] == [2, 4, 6] and [e["step"] for e in evals] == [3, 6]
    for entry in steps:
        assert set(entry) == {"stage", "step", "epoch", "lr", "loss", "window_steps", "ce", "kd"}
        assert entry["stage"] == "kd" and entry["window_steps"] == 2
        assert entry["loss"] == pytest.approx(entry["ce"] + entry["kd"], rel=1e-5)  # the terms add up to the loss
        assert entry["lr"] > 0 and entry["epoch"] > 0
    assert set(evals[0]["eval"]) == {"acc"}
    log = (run_dir / "train.log").read_text()
    assert "kd step 4/6" in log and "(ce " in log and "eval acc" in log and "checkpoint at step 3" in log
    assert "kd step 4/6" in output and "{'loss'" not in output  # readable lines, not dicts of strings
    assert [p.name for p in _stage_dir(run_dir).glob("checkpoint-*")] == ["checkpoint-6"]  # best is in final/
    record = json.loads((run_dir / "result.json").read_text())
    assert 0 < record["disk_bytes"] <= folder_bytes(run_dir)
    assert f"run folder {run_dir} holds" in output


def test_checkpoints_on_a_time_interval_and_what_a_stage_keeps(tiny_world, tmp_path, capsys):
    # an interval shorter than a step: a checkpoint after every step, although nothing is evaluated
    args = ("checkpoint_minutes=0.000001", "eval_steps=100", "train.save_total_limit=10")
    run_dir, _ = _run(tiny_world.run_args("kd", tmp_path / "a", *args, "keep_checkpoints=all"), capsys)
    log = (run_dir / "train.log").read_text()
    assert [f"checkpoint at step {n}" in log for n in (1, 2, 3, 4)] == [True] * 4
    assert sorted(p.name for p in _stage_dir(run_dir).glob("checkpoint-*")) == [f"checkpoint-{n}" for n in (1, 2, 3, 4)]
    run_dir, _ = _run(tiny_world.run_args("kd", tmp_path / "b", *args, "keep_checkpoints=none"), capsys)
    assert not list(_stage_dir(run_dir).glob("checkpoint-*")) and (_stage_dir(run_dir) / "final").is_dir()
    run_dir, _ = _run(tiny_world.run_args("kd", tmp_path / "c", "checkpoint_minutes=0", "eval_steps=100"), capsys)
    assert "checkpoint at step 1" not in (run_dir / "train.log").read_text()  # 0: only at evaluations / the end


def _reopen(run_dir: Path) -> None:
    """Make a finished run look killed after its last checkpoint (the run resumes from checkpoints)."""
    stage = _stage_dir(run_dir)
    for path in (run_dir / "result.json", stage / "stage_done.json"):
        path.unlink()
    import shutil

    shutil.rmtree(stage / "final")


def test_truncated_checkpoint_falls_back_to_the_intact_earlier_one(tiny_world, tmp_path, capsys):
    argv = tiny_world.run_args("kd", tmp_path, "keep_checkpoints=all", "train.save_total_limit=5")
    run_dir, _ = _run(argv, capsys)
    _reopen(run_dir)
    weights = _stage_dir(run_dir) / "checkpoint-4" / "student" / "model.safetensors"
    weights.write_bytes(weights.read_bytes()[: weights.stat().st_size // 2])
    _, output = _run(argv, capsys)
    assert "checkpoint-4 is unusable (model.safetensors is truncated (" in output
    assert "falling back to the previous checkpoint" in output
    assert f"resuming from {_stage_dir(run_dir) / 'checkpoint-2'} at step 2" in output
    record = json.loads((run_dir / "result.json").read_text())
    assert record["status"] == "completed" and record["stages"][0]["resumed_from"].endswith("checkpoint-2")


class _CtrlC(TrainerCallback):
    def on_step_end(self, args, state, control, **kwargs):
        if state.global_step == 3:
            raise KeyboardInterrupt


def test_ctrl_c_is_recorded_as_interrupted_not_failed(tiny_world, tmp_path, capsys):
    from kdbench.cli import build_parser, run_config_from_args
    from kdbench.engine import run_experiment
    from kdbench.records import load_records, records_table
    from kdbench.tables import build_table, load_spec

    argv = tiny_world.run_args("kd", tmp_path)
    args, extra = build_parser().parse_known_args(argv)
    args.overrides = list(args.overrides) + extra
    config = run_config_from_args(args)
    with pytest.raises(KeyboardInterrupt):
        run_experiment(config, callbacks=[_CtrlC()])
    (record_path,) = tmp_path.rglob("result.json")
    record = json.loads(record_path.read_text())
    assert record["status"] == "interrupted" and "traceback" not in record
    assert "interrupted" in records_table(tmp_path, "csv")
    notes = " ".join(build_table(load_spec("cross-method"), load_records(tmp_path)).notes)
    assert "failed run" not in notes and "1 interrupted run(s) not shown (resumable)" in notes
    run_dir = run_experiment(config)  # the same command resumes it (checkpoint at the step-2 evaluation)
    record = json.loads((run_dir / "result.json").read_text())
    assert record["status"] == "completed" and record["stages"][0]["resumed_from"].endswith("checkpoint-2")


def test_input_error_on_an_existing_run_folder_is_hidden_from_results(tiny_world, tmp_path, capsys):
    from kdbench.config import build_run_config
    from kdbench.engine import plan_run

    argv = tiny_world.run_args("kd", tmp_path, student=tiny_world.student_other_vocab)
    values = {"method": "kd", "task": "sst2", "teacher": str(tiny_world.teacher),
              "student": str(tiny_world.student_other_vocab), "data_dir": str(tiny_world.data_dir),
              "output": str(tmp_path)}
    values.update(dict(a.split("=", 1) for a in argv if "=" in a))
    run_dir = plan_run(build_run_config(values)).run_dir
    run_dir.mkdir(parents=True)  # left by an earlier attempt
    message = cli_error(argv, capsys, tmp_path)
    assert "different tokenizer" in message
    record = json.loads((run_dir / "result.json").read_text())
    assert record["status"] == "failed" and record["input_error"] is True
    capsys.readouterr()
    assert main(["results", str(tmp_path), "--format", "csv"]) == 0
    assert capsys.readouterr().out.strip() == f"no result records under {tmp_path}"
    assert main(["results", str(tmp_path), "--format", "csv", "--all"]) == 0
    assert str(run_dir) in capsys.readouterr().out


@pytest.mark.parametrize("umask, mode", [(0o022, 0o644), (0o002, 0o664)])
def test_files_respect_the_umask(umask, mode, tiny_world, tmp_path, capsys):
    previous = os.umask(umask)
    try:
        run_dir, _ = _run(tiny_world.run_args("kd", tmp_path), capsys)
    finally:
        os.umask(previous)
    for name in ("result.json", "loss_terms.jsonl", "train.log", "config.yaml"):
        assert stat.S_IMODE((run_dir / name).stat().st_mode) == mode, name
    assert stat.S_IMODE((_stage_dir(run_dir) / "stage_done.json").stat().st_mode) == mode


def test_prune_and_status_of_a_folder_of_runs(tiny_world, tmp_path, capsys):
    run_dir, _ = _run(tiny_world.run_args("kd", tmp_path), capsys)
    incomplete = tmp_path / "kd-sst2-000000000000"
    incomplete.mkdir()
    (incomplete / "config.yaml").write_text("method: kd\n")
    assert main(["status", str(tmp_path)]) == 0
    out = capsys.readouterr().out
    assert "completed" in out and str(run_dir) in out and "incomplete" in out and "1 completed, 1 incomplete" in out
    before = folder_bytes(run_dir)
    assert main(["prune", str(tmp_path)]) == 0
    out = capsys.readouterr().out
    assert not list(run_dir.rglob("checkpoint-*")) and not (_stage_dir(run_dir) / "final").exists()
    assert (run_dir / "model" / "model.safetensors").is_file() and (run_dir / "result.json").is_file()
    assert folder_bytes(run_dir) < before and "freed" in out and str(run_dir) in out
    assert main(["results", str(tmp_path)]) == 0
    assert "| disk" in capsys.readouterr().out
