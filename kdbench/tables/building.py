"""Building a table: published cells beside measured ones (mean ± std over seeds), with footnotes
that account for every run that does not appear in a cell."""

from __future__ import annotations

import functools
import itertools
import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from kdbench.claims import weights_read
from kdbench.evaluations import describe_rules, reselect
from kdbench.tables.matching import assign_rows, canonical_method, normalise
from kdbench.tables.plan import MISSING, MarkLog, StudyPlan
from kdbench.tables.published import PublishedValue, check_rows_exist, published_cell, read_published
from kdbench.tables.specs import (MAIN_METRICS, ColumnSpec, CrossMethodSpec, PaperAverage, RowSpec, TableError, TableSpec,
                                  load_spec)

UNCERTAIN_MARK = "†"
MIXED_WEIGHTS_MARK = "‡"
REFERENCE = "ref"  # the row a difference column (``average.relative_to``) is measured from


@dataclass(frozen=True)
class Measured:
    mean: float
    std: float | None  # None with one seed
    n: int  # seeds
    runs: int = 0  # runs behind the cell (> n: the best of several runs per seed was kept)

    def format(self, decimals: int, signed: bool = False) -> str:
        text = f"{self.mean:{'+' if signed else ''}.{decimals}f}"
        if self.std is not None:
            text += f" ± {self.std:.{decimals}f}"
        return text


def best_per_seed(values: Sequence[tuple[Any, float]]) -> dict[Any, float]:
    """``(seed, value)`` pairs -> the best value per seed (None and NaN values dropped; a missing
    seed is ``"?"``)."""
    per_seed: dict[Any, float] = {}
    for seed, value in values:
        if value is None or (isinstance(value, float) and math.isnan(value)):
            continue
        key = seed if seed is not None and not (isinstance(seed, float) and math.isnan(seed)) else "?"
        per_seed[key] = max(per_seed.get(key, -math.inf), float(value))
    return per_seed


def _summary(numbers: Sequence[float], runs: int) -> Measured:
    """Mean and sample std (None for one number)."""
    mean = sum(numbers) / len(numbers)
    if len(numbers) == 1:
        return Measured(mean, None, 1, runs)
    std = math.sqrt(sum((x - mean) ** 2 for x in numbers) / (len(numbers) - 1))
    return Measured(mean, std, len(numbers), runs)


@dataclass(frozen=True)
class CellSeeds:
    """One measured cell before it is summarised: the best value per seed, and the runs behind it."""

    values: Mapping[Any, float]
    runs: int

    @classmethod
    def of(cls, values: Sequence[tuple[Any, float]]) -> CellSeeds:
        """From ``(seed, value)`` pairs (None and NaN values dropped)."""
        runs = sum(1 for _, value in values if value is not None and not (isinstance(value, float) and math.isnan(value)))
        return cls(best_per_seed(values), runs)

    def summary(self) -> Measured | None:
        return _summary(list(self.values.values()), self.runs) if self.values else None


def aggregate(values: Sequence[tuple[Any, float]]) -> Measured | None:
    """``(seed, value)`` pairs -> best value per seed, then mean and sample std over seeds."""
    return CellSeeds.of(values).summary()


def paired_difference(row: Mapping[str, Mapping[Any, float]], reference: Mapping[str, Mapping[Any, float]],
                      over: Sequence[str]) -> tuple[Measured | None, list[str]]:
    """How much a row's average over columns ``over`` differs from a reference row's, paired by
    seed: for each seed that both rows ran on every chosen column, the mean over those columns of
    (row - reference); then mean and sample std over those seeds. ``row`` and ``reference`` map a
    column header to ``{seed: value}``.

    The chosen columns are those of ``over`` both rows ran whose common seeds pair up the most
    measurements (columns x seeds; ties go to more columns), so a column still running on one seed
    does not shrink a difference measured on five seeds to that one. Returns the difference (None
    when no seed pairs up) and the columns it averages (all shared columns when none pair up)."""
    shared = [header for header in over if row.get(header) and reference.get(header)]
    if not shared:
        return None, []
    from kdbench.claims import PairedDifference

    columns, seeds = _most_paired_columns({h: (set(row[h]) & set(reference[h])) - {"?"} for h in shared})
    if not seeds:
        return None, shared

    def average(cells: Mapping[str, Mapping[Any, float]]) -> dict[Any, float]:
        return {seed: sum(cells[h][seed] for h in columns) / len(columns) for seed in seeds}

    difference = PairedDifference.of(average(row), average(reference))
    return Measured(difference.mean, difference.std, difference.n, difference.n), columns


