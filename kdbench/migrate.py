"""``kdbench migrate``: rename run folders named under an older identity scheme.

A run folder is named by its identity (:func:`kdbench.fingerprint.run_identity`). When the rule
changes (:data:`~kdbench.fingerprint.IDENTITY_SCHEME`), existing folders keep their old names, and
a sweep or ``kdbench run`` would no longer find them: it would train every run again. This command
renames them, and every committed record folder, to the current scheme.

A folder is renamed only when its own files prove what it is: the config and input fingerprints in
its ``result.json`` (or, for a run that never finished, its ``config.yaml`` planned again) must
hash, under the old scheme, to the name it has. A run that reads another kdbench run's model (a
student reading its teacher) is named after that run's *new* name, so runs are renamed in
dependency order, and a run whose upstream run is in none of the given folders is left as it is.

After the renames, every old name is replaced by its new one in the text files under the given
folders (records, configs, sweep manifests, ``stage_roles.json``, checkpoints' trainer state).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from kdbench.config import ConfigError, RunConfig, from_mapping, load_yaml
from kdbench.fingerprint import IDENTITY_DIGITS, RUN_FOLDER, identity_digest, run_identity
from kdbench.records import RESULT_FILE, lock_holder

TEXT_SUFFIXES = (".json", ".jsonl", ".yaml", ".yml", ".md", ".csv")
MAX_REWRITTEN_BYTES = 64 << 20  # larger files are data or weights, not records


def scheme_1_identity(config_identity: dict[str, Any], inputs: dict[str, Any]) -> str:
    """The folder hash kdbench gave a run before identity scheme 2: config paths included."""
    return identity_digest({"config": config_identity, "inputs": inputs})


# Identity schemes a folder may have been named under, oldest first; the last is the current one.
SCHEMES: tuple[Callable[[dict[str, Any], dict[str, Any]], str], ...] = (scheme_1_identity, run_identity)


@dataclass
class FolderIdentity:
    """What a run folder says it is: its resolved config's identity and its input fingerprints."""

    name: str
    folders: list[Path] = field(default_factory=list)  # the run's folder and any record copies of it
    config_identity: dict[str, Any] = field(default_factory=dict)
    inputs: dict[str, Any] = field(default_factory=dict)

    @property
    def prefix(self) -> str:
        return self.name[: -IDENTITY_DIGITS]

    @property
    def upstream(self) -> dict[str, str]:
        """``{role: run name}`` for each input that is another kdbench run's model."""
        return {role: value["kdbench_run"] for role, value in self.inputs.items()
                if isinstance(value, dict) and "kdbench_run" in value}


@dataclass
class MigrationPlan:
    renames: dict[str, str]  # old run name -> new run name
    current: list[str]  # already named under the current scheme
    skipped: dict[str, str]  # run name -> why it is left as it is
    folders: dict[str, list[Path]]  # run name -> its folders


def read_identity(folder: Path) -> FolderIdentity:
    """The config identity and inputs a run folder (or a record folder) was named from.

    Raises ConfigError when the folder holds neither a record with ``inputs`` nor a ``config.yaml``."""
    record_path = folder / RESULT_FILE
    if record_path.is_file():
        record = json.loads(record_path.read_text())
        if "inputs" in record and "config" in record:
            config = from_mapping(RunConfig, record["config"], where=f"{record_path}: config")
            return FolderIdentity(folder.name, [folder], config.identity(), record["inputs"])
    config_path = folder / "config.yaml"
    if not config_path.is_file():
        raise ConfigError(f"{folder}: neither a result.json with inputs nor a config.yaml")
    from kdbench.config import build_run_config
    from kdbench.engine import plan_run

    plan = plan_run(build_run_config(load_yaml(config_path)))
    return FolderIdentity(folder.name, [folder], plan.config.identity(), plan.inputs)


def find_run_folders(roots: Iterable[Path]) -> list[Path]:
    """Run folders (a run-shaped name holding ``result.json`` or ``config.yaml``) under ``roots``,
    not inside hidden folders (sweep selections, temporary files)."""
    found = set()
    for root in roots:
        for folder, subfolders, files in os.walk(root):
            subfolders[:] = [name for name in subfolders if not name.startswith(".")]  # never entered
            if RUN_FOLDER.match(Path(folder).name) and ("config.yaml" in files or RESULT_FILE in files):
                found.add(Path(folder))
    return sorted(found)


