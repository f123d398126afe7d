"""``kdbench report DIR --out FOLDER``: one static HTML page per sweep, tuning study or folder of runs.

A page puts side by side what the other commands print one by one:

- the paper tables whose rows the runs fill (published beside measured, :mod:`kdbench.tables`),
  and the cross-method table;
- score against cost per task (FLOPs, parameters; :mod:`kdbench.plots`);
- every run: method, task, student, status, dev metrics, time;
- each run's loss curves, one panel per stage, one line per loss term, the dev score on the right
  axis, read from ``RUN/loss_terms.jsonl`` or, for runs written before it existed, from the
  ``trainer_state.json`` of each stage's last checkpoint;
- a tuning study's trials, optimisation history and parameter importances (Optuna storage);
- failed, blocked or unfinished cells with their errors.

What ``DIR`` holds decides the pages: each folder with a sweep manifest (``sweep.json``) is a sweep
page, each folder with an Optuna study (``study.journal``, ``*.db``, or ``best.json``) a study page;
without either, all result records under ``DIR`` make one page. Pages are self-contained (images
inline as PNG data URIs, CSS in the page, no script); ``FOLDER/index.html`` links them.
"""

from __future__ import annotations

import argparse
import base64
import html
import io
import json
import math
import re
import tempfile
import time
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from kdbench.config import ConfigError
from kdbench.disk import STAGES_DIR
from kdbench.loss_log import (LOG_LINE_KEYS, LOSS_TERMS_FILE, eval_metrics_of, last_epoch_loss_terms, loss_terms_of,
                              read_loss_lines)

SWEEP_MANIFEST = "sweep.json"
STUDY_FILES = ("study.journal", "study.db", "best.json")
SKIPPED_FOLDERS = (".kdbench-sweep", ".submitit", "checkpoint-", "model", "stages", "wandb", "tensorboard")
INDEX = "index.html"

STYLE = """
body { font-family: system-ui, -apple-system, "Segoe UI", sans-serif; margin: 2rem auto; max-width: 1200px;
       color: #1d1d1f; padding: 0 1rem; }
h1 { font-size: 1.6rem; margin-bottom: .2rem; } h2 { border-bottom: 1px solid #ddd; padding-bottom: .2rem;
margin-top: 2.2rem; } h3 { margin-bottom: .3rem; }
.meta { color: #555; margin-top: 0; }
nav a { margin-right: 1rem; }
table { border-collapse: collapse; margin: .6rem 0 1.2rem; font-size: .88rem; }
th, td { border: 1px solid #ccc; padding: .25rem .55rem; text-align: right; }
th { background: #f3f3f6; } td:first-child, th:first-child { text-align: left; }
caption { font-weight: 600; text-align: left; padding: .3rem 0; }
tfoot td { text-align: left; color: #555; font-size: .8rem; border: none; }
.kdbench-table tr:nth-child(odd) td { background: #fafafa; }
.status-completed, .state-done { color: #17803d; } .status-failed, .state-failed { color: #b3261e; font-weight: 600; }
.state-blocked, .state-not-started, .state-pending, .state-running, .state-requeued { color: #8a5a00; }
figure { display: inline-block; margin: .4rem 1rem 1rem 0; vertical-align: top; }
figcaption { font-size: .8rem; color: #444; max-width: 640px; }
img { max-width: 100%; border: 1px solid #eee; }
pre { background: #f6f6f8; padding: .5rem; overflow-x: auto; font-size: .8rem; white-space: pre-wrap; }
.empty { color: #777; font-style: italic; }
table.failures td, table.runs td:nth-child(-n+5) { text-align: left; }
"""


@dataclass
class Page:
    kind: str  # "sweep" | "study" | "runs"
    name: str
    folder: Path
    slug: str = ""

    def __post_init__(self) -> None:
        if not self.slug:
            self.slug = re.sub(r"[^A-Za-z0-9_.-]+", "-", f"{self.kind}-{self.name}").strip("-")


@dataclass
class Curves:
    """A run's logged training: per stage, the loss lines and the evaluations."""

    steps: dict[str, list[dict[str, Any]]] = field(default_factory=dict)
    evals: dict[str, list[dict[str, Any]]] = field(default_factory=dict)
    source: str = ""