def _most_paired_columns(paired_seeds: Mapping[str, set[Any]]) -> tuple[list[str], set[Any]]:
    """The columns, and the seeds common to all of them, that pair up the most measurements
    (columns x common seeds; ties go to more columns). Tables have at most a dozen columns, so every
    subset is tried."""
    best: tuple[int, int] = (0, 0)
    chosen: tuple[list[str], set[Any]] = ([], set())
    headers = list(paired_seeds)
    for size in range(1, len(headers) + 1):
        for columns in itertools.combinations(headers, size):
            common = set.intersection(*(paired_seeds[h] for h in columns))
            if (len(common) * size, size) > best:
                best, chosen = (len(common) * size, size), (list(columns), common)
    return chosen


def _run_metric(run: Mapping[str, Any], alternatives: Sequence[tuple[str, str]]) -> float | None:
    task = normalise(run.get("task"))
    for want_task, metric in alternatives:
        if task == want_task:
            value = run.get(f"metric.{metric}")
            if value is not None and not (isinstance(value, float) and math.isnan(value)):
                return float(value)
    return None


class Measurer:
    """Model statistics of runs (``kdbench.measure.measure``), cached per (student, teacher)."""

    def __init__(self, seq_len: int = 128, latency: bool = False, repeats: int = 3, throughput_batch: int = 32):
        self.seq_len, self.latency, self.repeats, self.throughput_batch = seq_len, latency, repeats, throughput_batch
        self._cache: dict[tuple[str, str], dict[str, float]] = {}

    @staticmethod
    def _config_source(path_value: Any) -> Path | None:
        if not isinstance(path_value, str) or not path_value:
            return None
        path = Path(path_value)
        for candidate in (path / "config.json", path / "model" / "config.json", path):
            if candidate.is_file() and candidate.suffix == ".json":
                return candidate
        return None

    @classmethod
    def _exported_teacher(cls, run: Mapping[str, Any]) -> Path | None:
        """The teacher's architecture from an exported record beside this one (``kdbench reproduce``
        exports every run of a table, teachers included), for records whose teacher folder is gone."""
        from kdbench.fingerprint import kdbench_run_of

        teacher, record = run.get("teacher"), run.get("run_dir")
        if not isinstance(teacher, str) or not teacher or not isinstance(record, str) or not record:
            return None
        teacher_run = kdbench_run_of(Path(teacher))
        return cls._config_source(str(Path(record).parent / teacher_run)) if teacher_run else None

    def of_run(self, run: Mapping[str, Any]) -> dict[str, float]:
        from kdbench import measure

        student = self._config_source(run.get("run_dir")) or self._config_source(run.get("model_dir"))
        if student is None:
            return {}
        teacher = self._config_source(run.get("teacher")) or self._exported_teacher(run)
        key = (str(student.resolve()), str(teacher.resolve()) if teacher else "")
        if key not in self._cache:
            s_cfg = measure.as_config(student)
            t_cfg = measure.as_config(teacher) if teacher else None
            # identical architectures give identical numbers: cache by config text too
            arch = (s_cfg.to_json_string(use_diff=False), t_cfg.to_json_string(use_diff=False) if t_cfg else "")
            if arch not in self._cache:
                self._cache[arch] = measure.measure(s_cfg, teacher=t_cfg, seq_len=self.seq_len, time_it=self.latency,
                                                    repeats=self.repeats, warmup=1,
                                                    throughput_batch=self.throughput_batch)
            self._cache[key] = self._cache[arch]
        return self._cache[key]


