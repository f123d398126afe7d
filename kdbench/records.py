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
    handle = open(path, "a+")
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


def kdbench_revision() -> dict[str, Any]:
    """The kdbench source a run was produced by: the git commit of a source checkout (and whether
    it had uncommitted changes), else the installed version only."""
    import subprocess

    source = Path(__file__).resolve().parent.parent
    revision: dict[str, Any] = {"commit": None, "dirty": None}
    try:
        commit = subprocess.run(["git", "-C", str(source), "rev-parse", "HEAD"], capture_output=True, text=True,
                                timeout=10, check=True).stdout.strip()
        status = subprocess.run(["git", "-C", str(source), "status", "--porcelain", "--untracked-files=no"],
                                capture_output=True, text=True, timeout=10, check=True).stdout
    except (OSError, subprocess.SubprocessError):
        return revision
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


def records_table(runs_dir: str | Path, fmt: str = "markdown") -> str:
    frame = load_records(runs_dir)
    if frame.empty:
        return "no result records under " + str(runs_dir)
    columns = ["method", "task", "student", "label", "seed", "status"]
    columns += sorted(c for c in frame.columns if c.startswith("metric."))
    columns += ["student_params", "train_seconds", "run_dir"]
    frame = frame[[c for c in columns if c in frame.columns]]
    if fmt == "csv":
        return frame.to_csv(index=False)
    if fmt == "markdown":
        return frame.to_markdown(index=False) if _has_tabulate() else frame.to_string(index=False)
    if fmt == "json":
        return frame.to_json(orient="records", indent=2)
    raise ValueError(f"unknown format {fmt!r} (markdown, csv, json)")


def _has_tabulate() -> bool:
    try:
        import tabulate  # noqa: F401
    except ImportError:
        return False
    return True
