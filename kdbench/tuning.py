"""Hyperparameter search with Optuna: ``kdbench tune``.

A study maximises the task's main dev metric (``TaskSpec.main_metric``, as written to
``result.json``) over the method's declared search space (``Method.search_space()``), which the
command line (``--space alpha=float:0.1:0.9``) or the YAML config (``search_space:``) may override.
Each trial is one ``run_experiment`` call with its own run folder (``label=<study>-t<number>``).
Intermediate dev evaluations are reported to the trial, so a pruner can stop hopeless trials.

Storage: ``sqlite:///PATH`` (the default, ``OUTPUT/study.db``; any SQLAlchemy URL) or a journal file
(``journal:PATH`` or a path ending in ``.journal``/``.log``;
:class:`optuna.storages.journal.JournalFileBackend`). The study is created once by the driver,
before any worker starts; workers only ``load_study`` (creating one SQLite study from several
processes at once fails).

Dead workers (database storages): every running trial beats a heartbeat into the storage
(``--heartbeat`` seconds); a trial whose heartbeat is older than the grace period (``--grace``,
default twice the heartbeat) is failed by whichever worker or driver looks next, and Optuna's
:class:`~optuna.storages.RetryHeartbeatStaleTrialCallback` queues a retry with the same parameters
(at most ``--max-retry`` times). The retry takes the original trial's label, hence its run folder,
so it resumes from the dead trial's last checkpoint. Live trials are never touched: a re-run of
``kdbench tune`` while workers run just joins them (and, on Slurm, submits no more workers than
``--workers`` minus those still queued or running). Workers stop once the study holds exactly
``--trials`` finished (complete or pruned) trials: a worker only starts a trial while finished +
running trials are fewer than that, and waits for the running ones otherwise (one of them may die
and be retried). A journal file has no heartbeat: there, trials left ``RUNNING`` are failed when
the driver starts (safe only when no worker of an earlier invocation is alive).

``kdbench tune`` exits 1, saying so, when fewer than ``--trials`` trials finished (the best-so-far
files are still written).

Outputs in ``--output``: the storage, ``trials/`` (run folders; a pruned or failed trial keeps its
own), ``workers.json`` (Slurm job ids of the workers), ``best_config.yaml`` (a ready-to-run
``kdbench run --config`` file), ``best.json``, ``optimization_history.png`` and
``param_importances.png``.

No torch/transformers/optuna import at module level (the CLI imports this module).
"""

from __future__ import annotations

import argparse
import json
import logging
import math
import os
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import submitit
import yaml

from kdbench.config import ConfigError, build_run_config, load_yaml, parse_overrides
from kdbench.search_space import Choice, FloatRange, IntRange, SearchDimension, SearchSpace

log = logging.getLogger("kdbench.tuning")

DEFAULT_STORAGE = "study.db"  # SQLite: its RDB storage has the heartbeat that detects dead workers
WORKERS_FILE = "workers.json"
FINISHED_STATES = ("COMPLETE", "PRUNED")
BEST_CONFIG = "best_config.yaml"
SPACE_KEY = "search_space"
INLINE = "inline"
TUNE_EXECUTORS = (INLINE, "debug", "local", "slurm")
PRUNERS = ("median", "none")
# Keys of the base config that must not reach a trial or the exported best config.
PER_RUN_KEYS = ("label", "output")


# ---------------------------------------------------------------------------------------------
# Search spaces
# ---------------------------------------------------------------------------------------------
def parse_dimension(name: str, text: str) -> SearchDimension | None:
    """``float:LOW:HIGH[:log]``, ``int:LOW:HIGH[:STEP]``, ``choice:A,B,C``; ``none`` removes the dim."""
    parts = text.strip().split(":")
    kind = parts[0].lower()
    try:
        if kind == "none" and len(parts) == 1:
            return None
        if kind == "float" and len(parts) in (3, 4):
            log_scale = len(parts) == 4 and parts[3].lower() == "log"
            if len(parts) == 4 and not log_scale:
                raise ValueError(f"the 4th field must be 'log', got {parts[3]!r}")
            return _checked(name, FloatRange(float(parts[1]), float(parts[2]), log_scale))
        if kind == "int" and len(parts) in (3, 4):
            step = int(parts[3]) if len(parts) == 4 else 1
            return _checked(name, IntRange(int(parts[1]), int(parts[2]), step))
        if kind == "choice" and len(parts) == 2 and parts[1]:
            return Choice(tuple(yaml.safe_load(v) for v in parts[1].split(",")))
    except ValueError as error:
        raise ConfigError(f"search space {name}={text!r}: {error}") from None
    raise ConfigError(f"search space {name}={text!r}: expected float:LOW:HIGH[:log], int:LOW:HIGH[:STEP], "
                      "choice:A,B,... or none")