@dataclass
class Table:
    """A rendered-ready table: ``header`` and ``rows`` of display strings, plus footnotes and the
    numbers behind the measured cells (``measured[(row label, column header)] = Measured``)."""

    name: str
    title: str
    header: list[str]
    rows: list[list[str]]
    notes: list[str] = field(default_factory=list)
    measured: dict[tuple[Any, str], Measured] = field(default_factory=dict)
    label_columns: int = 2  # leading text columns (left-aligned); the rest are numbers


def _published_text(value: PublishedValue | None) -> str:
    if value is None:
        return MISSING
    return value.printed + (UNCERTAIN_MARK if value.uncertain else "")


def _load_runs(runs: Any):
    import pandas as pd

    if runs is None:
        return pd.DataFrame()
    if isinstance(runs, pd.DataFrame):
        return runs.reset_index(drop=True)
    from kdbench.records import load_records

    folders = [runs] if isinstance(runs, (str, Path)) else list(runs)
    frames = [load_records(folder) for folder in folders]
    frames = [f for f in frames if not f.empty]
    return pd.concat(frames, ignore_index=True) if frames else pd.DataFrame()


def _describe_run(run: Mapping[str, Any]) -> str:
    label = run.get("label")
    label = f" label={label}" if isinstance(label, str) and label else ""
    return f"{run.get('method')}/{run.get('task')}/{model_name(run)}{label}"


def build_table(name: str | TableSpec | CrossMethodSpec, runs: Any = None, *, latency: bool = False,
                measurer: Measurer | None = None, plan: StudyPlan | None = None) -> Table:
    """Build table ``name`` from the published numbers and ``runs`` (a runs folder, a list of
    folders, a records DataFrame or None for the published numbers alone). With the ``plan`` of the
    study the runs belong to, every empty measured cell says why it is empty
    (:mod:`kdbench.tables.plan`), and a cross-method table shows the planned rows and tasks no run
    has reached yet."""
    spec = load_spec(name) if isinstance(name, str) else name
    frame = _load_runs(runs)
    measurer = measurer or Measurer(seq_len=spec.seq_len, latency=latency)
    if isinstance(spec, CrossMethodSpec):
        return _build_cross_method(spec, frame, measurer, plan)
    return _build_paper_table(spec, frame, measurer, plan)


def _column_task(column: ColumnSpec) -> str | None:
    """The kdbench task of a column's measured cells (its first alternative), None for a measure."""
    return normalise(column.run[0][0]) if column.run else None


def _build_paper_table(spec: TableSpec, runs, measurer: Measurer, plan: StudyPlan | None) -> Table:
    check_rows_exist(spec)
    by_row, unmatched = assign_rows(spec, runs)
    rules = spec.evaluation_rules()
    if rules:
        runs = reselect(runs, rules, only=sorted({i for indices in by_row.values() for i in indices}))
    gathered = {row.key: _row_per_seed(spec, [runs.loc[i] for i in by_row.get(row.key, [])], measurer)
                for row in spec.rows}
    per_seed = {key: seeds for key, (seeds, _) in gathered.items()}
    behind = {key: scored for key, (_, scored) in gathered.items()}
    headers = [c.header for c in spec.columns] + ([spec.average.header] if spec.average else [])
    table = Table(spec.name, spec.title, ["Model", "Source", *headers], [])
    partial: dict[str, list[str]] = {}  # row -> the columns its measured difference averages, when not all
    marks = MarkLog(plan) if plan else None
    mixed = MixedWeightsLog()
    for row in spec.rows:
        if row.model is not None:
            cells = [_published_text(published_cell(spec, row, c.task, c.metric)) for c in spec.columns]
            if spec.average:
                cells.append(_published_text(published_cell(spec, row, spec.average.task, spec.average.metric)))
            table.rows.append([row.display, "paper", *cells])
        cells = []
        for col in spec.columns:
            measured = per_seed[row.key][col.header].summary()
            task = _column_task(col)
            if measured is not None:
                table.measured[(row.display, col.header)] = measured
                cells.append(measured.format(col.decimals) + (marks.measured(row.key, task, measured.n)
                                                             if marks and task else "")
                             + mixed.mark(f"{row.display} / {col.header}", behind[row.key][col.header]))
            else:
                cells.append(marks.empty(row.key, task) if marks and task else MISSING)
        if spec.average and spec.average.relative_to == row.key:
            cells.append(REFERENCE)
        elif spec.average:
            average, over = _measured_average(spec, row, per_seed)
            if average is not None:
                table.measured[(row.display, spec.average.header)] = average
                if len(over) < len(spec.average.over):
                    partial[row.display] = over
            cells.append(average.format(1, signed=spec.average.relative_to is not None) if average else MISSING)
        table.rows.append([row.display, "ours", *cells])
    table.notes.extend(_notes(spec, runs, unmatched, planned=plan is not None))
    table.notes.extend(mixed.notes())
    if marks:
        table.notes.extend(marks.notes())
        table.notes.extend(_average_out_of_plan(spec, marks.plan))
    evaluation_note = describe_rules(rules)
    if evaluation_note:
        table.notes.append(evaluation_note)
    if spec.average and spec.average.relative_to:
        table.notes.append(_difference_note(spec, partial))
    _note_selection(table)
    return table


