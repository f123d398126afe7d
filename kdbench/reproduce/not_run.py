"""Cells a table's records lack on purpose, and why: ``not-run.yaml`` beside the records folder.

A study can end with cells it planned and did not run, e.g. seeds that must read stages only one
kind of machine trains to the recorded weights. The table then says why, not "pending". The file
lists spec cells by name::

    - cells: [tinybert4-stsb-s4, tinybert4-stsb-s5]
      why: they must read the STS-B teacher, GD and augmented set of seeds 1-3, ...

The cells stay in the spec (``--missing`` runs them where they can run). A listed cell that gains a
completed record drops out of the footnote, with a warning to take it off the list.
"""

from __future__ import annotations

import sys
from collections.abc import Collection
from pathlib import Path
from typing import Any

import yaml

from kdbench.config import ConfigError
from kdbench.reproduce.study import TABLE_ROWS, build_spec, plan_row_key
from kdbench.tables.plan import SeedsNotRun

NOT_RUN_FILE = "not-run.yaml"


def not_run_path(records: Path) -> Path:
    return records.parent / NOT_RUN_FILE


def read_seeds_not_run(table: str, records: Path) -> tuple[SeedsNotRun, ...]:
    """The seeds of ``table``'s cells listed in ``not-run.yaml`` beside ``records`` that have no
    completed record there, grouped by row, task and reason; () without the file. Unknown cell
    names, and entries without cells or a reason, raise :class:`ConfigError` naming them."""
    path = not_run_path(records)
    if not path.is_file():
        return ()
    cells = {cell["name"]: cell for cell in build_spec(table)["cells"]}
    rows = {row.label: row for row in TABLE_ROWS[table]()}
    recorded = _completed_cells(records)
    grouped: dict[tuple[str, str, str], list[int]] = {}
    for name, why in _listed(table, path, cells).items():
        cell = cells[name]
        if (cell["label"], cell["task"], cell["seed"]) in recorded:
            print(f"[kdbench reproduce] {path}: cell {name} is listed as not run but has a completed record; "
                  "take it off the list (the table no longer counts it as not run)", file=sys.stderr)
            continue
        key = plan_row_key(table, rows[cell["label"]])
        grouped.setdefault((key, cell["task"], why), []).append(int(cell["seed"]))
    return tuple(SeedsNotRun(row=key, task=task, seeds=tuple(sorted(seeds)), why=why)
                 for (key, task, why), seeds in grouped.items())


def listed_cells(table: str, records: Path) -> dict[str, str]:
    """Cell name -> why it was not run, for every cell ``not-run.yaml`` beside ``records`` lists
    (recorded or not); {} without the file."""
    path = not_run_path(records)
    if not path.is_file():
        return {}
    return _listed(table, path, {cell["name"] for cell in build_spec(table)["cells"]})


def _listed(table: str, path: Path, planned: Collection[str]) -> dict[str, str]:
    """Cell name -> why, from ``path``; a name not among ``planned`` (the table's spec cells) raises."""
    entries = yaml.safe_load(path.read_text()) or []
    if not isinstance(entries, list):
        raise ConfigError(f"{path}: expected a list of {{cells: [...], why: ...}} entries, got {type(entries).__name__}")
    listed: dict[str, str] = {}
    for number, entry in enumerate(entries, start=1):
        names, why = _entry(path, number, entry)
        for name in names:
            if name not in planned:
                raise ConfigError(f"{path}: entry {number} names cell {name!r}, which table {table!r} does not plan "
                                  f"(`kdbench reproduce {table} --dry-run` lists its cells)")
            listed[name] = why
    return listed


def say_which_listed_cells_run(table: str, records: Path, chosen: list[str]) -> None:
    """Name the chosen cells that ``not-run.yaml`` lists as not run: they run now, and once recorded
    they should leave the list."""
    listed = listed_cells(table, records)
    by_reason: dict[str, list[str]] = {}
    for name in chosen:
        if name in listed:
            by_reason.setdefault(listed[name], []).append(name)
    for why, names in by_reason.items():
        print(f"[kdbench reproduce] chosen, though {not_run_path(records)} lists them as not run: {', '.join(names)} "
              f"({why}); take them off that list once their records are committed")


def _entry(path: Path, number: int, entry: Any) -> tuple[list[str], str]:
    if not isinstance(entry, dict) or set(entry) != {"cells", "why"}:
        raise ConfigError(f"{path}: entry {number} must have exactly the keys 'cells' and 'why', got {entry!r}")
    names, why = entry["cells"], entry["why"]
    if not isinstance(names, list) or not names or not all(isinstance(name, str) for name in names):
        raise ConfigError(f"{path}: entry {number}'s cells must be a non-empty list of cell names, got {names!r}")
    if not isinstance(why, str) or not why.strip():
        raise ConfigError(f"{path}: entry {number} must say why its cells were not run, got why={why!r}")
    return names, " ".join(why.split())


def _completed_cells(records: Path) -> set[tuple[str, str, int]]:
    """(label, task, seed) of every completed record under ``records``."""
    from kdbench.records import load_records

    if not records.is_dir():
        return set()
    frame = load_records(records, include_failed=False)
    if frame.empty or not {"label", "task", "seed"} <= set(frame.columns):
        return set()
    return {(str(label), str(task), int(seed)) for label, task, seed in zip(frame["label"], frame["task"], frame["seed"])
            if isinstance(label, str) and seed == seed}