def dimension_from_mapping(name: str, value: Any) -> SearchDimension | None:
    """YAML form: ``{low: 0.1, high: 0.9, log: true}``, ``{low: 2, high: 6, step: 1, type: int}``,
    ``{choices: [1, 2, 4]}``, a string in the command-line form, or ``null`` to remove it."""
    if value is None:
        return None
    if isinstance(value, str):
        return parse_dimension(name, value)
    if not isinstance(value, dict):
        raise ConfigError(f"search_space.{name}: expected a mapping or a string, got {value!r}")
    keys = set(value)
    if keys == {"choices"}:
        if not isinstance(value["choices"], list) or not value["choices"]:
            raise ConfigError(f"search_space.{name}.choices: expected a non-empty list, got {value['choices']!r}")
        return Choice(tuple(value["choices"]))
    if {"low", "high"} <= keys <= {"low", "high", "log", "step", "type"}:
        kind = value.get("type") or ("int" if "step" in value or all(isinstance(value[k], int) and not
                                                                         isinstance(value[k], bool)
                                                                         for k in ("low", "high")) else "float")
        if kind == "int":
            return _checked(name, IntRange(int(value["low"]), int(value["high"]), int(value.get("step", 1))))
        if kind == "float":
            return _checked(name, FloatRange(float(value["low"]), float(value["high"]), bool(value.get("log", False))))
        raise ConfigError(f"search_space.{name}.type: must be int or float, got {kind!r}")
    raise ConfigError(f"search_space.{name}: expected keys low/high[/log|step|type] or choices, got {sorted(keys)}")


def _checked(name: str, dim: SearchDimension) -> SearchDimension:
    if isinstance(dim, (FloatRange, IntRange)) and not dim.low < dim.high:
        raise ConfigError(f"search space {name}: low must be < high, got {dim.low!r} .. {dim.high!r}")
    if isinstance(dim, FloatRange) and dim.log and dim.low <= 0:
        raise ConfigError(f"search space {name}: a log range needs low > 0, got {dim.low!r}")
    if isinstance(dim, IntRange) and dim.step <= 0:
        raise ConfigError(f"search space {name}: step must be > 0, got {dim.step!r}")
    return dim


def resolve_space(declared: SearchSpace, yaml_space: dict[str, Any] | None, cli_space: list[str],
                  fixed: set[str] | frozenset[str] = frozenset()) -> SearchSpace:
    """The method's space, updated by the YAML ``search_space`` mapping, then by ``--space`` items.

    A declared dimension whose key the user fixed (``lr=1e-4`` on the command line or in the YAML
    config; ``learning_rate`` and ``lr`` are one key) is not searched; an explicit ``search_space`` /
    ``--space`` entry still is.
    """
    from kdbench.config import STANDARD_KEYS

    fixed_keys = {STANDARD_KEYS.get(key, key) for key in fixed}
    space: dict[str, SearchDimension] = {name: dim for name, dim in declared.items()
                                         if STANDARD_KEYS.get(name, name) not in fixed_keys}
    for name, value in (yaml_space or {}).items():
        dim = dimension_from_mapping(name, value)
        space.pop(name, None) if dim is None else space.__setitem__(name, dim)
    for item in cli_space:
        name, sep, text = item.partition("=")
        if not sep or not name.strip():
            raise ConfigError(f"--space {item!r}: expected NAME=SPEC, e.g. alpha=float:0.1:0.9")
        dim = parse_dimension(name.strip(), text)
        space.pop(name.strip(), None) if dim is None else space.__setitem__(name.strip(), dim)
    if not space:
        raise ConfigError("the search space is empty: the method declares none; give --space NAME=SPEC")
    return space


def suggest(trial: Any, space: SearchSpace) -> dict[str, Any]:
    """Ask ``trial`` for one value per dimension (Optuna's distributions, same names)."""
    values: dict[str, Any] = {}
    for name, dim in space.items():
        if isinstance(dim, FloatRange):
            values[name] = trial.suggest_float(name, dim.low, dim.high, log=dim.log)
        elif isinstance(dim, IntRange):
            values[name] = trial.suggest_int(name, dim.low, dim.high, step=dim.step)
        elif isinstance(dim, Choice):
            values[name] = trial.suggest_categorical(name, list(dim.values))
        else:  # pragma: no cover - the SearchDimension union is closed
            raise ConfigError(f"search space {name}: unsupported dimension {dim!r}")
    return values


