"""Worker side of the fault-injection test: one process runs one sweep cell (like a sweep job).

Imported by a multiprocessing fork server that has already imported the engine, so a worker starts
in milliseconds and the test can afford dozens of kill -9s. Kept free of pytest imports.
"""

from __future__ import annotations

import os
import sys
import time
from typing import Any



def noop() -> None:
    """Starts the fork server (and its engine import) before any timing starts."""


def run_cell(values: dict[str, Any], log_path: str) -> None:
    """Run one cell with ``run_experiment`` (resuming whatever an earlier, killed attempt left)."""
    import torch

    from kdbench.config import build_run_config
    from kdbench.engine import run_experiment

    log = os.open(log_path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
    os.dup2(log, 1)
    os.dup2(log, 2)
    sys.stdout = os.fdopen(1, "w", buffering=1)
    sys.stderr = os.fdopen(2, "w", buffering=1)
    torch.set_num_threads(1)
    print(f"[worker {os.getpid()}] start {time.time():.2f}", flush=True)
    run_experiment(build_run_config(dict(values)))
    print(f"[worker {os.getpid()}] done {time.time():.2f}", flush=True)
