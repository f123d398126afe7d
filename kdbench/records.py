"""Result records: one ``result.json`` per run, written atomically, read back into pandas.

Schema (``SCHEMA_VERSION`` 1): ``schema_version``, ``method``, ``task``, ``teacher``, ``student``,
``label``, ``config`` (the full resolved config), ``metrics`` (dev metrics by name, 0-100 scale),
``student_params``, ``teacher_params``, ``train_seconds`` (all attempts), ``status`` (``completed`` | ``requeued`` | ``failed``),
``error``, ``seed``, ``versions`` (library versions), ``run_dir``, ``stages`` (per-stage summary),
``data`` (rows used and rows skipped per split), ``created_at``, ``inputs`` (content fingerprints of
the data files and models the run read: :mod:`kdbench.fingerprint`), ``kdbench_revision`` (the git
commit of the kdbench source, and whether it had uncommitted changes).

Concurrency: there is no shared result store; each run owns its folder (keyed by its config and input hash)
and its ``result.json``. Two processes given the same cell (a duplicated sweep entry, a resume
started while the first attempt still runs) are kept apart by :func:`run_lock`, an exclusive
``flock`` on ``RUN_LOCK_FILE`` that the kernel releases when its holder dies (even by kill -9).
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import platform
import tempfile
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

SCHEMA_VERSION = 1
RESULT_FILE = "result.json"
COMPLETED, FAILED, INTERRUPTED = "completed", "failed", "interrupted"  # a record's status
REQUIRED_KEYS = ("schema_version", "method", "task", "student", "config", "metrics", "status")
RUN_LOCK_FILE = ".lock"
# Upgrades from an older schema: MIGRATIONS[v] turns a version-v record into a version-(v + 1) one.
# Version 1 is the first published schema, so there is nothing to upgrade yet; a record claiming an
# older version is refused with a message naming the file (it was not written by kdbench).
MIGRATIONS: dict[int, Callable[[dict[str, Any]], dict[str, Any]]] = {}


class RecordError(ValueError):
    """A result record cannot be read; the message names the file and the problem."""


class RunInProgressError(RecordError):
    """Another live process holds the run folder's lock."""