def _row_per_seed(spec: TableSpec, row_runs: Sequence[Mapping[str, Any]],
                  measurer: Measurer) -> tuple[dict[str, CellSeeds], dict[str, list[Mapping[str, Any]]]]:
    """Column header -> the row's best value per seed in that column, and -> the runs with a value there."""
    seeds, scored = {}, {}
    for col in spec.columns:
        pairs: list[tuple[Any, float]] = []
        scored[col.header] = []
        for run in row_runs:
            if col.measure:
                value = measurer.of_run(run).get(col.measure)
            else:
                value = _run_metric(run, col.run) if col.run else None
            if value is not None:
                pairs.append((run.get("seed"), value))
                scored[col.header].append(run)
        seeds[col.header] = CellSeeds.of(pairs)
    return seeds, scored


def _measured_average(spec: TableSpec, row: RowSpec,
                      per_seed: Mapping[str, Mapping[str, CellSeeds]]) -> tuple[Measured | None, list[str]]:
    """The row's measured average cell and the columns it covers.

    A plain average exists only when every ``over`` column was measured (recompute: false -- the
    paper's number, e.g. a leaderboard score, is not a mean of the row -- never has one). A
    difference (``relative_to``) is :func:`paired_difference` from the reference row over the
    columns both rows measured."""
    average = spec.average
    mine = {header: cell.values for header, cell in per_seed[row.key].items()}
    if average.relative_to is not None:
        reference = {header: cell.values for header, cell in per_seed[average.relative_to].items()}
        return paired_difference(mine, reference, average.over)
    means = [per_seed[row.key][h].summary() for h in average.over]
    if not average.recompute or not means or not all(means):
        return None, []
    return Measured(sum(m.mean for m in means) / len(means), None, min(m.n for m in means)), list(average.over)


def _average_out_of_plan(spec: TableSpec, plan: StudyPlan) -> list[str]:
    """A footnote when the study can never fill the measured average: it runs none of some columns
    the paper averages over."""
    average = spec.average
    if average is None or average.relative_to is not None or not average.recompute:
        return []
    outside = [c.header for c in spec.columns if c.header in average.over and _column_task(c) not in plan.seeds]
    if not outside:
        return []
    return [f"ours: {average.header} stays {MISSING}: the paper averages {', '.join(outside)} too, which the study does "
            "not run"]


def _difference_note(spec: TableSpec, partial: Mapping[str, list[str]]) -> str:
    average = spec.average
    reference = next(r.display for r in spec.rows if r.key == average.relative_to)
    note = (f"{average.header}: difference from {reference} ({REFERENCE}). paper: as printed; ours: for each seed, the "
            f"mean over the columns both rows ran of (row − {reference}), then mean ± std over seeds (where a column "
            "has fewer seeds than the others, the columns and seeds that pair up the most runs)")
    if partial:
        note += ("; where ours covers fewer columns than the paper's average, it covers only: "
                 + "; ".join(f"{row}: {', '.join(columns)}" for row, columns in partial.items()))
    return note


