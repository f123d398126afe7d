"""Integration tests against the real single-node Slurm of slurm/dev-cluster/up.sh (marker `slurm`).

Run by the Slurm block of .ci/run:  bash slurm/dev-cluster/up.sh && pytest -m slurm tests/slurm.
Tiny models (built from a config) on 32 real SST-2 rows keep every job to seconds of training;
most of a job's time is Python start-up.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml
from tiny_models import TINY_RUN

pytestmark = pytest.mark.slurm
ENV_FILE = Path("/etc/slurm/kdbench-dev.env")


@pytest.fixture(scope="module", autouse=True)
def slurm_cluster():
    if "SLURM_CONF" not in os.environ and ENV_FILE.is_file():
        os.environ["SLURM_CONF"] = ENV_FILE.read_text().split("=", 1)[1].strip()
    if not shutil.which("sinfo") or "SLURM_CONF" not in os.environ:
        pytest.skip("no Slurm here: bring the dev cluster up with slurm/dev-cluster/up.sh")
    state = subprocess.run(["sinfo", "-h", "-o", "%t"], check=False, capture_output=True, text=True, timeout=30)
    if state.returncode != 0 or not state.stdout.split() or state.stdout.split()[0] not in ("idle", "mix", "alloc"):
        pytest.skip(f"the Slurm node is not usable: {state.stdout or state.stderr}")
    os.environ.setdefault("KDBENCH_DATA_DIR", str(Path(__file__).resolve().parents[3] / "shared" / "data"))


def sacct(job: str) -> list[list[str]]:
    out = subprocess.run(["sacct", "-n", "-P", "-X", "-j", job, "-o", "JobID,State"], capture_output=True,
                         text=True, check=True, timeout=30).stdout
    return [line.split("|") for line in out.splitlines() if line.strip()]


def settle(folder: Path, timeout_s: float = 360) -> dict[str, object]:
    """Poll `kdbench status` (the library call) until no run is pending/running/requeued."""
    from kdbench.sweep import LIVE_STATES, sweep_status

    deadline = time.perf_counter() + timeout_s
    while True:
        statuses = {s.name: s for s in sweep_status(folder)}
        if not any(s.state in LIVE_STATES for s in statuses.values()):
            return statuses
        assert time.perf_counter() < deadline, {n: s.state for n, s in statuses.items()}
        time.sleep(1)


def submitted_runs(folder: Path) -> list[list[str]]:
    return [sorted(s["runs"]) for s in json.loads((folder / "sweep.json").read_text())["submissions"]]


def test_sweep_is_submitted_at_once_with_dependencies_and_completes_without_the_driver(tmp_path, tiny_models,
                                                                                       capsys):
    from kdbench.cli import main

    train_file = tmp_path / "late_train.tsv"  # missing on the first run: that teacher fails at run time
    folder = tmp_path / "sweep"
    spec = {
        "name": "slurm-ci",
        "output": str(folder),
        "defaults": {**TINY_RUN, "student": str(tiny_models["student"])},
        "stages": {"finetune-teacher": {"method": "finetune", "task": "${task}", "student": str(tiny_models["teacher"]),
                                        "seed": 1},
                   "late-teacher": {"method": "finetune", "task": "sst2", "student": str(tiny_models["teacher"]),
                                    "seed": 1, "train_file": str(train_file)}},
        "grid": {"methods": {"kd": {"teacher": "${finetune-teacher}"}, "finetune": {}},
                 "tasks": ["sst2", "rte"], "seeds": [1]},
        "cells": [{"method": "kd", "task": "sst2", "seed": 3, "label": "from-late-teacher",
                   "teacher": "${late-teacher}"}],
    }
    path = tmp_path / "spec.yaml"
    path.write_text(yaml.safe_dump(spec))

    started = time.perf_counter()
    assert main(["sweep", str(path), "--executor", "slurm", "--profile", "dev"]) == 0  # returns after submitting
    submit_seconds = time.perf_counter() - started
    out = capsys.readouterr().out
    assert "the sweep runs without this process" in out
    manifest = json.loads((folder / "sweep.json").read_text())
    level0, kd_sst2, kd_rte, late_cell = manifest["submissions"]
    assert sorted(level0["runs"]) == ["finetune-rte-s1", "finetune-sst2-s1", "finetune-teacher-rte",
                                      "finetune-teacher-sst2", "late-teacher"]
    job_of = dict(zip(level0["runs"], level0["job_ids"]))
    # each dependent waits for its own teacher only (afterok), and was submitted before any run ended
    assert kd_sst2["runs"] == ["kd-sst2-s1"] and kd_sst2["after"] == [job_of["finetune-teacher-sst2"]]
    assert kd_rte["runs"] == ["kd-rte-s1"] and kd_rte["after"] == [job_of["finetune-teacher-rte"]]
    assert late_cell["runs"] == ["from-late-teacher"] and late_cell["after"] == [job_of["late-teacher"]]
    for submission in manifest["submissions"]:  # each is ONE sbatch array: <array id>_<index>
        assert len({job.split("_")[0] for job in submission["job_ids"]}) == 1
    array = kd_sst2["job_ids"][0].split("_")[0]
    script = (folder / ".kdbench-sweep" / "jobs" / f"{array}_submission.sh").read_text()
    assert f"#SBATCH --dependency=afterok:{job_of['finetune-teacher-sst2']}" in script
    assert "#SBATCH --kill-on-invalid-dep=yes" in script
    statuses = settle(folder)  # this process no longer drives anything: Slurm runs the sweep
    sweep_seconds = time.perf_counter() - started

    states = {name: s.state for name, s in statuses.items()}
    assert states == {"finetune-teacher-sst2": "done", "finetune-teacher-rte": "done", "late-teacher": "failed",
                      "kd-sst2-s1": "done", "kd-rte-s1": "done", "finetune-sst2-s1": "done", "finetune-rte-s1": "done",
                      "from-late-teacher": "blocked"}, states
    assert statuses["late-teacher"].error.startswith(f"DataError: sst2: data file '{train_file}' does not exist")
    assert statuses["from-late-teacher"].error == "dependency late-teacher did not complete"
    blocked_job = statuses["from-late-teacher"].job_id
    assert sacct(blocked_job) == [[blocked_job, "CANCELLED"]]  # Slurm cancelled it: its dependency failed
    assert not (Path(statuses["from-late-teacher"].run_dir) / "result.json").exists()  # it never ran

    # fix the cause and run the same sweep again, following it to the end: only the two missing runs go
    train_file.write_text("".join((Path(os.environ["KDBENCH_DATA_DIR"]) / "glue_data" / "SST-2" / "train.tsv")
                                  .read_text().splitlines(keepends=True)[:41]))
    started = time.perf_counter()
    assert main(["sweep", str(path), "--executor", "slurm", "--profile", "dev", "--wait", "--poll", "1"]) == 0
    rerun_seconds = time.perf_counter() - started
    out = capsys.readouterr().out
    print(out)
    for name in ("late-teacher", "from-late-teacher"):  # the live view: each change of state as it is seen
        assert re.search(rf"\] \d\d:\d\d:\d\d {name}: (pending|running) -> done", out), name
    assert out.strip().splitlines()[-2] == "8 done"
    assert submitted_runs(folder)[4:] == [["late-teacher"], ["from-late-teacher"]]

    # the cross-method table: one row per method, whatever the per-task teacher folders, with its average
    from kdbench.tables import build_table, render

    table = build_table("cross-method", [str(folder)])
    print(render(table, "markdown"))
    kd = [r for r in table.rows if r[0] == "kd"]
    assert len(kd) == 1 and kd[0][2] == "finetune-teacher", table.rows
    columns = dict(zip(table.header, kd[0]))
    sst2, rte = (float(json.loads((Path(statuses[f"kd-{t}-s1"].run_dir) / "result.json").read_text())["metrics"]["acc"])
                 for t in ("sst2", "rte"))
    assert columns["SST-2"] == f"{sst2:.1f}" and columns["RTE"] == f"{rte:.1f}"
    assert columns["Avg (ours)"] == f"{(sst2 + rte) / 2:.1f}"
    print(f"TIMING walk-away sweep: submitted in {submit_seconds:.1f}s, 8 runs settled after {sweep_seconds:.0f}s "
          f"without the driver; re-run with --wait (2 runs) {rerun_seconds:.0f}s")


def test_rerun_during_a_live_sweep_submits_nothing_twice_and_a_cancelled_pending_task_is_not_waited_on(
        tmp_path, tiny_models, capsys):
    from kdbench.cli import main
    from kdbench.sweep import wait_for_sweep

    folder = tmp_path / "sweep"
    spec = {
        "name": "slurm-live",
        "output": str(folder),
        "defaults": {**TINY_RUN, "student": str(tiny_models["student"])},
        "stages": {"finetune-teacher": {"method": "finetune", "task": "${task}", "student": str(tiny_models["teacher"]),
                                        "seed": 1}},
        "grid": {"methods": {"kd": {"teacher": "${finetune-teacher}"}}, "tasks": ["sst2"], "seeds": [1, 2]},
    }
    path = tmp_path / "spec.yaml"
    path.write_text(yaml.safe_dump(spec))
    profile = tmp_path / "one-at-a-time.yaml"
    profile.write_text(yaml.safe_dump({**yaml.safe_load((Path(__file__).parents[2] / "slurm" / "dev.yaml").read_text()),
                                       "array_parallelism": 1}))
    command = ["sweep", str(path), "--executor", "slurm", "--profile", str(profile)]
    assert main(command) == 0
    first = submitted_runs(folder)
    assert first == [["finetune-teacher-sst2"], ["kd-sst2-s1", "kd-sst2-s2"]]

    assert main(command) == 0  # the driver again, while everything is still queued or running
    out = capsys.readouterr().out
    assert submitted_runs(folder) == first  # nothing submitted twice
    assert out.count("already queued or running") == 3

    # cancel the second kd cell while it is still pending (held by its dependency / the array throttle)
    kd2 = json.loads((folder / ".kdbench-sweep" / "state" / "kd-sst2-s2.json").read_text())["job_id"]
    queued = subprocess.run(["squeue", "--array", "-h", "-o", "%i|%T"], check=True, capture_output=True,
                            text=True, timeout=30).stdout
    assert f"{kd2}|PENDING" in queued
    subprocess.run(["scancel", kd2], check=True, timeout=30)
    started = time.perf_counter()
    statuses = {s.name: s for s in wait_for_sweep(folder, poll_seconds=1)}  # what --wait does: returns
    waited = time.perf_counter() - started
    assert {n: s.state for n, s in statuses.items()} == {"finetune-teacher-sst2": "done", "kd-sst2-s1": "done",
                                                         "kd-sst2-s2": "cancelled"}
    assert "cancelled before it started" in statuses["kd-sst2-s2"].error

    assert main([*command, "--wait", "--poll", "1"]) == 0  # a re-run submits exactly the cancelled cell
    assert submitted_runs(folder) == [*first, ["kd-sst2-s2"]]
    for name in ("finetune-teacher-sst2", "kd-sst2-s1"):  # trained once: one job each, no duplicate ever ran
        run_dir = Path(statuses[name].run_dir)
        assert json.loads((run_dir / "result.json").read_text())["status"] == "completed"
    logs = "".join(p.read_text() for p in (folder / ".kdbench-sweep" / "jobs").glob("*.err"))
    assert "RunInProgressError" not in logs
    print(f"TIMING live re-run: cancelled pending task seen after {waited:.0f}s (teacher + kd-s1 finished)")


def test_tune_with_two_parallel_slurm_workers_and_the_best_config_runs(tmp_path, tiny_models, capsys):
    import optuna

    from kdbench.cli import main
    from kdbench.tuning import make_storage

    tiny = [f"{k}={v}" for k, v in TINY_RUN.items() if k != "lr"]
    storage = f"sqlite:///{tmp_path / 'tune' / 'study.db'}"
    started = time.perf_counter()
    code = main(["tune", "kd", "--task", "sst2", "--teacher", str(tiny_models["teacher"]), "--student",
                 str(tiny_models["student"]), "--output", str(tmp_path / "tune"), "--trials", "8", "--workers", "2",
                 "--executor", "slurm", "--profile", "dev", "--storage", storage, "--sampler-seed", "0", *tiny])
    tune_seconds = time.perf_counter() - started
    assert code == 0
    study = optuna.load_study(study_name="kd-sst2", storage=make_storage(storage))
    finished = [t for t in study.trials if t.state.name in ("COMPLETE", "PRUNED")]
    assert len(finished) == 8 and len([t for t in study.trials if not t.user_attrs.get("surplus")]) == 8
    workers = {t.user_attrs["worker"] for t in study.trials}
    jobs = {t.user_attrs["job_id"] for t in study.trials}
    assert workers == {0, 1} and len(jobs) == 2  # two Slurm jobs shared one storage
    # the workers ran at the same time: their trial spans overlap
    span = {w: (min(t.datetime_start for t in study.trials if t.user_attrs["worker"] == w),
                max(t.datetime_complete for t in study.trials if t.user_attrs["worker"] == w)) for w in workers}
    assert span[0][0] < span[1][1] and span[1][0] < span[0][1]
    for name in ("best_config.yaml", "optimization_history.png", "param_importances.png", "best.json"):
        assert (tmp_path / "tune" / name).is_file(), name

    best = yaml.safe_load((tmp_path / "tune" / "best_config.yaml").read_text())
    assert best["method_params"]["alpha"] == pytest.approx(study.best_params["alpha"])
    assert best["train"]["lr"] == pytest.approx(study.best_params["lr"])
    capsys.readouterr()
    assert main(["run", "kd", "--config", str(tmp_path / "tune" / "best_config.yaml"), "--task", "sst2",
                 "--student", str(tiny_models["student"]), "--output", str(tmp_path / "best")]) == 0
    run_dir = Path(capsys.readouterr().out.strip().splitlines()[-1])
    record = json.loads((run_dir / "result.json").read_text())
    assert record["status"] == "completed" and "acc" in record["metrics"]
    assert record["config"]["method_params"]["temperature"] == study.best_params["temperature"]
    print(f"TIMING tune: 8 trials, 2 Slurm workers: {tune_seconds:.0f}s; best {study.best_value} "
          f"{study.best_params}; best config rerun acc {record['metrics']['acc']}")


def test_job_at_its_time_limit_checkpoints_requeues_and_resumes(tmp_path, tiny_models):
    """timeout_min=3 with the warning signal 120 s before the end: signalled ~60 s in, the job saves
    a checkpoint at the next step (no scheduled checkpoint exists: eval/save every 100000 steps),
    requeues itself, and the requeued job resumes at exactly that step. Two requeues are allowed: on a
    loaded machine the first signal can arrive before training has started (nothing to save yet)."""
    from kdbench.launch import make_executor
    from kdbench.sweep import RunJob, RunRequest

    values = {**TINY_RUN, "method": "finetune", "task": "sst2", "student": str(tiny_models["student"]),
              "max_steps": 100000, "eval_steps": 100000, "logging_steps": 20, "max_train_samples": 64,
              "output": str(tmp_path / "runs")}
    profile = {"partition": "debug", "cpus_per_task": 1, "timeout_min": 3, "signal_delay_s": 120,
               "max_num_timeout": 2}
    executor = make_executor("slurm", tmp_path / "jobs", profile)
    state_file = tmp_path / "state.json"
    held_records: list[dict] = []
    job = executor.submit(RunJob(), RunRequest("timeout-cell", values, str(state_file)))
    started = time.perf_counter()
    log = Path(job.paths.stdout)
    try:
        while time.perf_counter() - started < 420:
            text = log.read_text() if log.is_file() else ""
            if "[kdbench] resuming from" in text:
                break
            if state_file.is_file() and json.loads(state_file.read_text())["state"] == "requeued":
                record_path = next((tmp_path / "runs").glob("*/result.json"))
                held = json.loads(record_path.read_text())
                if held["status"] != "completed":  # while it waits to run again
                    held_records.append(held)
                # Slurm holds a requeued batch job ~2 minutes (EligibleTime = requeue + 121 s); release it
                # once it is back in the queue, to save test time
                show = subprocess.run(["scontrol", "show", "job", str(job.job_id)], check=False, capture_output=True,
                                      text=True, timeout=30).stdout
                if "JobState=PENDING" in show and "Reason=BeginTime" in show:
                    subprocess.run(["scontrol", "update", f"JobId={job.job_id}", "StartTime=now"], check=False,
                                   capture_output=True, timeout=30)
            time.sleep(2)
        text = log.read_text()
        seconds = time.perf_counter() - started
        show = subprocess.run(["scontrol", "show", "job", str(job.job_id)], check=False, capture_output=True,
                              text=True, timeout=30).stdout
    finally:
        subprocess.run(["scancel", str(job.job_id)], check=False, timeout=30)
    print(text[-2500:])
    lines = text.splitlines()
    resumed = [i for i, line in enumerate(lines) if line.startswith("[kdbench] resuming from")]
    assert resumed, "the requeued job did not resume from a checkpoint"
    saved = [line for line in lines[:resumed[0]] if "checkpoint saved at step" in line]
    assert saved, "the job did not checkpoint at its time limit"
    step = int(saved[-1].split("at step ")[1].split(";")[0])
    assert step > 0
    assert f"Requeued job {job.job_id}" in text
    # nothing trained is lost: the resume starts at the step saved when the signal came
    assert lines[resumed[0]].endswith(f"checkpoint-{step} at step {step}"), lines[resumed[0]]
    restarts = int(show.split("Restarts=")[1].split()[0])
    assert restarts >= 1
    # the record of a requeued run says so (not failed), with the first attempt's seconds
    assert held_records, "no record seen while the job was held for requeue"
    held = held_records[0]
    assert held["status"] == "requeued" and held["error"] == "Requeued: -1", held["status"]
    assert held["attempts"] == 1 and held["train_seconds"] > 0
    attempts = json.loads(next((tmp_path / "runs").glob("*/attempts.json")).read_text())["attempts"]
    assert attempts[0]["ended"] == "requeued" and len(attempts) >= 2
    print(f"TIMING requeue: checkpoint at step {step}, resumed after {seconds:.0f}s ({restarts} requeue(s)); "
          f"held record: status {held['status']}, train_seconds {held['train_seconds']}")


def test_tune_worker_killed_mid_trial_its_trial_is_retried_from_its_checkpoint_and_exactly_n_complete(
        tmp_path, tiny_models):
    """Two Slurm workers, 3 trials, heartbeat 2 s / grace 6 s. Once a running trial has a checkpoint,
    its worker process is killed with SIGKILL. The surviving worker fails the silent trial, runs its
    retry in the same run folder (resuming from that checkpoint), and the study ends with exactly 3
    complete trials; the driver exits 0."""
    import signal

    import optuna

    out = tmp_path / "tune"
    storage = f"sqlite:///{out / 'study.db'}"
    run = {**TINY_RUN, "max_steps": 150, "eval_steps": 25, "logging_steps": 25}
    driver = subprocess.Popen(
        [sys.executable, "-m", "kdbench", "tune", "kd", "--task", "sst2", "--teacher", str(tiny_models["teacher"]),
         "--student", str(tiny_models["student"]), "--output", str(out), "--trials", "3", "--workers", "2",
         "--executor", "slurm", "--profile", "dev", "--pruner", "none", "--sampler-seed", "0", "--space", "lr=none",
         "--heartbeat", "2", "--grace", "6", "--max-retry", "1", *[f"{k}={v}" for k, v in run.items()]],
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    started = time.perf_counter()
    killed = None
    try:
        while killed is None:
            assert time.perf_counter() - started < 300 and driver.poll() is None, "no trial reached a checkpoint"
            time.sleep(0.5)
            if not (out / "workers.json").is_file():  # written once the study exists and the workers are queued
                continue
            for trial in optuna.load_study(study_name="kd-sst2", storage=storage).get_trials(deepcopy=False):
                run_dir = Path(trial.user_attrs.get("run_dir", tmp_path / "none"))
                # elapsed.json is written once a checkpoint is complete (a kill while one is written
                # leaves it incomplete: the retry then removes it and starts that stage over)
                if trial.state.name == "RUNNING" and "pid" in trial.user_attrs and list(run_dir.glob("stages/*/elapsed.json")):
                    os.kill(int(trial.user_attrs["pid"]), signal.SIGKILL)
                    killed = trial
                    break
        output, _ = driver.communicate(timeout=420)
    finally:
        if driver.poll() is None:
            driver.kill()
        jobs = json.loads((out / "workers.json").read_text())["job_ids"] if (out / "workers.json").is_file() else []
        subprocess.run(["scancel", *jobs], check=False, timeout=30)
    seconds = time.perf_counter() - started
    print(output[-3000:])
    assert driver.returncode == 0, output[-2000:]
    study = optuna.load_study(study_name="kd-sst2", storage=storage)
    states = [t.state.name for t in study.trials]
    assert states.count("COMPLETE") == 3, states
    failed = [t for t in study.trials if t.state.name == "FAIL" and not t.user_attrs.get("surplus")]
    assert [t.number for t in failed] == [killed.number]  # the killed one, failed by the heartbeat check
    retry = next(t for t in study.trials if t.user_attrs.get("retry_of") == killed.number)
    assert retry.state.name == "COMPLETE" and retry.params == killed.params
    assert retry.user_attrs["run_dir"] == killed.user_attrs["run_dir"]  # its own folder, resumed
    record = json.loads((Path(retry.user_attrs["run_dir"]) / "result.json").read_text())
    assert record["status"] == "completed" and record["label"] == f"kd-sst2-t{killed.number}"
    assert "/checkpoint-" in record["stages"][0]["resumed_from"]
    assert retry.user_attrs["worker"] != killed.user_attrs["worker"]
    killed_job = killed.user_attrs["job_id"]
    assert sacct(killed_job)[0][1] == "FAILED"
    print(f"TIMING tune kill -9: trial {killed.number} killed, retried as trial {retry.number} from "
          f"{record['stages'][0]['resumed_from']}; 3 complete in {seconds:.0f}s; states {states}")
