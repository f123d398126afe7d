"""The registries of kdbench and the built-in entries.

Built-ins are registered lazily by import path, so listing names imports nothing heavy; tables are
discovered from the spec files in ``results/tables/``. Third-party packages add entries through the
entry-point groups ``kdbench.methods``, ``kdbench.tasks``, ``kdbench.students`` and ``kdbench.tables``
(value: ``"module:attribute"``).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from kdbench.registry import Registry

if TYPE_CHECKING:
    from kdbench.method import Method
    from kdbench.task import Task



def _discover_tables(registry: Registry[Any]) -> None:
    """Tables: one per spec file ``results/tables/<name>.yaml``, read when first used."""
    from functools import partial

    from kdbench.tables.specs import load_spec, spec_files

    for name, path in spec_files().items():
        registry.register_loader(name, partial(load_spec, name), str(path))


def _load_task_spec(name: str, path: str) -> Task:
    from kdbench.config import ConfigError
    from kdbench.tasks.classification import ClassificationTask

    task = ClassificationTask.from_yaml(path)
    if task.spec.name != name:
        raise ConfigError(f"task spec {path!r}: name {task.spec.name!r} differs from the file name {name!r}")
    return task


def _discover_task_specs(registry: Registry[Any]) -> None:
    """Classification tasks declared as data: one per spec file ``results/tasks/<name>.yaml``."""
    from functools import partial
    from pathlib import Path

    import kdbench.results

    for path in sorted((Path(kdbench.results.__file__).resolve().parent / "tasks").glob("*.yaml")):
        registry.register_loader(path.stem, partial(_load_task_spec, path.stem, str(path)), str(path))


METHODS: Registry[type[Method]] = Registry("method", "kdbench.methods")
TASKS: Registry[Task] = Registry("task", "kdbench.tasks", discover=_discover_task_specs)
STUDENTS: Registry[Any] = Registry("student preset", "kdbench.students")
TABLES: Registry[Any] = Registry("table", "kdbench.tables", discover=_discover_tables)

# Methods: name -> class.
METHODS.register_lazy("finetune", "kdbench.methods.finetune:FineTune")
METHODS.register_lazy("kd", "kdbench.methods.kd:HintonKD", aliases=("vanilla-kd", "hinton"))
METHODS.register_lazy("pkd", "kdbench.methods.pkd:PatientKD", aliases=("bert-pkd",))
METHODS.register_lazy("distilbert", "kdbench.methods.distilbert:DistilBertTask")
METHODS.register_lazy("distilbert-pretrain", "kdbench.methods.distilbert:DistilBertPretrain",
                      aliases=("distilbert-general",))
METHODS.register_lazy("mobilebert", "kdbench.methods.mobilebert:MobileBertTransfer", aliases=("mobilebert-kt",))
METHODS.register_lazy("tinybert", "kdbench.methods.tinybert:TinyBERT")
METHODS.register_lazy("tinybert-general", "kdbench.methods.tinybert:TinyBERTGeneral")

# Tasks: name -> Task instance.
for _name in ("cola", "sst2", "mrpc", "stsb", "qqp", "mnli", "mnli-mm", "qnli", "rte", "wnli", "ax"):
    TASKS.register_lazy(_name, f"kdbench.tasks.glue:{_name.upper().replace('-', '_')}")
TASKS.register_lazy("squad", "kdbench.tasks.squad:SQUAD_V1", aliases=("squad-v1", "squad1.1", "squad-v1.1"))
TASKS.register_lazy("squad-v2", "kdbench.tasks.squad:SQUAD_V2", aliases=("squad2.0", "squad-v2.0"))
TASKS.register_lazy("corpus", "kdbench.tasks.corpus:CORPUS", aliases=("general", "pretraining"))

# Student presets: name -> StudentPreset (kdbench.students).
STUDENTS.register_lazy("tinybert-4l-312", "kdbench.students:TINYBERT_4L_312")
STUDENTS.register_lazy("tinybert-6l-768", "kdbench.students:TINYBERT_6L_768")
STUDENTS.register_lazy("bert-6l-768", "kdbench.students:BERT_6L_768")
STUDENTS.register_lazy("bert-4l-768", "kdbench.students:BERT_4L_768")
STUDENTS.register_lazy("bert-3l-768", "kdbench.students:BERT_3L_768")
STUDENTS.register_lazy("teacher-3l-192", "kdbench.students:TEACHER_3L_192")
for _name, _attr in (("mobilebert-24l", "MOBILEBERT_24L"), ("mobilebert-tiny", "MOBILEBERT_TINY"),
                    ("ib-bert-large", "IB_BERT_LARGE"), ("mobilebert-6l-384", "MOBILEBERT_6L_384")):
    STUDENTS.register_lazy(_name, f"kdbench.students:{_attr}")
for _layers in (1, 2, 3, 4, 5, 6):
    STUDENTS.register_lazy(f"teacher-{_layers}l", f"kdbench.students:TEACHER_{_layers}L")

