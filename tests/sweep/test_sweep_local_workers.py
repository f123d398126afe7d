"""The local executor runs a level in ``local_parallelism`` worker processes, several cells each."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml

from tiny_models import TINY_RUN


@pytest.mark.integration
def test_local_workers_run_every_cell_of_a_level_once(tmp_path, tiny_models, monkeypatch):
    from kdbench.sweep import expand, run_sweep, sweep_status

    # The GPUs this driver may use (none exist here: the workers train on the CPU either way).
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "3,4")

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
    # Each worker saw one of the driver's GPUs, round robin (submitit alone would have hidden them all).
    state_dir = expand(spec).state_dir
    seen = {run: json.loads((state_dir / f"{run}.json").read_text())["cuda_visible_devices"]
            for run in ("kd-sst2-s1", "kd-sst2-s2", "kd-sst2-s3")}
    assert seen == {"kd-sst2-s1": "3", "kd-sst2-s2": "4", "kd-sst2-s3": "3"}


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


def _live_processes_mentioning(text: str) -> list[int]:
    """Pids of live (not zombie) processes whose command line contains ``text``."""
    found = []
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit():
            continue
        try:
            cmdline = (proc / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
            state = next(line for line in (proc / "status").read_text().splitlines() if line.startswith("State:"))
        except (OSError, StopIteration):
            continue
        if text in cmdline and " Z " not in f"{state} ":
            found.append(int(proc.name))
    return found


def _ignore_sigint() -> None:
    signal.signal(signal.SIGINT, signal.SIG_IGN)


@pytest.mark.integration
@pytest.mark.skipif(not Path("/proc").is_dir(), reason="reads the process table from /proc")
@pytest.mark.parametrize("started_in_background", [False, True], ids=["foreground", "background"])
def test_killing_a_local_sweep_stops_its_worker(tmp_path, tiny_models, started_in_background):
    """`kill` (SIGTERM) reaches the sweep's driver alone, not its worker processes: the driver must stop
    them, not leave a training running unseen, and record the run cancelled (a rerun resumes it).

    ``background``: a driver started with ``&`` from a script (or by ``nohup``) inherits SIGINT
    ignored, and so would its workers, which submitit's local cancel (SIGINT) would then not stop."""
    from kdbench.sweep import expand, sweep_status

    folder = tmp_path / "sw"
    spec = {"name": "stop", "output": str(folder),
            "defaults": {**TINY_RUN, "max_steps": 1_000_000, "eval_steps": 1_000_000, "logging_steps": 20,
                         "student": str(tiny_models["student"]), "teacher": str(tiny_models["teacher"])},
            "grid": {"methods": ["kd"], "tasks": ["sst2"], "seeds": [1]}}
    spec_path = tmp_path / "spec.yaml"
    spec_path.write_text(yaml.safe_dump(spec))
    train_log = expand(spec).runs["kd-sst2-s1"].run_dir / "train.log"
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1"}
    with open(tmp_path / "driver.log", "w") as log:
        driver = subprocess.Popen([sys.executable, "-m", "kdbench", "sweep", str(spec_path), "--executor", "local"],
                                  stdout=log, stderr=subprocess.STDOUT, env=env,
                                  preexec_fn=_ignore_sigint if started_in_background else None)
    try:
        deadline = time.monotonic() + 240
        while not (train_log.is_file() and " step " in train_log.read_text()):
            assert driver.poll() is None, (tmp_path / "driver.log").read_text()
            assert time.monotonic() < deadline, "the worker never started training"
            time.sleep(0.5)
        assert _live_processes_mentioning(str(folder))  # the worker is training
        driver.send_signal(signal.SIGTERM)
        assert driver.wait(timeout=90) == 130, (tmp_path / "driver.log").read_text()
    finally:
        if driver.poll() is None:
            driver.kill()
        orphans = _live_processes_mentioning(str(folder))
        for pid in orphans:  # a failing driver must not leave its worker training beside the other tests
            os.kill(pid, signal.SIGKILL)
    assert orphans == []
    size = train_log.stat().st_size
    time.sleep(2)
    assert train_log.stat().st_size == size  # nothing trains on
    [status] = sweep_status(folder, query_slurm=False)
    assert status.state == "cancelled" and "rerun the sweep" in status.error