# ---------------------------------------------------------------------------------------------
# What a folder holds
# ---------------------------------------------------------------------------------------------
def _walk(folder: Path) -> Iterable[Path]:
    yield folder
    try:
        children = sorted(p for p in folder.iterdir() if p.is_dir())
    except OSError:
        return
    for child in children:
        if child.name.startswith(SKIPPED_FOLDERS) or (child / "result.json").is_file():
            continue  # run folders are read through their records, not walked
        yield from _walk(child)


def discover(folder: Path) -> list[Page]:
    """The pages ``folder`` calls for (see the module's docstring)."""
    folder = Path(folder)
    if not folder.is_dir():
        raise FileNotFoundError(f"report: {str(folder)!r} is not a folder")
    pages: list[Page] = []
    for candidate in _walk(folder):
        manifest = candidate / SWEEP_MANIFEST
        if manifest.is_file():
            try:
                name = json.loads(manifest.read_text()).get("name") or candidate.name
            except (OSError, json.JSONDecodeError):
                name = candidate.name
            pages.append(Page("sweep", str(name), candidate))
        elif any((candidate / name).is_file() for name in STUDY_FILES) or list(candidate.glob("*.db")):
            pages.append(Page("study", candidate.name, candidate))
    if not pages:
        from kdbench.records import find_records

        if not find_records(folder):
            raise ConfigError(f"report: nothing to report under {str(folder)!r} (no sweep.json, no Optuna study, "
                              "no result.json)")
        pages.append(Page("runs", folder.resolve().name, folder))
    seen: dict[str, int] = {}
    for page in pages:  # two sweeps of one name get two files
        seen[page.slug] = seen.get(page.slug, 0) + 1
        if seen[page.slug] > 1:
            page.slug = f"{page.slug}-{seen[page.slug]}"
    return pages


# ---------------------------------------------------------------------------------------------
# Loss curves
# ---------------------------------------------------------------------------------------------
def read_curves(run_dir: Path) -> Curves:
    """The run's per-step loss terms and evaluations: ``RUN/loss_terms.jsonl``, else each stage's
    last checkpoint's ``trainer_state.json`` (``log_history``)."""
    run_dir = Path(run_dir)
    curves = Curves()
    path = run_dir / LOSS_TERMS_FILE
    if path.is_file():
        curves.source = LOSS_TERMS_FILE
        for _, entry in read_loss_lines(path):
            stage = str(entry.get("stage", ""))
            if isinstance(entry.get("eval"), Mapping):
                curves.evals.setdefault(stage, []).append({"step": entry.get("step"), **entry["eval"]})
            elif "loss" in entry:
                curves.steps.setdefault(stage, []).append(entry)
        return curves
    for stage_dir in sorted((run_dir / STAGES_DIR).glob("*-*")) if (run_dir / STAGES_DIR).is_dir() else []:
        states = sorted(stage_dir.glob("checkpoint-*/trainer_state.json"),
                        key=lambda p: int(p.parent.name.split("-")[-1]) if p.parent.name.split("-")[-1].isdigit() else -1)
        if not states:
            continue
        curves.source = "trainer_state.json"
        stage = stage_dir.name.split("-", 1)[1]
        for entry in json.loads(states[-1].read_text()).get("log_history", []):
            if "loss" in entry:
                terms = loss_terms_of(entry)
                curves.steps.setdefault(stage, []).append(
                    {"stage": stage, "step": entry.get("step"), "epoch": entry.get("epoch"),
                     "lr": entry.get("learning_rate"), "loss": entry["loss"], **terms})
            metrics = eval_metrics_of(entry)
            if metrics:
                curves.evals.setdefault(stage, []).append({"step": entry.get("step"), **metrics})
    return curves


