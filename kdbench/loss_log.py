"""The contract of ``RUN/loss_terms.jsonl``, the per-step loss log that :mod:`kdbench.engine.run_log`
writes and reports and tables read: its file name, the fields of a logged line besides its loss
terms, how a line's terms and metrics are read out of a Trainer log, how the file is read back, and
the loss a stage ended at. Free of torch and transformers, so readers stay light."""

from __future__ import annotations

import json
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

LOSS_TERMS_FILE = "loss_terms.jsonl"
WINDOW_STEPS = "window_steps"  # in a log and a loss_terms.jsonl line: how many steps its means cover
LOG_LINE_KEYS = ("stage", "step", "epoch", "lr", "loss", WINDOW_STEPS)  # a logged line's fields besides its terms
LOSS_TERM_PREFIX = "loss/"  # in a Trainer log (and a checkpoint's log_history): "loss/<term>"
EVAL_PREFIX = "eval_"


def loss_terms_of(logs: Mapping[str, Any]) -> dict[str, float]:
    """The loss terms of one Trainer log: its ``loss/<term>`` entries, keyed by term."""
    return {key[len(LOSS_TERM_PREFIX):]: float(value) for key, value in logs.items()
            if key.startswith(LOSS_TERM_PREFIX) and isinstance(value, (int, float))}


def eval_metrics_of(logs: Mapping[str, Any]) -> dict[str, float]:
    """The dev metrics of one Trainer log: its ``eval_<metric>`` entries but the runtime, keyed by metric."""
    return {key[len(EVAL_PREFIX):]: float(value) for key, value in logs.items()
            if key.startswith(EVAL_PREFIX) and key != "eval_runtime" and isinstance(value, (int, float))}


def read_loss_lines(path: Path) -> Iterator[tuple[str, dict[str, Any]]]:
    """Each whole line of a ``loss_terms.jsonl`` as written, with its entry, in file order; nothing
    when the file is absent. A line cut short by a kill (not valid JSON) is left out."""
    path = Path(path)
    if not path.is_file():
        return
    for line in path.read_text(encoding="utf-8").splitlines():
        try:
            entry = json.loads(line)
        except ValueError:
            continue
        if isinstance(entry, dict):
            yield line, entry


def last_epoch_loss_terms(entries: Sequence[Mapping[str, Any]]) -> tuple[dict[str, float], int]:
    """Per-term means over a stage's last epoch, and the number of training steps they cover.

    ``entries``: one stage's logged lines of ``loss_terms.jsonl``, in step order. Each line's terms
    are means over its window, so the result weights each line by its ``window_steps`` (for lines
    written before that field, the steps since the previous line). The span is the last epoch, or the
    second half of a stage that trains under two epochs; a line counts when its window ends inside
    the span, so the span is exact to one logging window.

    Why not the last logged line: when the step count is not a multiple of ``logging_steps``, that
    line averages a short tail of the epoch, and a length-grouped sampler ends each megabatch on its
    shortest rows, so the tail reads low (TinyBERT's intermediate loss on augmented SST-2: 1.84 over
    the last 15 steps against 2.72 over the last epoch)."""
    logged = [entry for entry in entries if isinstance(entry.get("loss"), (int, float))]
    if not logged:
        return {}, 0
    end = float(logged[-1].get("epoch") or 0.0)
    start = end - min(1.0, end / 2)
    sums: dict[str, float] = {}
    covered, previous_step = 0, 0
    for entry in logged:
        step = int(entry.get("step") or 0)
        weight = int(entry.get(WINDOW_STEPS) or step - previous_step)
        previous_step = step
        if float(entry.get("epoch") or 0.0) <= start or weight <= 0:
            continue
        covered += weight
        for name, value in entry.items():
            if name not in LOG_LINE_KEYS and isinstance(value, (int, float)):
                sums[name] = sums.get(name, 0.0) + weight * float(value)
    return {name: total / covered for name, total in sums.items()} if covered else {}, covered
