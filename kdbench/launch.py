"""Launching jobs with submitit: cluster profiles, executors, and the distributed helper.

Three executors share one interface (``submitit.Executor``):

* ``debug`` — :class:`submitit.DebugExecutor`: runs each job in this process when its result is
  asked for (breakpoints work); no parallelism.
* ``local`` — :class:`submitit.LocalExecutor`: one subprocess per job on this machine. Unless the
  profile says ``gpus_per_node``, each worker sees one of the GPUs this process may use, round
  robin (:func:`local_worker_gpus`); submitit alone would hide every GPU from it.
* ``slurm`` — :class:`submitit.AutoExecutor` with ``cluster="slurm"`` (given explicitly: submitit
  would otherwise pick Slurm or local depending on whether ``srun`` is on PATH), configured from a
  *cluster profile*.

A profile is a small YAML file (``slurm/<name>.yaml`` in this repository, installed as
``kdbench.slurm``; or any path)::

    partition: gpu          # slurm_partition
    gpus_per_node: 4        # also sets tasks_per_node (one task per GPU) unless given
    cpus_per_task: 8
    mem_gb: 64
    timeout_min: 720
    account: my-project     # slurm_account
    qos: normal             # slurm_qos
    constraint: a100        # slurm_constraint
    array_parallelism: 16   # at most this many array tasks at once (slurm_array_parallelism)
    nodes: 1
    exclude: node[01-02]    # slurm_exclude
    signal_delay_s: 90      # USR2 this long before the time limit: checkpoint + requeue (default 90)
    max_num_timeout: 3      # requeue a job hit by its time limit at most this many times
    setup: ["module load cuda/12.1"]       # lines run before the job in the sbatch script
    additional: {reservation: kd}          # any other sbatch option (slurm_additional_parameters)
    env: {HF_HUB_OFFLINE: "1"}             # exported in the sbatch script

Multi-GPU jobs: with ``gpus_per_node: N`` submitit starts N tasks per node (``srun``), each running
the job function; :func:`init_distributed` (called by the sweep's job function when
``JobEnvironment().num_tasks > 1``) exports ``MASTER_ADDR``, ``MASTER_PORT``, ``RANK``,
``WORLD_SIZE``, ``LOCAL_RANK``, ``LOCAL_WORLD_SIZE`` from :class:`submitit.JobEnvironment` so
Hugging Face ``Trainer``/``accelerate`` pick up DDP, and optionally initialises the process group.
Only task 0's return value is reported by submitit; every task writes through the same run folder.

Time limits and preemption: submitit asks Slurm for ``--signal=USR2@<signal_delay_s>`` (default 90 s
before the limit; ``timeout_min`` must then be >= 3). kdbench's job objects are
``submitit.helpers.Checkpointable``; :func:`graceful_requeue_callback` defers the signal to the
next optimiser step, saves a Trainer checkpoint, then lets submitit requeue the same call (at most
``max_num_timeout`` times). The requeued job reruns ``run_experiment`` on the same run folder, which
resumes the unfinished stage from that checkpoint (the log shows ``resuming from ... at step N``).
Note that Slurm holds a requeued batch job about two minutes before it is eligible again.
"""

from __future__ import annotations

import contextlib
import os
import shlex
import signal
import threading
import time
from collections.abc import Iterator
from importlib import resources
from pathlib import Path
from typing import Any

import yaml

EXECUTORS = ("debug", "local", "slurm")

# profile key -> submitit AutoExecutor parameter
_PROFILE_KEYS: dict[str, str] = {
    "partition": "slurm_partition",
    "gpus_per_node": "gpus_per_node",
    "tasks_per_node": "tasks_per_node",
    "cpus_per_task": "cpus_per_task",
    "mem_gb": "mem_gb",
    "timeout_min": "timeout_min",
    "nodes": "nodes",
    "account": "slurm_account",
    "qos": "slurm_qos",
    "constraint": "slurm_constraint",
    "exclude": "slurm_exclude",
    "array_parallelism": "slurm_array_parallelism",
    "setup": "slurm_setup",
    "additional": "slurm_additional_parameters",
    "comment": "slurm_comment",
    "job_name": "name",
    "signal_delay_s": "slurm_signal_delay_s",  # time-limit warning (USR2) this long before the end
    "max_num_timeout": None,  # executor constructor argument, handled separately
    "env": None,  # turned into setup lines
    "local_parallelism": None,  # used by the sweep for the local executor
}


class ProfileError(ValueError):
    """A cluster profile is missing or malformed; the message names the file and the bad key."""


