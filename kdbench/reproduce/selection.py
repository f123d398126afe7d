"""Running part of a table: cells chosen by name (``--only``), those already recorded left out
(``--missing``), what will train again and on which hardware, and how long the rest will take."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import yaml

from kdbench.config import ConfigError
from kdbench.reproduce.prerequisites import prerequisite_stages_read_by, prerequisite_stages_to_train


def select_runs(spec: dict[str, Any], patterns: list[str]) -> dict[str, Any]:
    """The spec with only the cells whose name matches one of ``patterns`` (shell-style, e.g.
    ``kd-3l-*``, ``*-mrpc-s[1-3]``); a pattern naming a stage (``teacher-rte``) runs that stage alone,
    as a cell with the stage's keys (the same run folder). The stages the kept cells refer to come
    along when the sweep resolves them. A pattern that matches nothing is an error naming it."""
    from fnmatch import fnmatchcase

    cells, stages = spec.get("cells") or [], spec.get("stages") or {}
    for pattern in patterns:
        if not any(fnmatchcase(cell["name"], pattern) for cell in cells) and \
                not any(fnmatchcase(name, pattern) for name in stages):
            example = cells[0]["name"] if cells else "none"
            raise ConfigError(f"--only {pattern!r} matches no cell or stage of {spec['name']} "
                              f"(cells are named like {example!r}; stages: {', '.join(stages) or 'none'})")
    chosen = [cell for cell in cells if any(fnmatchcase(cell["name"], pattern) for pattern in patterns)]
    needed = _referenced_stages(chosen, stages)
    alone = [{"name": name, **keys} for name, keys in stages.items()
             if name not in needed and any(fnmatchcase(name, pattern) for pattern in patterns)]
    return {**spec, "cells": alone + chosen}


def _referenced_stages(cells: list[dict[str, Any]], stages: dict[str, Any]) -> set[str]:
    """The stages ``cells`` refer to, directly or through other stages (a stage they need runs
    anyway: it is not added a second time as a cell of its own)."""
    import json

    from kdbench.sweep import REFERENCE, RUN_DIR_SUFFIX

    found: set[str] = set()
    todo = [json.dumps(cells, default=str)]
    while todo:
        for reference in REFERENCE.findall(todo.pop()):
            name = reference.removesuffix(RUN_DIR_SUFFIX)
            if name in stages and name not in found:
                found.add(name)
                depends_on = [f"${{{other}}}" for other in stages[name].get("depends_on") or []]
                todo.append(json.dumps([stages[name], depends_on], default=str))
    return found


def chosen_run_folders(table: str, spec_path: Path, run_spec: Path, output: Path) -> frozenset[str]:
    """The run folder names of what ``run_spec`` (a selection of the table's spec) runs: the chosen
    cells and stages, the stages they read (their teacher, a corpus stage) and the stages that built
    the files they read (DA's MLM teacher). ``--supersede-records`` with ``--only`` replaces only
    these records: another training of a teacher the chosen cells do not read keeps its record."""
    from kdbench.sweep import expand, load_spec

    runs = list(expand(load_spec(run_spec), output=output).runs.values())
    runs += prerequisite_stages_read_by(table, spec_path, run_spec, output).values()
    return frozenset(run.run_dir.name for run in runs)


def recorded_cells(runs: dict[str, Any], records: Path) -> set[str]:
    """The names of the cells among ``runs`` (an expanded sweep's runs) that already have a completed
    record in ``records``.

    A record's folder is named like its run's folder, and run folders are named by content, not
    location (:func:`kdbench.fingerprint.run_identity`): a cell planned on another machine or into
    another runs folder finds the record exported from the first training."""
    from kdbench.sweep import record_completed

    return {name for name, run in runs.items() if run.kind == "cell" and record_completed(records / run.run_dir.name)}


@dataclass(frozen=True)
class AwaitedRecord:
    """A completed record a cell will find once the files it reads that are not built yet exist
    (TinyBERT's augmented set, built after the MLM teacher trains): its run folder hashes those files'
    digests, so until they are built the cell is matched to the record by the digests the record read."""

    record: str  # the record's folder name
    digests: tuple[tuple[str, str], ...]  # (file name, sha256 the record read) for each file not built yet

    def __str__(self) -> str:
        return ", ".join(f"{name} sha256 {digest[:12]}…" for name, digest in self.digests)


def cells_awaiting_their_files(runs: dict[str, Any], records: Path) -> dict[str, AwaitedRecord]:
    """The cells among ``runs`` (an expanded sweep's runs) without a completed record under their
    planned folder name that read a data file not built yet, and whose config and other inputs are
    those of a completed record in ``records``: cell name -> that record and the digests it read.

    Rebuilt with those digests (the same stage on the same processor kind and libraries), the files
    give the cell the record's folder name and ``--missing`` leaves it out; rebuilt with other bits,
    the cell runs again. The match recomputes the record's folder name from the cell's own config
    and inputs with the record's digests put in for the missing files, so a record of another seed
    or setting never matches."""
    from kdbench.fingerprint import run_identity
    from kdbench.records import RESULT_FILE
    from kdbench.sweep import record_completed

    found: dict[str, AwaitedRecord] = {}
    recorded_inputs: dict[str, dict[str, Any]] = {}  # record folder name -> the inputs its record read
    for name, run in runs.items():
        if run.kind != "cell" or run.plan is None or record_completed(records / run.run_dir.name):
            continue
        plan = run.plan
        planned_data = plan.inputs.get("data", [])
        missing = [index for index, source in enumerate(planned_data)
                   if isinstance(source, dict) and source.get("missing")]
        if not missing:
            continue
        prefix = f"{plan.config.method}-{plan.config.task}-"
        for folder in sorted(records.glob(f"{prefix}*")) if records.is_dir() else []:
            if folder.name not in recorded_inputs:
                recorded_inputs[folder.name] = _completed_record_inputs(folder / RESULT_FILE)
            recorded_data = recorded_inputs[folder.name].get("data") or []
            if len(recorded_data) != len(planned_data) or any(
                    Path(recorded_data[index].get("path", "")).name != Path(planned_data[index]["path"]).name
                    or "sha256" not in recorded_data[index] for index in missing):
                continue
            data = [recorded_data[index] if index in missing else source for index, source in enumerate(planned_data)]
            if prefix + run_identity(plan.config.identity(), {**plan.inputs, "data": data}) == folder.name:
                found[name] = AwaitedRecord(folder.name, tuple((Path(recorded_data[index]["path"]).name,
                                                                recorded_data[index]["sha256"]) for index in missing))
                break
    return found


def _completed_record_inputs(path: Path) -> dict[str, Any]:
    """The ``inputs`` of the record at ``path`` if it is completed, else (or unreadable) ``{}``."""
    import json

    try:
        record = json.loads(path.read_text())
    except (OSError, json.JSONDecodeError):
        return {}
    return (record.get("inputs") or {}) if record.get("status") == "completed" else {}


def recorded_cells_to_retrain(runs: dict[str, Any], records: Path) -> list[str]:
    """The cells among ``runs`` that have a completed record in ``records`` but no completed run folder
    here: a sweep without ``--missing`` trains them again (e.g. committed records on a new machine)."""
    from kdbench.sweep import record_completed

    return sorted(name for name in recorded_cells(runs, records) if not record_completed(runs[name].run_dir))


def _first_names(names: Sequence[str], shown: int = 8) -> str:
    """``names`` for a message: the first ``shown``, then "..." if there are more."""
    return ", ".join(names[:shown]) + (", ..." if len(names) > shown else "")


def say_which_recorded_cells_retrain(run_spec: Path, output: Path, records: Path) -> None:
    from kdbench.sweep import expand, load_spec

    again = recorded_cells_to_retrain(expand(load_spec(run_spec), output=output).runs, records)
    if again:
        shown = _first_names(again)
        print(f"[kdbench reproduce] {len(again)} chosen cell(s) have a completed record in {records} but no "
              f"completed run folder in {output}, so they train again ({shown}); --missing leaves them out",
              flush=True)


def stages_retrained_elsewhere(table: str, spec_path: Path, run_spec: Path, output: Path,
                               records: Path) -> dict[str, str]:
    """The stages this run of the table will train (those its chosen runs and the prerequisites they
    read need, with no completed run folder here) whose record in ``records`` was trained on other
    hardware or libraries than this machine's: stage name -> what differs.

    Retrained on the processor, thread count and library versions its record names, a stage writes
    its recorded weights bit for bit; elsewhere its weights differ in their last bits, so the cells run
    now read another teacher than the recorded cells did (their claims read *teachers differ*)."""
    import json

    from kdbench.records import compute_environment, library_versions
    from kdbench.sweep import expand, load_spec, record_completed

    spec = load_spec(spec_path)
    stage_folders = {name: run.run_dir for name, run in expand(spec, output=output).runs.items() if run.kind == "stage"}
    needed = {name for name in expand(load_spec(run_spec), output=output).runs if name in stage_folders}
    for stage, run in prerequisite_stages_to_train(table, spec_path, run_spec, output).items():
        stage_folders[stage] = run.run_dir  # DA's MLM teacher: a stage no run of the spec reads
        needed.add(stage)
    here = {"machine": compute_environment(), "versions": library_versions()}
    found = {}
    for name in sorted(needed):
        record_path = records / stage_folders[name].name / "result.json"
        if record_completed(stage_folders[name]) or not record_completed(record_path.parent):
            continue
        record = json.loads(record_path.read_text())
        differences = _hardware_and_library_differences(record, here)
        if differences:
            found[name] = differences
    return found


def _hardware_and_library_differences(record: dict[str, Any], here: dict[str, Any]) -> str:
    """What of the processor, threads, GPU and torch/transformers versions differs between a record
    and ``here`` (``{"machine": ..., "versions": ...}``), as "recorded X, here Y" phrases; "" if nothing."""
    def describe(machine: dict[str, Any]) -> str:
        text = f"{machine.get('cpu')}, {machine.get('cpu_capability')}, {machine.get('torch_threads')} threads"
        return text + (f", GPU {machine['gpu']}" if machine.get("gpu") else "")

    phrases = []
    machine = record.get("machine")
    if not machine:
        phrases.append(f"its record predates the machine field; here {describe(here['machine'])}")
    elif machine != here["machine"]:
        phrases.append(f"recorded on {describe(machine)}, here {describe(here['machine'])}")
    versions = record.get("versions") or {}
    for library in ("torch", "transformers"):
        if versions.get(library) and versions[library] != here["versions"].get(library):
            phrases.append(f"{library} {versions[library]} recorded, {here['versions'].get(library)} here")
    return "; ".join(phrases)


def say_which_stages_retrain_elsewhere(table: str, spec_path: Path, run_spec: Path, output: Path,
                                        records: Path) -> None:
    found = stages_retrained_elsewhere(table, spec_path, run_spec, output, records)
    if found:
        listed = "; ".join(f"{name} ({why})" for name, why in found.items())
        print(f"[kdbench reproduce] {len(found)} recorded stage(s) train again on other hardware or libraries than "
              f"their records in {records} name (or on a machine a record does not name): {listed}. Trained on other "
              "hardware or libraries, a stage writes other weights in their last bits, so the cells run now read "
              "other stage weights than the recorded cells did (claims pairing them read 'teachers differ' where "
              "the stage is a teacher); on the machine and libraries its record names, it trains again bit for "
              "bit.", flush=True)


@dataclass(frozen=True)
class TrainingEstimate:
    """How long the runs still to do will train, judged from the records: a run by its own earlier
    training where one is recorded (a teacher, a corpus stage), a cell by the median ``train_seconds``
    of its row's recorded runs on the same task or, where its row has none there, of the recorded runs
    of the same method and student on that task that train as many steps (another row of one
    ablation: a mapping, an objective left out; not a row on another training file or with other
    epochs, such as TinyBERT's DA rows beside its rows without DA). On the machines that wrote those
    records: a guide, not a promise."""

    seconds: float
    estimated: int
    unestimated: tuple[str, ...]  # the runs with no record to judge from
    by_another_row: int = 0  # of ``estimated``, those judged by another row of their method and student

    @classmethod
    def of(cls, runs: dict[str, Any], records: Path) -> TrainingEstimate:
        """``runs``: the runs to do (name -> an expanded sweep's run)."""
        import statistics

        from kdbench.records import load_records

        frame = load_records(records, include_failed=False) if records.is_dir() else None
        if frame is None or "train_seconds" not in frame:
            frame = None
        else:
            frame = frame[frame["status"] == "completed"].dropna(subset=["train_seconds"])
        own: dict[str, float] = {}
        by_row: dict[tuple[Any, Any], list[float]] = {}
        by_model: dict[tuple[Any, ...], list[float]] = {}
        for _, record in frame.iterrows() if frame is not None else []:
            took = float(record["train_seconds"])
            own[Path(record["run_dir"]).name] = took
            by_row.setdefault((record.get("label"), record["task"]), []).append(took)
            workload = _workload(record.get("config") or {})
            by_model.setdefault((record.get("method"), record.get("student"), record["task"], workload), []).append(took)
        seconds, estimated, by_another_row, unestimated = 0.0, 0, 0, []
        for name, run in runs.items():
            past = own.get(run.run_dir.name)
            if past is None and run.values.get("label"):
                task = run.values.get("task")
                times = by_row.get((run.values["label"], task))
                if not times:
                    times = by_model.get((run.values.get("method"), run.values.get("student"), task,
                                          _workload(_resolved_config(run.values))))
                    by_another_row += bool(times)
                past = statistics.median(times) if times else None
            if past is None:
                unestimated.append(name)
            else:
                seconds, estimated = seconds + past, estimated + 1
        return cls(seconds, estimated, tuple(unestimated), by_another_row)

    def __str__(self) -> str:
        if not self.estimated and not self.unestimated:
            return "Nothing left to train."
        shown = _first_names(self.unestimated)
        if not self.estimated:
            return f"No record to judge the training time of the {len(self.unestimated)} runs to do from ({shown})."
        text = (f"Training time of the {self.estimated} runs to do that the records can judge (stages included): "
                f"about {self.seconds / 3600:.1f} h on the machines that wrote them")
        if self.by_another_row:
            text += (f" ({self.by_another_row} of them judged by another row of the same method and student on "
                     "their task)")
        if self.unestimated:
            text += f"; no record to judge the other {len(self.unestimated)} from ({shown})"
        return text + "."


def _workload(config: Mapping[str, Any]) -> tuple[Any, ...]:
    """What sets how many steps a run trains, from its config as a record stores it: the training
    file's name, the sample cap, the epochs and step limit, and the method's own epoch and step counts
    (TinyBERT's ``intermediate_epochs``, ...)."""
    data, train = config.get("data") or {}, config.get("train") or {}
    train_file = data.get("train_file")
    own_counts = tuple(sorted((name, value) for name, value in (config.get("method_params") or {}).items()
                              if name.endswith(("_epochs", "_steps"))))
    return (Path(train_file).name if train_file else None, data.get("max_train_samples"), train.get("epochs"),
            train.get("max_steps"), own_counts)


def _resolved_config(values: Mapping[str, Any]) -> dict[str, Any]:
    """A sweep run's config as its record will store it: method parameters with their defaults."""
    from kdbench.config import build_run_config
    from kdbench.plugins import METHODS

    config = build_run_config(dict(values))
    method = METHODS.get(config.method).from_overrides(config.method_params)
    return replace(config, method_params=method.params_dict()).to_dict()


def _runs_to_do(runs: dict[str, Any], cells: set[str]) -> dict[str, Any]:
    """``cells`` and the stages they need, directly or through other stages, not yet completed in
    their run folders."""
    from kdbench.sweep import record_completed

    needed, todo = set(), list(cells)
    while todo:
        name = todo.pop()
        if name not in needed:
            needed.add(name)
            todo.extend(runs[name].depends_on)
    return {name: run for name, run in runs.items()
            if name in needed and (name in cells or not record_completed(run.run_dir))}


def write_selection(spec_path: Path, patterns: list[str], output: Path,
                    leave_out_recorded_in: Path | None = None, also_to_train: Mapping[str, Any] | None = None) -> Path:
    """Write the selected part of the spec beside the runs (``OUTPUT/.selections/``) and return its path.

    ``patterns`` as for :func:`select_runs` (none: every cell); with ``leave_out_recorded_in``, the
    cells with a completed record there are left out too (``--missing``), and the training left is
    estimated: the kept cells, the stages they need and ``also_to_train`` (name -> expanded run:
    the stages that build the files they read, which run before them as sweeps of their own)."""
    import hashlib

    from kdbench.sweep import expand, load_spec, record_completed

    spec = load_spec(spec_path)
    selected = select_runs(spec, patterns) if patterns else spec
    how = f"only: {' '.join(patterns)}" if patterns else "every cell"
    if leave_out_recorded_in is not None:
        runs = expand(selected, output=output).runs
        recorded = recorded_cells(runs, leave_out_recorded_in)
        awaiting = cells_awaiting_their_files(runs, leave_out_recorded_in)
        left_out_names = recorded | set(awaiting)
        kept = [cell for cell in selected.get("cells") or [] if cell["name"] not in left_out_names]
        selected = {**selected, "cells": kept}
        to_do = {**_runs_to_do(runs, {cell["name"] for cell in kept}),
                 **{name: run for name, run in (also_to_train or {}).items() if not record_completed(run.run_dir)}}
        estimate = TrainingEstimate.of(to_do, leave_out_recorded_in)
        left_out = len(left_out_names)
        awaited = ""
        if awaiting:
            digests = sorted({str(match) for match in awaiting.values()})
            awaited = (f" ({len(awaiting)} of them by the digests their records read of files not built yet: "
                       f"{'; '.join(digests)}; built with other bits, those files give these cells other folders "
                       f"and they run: {_first_names(sorted(awaiting))})")
        print(f"[kdbench reproduce] --missing: {left_out} of {len(kept) + left_out} chosen cells have a completed "
              f"record in {leave_out_recorded_in} and are left out{awaited}; {len(kept)} to run. {estimate}",
              flush=True)
        how += f", missing from {leave_out_recorded_in}"
    digest = hashlib.sha256(how.encode()).hexdigest()[:8]
    path = output / ".selections" / f"{spec_path.stem}-{digest}.yaml"
    path.parent.mkdir(parents=True, exist_ok=True)
    header = f"# {spec_path.name}, {how} (written by kdbench reproduce)\n"
    path.write_text(header + yaml.safe_dump(selected, sort_keys=False))
    return path

