"""Sweeps: a grid of runs with shared stage dependencies, dispatched through submitit.

The spec format is documented in ``results/sweeps/README.md``. In short: ``defaults`` (run keys for
everything), ``stages`` (shared dependencies, each run once per distinct resolved config),
``grid`` (methods × tasks × seeds × override variants) and optional explicit ``cells``. ``${task}``,
``${seed}``, ``${STAGE}`` (the stage's ``model/`` folder) and ``${STAGE.run_dir}`` are resolved
before anything is submitted, so every run's folder (keyed by its config and input hash) is known up front.

With Slurm the whole sweep is submitted at once (:func:`submit_sweep`): one job array per dependency
level and distinct set of dependencies (capped by the profile's ``array_parallelism``), held by
``--dependency=afterok`` on the jobs it needs, so ``kdbench sweep`` returns after submitting and the
sweep runs without it (``--wait`` follows it to the end). A run whose ``result.json`` says
``completed`` is not submitted again, nor is a run whose recorded job Slurm still has queued or
running, so re-running a sweep, even while it runs, submits exactly the missing cells. The debug and
local executors have no dependencies: they run level after level, waiting for each
(:func:`run_sweep`); stopping a local sweep's driver (Ctrl-C, ``kill``) stops its worker processes
too and records their unfinished runs ``cancelled``. Job-side state (pending with the job id /
running / requeued / failed / blocked, with the error) is written to
``<output>/.kdbench-sweep/state/<run>.json``; ``kdbench status`` merges it with the result records
(the source of truth) and, for Slurm jobs, with ``squeue``/``sacct``.

This module imports neither torch nor transformers at module level (the CLI imports it).
"""

from __future__ import annotations

import argparse
import contextlib
import functools
import json
import logging
import os
import re
import time
from collections.abc import Collection
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import submitit
import yaml

from kdbench.config import ConfigError, from_mapping
from kdbench.constraints import constrained
from kdbench.records import RESULT_FILE, write_json_atomic

if TYPE_CHECKING:
    from kdbench.engine.planning import RunPlan

log = logging.getLogger("kdbench.sweep")

MANIFEST = "sweep.json"
SWEEP_DIR = ".kdbench-sweep"  # under the sweep output: job logs (submitit) and job-side state files
GRID_LIST_KEYS = ("methods", "tasks", "seeds", "overrides")
REFERENCE = re.compile(r"\$\{([A-Za-z0-9_.\-]+)\}")
RUN_DIR_SUFFIX = ".run_dir"

# Run states shown by `kdbench status`.
DONE, RUNNING, PENDING, REQUEUED, FAILED, CANCELLED, BLOCKED, NOT_STARTED = (
    "done", "running", "pending", "requeued", "failed", "cancelled", "blocked", "not-started")
LIVE_STATES = (PENDING, RUNNING, REQUEUED)  # a run in one of these may still change state
TERMINAL_SLURM_FAILURES = ("FAILED", "TIMEOUT", "NODE_FAIL", "OUT_OF_MEMORY", "PREEMPTED", "BOOT_FAIL", "DEADLINE")


class SweepError(ConfigError):
    """A sweep spec is invalid; the message names the spec key and the bad value."""


# ---------------------------------------------------------------------------------------------
# Spec -> runs
# ---------------------------------------------------------------------------------------------
@dataclass
class SweepRun:
    """One unit of work: an instance of a shared stage, or a grid cell."""

    name: str
    kind: str  # "stage" | "cell"
    values: dict[str, Any]  # run keys, references resolved, output set
    depends_on: tuple[str, ...] = ()
    run_dir: Path = field(default_factory=Path)
    level: int = 0
    stage: str | None = None  # a stage instance: the spec's stage name, its role (e.g. finetune-teacher)
    plan: RunPlan | None = field(default=None, repr=False)  # set when planned; its identity names run_dir

    def to_dict(self) -> dict[str, Any]:
        return {"name": self.name, "kind": self.kind, "stage": self.stage, "run_dir": str(self.run_dir),
                "level": self.level, "depends_on": list(self.depends_on), "values": self.values}


@dataclass
class Sweep:
    name: str
    output: Path
    runs: dict[str, SweepRun]  # insertion order: dependencies before dependents

    @property
    def state_dir(self) -> Path:
        return self.output / SWEEP_DIR / "state"

    @property
    def log_dir(self) -> Path:
        return self.output / SWEEP_DIR / "jobs"

    def levels(self) -> list[list[SweepRun]]:
        depth = max((run.level for run in self.runs.values()), default=-1)
        return [[run for run in self.runs.values() if run.level == level] for level in range(depth + 1)]


@dataclass(frozen=True)
class SweepSpec:
    """The top level of a sweep spec, built with :func:`kdbench.config.from_mapping` like run configs
    and table specs: unknown keys are named with the closest valid one, sections are typed."""

    name: str = constrained("sweep", non_empty=True)
    output: str | None = None
    defaults: dict[str, Any] = field(default_factory=dict)  # run keys of every run
    stages: dict[str, Any] = field(default_factory=dict)  # stage name -> run keys (+ depends_on)
    grid: dict[str, Any] = field(default_factory=dict)  # methods x tasks x seeds x overrides (+ shared keys)
    cells: list[Any] = field(default_factory=list)  # explicit runs

    def check_combination(self) -> None:
        if not self.grid and not self.cells:
            raise SweepError("sweep spec: needs a 'grid' or 'cells' (nothing to run)")
        for stage_name, keys in self.stages.items():
            if not isinstance(keys, dict):
                raise SweepError(f"stages.{stage_name}: must be a mapping of run keys, got {keys!r}")


