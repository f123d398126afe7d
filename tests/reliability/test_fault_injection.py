"""Kill -9 at random moments: no completed record is ever lost or half-written, and resuming
finishes every cell while re-running none that had completed.

A small sweep (kd x seeds x alpha on the tiny world, 6 cells, grown if it finishes before the kill
quota) runs with two worker processes at a time,
one process per cell as a sweep's local executor does. A seeded schedule SIGKILLs workers at
random moments (model loading, training steps, checkpoint saves, record writes) until at least
``KILLS`` kills happened; killed cells are simply started again (the resume) until all complete.
"""

from __future__ import annotations

import collections
import json
import multiprocessing
import random
import statistics
import sys
import time
from pathlib import Path

import pytest

from kdbench.records import RESULT_FILE, read_record

KILLS = 22
PARALLEL = 2
SEED = 20261123
TIME_LIMIT_S = 240
CELLS = 6  # the sweep; grown two cells at a time (up to MAX_CELLS) only if it finishes before KILLS kills
MAX_CELLS = 40  # enough that a fast machine still reaches the kill quota
LATE_KILL_SHARE = 0.3  # share of kills aimed at the end of a run (final save, result.json write)
LATE = "final save and record write"

HERE = Path(__file__).resolve().parent


def _cells(world, output: Path) -> list[dict]:
    cells = []
    for seed in range(1, 1 + MAX_CELLS // 2):
        for alpha in ("0.5", "0.9"):
            cells.append({
                "method": "kd", "task": "sst2", "teacher": str(world.teacher), "student": str(world.student),
                "output": str(output), "data_dir": str(world.data_dir), "seed": str(seed), "alpha": alpha,
                "max_steps": "2", "batch_size": "4", "eval_batch_size": "16", "max_seq_length": "16",
                "eval_steps": "1", "logging_steps": "1", "precision": "fp32", "train.save_total_limit": "2",
            })
    return cells


def _run_dir(values: dict) -> Path:
    from kdbench.config import build_run_config
    from kdbench.engine import plan_run

    return plan_run(build_run_config(dict(values))).run_dir


def _phase(log: Path, pid: int) -> str:
    """Where a killed worker was, from its log: the part written by that process only."""
    text = log.read_text() if log.is_file() else ""
    marker = f"[worker {pid}] start"
    if marker not in text:
        return "startup"
    text = text.split(marker, 1)[1]
    if "[kdbench] stage 0" not in text:
        return "setup (data, models, resume)"
    if "train_runtime" not in text:
        return "training and checkpoint saves"
    return LATE


def _completed_bytes(run_dir: Path) -> bytes | None:
    """The record's bytes when the cell has completed; asserts any existing record is whole."""
    path = run_dir / RESULT_FILE
    if not path.is_file():
        return None
    data = path.read_bytes()
    record = json.loads(data)  # a half-written record would fail here
    read_record(path)  # and must satisfy the schema
    return data if record["status"] == "completed" else None


@pytest.mark.slow
def test_kill_9_at_random_moments_loses_nothing(tiny_world, tmp_path):
    if str(HERE) not in sys.path:
        sys.path.insert(0, str(HERE))
    import fault_worker

    context = multiprocessing.get_context("forkserver")
    # The fork server imports the engine once; each worker then forks from it in ~0.1 s. (Preload
    # only modules importable from the default path: Python 3.11's fork server ignores sys.path.)
    context.set_forkserver_preload(["kdbench.engine", "kdbench.tasks.glue", "kdbench.methods.kd"])
    warm = context.Process(target=fault_worker.noop)
    warm.start()
    warm.join()
    output = tmp_path / "sweep"
    all_cells = _cells(tiny_world, output)
    all_run_dirs = [_run_dir(values) for values in all_cells]
    assert len(set(all_run_dirs)) == len(all_cells)
    cells, run_dirs = all_cells[:CELLS], all_run_dirs[:CELLS]
    logs = tmp_path / "logs"
    logs.mkdir()

    rng = random.Random(SEED)
    completed: dict[int, bytes] = {}
    running: dict[int, tuple[multiprocessing.Process, float | None]] = {}
    kills = attempts = 0
    kill_delays: list[float] = []
    lifetimes: list[float] = []  # seconds a worker needs when nobody kills it
    launched: dict[int, float] = {}
    phases: collections.Counter[str] = collections.Counter()
    unexpected_exits: list[str] = []
    started = time.monotonic()
    try:
        while len(completed) < len(cells) or (kills < KILLS and len(cells) < MAX_CELLS):
            if len(completed) == len(cells):  # finished too early for the kill quota: grow the sweep
                cells, run_dirs = all_cells[:len(cells) + 2], all_run_dirs[:len(cells) + 2]
            assert time.monotonic() - started < TIME_LIMIT_S, (
                f"sweep did not finish: {len(completed)}/{len(cells)} cells, {kills} kills")
            # Start workers for unfinished cells that nobody is running (the resume).
            for index in range(len(cells)):
                if len(running) >= PARALLEL:
                    break
                if index in completed or index in running:
                    continue
                process = context.Process(target=fault_worker.run_cell,
                                          args=(cells[index], str(logs / f"cell{index}.log")))
                process.start()
                attempts += 1
                deadline = None
                if kills + sum(d is not None for _, d in running.values()) < KILLS:
                    if rng.random() < LATE_KILL_SHARE:
                        # Aimed at the end: the final save and the record write.
                        deadline = -rng.uniform(0.0, 0.6)
                    else:
                        # Uniform over a typical worker lifetime, so kills land in every phase.
                        delay = rng.uniform(0.05, statistics.median(lifetimes) if lifetimes else 6.0)
                        kill_delays.append(delay)
                        deadline = time.monotonic() + delay
                running[index] = (process, deadline)
                launched[index] = time.monotonic()
            time.sleep(0.02)
            for index, (process, deadline) in list(running.items()):
                if deadline is not None and deadline <= 0 and _phase(logs / f"cell{index}.log", process.pid) == LATE:
                    deadline = time.monotonic() - deadline  # training ended: kill within the next 0.6 s
                    running[index] = (process, deadline)
                if process.is_alive() and deadline is not None and deadline > 0 and time.monotonic() >= deadline:
                    process.kill()
                    process.join()
                    kills += 1
                    phases[_phase(logs / f"cell{index}.log", process.pid)] += 1
                elif process.is_alive():
                    continue
                process.join()
                del running[index]
                if process.exitcode == 0:
                    lifetimes.append(time.monotonic() - launched[index])
                if process.exitcode not in (0, -9):
                    unexpected_exits.append(f"cell {index} exit {process.exitcode}: "
                                            + (logs / f"cell{index}.log").read_text()[-2000:])
                # After every exit: every record on disk is whole, and no completed one changed.
                for other, run_dir in enumerate(run_dirs):
                    data = _completed_bytes(run_dir)
                    if other in completed:
                        assert data == completed[other], f"completed record of cell {other} was rewritten or lost"
                    elif data is not None:
                        completed[other] = data
    finally:
        for process, _ in running.values():  # never leave workers behind, even when failing
            process.kill()
            process.join()
    elapsed = time.monotonic() - started

    # A final resume pass trains nothing: every cell reports "already completed" and no record changes.
    from kdbench.config import build_run_config
    from kdbench.engine import run_experiment

    for values in cells:
        run_experiment(build_run_config(dict(values)))
    records = sorted(output.rglob(RESULT_FILE))
    lost = [i for i, run_dir in enumerate(run_dirs) if (run_dir / RESULT_FILE).read_bytes() != completed[i]]
    leftover_temp = sorted(p.name for p in output.rglob(f".{RESULT_FILE}.*.tmp"))
    print(f"\nfault injection: kills={kills} attempts={attempts} cells={len(cells)} records={len(records)} "
          f"completed={len(completed)} lost={len(lost)} unexpected_exits={len(unexpected_exits)} "
          f"leftover_temp_files={len(leftover_temp)} kill_delays_s=[{min(kill_delays):.2f}, "
          f"{max(kill_delays):.2f}] elapsed_s={elapsed:.0f} kills_by_phase={dict(phases)}")
    assert kills >= 20
    assert not unexpected_exits, unexpected_exits[0]
    assert len(records) == len(cells) and not lost
    for path in records:
        record = read_record(path)
        assert record["status"] == "completed" and record["metrics"], path
