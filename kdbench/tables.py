"""Paper-style tables: the published numbers beside the numbers measured from result records.

A table is a **spec** (``results/tables/<name>.yaml``, data, not code) rendered against the
published numbers (``results/published/*.csv``) and a folder of result records
(``kdbench.records.load_records``). ``kdbench table NAME --runs DIR`` prints it as Markdown,
LaTeX, CSV or HTML; ``kdbench list tables`` names the specs.

Spec fields
-----------
``name``, ``title``, ``description``; ``published`` (a CSV file name under ``results/published``);
``table`` (optional: keep only CSV rows of this ``table`` value); ``note`` (footnote, e.g. that the
paper reports GLUE test while runs report dev); ``columns``: a list of

* ``header`` -- column title;
* ``task``/``metric`` -- the published cell: the CSV row with ``model`` = the row's ``model`` (and
  ``setting`` = the row's ``setting`` when given), this ``task`` and this ``metric``;
* ``run`` -- the measured cell: ``"<kdbench task>/<metric name>"`` (or a list of alternatives,
  the first one a record has wins), read from the ``metric.<name>`` column of records of that task;
* ``measure`` -- instead of ``run``: a model statistic computed from the run's model config by
  :mod:`kdbench.measure` (``params_millions``, ``flops_billions``, ``speedup_x``, ...);

``average``: ``header``, ``task``/``metric`` of the printed average and ``over`` (the headers of
the columns it averages: the paper's own convention, see below); ``known_mismatches``: models whose
printed average does *not* recompute from their printed cells, each with the reason (a test checks
that exactly these rows disagree); ``rows``: a list of ``key``, ``model`` (the row label as printed,
``null`` for rows the paper does not have), optional ``setting``, ``select`` and ``labels``.

How a run becomes a row (explicit, in this order)
-------------------------------------------------
1. **Label.** A run whose ``label`` equals a row's ``key``, one of its ``labels``, its printed
   ``model`` or ``<table name>/<key>`` (case-insensitive) belongs to that row. Sweep specs should set
   ``label`` this way; it always wins.
2. **Selector.** Otherwise a row's ``select`` must match every key it names: ``method`` (the
   record's method, canonical registry name), ``student`` (the record's student preset or path),
   ``role: teacher`` (the run's model is the ``teacher`` of another run loaded alongside it),
   ``upstream`` (a nested selector the run that *produced this run's student* must match, e.g. a
   ``finetune`` of a MobileBERT knowledge-transfer student; runs are recognised by path or, after
   a move, by their run-folder name),
   ``method_params`` (each listed key equals ``config['method_params'][key]``), and any other key
   is compared with the run's config (dotted: ``train.max_seq_length``). ``select`` may be a list
   of such selectors (alternatives; the row takes a run matching any). Among the rows that match,
   the one with the **most** selector keys wins (so an ablation row ``{method: tinybert,
   method_params: {use_attn: false}}`` beats the full ``{method: tinybert}`` row); a tie between two
   rows is an error naming the run and the rows.
3. Runs matching no row are not dropped silently: the table's footnote counts them and names them.
   Failed runs never enter a cell; they are counted in a footnote too.

Cells
-----
Published cells are printed as in the paper (``†`` marks an ``uncertain`` transcription). Measured
cells: all completed runs of the row and column task; several runs with the **same seed** are a
hyper-parameter sweep, of which the best dev score is kept (the papers pick on dev); then the mean
over seeds, shown as ``mean ± std`` (sample std) when more than one seed ran. A missing cell is
``–``, never 0. A measured average uses the same ``over`` columns as the paper and exists only
when every one of them was measured.

Average conventions (``shared/paper_tables/hyperparameters.md``, checked by the tests):
TinyBERT v5 Table 1 -- mean of the 9 printed test columns (MNLI-m and -mm both, QQP F1, STS-B
Spearman, MRPC F1). TinyBERT ablations -- mean of MNLI-m, MNLI-mm, MRPC (acc) and CoLA.
DistilBERT Table 1 -- "macro-score" over the 9 printed dev columns *including WNLI* with MNLI
matched only (QQP acc, MRPC F1, STS-B Spearman). MobileBERT Table 4 -- the leaderboard GLUE score,
which is not a mean of the row (no recomputation). BERT-PKD tables print no average.
"""

from __future__ import annotations

import dataclasses
import html
import math
import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from functools import lru_cache
from pathlib import Path
from typing import Any

import yaml

from kdbench.config import ConfigError