def space_midpoint(space: SearchSpace) -> dict[str, Any]:
    """A representative point (used to validate every dimension name before the study starts)."""
    point: dict[str, Any] = {}
    for name, dim in space.items():
        if isinstance(dim, FloatRange):
            point[name] = math.sqrt(dim.low * dim.high) if dim.log else (dim.low + dim.high) / 2
        elif isinstance(dim, IntRange):
            point[name] = dim.low
        else:
            point[name] = dim.values[0]
    return point


def space_to_yaml(space: SearchSpace) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for name, dim in space.items():
        if isinstance(dim, FloatRange):
            out[name] = {"low": dim.low, "high": dim.high, "log": dim.log, "type": "float"}
        elif isinstance(dim, IntRange):
            out[name] = {"low": dim.low, "high": dim.high, "step": dim.step, "type": "int"}
        else:
            out[name] = {"choices": list(dim.values)}
    return out


# ---------------------------------------------------------------------------------------------
# Storage, pruning
# ---------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class Heartbeat:
    """Dead-worker detection of a database storage: beat every ``interval_s``; a running trial
    silent for ``grace_s`` is failed and retried (same parameters, same run folder) up to
    ``max_retry`` times."""

    interval_s: int = 60
    grace_s: int | None = None  # default: twice the interval
    max_retry: int = 2


def make_storage(url: str, heartbeat: Heartbeat | None = None) -> Any:
    """An Optuna storage from ``sqlite:///...``/another SQLAlchemy URL, or a journal file path.

    ``heartbeat`` enables Optuna's heartbeat and stale-trial retry (database storages only).
    """
    import optuna
    from optuna.storages.journal import JournalFileBackend, JournalStorage

    if url.startswith("journal:"):
        return JournalStorage(JournalFileBackend(url[len("journal:"):]))
    if "://" in url:
        if heartbeat is None or heartbeat.interval_s <= 0:
            return optuna.storages.RDBStorage(url)
        import warnings

        with warnings.catch_warnings():  # the heartbeat arguments are marked experimental
            warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)
            return optuna.storages.RDBStorage(
                url, heartbeat_interval=heartbeat.interval_s,
                grace_period=heartbeat.grace_s or 2 * heartbeat.interval_s,
                heartbeat_stale_trial_callback=optuna.storages.RetryHeartbeatStaleTrialCallback(
                    max_retry=heartbeat.max_retry))
    if url.endswith((".journal", ".log", ".jsonl")):
        return JournalStorage(JournalFileBackend(url))
    raise ConfigError(f"--storage {url!r}: expected sqlite:///PATH (or another database URL), journal:PATH, "
                      "or a path ending in .journal/.log")


def make_pruner(name: str) -> Any:
    import optuna

    if name == "median":  # below the median of earlier trials at the same evaluation; never at the
        # first evaluation (reports are numbered from 1, and Optuna skips steps < n_warmup_steps)
        return optuna.pruners.MedianPruner(n_startup_trials=2, n_warmup_steps=2)
    if name == "none":
        return optuna.pruners.NopPruner()
    raise ConfigError(f"--pruner: must be one of {', '.join(PRUNERS)}, got {name!r}")


def pruning_callback(trial: Any, metric: str):
    """A ``TrainerCallback`` reporting ``metric`` (e.g. ``eval_accuracy``) at every dev evaluation.

    Reports are numbered 1, 2, ... across all stages of the run; when the pruner says so it raises
    :class:`optuna.TrialPruned` out of the Trainer loop (the engine records the run as failed with
    that error, and Optuna records the trial as pruned).
    """
    import optuna
    from transformers import TrainerCallback

    class OptunaPruning(TrainerCallback):
        def __init__(self) -> None:
            self.evaluations = 0

        def on_evaluate(self, args: Any, state: Any, control: Any, metrics: dict[str, float] | None = None,
                        **kwargs: Any) -> None:
            if not metrics or metric not in metrics:
                return
            self.evaluations += 1
            trial.report(float(metrics[metric]), self.evaluations)
            if trial.should_prune():
                raise optuna.TrialPruned(f"pruned at evaluation {self.evaluations} ({metric}={metrics[metric]:.4g})")

    return OptunaPruning()


