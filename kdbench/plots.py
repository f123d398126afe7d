"""Trade-off plots of the cross-method table: per task, dev score against latency and against size.

``kdbench plot --runs DIR --out DIR`` writes ``<task>.png`` and ``<task>.svg`` per task: two panels,
score vs FLOPs (analytic, at the table's sequence length; with ``--latency``: latency at batch 1,
measured on this machine, which takes minutes) and score vs parameters (millions), one point per
(method, student) of the runs (mean over seeds), the Pareto front (no other point is both
faster/smaller and better) drawn as a step line with its points ringed. Points that coincide get
distinct markers and their labels are stacked so that none hides another.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from pathlib import Path
from typing import Any

__all__ = ["add_command", "pareto_front", "plot_tradeoffs", "tradeoff_frame"]

STAT_KEYS = ("params_millions", "flops_billions", "speedup_x", "latency_ms")
MARKERS = ("o", "s", "^", "D", "v", "P", "X", "<", ">", "*")
LABEL_FONT_SIZE = 7


def pareto_front(xs: Sequence[float], ys: Sequence[float]) -> list[int]:
    """Indices of the points no other point dominates, for *lower x* and *higher y* being better,
    sorted by x. A point is dominated when another has x <= and y >= with one strictly better."""
    points = [(x, y, i) for i, (x, y) in enumerate(zip(xs, ys)) if not (math.isnan(x) or math.isnan(y))]
    front = []
    for x, y, i in points:
        dominated = any((ox <= x and oy >= y) and (ox < x or oy > y) for ox, oy, _ in points)
        if not dominated:
            front.append((x, y, i))
    return [i for _, _, i in sorted(front)]


def tradeoff_frame(runs: Any, *, latency: bool = False, measurer=None):
    """One row per (method, student, task): ``score`` (mean dev score over seeds), ``params_millions``,
    ``flops_billions`` and (with ``latency``) ``latency_ms`` at batch 1, from the cross-method table."""
    import pandas as pd

    from kdbench.tables import Measurer, build_table, load_spec

    spec = load_spec("cross-method")
    measurer = measurer or Measurer(seq_len=spec.seq_len, latency=latency)
    table = build_table(spec, runs, measurer=measurer)
    stat_keys = {"Avg (ours)", *STAT_KEYS}
    rows = []
    keys = sorted({k for k, _ in table.measured})
    for row_key in keys:
        method, student, teacher = row_key
        stats = {s: table.measured[(row_key, s)].mean for s in STAT_KEYS if (row_key, s) in table.measured}
        for (key, header), value in table.measured.items():
            if key != row_key or header in stat_keys:
                continue
            rows.append({"method": method, "student": student, "teacher": teacher, "task": header,
                         "score": value.mean, "std": value.std, "seeds": value.n, **stats})
    return pd.DataFrame(rows)


def plot_tradeoffs(frame, out_dir: str | Path, *, title_prefix: str = "") -> list[Path]:
    """Write ``<task>.png`` and ``<task>.svg`` per task of ``frame`` (see ``tradeoff_frame``)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    written: list[Path] = []
    if frame is None or len(frame) == 0:
        return written
    for task, group in frame.groupby("task", sort=False):
        group = group.reset_index(drop=True)
        fig, axes = plt.subplots(1, 2, figsize=(11, 4.5))
        timed = "latency_ms" in group and not group["latency_ms"].isna().all()
        first = ("latency_ms", "latency, batch 1 (ms, this machine)") if timed else \
            ("flops_billions", "FLOPs per example (billions)")
        for ax, column, xlabel in ((axes[0], *first), (axes[1], "params_millions", "parameters (millions)")):
            if column not in group or group[column].isna().all():
                ax.text(0.5, 0.5, f"no {column} measured", ha="center", va="center", transform=ax.transAxes)
                ax.set_xlabel(xlabel)
                continue
            xs = group[column].astype(float).tolist()
            ys = group["score"].astype(float).tolist()
            front = pareto_front(xs, ys)
            for i, row in group.iterrows():
                err = row["std"] if isinstance(row.get("std"), float) and not math.isnan(row["std"]) else None
                ax.errorbar(xs[i], ys[i], yerr=err, fmt=MARKERS[i % len(MARKERS)], capsize=3, alpha=0.85,
                            markersize=7 if i < len(MARKERS) else 5, label=f"{row['method']} ({row['student']})")
            ax.margins(x=0.2, y=0.15)  # room for labels of the outermost points
            ax.autoscale_view()
            labels = [f"{row['method']}/{str(row['student'])[:16]}" for _, row in group.iterrows()]
            for i, offset in enumerate(label_offsets(ax, xs, ys, labels)):
                ax.annotate(labels[i], (xs[i], ys[i]), textcoords="offset points", xytext=offset,
                            fontsize=LABEL_FONT_SIZE, annotation_clip=False)
            if front:
                fx = [xs[i] for i in front]
                fy = [ys[i] for i in front]
                ax.step(fx, fy, where="post", color="black", linestyle="--", linewidth=1, label="Pareto front")
                ax.scatter(fx, fy, s=160, facecolors="none", edgecolors="red", linewidths=1.5, zorder=3)
            ax.set_xlabel(xlabel)
            ax.set_ylabel(f"{task} dev score")
            ax.grid(True, alpha=0.3)
        handles, labels = axes[1].get_legend_handles_labels() if axes[1].lines or axes[1].collections \
            else axes[0].get_legend_handles_labels()
        if handles:
            fig.legend(handles, labels, loc="lower center", ncol=min(4, len(labels)), fontsize=8, frameon=False)
        cost = "latency" if timed else "FLOPs"
        fig.suptitle(f"{title_prefix}{task}: dev score vs {cost} and size (red rings: Pareto front)")
        fig.tight_layout(rect=(0, 0.12, 1, 0.95))
        stem = task.replace(" ", "_").replace("/", "-")
        for suffix in ("png", "svg"):
            path = out / f"{stem}.{suffix}"
            fig.savefig(path, dpi=120, bbox_inches="tight")  # labels at the edges are not cut off
            written.append(path)
        plt.close(fig)
    return written


