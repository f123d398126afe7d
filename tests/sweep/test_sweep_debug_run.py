"""A sweep end to end with submitit's debug executor (in this process): a shared stage, a dependent
cell, then a re-run that submits nothing."""

from __future__ import annotations

import json

import pytest

from tiny_models import TINY_RUN


@pytest.mark.integration
def test_debug_sweep_runs_stage_then_cell_and_rerun_skips(tmp_path, tiny_models):
    from kdbench.sweep import expand, run_sweep, sweep_status

    spec = {"name": "dbg", "output": str(tmp_path / "sw"), "defaults": {**TINY_RUN, "student": str(tiny_models["student"])},
            "stages": {"teacher": {"method": "finetune", "task": "sst2", "student": str(tiny_models["teacher"])}},
            "grid": {"methods": {"kd": {"teacher": "${teacher}"}}, "tasks": ["sst2"], "seeds": [5]}}
    sweep = expand(spec)
    assert run_sweep(sweep, "debug") == {"teacher": "done", "kd-sst2-s5": "done"}
    kd = json.loads((sweep.runs["kd-sst2-s5"].run_dir / "result.json").read_text())
    assert kd["teacher"] == str(sweep.runs["teacher"].run_dir / "model") and kd["status"] == "completed"
    assert run_sweep(expand(spec), "debug") == {"teacher": "done", "kd-sst2-s5": "done"}
    manifest = json.loads((tmp_path / "sw" / "sweep.json").read_text())
    assert [s["runs"] for s in manifest["submissions"]] == [["teacher"], ["kd-sst2-s5"]]  # the re-run submitted nothing
    assert [s.state for s in sweep_status(tmp_path / "sw")] == ["done", "done"]
