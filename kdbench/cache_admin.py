"""``kdbench cache``: what the teacher-output cache holds, and evicting it.

The cache (:mod:`kdbench.cache`) adds a folder for every new (teacher weights, tokenised training
set, max length, augmentation, precision): a sweep over tasks and teachers leaves one per teacher
and task, hidden states and attention scores included, and nothing ever removes them. ``kdbench
cache list`` shows each folder's size, key and when a stage last read it; ``kdbench cache prune``
removes folders not read for ``--older-than`` days and/or the least recently read ones until the
cache fits ``--max-size``. A folder read within ``--min-idle-hours`` is never removed (a running
stage marks its folder every few minutes), and a removed folder is renamed away first, so a run
that opens it meanwhile sees a miss and recomputes rather than reading half a folder.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from kdbench.config import ConfigError
from kdbench.disk import folder_bytes, human_bytes

DELETING_PREFIX = ".deleting-"
HOUR = 3600.0
DAY = 24 * HOUR


@dataclass(frozen=True)
class CacheFolder:
    path: Path
    bytes: int
    last_used: float  # seconds since the epoch: the LAST_USED marker, else the folder's own mtime
    key: dict[str, Any]  # the CacheKey it was written under (empty when the manifest is missing)
    fields: tuple[str, ...]


def cache_folders(root: Path) -> list[CacheFolder]:
    """Every folder of the cache under ``root``, least recently used first."""
    from kdbench.cache import LAST_USED, MANIFEST

    found = []
    for path in sorted(Path(root).iterdir()) if Path(root).is_dir() else []:
        if not path.is_dir() or path.name.startswith("."):
            continue
        marker = path / LAST_USED
        try:
            last_used = (marker if marker.exists() else path).stat().st_mtime
            manifest = json.loads((path / MANIFEST).read_text()) if (path / MANIFEST).is_file() else {}
        except (OSError, ValueError):  # removed meanwhile, or a manifest cut short
            last_used, manifest = path.stat().st_mtime if path.exists() else 0.0, {}
        found.append(CacheFolder(path, folder_bytes(path), last_used, dict(manifest.get("key") or {}),
                                 tuple(sorted(manifest.get("fields") or {}))))
    return sorted(found, key=lambda f: (f.last_used, f.path.name))


def choose_evictions(folders: Sequence[CacheFolder], *, now: float, older_than_days: float | None = None,
                     max_bytes: int | None = None, min_idle_hours: float = 24.0) -> list[CacheFolder]:
    """The folders to remove: those not used for ``older_than_days``, then the least recently used
    until the rest fit ``max_bytes``. A folder used within ``min_idle_hours`` is always kept."""
    idle_enough = [f for f in folders if now - f.last_used >= min_idle_hours * HOUR]
    doomed = [f for f in idle_enough if older_than_days is not None and now - f.last_used >= older_than_days * DAY]
    if max_bytes is not None:
        remaining = sum(f.bytes for f in folders) - sum(f.bytes for f in doomed)
        for folder in sorted(idle_enough, key=lambda f: f.last_used):
            if remaining <= max_bytes:
                break
            if folder not in doomed:
                doomed.append(folder)
                remaining -= folder.bytes
    return sorted(doomed, key=lambda f: f.last_used)


def remove_folder(folder: Path) -> None:
    """Rename ``folder`` out of the cache's namespace (atomic), then delete it."""
    hidden = folder.with_name(f"{DELETING_PREFIX}{folder.name}.{os.getpid()}")
    try:
        os.replace(folder, hidden)
    except FileNotFoundError:
        return
    shutil.rmtree(hidden, ignore_errors=True)


def _describe(folder: CacheFolder, now: float) -> str:
    key = folder.key
    what = (f"max_length {key.get('max_length')}, {key.get('augmentation', 'none')}, {key.get('precision')}"
            if key else "no manifest (an interrupted first write)")
    layers = sum(1 for name in folder.fields if "." in name)
    return (f"{folder.path.name}  {human_bytes(folder.bytes):>9}  used {(now - folder.last_used) / DAY:5.1f} days ago  "
            f"{len(folder.fields)} field(s) ({layers} per-layer)  {what}")


def _check(args: argparse.Namespace) -> None:
    for name in ("older_than", "max_size", "min_idle_hours"):
        value = getattr(args, name, None)
        if value is not None and value < 0:
            raise ConfigError(f"--{name.replace('_', '-')} must be >= 0, got {value}")
    if args.action == "prune" and args.older_than is None and args.max_size is None:
        raise ConfigError("kdbench cache prune: say what to remove with --older-than DAYS and/or --max-size GB")


def cmd_cache(args: argparse.Namespace) -> int:
    from kdbench.cache import default_cache_root

    _check(args)
    root = Path(args.root).expanduser() if args.root else default_cache_root()
    folders = cache_folders(root)
    now = time.time()
    if args.action == "list":
        for folder in folders:
            print(_describe(folder, now))
        print(f"{len(folders)} folder(s), {human_bytes(sum(f.bytes for f in folders))} in {root}")
        return 0
    for leftover in root.glob(f"{DELETING_PREFIX}*") if root.is_dir() else []:
        if not args.dry_run:  # an earlier prune stopped between renaming and deleting
            shutil.rmtree(leftover, ignore_errors=True)
    max_bytes = None if args.max_size is None else int(args.max_size * 1e9)
    doomed = choose_evictions(folders, now=now, older_than_days=args.older_than, max_bytes=max_bytes,
                              min_idle_hours=args.min_idle_hours)
    verb = "would remove" if args.dry_run else "removed"
    for folder in doomed:
        if not args.dry_run:
            remove_folder(folder.path)
        print(f"{verb}  {_describe(folder, now)}")
    left = sum(f.bytes for f in folders) - sum(f.bytes for f in doomed)
    print(f"{verb} {len(doomed)} folder(s), {human_bytes(sum(f.bytes for f in doomed))}; "
          f"{human_bytes(left)} left in {root}")
    if max_bytes is not None and left > max_bytes:
        print(f"the cache is still over --max-size {args.max_size:g} GB: the rest was used within "
              f"--min-idle-hours {args.min_idle_hours:g}")
    return 0


def add_command(subparsers: Any) -> None:
    cache = subparsers.add_parser("cache", help="list or prune the teacher-output cache ($KDBENCH_CACHE_DIR/teacher-outputs)")
    cache.add_argument("action", choices=("list", "prune"))
    cache.add_argument("--root", help="the teacher-output cache folder "
                                      "(default: $KDBENCH_CACHE_DIR/teacher-outputs, ~/.cache/kdbench/teacher-outputs)")
    cache.add_argument("--older-than", type=float, metavar="DAYS", help="prune: folders not used for DAYS days")
    cache.add_argument("--max-size", type=float, metavar="GB",
                       help="prune: then the least recently used until the cache fits GB gigabytes")
    cache.add_argument("--min-idle-hours", type=float, default=24.0,
                       help="prune: never remove a folder used within these hours (default 24)")
    cache.add_argument("--dry-run", action="store_true", help="prune: only say what would be removed")
    cache.set_defaults(handler=cmd_cache)
