"""File reading and row validation shared by the task adapters."""

from __future__ import annotations

import csv
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from kdbench.errors import DataError

__all__ = ["DataError", "BadRows", "read_tsv_lines", "read_named_rows", "require_file"]


class BadRows:
    """Raises :class:`DataError` on a malformed row, or counts it when ``on_bad_row == "skip"``."""

    def __init__(self, on_bad_row: str = "error") -> None:
        if on_bad_row not in ("error", "skip"):
            raise ValueError(f"on_bad_row must be 'error' or 'skip', got {on_bad_row!r}")
        self.skip = on_bad_row == "skip"
        self.count = 0
        self.examples: list[str] = []

    def __call__(self, where: str, problem: str) -> None:
        message = f"{where}: {problem}"
        if not self.skip:
            raise DataError(message + " (set on_bad_row=skip to drop malformed rows)")
        self.count += 1
        if len(self.examples) < 5:
            self.examples.append(message)


def require_file(path: Path, what: str = "data file") -> Path:
    path = Path(path)
    if not path.is_file():
        raise DataError(f"{what} {str(path)!r} does not exist")
    return path


def read_tsv_lines(path: Path) -> Iterator[tuple[int, list[str]]]:
    """``(line_number, fields)`` for each non-blank line, split on tabs with no quote handling (as
    GLUE's own processors read with ``quotechar=None``). A UTF-8 byte-order mark is dropped."""
    path = require_file(path)
    with open(path, encoding="utf-8-sig", newline="") as handle:
        for number, line in enumerate(handle, start=1):
            line = line.rstrip("\n").rstrip("\r")
            if line.strip() == "":
                continue
            yield number, line.split("\t")


def read_named_rows(path: Path) -> tuple[list[str], list[tuple[int, dict[str, Any]]]]:
    """Rows of a file with named columns: ``.tsv`` (header line), ``.csv`` (header line), ``.json``
    (a list of objects, or ``{"data": [...]}``) or ``.jsonl``. Returns the column names and
    ``(line_or_row_number, row)`` pairs."""
    path = require_file(path)
    suffix = path.suffix.lower()
    if suffix in (".tsv", ".csv"):
        lines = list(read_tsv_lines(path)) if suffix == ".tsv" else _read_csv(path)
        if not lines:
            raise DataError(f"{path}: the file is empty")
        (_, header), *body = lines
        header = [h.strip() for h in header]
        rows = []
        for number, fields in body:
            if len(fields) != len(header):
                rows.append((number, {"__bad__": f"expected {len(header)} columns, found {len(fields)}"}))
            else:
                rows.append((number, dict(zip(header, fields))))
        return header, rows
    if suffix in (".json", ".jsonl"):
        with open(path, encoding="utf-8") as handle:
            text = handle.read()
        try:
            if suffix == ".jsonl":
                records = [json.loads(line) for line in text.splitlines() if line.strip()]
            else:
                loaded = json.loads(text)
                records = loaded.get("data", loaded) if isinstance(loaded, dict) else loaded
        except json.JSONDecodeError as error:
            raise DataError(f"{path}: not valid JSON ({error})") from None
        if not isinstance(records, list) or not all(isinstance(r, dict) for r in records):
            raise DataError(f"{path}: expected a list of objects with named fields")
        columns = sorted({key for record in records for key in record})
        return columns, [(i + 1, record) for i, record in enumerate(records)]
    raise DataError(f"{path}: unsupported file type {suffix!r} (use .tsv, .csv, .json or .jsonl)")


def _read_csv(path: Path) -> list[tuple[int, list[str]]]:
    with open(path, encoding="utf-8-sig", newline="") as handle:
        reader = csv.reader(handle)
        return [(reader.line_num, row) for row in reader if row]
