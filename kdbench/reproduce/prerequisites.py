"""Files a table's runs read that no run produces: the GLUE corpus, the SQuAD split, and each task's
augmented training set (TinyBERT's DA), which needs the MLM-adapted teacher's stage trained first."""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass
from enum import Enum
from pathlib import Path
from typing import Any

import yaml

from kdbench.config import ConfigError
from kdbench.reproduce.study import CORPUS, MINI, MLM_TEACHER, TABLE_ROWS, MiniScale, augmented_path, table_tasks


class PrerequisiteKind(Enum):
    GLUE_CORPUS = "glue-corpus"  # kdbench corpus glue --dedupe over the study's GLUE tasks
    AUGMENTED = "augmented"  # kdbench augment of one task's training set with a stage's MLM teacher
    SQUAD_SPLIT = "squad-split"  # SQuAD v1.1 dev split by article into a training and a held-out file


@dataclass(frozen=True)
class Prerequisite:
    """Files a table's runs read that no run produces, built by ``kdbench reproduce`` before the
    runs that read them (their folders hash the files' content) and kept when present: the GLUE
    corpus, the SQuAD split, or a task's augmented training set, which needs a stage's model
    (``after_stage``)."""

    kind: PrerequisiteKind
    paths: tuple[str, ...]  # relative to the folder the command runs in, like the spec's output
    description: str
    after_stage: str | None = None  # the stage whose model/ the builder needs (run first)
    task: str | None = None  # the task an augmented training set is built from

    @property
    def present(self) -> bool:
        return all(Path(path).is_file() for path in self.paths)

    def ensure(self, scale: MiniScale = MINI, stage_model: Path | None = None) -> bool:
        """Build the files unless present; True when they were built now."""
        if self.present:
            return False
        if self.kind is PrerequisiteKind.GLUE_CORPUS:
            from kdbench.tasks.corpus import write_glue_corpus

            write_glue_corpus(scale.corpus_tasks, None, self.paths[0], dedupe=True)
        elif self.kind is PrerequisiteKind.SQUAD_SPLIT:
            _split_squad(scale, Path(self.paths[0]).parent)
        else:
            from kdbench.augment_cli import augment_task_file

            if stage_model is None or not stage_model.is_dir():
                raise ConfigError(f"{self.paths[0]}: needs the model of stage {self.after_stage!r}, not found at "
                                  f"{stage_model}")
            augment_task_file(self.task, mlm_model=str(stage_model), out=self.paths[0],
                              n_aug=scale.augmentation_variants, max_samples=scale.task(self.task).max_train_samples)
        return True


def _split_squad(scale: MiniScale, folder: Path) -> None:
    from kdbench.config import DataConfig
    from kdbench.tasks.squad import V1, SquadTask, split_articles

    data_dir = DataConfig().resolved_data_dir()
    if data_dir is None:
        raise ConfigError("the SQuAD split reads dev-v1.1.json from the data dir: set $KDBENCH_DATA_DIR")
    split_articles(SquadTask(V1).find_file(data_dir, "dev"), folder, scale.squad_train_articles)


GLUE_CORPUS = Prerequisite(PrerequisiteKind.GLUE_CORPUS, (CORPUS,),
                           "the GLUE training sentences of the study's tasks, deduplicated (kdbench corpus glue)")


def prerequisites(table: str, scale: MiniScale = MINI) -> list[Prerequisite]:
    """The table's prerequisite files, in build order (those needing a stage last)."""
    rows = TABLE_ROWS[table]()
    found = [GLUE_CORPUS] if any(row.upstream for row in rows) or any(row.augmented for row in rows) else []
    for task in table_tasks(table, scale):
        if task.name == "squad" and task.train_file and task.dev_file:
            found.append(Prerequisite(PrerequisiteKind.SQUAD_SPLIT, (task.train_file, task.dev_file),
                                      f"SQuAD v1.1 dev, its first {scale.squad_train_articles} articles to train on and "
                                      "the rest held out"))
    if any(row.augmented for row in rows):
        tasks = [t.name for t in table_tasks(table, scale) if any(row.augmented and row.runs_on(t.name) for row in rows)]
        found += [Prerequisite(PrerequisiteKind.AUGMENTED, (augmented_path(task, scale),),
                               f"{task}'s training set augmented by TinyBERT's DA with the MLM-adapted teacher "
                               "(kdbench augment)", after_stage=MLM_TEACHER, task=task)
                  for task in tasks]
    return found


def _read_paths(spec_path: Path, output: Path) -> set[str]:
    """Every string value of the runs of a spec (resolved, stages included): the files they read."""
    from kdbench.sweep import expand, load_spec

    return strings_of(expand(load_spec(spec_path), output=output).runs.values())


def strings_of(runs: Iterable[Any]) -> set[str]:
    """Every string value of expanded sweep runs (nested in dicts and lists)."""
    found: set[str] = set()

    def walk(value: Any) -> None:
        if isinstance(value, dict):
            for item in value.values():
                walk(item)
        elif isinstance(value, list):
            for item in value:
                walk(item)
        elif isinstance(value, str):
            found.add(value)

    for run in runs:
        walk(run.values)
    return found


