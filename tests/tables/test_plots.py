"""Trade-off plots: the Pareto front on hand-made points, files written, frame from runs."""

from __future__ import annotations

import math

import pandas as pd
import pytest

from kdbench.plots import pareto_front, plot_tradeoffs, tradeoff_frame


def test_pareto_front_lower_x_higher_y():
    xs = [10.0, 5.0, 20.0, 5.0, 30.0, math.nan]
    ys = [80.0, 70.0, 85.0, 60.0, 84.0, 99.0]
    # (5,70) best at x=5; (10,80); (20,85); (5,60) dominated by (5,70); (30,84) by (20,85); NaN ignored
    assert pareto_front(xs, ys) == [1, 0, 2]
    assert pareto_front([1.0, 1.0], [2.0, 2.0]) == [0, 1]  # ties dominate nobody


def test_plot_files_written(tmp_path):
    frame = pd.DataFrame([
        {"method": "tinybert", "student": "s", "task": "SST-2", "score": 88.0, "std": 0.5, "seeds": 2,
         "params_millions": 14.5, "latency_ms": 5.0},
        {"method": "kd", "student": "s", "task": "SST-2", "score": 85.0, "std": None, "seeds": 1,
         "params_millions": 17.4, "latency_ms": 7.0},
        {"method": "kd", "student": "s", "task": "RTE", "score": 60.0, "std": None, "seeds": 1,
         "params_millions": 17.4, "latency_ms": math.nan},
    ])
    written = plot_tradeoffs(frame, tmp_path)
    assert sorted(p.name for p in written) == ["RTE.png", "RTE.svg", "SST-2.png", "SST-2.svg"]
    assert all(p.stat().st_size > 1000 for p in written)
    assert (tmp_path / "SST-2.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert "<svg" in (tmp_path / "SST-2.svg").read_text()[:500]


def test_tradeoff_frame_from_runs(run, runs_frame):
    runs = runs_frame(run("tinybert", "sst2", {"acc": 88.0}, seed=1), run("tinybert", "sst2", {"acc": 90.0}, seed=2),
                      run("kd", "rte", {"acc": 55.0}, student="teacher-3l"))
    frame = tradeoff_frame(runs, latency=False)
    tiny = frame[(frame.method == "tinybert") & (frame.task == "SST-2")].iloc[0]
    assert tiny.score == pytest.approx(89.0) and tiny.seeds == 2
    assert set(frame.task) == {"SST-2", "RTE"}