__all__ = [
    "TableError", "ColumnSpec", "AverageSpec", "RowSpec", "TableSpec", "CrossMethodSpec", "Table",
    "published_dir", "tables_dir", "table_names", "load_spec", "load_published", "published_cell",
    "recompute_averages", "build_table", "render", "FORMATS", "MISSING", "add_command",
]

MISSING = "–"  # an en dash: never 0
UNCERTAIN_MARK = "†"
FORMATS = ("markdown", "latex", "csv", "html")
PUBLISHED_COLUMNS = ("paper", "table", "model", "setting", "task", "metric", "split", "value",
                     "uncertain", "source", "note")
# kdbench task name -> (display name, metric the cross-method table shows). Order = column order.
MAIN_METRICS: dict[str, tuple[str, str]] = {
    "mnli": ("MNLI-m", "acc"), "mnli-mm": ("MNLI-mm", "acc_mm"), "qqp": ("QQP", "f1"),
    "qnli": ("QNLI", "acc"), "sst2": ("SST-2", "acc"), "cola": ("CoLA", "mcc"),
    "stsb": ("STS-B", "spearman"), "mrpc": ("MRPC", "f1"), "rte": ("RTE", "acc"),
    "wnli": ("WNLI", "acc"), "squad": ("SQuAD1.1 F1", "f1"), "squad-v2": ("SQuAD2.0 F1", "f1"),
}


class TableError(ConfigError):
    """A table spec, a published file or a run-to-row assignment is wrong; the message says which."""


# ---------------------------------------------------------------------------------------------
# Specs


@dataclass(frozen=True)
class ColumnSpec:
    header: str
    task: str | None = None  # published CSV task
    metric: str | None = None  # published CSV metric
    run: tuple[tuple[str, str], ...] = ()  # (kdbench task, metric name) alternatives
    measure: str | None = None  # a kdbench.measure key instead of a task metric
    decimals: int = 1


@dataclass(frozen=True)
class AverageSpec:
    header: str
    task: str
    metric: str
    over: tuple[str, ...]
    recompute: bool = True  # False: the printed number is not a mean of the row (leaderboard score)
    known_mismatches: Mapping[str, str] = field(default_factory=dict)  # model -> reason


@dataclass(frozen=True)
class RowSpec:
    key: str
    model: str | None
    setting: str | None = None
    select: tuple[Mapping[str, Any], ...] = ()  # alternatives: the row takes a run that matches any
    labels: tuple[str, ...] = ()

    @property
    def display(self) -> str:
        return self.model or self.key


@dataclass(frozen=True)
class TableSpec:
    name: str
    title: str
    description: str
    published: str
    columns: tuple[ColumnSpec, ...]
    rows: tuple[RowSpec, ...]
    table: str | None = None
    average: AverageSpec | None = None
    note: str | None = None
    seq_len: int = 128


@dataclass(frozen=True)
class PaperAverage:
    label: str
    published: str
    model: str
    task: str
    metric: str


@dataclass(frozen=True)
class CrossMethodSpec:
    name: str
    title: str
    description: str
    tasks: tuple[str, ...]
    glue_average_over: tuple[str, ...]
    paper_averages: Mapping[str, PaperAverage]
    note: str | None = None
    seq_len: int = 128


def _resources_root() -> Path:
    import kdbench.results

    return Path(kdbench.results.__file__).resolve().parent


def published_dir() -> Path:
    return _resources_root() / "published"


def tables_dir() -> Path:
    return _resources_root() / "tables"


def table_names() -> list[str]:
    return sorted(p.stem for p in tables_dir().glob("*.yaml"))


def _as_tuple(value: Any) -> tuple:
    if value is None:
        return ()
    if isinstance(value, (list, tuple)):
        return tuple(value)
    return (value,)


def _parse_run_ref(ref: str, where: str) -> tuple[str, str]:
    if not isinstance(ref, str) or ref.count("/") != 1:
        raise TableError(f"{where}: run {ref!r} must look like 'task/metric' (e.g. 'mnli/acc_mm')")
    task, metric = ref.split("/")
    return task.strip().lower(), metric.strip()


def _require_keys(data: Mapping[str, Any], allowed: set[str], where: str) -> None:
    unknown = sorted(set(data) - allowed)
    if unknown:
        raise TableError(f"{where}: unknown key(s) {', '.join(map(repr, unknown))} (allowed: {', '.join(sorted(allowed))})")


