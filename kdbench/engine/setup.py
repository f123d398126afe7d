"""Everything a run sets up before its first training step, shared by ``kdbench run`` and
``kdbench bench`` so that the benchmark measures exactly what the engine runs."""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Any

import torch
from transformers import AutoTokenizer, DataCollatorWithPadding, PreTrainedModel, set_seed

from kdbench.cache import TeacherCacheSession, add_index_columns
from kdbench.config import ConfigError
from kdbench.engine.models import (DistillationModule, StudentInit, build_student_with_init,
                                   check_student_tokenizer, load_model, teacher_label_order)
from kdbench.engine.planning import RunPlan
from kdbench.engine.trainer import resolved_precision
from kdbench.method import MethodContext, Stage
from kdbench.task import MODEL_INPUTS, TRAINING_TARGETS, EncodedSplit

log = logging.getLogger("kdbench")


@dataclass
class RunData:
    """The tokenizer and the tokenised splits of a run."""

    tokenizer: Any
    train_split: EncodedSplit
    eval_splits: list[EncodedSplit]

    def train_dataset(self) -> Any:
        """The training rows as the Trainer reads them: model inputs, targets and the example index."""
        features = self.train_split.features
        columns = [c for c in (*MODEL_INPUTS, *TRAINING_TARGETS) if c in features.column_names]
        return add_index_columns(features.select_columns(columns))


@dataclass
class Distillation:
    """A method made concrete for one student and teacher: the trained module, its stages and the
    permutation that puts the teacher's logits in the task's label order."""

    module: DistillationModule
    stages: list[Stage]
    context: MethodContext
    teacher_order: list[int] | None
    student_init: StudentInit


def load_data(plan: RunPlan) -> RunData:
    """Tokenizer and tokenised splits; a missing or malformed file fails here, before any model loads."""
    config, task = plan.config, plan.task
    tokenizer_source = config.tokenizer or config.teacher or config.student
    if plan.preset is not None and not (config.tokenizer or config.teacher):
        raise ConfigError(f"student preset {config.student!r} has no tokenizer of its own: give --teacher or tokenizer=NAME")
    tokenizer = AutoTokenizer.from_pretrained(tokenizer_source, trust_remote_code=config.trust_remote_code)
    if plan.preset is None and tokenizer_source != config.student:
        check_student_tokenizer(config.student, tokenizer_source, tokenizer, config.trust_remote_code)
    train_split = task.encode_train(tokenizer, config)
    eval_splits = task.encode_eval(tokenizer, config)
    if len(train_split) == 0:
        raise ConfigError(f"task {task.spec.name!r}: the training split is empty")
    return RunData(tokenizer, train_split, eval_splits)


def load_teacher(plan: RunPlan, device: torch.device) -> PreTrainedModel | None:
    """The run's teacher, frozen, in eval mode on ``device`` (compiled if the run asks); None without one."""
    config, spec = plan.config, plan.task.spec
    if not config.teacher:
        return None
    teacher = load_model(config.teacher, spec.head, spec, trust_remote_code=config.trust_remote_code, role="teacher")
    teacher.to(device).eval()
    for parameter in teacher.parameters():
        parameter.requires_grad_(False)
    if config.train.compile:  # compiles forward in place: attribute access and capture hooks keep working
        teacher.compile()
    return teacher


def build_distillation(plan: RunPlan, teacher: PreTrainedModel | None, tokenizer: Any,
                       device: torch.device) -> Distillation:
    """Build the student, let the method validate the pair and initialise the student, and build the
    method's extra modules and stages."""
    config, method, spec = plan.config, plan.method, plan.task.spec
    teacher_order = teacher_label_order(teacher, spec) if teacher is not None and method.requires_teacher else None
    student, student_init = build_student_with_init(plan, teacher, tokenizer)
    student.to(device)
    if config.train.compile:
        student.compile()
    context = MethodContext(task=spec, student_config=student.config,
                            teacher_config=teacher.config if teacher is not None else None, run=config)
    method.validate(context)
    method.initialize_student(student, teacher, context)
    extras = method.extra_modules(context).to(device)
    stages = method.stages(context)
    return Distillation(DistillationModule(student, extras), stages, context, teacher_order, student_init)


@dataclass
class PreparedRun:
    """Everything :func:`prepare_run` sets up: data, teacher, the distillation and its teacher cache."""

    data: RunData
    teacher: PreTrainedModel | None
    distillation: Distillation
    train_dataset: Any
    teacher_cache: TeacherCacheSession | None


def prepare_run(plan: RunPlan, device: torch.device) -> PreparedRun:
    """Seed, data, teacher, student and method, and the teacher-output cache, in that order."""
    config = plan.config
    set_seed(config.train.seed)
    data = load_data(plan)
    teacher = load_teacher(plan, device)
    distillation = build_distillation(plan, teacher, data.tokenizer, device)
    train_dataset = data.train_dataset()
    teacher_cache = None
    if teacher is not None and plan.method.requires_teacher:
        teacher_cache = TeacherCacheSession.from_run(config, teacher, train_dataset,
                                                     DataCollatorWithPadding(data.tokenizer), device,
                                                     plan.task.spec.head.value, resolved_precision(config))
    return PreparedRun(data, teacher, distillation, train_dataset, teacher_cache)
