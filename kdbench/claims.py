"""Does a paper's claim hold in our measurements? Paired seed differences against seed noise.

A claim says one row beats another ("patient KD beats vanilla KD"). Both rows run with the same
seeds, so the evidence is the per-seed difference of their dev scores: its mean, its sample std and
its standard error. The verdict is deliberately strict:

- ``holds``: the difference is positive on every seed and its mean exceeds twice its standard error;
- ``reversed``: the same, negative;
- ``no signal``: both rows give one and the same score on every seed (e.g. both predict the
  majority class): the runs did not learn what the claim compares, so it is not tested;
- ``within noise``: anything else with at least two seeds;
- ``one seed`` / ``not run``: no estimate of the noise, or no pair of runs at all;
- ``teachers differ``: the two rows' runs read different teacher weights (``weights_sha256`` of
  their records), e.g. one row trained against a teacher retrained on another machine: no verdict.

Used by the reproduction study's claims tables (``kdbench reproduce``) and by ``kdbench quickstart``.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

HOLDS, REVERSED, WITHIN_NOISE, ONE_SEED, NOT_RUN = "holds", "reversed", "within noise", "one seed", "not run"
NO_SIGNAL = "no signal"
TEACHERS_DIFFER = "teachers differ"
READ_WEIGHT_ROLES = ("teacher", "student")  # the ``weights_sha256`` keys of models a run reads, not writes

# The verdicts in one paragraph, printed under every claims table.
VERDICT_LEGEND = (
    "Difference: better − worse per seed (both rows run the same seeds), mean ± sample std, se = std/√n. "
    "Verdict: *holds* / *reversed* when the difference has one sign on every seed and its mean exceeds "
    "twice its standard error; *no signal* when both rows give one and the same score on every seed (e.g. "
    "both predict the majority class: not tested); *within noise* otherwise; *one seed* / *not run* "
    "without a noise estimate; *teachers differ* when the two rows read different teacher weights (no verdict)."
)


@dataclass(frozen=True)
class PairedDifference:
    """``better − worse`` per seed (seeds run by both)."""

    differences: Mapping[Any, float]
    constant: float | None = None  # the one score both rows gave on every shared seed, if they did

    @classmethod
    def of(cls, better: Mapping[Any, float], worse: Mapping[Any, float]) -> PairedDifference:
        seeds = [seed for seed in better if seed in worse]
        scores = {better[seed] for seed in seeds} | {worse[seed] for seed in seeds}
        return cls({seed: better[seed] - worse[seed] for seed in seeds},
                   constant=scores.pop() if len(seeds) >= 2 and len(scores) == 1 else None)

    @property
    def n(self) -> int:
        return len(self.differences)

    @property
    def mean(self) -> float | None:
        return statistics.mean(self.differences.values()) if self.differences else None

    @property
    def std(self) -> float | None:
        return statistics.stdev(self.differences.values()) if self.n >= 2 else None

    @property
    def stderr(self) -> float | None:
        return self.std / math.sqrt(self.n) if self.std is not None else None

    @property
    def verdict(self) -> str:
        if self.n == 0:
            return NOT_RUN
        if self.n == 1:
            return ONE_SEED
        if self.constant is not None:
            return NO_SIGNAL
        values = list(self.differences.values())
        if self.mean > 2 * self.stderr and all(v > 0 for v in values):
            return HOLDS
        if self.mean < -2 * self.stderr and all(v < 0 for v in values):
            return REVERSED
        return WITHIN_NOISE

    def describe(self) -> str:
        """The verdict in a sentence, with the figures behind it."""
        if self.n == 0:
            return "not run: no seed has both runs"
        if self.n == 1:
            return f"one seed ({self.mean:+.2f}): no estimate of the seed noise, so no verdict"
        if self.constant is not None:
            return (f"no signal: both rows score {self.constant:.2f} on all {self.n} seeds (a constant prediction, "
                    "such as the majority class), so the claim is not tested")
        figures = f"mean {self.mean:+.2f} ± {self.std:.2f} over {self.n} seeds, standard error {self.stderr:.2f}"
        return {HOLDS: f"holds: positive on every seed, {figures}",
                REVERSED: f"reversed: negative on every seed, {figures}",
                WITHIN_NOISE: f"within the seed noise: {figures}"}[self.verdict]


@dataclass(frozen=True)
class Claim:
    """A paper's statement that row ``better`` beats row ``worse`` (rows named by their labels)."""

    paper: str
    statement: str
    better: str
    worse: str


def claim_metric(task: str, metrics: Mapping[str, str] | None = None) -> str:
    """The dev metric a claim on ``task`` compares: ``metrics[task]`` (the one the paper's table
    prints, e.g. accuracy for MRPC in TinyBERT's ablation tables), else the task's main metric."""
    from kdbench.plugins import TASKS

    return (metrics or {}).get(task) or TASKS.get(task).spec.main_metric


def scores_by_row(records: Any, metrics: Mapping[str, str] | None = None) -> dict[tuple[str, str], dict[Any, float]]:
    """``{(row label, task): {seed: dev metric}}`` of the completed runs of a records frame, on each
    task's :func:`claim_metric`."""
    scores: dict[tuple[str, str], dict[Any, float]] = {}
    if records is None or len(records) == 0:
        return scores
    for _, run in records.iterrows():
        label = run.get("label")
        if run.get("status") != "completed" or not isinstance(label, str):
            continue
        value = run.get(f"metric.{claim_metric(run['task'], metrics)}")
        if value is None or (isinstance(value, float) and math.isnan(value)):
            continue
        scores.setdefault((label, run["task"]), {})[int(run["seed"])] = float(value)
    return scores