def _spec_from_mapping(data: Mapping[str, Any], source: str) -> TableSpec | CrossMethodSpec:
    if not isinstance(data, Mapping) or "name" not in data:
        raise TableError(f"{source}: a table spec is a mapping with at least 'name'")
    if data.get("kind") == "cross-method":
        _require_keys(data, {"name", "kind", "title", "description", "tasks", "glue_average_over",
                             "paper_averages", "note", "seq_len"}, source)
        averages = {}
        for method, value in (data.get("paper_averages") or {}).items():
            _require_keys(value, {"label", "published", "model", "task", "metric"}, f"{source}: paper_averages.{method}")
            averages[str(method)] = PaperAverage(**value)
        unknown_tasks = [t for t in data.get("tasks", ()) if t not in MAIN_METRICS]
        if unknown_tasks:
            raise TableError(f"{source}: tasks {unknown_tasks} unknown (known: {', '.join(MAIN_METRICS)})")
        return CrossMethodSpec(name=data["name"], title=data.get("title", data["name"]),
                               description=data.get("description", ""), tasks=tuple(data.get("tasks", ())),
                               glue_average_over=tuple(data.get("glue_average_over", ())),
                               paper_averages=averages, note=data.get("note"), seq_len=int(data.get("seq_len", 128)))
    _require_keys(data, {"name", "title", "description", "published", "table", "columns", "rows", "average",
                         "note", "seq_len"}, source)
    columns = []
    for i, col in enumerate(data.get("columns") or ()):
        where = f"{source}: columns[{i}]"
        _require_keys(col, {"header", "task", "metric", "run", "measure", "decimals"}, where)
        if "header" not in col:
            raise TableError(f"{where}: needs a header")
        if col.get("run") and col.get("measure"):
            raise TableError(f"{where} ({col['header']!r}): give either run or measure, not both")
        columns.append(ColumnSpec(header=str(col["header"]), task=col.get("task"), metric=col.get("metric"),
                                  run=tuple(_parse_run_ref(r, where) for r in _as_tuple(col.get("run"))),
                                  measure=col.get("measure"), decimals=int(col.get("decimals", 1))))
    headers = [c.header for c in columns]
    if len(set(headers)) != len(headers):
        raise TableError(f"{source}: duplicate column headers {headers}")
    average = None
    if data.get("average"):
        avg = data["average"]
        _require_keys(avg, {"header", "task", "metric", "over", "recompute", "known_mismatches"}, f"{source}: average")
        over = tuple(avg.get("over") or ())
        bad = [h for h in over if h not in headers]
        if bad:
            raise TableError(f"{source}: average.over names {bad}, which are not column headers {headers}")
        average = AverageSpec(header=str(avg.get("header", "Avg")), task=avg["task"], metric=avg["metric"],
                              over=over, recompute=bool(avg.get("recompute", True)),
                              known_mismatches=dict(avg.get("known_mismatches") or {}))
    rows = []
    for i, row in enumerate(data.get("rows") or ()):
        where = f"{source}: rows[{i}]"
        _require_keys(row, {"key", "model", "setting", "select", "labels"}, where)
        if "key" not in row:
            raise TableError(f"{where}: needs a key")
        select = row.get("select") or []
        alternatives = tuple(dict(a) for a in (select if isinstance(select, list) else [select]))
        if not all(alternatives):
            raise TableError(f"{where}: an empty select would match every run")
        rows.append(RowSpec(key=str(row["key"]), model=row.get("model"), setting=row.get("setting"),
                            select=alternatives, labels=tuple(_as_tuple(row.get("labels")))))
    keys = [r.key for r in rows]
    if len(set(keys)) != len(keys):
        raise TableError(f"{source}: duplicate row keys {keys}")
    if "published" not in data:
        raise TableError(f"{source}: needs 'published' (a CSV file under results/published)")
    return TableSpec(name=data["name"], title=data.get("title", data["name"]),
                     description=data.get("description", ""), published=data["published"],
                     columns=tuple(columns), rows=tuple(rows), table=data.get("table"), average=average,
                     note=data.get("note"), seq_len=int(data.get("seq_len", 128)))


@lru_cache(maxsize=None)
def load_spec(name_or_path: str) -> TableSpec | CrossMethodSpec:
    """A spec by table name (``results/tables/<name>.yaml``) or by YAML file path."""
    path = Path(name_or_path)
    if not (path.suffix in (".yaml", ".yml") and path.is_file()):
        path = tables_dir() / f"{name_or_path.strip().lower().replace('_', '-')}.yaml"
    if not path.is_file():
        from kdbench.registry import UnknownNameError

        raise UnknownNameError("table", str(name_or_path), table_names())
    try:
        data = yaml.safe_load(path.read_text())
    except yaml.YAMLError as error:
        raise TableError(f"{path}: not valid YAML ({error})") from None
    spec = _spec_from_mapping(data, str(path))
    if spec.name != path.stem and path.parent == tables_dir():
        raise TableError(f"{path}: name {spec.name!r} differs from the file name {path.stem!r}")
    return spec


