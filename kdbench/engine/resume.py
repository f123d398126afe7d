"""What carries a run across its attempts (requeue at a time limit, preemption, a killed job).

- **Status.** A job that submitit requeues leaves its run recorded ``requeued``, not ``failed``:
  :func:`kdbench.launch.graceful_requeue_callback` raises :class:`Requeued` (a ``SystemExit``)
  once the checkpoint is saved and submitit has requeued the job.
- **Time.** ``RUN/attempts.json`` lists every attempt with the seconds it ran, updated at each
  checkpoint and at its end; ``train_seconds`` is their sum. A stage's seconds are kept beside its
  checkpoints (``STAGE/elapsed.json``, seconds at each saved step), so a resumed stage goes on
  counting from the checkpoint it resumes. An attempt killed outright (SIGKILL, node failure)
  counts up to its last checkpoint: the work after it is lost and its redoing is counted again.
  It could not write how it ended; the next attempt, which holds the run lock it lost, records it
  ``killed``.
- **Provenance.** Each attempt also names the kdbench revision and machine it ran on. A record
  names the last attempt's; where attempts differ (a run resumed after a ``git pull``, or requeued
  onto another node type) :meth:`RunClock.mixed_provenance` lists each one, for the record.
- **Data order.** ``Trainer`` restores the Python, NumPy and torch RNG states of a checkpoint and
  skips the batches already seen in the resumed epoch, but its length-grouped sampler draws each
  epoch's order from the global torch RNG when the epoch starts, a state a resumed run never had:
  resumed in a later epoch than the first, it trained on other batches than the uninterrupted run.
  :class:`EpochSeededLengthGroupedSampler` draws the order from ``seed + epoch`` alone (as
  accelerate's seedable sampler does for the plain random order), so a resumed run is bit-exact on
  CPU: same batches, same dropout masks, same final weights.
"""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

import torch
from transformers import TrainerCallback
from transformers.trainer_pt_utils import LengthGroupedSampler, get_length_grouped_indices

from kdbench.records import write_json_atomic

REQUEUED = "requeued"
FAILED = "failed"
KILLED = "killed"  # an attempt that ended without recording how: SIGKILL, OOM killer, a lost node
ATTEMPTS_FILE = "attempts.json"
STAGE_ELAPSED_FILE = "elapsed.json"


class Requeued(SystemExit):
    """The job was checkpointed and requeued by submitit; the process exits and the run resumes
    in the requeued job."""


def interrupted_status(error: BaseException) -> str:
    """The record status of a run that ended by ``error``: ``requeued`` or ``failed``."""
    return REQUEUED if isinstance(error, Requeued) else FAILED


def _read_json(path: Path, default: Any) -> Any:
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return default


class RunClock:
    """Seconds a run has spent over all its attempts, kept in ``RUN/attempts.json``.

    Made by the process that holds the run lock, so an earlier attempt still without an end was
    killed before it could record one: it is marked :data:`KILLED`."""

    def __init__(self, run_dir: Path, writer: bool = True, provenance: dict[str, Any] | None = None):
        self.path = Path(run_dir) / ATTEMPTS_FILE
        self.writer = writer
        previous = _read_json(self.path, {}).get("attempts", [])
        self.attempts: list[dict[str, Any]] = [a for a in previous if isinstance(a, dict)]
        for attempt in self.attempts:
            if attempt.get("ended") is None:
                attempt["ended"] = KILLED
        self.attempts.append({"started_at": time.strftime("%Y-%m-%dT%H:%M:%S%z"), "seconds": 0.0, "ended": None,
                              **(provenance or {})})
        self.started = time.perf_counter()
        self.save()

    @property
    def count(self) -> int:
        return len(self.attempts)

    def mixed_provenance(self, keys: tuple[str, ...] = ("kdbench_revision", "machine")) -> list[dict[str, Any]]:
        """Every attempt's ``keys`` (with its start and seconds) when the attempts do not all agree on
        them; else ``[]``. An attempt of a kdbench that did not record them counts as unknown (None),
        which differs from any that did: a run started before an upgrade and resumed after it."""
        if len({json.dumps([a.get(key) for key in keys], sort_keys=True) for a in self.attempts}) <= 1:
            return []
        return [{"attempt": i, "started_at": a.get("started_at"), "seconds": a.get("seconds"),
                 **{key: a.get(key) for key in keys}} for i, a in enumerate(self.attempts, start=1)]

    def total_seconds(self) -> float:
        """The seconds of every attempt, this one's as of the last :meth:`save`."""
        return round(sum(float(a.get("seconds") or 0.0) for a in self.attempts), 2)

    def save(self, ended: str | None = None) -> None:
        """Record this attempt's seconds so far (and how it ended, when it has)."""
        self.attempts[-1].update(seconds=round(time.perf_counter() - self.started, 2), ended=ended)
        if self.writer:
            write_json_atomic(self.path, {"attempts": self.attempts})


def stage_seconds_at(stage_dir: Path, checkpoint: str | None) -> float:
    """Training seconds a stage had spent when ``checkpoint`` (``.../checkpoint-N``) was saved."""
    if not checkpoint:
        return 0.0
    step = int(str(checkpoint).rstrip("/").rsplit("-", 1)[-1])
    entries = {int(k): float(v) for k, v in _read_json(Path(stage_dir) / STAGE_ELAPSED_FILE, {}).items()}
    earlier = [s for s in entries if s <= step]  # a kill between the checkpoint and its entry: the one before
    return entries[max(earlier)] if earlier else 0.0


class StageClock(TrainerCallback):
    """A stage's training seconds across attempts, written beside every checkpoint it saves.

    Put it before callbacks that may end the process in ``on_save`` (the graceful requeue).
    """

    def __init__(self, stage_dir: Path, checkpoint: str | None, run_clock: RunClock | None = None,
                 writer: bool = True):
        self.stage_dir = Path(stage_dir)
        self.prior = stage_seconds_at(self.stage_dir, checkpoint)
        self.run_clock = run_clock
        self.writer = writer
        self.started = time.perf_counter()

    def seconds(self) -> float:
        return self.prior + time.perf_counter() - self.started

    def on_save(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        if not self.writer:
            return
        path = self.stage_dir / STAGE_ELAPSED_FILE
        entries = _read_json(path, {})
        entries[str(state.global_step)] = round(self.seconds(), 3)
        write_json_atomic(path, entries)
        if self.run_clock is not None:
            self.run_clock.save()


class EpochSeededLengthGroupedSampler(LengthGroupedSampler):
    """``LengthGroupedSampler`` whose order in epoch ``e`` depends on ``seed + e`` only."""

    def __init__(self, base: LengthGroupedSampler, seed: int):
        self.__dict__.update(base.__dict__)
        self.seed = int(seed)
        self.epoch = 0

    def set_epoch(self, epoch: int) -> None:  # Trainer calls it at every epoch, resumed ones too
        self.epoch = int(epoch)

    def __iter__(self):
        generator = torch.Generator().manual_seed(self.seed + self.epoch)
        return iter(get_length_grouped_indices(self.lengths, self.batch_size, generator=generator))


def reproducible_sampler(sampler: Any, seed: int) -> Any:
    """``sampler``, with a length-grouped one made a function of (seed, epoch)."""
    if isinstance(sampler, LengthGroupedSampler) and not isinstance(sampler, EpochSeededLengthGroupedSampler):
        return EpochSeededLengthGroupedSampler(sampler, seed)
    return sampler