class MixedWeightsLog:
    """The cells whose seeds read more than one version of a model they share: a teacher or an initial
    student (a corpus stage) trained again on another processor or library writes other weights, and
    a cell mixing them averages runs of two different setups. Such a cell gets ``MIXED_WEIGHTS_MARK``
    and a footnote naming the cell and the digests; its mean is still shown."""

    def __init__(self) -> None:
        self._cells: list[str] = []

    def mark(self, cell: str, runs: Iterable[Mapping[str, Any]]) -> str:
        """`` ‡`` (noted) when ``runs``, the runs behind ``cell``, read several weights in one role; else ""."""
        mixed = {role: digests for role, digests in weights_read(runs).items() if len(digests) > 1}
        if not mixed:
            return ""
        read = "; ".join(f"{len(digests)} {role} weights ({', '.join(d[:12] + '…' for d in sorted(digests))})"
                         for role, digests in sorted(mixed.items()))
        self._cells.append(f"{cell}: {read}")
        return f" {MIXED_WEIGHTS_MARK}"

    def notes(self) -> list[str]:
        if not self._cells:
            return []
        return [f"{MIXED_WEIGHTS_MARK} = the cell's seeds read different weights of a model they share (a teacher or "
                "initial student trained again on another processor or library; records' weights_sha256): its mean "
                "mixes two setups: " + "; ".join(self._cells)]


def _note_selection(table: Table) -> None:
    selected = sorted(f"{' / '.join(row) if isinstance(row, tuple) else row}: {col}"
                      for (row, col), m in table.measured.items() if m.runs > m.n)
    if selected:
        table.notes.append(f"{len(selected)} cell(s) keep the best dev score of several runs with the same seed "
                           f"(hyper-parameter selection on dev, as the papers do): {', '.join(selected[:6])}"
                           + (" ..." if len(selected) > 6 else ""))


def _notes(spec: TableSpec, runs, unmatched: list[int], planned: bool = False) -> list[str]:
    notes = []
    if spec.note:
        notes.append(spec.note)
    empty = "not reported (paper)" if planned else "not reported / not run"
    notes.append(f"paper: {spec.published} (results/published); ours: dev metrics of kdbench runs, "
                 f"mean ± std over seeds; {MISSING} = {empty}; {UNCERTAIN_MARK} = uncertain "
                 "transcription (see the CSV's note)")
    if any(c.measure for c in spec.columns):
        notes.append(f"ours' size/speed: kdbench.measure on the run's model config at sequence length "
                     f"{spec.seq_len} (params incl. the W_h projection when the teacher is wider; "
                     "speed-up measured on this machine vs the run's teacher, only with --latency)")
    if len(runs):
        notes += unfinished_notes(runs)
        # A sweep stage (a task's teacher, TinyBERT's general distillation) is an input of the
        # table's cells, not a row of its own: say so, instead of listing it as a stray run.
        stages = {i: role for i in unmatched if (role := _own_role(runs.loc[i]))}
        strays = [i for i in unmatched if i not in stages]
        if stages:
            notes.append(f"{len(stages)} stage run(s) that this table's cells read, not rows of it: "
                         + _listing(f"{role}: {_describe_run(runs.loc[i])}" for i, role in stages.items()))
        if strays:
            notes.append(f"{len(strays)} completed run(s) match no row of this table: "
                         + _listing(_describe_run(runs.loc[i]) for i in strays))
    return notes


def _listing(names: Iterable[str], shown: int = 8) -> str:
    """The distinct ``names`` for a footnote, sorted, the first ``shown`` of them."""
    distinct = sorted(set(names))
    return ", ".join(distinct[:shown]) + (" ..." if len(distinct) > shown else "")


def model_name(run: Mapping[str, Any], field: str = "student") -> str:
    """How a table names a run's model: a preset or Hub name's last part, a model folder by its run
    (``RUN/model``) or its own name, the same from any checkout."""
    student = run.get(field)
    if not isinstance(student, str) or not student:
        return MISSING
    path = Path(student)
    if path.name == "model" and path.parent.name:
        return path.parent.name
    return path.name if "/" in student else student


STAGE_ROLES_FILE = "stage_roles.json"  # beside exported records: {stage run folder: sweep stage}