# ---------------------------------------------------------------------------------------------
# Study description shared by driver and workers
# ---------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class TuneSpec:
    study_name: str
    storage: str
    base: dict[str, Any]  # run keys every trial shares (method, task, teacher, student, overrides)
    space: dict[str, Any]  # search_space in YAML form (space_to_yaml), picklable and readable
    output: str
    main_metric: str
    pruner: str = "median"
    sampler_seed: int | None = None
    heartbeat: Heartbeat = field(default_factory=Heartbeat)

    @property
    def trials_dir(self) -> Path:
        return Path(self.output) / "trials"

    def dimensions(self) -> SearchSpace:
        return {name: dimension_from_mapping(name, value) for name, value in self.space.items()}  # type: ignore[misc]


def _system_attrs(trial: Any) -> dict[str, Any]:
    if hasattr(trial, "system_attrs"):  # a FrozenTrial
        return trial.system_attrs
    return trial.storage.get_trial_system_attrs(trial._trial_id)  # a live Trial keeps them in the storage


def original_trial_number(trial: Any) -> int:
    """The number of the trial this one retries (a dead worker's), else its own number."""
    retried = _system_attrs(trial).get("failed_trial")
    return trial.number if retried is None else int(retried)


def fail_stale_trials(study: Any) -> None:
    """Fail the running trials of dead workers (stale heartbeat) and queue their retries; a no-op
    for a storage without heartbeat."""
    import warnings

    import optuna
    from optuna.storages import fail_stale_trials as fail_stale

    with warnings.catch_warnings():
        warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)
        fail_stale(study)


def objective(spec: TuneSpec, trial: Any) -> float:
    """One trial: suggest, run, return the main dev metric from ``result.json``.

    The run is labelled by the trial's *original* number, so a retry of a dead worker's trial has
    the same config, hence the same run folder, and resumes from its last checkpoint. The run
    folder is recorded before training, so a pruned or failed trial names its own folder too.
    """
    from kdbench.engine import plan_run, run_experiment
    from kdbench.records import RESULT_FILE, read_record

    params = suggest(trial, spec.dimensions())
    original = original_trial_number(trial)
    values = {**spec.base, **params, "label": f"{spec.study_name}-t{original}", "output": str(spec.trials_dir)}
    config = build_run_config(values)
    trial.set_user_attr("run_dir", str(plan_run(config).run_dir))
    if original != trial.number:
        trial.set_user_attr("retry_of", original)
        print(f"[kdbench] trial {trial.number} retries trial {original} (its worker died) in "
              f"{trial.user_attrs['run_dir']}", flush=True)
    run_dir = run_experiment(config, callbacks=[pruning_callback(trial, f"eval_{spec.main_metric}")])
    metrics = read_record(run_dir / RESULT_FILE)["metrics"]
    if spec.main_metric not in metrics:
        raise ConfigError(f"trial {trial.number}: result.json of {run_dir} has no {spec.main_metric!r} "
                          f"(metrics: {sorted(metrics)})")
    return float(metrics[spec.main_metric])


@dataclass(frozen=True)
class WorkerRequest:
    spec: TuneSpec
    trials: int  # the worker gives up after this many of its own trials failed
    worker: int
    target: int  # finished (complete or pruned) trials wanted in the study in all


def worker_seed(sampler_seed: int | None, worker: int, existing_trials: int) -> int | None:
    """A sampler seed per worker *and* per resume: a worker that reloads a study must not replay
    the random start-up samples an earlier worker with the same index already tried."""
    return None if sampler_seed is None else sampler_seed + 7919 * worker + 104729 * existing_trials


class SurplusTrial(RuntimeError):
    """Two workers started a trial at the same moment when only one more was needed: the later
    one (higher number) gives its trial up (recorded as failed with ``user_attrs["surplus"]``)."""