def needed_prerequisites(table: str, read: set[str], stages: dict[str, Any]) -> list[Prerequisite]:
    """The table's prerequisites, in build order, that the runs to do read (``read``: their string
    values), and those that the stages building them read (``stages``: :func:`prerequisite_stages`):
    a part of the table chosen with --only may read an augmented set and no corpus, while the MLM
    teacher the set is built with trains on the corpus."""
    found = prerequisites(table)
    chosen = [p for p in found if any(path in read for path in p.paths)]
    read_by_stages = strings_of(stages[p.after_stage] for p in chosen if p.after_stage is not None)
    return [p for p in found if p in chosen or any(path in read_by_stages for path in p.paths)]


def prerequisite_stages(table: str, spec: dict[str, Any], output: Path) -> dict[str, Any]:
    """The stages the table's prerequisite files are built with (DA's MLM-adapted teacher), name ->
    the expanded run: no cell reads their model, yet its weights shape the files the cells read, so
    their records belong with the table's and their training with its estimate."""
    from kdbench.sweep import expand

    stages = sorted({p.after_stage for p in prerequisites(table) if p.after_stage is not None})
    return {stage: expand(stage_alone(spec, stage), output).runs[stage] for stage in stages}


def prerequisite_stages_read_by(table: str, spec_path: Path, run_spec: Path, output: Path) -> dict[str, Any]:
    """Of :func:`prerequisite_stages`, those that build files the chosen runs (``run_spec``) read,
    trained or not: DA's MLM teacher for a DA cell."""
    from kdbench.sweep import load_spec

    stages = prerequisite_stages(table, load_spec(spec_path), output)
    return {p.after_stage: stages[p.after_stage] for p in needed_prerequisites(table, _read_paths(run_spec, output), stages)
            if p.after_stage is not None}


def prerequisite_stages_to_train(table: str, spec_path: Path, run_spec: Path, output: Path) -> dict[str, Any]:
    """Of :func:`prerequisite_stages`, those the chosen runs (``run_spec``) still need trained: a file
    they read is missing and the stage has no completed run folder in ``output``."""
    from kdbench.sweep import load_spec, record_completed

    stages = prerequisite_stages(table, load_spec(spec_path), output)
    missing = [p for p in needed_prerequisites(table, _read_paths(run_spec, output), stages) if not p.present]
    return {p.after_stage: stages[p.after_stage] for p in missing
            if p.after_stage is not None and not record_completed(stages[p.after_stage].run_dir)}


def build_prerequisites(table: str, spec_path: Path, output: Path, sweep_options: list[str],
                        dry_run: bool = False, before_training: Callable[[], None] | None = None) -> int:
    """Build the table's prerequisite files in order. One that needs a stage's model (augmented data
    needs the MLM-adapted teacher) first runs that stage alone, as a sweep of the spec's stage with
    the same executor (waiting for it on Slurm). ``before_training`` is called once, when the files
    that need no stage exist: before the first such stage trains, or at the end (a stage's folder can
    hash those files). With ``dry_run`` only what needs no stage is built."""
    from kdbench.cli import main as kdbench_main
    from kdbench.sweep import expand, load_spec

    spec = load_spec(spec_path)
    stages = prerequisite_stages(table, spec, output)  # for the paths they read, not their folders
    stage_models: dict[str, Path] = {}  # each stage run once
    for prerequisite in needed_prerequisites(table, _read_paths(spec_path, output), stages):
        files = ", ".join(prerequisite.paths)
        if prerequisite.present:
            print(f"[kdbench reproduce] {files}: present ({prerequisite.description})", flush=True)
            continue
        stage_model = stage_models.get(prerequisite.after_stage or "")
        if prerequisite.after_stage is not None and stage_model is None:
            if dry_run:
                print(f"[kdbench reproduce] {files}: to build after stage {prerequisite.after_stage} "
                      f"({prerequisite.description}); the folders of runs reading it hash it, so until it "
                      "exists --missing finds their records by the digest those records read",
                      flush=True)
                continue
            if before_training is not None:
                before_training()
                before_training = None
            stage_spec = stage_alone(spec, prerequisite.after_stage)
            stage_path = output / ".prerequisites" / f"{table}-{prerequisite.after_stage}.yaml"
            stage_path.parent.mkdir(parents=True, exist_ok=True)
            stage_path.write_text(yaml.safe_dump(stage_spec, sort_keys=False))
            waiting = ["--wait"] if "slurm" in sweep_options else []
            code = kdbench_main(["sweep", str(stage_path), *sweep_options, *waiting])
            if code != 0:
                return code
            # expanded again: its folder hashes the files built before it (the corpus), absent at the start
            stage_model = expand(stage_spec, output).runs[prerequisite.after_stage].run_dir / "model"
            stage_models[prerequisite.after_stage] = stage_model
        prerequisite.ensure(MINI, stage_model)
        print(f"[kdbench reproduce] {files}: built ({prerequisite.description})", flush=True)
    if before_training is not None:
        before_training()
    return 0


def stage_alone(spec: dict[str, Any], stage: str) -> dict[str, Any]:
    """A sweep spec that runs one of ``spec``'s stages as its only cell (the same run folder)."""
    return {"name": f"{spec['name']}-{stage}", "output": spec.get("output"), "defaults": spec.get("defaults", {}),
            "cells": [{"name": stage, **spec["stages"][stage]}]}