def __getattr__(attribute: str):  # lazy registry targets: kdbench.tables:tinybert_v5_table1
    candidate = attribute.replace("_", "-")
    if (tables_dir() / f"{candidate}.yaml").is_file():
        return load_spec(candidate)
    raise AttributeError(f"module 'kdbench.tables' has no attribute {attribute!r}")


# ---------------------------------------------------------------------------------------------
# Published numbers


@lru_cache(maxsize=None)
def _read_published(file_name: str):
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
        return _read_published(file_name).copy()
    return pd.concat([_read_published(p.name) for p in sorted(published_dir().glob("*.csv"))], ignore_index=True)


@dataclass(frozen=True)
class PublishedValue:
    value: float
    printed: str
    uncertain: bool


def _published_rows(spec: TableSpec):
    frame = _read_published(spec.published)
    if spec.table is not None:
        frame = frame[frame["table"] == spec.table]
        if frame.empty:
            raise TableError(f"table {spec.name}: no row of {spec.published} has table == {spec.table!r}")
    return frame


def published_cell(spec: TableSpec, row: RowSpec, task: str | None, metric: str | None) -> PublishedValue | None:
    """The published number for one cell, or None when the paper leaves it empty."""
    if row.model is None or task is None or metric is None:
        return None
    frame = _published_rows(spec)
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


def _check_rows_exist(spec: TableSpec) -> None:
    frame = _published_rows(spec)
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


# ---------------------------------------------------------------------------------------------
# Runs -> rows


def _norm(text: Any) -> str:
    return str(text).strip().lower()


def _canonical_method(name: Any) -> str:
    from kdbench.plugins import METHODS

    try:
        return METHODS.canonical(str(name))
    except KeyError:
        return _norm(name).replace("_", "-")


def _path_key(value: Any) -> str | None:
    if not isinstance(value, str) or not value:
        return None
    path = Path(value)
    if path.name == "model":
        path = path.parent
    try:
        return str(path.resolve())
    except OSError:
        return str(path)


def _folder_keys(value: Any) -> set[str]:
    """Ways to recognise a run folder from a path to it or to its ``model/``: the resolved path and
    the folder's own name (hash-suffixed, so unique in practice; still matches after a move)."""
    if not isinstance(value, str) or "/" not in value:
        return set()
    path = Path(value)
    folder = path.parent if path.name == "model" else path
    return {k for k in (_path_key(value), f"name:{folder.name}") if k}


@dataclass
class _RunContext:
    """What selectors need to know about the other runs loaded alongside."""

    runs: Any
    teachers: set[str]  # folder keys of every run's teacher
    folders: dict[str, int]  # folder key -> run index
    students: set[str]  # folder keys of every run's student (runs whose model another run trained on)

    @classmethod
    def of(cls, runs) -> _RunContext:
        teachers: set[str] = set()
        for value in runs.get("teacher", ()):
            teachers |= _folder_keys(value)
        folders: dict[str, int] = {}
        for index, run in runs.iterrows():
            for key in _folder_keys(run.get("run_dir")) | _folder_keys(run.get("model_dir")):
                folders.setdefault(key, index)
        students: set[str] = set()
        for value in runs.get("student", ()):
            students |= _folder_keys(value)
        return cls(runs, teachers, folders, students)

    def upstream(self, run: Mapping[str, Any]) -> Mapping[str, Any] | None:
        """The run whose model is this run's student (or None)."""
        for key in _folder_keys(run.get("student")):
            if key in self.folders:
                return self.runs.loc[self.folders[key]]
        return None


def _config_value(config: Mapping[str, Any], dotted: str) -> Any:
    value: Any = config
    for part in dotted.split("."):
        if not isinstance(value, Mapping) or part not in value:
            return _NOT_SET
        value = value[part]
    return value


_NOT_SET = object()


