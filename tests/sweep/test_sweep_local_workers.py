"""The local executor runs a level in ``local_parallelism`` worker processes, several cells each."""

from __future__ import annotations

import json

import pytest

from tiny_models import TINY_RUN


@pytest.mark.integration
def test_local_workers_run_every_cell_of_a_level_once(tmp_path, tiny_models):
    from kdbench.sweep import expand, run_sweep, sweep_status

    spec = {"name": "loc", "output": str(tmp_path / "sw"),
            "defaults": {**TINY_RUN, "student": str(tiny_models["student"]), "teacher": str(tiny_models["teacher"])},
            "grid": {"methods": ["kd"], "tasks": ["sst2"], "seeds": [1, 2, 3]}}
    profile = {"local_parallelism": 2, "timeout_min": 10, "env": {"HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1"}}
    outcome = run_sweep(expand(spec), "local", profile)
    assert outcome == {f"kd-sst2-s{seed}": "done" for seed in (1, 2, 3)}
    submissions = json.loads((tmp_path / "sw" / "sweep.json").read_text())["submissions"]
    # Two worker processes for three cells: one worker ran two of them in turn.
    assert sorted(run for s in submissions for run in s["runs"]) == ["kd-sst2-s1", "kd-sst2-s2", "kd-sst2-s3"]
    assert sorted(len(s["runs"]) for s in submissions) == [1, 2]
    assert len({job for s in submissions for job in s["job_ids"]}) == 2
    assert [s.state for s in sweep_status(tmp_path / "sw", query_slurm=False)] == ["done"] * 3


def test_a_failed_run_does_not_stop_its_worker(tmp_path, monkeypatch):
    from kdbench import sweep as sw

    calls = []

    def fake_run(self, request):
        calls.append(request.name)
        if request.name == "bad":
            raise RuntimeError("broken cell")
        return f"/runs/{request.name}"

    monkeypatch.setattr(sw.RunJob, "__call__", fake_run)
    requests = [sw.RunRequest(name, {}, str(tmp_path / f"{name}.json")) for name in ("a", "bad", "c")]
    assert sw.RunSeries()(requests) == ["/runs/a", None, "/runs/c"]
    assert calls == ["a", "bad", "c"]
