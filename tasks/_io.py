"""File reading and row validation shared by the task adapters."""

from __future__ import annotations

import csv
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from kdbench.errors import DataError

__all__ = ["BadRows", "DataError", "read_named_rows", "read_tsv_lines", "require_file", "require_utf8_text"]


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


_OTHER_ENCODINGS = ((b"\xff\xfe\x00\x00", "UTF-32"), (b"\x00\x00\xfe\xff", "UTF-32"), (b"\xff\xfe", "UTF-16"),
                    (b"\xfe\xff", "UTF-16"))


def require_utf8_text(path: Path) -> None:
    """Raise DataError naming the file when it is UTF-16/32 text (by its byte-order mark) or binary
    (a NUL byte in its first block): both would otherwise fail deep inside decoding or tokenising."""
    with open(path, "rb") as handle:
        head = handle.read(1 << 16)
    for mark, encoding in _OTHER_ENCODINGS:
        if head.startswith(mark):
            raise DataError(f"{path}: the file is {encoding} text; save it as UTF-8")
    if b"\x00" in head:
        raise DataError(f"{path}: not a text file (it holds NUL bytes: binary, or UTF-16 without a byte-order mark)")


def _decode_error(path: Path, number: int, error: UnicodeDecodeError) -> DataError:
    return DataError(f"{path}, line {number}: not UTF-8 text (byte {error.object[error.start:error.start + 1]!r}); "
                     "save the file as UTF-8")


def _text_lines(path: Path) -> Iterator[tuple[int, str]]:
    """``(line_number, line)`` of a UTF-8 text file (BOM dropped), decoded line by line so that an
    undecodable line is a DataError naming the file and that line."""
    require_utf8_text(path)
    with open(path, "rb") as handle:
        for number, raw in enumerate(handle, start=1):
            if number == 1 and raw.startswith(b"\xef\xbb\xbf"):
                raw = raw[3:]
            try:
                yield number, raw.decode("utf-8")
            except UnicodeDecodeError as error:
                raise _decode_error(path, number, error) from None


def read_tsv_lines(path: Path) -> Iterator[tuple[int, list[str]]]:
    """``(line_number, fields)`` for each non-blank line, split on tabs with no quote handling (as
    GLUE's own processors read with ``quotechar=None``). A UTF-8 byte-order mark is dropped; a file
    that is not UTF-8 text is a DataError naming it (and the line)."""
    path = require_file(path)
    for number, line in _text_lines(path):
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
        require_utf8_text(path)
        try:
            text = path.read_text(encoding="utf-8-sig")
        except UnicodeDecodeError as error:
            raise _decode_error(path, path.read_bytes()[:error.start].count(b"\n") + 1, error) from None
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
    require_utf8_text(path)
    with open(path, encoding="utf-8-sig", newline="") as handle:
        reader = csv.reader(handle)
        try:
            return [(reader.line_num, row) for row in reader if row]
        except UnicodeDecodeError as error:
            raise _decode_error(path, reader.line_num + 1, error) from None
