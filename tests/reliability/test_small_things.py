"""Small things users hit: results as Markdown without tabulate, the teacher-5l preset, aliases in
``kdbench list``, ``plot`` without latency by default and with readable labels, ``run --help``."""

from __future__ import annotations

import math

import pandas as pd
import pytest

from kdbench.cli import build_parser, main


def test_markdown_table_without_tabulate():
    from kdbench.records import markdown_table

    frame = pd.DataFrame({"method": ["kd", "a|b"], "metric.acc": [91.25, math.nan], "seed": [1, 2]})
    assert markdown_table(frame).splitlines() == [
        "| method | metric.acc | seed |",
        "|:-------|-----------:|-----:|",
        "| kd     |      91.25 |    1 |",
        "| a\\|b   |            |    2 |",
    ]


def test_results_markdown_is_a_pipe_table(tmp_path, capsys, monkeypatch):
    import json

    from kdbench import records

    monkeypatch.setattr(records, "_has_tabulate", lambda: False)
    run = tmp_path / "kd-sst2-000000000000"
    run.mkdir()
    (run / "result.json").write_text(json.dumps({
        "schema_version": 1, "method": "kd", "task": "sst2", "student": "s", "config": {}, "metrics": {"acc": 90.0},
        "status": "completed", "seed": 1}))
    assert main(["results", str(tmp_path)]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[0].split("|")[1:6] == [" method ", " task ", " student ", " seed ", " status    "]
    assert lines[1].startswith("|:---")
    assert "| kd " in lines[2] and "90" in lines[2]


def test_teacher_5l_preset(tiny_world):
    from transformers import AutoConfig

    from kdbench.plugins import STUDENTS

    teacher = AutoConfig.from_pretrained(tiny_world.teacher)
    assert STUDENTS.get("teacher-5l").build_config(teacher).num_hidden_layers == 5


def test_list_shows_aliases(capsys):
    assert main(["list", "methods"]) == 0
    lines = dict(line.split("\t", 1) for line in capsys.readouterr().out.splitlines())
    assert lines["kd"].endswith("(also: hinton, vanilla-kd)") and lines["pkd"].endswith("(also: bert-pkd)")
    assert main(["list", "tasks"]) == 0
    assert "(also: squad-v1, squad-v1.1, squad1.1)" in capsys.readouterr().out


def test_run_help_explains_method_and_task(capsys):
    with pytest.raises(SystemExit):
        main(["run", "--help"])
    text = " ".join(capsys.readouterr().out.split())
    assert "METHOD distillation method: kd, tinybert" in text and "kdbench list methods" in text
    assert "--task TASK GLUE task (sst2, mnli, ...), squad / squad-v2, or corpus" in text


def test_plot_does_not_time_models_by_default(monkeypatch, tmp_path):
    from kdbench import plots

    seen = {}

    def frame(runs, *, latency=False, measurer=None):
        seen["latency"] = latency
        return pd.DataFrame()

    monkeypatch.setattr(plots, "tradeoff_frame", frame)
    assert main(["plot", "--runs", str(tmp_path), "--out", str(tmp_path / "p")]) == 0
    assert seen == {"latency": False}
    assert main(["plot", "--runs", str(tmp_path), "--out", str(tmp_path / "p"), "--latency"]) == 0
    assert seen == {"latency": True}
    assert build_parser().parse_args(["plot", "--runs", "x"]).latency is False


def test_labels_of_coinciding_points_do_not_overlap(tmp_path):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from kdbench.plots import LABEL_FONT_SIZE, label_offsets

    fig, ax = plt.subplots()
    xs, ys = [10.0, 10.0, 10.0, 30.0], [80.0, 80.0, 80.0, 70.0]
    ax.scatter(xs, ys)
    ax.margins(0.2)
    ax.autoscale_view()
    offsets = label_offsets(ax, xs, ys, ["kd/teacher-3l", "pkd/teacher-3l", "tinybert/teacher-3l", "far"])
    same_point = [dy for dx, dy in offsets[:3]]
    assert len(set(same_point)) == 3  # stacked, not drawn on top of each other
    assert min(abs(a - b) for i, a in enumerate(same_point) for b in same_point[i + 1:]) >= 1.2 * LABEL_FONT_SIZE
    assert offsets[3] == (5, 3)  # a lone point keeps the default place
    plt.close(fig)


def test_plot_writes_files_with_flops_when_not_timed(tmp_path):
    from kdbench.plots import plot_tradeoffs

    frame = pd.DataFrame([
        {"method": m, "student": "teacher-3l", "task": "SST-2", "score": 85.0, "std": math.nan, "seeds": 1,
         "params_millions": 17.4, "flops_billions": 1.1} for m in ("kd", "pkd", "tinybert")])
    written = plot_tradeoffs(frame, tmp_path)
    svg = (tmp_path / "SST-2.svg").read_text()
    assert len(written) == 2 and "FLOPs per example" in svg and "tinybert/teacher-3l" in svg