def available_profiles() -> list[str]:
    """Names of the profiles shipped in ``kdbench.slurm`` (``slurm/*.yaml``)."""
    try:
        root = resources.files("kdbench.slurm")
    except ModuleNotFoundError:  # pragma: no cover - broken install
        return []
    return sorted(p.name[:-5] for p in root.iterdir() if p.name.endswith(".yaml"))


def load_profile(name_or_path: str | os.PathLike[str] | None) -> dict[str, Any]:
    """Load a cluster profile by name (``dev`` -> ``slurm/dev.yaml``) or from a YAML path.

    ``None`` gives an empty profile. Unknown keys are an error naming them.
    """
    if name_or_path is None:
        return {}
    text = str(name_or_path)
    path = Path(text).expanduser()
    if path.suffix in (".yaml", ".yml") or os.sep in text or path.is_file():
        if not path.is_file():
            raise ProfileError(f"profile file {text!r} does not exist")
        raw = path.read_text()
        where = str(path)
    else:
        resource = resources.files("kdbench.slurm").joinpath(f"{text}.yaml")
        if not resource.is_file():
            names = ", ".join(available_profiles()) or "none"
            raise ProfileError(f"unknown cluster profile {text!r} (available: {names}; or give a path)")
        raw = resource.read_text()
        where = f"kdbench.slurm/{text}.yaml"
    data = yaml.safe_load(raw) or {}
    if not isinstance(data, dict):
        raise ProfileError(f"profile {where}: must hold a mapping, got {type(data).__name__}")
    unknown = sorted(set(data) - set(_PROFILE_KEYS))
    if unknown:
        raise ProfileError(f"profile {where}: unknown key(s) {', '.join(unknown)} "
                           f"(valid: {', '.join(sorted(_PROFILE_KEYS))})")
    return data


def slurm_parameters(profile: dict[str, Any]) -> dict[str, Any]:
    """Translate a profile into ``AutoExecutor.update_parameters`` keyword arguments."""
    params: dict[str, Any] = {}
    for key, value in profile.items():
        target = _PROFILE_KEYS.get(key)
        if target is None or value is None:
            continue
        params[target] = value
    gpus = int(profile.get("gpus_per_node") or 0)
    if gpus > 1 and "tasks_per_node" not in profile:
        params["tasks_per_node"] = gpus  # one task (process) per GPU
    env = profile.get("env") or {}
    if env:
        setup = list(params.get("slurm_setup", []))
        setup += [f"export {k}={shlex.quote(str(v))}" for k, v in env.items()]
        params["slurm_setup"] = setup
    return params


def make_executor(kind: str, folder: str | os.PathLike[str], profile: str | dict[str, Any] | None = None):
    """Build a submitit executor writing its logs/pickles under ``folder``.

    ``kind`` is ``debug``, ``local`` or ``slurm``; ``profile`` a profile name, path or mapping. The
    ``local`` executor takes ``timeout_min``, ``gpus_per_node`` and ``tasks_per_node`` from the
    profile (default time limit: 7 days, so long runs are not killed).
    """
    import submitit

    if kind not in EXECUTORS:
        raise ValueError(f"executor: must be one of {', '.join(EXECUTORS)}, got {kind!r}")
    prof = profile if isinstance(profile, dict) else load_profile(profile)
    folder = Path(folder)
    if kind == "debug":
        return submitit.DebugExecutor(folder)
    if kind == "local":
        executor = submitit.LocalExecutor(folder, max_num_timeout=int(prof.get("max_num_timeout", 3)))
        executor.update_parameters(
            timeout_min=float(prof.get("timeout_min", 7 * 24 * 60)),
            gpus_per_node=int(prof.get("gpus_per_node") or 0),
            tasks_per_node=int(prof.get("tasks_per_node") or max(1, int(prof.get("gpus_per_node") or 0))),
        )
        return executor
    executor = submitit.AutoExecutor(folder, cluster="slurm", slurm_max_num_timeout=int(prof.get("max_num_timeout", 3)))
    params = slurm_parameters(prof)
    if params:
        executor.update_parameters(**params)
    return executor


