"""What a study sets out to measure, so that a table of it says why each empty measured cell is empty.

Without a plan a table can only print ``–`` for a cell no run filled: not run, not runnable and not
part of the study all look alike. With one (``kdbench reproduce`` builds it from the study's rows and
scale), an empty measured cell reads

* ``pending`` -- the study runs this cell and no completed record exists yet;
* ``n/a`` -- the row cannot run on this task (a footnote gives the row's reason);
* ``–`` -- the study runs no such row or task (a footnote says why);

and a measured cell with fewer seeds than planned says how many it has (``[2/5]``): the missing seeds
are pending, unless the plan lists them as not run, with why (:class:`SeedsNotRun`).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from kdbench.tables.matching import normalise

MISSING = "–"  # an en dash: never 0
PENDING = "pending"
NOT_APPLICABLE = "n/a"


@dataclass(frozen=True)
class PlannedRow:
    """One row a study runs.

    ``key`` is the paper table's row key (in a cross-method table: the runs' label, or for label-less
    stage runs such as the fine-tuned teachers, their stage role, e.g. ``teacher``); ``method`` and
    ``student`` are what a cross-method table shows for the row before any of its runs exists."""

    key: str
    tasks: tuple[str, ...]
    method: str = ""
    student: str = ""
    teacher: str = ""
    not_run_reason: str = ""  # why the row runs none of the study's other tasks
    seeds: int | None = None  # seeds of each of its cells; None: the study's seeds of the task


@dataclass(frozen=True)
class SeedsNotRun:
    """Planned seeds of one cell that a study's records lack on purpose, and why (e.g. they need a
    kind of machine the study no longer has): a footnote of the table, in place of "pending"."""

    row: str  # the planned row's key
    task: str
    seeds: tuple[int, ...]
    why: str

    def describe(self) -> str:
        seeds = ", ".join(str(seed) for seed in self.seeds)
        return f"{self.row} on {self.task}: seed{'s' if len(self.seeds) > 1 else ''} {seeds} not run: {self.why}"


@dataclass(frozen=True)
class StudyPlan:
    """The rows and tasks a study runs, the seeds of each cell, and why it runs nothing else."""

    rows: tuple[PlannedRow, ...]
    seeds: Mapping[str, int]  # task -> seeds each of its cells runs (its keys: the study's tasks)
    not_in_study: str  # why the study runs no other row or task
    pending_where: str = ""  # where the reader finds the order and cost of the cells still to run
    seeds_not_run: tuple[SeedsNotRun, ...] = ()
    _by_key: dict[str, PlannedRow] = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "_by_key", {normalise(row.key): row for row in self.rows})

    def row(self, key: str) -> PlannedRow | None:
        return self._by_key.get(normalise(key))

    def empty_cell(self, key: str, task: str) -> str:
        """The mark of row ``key``'s empty measured cell in ``task``'s column."""
        row = self.row(key)
        if row is None or normalise(task) not in self.seeds:
            return MISSING
        return PENDING if normalise(task) in row.tasks else NOT_APPLICABLE

    def seeds_suffix(self, key: str, task: str, n: int) -> str:
        """`` [n/N]`` for row ``key``'s cell in ``task``'s column measured on fewer seeds than the
        study runs, else nothing."""
        row = self.row(key)
        if row is None or normalise(task) not in row.tasks:
            return ""
        planned = row.seeds or self.seeds.get(normalise(task))
        return f" [{n}/{planned}]" if planned and n < planned else ""

    def notes(self, marks: Mapping[str, Sequence[str]], short_cells: Sequence[tuple[str, str]] = ()) -> list[str]:
        """Footnotes for the marks a table used: ``marks[mark]`` = the row key of each cell that carries it;
        ``short_cells`` = (row key, task) of each measured cell with fewer seeds than planned."""
        notes = []
        where = f"; {self.pending_where}" if self.pending_where else ""
        pending = marks.get(PENDING, ())
        if pending:
            notes.append(f"ours: {PENDING} = a cell the study runs that has no completed record yet ({len(pending)} "
                         f"cell(s) in {len(set(pending))} row(s)){where}")
        if marks.get(NOT_APPLICABLE):
            by_reason: dict[str, list[str]] = {}
            for key in sorted(set(marks[NOT_APPLICABLE])):
                row = self.row(key)
                if row is not None and row.not_run_reason:
                    by_reason.setdefault(row.not_run_reason, []).append(row.key)
            reasons = "; ".join(f"{', '.join(keys)}: {reason}" for reason, keys in by_reason.items())
            notes.append(f"ours: {NOT_APPLICABLE} = the row does not run on that task" + (f" ({reasons})" if reasons else ""))
        if marks.get(MISSING):
            notes.append(f"ours: {MISSING} = not in the study: {self.not_in_study}")
        if short_cells:
            notes.append(self._short_cells_note(short_cells, where))
        return notes

    def _short_cells_note(self, short_cells: Sequence[tuple[str, str]], where: str) -> str:
        short = {(normalise(key), normalise(task)) for key, task in short_cells}
        explained = [entry for entry in self.seeds_not_run if (normalise(entry.row), normalise(entry.task)) in short]
        explained_cells = {(normalise(entry.row), normalise(entry.task)) for entry in explained}
        note = "ours: [n/N] = measured on n of the N seeds the study runs"
        if short - explained_cells:
            note += f" (the others are pending){where}"
        return "; ".join([note, *(entry.describe() for entry in explained)])


class MarkLog:
    """The rows of one table that carry each mark, for :meth:`StudyPlan.notes`."""

    def __init__(self, plan: StudyPlan) -> None:
        self.plan = plan
        self.marks: dict[str, list[str]] = {}
        self.short_cells: list[tuple[str, str]] = []

    def empty(self, key: str, task: str) -> str:
        """The mark of row ``key``'s empty cell in ``task``'s column."""
        mark = self.plan.empty_cell(key, task)
        self.marks.setdefault(mark, []).append(key)
        return mark

    def measured(self, key: str, task: str, n: int) -> str:
        """What follows the numbers of row ``key``'s cell in ``task``'s column, measured on ``n`` seeds."""
        suffix = self.plan.seeds_suffix(key, task, n)
        if suffix:
            self.short_cells.append((key, task))
        return suffix

    def notes(self) -> list[str]:
        return self.plan.notes(self.marks, self.short_cells)