def plot_curves(curves: Curves, title: str, main_metric: str | None) -> bytes | None:
    """PNG bytes: one panel per stage, the total loss and each term against the step (log scale when
    the lines span more than two decades), the dev ``main_metric`` on a right axis."""
    stages = [s for s in dict.fromkeys([*curves.steps, *curves.evals]) if curves.steps.get(s)]
    if not stages:
        return None
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, len(stages), figsize=(4.6 * len(stages), 3.1), squeeze=False)
    for ax, stage in zip(axes[0], stages):
        entries = curves.steps[stage]
        steps = [e.get("step") for e in entries]
        terms = [k for k in dict.fromkeys(k for e in entries for k in e) if k not in LOG_LINE_KEYS]
        values = []
        ax.plot(steps, [e.get("loss") for e in entries], color="black", linewidth=1.8, label="loss (total)")
        values += [e.get("loss") for e in entries]
        for term in terms:
            ys = [e.get(term) for e in entries]
            ax.plot(steps, ys, linewidth=1.2, marker="." if len(steps) < 30 else None, label=term)
            values += ys
        positive = [v for v in values if isinstance(v, int | float) and v > 0 and math.isfinite(v)]
        if positive and len(positive) == len([v for v in values if v is not None]) \
                and max(positive) / min(positive) > 100:
            ax.set_yscale("log")
        ax.set_xlabel("step")
        ax.set_title(stage, fontsize=10)
        ax.grid(True, alpha=0.3)
        evals = [e for e in curves.evals.get(stage, []) if main_metric and main_metric in e]
        if evals:
            right = ax.twinx()
            right.plot([e["step"] for e in evals], [e[main_metric] for e in evals], "s--", color="tab:red",
                       markersize=4, linewidth=1, label=f"dev {main_metric}")
            right.set_ylabel(f"dev {main_metric}", color="tab:red", fontsize=8)
            right.tick_params(axis="y", labelcolor="tab:red", labelsize=7)
        ax.legend(fontsize=7, loc="upper right", framealpha=0.7)
    axes[0][0].set_ylabel("loss")
    fig.suptitle(title, fontsize=9)
    fig.tight_layout()
    buffer = io.BytesIO()
    fig.savefig(buffer, format="png", dpi=90)
    plt.close(fig)
    return buffer.getvalue()


# ---------------------------------------------------------------------------------------------
# HTML pieces
# ---------------------------------------------------------------------------------------------
def _e(value: Any) -> str:
    return html.escape("" if value is None else str(value))


def _img(png: bytes, alt: str) -> str:
    return f'<img alt="{_e(alt)}" src="data:image/png;base64,{base64.b64encode(png).decode()}">'


def _html_table(header: Sequence[str], rows: Sequence[Sequence[Any]], css: str = "",
                row_classes: Sequence[str] | None = None, raw_columns: Sequence[int] = ()) -> str:
    out = [f'<table class="{css}">' if css else "<table>",
           "<thead><tr>" + "".join(f"<th>{_e(h)}</th>" for h in header) + "</tr></thead><tbody>"]
    for index, row in enumerate(rows):
        cls = f' class="{row_classes[index]}"' if row_classes else ""
        cells = "".join(f"<td>{cell if i in raw_columns else _e(cell)}</td>" for i, cell in enumerate(row))
        out.append(f"<tr{cls}>{cells}</tr>")
    out.append("</tbody></table>")
    return "\n".join(out)


def _fmt(value: Any) -> str:
    if isinstance(value, float):
        return "–" if math.isnan(value) else f"{value:.2f}"
    return "–" if value is None else str(value)


def _records(folder: Path) -> list[dict[str, Any]]:
    from kdbench.records import find_records, read_record

    records = []
    for path in find_records(folder):
        record = read_record(path)
        record["run_dir"] = str(path.parent)
        records.append(record)
    return records


def _main_metric(task: str) -> str | None:
    from kdbench.plugins import TASKS

    try:
        return TASKS.get(task).spec.main_metric
    except Exception:
        return None


def _teacher_only(select: Sequence[Mapping[str, Any]]) -> bool:
    return bool(select) and all(set(alternative) == {"role"} for alternative in select)


def tables_section(records: list[dict[str, Any]], names: Sequence[str] | None) -> str:
    """The paper tables with at least one student run on a row (or ``names``), and the cross-method table."""
    import pandas as pd

    from kdbench import tables

    if not records:
        return '<p class="empty">no result records</p>'
    frame = pd.DataFrame([{**{k: v for k, v in r.items() if k not in ("metrics", "versions", "stages", "data")},
                           **{f"metric.{k}": v for k, v in (r.get("metrics") or {}).items()}} for r in records])
    chosen = list(names) if names else []
    problems = []
    if not names:
        for name in tables.table_names():
            spec = tables.load_spec(name)
            if isinstance(spec, tables.CrossMethodSpec):
                continue
            try:
                by_row, _ = tables.assign_rows(spec, frame)
            except tables.TableError as error:  # e.g. a run two rows claim: said on the page
                problems.append(f"{name}: {error}")
                continue
            # A teacher fills the teacher row of nearly every table: a table is shown when a student lands on it.
            student_rows = {row.key for row in spec.rows if not _teacher_only(row.select)}
            if any(indices for key, indices in by_row.items() if key in student_rows):
                chosen.append(name)
        if (frame["status"] == "completed").any():
            chosen.append("cross-method")
    parts = [f'<p class="state-failed">table {_e(problem)}</p>' for problem in problems]
    for name in chosen:
        table = tables.build_table(name, frame)
        parts.append(tables.render(table, "html"))
    return "\n".join(parts) or '<p class="empty">no paper table has a row for these runs</p>'


