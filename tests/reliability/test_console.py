"""A run outlives whatever reads its console: a closed pipe on stdout/stderr must not fail it."""

from __future__ import annotations

import io
import json
import os
import subprocess
import sys

import pytest

from kdbench.console import DetachableStream


def kdbench_process(args: list[str], **kwargs) -> subprocess.Popen:
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    return subprocess.Popen([sys.executable, "-m", "kdbench", *args], env=env, **kwargs)


def test_a_run_whose_console_reader_is_gone_still_completes(tiny_world, tmp_path):
    # Both pipes are closed before the run writes a byte: every write it makes hits a dead reader.
    process = kdbench_process(tiny_world.run_args("kd", tmp_path / "runs"), stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE)
    process.stdout.close()
    process.stderr.close()
    assert process.wait(timeout=600) == 0
    (record,) = (tmp_path / "runs").glob("*/result.json")
    assert json.loads(record.read_text())["status"] == "completed"
    assert "step" in (record.parent / "train.log").read_text()  # the log went to the run folder instead


def test_a_listing_cut_short_by_its_reader_exits_cleanly(tmp_path):
    process = kdbench_process(["list", "methods"], stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    process.stdout.close()
    _, err = process.communicate(timeout=120)
    assert process.returncode == 0
    assert b"BrokenPipe" not in err and b"Exception ignored" not in err, err.decode()


class DeadPipe(io.StringIO):
    def write(self, text):
        raise BrokenPipeError(32, "Broken pipe")


class FullDisk(io.StringIO):
    def write(self, text):
        raise OSError(28, "No space left on device")


def test_stream_goes_quiet_on_a_dead_reader_but_not_on_other_errors():
    quiet = DetachableStream(DeadPipe())
    assert quiet.write("progress") == len("progress") and quiet.detached
    assert quiet.write("more") == 4 and not quiet.isatty()
    with pytest.raises(OSError, match="No space"):  # a real fault is not hidden
        DetachableStream(FullDisk()).write("x")
