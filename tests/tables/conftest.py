"""Fixtures for the table tests: synthetic result records (a DataFrame shaped like load_records')."""

from __future__ import annotations

import pandas as pd
import pytest


def make_run(method: str, task: str, metrics: dict[str, float], *, student: str = "tinybert-4l-312",
             seed: int = 42, label: str | None = None, status: str = "completed", method_params: dict | None = None,
             run_dir: str | None = None, teacher: str | None = None, **config) -> dict:
    row = {"method": method, "task": task, "student": student, "label": label, "seed": seed, "status": status,
           "teacher": teacher, "run_dir": run_dir or f"/nonexistent/{method}-{task}-{seed}-{label}",
           "config": {"method": method, "task": task, "method_params": dict(method_params or {}), **config}}
    for name, value in metrics.items():
        row[f"metric.{name}"] = value
    return row


@pytest.fixture
def run():
    """``run(method, task, metrics, **fields)`` -> one record row."""
    return make_run


@pytest.fixture
def runs_frame():
    def build(*rows: dict) -> pd.DataFrame:
        return pd.DataFrame(list(rows))

    return build