def _mapping(value: Any, where: str) -> dict[str, Any]:
    if value is None:
        return {}
    if not isinstance(value, dict):
        raise SweepError(f"{where}: must be a mapping, got {value!r}")
    return dict(value)


def _list(value: Any, where: str) -> list[Any]:
    if value is None:
        return []
    if not isinstance(value, list) or not value:
        raise SweepError(f"{where}: must be a non-empty list, got {value!r}")
    return list(value)


def load_spec(path: str | os.PathLike[str]) -> dict[str, Any]:
    path = Path(path)
    if not path.is_file():
        raise SweepError(f"sweep spec {str(path)!r} does not exist")
    try:
        data = yaml.safe_load(path.read_text()) or {}
    except yaml.YAMLError as error:
        raise SweepError(f"sweep spec {path}: not valid YAML ({error})") from None
    if not isinstance(data, dict):
        raise SweepError(f"sweep spec {path}: must hold a mapping, got {type(data).__name__}")
    data.setdefault("name", path.stem)
    return data


class _Resolver:
    """Expands stages on demand (memoised per distinct resolved config) and substitutes references."""

    def __init__(self, stages: dict[str, dict[str, Any]], defaults: dict[str, Any], output: Path):
        self.stages = stages
        self.defaults = defaults
        self.output = output
        self.runs: dict[str, SweepRun] = {}
        self._instances: dict[tuple[str, Any, Any], SweepRun] = {}
        self._visiting: list[str] = []

    # -- substitution ------------------------------------------------------------------------
    def substitute(self, value: Any, context: dict[str, Any], where: str, deps: list[str]) -> Any:
        if isinstance(value, dict):
            return {k: self.substitute(v, context, f"{where}.{k}", deps) for k, v in value.items()}
        if isinstance(value, list):
            return [self.substitute(v, context, where, deps) for v in value]
        if not isinstance(value, str):
            return value
        whole = REFERENCE.fullmatch(value)
        if whole:
            return self.lookup(whole.group(1), context, where, deps)
        return REFERENCE.sub(lambda m: str(self.lookup(m.group(1), context, where, deps)), value)

    def lookup(self, name: str, context: dict[str, Any], where: str, deps: list[str]) -> Any:
        if name in ("task", "seed"):
            if context.get(name) is None:
                raise SweepError(f"{where}: ${{{name}}} is used where no {name} is known "
                                 f"(a stage run once for all cells cannot refer to ${{{name}}})")
            return context[name]
        stage_name, as_run_dir = name, False
        if name.endswith(RUN_DIR_SUFFIX):
            stage_name, as_run_dir = name[: -len(RUN_DIR_SUFFIX)], True
        if stage_name not in self.stages:
            valid = ", ".join(["task", "seed", *self.stages]) or "task, seed"
            raise SweepError(f"{where}: unknown reference ${{{name}}} (valid: {valid})")
        run = self.stage(stage_name, context)
        deps.append(run.name)
        return str(run.run_dir) if as_run_dir else str(run.run_dir / "model")

    # -- stages ------------------------------------------------------------------------------
    def stage(self, name: str, context: dict[str, Any]) -> SweepRun:
        raw = self.stages[name]
        text = json.dumps(raw, default=str)
        task = context.get("task") if "${task}" in text else None
        seed = context.get("seed") if "${seed}" in text else None
        key = (name, task, seed)
        if key in self._instances:
            return self._instances[key]
        if name in self._visiting:
            raise SweepError(f"stages: dependency cycle {' -> '.join([*self._visiting, name])}")
        self._visiting.append(name)
        try:
            keys = dict(raw)
            extra = keys.pop("depends_on", None) or []
            if not isinstance(extra, list):
                raise SweepError(f"stages.{name}.depends_on: must be a list of stage names, got {extra!r}")
            if "method" not in keys:
                raise SweepError(f"stages.{name}: missing 'method'")
            deps: list[str] = []
            for other in extra:
                self.lookup(str(other), {"task": task, "seed": seed}, f"stages.{name}.depends_on", deps)
            values = self.substitute({**self.defaults, **keys}, {"task": task, "seed": seed}, f"stages.{name}", deps)
            suffix = "".join(f"-{part}" for part in (task, None if seed is None else f"s{seed}") if part is not None)
            run = self.add(SweepRun(f"{name}{suffix}", "stage", values, tuple(dict.fromkeys(deps)), stage=name))
        finally:
            self._visiting.pop()
        self._instances[key] = run
        return run

    def add(self, run: SweepRun) -> SweepRun:
        from kdbench.config import build_run_config
        from kdbench.engine import plan_run

        if run.name in self.runs:
            raise SweepError(f"two runs are both named {run.name!r}; give the variants distinct labels")
        run.values["output"] = str(self.output)
        try:
            plan = plan_run(build_run_config(run.values))
        except ConfigError as error:
            raise SweepError(f"{run.kind} {run.name}: {error}") from None
        run.plan, run.run_dir = plan, plan.run_dir
        run.level = 1 + max((self.runs[d].level for d in run.depends_on), default=-1)
        self.runs[run.name] = run
        return run