def tradeoffs_section(records: list[dict[str, Any]]) -> str:
    import pandas as pd

    from kdbench.plots import plot_tradeoffs, tradeoff_frame

    completed = [r for r in records if r.get("status") == "completed" and r.get("metrics")]
    if not completed:
        return '<p class="empty">no completed runs</p>'
    frame = pd.DataFrame([{**{k: v for k, v in r.items() if k not in ("metrics", "versions", "stages", "data")},
                           **{f"metric.{k}": v for k, v in (r.get("metrics") or {}).items()}} for r in completed])
    points = tradeoff_frame(frame, latency=False)
    if len(points) == 0:
        return '<p class="empty">no run with a task metric</p>'
    with tempfile.TemporaryDirectory() as tmp:
        figures = [path for path in plot_tradeoffs(points, tmp) if path.suffix == ".png"]
        return "\n".join(f"<figure>{_img(p.read_bytes(), f'score vs cost: {p.stem}')}"
                         f"<figcaption>{_e(p.stem)}: dev score against cost, as <code>kdbench plot</code> draws it "
                         "(latency only with <code>kdbench plot --latency</code>); red rings mark the Pareto front"
                         "</figcaption></figure>"
                         for p in figures)


def runs_section(records: list[dict[str, Any]], names: Mapping[str, str]) -> str:
    if not records:
        return '<p class="empty">no result records</p>'
    metric_names = sorted({m for r in records for m in (r.get("metrics") or {})})
    header = ["run", "method", "task", "student", "label", "seed", "status", *metric_names, "params (M)", "seconds"]
    rows, classes = [], []
    for r in sorted(records, key=lambda r: (str(r.get("task")), str(r.get("method")), str(r.get("run_dir")))):
        name = names.get(r["run_dir"], Path(r["run_dir"]).name)
        student = str(r.get("student") or "")
        student = Path(student).parent.name if Path(student).name == "model" else student
        params = r.get("student_params")
        rows.append([f'<a href="#run-{_e(Path(r["run_dir"]).name)}">{_e(name)}</a>', r.get("method"), r.get("task"),
                     student, r.get("label"), r.get("seed"), r.get("status"),
                     *[_fmt((r.get("metrics") or {}).get(m)) for m in metric_names],
                     f"{params / 1e6:.1f}" if isinstance(params, int | float) else "–", _fmt(r.get("train_seconds"))])
        classes.append(f"status-{r.get('status')}")
    return _html_table(header, rows, "runs", classes, raw_columns=(0,))


def curves_section(records: list[dict[str, Any]], names: Mapping[str, str]) -> str:
    parts = []
    for r in sorted(records, key=lambda r: (str(r.get("task")), str(r.get("method")), str(r.get("run_dir")))):
        run_dir = Path(r["run_dir"])
        name = names.get(r["run_dir"], run_dir.name)
        curves = read_curves(run_dir)
        png = plot_curves(curves, f"{name}: {r.get('method')} on {r.get('task')}", _main_metric(str(r.get("task"))))
        anchor = f'id="run-{_e(run_dir.name)}"'
        if png is None:
            parts.append(f'<figure {anchor}><figcaption>{_e(name)}: no loss terms logged '
                         f"({LOSS_TERMS_FILE} or checkpoint trainer_state.json)</figcaption></figure>")
            continue
        summary = "; ".join(_last_epoch_summary(stage, entries) for stage, entries in curves.steps.items() if entries)
        parts.append(f"<figure {anchor}>{_img(png, f'loss curves of {name}')}<figcaption>{_e(name)} "
                     f"(from {_e(curves.source)}); mean over the last epoch: {_e(summary)}</figcaption></figure>")
    return "\n".join(parts) or '<p class="empty">no runs</p>'


