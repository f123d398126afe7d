"""Cluster profiles -> submitit parameters; the torch.distributed environment of multi-task jobs;
the graceful-requeue callback (signal -> save at the next step -> hand over to submitit); stopping
waited-on jobs on an interrupt; the one line a failed job is logged by."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from types import SimpleNamespace

import pytest
import submitit

from kdbench import launch


def test_shipped_profiles_load():
    assert {"dev", "example-gpu", "example-multinode", "local"} <= set(launch.available_profiles())
    dev = launch.load_profile("dev")
    assert dev["partition"] == "debug" and dev["timeout_min"] >= 3


def test_gpu_profile_maps_to_one_task_per_gpu():
    params = launch.slurm_parameters(launch.load_profile("example-gpu"))
    assert params["gpus_per_node"] == 4 and params["tasks_per_node"] == 4
    assert params["slurm_partition"] == "gpu" and params["slurm_account"] == "my-project"
    assert params["slurm_qos"] == "normal" and params["slurm_constraint"] == "a100"
    assert params["slurm_array_parallelism"] == 16 and params["mem_gb"] == 128
    assert "export HF_HUB_OFFLINE=1" in params["slurm_setup"]
    assert params["slurm_setup"][0] == "module load cuda/12.1 || true"


def test_profile_errors_name_the_problem(tmp_path):
    bad = tmp_path / "p.yaml"
    bad.write_text("partition: x\ngpu: 2\n")
    with pytest.raises(launch.ProfileError, match="unknown key\\(s\\) gpu"):
        launch.load_profile(str(bad))
    with pytest.raises(launch.ProfileError, match="unknown cluster profile 'nope'"):
        launch.load_profile("nope")
    with pytest.raises(launch.ProfileError, match="does not exist"):
        launch.load_profile(str(tmp_path / "missing.yaml"))


def test_executors(tmp_path, srun_on_path):
    assert isinstance(launch.make_executor("debug", tmp_path), submitit.DebugExecutor)
    local = launch.make_executor("local", tmp_path, "local")
    assert isinstance(local, submitit.LocalExecutor)
    slurm = launch.make_executor("slurm", tmp_path / "s", {"partition": "p", "timeout_min": 5, "signal_delay_s": 60,
                                                          "array_parallelism": 3, "max_num_timeout": 2})
    assert slurm.cluster == "slurm"
    inner = slurm._executor
    assert inner.max_num_timeout == 2
    assert inner.parameters["partition"] == "p" and inner.parameters["array_parallelism"] == 3
    assert inner.parameters["signal_delay_s"] == 60 and inner.parameters["time"] == 5
    with pytest.raises(ValueError, match="executor: must be one of"):
        launch.make_executor("kubernetes", tmp_path)


def test_each_local_worker_sees_one_of_the_gpus_this_process_may_use(monkeypatch):
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "2, 5")
    assert launch.local_worker_gpus(3) == [(2,), (5,), (2,)]
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "")
    assert launch.local_worker_gpus(2) == [(), ()]
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES")
    import torch

    monkeypatch.setattr(torch.cuda, "device_count", lambda: 2)
    assert launch.local_worker_gpus(3) == [(0,), (1,), (0,)]
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 0)
    assert launch.local_worker_gpus(1) == [()]
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "GPU-8f3e2c1a")
    with pytest.raises(launch.ProfileError, match="CUDA_VISIBLE_DEVICES='GPU-8f3e2c1a'"):
        launch.local_worker_gpus(1)


def test_local_workers_see_the_drivers_gpus_unless_the_profile_names_them(tmp_path, monkeypatch):
    """Real submitit local jobs report the CUDA_VISIBLE_DEVICES they were started with."""
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "3,6")
    profile = launch.load_profile("local")
    jobs: list = []
    launch.submit_local_workers(launch.make_executor("local", tmp_path / "a", profile), profile,
                                os.getenv, ["CUDA_VISIBLE_DEVICES"] * 3, jobs)
    assert [job.result() for job in jobs] == ["3", "6", "3"]
    # A profile's gpus_per_node decides for every worker, as submitit numbers them.
    profile = {**profile, "gpus_per_node": 0}
    jobs = []
    launch.submit_local_workers(launch.make_executor("local", tmp_path / "b", profile), profile,
                                os.getenv, ["CUDA_VISIBLE_DEVICES"], jobs)
    assert [job.result() for job in jobs] == [""]


def test_distributed_environment_from_slurm_variables(monkeypatch):
    for key in ("MASTER_ADDR", "MASTER_PORT", "RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE"):
        # setenv first so monkeypatch restores the key (deletes it) after init_distributed exported it:
        # a leaked WORLD_SIZE=8 makes every later Trainer wait for 7 missing ranks
        monkeypatch.setenv(key, "")
        monkeypatch.delenv(key)
    # task 5 of 8: 2 nodes x 4 GPUs, second node, third GPU
    env = {"SUBMITIT_EXECUTOR": "slurm", "SLURM_JOB_ID": "4242", "SLURM_NTASKS": "8", "SLURM_JOB_NUM_NODES": "2",
           "SLURM_NODEID": "1", "SLURM_JOB_NODELIST": "gpu[07-08]", "SLURM_PROCID": "6", "SLURM_LOCALID": "2"}
    for key, value in env.items():
        monkeypatch.setenv(key, value)
    dist = launch.init_distributed(init_process_group=False)
    assert dist is not None
    assert os.environ["MASTER_ADDR"] == "gpu07"  # the first node of the job hosts rank 0
    assert os.environ["RANK"] == "6" and os.environ["WORLD_SIZE"] == "8"
    assert os.environ["LOCAL_RANK"] == "2" and os.environ["LOCAL_WORLD_SIZE"] == "4"
    assert 20000 <= int(os.environ["MASTER_PORT"]) <= 60000  # derived from the job id: same in every task


def test_the_distributed_test_leaves_no_variables_behind():
    assert not {"RANK", "WORLD_SIZE", "MASTER_ADDR"} & set(os.environ)


def test_single_task_and_no_job_leave_the_environment_alone(monkeypatch):
    monkeypatch.delenv("SUBMITIT_EXECUTOR", raising=False)
    assert launch.init_distributed() is None
    monkeypatch.setenv("SUBMITIT_EXECUTOR", "slurm")
    monkeypatch.setenv("SLURM_NTASKS", "1")
    monkeypatch.setenv("SLURM_JOB_ID", "1")
    monkeypatch.delenv("RANK", raising=False)
    assert launch.init_distributed() is None and "RANK" not in os.environ


def test_graceful_requeue_saves_at_the_next_step_then_hands_over():
    calls = []
    previous = signal.signal(signal.SIGUSR2, lambda signum, frame: calls.append(signum))
    try:
        callback = launch.graceful_requeue_callback()
        control = SimpleNamespace(should_save=False, should_evaluate=True)
        state = SimpleNamespace(global_step=17)
        callback.on_train_begin(None, state, control)
        os.kill(os.getpid(), signal.SIGUSR2)
        assert calls == [] and callback.pending is not None  # not handed over mid-step
        callback.on_step_end(None, state, control)
        assert control.should_save is True and control.should_evaluate is False
        callback.on_save(None, state, control)
        assert calls == [signal.SIGUSR2]  # submitit's handler: checkpoint + requeue
        assert signal.getsignal(signal.SIGUSR2) is not callback._on_signal
    finally:
        signal.signal(signal.SIGUSR2, previous)


def test_graceful_requeue_outside_training_hands_over_at_once():
    calls = []
    previous = signal.signal(signal.SIGUSR2, lambda signum, frame: calls.append(signum))
    try:
        launch.graceful_requeue_callback()
        os.kill(os.getpid(), signal.SIGUSR2)
        assert calls == [signal.SIGUSR2]
    finally:
        signal.signal(signal.SIGUSR2, previous)


def test_multinode_profile_renders_to_the_sbatch_options_it_promises(tmp_path, srun_on_path):
    """slurm/example-multinode.yaml through submitit's own sbatch writer, as a 10-cell sweep array."""
    from submitit.slurm.slurm import _make_sbatch_string

    executor = launch.make_executor("slurm", tmp_path, "example-multinode")
    assert executor._executor.max_num_timeout == 10
    text = _make_sbatch_string(command="python -m submitit.core._submit", folder=tmp_path, map_count=10,
                               **executor._executor.parameters)
    lines = set(text.splitlines())
    for option in ("--partition=gpu", "--account=my-project", "--qos=normal", "--nodes=2", "--gpus-per-node=4",
                   "--ntasks-per-node=4", "--cpus-per-task=8", "--mem=256GB", "--time=1440", "--signal=USR2@120",
                   "--array=0-9%4", "--constraint=a100", "--requeue", "--exclusive"):
        assert f"#SBATCH {option}" in lines, option
    assert "module load cuda/12.1 || true" in lines and "export NCCL_ASYNC_ERROR_HANDLING=1" in lines