def label_offsets(ax: Any, xs: Sequence[float], ys: Sequence[float], labels: Sequence[str]) -> list[tuple[int, int]]:
    """An offset (points) for each point's label such that no two label boxes overlap: each label
    takes the first free slot right of its point, then stacked above and below it. Boxes are
    estimated from the font size, in display space, so coinciding points get stacked labels."""
    dpi_scale = ax.figure.dpi / 72.0
    char_w, height = 0.6 * LABEL_FONT_SIZE, 1.3 * LABEL_FONT_SIZE  # points
    slots = [(5, 3)] + [(5, 3 + sign * step * height) for step in range(1, 12) for sign in (1, -1)]
    placed: list[tuple[float, float, float, float]] = []
    offsets: list[tuple[int, int]] = [(5, 3)] * len(labels)
    order = sorted(range(len(labels)), key=lambda i: (-ys[i] if not math.isnan(ys[i]) else 0.0, i))
    for i in order:
        if math.isnan(xs[i]) or math.isnan(ys[i]):
            continue
        px, py = ax.transData.transform((xs[i], ys[i])) / dpi_scale
        width = char_w * len(labels[i])
        for dx, dy in slots:
            box = (px + dx, py + dy, px + dx + width, py + dy + height)
            if not any(box[0] < b[2] and b[0] < box[2] and box[1] < b[3] and b[1] < box[3] for b in placed):
                placed.append(box)
                offsets[i] = (int(dx), int(dy))
                break
    return offsets


def cmd_plot(args) -> int:
    frame = tradeoff_frame(args.runs, latency=args.latency)
    if len(frame) == 0:
        print("no completed runs with task metrics under " + ", ".join(args.runs))
        return 0
    for path in plot_tradeoffs(frame, args.out):
        print(path)
    return 0


def add_command(subparsers) -> None:
    parser = subparsers.add_parser("plot", help="per task: dev score vs latency and vs parameters, Pareto front "
                                                "marked (PNG and SVG)")
    parser.add_argument("--runs", action="append", required=True, help="folder of result records (repeatable)")
    parser.add_argument("--out", default="plots", help="output folder (default: plots)")
    parser.add_argument("--latency", action="store_true",
                        help="time every model at batch 1 on this machine (minutes) and plot score vs latency; "
                             "by default the first panel is score vs analytic FLOPs")
    parser.add_argument("--no-latency", action="store_true", help="the default; kept for old scripts")
    parser.set_defaults(handler=cmd_plot)
