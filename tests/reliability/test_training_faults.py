"""Training faults: a NaN/inf loss stops the run naming the step and the loss term and keeps the
last good checkpoint; out-of-memory names the batch size and suggests gradient accumulation."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from kdbench.config import build_run_config
from kdbench.errors import TrainingOutOfMemoryError, is_out_of_memory
from kdbench.method import Method, Stage
from kdbench.plugins import METHODS

from .helpers import cli_error


class _FaultyMethod(Method):
    """Test-only: a plain cross-entropy stage that turns faulty at training step ``FAULT_STEP``."""

    requires_teacher = False
    FAULT_STEP = 3
    fault: str = "nan"

    def stages(self, context):
        calls = {"n": 0}
        fault = self.fault

        def loss(batch, student, teacher):
            calls["n"] += 1
            ce = torch.nn.functional.cross_entropy(student.logits, batch["labels"])
            if calls["n"] >= self.FAULT_STEP:
                if fault == "oom":
                    raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 20.00 GiB")
                bad = float("nan") if fault == "nan" else float("inf")
                return {"ce": ce, "probe_term": student.logits.sum() * bad}
            return {"ce": ce, "probe_term": 0.0 * student.logits.sum()}

        return [Stage(f"{fault}-stage", loss, uses_teacher=False)]  # logits are always captured


def _register(fault: str) -> str:
    name = f"{fault}-probe"
    if name not in METHODS:
        cls = type(f"{fault.title()}Probe", (_FaultyMethod,), {"name": name, "fault": fault})
        METHODS.register(name, cls)
    return name


def _args(world, method: str, output: Path) -> list[str]:
    args = world.run_args(method, output, "eval_steps=2", "train.save_total_limit=5")
    args[args.index("--teacher"):args.index("--teacher") + 2] = []
    return args + [f"tokenizer={world.teacher}"]


@pytest.mark.parametrize("fault", ["nan", "inf"])
def test_non_finite_loss_stops_naming_step_and_term_and_keeps_last_good_checkpoint(fault, tiny_world, tmp_path, capsys):
    method = _register(fault)
    message = cli_error(_args(tiny_world, method, tmp_path), capsys)
    assert f"loss term 'probe_term' of stage '{fault}-stage' became non-finite at step 3" in message
    assert "last good checkpoint is kept" in message
    (run_dir,) = [p for p in tmp_path.iterdir() if p.is_dir()]
    stage = run_dir / "stages" / f"0-{fault}-stage"
    assert sorted(p.name for p in stage.glob("checkpoint-*")) == ["checkpoint-2"]  # step 4 was never saved
    from safetensors.torch import load_file

    weights = load_file(str(stage / "checkpoint-2" / "student" / "model.safetensors"))
    assert all(torch.isfinite(t).all() for t in weights.values()), "the kept checkpoint holds good weights"
    record = json.loads((run_dir / "result.json").read_text())
    assert record["status"] == "failed" and "NonFiniteLossError" in record["error"] and "step 3" in record["error"]


def test_out_of_memory_names_batch_size_and_suggests_grad_accum(tiny_world, tmp_path, capsys):
    method = _register("oom")
    message = cli_error(_args(tiny_world, method, tmp_path), capsys)
    assert "out of memory" in message and "batch_size=4 grad_accum=1" in message
    assert "try batch_size=2 grad_accum=2 (same effective batch of 4)" in message
    (run_dir,) = [p for p in tmp_path.iterdir() if p.is_dir()]
    record = json.loads((run_dir / "result.json").read_text())
    assert record["status"] == "failed" and "TrainingOutOfMemoryError" in record["error"]


def test_out_of_memory_recognised_in_its_forms():
    assert is_out_of_memory(torch.OutOfMemoryError("CUDA out of memory"))
    assert is_out_of_memory(RuntimeError("CUDA error: out of memory"))
    assert is_out_of_memory(RuntimeError("[enforce fail at alloc_cpu.cpp:117] DefaultCPUAllocator: can't allocate"
                                         " memory: you tried to allocate 1 bytes. Error code 12 (Cannot allocate "
                                         "memory) out of memory")) is True
    assert not is_out_of_memory(RuntimeError("shape mismatch"))
    message = str(TrainingOutOfMemoryError("kd", 32, 2, "cuda:0", "CUDA out of memory"))
    assert "batch_size=32 grad_accum=2; try batch_size=16 grad_accum=4 (same effective batch of 64)" in message


def test_config_building_for_probe_is_valid(tiny_world, tmp_path):
    """Guard: the probes' arguments are a valid config (so the fault tests fail for the fault only)."""
    _register("nan")
    values = {"method": "nan-probe", "task": "sst2", "student": str(tiny_world.student),
              "tokenizer": str(tiny_world.teacher), "output": str(tmp_path)}
    assert build_run_config(values).tokenizer == str(tiny_world.teacher)


def test_non_finite_loss_on_the_last_step_without_a_log_or_save_there_still_fails(tiny_world, tmp_path, capsys):
    """Epoch-based saving with max_steps ending mid-epoch and no log at that step: nothing in the
    Trainer looks at the loss after the NaN, so the engine must check once more after training."""
    method = _register("nan")
    args = tiny_world.run_args(method, tmp_path, "max_steps=3", "logging_steps=50", "eval_steps=none")
    args[args.index("--teacher"):args.index("--teacher") + 2] = []
    message = cli_error(args + [f"tokenizer={tiny_world.teacher}"], capsys)
    assert "became non-finite at step 3" in message
    (run_dir,) = [p for p in tmp_path.iterdir() if p.is_dir()]
    assert not (run_dir / "model").exists(), "no model is published from NaN weights"
    assert json.loads((run_dir / "result.json").read_text())["status"] == "failed"