def _model_role(run: Mapping[str, Any], field: str) -> str | None:
    """The sweep stage that made the run's ``field`` model (its teacher, or a student that starts
    from a stage such as TinyBERT's general distillation): one fine-tuned teacher per task, one
    role. Exported records name it in ``stage_roles.json`` beside them (read first, so a table of
    records renders the same on every machine); runs in a sweep folder, in the sweep's manifest.
    None for a model no stage made."""
    model = run.get(field)
    if not isinstance(model, str) or not model:
        return None
    return _stage_of(model, run.get("run_dir"))


def _stage_of(model: str, record: Any) -> str | None:
    """The sweep stage whose run folder holds ``model``, for a run recorded in folder ``record``."""
    from kdbench.fingerprint import kdbench_run_of
    from kdbench.sweep import stage_role

    if isinstance(record, str) and record:
        file = Path(record).parent / STAGE_ROLES_FILE
        roles = _exported_roles(str(file), file.stat().st_mtime_ns) if file.is_file() else {}
        model_run = kdbench_run_of(Path(model))
        if model_run in roles:
            return roles[model_run]
    return stage_role(model)


def _own_role(run: Mapping[str, Any]) -> str | None:
    """The sweep stage the run itself is (``teacher``), or None for a cell or a run of no sweep."""
    from kdbench.fingerprint import RUN_MODEL_FOLDER

    run_dir = run.get("run_dir")
    if not isinstance(run_dir, str) or not run_dir:
        return None
    return _stage_of(str(Path(run_dir) / RUN_MODEL_FOLDER), run_dir)


def _teacher_role(run: Mapping[str, Any]) -> str:
    return _model_role(run, "teacher") or model_name(run, "teacher")


@functools.lru_cache(maxsize=64)
def _exported_roles(path: str, mtime_ns: int) -> dict[str, str]:
    """The roles file, read once per version (an export in the same process rewrites it)."""
    import json

    return json.loads(Path(path).read_text())


