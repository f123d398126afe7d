"""A run interrupted at a checkpoint and resumed ends with the uninterrupted run's weights, bit for
bit on CPU; its record says ``requeued`` while it waits, and its times add up over the attempts.

Tiny models on 40 real SST-2 rows: 5 steps an epoch, checkpoints every 4 steps, 12 steps. The
interruption comes at step 8, in the second epoch: the batches of that epoch are drawn at its
start, which a resumed run never saw (the length-grouped sampler used the global RNG there)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file
from transformers import TrainerCallback

from tiny_models import TINY_RUN


class RequeueAt(TrainerCallback):
    """What submitit's requeue does once the graceful callback saved a checkpoint: exit."""

    def __init__(self, step: int):
        self.step = step

    def on_save(self, args, state, control, **kwargs):
        from kdbench.engine.resume import Requeued

        if state.global_step == self.step:
            raise Requeued(-1)


def weights(run_dir: Path, which: str) -> dict[str, torch.Tensor]:
    return load_file(str(next(run_dir.glob(f"stages/*/{which}/student/model.safetensors"))))


def run(values: dict, output: Path, callbacks=()) -> Path:
    from kdbench.config import build_run_config
    from kdbench.engine import run_experiment

    return run_experiment(build_run_config({**values, "output": str(output)}), callbacks=list(callbacks))


def interrupted_then_resumed(values: dict, output: Path) -> tuple[Path, dict]:
    from kdbench.engine.resume import Requeued

    try:
        run(values, output, [RequeueAt(8)])
    except Requeued:
        pass
    else:
        raise AssertionError("the run was not interrupted")
    held = json.loads(next(output.glob("*/result.json")).read_text())
    return run(values, output), held


def test_resumed_run_is_bit_exact_requeued_while_held_and_its_times_add_up(tmp_path, tiny_models, shared_data,
                                                                           monkeypatch):
    monkeypatch.setenv("KDBENCH_DATA_DIR", str(shared_data))
    values = {**TINY_RUN, "method": "kd", "task": "sst2", "teacher": str(tiny_models["teacher"]),
              "student": str(tiny_models["student"]), "max_steps": 12, "eval_steps": 4, "max_train_samples": 40}
    straight = run(values, tmp_path / "straight")
    resumed, held = interrupted_then_resumed(values, tmp_path / "resumed")

    assert held["status"] == "requeued" and held["error"] == "Requeued: -1" and held["attempts"] == 1
    for which in ("checkpoint-12", "final"):
        a, b = weights(straight, which), weights(resumed, which)
        assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a), which
    record = json.loads((resumed / "result.json").read_text())
    stage = record["stages"][0]
    assert record["status"] == "completed" and record["attempts"] == 2
    assert stage["resumed_from"].endswith("checkpoint-8") and stage["steps"] == 12
    straight_stage = json.loads((straight / "result.json").read_text())["stages"][0]
    assert stage["final_loss_terms"] == straight_stage["final_loss_terms"]
    # the lines logged before the interruption count too: the resumed run's last epoch is the straight run's
    assert stage["last_epoch_loss_steps"] == straight_stage["last_epoch_loss_steps"] > 0
    assert stage["last_epoch_loss_terms"] == pytest.approx(straight_stage["last_epoch_loss_terms"], rel=1e-6)
    attempts = json.loads((resumed / "attempts.json").read_text())["attempts"]
    assert [a["ended"] for a in attempts] == ["requeued", "completed"]
    assert record["train_seconds"] == round(sum(a["seconds"] for a in attempts), 2) > held["train_seconds"] > 0
    at_checkpoint = json.loads(next(resumed.glob("stages/*/elapsed.json")).read_text())["8"]
    assert stage["seconds"] > at_checkpoint > 0  # the stage's clock went on from the checkpoint's
    # both attempts ran this checkout on this machine: nothing to say about mixed provenance
    assert attempts[0]["kdbench_revision"] == attempts[1]["kdbench_revision"] == record["kdbench_revision"]
    assert "attempt_provenance" not in record


