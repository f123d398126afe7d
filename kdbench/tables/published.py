"""The papers' published numbers (``results/published/*.csv``) and the cells tables take from them."""

from __future__ import annotations

from dataclasses import dataclass
from functools import cache
from typing import Any

from kdbench.tables.specs import RowSpec, TableError, TableSpec, published_dir

PUBLISHED_COLUMNS = ("paper", "table", "model", "setting", "task", "metric", "split", "value",
                     "uncertain", "source", "note")


@cache
def read_published(file_name: str):
    import pandas as pd

    path = published_dir() / file_name
    if not path.is_file():
        raise TableError(f"published file {file_name!r} not found under {published_dir()}")
    frame = pd.read_csv(path, dtype={"value": str, "uncertain": str})
    if tuple(frame.columns) != PUBLISHED_COLUMNS:
        raise TableError(f"{path}: columns {list(frame.columns)} differ from {list(PUBLISHED_COLUMNS)}")
    frame["uncertain"] = frame["uncertain"].fillna("0").str.strip() == "1"
    frame["printed"] = frame["value"].str.strip()
    frame["value"] = pd.to_numeric(frame["printed"], errors="coerce")
    return frame


def load_published(file_name: str | None = None):
    """The published numbers: one file by name, or every CSV under ``results/published``. Adds
    ``printed`` (the value exactly as printed) and makes ``uncertain`` a bool."""
    import pandas as pd

    if file_name is not None:
        return read_published(file_name).copy()
    return pd.concat([read_published(p.name) for p in sorted(published_dir().glob("*.csv"))], ignore_index=True)


@dataclass(frozen=True)
class PublishedValue:
    value: float
    printed: str
    uncertain: bool


def published_rows(spec: TableSpec):
    frame = read_published(spec.published)
    if spec.table is not None:
        frame = frame[frame["table"] == spec.table]
        if frame.empty:
            raise TableError(f"table {spec.name}: no row of {spec.published} has table == {spec.table!r}")
    return frame


def published_cell(spec: TableSpec, row: RowSpec, task: str | None, metric: str | None) -> PublishedValue | None:
    """The published number for one cell, or None when the paper leaves it empty."""
    if row.model is None or task is None or metric is None:
        return None
    frame = published_rows(spec)
    hit = frame[(frame["model"] == row.model) & (frame["task"] == task) & (frame["metric"] == metric)]
    if row.setting is not None:
        hit = hit[hit["setting"] == row.setting]
    if len(hit) > 1:
        raise TableError(f"table {spec.name}: row {row.key!r} ({row.model!r}) has {len(hit)} published values for "
                         f"{task}/{metric}; give the row a 'setting' to pick one")
    if hit.empty:
        return None
    record = hit.iloc[0]
    return PublishedValue(float(record["value"]), str(record["printed"]), bool(record["uncertain"]))


def check_rows_exist(spec: TableSpec) -> None:
    frame = published_rows(spec)
    for row in spec.rows:
        if row.model is None:
            continue
        found = frame[frame["model"] == row.model]
        if row.setting is not None:
            found = found[found["setting"] == row.setting]
        if found.empty:
            raise TableError(f"table {spec.name}: row {row.key!r} names model {row.model!r}, which "
                             f"{spec.published} does not have")


def recompute_averages(spec: TableSpec) -> list[dict[str, Any]]:
    """For each row with a printed average: the printed value, the mean of its printed ``over``
    cells, and whether they agree within rounding (inputs and output both rounded to the printed
    precision: |difference| <= one unit of the last printed digit)."""
    if spec.average is None:
        return []
    out = []
    for row in spec.rows:
        printed = published_cell(spec, row, spec.average.task, spec.average.metric)
        if printed is None:
            continue
        cells = [published_cell(spec, row, col.task, col.metric) for col in spec.columns if col.header in spec.average.over]
        if any(c is None for c in cells):
            out.append({"model": row.model, "printed": printed.value, "recomputed": None, "agrees": None})
            continue
        recomputed = sum(c.value for c in cells) / len(cells)
        decimals = len(printed.printed.split(".")[1]) if "." in printed.printed else 0
        unit = 10.0 ** -decimals
        out.append({"model": row.model, "printed": printed.value, "recomputed": recomputed,
                    "agrees": abs(recomputed - printed.value) <= unit + 1e-9})
    return out
