"""What a long run leaves behind and shows while it trains.

- ``RUN/loss_terms.jsonl``: one JSON object per logged step,
  ``{"stage", "step", "epoch", "lr", "loss", "window_steps", "<term>": value, ...}`` (each value the
  mean over the ``window_steps`` training steps since the previous line), and one per evaluation,
  ``{"stage", "step", "eval": {metric: value}}`` (the file other tools plot loss curves from);
- ``RUN/train.log``: the run's log (stage starts, one line per logged step with the loss terms, each
  evaluation, each checkpoint, resumes, warnings of the libraries);
- a progress bar per stage whose postfix holds the running loss terms and the last dev score,
  replacing ``Trainer``'s bar that printed each log as a dict of strings;
- checkpoints on a wall-clock interval (``train.checkpoint_minutes``) besides those at evaluations,
  so a killed run loses at most that interval.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from transformers import TrainerCallback

from kdbench.console import RUN_LOGGER
from kdbench.loss_log import LOSS_TERMS_FILE, WINDOW_STEPS, eval_metrics_of, loss_terms_of, read_loss_lines
from kdbench.records import default_file_mode

LOG_FILE = "train.log"

_LOG_FORMAT = "%(asctime)s %(levelname)s %(name)s: %(message)s"


@contextlib.contextmanager
def run_log_file(run_dir: Path) -> Iterator[Path]:
    """Append every log record of the block (kdbench's and the libraries') to ``RUN/train.log``."""
    path = Path(run_dir) / LOG_FILE
    path.parent.mkdir(parents=True, exist_ok=True)
    handler = logging.FileHandler(path, encoding="utf-8")
    handler.setFormatter(logging.Formatter(_LOG_FORMAT))
    handler.setLevel(logging.INFO)
    root, run_logger = logging.getLogger(), logging.getLogger(RUN_LOGGER)
    run_logger.propagate = False
    run_logger.setLevel(logging.INFO)
    root.addHandler(handler)
    run_logger.addHandler(handler)
    try:
        yield path
    finally:
        root.removeHandler(handler)
        run_logger.removeHandler(handler)
        handler.close()


class LossTermsFile:
    """``RUN/loss_terms.jsonl``, appended line by line (flushed, so a kill loses no finished line)."""

    def __init__(self, run_dir: Path):
        self.path = Path(run_dir) / LOSS_TERMS_FILE

    def drop_after(self, stage: str, step: int) -> None:
        """Forget the lines of ``stage`` after ``step``: a resumed stage logs those steps again."""
        if not self.path.is_file():
            return
        kept = [line for line, entry in read_loss_lines(self.path)
                if not (entry.get("stage") == stage and int(entry.get("step", 0)) > step)]
        tmp = self.path.with_name(f".{self.path.name}.tmp")
        tmp.write_text("".join(f"{line}\n" for line in kept), encoding="utf-8")
        os.replace(tmp, self.path)

    def stage_lines(self, stage: str) -> list[dict[str, Any]]:
        """The logged lines of ``stage`` (not its evaluations), in the order they were written."""
        return [entry for _, entry in read_loss_lines(self.path) if entry.get("stage") == stage and "loss" in entry]

    def append(self, entry: dict[str, Any]) -> None:
        fd = os.open(self.path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, default_file_mode())
        with os.fdopen(fd, "a", encoding="utf-8") as handle:
            handle.write(json.dumps(entry) + "\n")


def _format_terms(terms: dict[str, float]) -> str:
    return ", ".join(f"{name} {value:.4g}" for name, value in terms.items())


class StageProgress(TrainerCallback):
    """Progress bar + log lines + ``loss_terms.jsonl`` for one stage (replaces ``ProgressCallback``)."""

    def __init__(self, stage: str, run_dir: Path, main_metric: str | None, show_bar: bool = True):
        self.stage = stage
        self.terms_file = LossTermsFile(run_dir)
        self.main_metric = main_metric
        self.show_bar = show_bar
        self.bar: Any = None
        self.last_terms: dict[str, float] = {}
        self.last_eval: dict[str, float] = {}
        self.best: float | None = None
        self.last_lr = 0.0
        self.log = logging.getLogger(RUN_LOGGER)

    def _say(self, message: str) -> None:
        self.log.info(message)
        if self.bar is not None:
            self.bar.write(f"[kdbench] {message}")
        else:
            print(f"[kdbench] {message}", flush=True)

    def on_train_begin(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        if not state.is_world_process_zero:
            return
        self.terms_file.drop_after(self.stage, state.global_step)
        if self.show_bar:
            from tqdm.auto import tqdm

            self.bar = tqdm(total=state.max_steps, initial=state.global_step, desc=self.stage, dynamic_ncols=True,
                            mininterval=1.0)
        self.log.info("stage %s: %s steps%s", self.stage, state.max_steps,
                      f", resumed at step {state.global_step}" if state.global_step else "")

    def on_step_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        if self.bar is not None:
            self.bar.update(state.global_step - self.bar.n)

    def on_log(self, args: Any, state: Any, control: Any, logs: dict[str, Any] | None = None, **kwargs: Any) -> None:
        if not state.is_world_process_zero or not logs:
            return
        terms = loss_terms_of(logs)
        metrics = eval_metrics_of(logs)
        if terms:
            loss = logs.get("loss")
            if loss is None:  # the end-of-training summary: the steps after the last periodic log
                loss = sum(terms.values())
            self.last_lr = float(logs.get("learning_rate", self.last_lr))
            entry = {"stage": self.stage, "step": state.global_step, "epoch": round(float(state.epoch or 0.0), 4),
                     "lr": self.last_lr, "loss": float(loss), **terms}
            if isinstance(logs.get(WINDOW_STEPS), int):
                entry[WINDOW_STEPS] = logs[WINDOW_STEPS]
            self.terms_file.append(entry)
            self.last_terms = terms
            self._say(f"{self.stage} step {state.global_step}/{state.max_steps} epoch {entry['epoch']:.2f} "
                      f"loss {entry['loss']:.4g} ({_format_terms(terms)}) lr {entry['lr']:.3g}")
        if metrics:
            self.terms_file.append({"stage": self.stage, "step": state.global_step, "eval": metrics})
            self.last_eval = metrics
            score = metrics.get(self.main_metric) if self.main_metric else None
            if score is not None:
                self.best = score if self.best is None else max(self.best, score)
            best = f" (best {self.best:.4g})" if score is not None else ""
            self._say(f"{self.stage} step {state.global_step} eval {_format_terms(metrics)}{best}")
        if self.bar is not None and (terms or metrics):
            postfix = {name: f"{value:.4g}" for name, value in self.last_terms.items()}
            if self.main_metric and self.main_metric in self.last_eval:
                postfix[f"dev {self.main_metric}"] = f"{self.last_eval[self.main_metric]:.4g}"
            self.bar.set_postfix(postfix, refresh=False)

    def on_save(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        if state.is_world_process_zero:
            self.log.info("stage %s: checkpoint at step %s", self.stage, state.global_step)

    def on_train_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        if self.bar is not None:
            self.bar.close()
            self.bar = None


class TimedCheckpoints(TrainerCallback):
    """Save a checkpoint whenever ``minutes`` of wall-clock time passed since the last one (besides
    the checkpoints saved at evaluations), so a killed run loses at most that much training."""

    def __init__(self, minutes: float):
        self.seconds = minutes * 60.0
        self.last = time.monotonic()

    def on_train_begin(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        self.last = time.monotonic()

    def on_step_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> Any:
        if self.seconds > 0 and time.monotonic() - self.last >= self.seconds:
            control.should_save = True
        return control

    def on_save(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        self.last = time.monotonic()
