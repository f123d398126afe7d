"""Which table row a run belongs to: its label first, else the most specific matching selector
(the rules are in :mod:`kdbench.tables`)."""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from kdbench.tables.specs import RowSpec, TableError, TableSpec, as_tuple


def normalise(text: Any) -> str:
    return str(text).strip().lower()


def canonical_method(name: Any) -> str:
    from kdbench.plugins import METHODS

    try:
        return METHODS.canonical(str(name))
    except KeyError:
        return normalise(name).replace("_", "-")


def _path_key(value: Any) -> str | None:
    if not isinstance(value, str) or not value:
        return None
    path = Path(value)
    if path.name == "model":
        path = path.parent
    try:
        return str(path.resolve())
    except OSError:
        return str(path)


def _folder_keys(value: Any) -> set[str]:
    """Ways to recognise a run folder from a path to it or to its ``model/``: the resolved path and
    the folder's own name (hash-suffixed, so unique in practice; still matches after a move)."""
    if not isinstance(value, str) or "/" not in value:
        return set()
    path = Path(value)
    folder = path.parent if path.name == "model" else path
    return {k for k in (_path_key(value), f"name:{folder.name}") if k}


@dataclass
class _RunContext:
    """What selectors need to know about the other runs loaded alongside."""

    runs: Any
    teachers: set[str]  # folder keys of every run's teacher
    folders: dict[str, int]  # folder key -> run index
    students: set[str]  # folder keys of every run's student (runs whose model another run trained on)

    @classmethod
    def of(cls, runs) -> _RunContext:
        teachers: set[str] = set()
        for value in runs.get("teacher", ()):
            teachers |= _folder_keys(value)
        folders: dict[str, int] = {}
        for index, run in runs.iterrows():
            for key in _folder_keys(run.get("run_dir")) | _folder_keys(run.get("model_dir")):
                folders.setdefault(key, index)
        students: set[str] = set()
        for value in runs.get("student", ()):
            students |= _folder_keys(value)
        return cls(runs, teachers, folders, students)

    def upstream(self, run: Mapping[str, Any]) -> Mapping[str, Any] | None:
        """The run whose model is this run's student (or None)."""
        for key in _folder_keys(run.get("student")):
            if key in self.folders:
                return self.runs.loc[self.folders[key]]
        return None


def _config_value(config: Mapping[str, Any], dotted: str) -> Any:
    value: Any = config
    for part in dotted.split("."):
        if not isinstance(value, Mapping) or part not in value:
            return _NOT_SET
        value = value[part]
    return value


_NOT_SET = object()


def _equal(expected: Any, actual: Any) -> bool:
    if actual is _NOT_SET:
        return False
    if isinstance(expected, (list, tuple)) and isinstance(actual, (list, tuple)):
        return list(expected) == list(actual)
    if isinstance(expected, bool) or isinstance(actual, bool):
        return expected is actual or (isinstance(actual, str) and normalise(actual) == normalise(expected))
    if isinstance(expected, (int, float)) and isinstance(actual, (int, float)):
        return math.isclose(float(expected), float(actual), rel_tol=1e-9, abs_tol=1e-12)
    return normalise(expected) == normalise(actual)


def _selector_matches(select: Mapping[str, Any], run: Mapping[str, Any], context: _RunContext) -> bool:
    config = run.get("config") if isinstance(run.get("config"), Mapping) else {}
    for key, expected in select.items():
        if key == "method":
            if canonical_method(run.get("method")) != canonical_method(expected):
                return False
        elif key == "student":  # a preset name or path, or a list of them
            student = run.get("student")
            wanted = {normalise(s) for s in as_tuple(expected)}
            if not isinstance(student, str) or not {normalise(student), normalise(Path(student).name)} & wanted:
                return False
        elif key == "role":
            if expected != "teacher":
                raise TableError(f"select.role: only 'teacher' is supported, not {expected!r}")
            mine = _folder_keys(run.get("run_dir")) | _folder_keys(run.get("model_dir"))
            if not mine & context.teachers:
                return False
        elif key == "upstream":  # the run that produced this run's student must match ``expected``
            source = context.upstream(run)
            if source is None or not _selector_matches(expected, source, context):
                return False
        elif key == "method_params":
            params = config.get("method_params") or {}
            for name, value in (expected or {}).items():
                if not _equal(value, params.get(name, _NOT_SET)):
                    return False
        elif not _equal(expected, _config_value(config, key)):
            return False
    return True


def _specificity(select: Mapping[str, Any]) -> int:
    total = 0
    for key, value in select.items():
        if key == "method_params" and isinstance(value, Mapping):
            total += len(value)
        elif key == "upstream" and isinstance(value, Mapping):
            total += 1 + _specificity(value)
        else:
            total += 1
    return total


def _row_match(row: RowSpec, run: Mapping[str, Any], context: _RunContext) -> int | None:
    """The specificity of the most specific alternative of ``row.select`` that ``run`` matches."""
    scores = [_specificity(alt) for alt in row.select if _selector_matches(alt, run, context)]
    return max(scores) if scores else None


def assign_rows(spec: TableSpec, runs) -> tuple[dict[str, list[int]], list[int]]:
    """Map each run (index of ``runs``) onto at most one row of ``spec`` (rules in the module
    docstring). Returns ``({row key: [run indices]}, [indices of completed runs matching no row])``."""
    by_row: dict[str, list[int]] = {row.key: [] for row in spec.rows}
    unmatched: list[int] = []
    if runs is None or len(runs) == 0:
        return by_row, unmatched
    context = _RunContext.of(runs)
    label_index: dict[str, str] = {}
    for row in spec.rows:
        for name in (row.key, f"{spec.name}/{row.key}", row.model, *row.labels):
            if name:
                label_index.setdefault(normalise(name), row.key)
    for index, run in runs.iterrows():
        if run.get("status") != "completed":
            continue
        label = run.get("label")
        if isinstance(label, str) and normalise(label) in label_index:
            by_row[label_index[normalise(label)]].append(index)
            continue
        scores = {row.key: _row_match(row, run, context) for row in spec.rows}
        candidates = [row for row in spec.rows if scores[row.key] is not None]
        if not candidates:
            if not _folder_keys(run.get("run_dir")) & context.students:  # not an upstream stage of another run
                unmatched.append(index)
            continue
        best = max(scores[r.key] for r in candidates)
        top = [r for r in candidates if scores[r.key] == best]
        if len(top) > 1:
            raise TableError(f"table {spec.name}: run {run.get('run_dir')} matches rows "
                             f"{[r.key for r in top]} equally; set its label to one row key")
        by_row[top[0].key].append(index)
    return by_row, unmatched
