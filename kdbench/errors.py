"""Errors shared across kdbench."""

from __future__ import annotations


class DataError(ValueError):
    """A data file is missing, malformed or empty; the message names the file, the line number or
    question id, and the problem."""
