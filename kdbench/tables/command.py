"""``kdbench table NAME --runs DIR``."""

from __future__ import annotations

from pathlib import Path

from kdbench.tables.building import build_table
from kdbench.tables.rendering import FORMATS, render


def cmd_table(args) -> int:
    table = build_table(args.name, args.runs or None, latency=args.latency)
    text = render(table, args.format)
    if args.output:
        Path(args.output).parent.mkdir(parents=True, exist_ok=True)
        Path(args.output).write_text(text)
    print(text, end="")
    return 0


def add_command(subparsers) -> None:
    parser = subparsers.add_parser("table", help="a paper-style table: published numbers beside measured ones "
                                                 "(kdbench list tables)")
    parser.add_argument("name", help="table name (kdbench list tables) or a spec YAML file")
    parser.add_argument("--runs", action="append", default=[],
                        help="folder of result records (repeatable); omit for the published numbers alone")
    parser.add_argument("--format", default="markdown", choices=FORMATS)
    parser.add_argument("--output", help="also write the rendered table to this file")
    parser.add_argument("--latency", action="store_true",
                        help="time the runs' models on this machine for the speed-up column (slow on CPU)")
    parser.set_defaults(handler=cmd_table)