def _equal(expected: Any, actual: Any) -> bool:
    if actual is _NOT_SET:
        return False
    if isinstance(expected, (list, tuple)) and isinstance(actual, (list, tuple)):
        return list(expected) == list(actual)
    if isinstance(expected, bool) or isinstance(actual, bool):
        return expected is actual or (isinstance(actual, str) and _norm(actual) == _norm(expected))
    if isinstance(expected, (int, float)) and isinstance(actual, (int, float)):
        return math.isclose(float(expected), float(actual), rel_tol=1e-9, abs_tol=1e-12)
    return _norm(expected) == _norm(actual)


def _selector_matches(select: Mapping[str, Any], run: Mapping[str, Any], context: _RunContext) -> bool:
    config = run.get("config") if isinstance(run.get("config"), Mapping) else {}
    for key, expected in select.items():
        if key == "method":
            if _canonical_method(run.get("method")) != _canonical_method(expected):
                return False
        elif key == "student":  # a preset name or path, or a list of them
            student = run.get("student")
            wanted = {_norm(s) for s in _as_tuple(expected)}
            if not isinstance(student, str) or not {_norm(student), _norm(Path(student).name)} & wanted:
                return False
        elif key == "role":
            if expected != "teacher":
                raise TableError(f"select.role: only 'teacher' is supported, not {expected!r}")
            mine = _folder_keys(run.get("run_dir")) | _folder_keys(run.get("model_dir"))
            if not mine & context.teachers:
                return False
        elif key == "upstream":  # the run that produced this run's student must match ``expected``
            source = context.upstream(run)
            if source is None or not _selector_matches(expected, source, context):
                return False
        elif key == "method_params":
            params = config.get("method_params") or {}
            for name, value in (expected or {}).items():
                if not _equal(value, params.get(name, _NOT_SET)):
                    return False
        elif not _equal(expected, _config_value(config, key)):
            return False
    return True


def _specificity(select: Mapping[str, Any]) -> int:
    total = 0
    for key, value in select.items():
        if key == "method_params" and isinstance(value, Mapping):
            total += len(value)
        elif key == "upstream" and isinstance(value, Mapping):
            total += 1 + _specificity(value)
        else:
            total += 1
    return total


def _row_match(row: RowSpec, run: Mapping[str, Any], context: _RunContext) -> int | None:
    """The specificity of the most specific alternative of ``row.select`` that ``run`` matches."""
    scores = [_specificity(alt) for alt in row.select if _selector_matches(alt, run, context)]
    return max(scores) if scores else None


def assign_rows(spec: TableSpec, runs) -> tuple[dict[str, list[int]], list[int]]:
    """Map each run (index of ``runs``) onto at most one row of ``spec`` (rules in the module
    docstring). Returns ``({row key: [run indices]}, [indices of completed runs matching no row])``."""
    by_row: dict[str, list[int]] = {row.key: [] for row in spec.rows}
    unmatched: list[int] = []
    if runs is None or len(runs) == 0:
        return by_row, unmatched
    context = _RunContext.of(runs)
    label_index: dict[str, str] = {}
    for row in spec.rows:
        for name in (row.key, f"{spec.name}/{row.key}", row.model, *row.labels):
            if name:
                label_index.setdefault(_norm(name), row.key)
    for index, run in runs.iterrows():
        if run.get("status") != "completed":
            continue
        label = run.get("label")
        if isinstance(label, str) and _norm(label) in label_index:
            by_row[label_index[_norm(label)]].append(index)
            continue
        scores = {row.key: _row_match(row, run, context) for row in spec.rows}
        candidates = [row for row in spec.rows if scores[row.key] is not None]
        if not candidates:
            if not _folder_keys(run.get("run_dir")) & context.students:  # not an upstream stage of another run
                unmatched.append(index)
            continue
        best = max(scores[r.key] for r in candidates)
        top = [r for r in candidates if scores[r.key] == best]
        if len(top) > 1:
            raise TableError(f"table {spec.name}: run {run.get('run_dir')} matches rows "
                             f"{[r.key for r in top]} equally; set its label to one row key")
        by_row[top[0].key].append(index)
    return by_row, unmatched


# ---------------------------------------------------------------------------------------------
# Measured cells


@dataclass(frozen=True)
class Measured:
    mean: float
    std: float | None  # None with one seed
    n: int  # seeds
    runs: int = 0  # runs behind the cell (> n: the best of several runs per seed was kept)

    def format(self, decimals: int) -> str:
        text = f"{self.mean:.{decimals}f}"
        if self.std is not None:
            text += f" ± {self.std:.{decimals}f}"
        return text


