"""``kdbench compare BETTER WORSE --runs DIR``: does one row of runs beat another beyond seed noise?

The reproduction study's test (:mod:`kdbench.claims`) for anyone's runs: a new method against the
baselines it should beat, say. Both rows run the same seeds on a task; the evidence is the per-seed
difference of their dev scores, its mean, sample std and standard error, and a strict verdict
(``holds`` only when every seed agrees and the mean exceeds twice its standard error). Rows are
named by their runs' ``label`` (sweeps set it), or for runs without one by their method.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from kdbench.claims import ClaimResult

ROW_COLUMN = "row"


def compare_rows(better: str, worse: str, runs: Sequence[str], tasks: Sequence[str] = (),
                 metrics: dict[str, str] | None = None,
                 evaluations: dict[str, str] | None = None) -> list[ClaimResult]:
    """The :class:`kdbench.claims.ClaimResult` of "``better`` beats ``worse``" on each task (``tasks``,
    or every task both rows completed runs on), from the records under ``runs``; ``metrics``: task ->
    the dev metric to compare where not the task's main one; ``evaluations``: task -> the rule that
    picks each run's evaluation (``best:acc``, ``last``; default: the one the run kept).

    Bad input is named before anything is scored: a row with no completed run, a task a row did not
    run, a metric or evaluation rule for a task not compared or a metric a row did not record, rows
    with no seed in common, a run without a usable seed or score, or two trainings of one row, task
    and seed."""
    from kdbench.claims import Claim, claim_results
    from kdbench.config import ConfigError
    from kdbench.evaluations import parse_rules, reselect

    if better == worse:
        raise ConfigError(f"compare a row with another one: both are {better!r}")
    frame = _completed_runs(runs)
    rows = sorted(frame[ROW_COLUMN].dropna().unique()) if len(frame) else []
    for name in (better, worse):
        if name not in rows:
            raise ConfigError(f"row {name!r} has no completed run under {', '.join(runs)} "
                              f"(rows: {', '.join(rows) or 'none'}; a row is a label, or a method for unlabelled runs)")
    tasks_of = {name: set(frame.loc[frame[ROW_COLUMN] == name, "task"]) for name in (better, worse)}
    chosen = list(dict.fromkeys(tasks)) or sorted(tasks_of[better] & tasks_of[worse])
    if not chosen:
        raise ConfigError(f"rows {better!r} ({', '.join(sorted(tasks_of[better]))}) and {worse!r} "
                          f"({', '.join(sorted(tasks_of[worse]))}) share no task")
    for task in chosen:
        for name in (better, worse):
            if task not in tasks_of[name]:
                raise ConfigError(f"--task {task!r}: row {name!r} has no completed run on it "
                                  f"(its tasks: {', '.join(sorted(tasks_of[name]))})")
    for option, given in (("--metric", metrics or {}), ("--evaluation", evaluations or {})):
        for task in given:
            if task not in chosen:
                raise ConfigError(f"{option} {task}={given[task]}: {task!r} is not a compared task "
                                  f"({', '.join(chosen)})")
    frame = frame[frame[ROW_COLUMN].isin([better, worse]) & frame["task"].isin(chosen)].reset_index(drop=True)
    frame["seed"] = [_seed(run) for _, run in frame.iterrows()]
    _refuse_rows_of_several_students(frame)
    _refuse_two_trainings_of_one_seed(frame)
    for task in chosen:
        seeds = {name: set(frame.loc[(frame[ROW_COLUMN] == name) & (frame["task"] == task), "seed"])
                 for name in (better, worse)}
        if not seeds[better] & seeds[worse]:
            raise ConfigError(f"rows {better!r} and {worse!r} share no seed on {task} (seeds "
                              f"{sorted(seeds[better])} and {sorted(seeds[worse])}): a paired test needs both "
                              "rows run with the same seeds")
    if evaluations:
        frame = reselect(frame, parse_rules(evaluations))
    for task, metric in (metrics or {}).items():
        for name in (better, worse):
            recorded = frame.loc[(frame["task"] == task) & (frame[ROW_COLUMN] == name)]
            if f"metric.{metric}" not in recorded or recorded[f"metric.{metric}"].isna().all():
                raise ConfigError(f"--metric {task}={metric}: row {name!r} recorded no {metric!r} on {task!r}")
    _refuse_runs_without_a_score(frame, chosen, metrics or {})
    claim = Claim("", f"{better} beats {worse}", better, worse)
    return claim_results([claim], frame.assign(label=frame[ROW_COLUMN]), chosen, metrics=metrics)


def _completed_runs(runs: Sequence[str]) -> Any:
    """The completed records under the folders ``runs``, each named by its row; a record found in
    several of them (a folder given twice, nested in another, or records exported to two tables) is
    one run."""
    import pandas as pd

    from kdbench.records import load_records, training_identity

    frames = [load_records(folder, include_failed=False) for folder in runs]
    frame = pd.concat([f for f in frames if len(f)], ignore_index=True) if any(len(f) for f in frames) else pd.DataFrame()
    if not len(frame):
        return frame.assign(**{ROW_COLUMN: [], "task": []})
    frame = frame[~pd.Series([training_identity(run) for _, run in frame.iterrows()]).duplicated()]
    frame = frame.reset_index(drop=True)
    labels = frame["label"] if "label" in frame else pd.Series([None] * len(frame))
    frame[ROW_COLUMN] = [label if isinstance(label, str) and label else method
                         for label, method in zip(labels, frame["method"], strict=True)]
    return frame


def _refuse_runs_without_a_score(frame: Any, tasks: Sequence[str], metrics: dict[str, str]) -> None:
    """A completed run with no score on the compared metric (NaN: a diverged evaluation, or an
    evaluation rule that picked one without it) would silently leave its seed out of the pairing."""
    from kdbench.claims import claim_metric
    from kdbench.config import ConfigError

    for task in tasks:
        column = f"metric.{claim_metric(task, metrics)}"
        runs = frame[frame["task"] == task]
        missing = runs[runs[column].isna()] if column in runs else runs
        if len(missing):
            raise ConfigError(f"{len(missing)} run(s) have no {column.removeprefix('metric.')!r} on {task} to compare "
                              f"({', '.join(sorted(missing['run_dir']))}): rerun or leave them out of the folders")


def _refuse_rows_of_several_students(frame: Any) -> None:
    """A row is one student trained one way: unlabelled runs of one method with several students (a
    sweep's teacher stage beside its student cells, say) are not a row to compare."""
    from kdbench.config import ConfigError

    for row, group in frame.groupby(ROW_COLUMN):
        students = sorted({_student_identity(run) for _, run in group.iterrows()})
        if len(students) > 1:
            raise ConfigError(f"row {row!r} holds runs of {len(students)} students ({', '.join(students)}), e.g. a "
                              "sweep's teacher stage beside its cells: give the runs to compare a label "
                              "(label=NAME, or a sweep cell's label)")


def _student_identity(run: Any) -> str:
    """The student a run started from, as its run identity fingerprints it (``inputs.student``: a
    kdbench run's name, a Hub id or a content digest, the same from any checkout); else (a preset, a
    record written by hand) as tables name it."""
    import json

    from kdbench.tables.building import model_name

    inputs = run.get("inputs")
    fingerprint = inputs.get("student") if isinstance(inputs, dict) else None
    return json.dumps(fingerprint, sort_keys=True) if fingerprint else model_name(run)


def _seed(run: Any) -> int:
    """A run's seed as an integer (records written by hand or by a plug-in may hold ``"1"``)."""
    from kdbench.config import ConfigError

    try:
        value = float(run.get("seed"))
        if value != int(value):
            raise ValueError
        return int(value)
    except (TypeError, ValueError):
        raise ConfigError(f"run {run.get('run_dir')}: seed {run.get('seed')!r} is not an integer, so it pairs "
                          "with no seed of the other row") from None


def _refuse_two_trainings_of_one_seed(frame: Any) -> None:
    """Two completed runs of one row, task and seed would leave the pairing to chance: name them."""
    from kdbench.config import ConfigError

    for (row, task, seed), group in frame.groupby([ROW_COLUMN, "task", "seed"]):
        if len(group) > 1:
            raise ConfigError(f"row {row!r} has {len(group)} completed runs of {task} seed {seed} "
                              f"({', '.join(sorted(group['run_dir']))}): keep one, or give them other labels")


def _pairs(values: Sequence[str], option: str) -> dict[str, str]:
    from kdbench.config import ConfigError

    pairs = {}
    for value in values:
        task, sep, setting = value.partition("=")
        if not sep or not task.strip() or not setting.strip():
            raise ConfigError(f"{option} {value!r}: expected TASK=VALUE, e.g. mrpc=acc")
        pairs[task.strip().lower()] = setting.strip()
    return pairs


def cmd_compare(args: Any) -> int:
    from kdbench.claims import VERDICT_LEGEND, format_comparison

    tasks = [t.strip().lower() for t in (args.task or "").split(",") if t.strip()]
    results = compare_rows(args.better, args.worse, args.runs, tasks, _pairs(args.metric, "--metric"),
                           _pairs(args.evaluation, "--evaluation"))
    print(format_comparison(results))
    print(f"\n{VERDICT_LEGEND}")
    return 0


def add_command(subparsers: Any) -> None:
    parser = subparsers.add_parser(
        "compare", help="does one row of runs beat another beyond seed noise? paired by seed, per task")
    parser.add_argument("better", help="the row expected to win: a label, or a method for unlabelled runs")
    parser.add_argument("worse", help="the row it should beat")
    parser.add_argument("--runs", action="append", required=True, help="folder of result records (repeatable)")
    parser.add_argument("--task", help="comma-separated tasks (default: every task both rows ran)")
    parser.add_argument("--metric", action="append", default=[], metavar="TASK=METRIC",
                        help="compare this dev metric on the task instead of its main one, e.g. mrpc=acc (repeatable)")
    parser.add_argument("--evaluation", action="append", default=[], metavar="TASK=RULE",
                        help="which recorded evaluation of each run counts on the task: best:METRIC or last "
                             "(default: the one the run kept), e.g. mrpc=best:acc as TinyBERT's script (repeatable)")
    parser.set_defaults(handler=cmd_compare)