def test_graceful_requeue_raises_requeued_when_submitit_requeues():
    """submitit's handler requeues and calls sys.exit: the run sees Requeued, recorded 'requeued'."""
    import sys

    from kdbench.engine.resume import Requeued, interrupted_status

    previous = signal.signal(signal.SIGUSR2, lambda signum, frame: sys.exit(-1))
    try:
        callback = launch.graceful_requeue_callback()
        control = SimpleNamespace(should_save=False, should_evaluate=True)
        state = SimpleNamespace(global_step=3)
        callback.on_train_begin(None, state, control)
        os.kill(os.getpid(), signal.SIGUSR2)
        callback.on_step_end(None, state, control)
        with pytest.raises(Requeued) as caught:
            callback.on_save(None, state, control)
        assert caught.value.code == -1 and interrupted_status(caught.value) == "requeued"
        assert interrupted_status(SystemExit(-1)) == interrupted_status(RuntimeError()) == "failed"
    finally:
        signal.signal(signal.SIGUSR2, previous)


class _FakeJob:
    def __init__(self, job_id: str, finished: bool) -> None:
        self.job_id, self.finished, self.cancelled = job_id, finished, False

    def done(self) -> bool:
        return self.finished

    def cancel(self) -> None:
        self.cancelled = self.finished = True