def expand(spec: dict[str, Any], output: str | os.PathLike[str] | None = None) -> Sweep:
    """Resolve a spec (as loaded by :func:`load_spec`) into runs with known run folders.

    Validates every run's config (``plan_run``) before anything is submitted.
    """
    try:
        typed = from_mapping(SweepSpec, {k: v for k, v in spec.items() if v is not None}, where="")
    except SweepError:
        raise
    except ConfigError as error:
        raise SweepError(f"sweep spec: {error}") from None
    name = typed.name
    out = Path(output or typed.output or Path("runs") / "sweeps" / name).expanduser().resolve()
    defaults, stages, grid, cells = dict(typed.defaults), dict(typed.stages), dict(typed.grid), list(typed.cells)
    resolver = _Resolver(stages, defaults, out)

    if grid:
        methods = grid.get("methods")
        if isinstance(methods, list) and methods:
            methods = {str(m): {} for m in methods}
        methods = _mapping(methods, "grid.methods")
        if not methods:
            raise SweepError("grid.methods: missing (a list of method names, or name -> run keys)")
        tasks = _list(grid.get("tasks"), "grid.tasks")
        if not tasks:
            raise SweepError("grid.tasks: missing (a list of task names)")
        seeds = _list(grid.get("seeds"), "grid.seeds") or [None]
        variants = _list(grid.get("overrides"), "grid.overrides") or [{}]
        shared = {k: v for k, v in grid.items() if k not in GRID_LIST_KEYS}
        for method, method_keys in methods.items():
            method_keys = _mapping(method_keys, f"grid.methods.{method}")
            for task in tasks:
                for seed in seeds:
                    for index, variant in enumerate(variants):
                        variant = _mapping(variant, f"grid.overrides[{index}]")
                        label = variant.get("label") or method_keys.get("label") or shared.get("label") \
                            or defaults.get("label")
                        cell_name = f"{method}-{task}" + (f"-s{seed}" if seed is not None else "")
                        if len(variants) > 1:
                            cell_name += f"-{variant.get('label') or f'v{index}'}"
                        values = {**defaults, **shared, **method_keys, **variant, "method": method, "task": task}
                        if seed is not None:
                            values["seed"] = seed
                        if label is not None:
                            values["label"] = label
                        _add_cell(resolver, cell_name, values, {"task": task, "seed": seed}, f"grid cell {cell_name}")
    if cells:
        if not isinstance(cells, list):
            raise SweepError(f"cells: must be a list of mappings, got {cells!r}")
        for index, cell in enumerate(cells):
            cell = _mapping(cell, f"cells[{index}]")
            given_name = cell.pop("name", None)  # the cell's name in the sweep; several cells may share a row label
            values = {**defaults, **cell}
            for required in ("method", "task"):
                if required not in values:
                    raise SweepError(f"cells[{index}]: missing {required!r}")
            cell_name = str(given_name or cell.get("label") or f"cell{index}")
            _add_cell(resolver, cell_name, values, {"task": values["task"], "seed": values.get("seed")},
                      f"cells[{index}]")
    return Sweep(name, out, resolver.runs)


def _add_cell(resolver: _Resolver, name: str, values: dict[str, Any], context: dict[str, Any], where: str) -> None:
    deps: list[str] = []
    resolved = resolver.substitute(values, context, where, deps)
    resolver.add(SweepRun(name, "cell", resolved, tuple(dict.fromkeys(deps))))


def stage_role(model: str | os.PathLike[str] | None) -> str | None:
    """The spec's stage name (``finetune-teacher``) of the sweep run whose folder (or ``model/``)
    ``model`` is, read from the ``sweep.json`` beside it; None for a model no sweep stage made.

    Every task has its own fine-tuned teacher, but they all play one role: tables group by it.
    """
    if not model or not isinstance(model, (str, os.PathLike)):
        return None
    path = Path(model)
    run_dir = path.parent if path.name == "model" else path
    manifest = run_dir.parent / MANIFEST
    if not manifest.is_file():
        return None
    roles = _stage_roles(str(manifest), manifest.stat().st_mtime_ns)
    return roles.get(str(run_dir.resolve()))


@functools.lru_cache(maxsize=64)
def _stage_roles(manifest: str, mtime_ns: int) -> dict[str, str]:
    try:
        runs = json.loads(Path(manifest).read_text()).get("runs", [])
    except (OSError, json.JSONDecodeError):
        return {}
    return {str(Path(run["run_dir"]).resolve()): run["stage"] for run in runs if run.get("stage")}


# ---------------------------------------------------------------------------------------------
# Job side
# ---------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class RunRequest:
    """What a job needs: the run's name and keys, where to record its job-side state, and the
    ``(name, run folder)`` of each run it depends on (checked before it starts)."""

    name: str
    values: dict[str, Any]
    state_file: str
    depends_on: tuple[tuple[str, str], ...] = ()