class TuneWorker(submitit.helpers.Checkpointable):
    """A submitted worker: loads the (already created) study and runs trials until the study holds
    ``target`` finished trials (see the module docstring); ``trials`` bounds how many of its own
    trials may fail before it gives up."""

    def __call__(self, request: WorkerRequest) -> dict[str, int]:
        import optuna
        from optuna.storages._heartbeat import is_heartbeat_enabled
        from optuna.trial import TrialState

        from kdbench.launch import configure_job_process, current_job_id

        configure_job_process()
        spec = request.spec
        storage = make_storage(spec.storage, spec.heartbeat)
        study = optuna.load_study(study_name=spec.study_name, storage=storage, pruner=make_pruner(spec.pruner))
        study.sampler = optuna.samplers.TPESampler(seed=worker_seed(spec.sampler_seed, request.worker,
                                                                    len(study.trials)))
        job_id = current_job_id()
        watched = is_heartbeat_enabled(storage)  # can a running trial of a dead worker be told apart?
        busy = (TrialState.RUNNING, TrialState.WAITING) if watched else (TrialState.WAITING,)
        finished = (TrialState.COMPLETE, TrialState.PRUNED)

        def run_trial(trial: Any) -> float:
            trial.set_user_attr("worker", request.worker)
            trial.set_user_attr("job_id", job_id)
            trial.set_user_attr("pid", os.getpid())
            trial.set_user_attr("host", os.uname().nodename)
            ahead = [t for t in study.get_trials(deepcopy=False, states=(*finished, *busy)) if t.number < trial.number]
            if original_trial_number(trial) == trial.number and len(ahead) >= request.target:
                trial.set_user_attr("surplus", True)
                raise SurplusTrial(f"trial {trial.number} not needed: {request.target} trials are finished or running")
            return objective(spec, trial)

        mine: dict[str, int] = {"COMPLETE": 0, "PRUNED": 0, "FAIL": 0}
        while True:
            fail_stale_trials(study)  # a dead worker's trial: failed, and its retry queued
            if len(study.get_trials(deepcopy=False, states=finished)) >= request.target:
                break
            waiting = study.get_trials(deepcopy=False, states=(TrialState.WAITING,))
            active = study.get_trials(deepcopy=False, states=(*finished, *busy))
            if not waiting and len(active) >= request.target:
                time.sleep(max(1, min(10, spec.heartbeat.interval_s)))  # the running trials may yet die
                continue
            if mine["FAIL"] >= request.trials:
                log.error("worker %d: %d of its trials failed; giving up", request.worker, mine["FAIL"])
                break
            study.optimize(run_trial, n_trials=1, catch=(Exception,), gc_after_trial=True)
            last = max((t for t in study.get_trials(deepcopy=False) if t.user_attrs.get("worker") == request.worker
                        and t.user_attrs.get("pid") == os.getpid()), key=lambda t: t.number, default=None)
            if last is not None and last.state.name in mine and not last.user_attrs.get("surplus"):
                mine[last.state.name] += 1
        return mine


# ---------------------------------------------------------------------------------------------
# Driver
# ---------------------------------------------------------------------------------------------
@dataclass
class TuneResult:
    best_value: float
    best_params: dict[str, Any]
    best_trial: int
    best_run_dir: str | None
    counts: dict[str, int]
    files: dict[str, str] = field(default_factory=dict)


def prepare_study(spec: TuneSpec, direction: str = "maximize") -> Any:
    """Create (or load) the study once, before any worker starts.

    With a heartbeat, only trials whose worker died (stale heartbeat) are failed, and retried; live
    trials of workers still running are left alone. Without one (journal file), every ``RUNNING``
    trial is taken for a dead worker's and failed.
    """
    import optuna
    from optuna.storages._heartbeat import is_heartbeat_enabled
    from optuna.trial import TrialState

    storage = make_storage(spec.storage, spec.heartbeat)
    study = optuna.create_study(study_name=spec.study_name, storage=storage, direction=direction,
                                load_if_exists=True, pruner=make_pruner(spec.pruner))
    if is_heartbeat_enabled(storage):
        fail_stale_trials(study)
    else:
        for trial in study.get_trials(deepcopy=False, states=(TrialState.RUNNING,)):
            log.warning("trial %d was left running by an earlier invocation; marking it failed (a journal "
                        "storage has no heartbeat to tell a live worker from a dead one)", trial.number)
            storage.set_trial_state_values(trial._trial_id, TrialState.FAIL)
    study.set_user_attr("base", spec.base)
    study.set_user_attr("search_space", spec.space)
    study.set_user_attr("main_metric", spec.main_metric)
    return study


def finished_trials(study: Any) -> int:
    from optuna.trial import TrialState

    return len(study.get_trials(deepcopy=False, states=(TrialState.COMPLETE, TrialState.PRUNED)))


class TuningIncompleteError(RuntimeError):
    """Fewer trials than asked finished; the message gives the counts (best-so-far files are written)."""