def local_worker_gpus(workers: int) -> list[tuple[int, ...]]:
    """The GPU each of ``workers`` local worker processes sees, as ``CUDA_VISIBLE_DEVICES`` numbers.

    Worker ``i`` gets the ``(i mod G)``-th of the G GPUs this process may use: its own
    ``CUDA_VISIBLE_DEVICES`` when set, else every device torch counts. One GPU each, since a Trainer
    that sees several without a distributed launch wraps the model in ``DataParallel``; empty tuples
    on a machine without GPUs. Identifiers that are not numbers (``GPU-<uuid>``, ``MIG-...``) are
    an error naming them, raised before any job starts: submitit's local executor takes numbers only.
    """
    inherited = os.environ.get("CUDA_VISIBLE_DEVICES")
    if inherited is None:
        import torch

        devices = list(range(torch.cuda.device_count()))
    else:
        names = [name.strip() for name in inherited.split(",") if name.strip()]
        if not all(name.isdigit() for name in names):
            raise ProfileError(f"CUDA_VISIBLE_DEVICES={inherited!r}: the local executor gives each worker one GPU by "
                               "number; name the GPUs by number, or set gpus_per_node in the profile")
        devices = [int(name) for name in names]
    if not devices:
        return [() for _ in range(workers)]
    return [(devices[i % len(devices)],) for i in range(workers)]


def submit_local_workers(executor: Any, profile: dict[str, Any], job: Any, requests: list[Any],
                         submitted: list[Any]) -> None:
    """Submit ``job(request)`` as one local worker process per request, appending each job to
    ``submitted`` as it starts. Each worker sees its share of this machine's GPUs
    (:func:`local_worker_gpus`), unless the profile's ``gpus_per_node`` decides for all of them."""
    if profile.get("gpus_per_node") is not None:
        with executor.batch():
            submitted.extend(executor.submit(job, request) for request in requests)
        return
    for request, gpus in zip(requests, local_worker_gpus(len(requests))):
        executor.update_parameters(gpus_per_node=len(gpus), visible_gpus=gpus, tasks_per_node=1)
        submitted.append(executor.submit(job, request))


@contextlib.contextmanager
def stop_jobs_on_interrupt(grace_seconds: float = 30.0) -> Iterator[list[Any]]:
    """Submit jobs and wait on them inside this block; it yields a list to which the caller adds each
    job as it is submitted. If the waiting process is interrupted (Ctrl-C, or SIGTERM, which here
    raises ``KeyboardInterrupt`` as Ctrl-C does), every job still running is cancelled (a local job:
    SIGINT to its worker, which passes it on and SIGKILLs its task a second later), waited on for up
    to ``grace_seconds``, then killed with its whole process tree if it still runs, and the interrupt
    re-raised.

    Ctrl-C at a terminal reaches local workers anyway (the whole process group gets it), but ``kill``
    and schedulers signal the driver alone, and its local workers would otherwise train on unseen,
    holding the machine and their run folders. A driver started in the background of a script (``&``,
    ``nohup``) inherits SIGINT *ignored*, and so would the workers it starts, making a local cancel a
    no-op: while the block is open SIGINT raises ``KeyboardInterrupt`` again, so the workers submitted
    inside it take SIGINT's default. Signal handlers can be set in the main thread only."""
    jobs: list[Any] = []
    restore: list[tuple[int, Any]] = []
    if threading.current_thread() is threading.main_thread():
        def interrupt(signum: int, frame: Any) -> None:
            raise KeyboardInterrupt(f"signal {signum}")

        restore.append((signal.SIGTERM, signal.signal(signal.SIGTERM, interrupt)))
        if signal.getsignal(signal.SIGINT) is signal.SIG_IGN:
            restore.append((signal.SIGINT, signal.signal(signal.SIGINT, signal.default_int_handler)))
    try:
        yield jobs
    except KeyboardInterrupt:
        live = [job for job in jobs if not job.done()]
        for job in live:
            job.cancel()
        deadline = time.monotonic() + grace_seconds
        while any(not job.done() for job in live) and time.monotonic() < deadline:
            time.sleep(0.2)
        for job in live:
            if not job.done():
                _kill_local_job(job)
        if live:
            print(f"[kdbench] interrupted: stopped {len(live)} job(s): {', '.join(str(j.job_id) for j in live)}",
                  flush=True)
        raise
    finally:
        for signum, handler in reversed(restore):
            signal.signal(signum, handler)


def job_failure_line(error: BaseException) -> str:
    """One line for a log that says why a submitted job failed: submitit's error carries the job's
    whole traceback, whose last line names the exception and its message."""
    lines = str(error).strip().splitlines()
    return lines[-1] if lines else type(error).__name__


