"""Planning a run: resolve names and parameters and check everything that is cheap to check,
before any model is loaded."""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from kdbench.config import ConfigError, RunConfig
from kdbench.fingerprint import data_fingerprint, model_fingerprint, run_identity, written_as_path
from kdbench.method import Method
from kdbench.plugins import METHODS, STUDENTS, TASKS
from kdbench.students import StudentPreset
from kdbench.task import Task


@dataclass
class RunPlan:
    config: RunConfig  # resolved: canonical names, typed method parameters
    method: Method
    task: Task
    preset: StudentPreset | None

    inputs: dict[str, Any] = field(default_factory=dict)  # fingerprints of the data and models it reads

    @property
    def identity(self) -> str:
        """The run's identity: its resolved config and the content of every input it reads, wherever
        those inputs and the run's output sit."""
        return run_identity(self.config.identity(), self.inputs)

    @property
    def run_dir(self) -> Path:
        return Path(self.config.output) / f"{self.config.method}-{self.config.task}-{self.identity}"


def input_fingerprints(config: RunConfig, task: Task, preset: StudentPreset | None) -> dict[str, Any]:
    """Fingerprints of the models and data files ``config`` reads (see :mod:`kdbench.fingerprint`)."""
    models = {"teacher": config.teacher, "student": None if preset is not None else config.student,
              "tokenizer": config.tokenizer, "student_init_from": config.student_init_from}
    fingerprints = {role: model_fingerprint(name) for role, name in models.items() if name}
    if "student" in fingerprints and config.student_init == "random":
        # The checkpoint's architecture with new weights: another run than one that loads them (and
        # than such runs before kdbench honoured random for a checkpoint, which loaded them anyway).
        fingerprints["student"] = {"random_weights_of": fingerprints["student"]}
    return {**fingerprints, "data": [data_fingerprint(source) for source in task.data_sources(config)]}


def plan_run(config: RunConfig) -> RunPlan:
    """Resolve names and parameters; raise ConfigError naming any bad value. Loads no model."""
    method_cls: type[Method] = METHODS.get(config.method)
    method = method_cls.from_overrides(config.method_params)
    task: Task = TASKS.get(config.task)
    method.check_head(task.spec)
    if method_cls.requires_teacher and not config.teacher:
        raise ConfigError(f"method {method_cls.name!r} needs a teacher: give --teacher MODEL")
    preset = STUDENTS.get(config.student) if config.student in STUDENTS else None
    if preset is None and not _looks_like_model(config.student):
        STUDENTS.get(config.student)  # raises "unknown student preset ... did you mean"
    if preset is not None and preset.from_teacher and not config.teacher:
        raise ConfigError(f"student preset {preset.name!r} is derived from the teacher: give --teacher MODEL")
    if config.student_init_from and (preset is None or config.student_init == "random"):
        raise ConfigError(f"student_init_from={config.student_init_from!r} copies layers into a preset-shaped student; "
                          f"give a preset student (kdbench list students) with student_init=teacher or auto")
    if preset is None and config.student_init == "teacher":
        raise ConfigError(f"student_init=teacher copies teacher layers into a preset-shaped student, but "
                          f"{config.student!r} is a checkpoint: give a preset student (kdbench list students), or "
                          "student_init=pretrained (its weights) or random (its architecture, new weights)")
    if preset is not None and config.student_init == "pretrained":
        raise ConfigError(f"student_init=pretrained needs a checkpoint, but {config.student!r} is a shape preset")
    if config.teacher and Path(config.teacher).exists() and not (Path(config.teacher) / "config.json").is_file():
        raise ConfigError(f"teacher folder {config.teacher!r} has no config.json (not a Hugging Face model folder)")
    resolved = replace(
        config,
        method=method_cls.name,
        task=task.spec.name,
        method_params=method.params_dict(),
    )
    return RunPlan(resolved, method, task, preset, input_fingerprints(resolved, task, preset))


def check_model_paths_exist(config: RunConfig) -> None:
    """Raise ConfigError for a model that must be a local folder and does not exist.

    Not part of :func:`plan_run`: a sweep plans its dependent runs before the runs that produce
    their models exist. A name written as a path (absolute, ``./``, ``../``, ``~``) or with two or
    more slashes (a Hub id has one) is never a Hub id; say it is missing instead of letting the Hub
    client complain about its form.
    """
    for role in ("student", "teacher", "tokenizer", "student_init_from"):
        source = getattr(config, role)
        if source and (written_as_path(source) or source.count("/") >= 2) and not Path(source).expanduser().exists():
            where = "" if Path(source).expanduser().is_absolute() else f" (relative to {str(Path.cwd())!r})"
            raise ConfigError(f"{role} folder {source!r} does not exist{where}")


def _looks_like_model(name: str) -> bool:
    """A folder, or something shaped like a Hub id (``org/name`` or a bare known model name)."""
    return Path(name).exists() or "/" in name or name.startswith(("bert-", "distilbert-", "roberta-"))
