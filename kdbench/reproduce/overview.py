"""The study at a glance: every claim of every table, one column per task, with its verdict and the
paired difference behind it, the verdicts counted per paper, and the training the records hold.

Rendered from the tables' committed records into ``results/reproduction/verdicts.md`` whenever a
table is rendered into its own records folder, and by ``kdbench reproduce all --render-only``.
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

from kdbench.claims import (HOLDS, NO_SIGNAL, NOT_RUN, ONE_SEED, REVERSED, TEACHERS_DIFFER, VERDICT_LEGEND,
                            WITHIN_NOISE, ClaimResult)
from kdbench.reproduce.records import records_folder, table_claim_results
from kdbench.reproduce.study import MINI, SPEC_FOLDER, TABLE_ROWS, MiniScale

OVERVIEW_FILE = "verdicts.md"
# Tally columns, in the order a reader asks: did it hold, did it flip, was it measured at all.
VERDICT_ORDER = (HOLDS, REVERSED, WITHIN_NOISE, NO_SIGNAL, TEACHERS_DIFFER, ONE_SEED, NOT_RUN)


def render_overview(spec_folder: Path = SPEC_FOLDER, scale: MiniScale = MINI) -> Path:
    """Write :func:`overview_text` to ``spec_folder/verdicts.md``."""
    out = spec_folder / OVERVIEW_FILE
    out.write_text(overview_text(spec_folder, scale))
    return out


def overview_text(spec_folder: Path = SPEC_FOLDER, scale: MiniScale = MINI) -> str:
    """The overview of each table's records in ``spec_folder/TABLE/records``, as markdown."""
    claimed = {table: table_claim_results(table, records_folder(table, spec_folder)) for table in sorted(TABLE_ROWS)}
    results = {table: table_results for table, (table_results, _) in claimed.items()}
    return (overview_markdown(results, scale) + "\n\n"
            + training_summary(frame for _, frame in claimed.values()) + "\n")


def overview_markdown(results: dict[str, Sequence[ClaimResult]], scale: MiniScale = MINI) -> str:
    """The verdict matrix (claims × tasks) and the verdicts counted per paper."""
    from kdbench.tables.specs import MAIN_METRICS

    studied = {task.name for task in scale.tasks}
    tasks = [task for task in MAIN_METRICS if task in studied]
    lines = ["**The papers' claims at kdbench's mini scale** (regenerated from every table's records whenever one "
             "is rendered, e.g. by `kdbench reproduce all --render-only`; each claim is tested on the dev metric its "
             "paper's table prints, seed by seed against the other row; the figures behind a cell are in the "
             "table's `claims.md`, linked)", "",
             "| paper | claim | table | " + " | ".join(MAIN_METRICS[task][0] for task in tasks) + " |",
             "|---|---|---|" + "---|" * len(tasks)]
    for table, table_results in results.items():
        by_claim: dict[Any, dict[str, ClaimResult]] = {}
        for result in table_results:
            by_claim.setdefault(result.claim, {})[result.task] = result
        for claim, on_task in by_claim.items():
            cells = [_cell(on_task[task], len(scale.task(task).seeds)) if task in on_task else "n/a" for task in tasks]
            lines.append(f"| {claim.paper} | {claim.statement} | [{table}]({table}/claims.md) | " + " | ".join(cells) + " |")
    lines += ["", "Cells: the verdict and the mean paired difference (better row − worse row, in points of the "
              "metric); [n/N] = n of the study's N seeds have both runs (the table's footnotes say whether the "
              "others are pending or why they were not run); n/a = the table does not test the "
              "claim on that task (not one of its columns, or one of the two rows does not run on it). "
              + VERDICT_LEGEND, "", _tally(results)]
    return "\n".join(lines)


def _cell(result: ClaimResult, planned_seeds: int) -> str:
    difference = result.difference
    text = f"**{result.verdict}**" if result.verdict in (HOLDS, REVERSED) else result.verdict
    if difference.n > 0 and result.verdict != NO_SIGNAL:
        text += f" {difference.mean:+.2f}"
    if 0 < difference.n < planned_seeds:
        text += f" [{difference.n}/{planned_seeds}]"
    return text


def _tally(results: dict[str, Sequence[ClaimResult]]) -> str:
    """Verdicts counted per paper. A test is a claim's two rows compared on one task and metric with
    the same per-seed scores: a claim that two tables test on the same runs, metric and evaluation
    (BERT-PKD's skip against last in table 1 and in its own Table 2's RTE column, say) is counted
    once; where the tables pick other evaluations (MRPC's accuracy-best one in Table 2) it is two."""
    tests: dict[tuple[Any, ...], str] = {}
    for table_results in results.values():
        for result in table_results:
            key = (result.claim.paper, result.claim.better, result.claim.worse, result.task, result.metric,
                   tuple(sorted(result.better.items())), tuple(sorted(result.worse.items())))
            tests.setdefault(key, result.verdict)
    by_paper: dict[str, Counter[str]] = {}
    for (paper, *_), verdict in tests.items():
        by_paper.setdefault(paper, Counter())[verdict] += 1
    by_paper["all"] = sum(by_paper.values(), Counter())
    lines = ["**Verdicts per paper** (a claim's two rows on one task and metric, with the same scores per seed, "
             "count once, whichever tables print them)", "",
             "| paper | tests | " + " | ".join(VERDICT_ORDER) + " |", "|---|---:|" + "---:|" * len(VERDICT_ORDER)]
    for paper, counts in by_paper.items():
        lines.append(f"| {paper} | {sum(counts.values())} | " + " | ".join(str(counts[v]) for v in VERDICT_ORDER) + " |")
    return "\n".join(lines)


def training_summary(frames: Iterable[Any]) -> str:
    """The training behind the study, from each table's records frame (None: no records): each
    completed training once, however many tables hold its record
    (:func:`kdbench.records.training_identity`)."""
    from kdbench.records import training_identity

    seconds: dict[tuple[str, str], float] = {}
    for frame in frames:
        for _, run in (frame.iterrows() if frame is not None else ()):
            if run.get("status") == "completed":
                value = run.get("train_seconds")  # NaN where a record has none
                seconds[training_identity(run)] = 0.0 if value is None or math.isnan(value) else float(value)
    runs = {name for name, _ in seconds}
    retrained = len(seconds) - len(runs)
    return (f"Compute: {len(seconds)} completed trainings of {len(runs)} runs"
            + (f" ({retrained} of them a second training of a run whose other training another table keeps)"
               if retrained else "")
            + f", {sum(seconds.values()) / 3600:.2f} hours of training (summed `train_seconds`; a run shared by "
              "several tables is counted once). Attempts cut short, stages retrained on fresh machines whose "
              "records were not kept, and check runs outside the records are not counted.")
