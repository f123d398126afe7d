"""A table's records (what of each run is committed, never model weights) and what is rendered from
them: the paper-style table beside the published numbers (``PAPER_TABLES``), the paper's claims
against seed noise (``TABLE_CLAIMS``, :mod:`kdbench.claims`) and score-vs-cost plots."""

from __future__ import annotations

from collections.abc import Collection, Mapping
from pathlib import Path
from typing import Any

from kdbench.reproduce.study import MINI, SPEC_FOLDER, TABLE_CLAIMS, TABLE_ROWS, study_plan, table_tasks

# What a record keeps of a run: its result, config, loss curves and the model's architecture
# (``model/config.json``: tables measure parameters and FLOPs from it, so they re-render anywhere).
RECORD_FILES = ("result.json", "config.yaml", "loss_terms.jsonl", "model/config.json")
MINI_SCALE_NOTE = ("ours = kdbench's mini scale: teacher MiniLM-L6 (6 layers, hidden 384) fine-tuned per task, "
                   "students of 3 layers (`teacher-3l`, `teacher-3l-192`) or the 6-layer bottleneck "
                   "`mobilebert-6l-384`, not the paper's models; see results/reproduction/README.md")
# reproduction table -> the kdbench table spec that renders it
PAPER_TABLES = {"cross-method": "cross-method", "pkd-skip-last": "pkd-table2",
                "tinybert-objectives": "tinybert-v5-table3", "tinybert-mappings": "tinybert-v5-table4",
                "tinybert-procedures": "tinybert-v5-table2", "distilbert-ablation": "distilbert-table4",
                "mobilebert-strategies": "mobilebert-table8", "mobilebert-objectives": "mobilebert-table9"}


def records_folder(table: str, root: Path = SPEC_FOLDER) -> Path:
    return root / table / "records"


def export_records(spec_path: Path, runs_output: Path, destination: Path, supersede: bool | Collection[str] = False,
                   prerequisite_stages: Mapping[str, Any] | None = None) -> list[Path]:
    """Copy the record files (never model weights) of every run of the spec that has a record into
    ``destination/<run folder>/``; returns the copied run folders. ``prerequisite_stages`` (stage
    name -> expanded run, as :func:`kdbench.reproduce.prerequisites.prerequisite_stages` gives them)
    are exported too, under their stage's name as role: the MLM teacher that built the augmented sets.

    A completed record already there from another training of the same config (another machine or
    session: a different ``created_at``) is kept, and named on standard error, unless ``supersede``
    covers it (True: every run; a collection: the run folders it names, e.g. the cells ``--only``
    chose and the stages they read): records that read its model were trained on its weights, which
    a new training need not repeat.
    A run that did not complete never replaces a completed record, ``supersede`` or not, and an
    interrupted run is not exported at all: it resumes when the table runs again and is exported
    once it completes (a failed run is, where no completed record is: a table notes its failure)."""
    import json
    import shutil
    import sys

    from kdbench.sweep import expand, load_spec

    copied = []
    runs = list(expand(load_spec(spec_path), output=runs_output).runs.values())
    roles = {run.run_dir.name: stage_role_name(run.stage, run.values.get("task")) for run in runs if run.stage}
    for name, run in (prerequisite_stages or {}).items():
        if run.run_dir.name not in roles:  # a stage of the spec too (table 1 fine-tunes MobileBERT from it)
            roles[run.run_dir.name] = name
            runs.append(run)
    for run in runs:
        if not (run.run_dir / "result.json").is_file():
            continue
        target = destination / run.run_dir.name
        kept = target / "result.json"
        fresh_text = (run.run_dir / "result.json").read_bytes()
        kept_text = kept.read_bytes() if kept.is_file() else None
        if fresh_text == kept_text:
            # Already exported. A teacher rebuilt by rebuild_teacher.py holds the committed record beside
            # weights of its own training, whose files (model/config.json) must not replace the record's.
            continue
        may_supersede = supersede is True or (not isinstance(supersede, bool) and run.run_dir.name in supersede)
        reason = _why_not_exported(json.loads(fresh_text), json.loads(kept_text) if kept_text else None, may_supersede)
        if reason:
            print(f"[kdbench reproduce] {run.run_dir} not exported to {target}: {reason}", file=sys.stderr, flush=True)
            continue
        target.mkdir(parents=True, exist_ok=True)
        for name in RECORD_FILES:
            if (run.run_dir / name).is_file():
                (target / name).parent.mkdir(parents=True, exist_ok=True)
                shutil.copy2(run.run_dir / name, target / name)
        copied.append(target)
    _write_stage_roles(destination, roles)
    return copied