def _live_slurm_workers(output: Path) -> list[str]:
    """Job ids of this study's Slurm workers (``workers.json``) that are still queued or running."""
    from kdbench.launch import SLURM_LIVE_STATES, slurm_job_states

    path = output / WORKERS_FILE
    recorded = json.loads(path.read_text()).get("job_ids", []) if path.is_file() else []
    states = slurm_job_states(recorded) or {}
    return [job for job in recorded if states.get(job) in SLURM_LIVE_STATES]


def _wait_for_slurm_jobs(job_ids: list[str], poll_seconds: float) -> dict[str, str | None]:
    """Poll ``squeue``/``sacct`` until none of ``job_ids`` is queued or running (a job cancelled
    while pending is gone at once; submitit's ``Job.result`` would wait for it forever)."""
    from kdbench.launch import SLURM_LIVE_STATES, slurm_job_states

    while True:
        states = slurm_job_states(job_ids)
        if states is not None and not any(state in SLURM_LIVE_STATES for state in states.values()):
            return states
        time.sleep(poll_seconds)


def _submit_tuning_workers(spec: TuneSpec, requests: list[WorkerRequest], executor_kind: str, output: Path,
                           profile: str | dict[str, Any] | None) -> list[Any]:
    """Submit one tuning worker job per request (none when there is none) and say so."""
    if not requests:
        return []
    from kdbench.launch import load_profile, make_executor, submit_local_workers

    prof = profile if isinstance(profile, dict) else load_profile(profile)
    executor = make_executor(executor_kind, output / ".submitit", prof)
    jobs: list[Any] = []
    if executor_kind == "local":
        submit_local_workers(executor, prof, TuneWorker(), requests, jobs)
    else:
        if executor_kind == "slurm":
            executor.update_parameters(name=f"kdbench-tune-{spec.study_name}")
        with executor.batch():
            jobs = [executor.submit(TuneWorker(), request) for request in requests]
    print(f"[kdbench] {len(jobs)} tuning worker(s) submitted ({executor_kind}): "
          f"{', '.join(str(j.job_id) for j in jobs)}", flush=True)
    return jobs


def run_tune(spec: TuneSpec, trials: int, workers: int = 1, executor_kind: str = INLINE,
             profile: str | dict[str, Any] | None = None, poll_seconds: float = 5.0) -> TuneResult:
    """Run the study to ``trials`` finished trials; raise :class:`TuningIncompleteError` (after
    writing the best-so-far files) when fewer finished."""
    import optuna

    output = Path(spec.output)
    output.mkdir(parents=True, exist_ok=True)
    study = prepare_study(spec)
    live = _live_slurm_workers(output) if executor_kind == "slurm" else []
    needed = max(0, trials - finished_trials(study))
    count = min(workers, needed) - len(live) if needed else 0
    if live:
        print(f"[kdbench] {len(live)} worker(s) of an earlier invocation still queued or running: "
              f"{', '.join(live)}", flush=True)
    if not needed:
        log.info("study %s already has %d finished trials; running none", spec.study_name, finished_trials(study))
    requests = [WorkerRequest(spec, max(1, trials), len(live) + i, trials) for i in range(max(0, count))]
    if requests and executor_kind == INLINE:
        for request in requests:
            TuneWorker()(request)
    elif requests or live:
        from kdbench.launch import job_failure_line, stop_jobs_on_interrupt

        if executor_kind != "slurm":
            with stop_jobs_on_interrupt() as jobs:
                jobs.extend(_submit_tuning_workers(spec, requests, executor_kind, output, profile))
                for job in jobs:
                    try:
                        job.result()
                    except Exception as error:
                        log.error("tuning worker %s failed: %s", job.job_id, job_failure_line(error))
        else:
            jobs = _submit_tuning_workers(spec, requests, executor_kind, output, profile)
            from kdbench.records import write_json_atomic

            job_ids = [*live, *(str(job.job_id) for job in jobs)]
            write_json_atomic(output / WORKERS_FILE, {"job_ids": job_ids})
            ended = _wait_for_slurm_jobs(job_ids, poll_seconds)
            failed = {job: state for job, state in ended.items() if state != "COMPLETED"}
            if failed:
                log.error("tuning workers that did not end well: %s",
                          ", ".join(f"{job} {state or 'CANCELLED (before it started)'}" for job, state in failed.items()))
    study = optuna.load_study(study_name=spec.study_name, storage=make_storage(spec.storage))
    counts = {state: sum(1 for t in study.trials if t.state.name == state)
              for state in ("COMPLETE", "PRUNED", "FAIL", "RUNNING", "WAITING")}
    completed = [t for t in study.trials if t.state.name == "COMPLETE"]
    finished = counts["COMPLETE"] + counts["PRUNED"]
    if not completed:
        raise TuningIncompleteError(f"study {spec.study_name!r}: no trial completed of {trials} asked ({counts}); "
                                    f"see the trial run folders under {spec.trials_dir}")
    best = study.best_trial
    files = export_best(spec, best.params, output)
    files.update(save_plots(study, output))
    result = TuneResult(best.value, best.params, best.number, best.user_attrs.get("run_dir"), counts, files)
    (output / "best.json").write_text(json.dumps({**result.__dict__, "trials_asked": trials,
                                                  "trials_finished": finished}, indent=2, default=str) + "\n")
    if finished < trials:
        raise TuningIncompleteError(f"study {spec.study_name!r}: only {finished} of {trials} trials finished "
                                    f"({counts}); best so far written to {output / 'best.json'}; run the same "
                                    "command again to finish the study")
    return result