def _kill_local_job(job: Any) -> None:
    """SIGKILL a local job's worker process and every process under it (its tasks, their children);
    a Slurm job has no local process (``scancel`` is its cancel), and is left alone."""
    process = getattr(job, "_process", None)  # submitit.local.LocalJob keeps its worker's Popen here
    if process is None or process.poll() is not None:
        return
    for pid in [*_descendants(process.pid), process.pid]:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.kill(pid, signal.SIGKILL)
    process.wait()


def _descendants(pid: int) -> list[int]:
    """Every live process below ``pid`` in the process tree, deepest first, read from ``/proc``
    (empty where there is no ``/proc``)."""
    children: dict[int, list[int]] = {}
    proc = Path("/proc")
    if not proc.is_dir():
        return []
    for entry in proc.iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
        except OSError:
            continue
        parent = int(stat[stat.rindex(")") + 2:].split()[1])  # after "pid (comm) state": the ppid
        children.setdefault(parent, []).append(int(entry.name))
    found: list[int] = []
    stack = list(children.get(pid, []))
    while stack:
        child = stack.pop()
        found.append(child)
        stack.extend(children.get(child, []))
    return found[::-1]


def init_distributed(backend: str | None = None, init_process_group: bool = False):
    """Set up ``torch.distributed`` from the submitit job environment (one task per GPU).

    Exports ``MASTER_ADDR``/``MASTER_PORT``/``RANK``/``WORLD_SIZE``/``LOCAL_RANK``/
    ``LOCAL_WORLD_SIZE`` (the ``env://`` convention that ``torch.distributed``, ``accelerate`` and
    Hugging Face ``Trainer`` read) and, with ``init_process_group=True``, initialises the default
    process group (``nccl`` when CUDA is available, else ``gloo``). Returns the
    :class:`submitit.helpers.TorchDistributedEnvironment`, or ``None`` outside a multi-task job.

    Not exercised by the test-suite (it needs several GPUs); the Trainer-based engine needs only
    the exported variables, so the sweep job calls it with ``init_process_group=False``.
    """
    import submitit

    try:
        env = submitit.JobEnvironment()
    except RuntimeError:  # not inside a submitit job (e.g. `kdbench tune` running trials inline)
        return None
    if not env.activated() or env.num_tasks <= 1:
        return None
    dist_env = submitit.helpers.TorchDistributedEnvironment().export(set_cuda_visible_devices=False)
    os.environ.setdefault("LOCAL_WORLD_SIZE", str(dist_env.local_world_size))
    if init_process_group:
        import torch

        if backend is None:
            backend = "nccl" if torch.cuda.is_available() else "gloo"
        if torch.cuda.is_available():
            torch.cuda.set_device(dist_env.local_rank)
        if not torch.distributed.is_initialized():
            torch.distributed.init_process_group(backend=backend)
    return dist_env


def current_job_id() -> str | None:
    """This job's id as ``squeue``/``sacct`` name it (``<array job>_<task>`` for an array task), or
    the local executor's job id, or None outside a job."""
    job_id = os.environ.get("SLURM_ARRAY_JOB_ID")
    if job_id and os.environ.get("SLURM_ARRAY_TASK_ID"):
        return f"{job_id}_{os.environ['SLURM_ARRAY_TASK_ID']}"
    return os.environ.get("SLURM_JOB_ID") or os.environ.get("SUBMITIT_LOCAL_JOB_ID")


def configure_job_process() -> None:
    """Prepare a submitted job's process: thread count from the allocation, DDP variables.

    Called first thing by every kdbench job function. With several tasks per node (one per GPU),
    exports the ``torch.distributed`` environment (:func:`init_distributed`); torch then uses no
    more threads than the CPUs Slurm gave the task.
    """
    init_distributed(init_process_group=False)
    cpus = os.environ.get("SLURM_CPUS_PER_TASK")
    if cpus and cpus.isdigit():
        import torch

        torch.set_num_threads(max(1, int(cpus)))