def weights_read(runs: Iterable[Mapping[str, Any]]) -> dict[str, set[str]]:
    """Role (``teacher``, ``student``: the initial student) -> the digests of the weights ``runs`` read
    in that role, from their records' ``weights_sha256`` (records that predate it contribute nothing)."""
    found: dict[str, set[str]] = {}
    for run in runs:
        digests = run.get("weights_sha256")
        if not isinstance(digests, Mapping):
            continue
        for role in READ_WEIGHT_ROLES:
            if isinstance(digests.get(role), str) and digests[role]:
                found.setdefault(role, set()).add(digests[role])
    return found


def teacher_weights_by_row(records: Any) -> dict[tuple[str, str], set[str]]:
    """``{(row label, task): {teacher weights digest}}`` of the completed runs that recorded one
    (records written before ``weights_sha256`` existed contribute nothing)."""
    found: dict[tuple[str, str], set[str]] = {}
    if records is None or len(records) == 0 or "weights_sha256" not in records.columns:
        return found
    for _, run in records.iterrows():
        label = run.get("label")
        if run.get("status") != "completed" or not isinstance(label, str):
            continue
        for digest in weights_read([run]).get("teacher", ()):
            found.setdefault((label, run["task"]), set()).add(digest)
    return found


@dataclass(frozen=True)
class ClaimResult:
    """One claim tested on one task: both rows' seed scores, their paired difference and the verdict."""

    claim: Claim
    task: str
    metric: str
    better: Mapping[Any, float]
    worse: Mapping[Any, float]
    difference: PairedDifference
    verdict: str


def claim_results(claims: Sequence[Claim], records: Any, tasks: Sequence[str],
                  applies: Callable[[Claim, str], bool] | None = None,
                  metrics: Mapping[str, str] | None = None) -> list[ClaimResult]:
    """Each claim on each task, in that order, on the task's :func:`claim_metric` (``metrics``: task
    -> the paper's metric where it is not the main one); ``applies(claim, task)`` leaves out the tasks
    a claim's rows do not run on (default: none). Rows whose runs read more than one teacher's weights
    get ``teachers differ`` instead of a verdict."""
    scores, teachers = scores_by_row(records, metrics), teacher_weights_by_row(records)
    results = []
    for claim in claims:
        for task in tasks:
            if applies is not None and not applies(claim, task):
                continue
            better, worse = scores.get((claim.better, task), {}), scores.get((claim.worse, task), {})
            difference = PairedDifference.of(better, worse)
            read = teachers.get((claim.better, task), set()) | teachers.get((claim.worse, task), set())
            verdict = TEACHERS_DIFFER if len(read) > 1 and difference.n > 0 else difference.verdict
            results.append(ClaimResult(claim, task, claim_metric(task, metrics), better, worse, difference, verdict))
    return results


def claims_table(claims: Sequence[Claim], records: Any, tasks: Sequence[str],
                 applies: Callable[[Claim, str], bool] | None = None,
                 metrics: Mapping[str, str] | None = None) -> str:
    """Markdown: one line per claim and task (see :func:`claim_results`), with both rows' mean ± std
    and the paired verdict."""
    return format_claims(claim_results(claims, records, tasks, applies, metrics))


def format_claims(results: Sequence[ClaimResult]) -> str:
    """Markdown: one line per :class:`ClaimResult`."""
    lines = ["| paper | claim | task | metric | better row | worse row | difference (paired) | verdict |",
             "|---|---|---|---|---|---|---|---|"]
    for result in results:
        claim = result.claim
        lines.append(f"| {claim.paper} | {claim.statement} | {result.task} | {result.metric} | "
                     f"{claim.better} {_mean_std(result.better)} | "
                     f"{claim.worse} {_mean_std(result.worse)} | {_difference(result.difference)} | {result.verdict} |")
    return "\n".join(lines)


def format_comparison(results: Sequence[ClaimResult]) -> str:
    """Markdown: one line per task of one claim (``kdbench compare``), the rows named in the header."""
    if not results:
        return "(nothing compared)"
    claim = results[0].claim
    lines = [f"| task | metric | {claim.better} | {claim.worse} | difference (paired) | verdict |",
             "|---|---|---|---|---|---|"]
    lines += [f"| {r.task} | {r.metric} | {_mean_std(r.better)} | {_mean_std(r.worse)} | {_difference(r.difference)} | "
              f"{r.verdict} |" for r in results]
    return "\n".join(lines)


def _mean_std(values: Mapping[Any, float]) -> str:
    if not values:
        return "(not run)"
    if len(values) == 1:
        return f"{next(iter(values.values())):.2f} (1 seed)"
    return f"{statistics.mean(values.values()):.2f} ± {statistics.stdev(values.values()):.2f} ({len(values)} seeds)"


def _difference(difference: PairedDifference) -> str:
    if difference.n == 0:
        return "–"
    if difference.n == 1:
        return f"{difference.mean:+.2f} (1 seed)"
    return f"{difference.mean:+.2f} ± {difference.std:.2f} (se {difference.stderr:.2f})"