@contextlib.contextmanager
def run_lock(run_dir: Path) -> Iterator[None]:
    """Hold an exclusive lock on ``run_dir`` for the block, or raise RunInProgressError at once.

    ``flock`` locks belong to the open file: the kernel drops them when the holder exits or is
    killed, so a crashed run never leaves a stale lock behind.
    """
    run_dir = Path(run_dir)
    run_dir.mkdir(parents=True, exist_ok=True)
    path = run_dir / RUN_LOCK_FILE
    handle = open(path, "a+")  # noqa: SIM115 - held open for the lock's lifetime, closed in finally
    try:
        try:
            fcntl.flock(handle.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            handle.seek(0)
            holder = handle.read().strip() or "unknown"
            raise RunInProgressError(f"run folder {str(run_dir)!r} is in use by another process (pid {holder}); "
                                     "wait for it to finish: a second writer would corrupt its checkpoints") from None
        handle.seek(0)
        handle.truncate()
        handle.write(str(os.getpid()))
        handle.flush()
        yield
    finally:
        handle.close()  # releases the lock


def write_json_atomic(path: Path, data: Any) -> None:
    """Write JSON to a temporary file in the same folder, fsync it, then rename it into place.

    A reader (or a kill -9 at any moment) sees either the old file or the complete new one.
    """
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        os.fchmod(fd, default_file_mode())  # mkstemp's 0600 would hide records from the user's group
        with os.fdopen(fd, "w") as handle:
            json.dump(data, handle, indent=2, sort_keys=False, default=str)
            handle.write("\n")
            handle.flush()
            os.fsync(handle.fileno())
        os.replace(tmp, path)
        _fsync_dir(path.parent)  # make the rename itself durable (power loss, not only kill -9)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


RUNNING, INCOMPLETE = "running", "incomplete"  # states of a run folder without a final record


def lock_holder(run_dir: Path) -> str | None:
    """The pid holding ``run_dir``'s lock if a live process holds it, else None (never waits)."""
    path = Path(run_dir) / RUN_LOCK_FILE
    if not path.is_file():
        return None
    with open(path) as handle:
        try:
            fcntl.flock(handle.fileno(), fcntl.LOCK_SH | fcntl.LOCK_NB)
        except BlockingIOError:
            return handle.read().strip() or "unknown"
        fcntl.flock(handle.fileno(), fcntl.LOCK_UN)
    return None


def run_states(runs_dir: Path) -> list[dict[str, Any]]:
    """The state of every run folder under ``runs_dir`` (folders holding ``config.yaml``, which a run
    writes first): ``completed`` / ``failed`` / ``interrupted`` from its record, else ``running``
    (a live process holds its lock) or ``incomplete`` (killed; the same command resumes it), with the
    last checkpoint step and the folder's size."""
    from kdbench.disk import STAGES_DIR, checkpoints, folder_bytes

    runs_dir = Path(runs_dir)
    if not runs_dir.is_dir():
        raise RecordError(f"runs folder {str(runs_dir)!r} does not exist")
    states = []
    for config in sorted(runs_dir.rglob("config.yaml")):
        run_dir = config.parent
        if any(part.startswith(".") for part in run_dir.relative_to(runs_dir).parts):
            continue
        state, error, pid = INCOMPLETE, None, lock_holder(run_dir)
        record_path = run_dir / RESULT_FILE
        if pid is not None:
            state = RUNNING
        elif record_path.is_file():
            try:
                record = json.loads(record_path.read_text())
                state, error = record.get("status", INCOMPLETE), record.get("error")
            except ValueError:
                error = f"{record_path} is not valid JSON"
        steps = [int(p.name.split("-")[1]) for stage in sorted((run_dir / STAGES_DIR).glob("*"))
                 for p in checkpoints(stage)]
        states.append({"run_dir": str(run_dir), "state": state, "error": error, "pid": pid,
                       "last_checkpoint_step": max(steps) if steps else None, "disk_bytes": folder_bytes(run_dir)})
    return states


def format_run_states(states: list[dict[str, Any]]) -> str:
    from kdbench.disk import human_bytes

    lines = [f"{'STATE':<11}  {'CKPT':>6}  {'DISK':>9}  RUN FOLDER / ERROR"]
    for entry in states:
        step = entry["last_checkpoint_step"]
        lines.append(f"{entry['state']:<11}  {step if step is not None else '-':>6}  "
                     f"{human_bytes(entry['disk_bytes']):>9}  {entry['run_dir']}")
        if entry["error"] and entry["state"] != COMPLETED:
            lines.append(f"{'':<11}  {'':>6}  {'':>9}  error: {str(entry['error']).strip().splitlines()[0]}")
    counts: dict[str, int] = {}
    for entry in states:
        counts[entry["state"]] = counts.get(entry["state"], 0) + 1
    lines.append(", ".join(f"{n} {state}" for state, n in sorted(counts.items())) or "no run folders")
    return "\n".join(lines)


def default_file_mode() -> int:
    """The mode ``open()`` gives a new file: 0666 less the process umask (``mkstemp`` gives 0600,
    which on a shared cluster makes results unreadable by the user's group)."""
    umask = os.umask(0o022)
    os.umask(umask)
    return 0o666 & ~umask


def _fsync_dir(folder: Path) -> None:
    try:
        fd = os.open(folder, os.O_RDONLY)
    except OSError:  # pragma: no cover - platforms without directory handles
        return
    try:
        os.fsync(fd)
    except OSError:  # pragma: no cover - some filesystems refuse fsync on directories
        pass
    finally:
        os.close(fd)


def library_versions() -> dict[str, str]:
    import importlib.metadata as metadata

    versions = {"python": platform.python_version()}
    for package in ("kdbench", "torch", "transformers", "datasets", "evaluate", "pandas", "optuna", "submitit"):
        try:
            versions[package] = metadata.version(package)
        except metadata.PackageNotFoundError:
            versions[package] = "not installed"
    return versions


def cpu_model() -> str:
    """The processor's model name (``/proc/cpuinfo`` on Linux), else what ``platform`` knows."""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def compute_environment() -> dict[str, Any]:
    """What besides code, data and library versions decides a run's floating-point results: the
    processor and the kernels torch picks for it, the number of threads that split each reduction,
    and the GPU. Two CPU trainings agree bit for bit only where these agree too (the study's CoLA
    teacher did across machines; its MRPC teacher, rebuilt on another machine, agreed in its metrics
    but not in its weights' last bits)."""
    import torch

    return {"cpu": cpu_model(), "cpu_capability": torch.backends.cpu.get_cpu_capability(),
            "torch_threads": torch.get_num_threads(),
            "gpu": torch.cuda.get_device_name(0) if torch.cuda.is_available() else None}


# The parts of a source checkout that decide what a run computes. Uncommitted edits elsewhere
# (re-rendered tables and records under results/, docs, tests) leave a run's numbers unchanged, and a
# study that exports records into its own checkout would otherwise mark every later run dirty.
CODE_PATHS: tuple[str, ...] = ("kdbench", "methods", "tasks", "pyproject.toml")


# Packages the install maps from the checkout's methods/ and tasks/ folders.
MAPPED_CODE_PACKAGES: tuple[str, ...] = ("kdbench.methods", "kdbench.tasks")


def code_imported_from_elsewhere(root: Path) -> list[str]:
    """Folders other than the checkout ``root`` that kdbench's method and task packages were
    imported from. An editable install maps them from its own checkout, so putting a second
    checkout's ``kdbench/`` first on ``PYTHONPATH`` runs that checkout's engine with the install's
    methods and tasks: a commit the record would otherwise name alone."""
    import importlib.util

    elsewhere: set[str] = set()
    for name in MAPPED_CODE_PACKAGES:
        spec = importlib.util.find_spec(name)
        for location in (spec.submodule_search_locations or []) if spec is not None else []:
            folder = Path(location).resolve()
            if root not in (folder.parent, folder.parent.parent):  # checkout/methods, or kdbench/methods installed
                elsewhere.add(str(folder.parent))
    return sorted(elsewhere)


def kdbench_revision(source: Path | None = None) -> dict[str, Any]:
    """The kdbench source a run was produced by: the git commit of a source checkout and whether its
    code (`CODE_PATHS`) had uncommitted changes to tracked files, else the installed version only.
    `source` is the checkout's root (default: the one this module was imported from). When the
    method or task code came from another folder (:func:`code_imported_from_elsewhere`), the
    revision is dirty and ``code_from`` names that folder."""
    import subprocess

    own_root = Path(__file__).resolve().parent.parent
    source = source or own_root
    revision: dict[str, Any] = {"commit": None, "dirty": None}
    try:
        commit = subprocess.run(["git", "-C", str(source), "rev-parse", "HEAD"], capture_output=True, text=True,
                                timeout=10, check=True).stdout.strip()
        status = subprocess.run(["git", "-C", str(source), "status", "--porcelain", "--untracked-files=no", "--",
                                 *CODE_PATHS], capture_output=True, text=True, timeout=10, check=True).stdout
    except (OSError, subprocess.SubprocessError):
        return revision
    elsewhere = code_imported_from_elsewhere(source) if source == own_root else []
    if elsewhere:
        return {"commit": commit, "dirty": True, "code_from": elsewhere}
    return {"commit": commit, "dirty": bool(status.strip())}


def migrate(record: dict[str, Any], source: str) -> dict[str, Any]:
    """Bring a record to the current schema, or refuse with a message naming the file."""
    version = record.get("schema_version")
    while isinstance(version, int) and not isinstance(version, bool) and version in MIGRATIONS:
        record = MIGRATIONS[version](dict(record))
        if record.get("schema_version") != version + 1:
            raise RecordError(f"{source}: migration from schema_version {version} did not produce {version + 1}")
        version = version + 1
    if version == SCHEMA_VERSION:
        missing = [key for key in REQUIRED_KEYS if key not in record]
        if missing:
            raise RecordError(f"{source}: result record lacks {', '.join(missing)}")
        return record
    if version is None:
        raise RecordError(f"{source}: not a kdbench result record (no schema_version)")
    if isinstance(version, int) and version > SCHEMA_VERSION:
        raise RecordError(f"{source}: schema_version {version} is newer than this kdbench understands "
                          f"({SCHEMA_VERSION}); upgrade kdbench")
    if isinstance(version, int) and not isinstance(version, bool) and version < SCHEMA_VERSION:
        raise RecordError(f"{source}: schema_version {version} is older than the oldest this kdbench reads "
                          f"({min([*MIGRATIONS, SCHEMA_VERSION])}) and no migration exists; re-run the cell "
                          "to produce a current record")
    raise RecordError(f"{source}: schema_version {version!r} is not supported (current: {SCHEMA_VERSION})")


def read_record(path: Path) -> dict[str, Any]:
    path = Path(path)
    try:
        record = json.loads(path.read_text())
    except json.JSONDecodeError as error:
        raise RecordError(f"{path}: not valid JSON ({error})") from None
    if not isinstance(record, dict):
        raise RecordError(f"{path}: a result record must be a JSON object")
    return migrate(record, str(path))


def find_records(runs_dir: Path) -> list[Path]:
    runs_dir = Path(runs_dir)
    if not runs_dir.is_dir():
        raise RecordError(f"runs folder {str(runs_dir)!r} does not exist")
    return sorted(runs_dir.rglob(RESULT_FILE))


def training_identity(run: Any) -> tuple[str, str]:
    """One training, wherever its record was copied (tables that share a run each export it): its
    run folder's name and its ``created_at``; a record without the time is its own folder's."""
    created = run.get("created_at")
    return Path(str(run["run_dir"])).name, str(created) if isinstance(created, str) and created else str(run["run_dir"])


def load_records(runs_dir: str | Path, *, include_failed: bool = True):
    """All records under ``runs_dir`` as a DataFrame, one row per run.

    Scalar fields become columns, ``metrics`` are flattened into ``metric.<name>`` columns, and
    ``config`` stays a dict column. Unreadable records raise (nothing is skipped silently).
    """
    import pandas as pd

    rows = []
    for path in find_records(Path(runs_dir)):
        record = read_record(path)
        if not include_failed and record["status"] != "completed":
            continue
        row = {key: value for key, value in record.items() if key not in ("metrics", "versions", "stages", "data")}
        row["run_dir"] = str(path.parent)
        for name, value in (record.get("metrics") or {}).items():
            row[f"metric.{name}"] = value
        rows.append(row)
    return pd.DataFrame(rows)


def records_table(runs_dir: str | Path, fmt: str = "markdown", include_input_errors: bool = False) -> str:
    """The records under ``runs_dir`` as a table; ``status`` is ``completed``, ``failed`` or
    ``interrupted`` (stopped by the user: resumable, not a failure of the method). Runs that failed
    on bad input before training are left out unless ``include_input_errors``. ``disk`` is each run
    folder's current size."""
    from kdbench.disk import folder_bytes, human_bytes

    frame = load_records(runs_dir)
    if not frame.empty and "input_error" in frame.columns and not include_input_errors:
        hidden = frame["input_error"].fillna(False).astype(bool)
        frame = frame[~hidden]
    if frame.empty:
        return "no result records under " + str(runs_dir)
    frame = frame.assign(disk=[human_bytes(folder_bytes(Path(folder))) for folder in frame["run_dir"]])
    columns = ["method", "task", "student", "label", "seed", "status"]
    columns += sorted(c for c in frame.columns if c.startswith("metric."))
    columns += ["student_params", "train_seconds", "disk", "run_dir"]
    frame = frame[[c for c in columns if c in frame.columns]]
    if fmt == "csv":
        return frame.to_csv(index=False)
    if fmt == "markdown":
        return frame.to_markdown(index=False) if _has_tabulate() else markdown_table(frame)
    if fmt == "json":
        return frame.to_json(orient="records", indent=2)
    raise ValueError(f"unknown format {fmt!r} (markdown, csv, json)")


def markdown_table(frame: Any) -> str:
    """A GitHub-flavoured Markdown table of a DataFrame (what ``to_markdown`` gives, without its
    optional ``tabulate`` dependency): numbers right-aligned, ``|`` in cells escaped, NaN empty."""
    import pandas as pd

    def cell(value: Any) -> str:
        if value is None or (isinstance(value, float) and pd.isna(value)):
            return ""
        text = f"{value:g}" if isinstance(value, float) else str(value)
        return text.replace("|", "\\|").replace("\n", " ")

    columns = [str(c) for c in frame.columns]
    rows = [[cell(v) for v in row] for row in frame.itertuples(index=False)]
    numeric = [pd.api.types.is_numeric_dtype(frame[c]) for c in frame.columns]
    widths = [max([len(c), 3, *(len(r[i]) for r in rows)]) for i, c in enumerate(columns)]

    def line(cells: list[str]) -> str:
        return "| " + " | ".join(c.rjust(w) if n else c.ljust(w) for c, w, n in zip(cells, widths, numeric)) + " |"

    rule = "|" + "|".join(("-" * (w + 1) + ":") if n else (":" + "-" * (w + 1)) for w, n in zip(widths, numeric)) + "|"
    return "\n".join([line(columns), rule, *(line(r) for r in rows)])


def _has_tabulate() -> bool:
    try:
        import tabulate  # noqa: F401
    except ImportError:
        return False
    return True