def _build_cross_method(spec: CrossMethodSpec, runs, measurer: Measurer, plan: StudyPlan | None) -> Table:
    import pandas as pd

    completed = runs[runs["status"] == "completed"] if len(runs) and "status" in runs else pd.DataFrame()
    without_column = pd.DataFrame()
    if len(completed):  # e.g. a general-distillation stage on a corpus: a model for other rows, no dev score
        has_column = completed["task"].map(lambda task: normalise(task) in spec.tasks)
        completed, without_column = completed[has_column], completed[~has_column]
    present = set(completed["task"].map(normalise)) if len(completed) else set()
    if plan:
        present |= set(plan.seeds)
    tasks = [t for t in spec.tasks if t in present or (t == "mnli-mm" and "mnli" in present)]
    headers = [MAIN_METRICS[t][0] for t in tasks]
    avg_over = [MAIN_METRICS[t][0] for t in spec.glue_average_over if t in tasks]
    header = ["Method", "Student", "Teacher", *headers, "Avg (ours)", "Paper avg", "Params (M)", "FLOPs (G)",
              "Speed-up"]
    table = Table(spec.name, spec.title, header, [], label_columns=3)
    marks = MarkLog(plan) if plan else None
    mixed = MixedWeightsLog()
    groups: dict[tuple[str, str, str, str], list[int]] = {}
    plan_keys: dict[tuple[str, str, str, str], str] = {}  # group -> its row's key in the plan
    for index, run in completed.iterrows():
        label = run.get("label") if isinstance(run.get("label"), str) else ""
        student = _model_role(run, "student") or model_name(run)
        key = (canonical_method(run.get("method")), student, label or "", _teacher_role(run))
        groups.setdefault(key, []).append(index)
        plan_keys.setdefault(key, label or _own_role(run) or "")
    if plan:  # the planned rows no run has reached yet
        reached = {normalise(key) for key in plan_keys.values()}
        for row in plan.rows:
            if normalise(row.key) not in reached:
                key = (canonical_method(row.method), row.student or MISSING, row.key, row.teacher or MISSING)
                groups[key], plan_keys[key] = [], row.key
    for (method, student, label, teacher), indices in sorted(groups.items()):
        plan_key = plan_keys[(method, student, label, teacher)]
        display = f"{method} [{label}]" if label else method
        cells: list[str] = []
        means: dict[str, Measured] = {}
        for task in tasks:
            metric = MAIN_METRICS[task][1]
            alternatives = [("mnli", "acc_mm"), ("mnli-mm", "acc_mm")] if task == "mnli-mm" else [(task, metric)]
            values = {i: _run_metric(runs.loc[i], alternatives) for i in indices}
            scored = [i for i, value in values.items() if value is not None]
            m = aggregate([(runs.loc[i].get("seed"), values[i]) for i in scored])
            if m is not None:
                means[MAIN_METRICS[task][0]] = m
                table.measured[((display, student, teacher), MAIN_METRICS[task][0])] = m
                cells.append(m.format(1) + (marks.measured(plan_key, task, m.n) if marks else "")
                             + mixed.mark(f"{display} / {MAIN_METRICS[task][0]}", (runs.loc[i] for i in scored)))
            else:
                cells.append(marks.empty(plan_key, task) if marks else MISSING)
        if avg_over and all(h in means for h in avg_over):
            avg = sum(means[h].mean for h in avg_over) / len(avg_over)
            table.measured[((display, student, teacher), "Avg (ours)")] = Measured(avg, None, 1)
            cells.append(f"{avg:.1f}")
        else:
            cells.append(MISSING)
        cells.append(_paper_average_text(spec.paper_averages.get(method)))
        stats = [measurer.of_run(runs.loc[i]) for i in indices]
        stats = next((s for s in stats if s), {})
        for key, fmt in (("params_millions", "{:.1f}"), ("flops_billions", "{:.2f}"), ("speedup_x", "{:.1f}x"),
                         ("latency_ms", None)):
            value = stats.get(key)
            if fmt is not None:
                cells.append(fmt.format(value) if value is not None else MISSING)
            if value is not None:
                table.measured[((display, student, teacher), key)] = Measured(float(value), None, 1)
        table.rows.append([display, student, teacher, *cells])
    if spec.note:
        table.notes.append(spec.note)
    table.notes.append(
        f"ours: dev metrics (MRPC/QQP F1, STS-B Spearman, CoLA MCC, SQuAD F1, others accuracy), mean ± std over "
        f"seeds; Avg (ours) = mean over {', '.join(avg_over) or 'no GLUE task'} (MNLI-m and -mm both counted), "
        f"only when all were run" + ("" if plan else f"; {MISSING} = not run"))
    table.notes.append(f"Params/FLOPs: kdbench.measure at sequence length {spec.seq_len}; Speed-up: measured "
                       "throughput ratio vs the run's teacher at batch 32 on this machine (only with --latency)")
    table.notes += mixed.notes()
    if marks:
        table.notes += marks.notes()
    if len(runs):
        table.notes += unfinished_notes(runs)
    if len(without_column):
        table.notes.append(f"{len(without_column)} completed run(s) on a task with no column here, so in no row: "
                           + _listing(_describe_run(run) for _, run in without_column.iterrows()))
    _note_selection(table)
    return table


def _paper_average_text(ref: PaperAverage | None) -> str:
    if ref is None:
        return MISSING
    frame = read_published(ref.published)
    hit = frame[(frame["model"] == ref.model) & (frame["task"] == ref.task) & (frame["metric"] == ref.metric)]
    if len(hit) != 1:
        raise TableError(f"paper average {ref.label!r}: {len(hit)} rows in {ref.published} for "
                         f"{ref.model}/{ref.task}/{ref.metric} (need exactly 1)")
    return f"{hit.iloc[0]['printed']} ({ref.label})"


def unfinished_notes(runs: Any) -> list[str]:
    """Footnotes for runs not shown: failures of the method, and runs the user interrupted (which
    resume when run again, so they are not counted as failures)."""
    if "status" not in runs:
        return []
    status = runs["status"]
    notes = []
    failed = int(((status != "completed") & (status != "interrupted")).sum())
    interrupted = int((status == "interrupted").sum())
    if failed:
        notes.append(f"{failed} failed run(s) not shown")
    if interrupted:
        notes.append(f"{interrupted} interrupted run(s) not shown (resumable)")
    return notes
