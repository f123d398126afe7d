"""Fixtures for the sweep tests that need no cluster."""

from __future__ import annotations

import os

import pytest


@pytest.fixture
def srun_on_path(tmp_path, monkeypatch):
    """A stand-in ``srun`` on PATH: submitit builds a Slurm executor only where ``srun`` exists, and
    these tests render sbatch options without submitting, on machines with or without Slurm."""
    folder = tmp_path / "fake-bin"
    folder.mkdir()
    srun = folder / "srun"
    srun.write_text("#!/bin/sh\nexit 0\n")
    srun.chmod(0o755)
    monkeypatch.setenv("PATH", f"{folder}{os.pathsep}{os.environ.get('PATH', '')}")