def plan_migration(roots: Sequence[Path]) -> MigrationPlan:
    """Work out the new name of every run folder under ``roots`` (nothing is changed)."""
    runs: dict[str, FolderIdentity] = {}
    skipped: dict[str, str] = {}
    for folder in find_run_folders(roots):
        try:
            identity = read_identity(folder)
        except (ConfigError, ValueError, OSError) as error:
            skipped[folder.name] = f"unreadable: {error}"
            continue
        if folder.name in runs:
            runs[folder.name].folders.append(folder)
        else:
            runs[folder.name] = identity
    new_names: dict[str, str | None] = {}

    def resolve(name: str) -> str | None:
        if name in new_names:
            return new_names[name]
        new_names[name] = None  # a cycle cannot happen (a run reads finished runs); guard anyway
        run = runs.get(name)
        if run is None:
            skipped.setdefault(name, "not in the given folders")
            return None
        mapped_inputs = json.loads(json.dumps(run.inputs))
        for role, upstream in run.upstream.items():
            upstream_name = resolve(upstream)
            if upstream_name is None:
                skipped[name] = f"reads run {upstream!r} ({role}), which could not be renamed: migrate its folder too"
                return None
            mapped_inputs[role] = {"kdbench_run": upstream_name}
        scheme = next((rule for rule in SCHEMES if name.endswith("-" + rule(run.config_identity, run.inputs))), None)
        if scheme is None:
            skipped[name] = "its record does not hash to its name under any known scheme (edited, or not kdbench's)"
            return None
        new_names[name] = f"{run.prefix}{run_identity(run.config_identity, mapped_inputs)}"
        return new_names[name]

    for name in runs:
        resolve(name)
    renames = {old: new for old, new in new_names.items() if new is not None and new != old}
    current = sorted(old for old, new in new_names.items() if new == old)
    return MigrationPlan(renames, current, {k: v for k, v in skipped.items() if k in runs},
                         {name: run.folders for name, run in runs.items()})


def older_scheme_folders(output: Path, planned: Iterable[str]) -> list[str]:
    """Run folders directly under ``output`` that no planned run is named after and whose record
    hashes to their name under an older scheme: what ``kdbench migrate`` would rename. Only records
    are read (no model or data file), so a sweep can check this before every submission."""
    wanted = set(planned)
    older = []
    for folder in sorted(output.iterdir()) if output.is_dir() else []:
        if folder.name in wanted or not RUN_FOLDER.match(folder.name) or not (folder / RESULT_FILE).is_file():
            continue
        try:
            run = read_identity(folder)
        except (ConfigError, ValueError, OSError):
            continue
        if any(folder.name.endswith("-" + rule(run.config_identity, run.inputs)) for rule in SCHEMES[:-1]):
            older.append(folder.name)
    return older


def apply_migration(plan: MigrationPlan, roots: Sequence[Path]) -> None:
    """Rename the folders and rewrite old names in the text files under ``roots``.

    Raises ConfigError before changing anything when a run is live (its lock is held) or a new name
    is already taken by another folder."""
    for old in plan.renames:
        for folder in plan.folders[old]:
            holder = lock_holder(folder)
            if holder is not None:
                raise ConfigError(f"run folder {str(folder)!r} is in use by pid {holder}: migrate when no run is live")
            target = folder.with_name(plan.renames[old])
            if target.exists():
                raise ConfigError(f"cannot rename {str(folder)!r}: {str(target)!r} already exists")
    for old, new in plan.renames.items():
        for folder in plan.folders[old]:
            folder.rename(folder.with_name(new))
    for root in roots:
        for path in root.rglob("*"):
            if path.suffix in TEXT_SUFFIXES and path.is_file() and path.stat().st_size <= MAX_REWRITTEN_BYTES:
                _replace_names(path, plan.renames)


def _replace_names(path: Path, renames: dict[str, str]) -> None:
    text = path.read_text(encoding="utf-8", errors="surrogateescape")
    updated = text
    for old, new in renames.items():
        updated = updated.replace(old, new)
    if updated != text:
        tmp = path.with_name(f".{path.name}.{os.getpid()}.migrate")
        tmp.write_text(updated, encoding="utf-8", errors="surrogateescape")
        os.replace(tmp, path)


def cmd_migrate(args: argparse.Namespace) -> int:
    roots = [Path(folder).expanduser().resolve() for folder in args.folders]
    for root in roots:
        if not root.is_dir():
            raise ConfigError(f"folder {str(root)!r} does not exist")
    plan = plan_migration(roots)
    for old, new in sorted(plan.renames.items()):
        print(f"rename  {old} -> {new}  ({len(plan.folders[old])} folder(s))")
    for name, why in sorted(plan.skipped.items()):
        print(f"keep    {name}: {why}", file=sys.stderr)
    print(f"{len(plan.renames)} to rename, {len(plan.current)} already current, {len(plan.skipped)} left as they are")
    if not args.dry_run and plan.renames:
        apply_migration(plan, roots)
        print("renamed")
    return 0


def add_command(subparsers: Any) -> None:
    parser = subparsers.add_parser(
        "migrate", help="rename run and record folders named under an older identity scheme, so that sweeps and "
                        "kdbench run find them again")
    parser.add_argument("folders", nargs="+", metavar="FOLDER",
                        help="folders of runs or records; give together the folders whose runs read each other")
    parser.add_argument("--dry-run", action="store_true", help="print the renames, change nothing")
    parser.set_defaults(handler=cmd_migrate)
