"""Table specs: the schema of ``results/tables/<name>.yaml`` and its loading.

Specs are built with :func:`kdbench.config.from_mapping`, the mechanism that builds run configs:
unknown keys name the closest valid one, values are typed, declared field constraints are enforced,
and rules over several fields live in each spec's ``check_combination``. The field meanings are
documented in :mod:`kdbench.tables`.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from functools import cache
from pathlib import Path
from typing import Any

import yaml

from kdbench.config import ConfigError, from_mapping
from kdbench.constraints import constrained
from kdbench.evaluations import EvaluationRule, parse_rules

# kdbench task name -> (display name, metric the cross-method table shows). Order = column order.
MAIN_METRICS: dict[str, tuple[str, str]] = {
    "mnli": ("MNLI-m", "acc"), "mnli-mm": ("MNLI-mm", "acc_mm"), "qqp": ("QQP", "f1"),
    "qnli": ("QNLI", "acc"), "sst2": ("SST-2", "acc"), "cola": ("CoLA", "mcc"),
    "stsb": ("STS-B", "spearman"), "mrpc": ("MRPC", "f1"), "rte": ("RTE", "acc"),
    "wnli": ("WNLI", "acc"), "squad": ("SQuAD1.1 F1", "f1"), "squad-v2": ("SQuAD2.0 F1", "f1"),
}
CROSS_METHOD_KIND = "cross-method"


class TableError(ConfigError):
    """A table spec, a published file or a run-to-row assignment is wrong; the message says which."""


@dataclass(frozen=True)
class ColumnSpec:
    header: str = constrained(non_empty=True)
    task: str | None = None  # published CSV task
    metric: str | None = None  # published CSV metric
    run: tuple[tuple[str, str], ...] = ()  # (kdbench task, metric name) alternatives
    measure: str | None = None  # a kdbench.measure key instead of a task metric
    decimals: int = constrained(1, ge=0)

    def check_combination(self) -> None:
        if self.run and self.measure:
            raise TableError(f"column {self.header!r}: give either run or measure, not both")


@dataclass(frozen=True)
class AverageSpec:
    task: str
    metric: str
    header: str = "Avg"
    over: tuple[str, ...] = ()
    recompute: bool = True  # False: the printed number is not a mean of the row (leaderboard score)
    known_mismatches: Mapping[str, str] = field(default_factory=dict)  # model -> reason
    # A row key: the column is each row's difference from that row's average (an ablation table
    # that prints deltas, e.g. DistilBERT's Table 4), measured paired by seed.
    relative_to: str | None = None

    def check_combination(self) -> None:
        if self.relative_to is not None and not self.recompute:
            raise TableError(f"average {self.header!r}: relative_to {self.relative_to!r} needs recompute: true "
                             "(a difference of averages is measured from the row's own cells)")


@dataclass(frozen=True)
class RowSpec:
    key: str = constrained(non_empty=True)
    model: str | None = None
    setting: str | None = None
    select: tuple[Mapping[str, Any], ...] = ()  # alternatives: the row takes a run that matches any
    labels: tuple[str, ...] = ()
    title: str | None = None  # printed instead of ``model`` where the CSV's model is a long description

    def check_combination(self) -> None:
        if not all(self.select):
            raise TableError(f"row {self.key!r}: an empty select would match every run")

    @property
    def display(self) -> str:
        return self.title or self.model or self.key


@dataclass(frozen=True)
class TableSpec:
    name: str
    published: str  # a CSV file under results/published
    title: str = ""
    description: str = ""
    columns: tuple[ColumnSpec, ...] = ()
    rows: tuple[RowSpec, ...] = ()
    table: str | None = None
    average: AverageSpec | None = None
    note: str | None = None
    seq_len: int = constrained(128, ge=8)
    # kdbench task -> which of a run's dev evaluations the table reports (kdbench.evaluations):
    # the paper's own rule where it differs from the run's, e.g. {mrpc: "best:acc"} for TinyBERT.
    evaluation: Mapping[str, str] = field(default_factory=dict)

    def check_combination(self) -> None:
        try:
            self.evaluation_rules()
        except ConfigError as error:
            raise TableError(str(error)) from None
        headers = [c.header for c in self.columns]
        if len(set(headers)) != len(headers):
            raise TableError(f"duplicate column headers {headers}")
        if self.average is not None:
            bad = [h for h in self.average.over if h not in headers]
            if bad:
                raise TableError(f"average.over names {bad}, which are not column headers {headers}")
        keys = [r.key for r in self.rows]
        if len(set(keys)) != len(keys):
            raise TableError(f"duplicate row keys {keys}")
        if self.average is not None and self.average.relative_to not in (None, *keys):
            raise TableError(f"average.relative_to {self.average.relative_to!r} is not a row key {keys}")

    def evaluation_rules(self) -> dict[str, EvaluationRule]:
        return parse_rules(self.evaluation)


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
    kind: str = constrained(CROSS_METHOD_KIND, choices=(CROSS_METHOD_KIND,))
    title: str = ""
    description: str = ""
    tasks: tuple[str, ...] = constrained((), choices=tuple(MAIN_METRICS))
    glue_average_over: tuple[str, ...] = ()
    paper_averages: Mapping[str, PaperAverage] = field(default_factory=dict)
    note: str | None = None
    seq_len: int = constrained(128, ge=8)


def _resources_root() -> Path:
    import kdbench.results

    return Path(kdbench.results.__file__).resolve().parent


def published_dir() -> Path:
    return _resources_root() / "published"


def tables_dir() -> Path:
    return _resources_root() / "tables"


def spec_files() -> dict[str, Path]:
    """Every table spec shipped with kdbench, by name: the files ``results/tables/*.yaml``."""
    return {path.stem: path for path in sorted(tables_dir().glob("*.yaml"))}


def table_names() -> list[str]:
    return sorted(spec_files())


def as_tuple(value: Any) -> tuple:
    if value is None:
        return ()
    if isinstance(value, (list, tuple)):
        return tuple(value)
    return (value,)


def _parse_run_ref(ref: Any, where: str) -> tuple[str, str]:
    if not isinstance(ref, str) or ref.count("/") != 1:
        raise TableError(f"{where}: run {ref!r} must look like 'task/metric' (e.g. 'mnli/acc_mm')")
    task, metric = ref.split("/")
    return task.strip().lower(), metric.strip()


def _mapping(value: Any, where: str) -> dict[str, Any]:
    if not isinstance(value, Mapping):
        raise TableError(f"{where}: must be a mapping, got {value!r}")
    return dict(value)


def _build(cls: type, values: Mapping[str, Any], where: str) -> Any:
    try:
        return from_mapping(cls, dict(values), where=where)
    except TableError as error:
        raise TableError(f"{where}: {error}") from None
    except ConfigError as error:
        raise TableError(str(error)) from None


def spec_from_mapping(data: Any, source: str) -> TableSpec | CrossMethodSpec:
    """Build a spec from its YAML mapping; any error is a one-line :class:`TableError` naming ``source``."""
    data = _mapping(data, f"{source}: a table spec")
    if "name" not in data:
        raise TableError(f"{source}: a table spec needs a 'name'")
    data.setdefault("title", data["name"])
    try:
        if data.get("kind") == CROSS_METHOD_KIND:
            averages = {str(method): _build(PaperAverage, _mapping(value, f"paper_averages.{method}"),
                                            f"paper_averages.{method}")
                        for method, value in (data.get("paper_averages") or {}).items()}
            return _build(CrossMethodSpec, {**data, "paper_averages": averages}, "")
        columns = []
        for i, raw in enumerate(data.get("columns") or ()):
            where = f"columns[{i}]"
            column = _mapping(raw, where)
            column["run"] = [_parse_run_ref(r, where) for r in as_tuple(column.get("run"))]
            columns.append(_build(ColumnSpec, column, where))
        rows = []
        for i, raw in enumerate(data.get("rows") or ()):
            row = _mapping(raw, f"rows[{i}]")
            select = row.get("select") or []
            row["select"] = [dict(a) for a in (select if isinstance(select, list) else [select])]
            row["labels"] = list(as_tuple(row.get("labels")))
            rows.append(_build(RowSpec, row, f"rows[{i}]"))
        average = None
        if data.get("average"):
            raw_average = _mapping(data["average"], "average")
            raw_average["known_mismatches"] = dict(raw_average.get("known_mismatches") or {})
            average = _build(AverageSpec, raw_average, "average")
        evaluation = dict(_mapping(data.get("evaluation") or {}, "evaluation"))
        return _build(TableSpec, {**data, "columns": columns, "rows": rows, "average": average,
                                  "evaluation": evaluation}, "")
    except TableError as error:
        raise TableError(f"{source}: {str(error).removeprefix(': ')}") from None


@cache
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
    spec = spec_from_mapping(data, str(path))
    if spec.name != path.stem and path.parent == tables_dir():
        raise TableError(f"{path}: name {spec.name!r} differs from the file name {path.stem!r}")
    return spec
