"""Shared helpers of the reliability tests (no fixtures: those live in conftest.py)."""

from __future__ import annotations

import shutil
import time
from pathlib import Path

from kdbench.cli import EXIT_BAD_INPUT, main

# Bad input must fail before training: on this 2-core CI machine loading the tiny models takes a
# few seconds; a training run that started would take far longer and leave a checkpoint.
FAIL_FAST_S = 45.0


def cli_error(argv: list[str], capsys, output: Path | None = None) -> str:
    """Run ``kdbench ARGV`` in-process; assert it fails with exit status 2, one error line and no
    checkpoint written, within FAIL_FAST_S. Returns the error message (printed for the report)."""
    capsys.readouterr()
    started = time.monotonic()
    status = main([str(a) for a in argv])
    elapsed = time.monotonic() - started
    captured = capsys.readouterr()
    # A progress bar may share the line (it ends without a newline): take the text after the prefix.
    lines = [line.split("kdbench: error: ", 1)[1] for line in captured.err.splitlines() if "kdbench: error: " in line]
    assert status == EXIT_BAD_INPUT, (status, captured.err[-2000:])
    assert len(lines) == 1, captured.err[-2000:]
    assert elapsed < FAIL_FAST_S, f"took {elapsed:.1f}s: did training start?"
    if output is not None:
        assert not list(Path(output).rglob("checkpoint-*")), "a checkpoint was written: training started"
        assert not list(Path(output).rglob("model.safetensors")), "a model was saved: training started"
    message = lines[0]
    print(f"\n[bad-input] {message}")
    return message


def copy_data(tiny_world, tmp_path: Path) -> Path:
    """A writable copy of the tiny world's data folder, to damage."""
    data = tmp_path / "data"
    shutil.copytree(tiny_world.data_dir, data)
    return data