class DependencyNotMetError(RuntimeError):
    """A run's dependency has no completed record; the message names it."""


class RunJob(submitit.helpers.Checkpointable):
    """The submitted job: one ``run_experiment`` call.

    Checkpointable: at its time limit (or on preemption) the job saves a Trainer checkpoint at the
    next step boundary (:func:`kdbench.launch.graceful_requeue_callback`), then submitit requeues
    the same call; the engine resumes the unfinished stage from that checkpoint.

    Before it trains, the job checks that every run it depends on has a completed record: Slurm's
    ``afterok`` normally holds it back, but a dependency cancelled while still pending vanishes from
    Slurm 22.05 and its dependents are then released as if it had succeeded. Such a job records
    itself ``blocked`` and exits non-zero, which cancels its own dependents in turn.
    """

    def __call__(self, request: RunRequest) -> str:
        from kdbench.launch import configure_job_process, graceful_requeue_callback
        from kdbench.records import RunInProgressError

        configure_job_process()  # first: exports RANK etc. in multi-task jobs (only rank 0 records state)
        state = Path(request.state_file)
        attempt = int(os.environ.get("SLURM_RESTART_COUNT", "0"))
        missing = [name for name, run_dir in request.depends_on if not record_completed(Path(run_dir))]
        if missing:
            error = f"dependency {', '.join(missing)} did not complete"
            _write_state(state, BLOCKED, attempt=attempt, error=error, **_job_identity())
            raise DependencyNotMetError(f"{request.name}: {error}")
        _write_state(state, RUNNING, attempt=attempt, **_job_identity())
        try:
            from kdbench.config import build_run_config
            from kdbench.engine import run_experiment

            config = build_run_config(dict(request.values))
            run_dir = run_experiment(config, callbacks=[graceful_requeue_callback()])
        except SystemExit:  # submitit's requeue exits the process after checkpointing
            _write_state(state, REQUEUED, attempt=attempt, **_job_identity())
            raise
        except RunInProgressError:  # a second job for a run that another live job owns: leave its state alone
            raise
        except BaseException as error:
            _write_state(state, FAILED, attempt=attempt, error=f"{type(error).__name__}: {error}", **_job_identity())
            raise
        _write_state(state, DONE, attempt=attempt, run_dir=str(run_dir), **_job_identity())
        return str(run_dir)


class RunSeries(RunJob):
    """Several runs of one level, one after another, in one process: the local executor's worker.

    Process start-up and imports (several seconds a cell) are paid once per worker instead of once
    per cell. A run that fails is recorded (its state file says why) and the next one starts; a
    requeued series skips the runs that already completed (``run_experiment`` returns at once).
    """

    def __call__(self, requests: list[RunRequest]) -> list[str | None]:  # type: ignore[override]
        found: list[str | None] = []
        for request in requests:
            try:
                found.append(RunJob.__call__(self, request))
            except Exception:
                found.append(None)
        return found


def _run_local_workers(sweep: Sweep, todo: list[SweepRun], prof: dict[str, Any], outcome: dict[str, str]) -> None:
    """The local executor: ``local_parallelism`` worker processes, each running its share of the level."""
    from kdbench.launch import job_failure_line, make_executor, stop_jobs_on_interrupt, submit_local_workers

    workers = max(1, min(len(todo), int(prof.get("local_parallelism") or 1)))
    shares = [todo[i::workers] for i in range(workers)]
    executor = make_executor("local", sweep.log_dir, prof)
    series = [[RunRequest(r.name, r.values, str(sweep.state_dir / f"{r.name}.json")) for r in share]
              for share in shares]
    for requests in series:
        for request in requests:
            _write_state(Path(request.state_file), PENDING)
    try:
        with stop_jobs_on_interrupt() as jobs:
            submit_local_workers(executor, prof, RunSeries(), series, jobs)
            for share, requests, job in zip(shares, series, jobs):
                for request in requests:
                    _write_state(Path(request.state_file), PENDING, job_id=str(job.job_id))
                _record_submission(sweep, [r.name for r in share], [str(job.job_id)] * len(share), "local")
            for share, job in zip(shares, jobs):
                try:
                    job.result()
                except Exception as error:
                    log.warning("local worker %s failed: %s", job.job_id, job_failure_line(error))
                for run in share:
                    outcome[run.name] = DONE if _completed(run) else FAILED
    except KeyboardInterrupt:
        _record_cancelled(shares, series)
        raise


def _record_cancelled(shares: list[list[SweepRun]], series: list[list[RunRequest]]) -> None:
    """After an interrupted local level: record each of its unfinished runs ``cancelled``."""
    stopped = []
    for share, requests in zip(shares, series):
        for run, request in zip(share, requests):
            if not _completed(run):
                _write_state(Path(request.state_file), CANCELLED,
                             error="the sweep was interrupted and stopped this run; rerun the sweep to resume it")
                stopped.append(run.name)
    if stopped:
        log.warning("interrupted; not completed: %s (rerun the same command to resume)", ", ".join(stopped))