def _last_epoch_summary(stage: str, entries: list[dict[str, Any]]) -> str:
    terms, steps = last_epoch_loss_terms(entries)
    return f"{stage}: " + ", ".join(f"{name} {value:.4g}" for name, value in terms.items()) + f" ({steps} steps)"


def failures_section(records: list[dict[str, Any]], sweep_folder: Path | None) -> str:
    rows, classes = [], []
    if sweep_folder is not None:
        from kdbench.sweep import DONE, sweep_status

        for status in sweep_status(sweep_folder, query_slurm=False):
            if status.state == DONE:
                continue
            rows.append([status.name, status.state, status.job_id or "–", status.error or "–", status.run_dir])
            classes.append(f"state-{status.state}")
    else:
        for r in records:
            if r.get("status") != "completed":
                rows.append([Path(r["run_dir"]).name, r.get("status"), "–", r.get("error") or "–", r["run_dir"]])
                classes.append("state-failed" if r.get("status") == "failed" else f"state-{r.get('status')}")
    if not rows:
        return '<p class="empty">none: every run completed</p>'
    table = _html_table(["run", "state", "job", "error", "run folder"], rows, "failures", classes)
    tracebacks = [(Path(r["run_dir"]).name, r["traceback"]) for r in records
                  if r.get("status") == "failed" and r.get("traceback")]
    details = "".join(f"<h3>{_e(name)}</h3><pre>{_e(chr(10).join(trace.strip().splitlines()[-8:]))}</pre>"
                      for name, trace in tracebacks)
    return table + details


# ---------------------------------------------------------------------------------------------
# Tuning studies
# ---------------------------------------------------------------------------------------------
def _study_storages(folder: Path) -> list[str]:
    storages = []
    for path in sorted(folder.glob("*.journal")):
        storages.append(str(path))
    for path in sorted(folder.glob("*.db")):
        storages.append(f"sqlite:///{path.resolve()}")
    return storages


def study_section(folder: Path) -> tuple[str, list[dict[str, Any]]]:
    """The studies in ``folder``'s storages: trials, best, history and importances; and the
    records of their trial runs."""
    import optuna

    from kdbench.tuning import make_storage, save_plots

    optuna.logging.set_verbosity(optuna.logging.WARNING)
    parts: list[str] = []
    best_file = folder / "best.json"
    if best_file.is_file():
        best = json.loads(best_file.read_text())
        parts.append(f"<p>best value <b>{_e(best.get('best_value'))}</b> (trial {_e(best.get('best_trial'))}), "
                     f"params <code>{_e(json.dumps(best.get('best_params'), default=str))}</code></p>")
    storages = _study_storages(folder)
    for storage_url in storages:
        storage = make_storage(storage_url)
        for name in optuna.study.get_all_study_names(storage):
            study = optuna.load_study(study_name=name, storage=storage)
            trials = study.trials
            params = sorted({p for t in trials for p in t.params})
            rows = [[t.number, t.state.name, _fmt(t.value), *[_fmt(t.params.get(p)) for p in params],
                     _fmt(t.duration.total_seconds() if t.duration else None), t.user_attrs.get("run_dir", "–")]
                    for t in trials]
            parts.append(f"<h3>study {_e(name)} ({len(trials)} trials, {_e(storage_url)})</h3>")
            parts.append(_html_table(["trial", "state", "value", *params, "seconds", "run folder"], rows, "trials",
                                     [f"state-{'done' if t.state.name == 'COMPLETE' else 'failed' if t.state.name == 'FAIL' else 'pending'}"
                                      for t in trials]))
            with tempfile.TemporaryDirectory() as tmp:
                for plot_name, path in save_plots(study, Path(tmp)).items():
                    parts.append(f"<figure>{_img(Path(path).read_bytes(), plot_name)}"
                                 f"<figcaption>{_e(plot_name.replace('_', ' '))}</figcaption></figure>")
    if not storages:
        for png in sorted(folder.glob("*.png")):  # the plots `kdbench tune` saved, without a readable storage
            parts.append(f"<figure>{_img(png.read_bytes(), png.stem)}<figcaption>{_e(png.name)}</figcaption></figure>")
    trials_dir = folder / "trials"
    records = _records(trials_dir) if trials_dir.is_dir() else []
    return "\n".join(parts) or '<p class="empty">no Optuna storage found</p>', records