def test_a_run_resumed_at_another_commit_lists_each_attempts_revision(tmp_path, tiny_models, shared_data,
                                                                     monkeypatch):
    """A record names one kdbench revision, the last attempt's: a run whose earlier attempt ran
    other code (resumed after a git pull, say) must say so, or its record would vouch for code that
    trained only its end."""
    import kdbench.engine.runner as runner

    monkeypatch.setenv("KDBENCH_DATA_DIR", str(shared_data))
    values = {**TINY_RUN, "method": "kd", "task": "sst2", "teacher": str(tiny_models["teacher"]),
              "student": str(tiny_models["student"]), "max_steps": 12, "eval_steps": 4, "max_train_samples": 40}
    monkeypatch.setattr(runner, "kdbench_revision", lambda: {"commit": "1111111aaaa", "dirty": False})
    from kdbench.engine.resume import Requeued

    with pytest.raises(Requeued):
        run(values, tmp_path, [RequeueAt(8)])
    monkeypatch.setattr(runner, "kdbench_revision", lambda: {"commit": "2222222bbbb", "dirty": False})
    record = json.loads((run(values, tmp_path) / "result.json").read_text())
    assert record["kdbench_revision"]["commit"] == "2222222bbbb"
    listed = record["attempt_provenance"]
    assert [(a["attempt"], a["kdbench_revision"]["commit"]) for a in listed] == [(1, "1111111aaaa"), (2, "2222222bbbb")]
    assert listed[0]["machine"] == listed[1]["machine"] == record["machine"] and listed[0]["seconds"] > 0


def test_without_the_epoch_seeded_sampler_the_resumed_run_trains_on_other_batches(tmp_path, tiny_models,
                                                                                   shared_data, monkeypatch):
    """The control: Trainer's own length-grouped sampler gives a different model after the resume."""
    from kdbench.engine import trainer

    monkeypatch.setenv("KDBENCH_DATA_DIR", str(shared_data))
    monkeypatch.setattr(trainer, "reproducible_sampler", lambda sampler, seed: sampler)
    values = {**TINY_RUN, "method": "kd", "task": "sst2", "teacher": str(tiny_models["teacher"]),
              "student": str(tiny_models["student"]), "max_steps": 12, "eval_steps": 4, "max_train_samples": 40}
    straight = run(values, tmp_path / "straight")
    resumed, _ = interrupted_then_resumed(values, tmp_path / "resumed")
    a, b = weights(straight, "checkpoint-12"), weights(resumed, "checkpoint-12")
    assert not all(torch.equal(a[k], b[k]) for k in a)


def test_an_attempt_that_never_recorded_its_end_is_marked_killed_by_the_next(tmp_path):
    """A worker SIGKILLed before its first checkpoint (a cancel during set-up) leaves ``ended: null``;
    the next attempt holds the run lock, so that attempt cannot still be running."""
    from kdbench.engine.resume import KILLED, RunClock

    (tmp_path / "attempts.json").write_text(json.dumps({"attempts": [
        {"started_at": "t0", "seconds": 670.87, "ended": "interrupted"},
        {"started_at": "t1", "seconds": 12.5, "ended": None}]}))
    clock = RunClock(tmp_path)
    attempts = json.loads((tmp_path / "attempts.json").read_text())["attempts"]
    assert [a["ended"] for a in attempts] == ["interrupted", KILLED, None]
    assert clock.count == 3 and clock.total_seconds() == 683.37  # the killed attempt's seconds still count


def test_an_attempt_of_a_kdbench_that_recorded_no_provenance_is_unknown_not_left_out(tmp_path):
    """A run started before attempts named their revision and resumed after an upgrade: the earlier
    attempt's code is unknown, which is not the same as the last attempt's."""
    from kdbench.engine.resume import RunClock

    (tmp_path / "attempts.json").write_text(json.dumps({"attempts": [
        {"started_at": "t0", "seconds": 600.0, "ended": "requeued"}]}))
    now = {"kdbench_revision": {"commit": "abc", "dirty": False}, "machine": {"cpu_capability": "AVX2"}}
    listed = RunClock(tmp_path, provenance=now).mixed_provenance()
    assert [(a["attempt"], a["kdbench_revision"]) for a in listed] == [(1, None), (2, now["kdbench_revision"])]
    same = tmp_path / "same"
    same.mkdir()
    RunClock(same, provenance=now).save(ended="requeued")
    assert RunClock(same, provenance=now).mixed_provenance() == []
