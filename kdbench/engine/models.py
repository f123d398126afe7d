"""Loading teachers and students with the task's head, and building a student from a preset."""

from __future__ import annotations

import logging
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from safetensors import SafetensorError
from torch import nn
from transformers import (
    AutoConfig,
    AutoModelForMaskedLM,
    AutoModelForQuestionAnswering,
    AutoModelForSequenceClassification,
    AutoTokenizer,
    PretrainedConfig,
    PreTrainedModel,
)

from kdbench.config import ConfigError
from kdbench.engine.checkpoints import CheckpointError
from kdbench.engine.planning import RunPlan
from kdbench.students import copy_teacher_weights, resolve_teacher_layers
from kdbench.task import HeadType, TaskSpec

log = logging.getLogger("kdbench")


HEAD_CLASSES = {
    HeadType.CLASSIFICATION: AutoModelForSequenceClassification,
    HeadType.REGRESSION: AutoModelForSequenceClassification,
    HeadType.SPAN: AutoModelForQuestionAnswering,
    HeadType.MASKED_LM: AutoModelForMaskedLM,
}


def head_kwargs(spec: TaskSpec, head: HeadType) -> dict[str, Any]:
    if head in (HeadType.CLASSIFICATION, HeadType.REGRESSION):
        labels = spec.label_names if head is HeadType.CLASSIFICATION else ("score",)
        return {
            "num_labels": spec.num_labels,
            "id2label": dict(enumerate(labels)),
            "label2id": {name: i for i, name in enumerate(labels)},
            "problem_type": "regression" if head is HeadType.REGRESSION else "single_label_classification",
        }
    return {}


def with_task_head(model_config: PretrainedConfig, spec: TaskSpec) -> PretrainedConfig:
    """``model_config`` set up for the task's head (labels, problem type), in place and returned."""
    for key, value in head_kwargs(spec, spec.head).items():
        setattr(model_config, key, value)
    return model_config


def load_model(name: str, head: HeadType, spec: TaskSpec, *, trust_remote_code: bool, role: str) -> PreTrainedModel:
    kwargs = head_kwargs(spec, head) if role == "student" else {}
    try:
        model = HEAD_CLASSES[head].from_pretrained(name, trust_remote_code=trust_remote_code, **kwargs)
    except SafetensorError as error:
        raise CheckpointError(f"{role} checkpoint {name!r} is corrupted or truncated ({error}); "
                              "re-create or re-download it") from None
    except (OSError, ValueError) as error:  # ValueError: unknown architecture, remote code refused, ...
        hint = ("; it ships its own Python code, which kdbench does not run unless you review it and pass "
                "trust_remote_code=true" if "trust_remote_code" in str(error) else "")
        raise ConfigError(f"{role} {name!r} cannot be loaded: {str(error).splitlines()[0]}{hint}") from None
    return model


def load_model_config(name: str, role: str, trust_remote_code: bool) -> PretrainedConfig:
    """A model's config.json through transformers, as a one-line ConfigError when it cannot be read."""
    try:
        return AutoConfig.from_pretrained(name, trust_remote_code=trust_remote_code)
    except (OSError, ValueError, KeyError) as error:  # missing/truncated config.json, bad repo id, offline Hub
        detail = str(error).strip().splitlines()[0] if str(error).strip() else type(error).__name__
        hint = ("; it ships its own Python code, which kdbench does not run unless you review it and pass "
                "trust_remote_code=true" if "trust_remote_code" in str(error) else "")
        raise ConfigError(f"{role} {name!r} cannot be loaded: {detail}{hint}") from None


def random_model(name: str, spec: TaskSpec, *, trust_remote_code: bool) -> PreTrainedModel:
    """``name``'s architecture (its config, with the task's head) with freshly initialised weights:
    ``student_init=random`` for a checkpoint student, e.g. a no-pre-training baseline of its shape."""
    model_config = with_task_head(load_model_config(name, "student", trust_remote_code), spec)
    model_config._attn_implementation = "sdpa"
    return HEAD_CLASSES[spec.head].from_config(model_config, trust_remote_code=trust_remote_code)


def teacher_label_order(teacher: PreTrainedModel, spec: TaskSpec) -> list[int] | None:
    """Index permutation putting the teacher's logits in the task's label order (by label NAME).

    ``None`` when the orders already agree. A teacher whose labels are not the task's is an error:
    distilling logits whose classes mean something else would silently produce garbage.
    """
    if spec.head is not HeadType.CLASSIFICATION:
        return None
    id2label = {int(k): str(v) for k, v in teacher.config.id2label.items()}
    teacher_names = [id2label[i] for i in range(len(id2label))]
    wanted = list(spec.label_names or ())
    if sorted(teacher_names) != sorted(wanted):
        trained_as = spec.trained_as or spec.name
        raise ConfigError(
            f"teacher labels {teacher_names} are not the labels of task {spec.name!r} {wanted}; "
            f"fine-tune the teacher on {trained_as} first (kdbench run finetune --task {trained_as} --student MODEL)"
        )
    order = [teacher_names.index(name) for name in wanted]
    return None if order == list(range(len(order))) else order


class DistillationModule(nn.Module):
    """What the Trainer optimises and checkpoints: the student plus the method's extra modules."""

    def __init__(self, student: PreTrainedModel, extras: nn.ModuleDict):
        super().__init__()
        self.student = student
        self.extras = extras

    def forward(self, **inputs: Any) -> Any:
        return self.student(**inputs)


TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "vocab.txt", "vocab.json", "spiece.model",
                   "sentencepiece.bpe.model")