def stage_role_name(stage: str, task: str | None) -> str:
    """The role a stage plays across tasks: ``teacher-mrpc`` and ``teacher-rte`` are both the task's
    fine-tuned ``teacher`` (one table row spans the tasks); other stages keep their name."""
    suffix = f"-{task}"
    return stage[: -len(suffix)] if task and stage.endswith(suffix) and len(stage) > len(suffix) else stage


def _write_stage_roles(destination: Path, roles: dict[str, str]) -> None:
    """Name each stage run with a record here (the teachers) by its stage in ``stage_roles.json``
    beside the records: a table groups cells by their teacher's role, and records must not need the
    run folders for it. Stages without a record are left out: nothing here reads them, and the name
    of a stage not run yet can change (it hashes prerequisite files that may not exist yet)."""
    import json

    from kdbench.tables.building import STAGE_ROLES_FILE

    path = destination / STAGE_ROLES_FILE
    known = json.loads(path.read_text()) if path.is_file() else {}
    merged = {name: role for name, role in {**known, **roles}.items() if (destination / name).is_dir()}
    if merged != known:
        destination.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(merged, indent=1, sort_keys=True) + "\n")


def _why_not_exported(fresh: dict[str, Any], committed: dict[str, Any] | None, supersede: bool) -> str | None:
    """Why the run's record ``fresh`` is not copied where ``committed`` (or nothing) is; None to copy it."""
    from kdbench.records import COMPLETED, INTERRUPTED

    if fresh.get("status") == INTERRUPTED:
        return "it was interrupted; it resumes when the table runs again and is exported when it completes"
    if committed and committed.get("status") == COMPLETED and fresh.get("status") != COMPLETED:
        # e.g. a stage retrained here and stopped half-way: never lose a finished result to it
        return f"it is {fresh.get('status')}, not completed; the completed record stays"
    conflict = _other_training(fresh, committed)
    same_weights = conflict and _same_weights(fresh, committed)
    if same_weights:
        return (f"the record kept there is another training that wrote the same weights (sha256 "
                f"{same_weights[:12]}), so records that read either agree; nothing to rerun")
    if conflict and not supersede:
        return (f"{conflict}; --supersede-records replaces it (with --only, when the chosen cells read it or it is "
                f"chosen; rerun every record that read its model)")
    return None


def _other_training(fresh: dict[str, Any], old: dict[str, Any] | None) -> str | None:
    """Why the completed record ``old`` is another training than ``fresh``; None when it is the same
    run (or ``old`` is absent or unfinished, so the new one may replace it)."""
    from kdbench.records import COMPLETED

    if old is None:
        return None
    if old.get("status") != COMPLETED or old.get("created_at") == fresh.get("created_at"):
        return None
    return (f"the record kept there is a completed run created {old.get('created_at')} (metrics {old.get('metrics')}), "
            f"this one was created {fresh.get('created_at')} (metrics {fresh.get('metrics')})")


def _same_weights(fresh: dict[str, Any], old: dict[str, Any]) -> str | None:
    """The sha256 of the weights both records wrote, when both name them and they are equal (a
    deterministic retraining: same code, libraries and thread count); else None."""
    written = [(record.get("weights_sha256") or {}).get("model") for record in (fresh, old)]
    return written[0] if written[0] and written[0] == written[1] else None


def render(table: str, records: Path, out: Path) -> Path:
    """The paper-style table of ``records`` as markdown (published rows above measured; a cell short of
    its planned seeds says why where ``not-run.yaml`` beside ``records`` lists them), written to
    ``out``, and beside it ``claims.md``: each of the paper's claims the table tests, per task, with
    the paired seed difference and its verdict against seed noise."""
    from kdbench import tables
    from kdbench.reproduce.not_run import read_seeds_not_run

    plan = study_plan(table, seeds_not_run=read_seeds_not_run(table, records))
    text = tables.render(tables.build_table(PAPER_TABLES[table], records, plan=plan), "markdown")
    text += f"\n- {MINI_SCALE_NOTE}\n"
    if table == "tinybert-procedures":
        text += (f"- ours: DA with {MINI.augmentation_variants} variants per example (paper: 20), GD on the study's "
                 "GLUE corpus; w/o TD = GD, then prediction distillation alone\n")
    out.write_text(text)
    render_claims(table, records, out.parent / "claims.md")
    return out