def aggregate(values: Sequence[tuple[Any, float]]) -> Measured | None:
    """``(seed, value)`` pairs -> best value per seed, then mean and sample std over seeds."""
    per_seed: dict[Any, float] = {}
    for seed, value in values:
        if value is None or (isinstance(value, float) and math.isnan(value)):
            continue
        key = seed if seed is not None and not (isinstance(seed, float) and math.isnan(seed)) else "?"
        per_seed[key] = max(per_seed.get(key, -math.inf), float(value))
    if not per_seed:
        return None
    numbers = list(per_seed.values())
    runs = sum(1 for _, value in values if value is not None and not (isinstance(value, float) and math.isnan(value)))
    mean = sum(numbers) / len(numbers)
    if len(numbers) == 1:
        return Measured(mean, None, 1, runs)
    std = math.sqrt(sum((x - mean) ** 2 for x in numbers) / (len(numbers) - 1))
    return Measured(mean, std, len(numbers), runs)


def _run_metric(run: Mapping[str, Any], alternatives: Sequence[tuple[str, str]]) -> float | None:
    task = _norm(run.get("task"))
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

    def of_run(self, run: Mapping[str, Any]) -> dict[str, float]:
        from kdbench import measure

        student = self._config_source(run.get("run_dir")) or self._config_source(run.get("model_dir"))
        if student is None:
            return {}
        teacher = self._config_source(run.get("teacher"))
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


# ---------------------------------------------------------------------------------------------
# Building a table


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
    return f"{run.get('method')}/{run.get('task')}/{_student_name(run)}{label}"


def build_table(name: str | TableSpec | CrossMethodSpec, runs: Any = None, *, latency: bool = False,
                measurer: Measurer | None = None) -> Table:
    """Build table ``name`` from the published numbers and ``runs`` (a runs folder, a list of
    folders, a records DataFrame or None for the published numbers alone)."""
    spec = load_spec(name) if isinstance(name, str) else name
    frame = _load_runs(runs)
    measurer = measurer or Measurer(seq_len=spec.seq_len, latency=latency)
    if isinstance(spec, CrossMethodSpec):
        return _build_cross_method(spec, frame, measurer)
    return _build_paper_table(spec, frame, measurer)


def _build_paper_table(spec: TableSpec, runs, measurer: Measurer) -> Table:
    _check_rows_exist(spec)
    by_row, unmatched = assign_rows(spec, runs)
    headers = [c.header for c in spec.columns] + ([spec.average.header] if spec.average else [])
    table = Table(spec.name, spec.title, ["Model", "Source", *headers], [])
    for row in spec.rows:
        if row.model is not None:
            cells = [_published_text(published_cell(spec, row, c.task, c.metric)) for c in spec.columns]
            if spec.average:
                cells.append(_published_text(published_cell(spec, row, spec.average.task, spec.average.metric)))
            table.rows.append([row.display, "paper", *cells])
        indices = by_row.get(row.key, [])
        measured_cells: dict[str, Measured | None] = {}
        for col in spec.columns:
            pairs: list[tuple[Any, float]] = []
            for i in indices:
                run = runs.loc[i]
                if col.measure:
                    value = measurer.of_run(run).get(col.measure)
                else:
                    value = _run_metric(run, col.run) if col.run else None
                if value is not None:
                    pairs.append((run.get("seed"), value))
            measured_cells[col.header] = aggregate(pairs)
            if measured_cells[col.header] is not None:
                table.measured[(row.display, col.header)] = measured_cells[col.header]
        cells = [measured_cells[c.header].format(c.decimals) if measured_cells[c.header] else MISSING
                 for c in spec.columns]
        if spec.average:
            parts = [measured_cells.get(h) for h in spec.average.over]
            if parts and all(p is not None for p in parts):
                avg = Measured(sum(p.mean for p in parts) / len(parts), None, min(p.n for p in parts))
                table.measured[(row.display, spec.average.header)] = avg
                cells.append(avg.format(1))
            else:
                cells.append(MISSING)
        table.rows.append([row.display, "ours", *cells])
    table.notes.extend(_notes(spec, runs, unmatched))
    _note_selection(table)
    return table


def _note_selection(table: Table) -> None:
    selected = sorted(f"{' / '.join(row) if isinstance(row, tuple) else row}: {col}"
                      for (row, col), m in table.measured.items() if m.runs > m.n)
    if selected:
        table.notes.append(f"{len(selected)} cell(s) keep the best dev score of several runs with the same seed "
                           f"(hyper-parameter selection on dev, as the papers do): {', '.join(selected[:6])}"
                           + (" ..." if len(selected) > 6 else ""))