def test_an_interrupt_while_waiting_cancels_only_the_jobs_still_running():
    finished, running = _FakeJob("1", finished=True), _FakeJob("2", finished=False)
    with pytest.raises(KeyboardInterrupt), launch.stop_jobs_on_interrupt(grace_seconds=1) as jobs:
        jobs.extend([finished, running])
        raise KeyboardInterrupt
    assert (finished.cancelled, running.cancelled) == (False, True)


def test_sigterm_while_waiting_is_an_interrupt_and_the_handler_is_restored_after():
    before = signal.getsignal(signal.SIGTERM)
    running = _FakeJob("7", finished=False)
    with pytest.raises(KeyboardInterrupt, match="signal 15"), launch.stop_jobs_on_interrupt(grace_seconds=1) as jobs:
        jobs.append(running)
        os.kill(os.getpid(), signal.SIGTERM)
        time.sleep(5)  # the handler interrupts this at once
    assert running.cancelled
    assert signal.getsignal(signal.SIGTERM) is before
    with launch.stop_jobs_on_interrupt() as jobs:  # an uninterrupted wait touches nothing
        jobs.append(running)


def test_an_ignored_sigint_is_an_interrupt_inside_the_block_and_ignored_again_after():
    """A driver started with ``&`` from a script inherits SIGINT ignored; its local workers, started
    inside the block, must not inherit that, or a local cancel (SIGINT) could not stop them."""
    previous = signal.signal(signal.SIGINT, signal.SIG_IGN)
    try:
        with launch.stop_jobs_on_interrupt():
            assert signal.getsignal(signal.SIGINT) is signal.default_int_handler
            code = "import signal; print(signal.getsignal(signal.SIGINT) is signal.default_int_handler)"
            worker = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
            assert worker.stdout.strip() == "True"
        assert signal.getsignal(signal.SIGINT) is signal.SIG_IGN
    finally:
        signal.signal(signal.SIGINT, previous)


def _is_gone(pid: int) -> bool:
    try:
        return "State:\tZ" in Path(f"/proc/{pid}/status").read_text()
    except OSError:
        return True


@pytest.mark.skipif(not Path("/proc").is_dir(), reason="reads the process table from /proc")
def test_a_job_deaf_to_its_cancel_is_killed_with_every_process_under_it():
    """The worker and its task both ignore SIGINT and SIGTERM, as a local job started from a
    background driver did: after the grace period the whole tree is SIGKILLed, not only the worker."""
    deaf = "import signal; signal.signal(signal.SIGINT, signal.SIG_IGN); signal.signal(signal.SIGTERM, signal.SIG_IGN); "
    task = deaf + "import time; time.sleep(600)"
    worker = deaf + f"import subprocess, sys; subprocess.Popen([sys.executable, '-c', {task!r}]).wait()"
    process = subprocess.Popen([sys.executable, "-c", worker])

    class DeafJob(_FakeJob):
        _process = process

        def done(self) -> bool:
            return process.poll() is not None

        def cancel(self) -> None:
            process.send_signal(signal.SIGINT)

    try:
        deadline = time.monotonic() + 30
        while not launch._descendants(process.pid):
            assert time.monotonic() < deadline, "the worker never started its task"
            time.sleep(0.1)
        [task_pid] = launch._descendants(process.pid)
        with pytest.raises(KeyboardInterrupt), launch.stop_jobs_on_interrupt(grace_seconds=1) as jobs:
            jobs.append(DeafJob("9", finished=False))
            raise KeyboardInterrupt
        assert process.returncode == -signal.SIGKILL
        deadline = time.monotonic() + 10
        while not _is_gone(task_pid):
            assert time.monotonic() < deadline, f"the worker's task {task_pid} survived"
            time.sleep(0.1)
    finally:
        for pid in [*launch._descendants(process.pid), process.pid]:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)


def test_a_failed_job_is_logged_by_the_last_line_of_its_traceback_and_by_its_type_when_it_has_no_text():
    traceback_text = ("Job (task=0) failed during processing with trace:\n----------------------\n"
                      "Traceback (most recent call last):\n  File \"run.py\", line 3, in <module>\n"
                      "ValueError: task 'mrcp' is not registered\n")
    assert launch.job_failure_line(submitit.core.utils.FailedJobError(traceback_text)) == \
        "ValueError: task 'mrcp' is not registered"
    assert launch.job_failure_line(submitit.core.utils.UncompletedJobError("  \n")) == "UncompletedJobError"