def paper_metrics(table: str) -> dict[str, str]:
    """Task -> the dev metric the paper's table prints for it (its first column of that task), so
    a claim is tested on the paper's own metric: TinyBERT's and MobileBERT's ablation tables print
    MRPC's accuracy, not its F1. A cross-method table uses each task's main metric (empty mapping)."""
    from kdbench.tables.specs import TableSpec, load_spec

    spec = load_spec(PAPER_TABLES[table])
    metrics: dict[str, str] = {}
    if isinstance(spec, TableSpec):
        for column in spec.columns:
            for task, metric in column.run:
                metrics.setdefault(task, metric)
    return metrics


def _paper_evaluations(table: str, frame: Any, rows: Mapping[str, Any]) -> Any:
    """The table's rows' runs scored on the dev evaluation the paper's script reports (its spec's
    ``evaluation`` rules, e.g. TinyBERT's accuracy-best MRPC evaluation), as the rendered table is."""
    from kdbench.evaluations import reselect
    from kdbench.tables.specs import TableSpec, load_spec

    spec = load_spec(PAPER_TABLES[table])
    if frame is None or len(frame) == 0 or not isinstance(spec, TableSpec) or not spec.evaluation:
        return frame
    in_rows = frame.index[frame["label"].isin(list(rows))] if "label" in frame else []
    return reselect(frame, spec.evaluation_rules(), only=in_rows)


def table_claim_results(table: str, records: Path) -> tuple[list[Any], Any]:
    """The claims ``table`` tests, each on each of its tasks (:class:`kdbench.claims.ClaimResult`),
    from ``records`` scored on the evaluation the paper's script reports; and the records frame
    (None when there are no records)."""
    from kdbench.claims import claim_results
    from kdbench.records import load_records

    frame = load_records(records) if records.is_dir() else None
    tasks = [task.name for task in table_tasks(table)]
    rows = {row.label: row for row in TABLE_ROWS[table]()}
    frame = _paper_evaluations(table, frame, rows)
    results = claim_results(TABLE_CLAIMS.get(table, []), frame, tasks,
                            applies=lambda claim, task: rows[claim.better].runs_on(task) and rows[claim.worse].runs_on(task),
                            metrics=paper_metrics(table))
    return results, frame


def render_claims(table: str, records: Path, out: Path) -> Path:
    from kdbench.claims import VERDICT_LEGEND, format_claims

    results, frame = table_claim_results(table, records)
    text = (f"**Claims tested by table {table!r}** (regenerated by `kdbench reproduce {table} --render-only`; "
            f"each on the dev metric the paper's table prints for the task)\n\n"
            + format_claims(results)
            + "\n\n" + VERDICT_LEGEND + "\n")
    text += "\n" + compute_summary(frame) + "\n"
    out.write_text(text)
    return out


def compute_summary(frame: Any) -> str:
    """The training time behind a table: completed runs and their summed ``train_seconds``, and the
    kdbench commits that produced them."""
    if frame is None or len(frame) == 0:
        return "Compute: no run recorded yet."
    done = frame[frame["status"] == "completed"]
    hours = float(done["train_seconds"].fillna(0).sum()) / 3600 if "train_seconds" in done else 0.0
    commits = sorted({r["commit"][:7] for r in done.get("kdbench_revision", []) if isinstance(r, dict) and r.get("commit")})
    return (f"Compute: {len(done)} completed runs, {hours:.2f} hours of training (summed `train_seconds`; "
            f"the machine is named in the study's README); commits: {', '.join(commits) or 'unknown'}.")


def plot(records: Path, out_dir: Path) -> list[Path]:
    """Score-vs-cost plots (FLOPs and parameters; PNG) per task of the records."""
    from kdbench.plots import plot_tradeoffs, tradeoff_frame
    from kdbench.records import load_records

    frame = tradeoff_frame(load_records(records, include_failed=False))
    written = plot_tradeoffs(frame, out_dir, title_prefix="kdbench mini-scale study, ")
    for path in [p for p in written if p.suffix == ".svg"]:  # PNG only: SVGs bloat the repository
        path.unlink()
    return [p for p in written if p.suffix == ".png"]