def _job_identity() -> dict[str, Any]:
    from kdbench.launch import current_job_id

    return {"job_id": current_job_id(), "host": os.uname().nodename, "pid": os.getpid(),
            "cuda_visible_devices": os.environ.get("CUDA_VISIBLE_DEVICES")}


def _write_state(path: Path, state: str, **info: Any) -> None:
    """Record a run's job-side state; keeps the job id the driver recorded when the job has none.

    In a multi-task (multi-GPU) job only global rank 0 writes.
    """
    if os.environ.get("RANK", "0") != "0":
        return
    if info.get("job_id") is None and path.is_file():
        with contextlib.suppress(OSError, json.JSONDecodeError):
            info["job_id"] = json.loads(path.read_text()).get("job_id")
    write_json_atomic(path, {"state": state, "time": time.time(), **info})


def _read_state(path: Path) -> dict[str, Any] | None:
    try:
        return json.loads(path.read_text())
    except (OSError, json.JSONDecodeError):
        return None


# ---------------------------------------------------------------------------------------------
# Driver
# ---------------------------------------------------------------------------------------------
def record_completed(run_dir: Path) -> bool:
    """Whether ``run_dir`` (a run folder, or an exported record's folder) holds a completed record."""
    path = run_dir / RESULT_FILE
    if not path.is_file():
        return False
    try:
        return json.loads(path.read_text()).get("status") == "completed"
    except (OSError, json.JSONDecodeError):
        return False


def _completed(run: SweepRun) -> bool:
    return record_completed(run.run_dir)


def write_manifest(sweep: Sweep, executor: str, spec_path: str | None) -> None:
    """Write the folder's ``sweep.json``: this sweep's name, spec and executor, and every run
    submitted into the folder, not only this sweep's. Sweeps that share an output folder (the tables
    of ``kdbench reproduce``, one spec run again on a subset of its cells) share its stages, and
    ``kdbench status`` and ``kdbench report`` of the folder show all of their runs; a run name
    defined again takes its new definition. Each run names the executor that last submitted it."""
    path = sweep.output / MANIFEST
    previous = json.loads(path.read_text()) if path.is_file() else {}
    runs = {run["name"]: {"executor": previous.get("executor"), **run} for run in previous.get("runs", [])}
    runs.update((run.name, {**run.to_dict(), "executor": executor}) for run in sweep.runs.values())
    write_json_atomic(path, {
        "name": sweep.name, "spec": spec_path, "executor": executor,
        "submissions": previous.get("submissions", []),
        "runs": list(runs.values()),
    })


def _record_submission(sweep: Sweep, names: list[str], job_ids: list[str], executor: str,
                       after: tuple[str, ...] = ()) -> None:
    path = sweep.output / MANIFEST
    manifest = json.loads(path.read_text())
    manifest["submissions"].append({"time": time.strftime("%Y-%m-%dT%H:%M:%S%z"), "executor": executor,
                                    "runs": names, "job_ids": job_ids, "after": list(after)})
    write_json_atomic(path, manifest)


def _requests(sweep: Sweep, runs: list[SweepRun]) -> list[RunRequest]:
    return [RunRequest(r.name, r.values, str(sweep.state_dir / f"{r.name}.json"),
                       tuple((d, str(sweep.runs[d].run_dir)) for d in r.depends_on)) for r in runs]


def _submit_batch(sweep: Sweep, runs: list[SweepRun], executor_kind: str, prof: dict[str, Any],
                  after: tuple[str, ...] = ()) -> list[Any]:
    """Submit ``runs`` as one batch (a Slurm job array), held until every job in ``after`` succeeded."""
    from kdbench.launch import make_executor

    executor = make_executor(executor_kind, sweep.log_dir, prof)
    if executor_kind == "slurm":
        if "job_name" not in prof:
            executor.update_parameters(name=f"kdbench-{sweep.name}")
        if after:
            # kill_on_invalid_dep: a job whose dependency failed is cancelled (not left pending forever)
            executor.update_parameters(slurm_dependency="afterok:" + ":".join(after), slurm_additional_parameters={
                **(prof.get("additional") or {}), "kill_on_invalid_dep": "yes"})
    requests = _requests(sweep, runs)
    for request in requests:
        _write_state(Path(request.state_file), PENDING)
    with executor.batch():
        jobs = [executor.submit(RunJob(), request) for request in requests]
    job_ids = [str(job.job_id) for job in jobs]
    for request, job_id in zip(requests, job_ids):
        _write_state(Path(request.state_file), PENDING, job_id=job_id, after=list(after))
    _record_submission(sweep, [r.name for r in runs], job_ids, executor_kind, after)
    return jobs


def live_slurm_jobs(sweep: Sweep) -> dict[str, str]:
    """``{run name: job id}`` of the runs whose recorded Slurm job is still queued or running."""
    from kdbench.launch import SLURM_LIVE_STATES, slurm_job_states

    recorded: dict[str, str] = {}
    for run in sweep.runs.values():
        state = _read_state(sweep.state_dir / f"{run.name}.json")
        if state and state.get("job_id") and state.get("state") in (PENDING, RUNNING, REQUEUED):
            recorded[run.name] = str(state["job_id"])
    if not recorded:
        return {}
    states = slurm_job_states(set(recorded.values()))
    if states is None:
        raise SweepError("cannot ask Slurm (squeue/sacct) which of this sweep's jobs are still queued or running; "
                         "is SLURM_CONF set?")
    return {name: job for name, job in recorded.items() if states.get(job) in SLURM_LIVE_STATES}