def best_config_values(spec: TuneSpec, params: dict[str, Any]) -> dict[str, Any]:
    """The complete resolved run config of the best parameters (typed sections, method parameters
    with their defaults filled in), without the per-run keys (output, label)."""
    from kdbench.engine import plan_run

    raw = {k: v for k, v in {**spec.base, **params}.items() if k not in PER_RUN_KEYS}
    resolved = plan_run(build_run_config({**raw, "output": "unused"})).config.to_dict()
    return {k: v for k, v in resolved.items() if k not in PER_RUN_KEYS}


def export_best(spec: TuneSpec, params: dict[str, Any], output: Path) -> dict[str, str]:
    """Write ``best_config.yaml``: the resolved config of the best trial (``kdbench run --config``)."""
    values = best_config_values(spec, params)
    path = output / BEST_CONFIG
    header = (f"# Best trial of study {spec.study_name!r} (maximising {spec.main_metric}).\n"
              f"# kdbench run {values['method']} --config {path} --task {values['task']} "
              f"--student {values['student']} --output {output / 'best'}\n")
    path.write_text(header + yaml.safe_dump(values, sort_keys=False))
    return {"best_config": str(path)}


def save_plots(study: Any, output: Path) -> dict[str, str]:
    """Optimisation history and parameter importances as PNG (optuna.visualization.matplotlib)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import optuna.visualization.matplotlib as ovm

    files: dict[str, str] = {}
    plots = {"optimization_history": ovm.plot_optimization_history,
             "param_importances": ovm.plot_param_importances}
    for name, plot in plots.items():
        path = output / f"{name}.png"
        try:
            axes = plot(study)
        except (ValueError, RuntimeError) as error:  # e.g. importances need >= 2 completed trials
            log.warning("no %s plot: %s", name, error)
            continue
        figure = axes.figure if hasattr(axes, "figure") else axes.flat[0].figure
        figure.tight_layout()
        figure.savefig(path, dpi=100)
        plt.close(figure)
        files[name] = str(path)
    return files


# ---------------------------------------------------------------------------------------------
# CLI
# ---------------------------------------------------------------------------------------------
def spec_from_args(args: argparse.Namespace) -> TuneSpec:
    from kdbench.engine import plan_run
    from kdbench.plugins import METHODS, TASKS

    values: dict[str, Any] = load_yaml(args.config) if args.config else {}
    yaml_space = values.pop(SPACE_KEY, None)
    if yaml_space is not None and not isinstance(yaml_space, dict):
        raise ConfigError(f"{args.config}: search_space must be a mapping, got {yaml_space!r}")
    values["method"] = args.method
    for key in ("task", "teacher", "student", "data_dir"):
        if getattr(args, key, None) is not None:
            values[key] = getattr(args, key)
    values.update(parse_overrides(args.overrides))
    for key in PER_RUN_KEYS:
        values.pop(key, None)
    method_cls = METHODS.get(args.method)
    base_config = build_run_config({**values, "output": args.output})
    declared = method_cls.from_overrides(base_config.method_params).search_space()
    space = resolve_space(declared, yaml_space, args.space or [], fixed=set(values) - {"method", "task"})
    plan_run(build_run_config({**values, **space_midpoint(space), "output": args.output}))  # every name valid
    task = TASKS.get(base_config.task)
    storage = args.storage or f"sqlite:///{Path(args.output).resolve() / DEFAULT_STORAGE}"
    if storage.startswith("sqlite:///") and not storage.startswith("sqlite:////"):
        path = Path(storage[len("sqlite:///"):])
        storage = f"sqlite:///{path.resolve()}"  # workers may run elsewhere: make it absolute
    return TuneSpec(
        study_name=args.study_name or f"{method_cls.name}-{task.spec.name}",
        storage=storage,
        base=values,
        space=space_to_yaml(space),
        output=str(Path(args.output).resolve()),
        main_metric=task.spec.main_metric,
        pruner=args.pruner,
        sampler_seed=args.sampler_seed,
        heartbeat=Heartbeat(args.heartbeat, args.grace, args.max_retry),
    )


def cmd_tune(args: argparse.Namespace) -> int:
    if args.trials <= 0:
        raise ConfigError(f"--trials: must be > 0, got {args.trials}")
    if args.workers <= 0:
        raise ConfigError(f"--workers: must be > 0, got {args.workers}")
    if args.executor not in TUNE_EXECUTORS:
        raise ConfigError(f"--executor: must be one of {', '.join(TUNE_EXECUTORS)}, got {args.executor!r}")
    if args.executor == INLINE and args.workers > 1:
        raise ConfigError("--workers > 1 needs --executor local or slurm (inline runs in this process)")
    if args.heartbeat < 0 or (args.grace is not None and args.grace <= args.heartbeat) or args.max_retry < 0:
        raise ConfigError(f"--heartbeat {args.heartbeat} / --grace {args.grace} / --max-retry {args.max_retry}: "
                          "need heartbeat >= 0, grace > heartbeat, max-retry >= 0")
    spec = spec_from_args(args)
    try:
        result = run_tune(spec, args.trials, args.workers, args.executor, args.profile)
    except TuningIncompleteError as error:
        print(f"kdbench tune: {error}", file=sys.stderr)
        return 1
    print(json.dumps({"best_value": result.best_value, "best_params": result.best_params,
                      "best_trial": result.best_trial, "trials": result.counts}, default=str))
    print(result.files["best_config"])
    return 0


def add_command(subparsers: Any) -> None:
    tune = subparsers.add_parser("tune", help="Optuna search over a method's hyperparameters")
    tune.add_argument("method")
    tune.add_argument("--task", required=True)
    tune.add_argument("--teacher", help="Hub id or local folder of the (fine-tuned) teacher")
    tune.add_argument("--student", required=True, help="preset name, Hub id or folder")
    tune.add_argument("--data-dir", dest="data_dir")
    tune.add_argument("--config", help="YAML run config; may hold a search_space: mapping")
    tune.add_argument("--output", default="tune", help="study folder (default: tune)")
    tune.add_argument("--trials", type=int, required=True, help="finished trials wanted in the study in all")
    tune.add_argument("--storage", help="sqlite:///PATH, journal:PATH or PATH.journal (default: sqlite:///OUTPUT/study.db)")
    tune.add_argument("--study-name", dest="study_name", help="default: METHOD-TASK")
    tune.add_argument("--space", action="append", metavar="NAME=SPEC",
                      help="override one dimension: float:LOW:HIGH[:log], int:LOW:HIGH[:STEP], choice:A,B, none")
    tune.add_argument("--pruner", default="median", choices=PRUNERS)
    tune.add_argument("--sampler-seed", dest="sampler_seed", type=int, default=None)
    tune.add_argument("--workers", type=int, default=1, help="parallel workers sharing the storage")
    tune.add_argument("--executor", default=INLINE, help="inline (this process) | debug | local | slurm")
    tune.add_argument("--profile", help="cluster profile for --executor slurm (e.g. dev) or a YAML path")
    tune.add_argument("--heartbeat", type=int, default=60,
                      help="seconds between a running trial's heartbeats (database storage; 0: off)")
    tune.add_argument("--grace", type=int, default=None,
                      help="a trial silent this long is a dead worker's: failed and retried (default 2 x heartbeat)")
    tune.add_argument("--max-retry", dest="max_retry", type=int, default=2,
                      help="retries of a dead worker's trial, resuming its run folder (default 2)")
    tune.add_argument("overrides", nargs="*", metavar="KEY=VALUE", help="fixed run keys, e.g. epochs=1 max_steps=50")
    tune.set_defaults(handler=cmd_tune)
