"""Fixtures for the table tests: synthetic result records (a DataFrame shaped like load_records')."""

from __future__ import annotations

import json
from pathlib import Path

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


def write_run(folder: Path, task: str, evaluations: list[dict], *, steps: int = 30, label: str = "tinybert4",
              seed: int = 1, stage: str = "prediction") -> Path:
    """A completed run folder whose last stage recorded ``evaluations`` (``{"step", metric: value}``) in
    ``loss_terms.jsonl``, and whose record kept the F1-best one (or the only one), as kdbench writes them."""
    folder.mkdir(parents=True)
    kept = max(evaluations, key=lambda e: e.get("f1", 0.0)) if evaluations else {}
    metrics = {k: v for k, v in kept.items() if k != "step"}
    record = {"schema_version": 1, "status": "completed", "method": "tinybert", "task": task, "label": label,
              "seed": seed, "student": "teacher-3l-192", "metrics": metrics,
              "config": {"method": "tinybert", "task": task, "method_params": {}},
              "stages": [{"name": "intermediate", "steps": 100, "metrics": {}},
                         {"name": stage, "steps": steps, "metrics": {"eval_f1": metrics.get("f1")}}]}
    (folder / "result.json").write_text(json.dumps(record))
    lines = [{"stage": "intermediate", "step": 50, "epoch": 1.0, "lr": 1e-4, "loss": 3.0}]
    lines += [{"stage": stage, "step": e["step"], "eval": {k: v for k, v in e.items() if k != "step"}}
              for e in evaluations]
    (folder / "loss_terms.jsonl").write_text("".join(json.dumps(line) + "\n" for line in lines))
    return folder


@pytest.fixture
def recorded_run():
    """``recorded_run(folder, task, evaluations, **fields)`` -> a run folder (see :func:`write_run`)."""
    return write_run


@pytest.fixture
def run():
    """``run(method, task, metrics, **fields)`` -> one record row."""
    return make_run


@pytest.fixture
def runs_frame():
    def build(*rows: dict) -> pd.DataFrame:
        return pd.DataFrame(list(rows))

    return build