# ---------------------------------------------------------------------------------------------
# Pages
# ---------------------------------------------------------------------------------------------
def _sweep_records(folder: Path) -> tuple[list[dict[str, Any]], dict[str, str]]:
    from kdbench.records import RecordError, read_record

    manifest = json.loads((folder / SWEEP_MANIFEST).read_text())
    records, names = [], {}
    for run in manifest.get("runs", []):
        path = Path(run["run_dir"]) / "result.json"
        if not path.is_file():
            continue
        try:
            record = read_record(path)
        except RecordError:
            continue  # an unreadable record shows in the failures table through sweep_status
        record["run_dir"] = str(path.parent)
        records.append(record)
        names[record["run_dir"]] = run["name"]
    return records, names


def render_page(page: Page, table_names: Sequence[str] | None = None) -> str:
    sections: list[tuple[str, str, str]] = []  # (id, title, html)
    names: dict[str, str] = {}
    if page.kind == "sweep":
        records, names = _sweep_records(page.folder)
    elif page.kind == "study":
        study_html, records = study_section(page.folder)
        sections.append(("tuning", "Tuning history and importances", study_html))
    else:
        records = _records(page.folder)
    counts: dict[str, int] = {}
    for r in records:
        counts[str(r.get("status"))] = counts.get(str(r.get("status")), 0) + 1
    sections = [
        ("tables", "Paper tables (published beside measured)", tables_section(records, table_names)),
        ("tradeoffs", "Score vs cost", tradeoffs_section(records)),
        ("runs", "Runs", runs_section(records, names)),
        ("curves", "Loss curves", curves_section(records, names)),
        *sections,
        ("failures", "Failed and unfinished cells",
         failures_section(records, page.folder if page.kind == "sweep" else None)),
    ]
    title = f"kdbench {page.kind}: {page.name}"
    nav = " ".join(f'<a href="#{sid}">{_e(stitle)}</a>' for sid, stitle, _ in sections)
    count_text = ", ".join(f"{n} {state}" for state, n in sorted(counts.items())) or "no records"
    body = "\n".join(f'<section id="{sid}"><h2>{_e(stitle)}</h2>\n{content}\n</section>'
                     for sid, stitle, content in sections)
    return (f'<!doctype html>\n<html lang="en"><head><meta charset="utf-8"><title>{_e(title)}</title>'
            f"<style>{STYLE}</style></head>\n<body>\n<h1>{_e(title)}</h1>\n"
            f'<p class="meta">{_e(page.folder.resolve())} · {len(records)} runs ({_e(count_text)}) · '
            f"generated {_e(time.strftime('%Y-%m-%d %H:%M'))}</p>\n<nav>{nav}</nav>\n{body}\n</body></html>\n")


def write_report(folder: Path, out: Path, table_names: Sequence[str] | None = None) -> list[Path]:
    """Write one page per sweep / study / folder of runs under ``folder`` into ``out``, and
    ``out/index.html``; returns the pages' paths (index first)."""
    pages = discover(folder)
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    written = []
    for page in pages:
        path = out / f"{page.slug}.html"
        path.write_text(render_page(page, table_names), encoding="utf-8")
        written.append(path)
    links = "".join(f'<li><a href="{_e(p.name)}">{_e(page.kind)}: {_e(page.name)}</a> '
                    f"<small>{_e(page.folder)}</small></li>" for p, page in zip(written, pages))
    index = out / INDEX
    index.write_text(f'<!doctype html>\n<html lang="en"><head><meta charset="utf-8"><title>kdbench report</title>'
                     f"<style>{STYLE}</style></head><body><h1>kdbench report</h1>"
                     f'<p class="meta">{_e(Path(folder).resolve())}</p><ul>{links}</ul></body></html>\n',
                     encoding="utf-8")
    return [index, *written]


def cmd_report(args: argparse.Namespace) -> int:
    for path in write_report(Path(args.dir), Path(args.out), args.table or None):
        print(path)
    return 0


def add_command(subparsers: Any) -> None:
    parser = subparsers.add_parser("report", help="static HTML pages of sweeps, tuning studies or runs: tables, "
                                                  "plots, loss curves, tuning history, failures")
    parser.add_argument("dir", help="a sweep output folder, a tune folder, or any folder of runs")
    parser.add_argument("--out", required=True, help="folder for the HTML pages (index.html links them)")
    parser.add_argument("--table", action="append", default=[],
                        help="paper table to show (repeatable; default: every table a run fills, and cross-method)")
    parser.set_defaults(handler=cmd_report)