def submit_sweep(sweep: Sweep, profile: str | dict[str, Any] | None = None,
                 spec_path: str | None = None) -> dict[str, str]:
    """Submit every run that is neither completed nor still queued/running, all at once, to Slurm.

    Each dependency level becomes one job array per distinct set of dependencies (so a cell waits
    only for its own teacher), held by ``--dependency=afterok:<jobs>``; runs still queued or running
    from an earlier submission (the sweep's state files, checked with ``squeue``/``sacct``) are not
    submitted again, and their jobs are what the new dependents wait for. Returns
    ``{run name: "done" | "queued" (already) | "submitted"}``; the jobs run without this process.
    """
    from kdbench.launch import load_profile

    prof = profile if isinstance(profile, dict) else load_profile(profile)
    sweep.output.mkdir(parents=True, exist_ok=True)
    _warn_older_folders(sweep)
    write_manifest(sweep, "slurm", spec_path)
    live = live_slurm_jobs(sweep)
    job_of: dict[str, str] = {}
    outcome: dict[str, str] = {}
    for level, runs in enumerate(sweep.levels()):
        groups: dict[tuple[str, ...], list[SweepRun]] = {}
        for run in runs:
            if _completed(run):
                outcome[run.name] = DONE
                continue
            if run.name in live:
                outcome[run.name] = "queued"
                job_of[run.name] = live[run.name]
                print(f"[kdbench] {run.name}: already queued or running as Slurm job {live[run.name]}; "
                      "not submitted again", flush=True)
                continue
            after = tuple(sorted({job_of[d] for d in run.depends_on if d in job_of}))
            groups.setdefault(after, []).append(run)
        for after, part in groups.items():
            jobs = _submit_batch(sweep, part, "slurm", prof, after)
            for run, job in zip(part, jobs):
                job_of[run.name] = str(job.job_id)
                outcome[run.name] = "submitted"
            array = str(jobs[0].job_id).split("_")[0]
            held = f" (after {', '.join(after)})" if after else ""
            print(f"[kdbench] level {level}: submitted {len(part)} run(s) as Slurm job array {array}{held}: "
                  f"{', '.join(r.name for r in part)}", flush=True)
    return outcome


def _warn_older_folders(sweep: Sweep) -> None:
    """Say so when the output holds runs named by an older kdbench: the sweep would train them again."""
    from kdbench.migrate import older_scheme_folders

    older = older_scheme_folders(sweep.output, (run.run_dir.name for run in sweep.runs.values()))
    if older:
        log.warning("%d run folder(s) in %s were named by an older kdbench (e.g. %s); this sweep does not find them "
                    "and trains their runs again: stop it and run `kdbench migrate %s` first", len(older),
                    sweep.output, older[0], sweep.output)


def run_sweep(sweep: Sweep, executor_kind: str, profile: str | dict[str, Any] | None = None,
              spec_path: str | None = None) -> dict[str, str]:
    """Submit every run that is not completed, level by level, waiting for each level (the
    ``debug`` and ``local`` executors, which have no dependencies between jobs; Slurm sweeps use
    :func:`submit_sweep`).

    Returns ``{run name: state}`` after the last level (``done``, ``failed``, ``blocked``).
    """
    from kdbench.launch import job_failure_line, load_profile

    prof = profile if isinstance(profile, dict) else load_profile(profile)
    sweep.output.mkdir(parents=True, exist_ok=True)
    _warn_older_folders(sweep)
    write_manifest(sweep, executor_kind, spec_path)
    outcome: dict[str, str] = {}
    for level, runs in enumerate(sweep.levels()):
        todo = []
        for run in runs:
            if _completed(run):
                outcome[run.name] = DONE
                log.info("%s: already completed (%s), skipped", run.name, run.run_dir)
                continue
            broken = [d for d in run.depends_on if outcome.get(d) != DONE]
            if broken:
                outcome[run.name] = BLOCKED
                _write_state(sweep.state_dir / f"{run.name}.json", BLOCKED,
                             error=f"dependency {', '.join(broken)} did not complete")
                continue
            todo.append(run)
        if not todo:
            continue
        print(f"[kdbench] level {level}: submitting {len(todo)} run(s) with the {executor_kind} executor: "
              f"{', '.join(r.name for r in todo)}", flush=True)
        if executor_kind == "local":
            _run_local_workers(sweep, todo, prof, outcome)
            continue
        jobs = _submit_batch(sweep, todo, executor_kind, prof)
        for run, job in zip(todo, jobs):
            try:
                job.result()
                outcome[run.name] = DONE if _completed(run) else FAILED
            except Exception as error:
                outcome[run.name] = FAILED
                log.warning("%s failed (job %s): %s", run.name, job.job_id, job_failure_line(error))
    return outcome