def check_student_tokenizer(student: str, source: str, tokenizer: Any, trust_remote_code: bool) -> None:
    """A student checkpoint that ships its own tokenizer must use the run's (teacher's) vocabulary:
    the same text must give the same ids, or the student's embeddings read the wrong tokens.
    Checked for local folders that hold tokenizer files (a Hub id is not fetched just for this)."""
    folder = Path(student)
    if not folder.is_dir() or not any((folder / name).is_file() for name in TOKENIZER_FILES):
        return
    try:
        own = AutoTokenizer.from_pretrained(student, trust_remote_code=trust_remote_code)
    except (OSError, ValueError):  # no tokenizer of its own: it is trained with the run's
        return
    ours, theirs = tokenizer.get_vocab(), own.get_vocab()
    if ours == theirs:
        return
    differing = sorted({token for token in ours.keys() | theirs.keys() if ours.get(token) != theirs.get(token)},
                       key=lambda token: min(ours.get(token, 1 << 30), theirs.get(token, 1 << 30)))[:3]
    examples = ", ".join(f"{token!r}: {source} id {ours.get(token)}, student id {theirs.get(token)}"
                         for token in differing)
    raise ConfigError(f"student {student!r} has a different tokenizer than {source!r} ({len(theirs)} vs "
                      f"{len(ours)} tokens; e.g. {examples}); teacher and student must share one vocabulary")


@dataclass(frozen=True)
class StudentInit:
    """How a run's student was initialised: ``pretrained`` (a checkpoint), ``random``, or ``teacher``
    (the embeddings and the listed 0-based ``layers`` of ``source``: the teacher, or the model given as
    ``student_init_from``). ``chosen_by`` says whether the run chose it or the method's
    ``default_student_init`` did (``student_init=auto``)."""

    kind: str
    chosen_by: str  # "run" | "method default" | "no teacher" | "checkpoint student" (auto loads its weights)
    source: str | None = None
    layers: tuple[int, ...] = ()

    def describe(self) -> str:
        copied = f" (layers {list(self.layers)} of {self.source})" if self.layers else ""
        return f"{self.kind}{copied}, chosen by {self.chosen_by}"


def resolved_student_init(plan: RunPlan, has_teacher: bool) -> tuple[str, str]:
    """What ``student_init`` means for this run, and who chose it: ``auto`` takes the method's
    ``default_student_init`` where there is a model to copy from (a teacher or ``student_init_from``),
    else ``random``; any other value is the run's own choice."""
    config = plan.config
    if config.student_init != "auto":
        return config.student_init, "run"
    if has_teacher or config.student_init_from:
        return plan.method.default_student_init, "method default"
    return "random", "no teacher"


def resolved_student_layers(plan: RunPlan) -> Any:
    """The teacher layers a ``teacher``-initialised student copies: the run's ``student_layers``, or
    under ``auto`` the method's ``default_student_layers``."""
    layers = plan.config.student_layers
    return plan.method.default_student_layers if layers == "auto" else layers


def build_student(plan: RunPlan, teacher: PreTrainedModel | None, tokenizer: Any) -> PreTrainedModel:
    return build_student_with_init(plan, teacher, tokenizer)[0]


def build_student_with_init(plan: RunPlan, teacher: PreTrainedModel | None,
                            tokenizer: Any) -> tuple[PreTrainedModel, StudentInit]:
    """The student, built and initialised, and how it was initialised (logged)."""
    config, spec = plan.config, plan.task.spec
    head_class = HEAD_CLASSES[spec.head]
    if plan.preset is None and config.student_init == "random":
        student = random_model(config.student, spec, trust_remote_code=config.trust_remote_code)
        init = StudentInit("random", "run", config.student)
    elif plan.preset is None:  # planning refused student_init=teacher for a checkpoint
        student = load_model(config.student, spec.head, spec, trust_remote_code=config.trust_remote_code, role="student")
        init = StudentInit("pretrained", "run" if config.student_init == "pretrained" else "checkpoint student",
                           config.student)
    else:
        model_config = with_task_head(plan.preset.build_config(teacher.config if teacher is not None else None), spec)
        model_config._attn_implementation = "sdpa"
        student = head_class.from_config(model_config)
        kind, chosen_by = resolved_student_init(plan, teacher is not None)
        init = StudentInit(kind, chosen_by)
        if kind == "teacher":
            source, role = teacher, config.teacher
            if config.student_init_from:
                source = load_model(config.student_init_from, spec.head, spec,
                                    trust_remote_code=config.trust_remote_code, role="student_init_from")
                role = config.student_init_from
            if source is None:
                raise ConfigError("student_init=teacher needs --teacher (or student_init_from=MODEL)")
            choice = resolved_student_layers(plan)
            layers = resolve_teacher_layers(choice, source.config.num_hidden_layers, model_config.num_hidden_layers)
            copy_teacher_weights(student, source, layers)
            init = StudentInit(kind, chosen_by, role, tuple(layers))
    log.info("student initialisation: %s", init.describe())
    vocab = len(tokenizer)
    if student.config.vocab_size < vocab:
        raise ConfigError(f"student vocabulary ({student.config.vocab_size}) is smaller than the tokenizer's ({vocab})")
    if teacher is not None and teacher.config.vocab_size != student.config.vocab_size:
        raise ConfigError(f"teacher and student vocabularies differ ({teacher.config.vocab_size} vs "
                          f"{student.config.vocab_size}): distillation needs one tokenizer for both")
    return student, init


def training_device() -> torch.device:
    """This process's device: its own GPU (``LOCAL_RANK``) in a multi-GPU job, else the GPU or CPU."""
    if torch.cuda.is_available():
        return torch.device("cuda", int(os.environ.get("LOCAL_RANK", "0")))
    return torch.device("cpu")