def _notes(spec: TableSpec, runs, unmatched: list[int]) -> list[str]:
    notes = []
    if spec.note:
        notes.append(spec.note)
    notes.append(f"paper: {spec.published} (results/published); ours: dev metrics of kdbench runs, "
                 f"mean ± std over seeds; {MISSING} = not reported / not run; {UNCERTAIN_MARK} = uncertain "
                 "transcription (see the CSV's note)")
    if any(c.measure for c in spec.columns):
        notes.append(f"ours' size/speed: kdbench.measure on the run's model config at sequence length "
                     f"{spec.seq_len} (params incl. the W_h projection when the teacher is wider; "
                     "speed-up measured on this machine vs the run's teacher, only with --latency)")
    if len(runs):
        notes += unfinished_notes(runs)
        if unmatched:
            names = sorted({_describe_run(runs.loc[i]) for i in unmatched})
            shown = ", ".join(names[:8]) + (" ..." if len(names) > 8 else "")
            notes.append(f"{len(unmatched)} completed run(s) match no row of this table: {shown}")
    return notes


def _student_name(run: Mapping[str, Any], field: str = "student") -> str:
    student = run.get(field)
    if not isinstance(student, str) or not student:
        return MISSING
    path = Path(student)
    if path.name == "model" and path.parent.name:
        return path.parent.name
    return path.name if "/" in student else student


def _teacher_role(run: Mapping[str, Any]) -> str:
    """The teacher's role: the sweep stage that made it (one fine-tuned teacher per task, one role),
    else its folder or name."""
    from kdbench.sweep import stage_role

    return stage_role(run.get("teacher")) or _student_name(run, "teacher")


def _build_cross_method(spec: CrossMethodSpec, runs, measurer: Measurer) -> Table:
    import pandas as pd

    completed = runs[runs["status"] == "completed"] if len(runs) and "status" in runs else pd.DataFrame()
    present = set(completed["task"].map(_norm)) if len(completed) else set()
    tasks = [t for t in spec.tasks if t in present or (t == "mnli-mm" and "mnli" in present)]
    headers = [MAIN_METRICS[t][0] for t in tasks]
    avg_over = [MAIN_METRICS[t][0] for t in spec.glue_average_over if t in tasks]
    header = ["Method", "Student", "Teacher", *headers, "Avg (ours)", "Paper avg", "Params (M)", "FLOPs (G)",
              "Speed-up"]
    table = Table(spec.name, spec.title, header, [], label_columns=3)
    if len(completed):
        groups: dict[tuple[str, str, str, str], list[int]] = {}
        for index, run in completed.iterrows():
            label = run.get("label") if isinstance(run.get("label"), str) else ""
            key = (_canonical_method(run.get("method")), _student_name(run), label or "", _teacher_role(run))
            groups.setdefault(key, []).append(index)
        for (method, student, label, teacher), indices in sorted(groups.items()):
            display = f"{method} [{label}]" if label else method
            cells: list[str] = []
            means: dict[str, Measured] = {}
            for task in tasks:
                metric = MAIN_METRICS[task][1]
                alternatives = [("mnli", "acc_mm"), ("mnli-mm", "acc_mm")] if task == "mnli-mm" else [(task, metric)]
                pairs = [(runs.loc[i].get("seed"), _run_metric(runs.loc[i], alternatives)) for i in indices]
                m = aggregate([(s, v) for s, v in pairs if v is not None])
                if m is not None:
                    means[MAIN_METRICS[task][0]] = m
                    table.measured[((display, student, teacher), MAIN_METRICS[task][0])] = m
                cells.append(m.format(1) if m else MISSING)
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
        f"only when all were run; {MISSING} = not run")
    table.notes.append(f"Params/FLOPs: kdbench.measure at sequence length {spec.seq_len}; Speed-up: measured "
                       "throughput ratio vs the run's teacher at batch 32 on this machine (only with --latency)")
    if len(runs):
        table.notes += unfinished_notes(runs)
    _note_selection(table)
    return table


def _paper_average_text(ref: PaperAverage | None) -> str:
    if ref is None:
        return MISSING
    frame = _read_published(ref.published)
    hit = frame[(frame["model"] == ref.model) & (frame["task"] == ref.task) & (frame["metric"] == ref.metric)]
    if len(hit) != 1:
        raise TableError(f"paper average {ref.label!r}: {len(hit)} rows in {ref.published} for "
                         f"{ref.model}/{ref.task}/{ref.metric} (need exactly 1)")
    return f"{hit.iloc[0]['printed']} ({ref.label})"


# ---------------------------------------------------------------------------------------------
# Rendering


