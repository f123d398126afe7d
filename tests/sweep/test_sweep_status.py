"""`kdbench status`: merging result records (truth), job-side state files and the manifest."""

from __future__ import annotations

import argparse
import io
import json
import os
import time

import pytest

from kdbench import sweep as sw


def write(path, data, mtime=None):
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(data))
    if mtime is not None:
        os.utime(path, (mtime, mtime))


@pytest.fixture
def folder(tmp_path):
    names = ["done", "failed", "requeued", "running", "blocked", "fresh", "crashed"]
    runs = [{"name": n, "kind": "cell", "run_dir": str(tmp_path / f"run-{n}"), "level": 0, "depends_on": [],
             "values": {}} for n in names]
    write(tmp_path / sw.MANIFEST, {"name": "t", "executor": "local", "submissions": [], "runs": runs})
    state = tmp_path / sw.SWEEP_DIR / "state"
    now = time.time()
    write(tmp_path / "run-done" / "result.json", {"status": "completed"})
    write(tmp_path / "run-failed" / "result.json", {"status": "failed", "error": "DataError: sst2: no file x.tsv"},
          mtime=now)
    write(state / "failed.json", {"state": "failed", "time": now - 5, "job_id": "7_1", "error": "short"})
    # a requeued job: the engine recorded the SystemExit as failed, the job wrote "requeued" after it
    write(tmp_path / "run-requeued" / "result.json", {"status": "failed", "error": "SystemExit: -1"}, mtime=now - 10)
    write(state / "requeued.json", {"state": "requeued", "time": now, "job_id": "8"})
    write(state / "running.json", {"state": "running", "time": now, "job_id": "9_0"})
    write(state / "blocked.json", {"state": "blocked", "time": now, "error": "dependency teacher did not complete"})
    write(state / "crashed.json", {"state": "failed", "time": now, "job_id": "10", "error": "ImportError: boom"})
    return tmp_path


def test_status_of_each_run(folder):
    statuses = {s.name: s for s in sw.sweep_status(folder)}
    assert {n: s.state for n, s in statuses.items()} == {
        "done": "done", "failed": "failed", "requeued": "requeued", "running": "running",
        "blocked": "blocked", "fresh": "not-started", "crashed": "failed"}
    assert statuses["failed"].error == "DataError: sst2: no file x.tsv"  # the record's error wins
    assert statuses["failed"].job_id == "7_1"
    assert statuses["crashed"].error == "ImportError: boom"  # failed before the engine wrote a record
    assert statuses["blocked"].error.startswith("dependency teacher")


def test_status_command_prints_the_error_of_a_failed_run(folder, capsys):
    assert sw.cmd_status(argparse.Namespace(folder=str(folder), json=False)) == 0
    out = capsys.readouterr().out
    failed_line = next(line for line in out.splitlines() if line.startswith("failed "))
    assert "failed" in failed_line and "7_1" in failed_line
    assert "error: DataError: sst2: no file x.tsv" in out
    assert out.strip().splitlines()[-1] == "1 blocked, 1 done, 2 failed, 1 not-started, 1 requeued, 1 running"


def test_status_of_a_folder_that_is_not_a_sweep(tmp_path):
    with pytest.raises(FileNotFoundError, match="not a sweep folder"):
        sw.sweep_status(tmp_path)


def test_job_state_keeps_the_job_id_the_driver_recorded(tmp_path):
    path = tmp_path / "s.json"
    sw._write_state(path, sw.PENDING, job_id="12_3")
    sw._write_state(path, sw.RUNNING, job_id=None, host="h")
    data = json.loads(path.read_text())
    assert data["state"] == "running" and data["job_id"] == "12_3" and data["host"] == "h"


def test_only_rank_zero_of_a_multi_task_job_records_state(tmp_path, monkeypatch):
    path = tmp_path / "s.json"
    monkeypatch.setenv("RANK", "3")
    sw._write_state(path, sw.RUNNING, job_id="1")
    assert not path.exists()
    monkeypatch.setenv("RANK", "0")
    sw._write_state(path, sw.RUNNING, job_id="1")
    assert json.loads(path.read_text())["state"] == "running"


def test_sweeps_sharing_a_folder_keep_each_others_runs_and_each_follows_its_own(tmp_path, monkeypatch):
    """Two sweeps into one output (two tables of `kdbench reproduce`): the manifest keeps both, so
    the folder's status shows every run; a sweep's own status (its --wait, its last print) only its
    runs; a run a Slurm sweep submitted is still checked against Slurm after a local sweep wrote the manifest."""
    def sweep(name, runs):
        return sw.Sweep(name, tmp_path, {r: sw.SweepRun(r, "cell", {}, run_dir=tmp_path / f"run-{r}") for r in runs})

    first, second = sweep("cross-method", ["teacher", "kd-s1"]), sweep("procedures", ["teacher", "wo-td-s1"])
    sw.write_manifest(first, "slurm", None)
    write(first.state_dir / "kd-s1.json", {"state": "pending", "time": time.time(), "job_id": "41"})
    sw.write_manifest(second, "local", None)
    write(tmp_path / "run-teacher" / "result.json", {"status": "completed"})
    asked = []
    monkeypatch.setattr("kdbench.launch.slurm_job_states", lambda ids, **_: asked.append(set(ids)) or {"41": "RUNNING"})

    manifest = json.loads((tmp_path / sw.MANIFEST).read_text())
    assert (manifest["name"], manifest["executor"]) == ("procedures", "local")
    assert {r["name"]: r["executor"] for r in manifest["runs"]} == {"teacher": "local", "kd-s1": "slurm",
                                                                    "wo-td-s1": "local"}
    states = {s.name: s.state for s in sw.sweep_status(tmp_path)}
    assert states == {"teacher": "done", "kd-s1": "running", "wo-td-s1": "not-started"}
    assert asked == [{"41"}]
    assert {s.name for s in sw.sweep_status(tmp_path, names=first.runs)} == {"teacher", "kd-s1"}
    followed = sw.wait_for_sweep(tmp_path, poll_seconds=0.01, out=io.StringIO(), names=second.runs)
    assert {s.name: s.state for s in followed} == {"teacher": "done", "wo-td-s1": "not-started"}