def wait_for_sweep(folder: Path, poll_seconds: float = 10.0, out: Any = None,
                   names: Collection[str] | None = None) -> list[RunStatus]:
    """Follow a submitted sweep until none of its runs (``names``; default: every run of the
    folder) is pending, running or requeued; print each change of state as it is seen and a
    one-line count of the states after every change."""
    import sys

    out = out or sys.stdout
    seen: dict[str, str] = {}
    while True:
        statuses = sweep_status(folder, names=names)
        changed = False
        for s in statuses:
            if seen.get(s.name) != s.state:
                before = seen.get(s.name)
                detail = f" ({s.error.strip().splitlines()[0]})" if s.error and s.state != DONE else ""
                print(f"[kdbench] {time.strftime('%H:%M:%S')} {s.name}: "
                      f"{f'{before} -> ' if before else ''}{s.state}{detail}", file=out, flush=True)
                seen[s.name] = s.state
                changed = True
        if changed:
            print(f"[kdbench] {time.strftime('%H:%M:%S')} {_counts(statuses)}", file=out, flush=True)
        if not any(s.state in LIVE_STATES for s in statuses):
            return statuses
        time.sleep(poll_seconds)


# ---------------------------------------------------------------------------------------------
# Status
# ---------------------------------------------------------------------------------------------
@dataclass
class RunStatus:
    name: str
    state: str
    run_dir: str
    job_id: str | None = None
    error: str | None = None


def _from_slurm(job_state: str, slurm_state: str | None, job_id: str) -> tuple[str, str | None]:
    """A run's state from its job-side state and Slurm's state of its job (``None``: Slurm has no
    record of it, i.e. it was cancelled before it started)."""
    if slurm_state is None:
        return CANCELLED, f"Slurm job {job_id} was cancelled before it started (no longer queued, no accounting record)"
    if slurm_state == "CANCELLED":
        return CANCELLED, f"Slurm job {job_id} was cancelled"
    if slurm_state in TERMINAL_SLURM_FAILURES:
        return FAILED, f"Slurm job {job_id} ended {slurm_state}"
    if slurm_state == "COMPLETED":  # the job ended without writing its final state (should not happen)
        return FAILED, f"Slurm job {job_id} ended without a completed record"
    if slurm_state == "PENDING":
        return (REQUEUED if job_state == REQUEUED else PENDING), None
    if slurm_state.startswith("REQUEUE"):
        return REQUEUED, None
    return RUNNING, None


def sweep_status(folder: str | os.PathLike[str], query_slurm: bool = True,
                 names: Collection[str] | None = None) -> list[RunStatus]:
    """Each run of the sweeps in ``folder`` (only those in ``names`` when given): done / pending /
    running / requeued / failed / cancelled / blocked / not-started.

    The result record is the truth for a finished run; otherwise the job-side state file (newer than
    the record), checked against Slurm for jobs that may be live. A run whose job never started
    because a dependency failed, was cancelled or was blocked is ``blocked``.
    """
    from kdbench.launch import slurm_job_states

    folder = Path(folder)
    manifest_path = folder / MANIFEST
    if not manifest_path.is_file():
        raise FileNotFoundError(f"{folder} is not a sweep folder (no {MANIFEST}; run `kdbench sweep` first)")
    manifest = json.loads(manifest_path.read_text())
    runs = [run for run in manifest["runs"] if names is None or run["name"] in names]
    state_dir = folder / SWEEP_DIR / "state"
    jobs = {run["name"]: _read_state(state_dir / f"{run['name']}.json") for run in runs}
    slurm: dict[str, str | None] = {}
    if query_slurm:  # ask Slurm about the live jobs of the runs a Slurm sweep submitted
        ids = set()
        for run in runs:
            job = jobs[run["name"]]
            if job and job.get("job_id") and job["state"] in LIVE_STATES \
                    and run.get("executor", manifest.get("executor")) == "slurm":
                ids.add(str(job["job_id"]))
        slurm = (slurm_job_states(ids) or {}) if ids else {}
    statuses: dict[str, RunStatus] = {}
    for run in runs:
        name, run_dir = run["name"], Path(run["run_dir"])
        record_path = run_dir / RESULT_FILE
        try:
            record = json.loads(record_path.read_text()) if record_path.is_file() else None
        except (OSError, json.JSONDecodeError):
            record = None
        job = jobs[name]
        job_id = str(job["job_id"]) if job and job.get("job_id") else None
        if record and record.get("status") == "completed":
            statuses[name] = RunStatus(name, DONE, str(run_dir), job_id)
            continue
        record_time = record_path.stat().st_mtime if record else -1.0
        if job and (record is None or job["time"] >= record_time):
            state, error = job["state"], job.get("error")
            if state in LIVE_STATES and job_id and job_id in slurm:
                state, error = _from_slurm(state, slurm[job_id], job_id)
                broken = [d for d in run.get("depends_on", []) if statuses.get(d) and
                          statuses[d].state in (FAILED, CANCELLED, BLOCKED)]
                if job["state"] == PENDING and state in (FAILED, CANCELLED) and broken:
                    state, error = BLOCKED, f"dependency {', '.join(broken)} did not complete"
            if state == FAILED and record and record.get("error"):
                error = record["error"]
            statuses[name] = RunStatus(name, state, str(run_dir), job_id, error)
        elif record:
            statuses[name] = RunStatus(name, REQUEUED if record.get("status") == REQUEUED else FAILED, str(run_dir),
                                       job_id, record.get("error"))
        else:
            statuses[name] = RunStatus(name, NOT_STARTED, str(run_dir))
    return list(statuses.values())