def render(table: Table, fmt: str = "markdown") -> str:
    if fmt not in FORMATS:
        raise TableError(f"format {fmt!r} unknown (known: {', '.join(FORMATS)})")
    return {"markdown": _markdown, "latex": _latex, "csv": _csv, "html": _html}[fmt](table)


def _markdown(table: Table) -> str:
    def esc(text: str) -> str:
        return text.replace("|", "\\|")

    widths = [max(len(esc(r[i])) for r in [table.header, *table.rows]) for i in range(len(table.header))]
    line = lambda cells: "| " + " | ".join(esc(c).ljust(w) for c, w in zip(cells, widths)) + " |"  # noqa: E731
    out = [f"**{table.title}**", "", line(table.header),
           "|" + "|".join(("-" * (w + 1) + ":") if i >= table.label_columns else ("-" * (w + 2))
                          for i, w in enumerate(widths)) + "|"]
    out += [line(r) for r in table.rows]
    out += [""] + [f"- {n}" for n in table.notes]
    return "\n".join(out) + "\n"


_LATEX_SPECIAL = {"&": r"\&", "%": r"\%", "$": r"\$", "#": r"\#", "_": r"\_", "{": r"\{", "}": r"\}",
                  "~": r"\textasciitilde{}", "^": r"\textasciicircum{}", "\\": r"\textbackslash{}"}


def _latex_escape(text: str) -> str:
    text = "".join(_LATEX_SPECIAL.get(ch, ch) for ch in text)
    return text.replace("±", r"$\pm$").replace(MISSING, "--").replace(UNCERTAIN_MARK, r"$^\dagger$")


def _latex(table: Table) -> str:
    cols = "l" * table.label_columns + "r" * (len(table.header) - table.label_columns)
    out = [r"\begin{table}[t]", r"\centering", r"\small", rf"\begin{{tabular}}{{{cols}}}", r"\toprule",
           " & ".join(_latex_escape(h) for h in table.header) + r" \\", r"\midrule"]
    out += [" & ".join(_latex_escape(c) for c in row) + r" \\" for row in table.rows]
    out += [r"\bottomrule", r"\end{tabular}",
            rf"\caption{{{_latex_escape(table.title)}. " + " ".join(_latex_escape(n) for n in table.notes) + "}",
            rf"\label{{tab:{table.name}}}", r"\end{table}"]
    return "\n".join(out) + "\n"


def _csv(table: Table) -> str:
    import csv
    import io

    buffer = io.StringIO()
    writer = csv.writer(buffer, lineterminator="\n")
    writer.writerow(table.header)
    writer.writerows(table.rows)
    return buffer.getvalue()


def _html(table: Table) -> str:
    out = [f"<table class=\"kdbench-table\" id=\"{html.escape(table.name)}\">",
           f"<caption>{html.escape(table.title)}</caption>",
           "<thead><tr>" + "".join(f"<th>{html.escape(h)}</th>" for h in table.header) + "</tr></thead>", "<tbody>"]
    for row in table.rows:
        out.append("<tr>" + "".join(f"<td>{html.escape(c)}</td>" for c in row) + "</tr>")
    out.append("</tbody>")
    if table.notes:
        out.append("<tfoot>" + "".join(f"<tr><td colspan=\"{len(table.header)}\">{html.escape(n)}</td></tr>"
                                       for n in table.notes) + "</tfoot>")
    out.append("</table>")
    return "\n".join(out) + "\n"


# ---------------------------------------------------------------------------------------------
# Command line


def cmd_table(args) -> int:
    table = build_table(args.name, args.runs or None, latency=args.latency)
    text = render(table, args.format)
    if args.output:
        Path(args.output).parent.mkdir(parents=True, exist_ok=True)
        Path(args.output).write_text(text)
    print(text, end="")
    return 0


def add_command(subparsers) -> None:
    parser = subparsers.add_parser("table", help="a paper-style table: published numbers beside measured ones "
                                                 "(kdbench list tables)")
    parser.add_argument("name", help="table name (kdbench list tables) or a spec YAML file")
    parser.add_argument("--runs", action="append", default=[],
                        help="folder of result records (repeatable); omit for the published numbers alone")
    parser.add_argument("--format", default="markdown", choices=FORMATS)
    parser.add_argument("--output", help="also write the rendered table to this file")
    parser.add_argument("--latency", action="store_true",
                        help="time the runs' models on this machine for the speed-up column (slow on CPU)")
    parser.set_defaults(handler=cmd_table)


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
