"""Which of a run's dev evaluations a table reports.

A run evaluates on dev during its last stage (each epoch, or every ``train.eval_steps``) and keeps
the evaluation that is best on its selection metric (``train.select_metric``, else the task's main
metric); its record's ``metrics`` are that evaluation. The papers' own scripts do not all keep the
same one: TinyBERT's ``task_distill.py`` keeps MRPC's *accuracy*-best evaluation (its ``acc_tasks``)
where kdbench's main MRPC metric is F1, as do BERT-PKD's result summaries (accuracy per epoch), and
MobileBERT's TF ``run_classifier.py`` reports the model at the end of training. A table spec names
its paper's rule per task (``evaluation:`` in :mod:`kdbench.tables`), and the table re-selects each
run's evaluation from the run's recorded evaluations (``RUN/loss_terms.jsonl``): the training does
not depend on which evaluation is kept (only the last stage evaluates, and nothing trains on after
it), so the re-selected evaluation is exactly what the run would report had it run under the paper's
rule, and one run serves tables with different rules.

Rules (plain strings, so a spec stays data):

* ``kept`` -- the evaluation the run kept (its record's ``metrics``);
* ``best:<metric>`` -- the first evaluation with the highest ``<metric>`` (a later tie does not
  replace it: the official scripts and ``Trainer`` both compare with a strict ``>``);
* ``last`` -- the evaluation at the stage's last step (a run whose last evaluation came before its
  last step has no such evaluation: an error, not a silent earlier one).
"""

from __future__ import annotations

import json
import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from kdbench.config import ConfigError

KEPT, LAST, BEST = "kept", "last", "best"
BEST_PREFIX = BEST + ":"
METRIC_COLUMN_PREFIX = "metric."  # kdbench.records.load_records flattens metrics into these columns
EVALUATION_STEP_COLUMN = "evaluation_step"


@dataclass(frozen=True)
class EvaluationRule:
    """One of ``kept``, ``last`` or ``best:<metric>`` (see the module docstring)."""

    kind: str
    metric: str | None = None

    @classmethod
    def parse(cls, text: str) -> EvaluationRule:
        value = str(text).strip()
        if value in (KEPT, LAST):
            return cls(value)
        if value.startswith(BEST_PREFIX) and value[len(BEST_PREFIX):].strip():
            return cls(BEST, value[len(BEST_PREFIX):].strip())
        raise ConfigError(f"evaluation rule {text!r}: use 'kept', 'last' or 'best:<metric>' (e.g. 'best:acc')")

    def __str__(self) -> str:
        return f"{BEST_PREFIX}{self.metric}" if self.kind == BEST else self.kind

    def describe(self) -> str:
        if self.kind == BEST:
            return f"the evaluation with the best {self.metric}"
        return "the evaluation at the end of training" if self.kind == LAST else "the evaluation the run kept"


def describe_rules(rules: Mapping[str, EvaluationRule]) -> str:
    """A footnote: which evaluation each task's cells report, where it is not the run's own."""
    active = {task: rule for task, rule in rules.items() if rule.kind != KEPT}
    if not active:
        return ""
    tasks_by_rule: dict[EvaluationRule, list[str]] = {}
    for task, rule in sorted(active.items()):
        tasks_by_rule.setdefault(rule, []).append(task)
    parts = "; ".join(f"{', '.join(tasks)}: {rule.describe()}" for rule, tasks in tasks_by_rule.items())
    return (f"measured cells report the paper's own choice of dev evaluation ({parts}), re-selected from each "
            "run's recorded evaluations; other tasks report the evaluation the run kept")


def parse_rules(rules: Mapping[str, str]) -> dict[str, EvaluationRule]:
    """``{task: rule text}`` -> ``{task: EvaluationRule}``; a bad rule names its task."""
    parsed = {}
    for task, text in rules.items():
        try:
            parsed[str(task).strip().lower()] = EvaluationRule.parse(text)
        except ConfigError as error:
            raise ConfigError(f"evaluation.{task}: {error}") from None
    return parsed


