"""Disk use of run folders, and pruning what a finished run no longer needs.

A run needs its checkpoints only while it can still be resumed. Once a stage has finished, its
``final/`` weights let a repeated run skip it; once the whole run has completed, ``model/`` (the
best student) and ``result.json`` are all anything reads. ``train.keep_checkpoints`` says what a
stage keeps when it ends (default ``last``: the last checkpoint, to continue training from);
``kdbench prune RUNS`` removes the checkpoints and stage weights of completed runs.
"""

from __future__ import annotations

import argparse
import json
import re
import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import Any

CHECKPOINT = re.compile(r"^checkpoint-(\d+)$")
STAGES_DIR = "stages"
STAGE_FINAL = "final"


def folder_bytes(folder: Path) -> int:
    """Bytes of the regular files under ``folder`` (links not followed)."""
    total = 0
    for path in Path(folder).rglob("*"):
        try:
            if path.is_file() and not path.is_symlink():
                total += path.stat().st_size
        except OSError:  # removed while walking (a checkpoint rotation)
            continue
    return total


def free_disk_bytes(folder: Path) -> int:
    """Free bytes on the disk ``folder`` is (or will be) on: its nearest existing ancestor's."""
    existing = Path(folder).absolute()
    while not existing.exists() and existing != existing.parent:
        existing = existing.parent
    return shutil.disk_usage(existing).free


def human_bytes(size: int) -> str:
    value = float(size)
    for unit in ("B", "KB", "MB", "GB"):
        if value < 1000 or unit == "GB":
            return f"{value:.0f} {unit}" if unit == "B" else f"{value:.1f} {unit}"
        value /= 1000
    return f"{value:.1f} TB"  # pragma: no cover


def checkpoints(stage_dir: Path) -> list[Path]:
    """The stage's ``checkpoint-N`` folders, oldest first."""
    found = [(int(m.group(1)), p) for p in Path(stage_dir).glob("checkpoint-*")
             if p.is_dir() and (m := CHECKPOINT.match(p.name))]
    return [p for _, p in sorted(found)]


def prune_stage(stage_dir: Path, keep: str) -> int:
    """After a stage ended: remove its checkpoints except what ``keep`` says (``last``, ``none``,
    ``all``). Returns the bytes freed."""
    found = checkpoints(stage_dir)
    doomed = [] if keep == "all" else found[:-1] if keep == "last" else found
    freed = 0
    for folder in doomed:
        freed += folder_bytes(folder)
        shutil.rmtree(folder, ignore_errors=True)
    return freed


@dataclass
class Pruned:
    run_dir: Path
    freed: int
    remaining: int


def prune_run(run_dir: Path, dry_run: bool = False) -> Pruned | None:
    """Remove the checkpoints and per-stage weights of a COMPLETED run (``model/``, the record, the
    config and the logs stay). None for a run that is not completed (it may still need them)."""
    record = Path(run_dir) / "result.json"
    try:
        completed = json.loads(record.read_text()).get("status") == "completed"
    except (OSError, ValueError):
        completed = False
    if not completed:
        return None
    doomed = []
    for stage_dir in sorted((Path(run_dir) / STAGES_DIR).glob("*")):
        doomed += checkpoints(stage_dir)
        if (stage_dir / STAGE_FINAL).is_dir():
            doomed.append(stage_dir / STAGE_FINAL)
    freed = sum(folder_bytes(folder) for folder in doomed)
    if not dry_run:
        for folder in doomed:
            shutil.rmtree(folder, ignore_errors=True)
    return Pruned(Path(run_dir), freed, folder_bytes(run_dir) - (freed if dry_run else 0))


def cmd_prune(args: argparse.Namespace) -> int:
    from kdbench.records import find_records

    total = 0
    for record in find_records(Path(args.runs)):
        pruned = prune_run(record.parent, dry_run=args.dry_run)
        if pruned is None:
            print(f"kept     {record.parent} (not completed)")
            continue
        total += pruned.freed
        verb = "would free" if args.dry_run else "freed"
        print(f"{verb} {human_bytes(pruned.freed):>9}  {pruned.run_dir} (now {human_bytes(pruned.remaining)})")
    print(f"{'would free' if args.dry_run else 'freed'} {human_bytes(total)} in all")
    return 0


def add_command(subparsers: Any) -> None:
    prune = subparsers.add_parser("prune", help="remove checkpoints of completed runs (keeps model/ and records)")
    prune.add_argument("runs", help="folder of run folders")
    prune.add_argument("--dry-run", action="store_true", help="only say what would be removed")
    prune.set_defaults(handler=cmd_prune)