def graceful_requeue_callback(signum: int | None = None):
    """A ``TrainerCallback`` that turns submitit's time-limit/preemption signal into a clean stop.

    submitit asks Slurm for ``--signal=USR2@90`` and, on that signal, calls the job's
    ``checkpoint()`` and requeues the job *immediately*, from inside the signal handler, wherever
    training happens to be. Anything trained since the last scheduled Trainer checkpoint would be
    lost. This callback installs its own handler that only records the signal; at the next step
    boundary it asks the Trainer to save a checkpoint and, once saved (``on_save``), hands over to
    submitit's handler (checkpoint + requeue + exit), whose exit it raises as
    :class:`kdbench.engine.resume.Requeued`, so the run is recorded ``requeued``. The requeued job
    reruns the same ``run_experiment`` call, which resumes the stage from that checkpoint. Outside a Trainer loop
    (loading, evaluation after training) the signal goes to submitit's handler at once.
    """
    import signal

    from transformers import TrainerCallback

    chosen = signal.SIGUSR2 if signum is None else signum

    class GracefulRequeue(TrainerCallback):
        def __init__(self) -> None:
            self.pending: tuple[int, Any] | None = None
            self.training = False
            self.previous = signal.getsignal(chosen)
            if callable(self.previous):  # only inside a submitit job; elsewhere leave signals alone
                signal.signal(chosen, self._on_signal)

        def _on_signal(self, received: int, frame: Any) -> None:
            print(f"[kdbench] received signal {received}: checkpointing at the next step", flush=True)
            self.pending = (received, frame)
            if not self.training:
                self._hand_over()

        def _hand_over(self) -> None:
            from kdbench.engine.resume import Requeued

            received, frame = self.pending  # type: ignore[misc]
            signal.signal(chosen, self.previous)
            try:
                self.previous(received, frame)  # submitit: checkpoint(), requeue, sys.exit
            except SystemExit as exit_:  # requeued (submitit raises an error when it does not requeue)
                raise Requeued(exit_.code) from None

        def on_train_begin(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
            self.training = True

        def on_train_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
            self.training = False
            if self.pending:
                self._hand_over()

        def on_step_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
            if self.pending:
                control.should_save = True
                control.should_evaluate = False

        def on_save(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
            if self.pending:
                print(f"[kdbench] checkpoint saved at step {state.global_step}; requeueing", flush=True)
                self._hand_over()

    return GracefulRequeue()


# ---------------------------------------------------------------------------------------------
# What Slurm knows about submitted jobs
# ---------------------------------------------------------------------------------------------
# Job states (squeue/sacct names) in which a job may still run: it is neither finished nor gone.
SLURM_LIVE_STATES = frozenset({"PENDING", "RUNNING", "CONFIGURING", "COMPLETING", "SUSPENDED", "REQUEUED",
                               "REQUEUE_FED", "REQUEUE_HOLD", "RESIZING", "SIGNALING", "STAGE_OUT", "STOPPED",
                               "RESV_DEL_HOLD", "SPECIAL_EXIT"})


def slurm_job_states(job_ids: list[str] | tuple[str, ...] | set[str], timeout_s: float = 30) -> dict[str, str | None] | None:
    """Slurm's state of each job id (``123`` or an array task ``123_4``): ``PENDING``, ``RUNNING``,
    ``COMPLETED``, ``FAILED``, ``CANCELLED`` ... (the first word of the state, so ``CANCELLED by 0``
    reads ``CANCELLED``), or ``None`` for a job Slurm knows nothing of any more.

    ``squeue --array`` answers for queued and running jobs (an array task that has not started yet
    has no accounting record of its own), ``sacct`` for finished ones. A *pending* array task that
    is cancelled disappears from both: Slurm 22.05 just removes it from the array, so ``None`` for a
    job that was submitted means it was cancelled before it started. Returns ``None`` (no answer at
    all) when Slurm cannot be asked.
    """
    import subprocess

    wanted = {str(job) for job in job_ids if job}
    if not wanted:
        return {}
    user = os.environ.get("USER") or _user_name()
    try:
        queue = subprocess.run(["squeue", "--array", "--noheader", "--format=%i|%T", f"--user={user}"],
                               capture_output=True, text=True, timeout=timeout_s, check=True).stdout
    except (OSError, subprocess.SubprocessError):
        return None
    states: dict[str, str | None] = {}
    for line in queue.splitlines():
        job, _, state = line.strip().partition("|")
        if job in wanted and state:
            states[job] = state.split()[0]
    rest = sorted(wanted - set(states))
    if rest:
        try:
            acct = subprocess.run(["sacct", "--noheader", "--parsable2", "--allocations", "--format=JobID,State",
                                   f"--jobs={','.join(rest)}"], capture_output=True, text=True,
                                  timeout=timeout_s, check=True).stdout
        except (OSError, subprocess.SubprocessError):
            return None
        for line in acct.splitlines():
            job, _, state = line.strip().partition("|")
            if job in wanted and job not in states and state:
                states[job] = state.split()[0]
    return {job: states.get(job) for job in wanted}


def _user_name() -> str:
    import pwd

    return pwd.getpwuid(os.getuid()).pw_name