def recorded_evaluations(run_dir: Path) -> tuple[list[dict[str, Any]], int]:
    """The dev evaluations of the run's last stage, in order (``{"step": n, metric: value, ...}``),
    and the number of steps that stage trained. Raises when the run recorded none."""
    from kdbench.report import read_curves

    run_dir = Path(run_dir)
    record = json.loads((run_dir / "result.json").read_text())
    stages = record.get("stages") or []
    if not stages:
        raise ConfigError(f"{run_dir}: the record names no stage, so its dev evaluations cannot be found")
    last = stages[-1]
    evaluations = read_curves(run_dir).evals.get(str(last["name"]), [])
    if not evaluations:
        raise ConfigError(f"{run_dir}: stage {last['name']!r} recorded no dev evaluation (loss_terms.jsonl or "
                          "the checkpoints' trainer_state.json), so no evaluation can be re-selected")
    return evaluations, int(last.get("steps") or 0)


def select_evaluation(evaluations: Sequence[Mapping[str, Any]], rule: EvaluationRule, last_step: int,
                      where: str = "run") -> Mapping[str, Any]:
    """The evaluation ``rule`` picks from ``evaluations`` (recorded order); see the module docstring."""
    if not evaluations:
        raise ConfigError(f"{where}: no dev evaluation to select from")
    if rule.kind == LAST:
        final = evaluations[-1]
        if int(final.get("step") or -1) != last_step:
            raise ConfigError(f"{where}: its last dev evaluation is at step {final.get('step')}, not at the end of "
                              f"training (step {last_step}), so rule 'last' has no evaluation to report")
        return final
    if rule.kind != BEST:
        raise ConfigError(f"{where}: rule {rule} does not select from the recorded evaluations")
    missing = [e.get("step") for e in evaluations if not _is_number(e.get(rule.metric))]
    if missing:
        names = sorted({k for e in evaluations for k in e if k != "step"})
        raise ConfigError(f"{where}: rule {rule}: the evaluations at steps {missing} have no {rule.metric!r} "
                          f"(they report {names})")
    best = evaluations[0]
    for evaluation in evaluations[1:]:
        if evaluation[rule.metric] > best[rule.metric]:
            best = evaluation
    return best


def reselect(frame: Any, rules: Mapping[str, EvaluationRule], only: Iterable[Any] | None = None) -> Any:
    """``frame`` (``kdbench.records.load_records``) with the ``metric.*`` columns of each completed
    run whose task has a rule other than ``kept`` replaced by the evaluation that rule picks (all of
    them: a metric that evaluation lacks becomes NaN rather than the kept evaluation's), and the
    picked step in ``evaluation_step``. ``only``: the index labels to consider (default all). Other
    rows are unchanged; the input is not modified. A run with no recorded evaluation is an error
    naming it: pass only the runs a table reports."""
    active = {task: rule for task, rule in rules.items() if rule.kind != KEPT}
    if not active or frame is None or len(frame) == 0 or "task" not in frame:
        return frame
    out = frame.copy()
    if EVALUATION_STEP_COLUMN not in out:
        out[EVALUATION_STEP_COLUMN] = None
    chosen_rows = frame if only is None else frame.loc[list(only)]
    for index, run in chosen_rows.iterrows():
        rule = active.get(str(run.get("task") or "").lower())
        if rule is None or run.get("status") != "completed":
            continue
        where = f"run {run.get('run_dir')} ({run.get('task')}, rule {rule})"
        try:
            evaluations, last_step = recorded_evaluations(Path(run["run_dir"]))
        except (OSError, ValueError) as error:
            raise ConfigError(f"{where}: {error}") from None
        chosen = select_evaluation(evaluations, rule, last_step, where)
        for column in [c for c in out.columns if c.startswith(METRIC_COLUMN_PREFIX)]:
            out.at[index, column] = math.nan  # a metric of the kept evaluation that this one lacks is not mixed in
        for name, value in chosen.items():
            if name == "step":
                continue
            column = METRIC_COLUMN_PREFIX + name
            if column not in out:
                out[column] = math.nan
            out.at[index, column] = value
        out.at[index, EVALUATION_STEP_COLUMN] = chosen.get("step")
    return out


def _is_number(value: Any) -> bool:
    return isinstance(value, int | float) and not (isinstance(value, float) and math.isnan(value))