def _counts(statuses: list[RunStatus]) -> str:
    counts: dict[str, int] = {}
    for s in statuses:
        counts[s.state] = counts.get(s.state, 0) + 1
    return ", ".join(f"{n} {state}" for state, n in sorted(counts.items()))


def format_status(statuses: list[RunStatus]) -> str:
    width = max((len(s.name) for s in statuses), default=4)
    lines = [f"{'RUN':<{width}}  {'STATE':<11}  {'JOB':<10}  RUN FOLDER / ERROR"]
    for s in statuses:
        lines.append(f"{s.name:<{width}}  {s.state:<11}  {s.job_id or '-'!s:<10}  {s.run_dir}")
        if s.error:
            lines.append(f"{'':<{width}}  {'':<11}  {'':<10}  error: {s.error.strip().splitlines()[0]}")
    lines.append(_counts(statuses))
    return "\n".join(lines)


# ---------------------------------------------------------------------------------------------
# CLI
# ---------------------------------------------------------------------------------------------
def cmd_sweep(args: argparse.Namespace) -> int:
    from kdbench.launch import EXECUTORS, ProfileError

    spec = load_spec(args.spec)
    sweep = expand(spec, args.output)
    if args.dry_run:
        for run in sweep.runs.values():
            mark = "done" if _completed(run) else "todo"
            deps = f" <- {', '.join(run.depends_on)}" if run.depends_on else ""
            print(f"level {run.level}  {run.kind:<5}  {mark}  {run.name}{deps}\n    {run.run_dir}")
        print(sweep.output)
        return 0
    if args.executor not in EXECUTORS:
        raise SweepError(f"--executor: must be one of {', '.join(EXECUTORS)}, got {args.executor!r}")
    if args.poll <= 0:
        raise SweepError(f"--poll: must be > 0 seconds, got {args.poll}")
    spec_path = str(Path(args.spec).resolve())
    try:
        if args.executor == "slurm":
            outcome = submit_sweep(sweep, args.profile, spec_path)
            if not args.wait:
                print(format_status(sweep_status(sweep.output, names=sweep.runs)))
                print(f"[kdbench] {sum(v == 'submitted' for v in outcome.values())} run(s) submitted; the sweep runs "
                      f"without this process. Follow it with `kdbench status {sweep.output}`, or run this "
                      "command again with --wait.", flush=True)
                print(sweep.output)
                return 0
            statuses = wait_for_sweep(sweep.output, args.poll, names=sweep.runs)
            print(format_status(statuses))
            print(sweep.output)
            return 0 if all(s.state == DONE for s in statuses) else 1
        outcome = run_sweep(sweep, args.executor, args.profile, spec_path)
    except ProfileError as error:
        raise SweepError(str(error)) from None
    print(format_status(sweep_status(sweep.output, query_slurm=False, names=sweep.runs)))
    print(sweep.output)
    return 0 if all(state == DONE for state in outcome.values()) else 1


def cmd_status(args: argparse.Namespace) -> int:
    if not (Path(args.folder) / MANIFEST).is_file():  # a folder of plain `kdbench run` runs
        from kdbench.records import format_run_states, run_states

        states = run_states(Path(args.folder))
        print(json.dumps(states, indent=2) if args.json else format_run_states(states))
        return 0
    statuses = sweep_status(args.folder)
    if args.json:
        print(json.dumps([s.__dict__ for s in statuses], indent=2))
    else:
        print(format_status(statuses))
    return 0


def add_command(subparsers: Any) -> None:
    sweep = subparsers.add_parser("sweep", help="run a grid of experiments (with shared stages) via submitit")
    sweep.add_argument("spec", help="sweep spec YAML (see results/sweeps/README.md)")
    sweep.add_argument("--executor", default="local", help="debug | local | slurm (default local)")
    sweep.add_argument("--profile", help="cluster profile: a name in slurm/ (e.g. dev) or a YAML path")
    sweep.add_argument("--output", help="sweep folder (default: the spec's output)")
    sweep.add_argument("--dry-run", action="store_true", help="list the runs and their folders; submit nothing")
    sweep.add_argument("--wait", action="store_true",
                       help="slurm: stay until every run has ended, printing each change of state (the debug and "
                            "local executors always wait)")
    sweep.add_argument("--poll", type=float, default=10.0, help="seconds between two looks at Slurm with --wait")
    sweep.set_defaults(handler=cmd_sweep)

    status = subparsers.add_parser("status", help="state of each run of a sweep (or of a folder of runs)")
    status.add_argument("folder", help="the sweep folder (its output), or a folder of run folders")
    status.add_argument("--json", action="store_true")
    status.set_defaults(handler=cmd_status)
