"""Plan-time checks that read model *configs* (never weights), run before a run folder exists.

Errors that used to surface at the first training step (a wasted queue slot on Slurm) are found
here in about a second: the output location, the teacher's head against the task's head and label
count, ``max_seq_length`` against each model's position limit, and the method itself, built with
both model configs so that its ``validate`` and ``stages`` run (``kdbench run --dry-run`` shows
exactly this).
"""

from __future__ import annotations

import copy
from dataclasses import dataclass
from pathlib import Path

from transformers import PretrainedConfig

from kdbench.config import ConfigError, RunConfig
from kdbench.engine.models import load_model_config, resolved_student_init, resolved_student_layers, with_task_head
from kdbench.engine.planning import RunPlan, check_model_paths_exist
from kdbench.method import Method, MethodContext, Stage
from kdbench.task import HeadType, TaskSpec

# Architectures whose position embeddings start after the padding index (RoBERTa's offset of 2).
_POSITION_OFFSET_MODEL_TYPES = ("roberta", "xlm-roberta", "camembert", "longformer", "bart", "mbart")
_HEAD_SUFFIXES = {
    "ForSequenceClassification": (HeadType.CLASSIFICATION, HeadType.REGRESSION),
    "ForQuestionAnswering": (HeadType.SPAN,),
}


@dataclass
class DryRun:
    """What planning built without loading weights: both model configs and the method's stages."""

    teacher_config: PretrainedConfig | None
    student_config: PretrainedConfig
    stages: list[Stage]

    def describe(self) -> list[str]:
        lines = []
        for role, cfg in (("teacher", self.teacher_config), ("student", self.student_config)):
            if cfg is not None:
                lines.append(f"{role}: {getattr(cfg, 'model_type', '?')}, {cfg.num_hidden_layers} layers, hidden "
                             f"{cfg.hidden_size}, {cfg.num_attention_heads} heads, "
                             f"{getattr(cfg, 'max_position_embeddings', '?')} positions")
        for stage in self.stages:
            lines.append(f"stage {stage.name}: epochs {stage.epochs if stage.epochs is not None else 'run'}, "
                         f"lr {stage.lr if stage.lr is not None else 'run'}, teacher "
                         f"{'yes' if stage.uses_teacher else 'no'}, select best {stage.select_best}")
        return lines


def check_output_folder(config: RunConfig) -> None:
    """``output`` must be a folder (or not exist yet): a file there would fail at the first write."""
    output = Path(config.output)
    for parent in (output, *output.parents):
        if parent.exists():
            if not parent.is_dir():
                raise ConfigError(f"--output {config.output!r}: {str(parent)!r} is a file, not a folder")
            break


def check_teacher_head(teacher: str, teacher_config: PretrainedConfig, spec: TaskSpec) -> None:
    """The teacher's saved head must be the task's: a classification teacher on a regression task
    (or the wrong number of labels) would fail at the first step, or train on garbage logits."""
    if spec.head is HeadType.MASKED_LM:
        return
    architectures = list(getattr(teacher_config, "architectures", None) or [])
    heads = {head for arch in architectures for suffix, kinds in _HEAD_SUFFIXES.items()
             if arch.endswith(suffix) for head in kinds}
    trained_as = spec.trained_as or spec.name
    fix = f"fine-tune a teacher on {trained_as} first (kdbench run finetune --task {trained_as} --student MODEL)"
    if architectures and spec.head not in heads:
        raise ConfigError(f"teacher {teacher!r} is a {'/'.join(architectures)} without a {spec.head.value} head "
                          f"for task {spec.name!r}; {fix}")
    if spec.head is HeadType.SPAN:
        return
    labels = int(getattr(teacher_config, "num_labels", 0) or 0)
    if spec.head is HeadType.REGRESSION and labels != 1:
        raise ConfigError(f"teacher {teacher!r} is a classification model with {labels} labels; task "
                          f"{spec.name!r} is a regression (num_labels=1); {fix}")
    if spec.head is HeadType.CLASSIFICATION and labels != spec.num_labels:
        kind = "a regression model (1 output)" if labels == 1 else f"a classifier with {labels} labels"
        raise ConfigError(f"teacher {teacher!r} is {kind}; task {spec.name!r} has {spec.num_labels} labels "
                          f"({', '.join(spec.label_names or ())}); {fix}")


def check_select_metric(config: RunConfig, spec: TaskSpec) -> None:
    """``train.select_metric`` must be a dev metric the task reports: an unknown name would only
    fail at the first evaluation, after an epoch of training."""
    chosen = config.train.select_metric
    if chosen is None:
        return
    if spec.head is HeadType.MASKED_LM:
        raise ConfigError(f"train.select_metric={chosen!r}: task {spec.name!r} has no dev metric to select on")
    if spec.selectable_metrics and chosen not in spec.selectable_metrics:
        raise ConfigError(f"train.select_metric={chosen!r} is not a dev metric of task {spec.name!r}; "
                          f"choose one of {', '.join(spec.selectable_metrics)}")


def position_limit(model_config: PretrainedConfig) -> int | None:
    """The longest input a model takes: ``max_position_embeddings`` (less RoBERTa's padding offset)."""
    limit = getattr(model_config, "max_position_embeddings", None)
    if not isinstance(limit, int):
        return None
    if getattr(model_config, "model_type", "") in _POSITION_OFFSET_MODEL_TYPES:
        limit -= (getattr(model_config, "pad_token_id", 1) or 1) + 1
    return limit


def check_sequence_length(config: RunConfig, models: dict[str, PretrainedConfig | None]) -> None:
    length = config.train.max_seq_length
    for role, model_config in models.items():
        limit = position_limit(model_config) if model_config is not None else None
        if limit is not None and length > limit:
            name = config.teacher if role == "teacher" else config.student
            raise ConfigError(f"max_seq_length={length} is longer than the {role} {name!r} takes "
                              f"(max_position_embeddings {limit}); use max_seq_length={limit} or less")


def student_config(plan: RunPlan, teacher_config: PretrainedConfig | None) -> PretrainedConfig:
    """The student's config as :func:`kdbench.engine.build_student` builds it, without weights."""
    config, spec = plan.config, plan.task.spec
    if plan.preset is not None:
        model_config = plan.preset.build_config(teacher_config)
    else:
        model_config = load_model_config(config.student, "student", config.trust_remote_code)
    return with_task_head(model_config, spec)


def check_copied_layers(plan: RunPlan, teacher_config: PretrainedConfig | None, student: PretrainedConfig) -> None:
    """A student initialised from teacher layers (``student_init=teacher``, or ``auto`` where the
    method's default is ``teacher``) copies layers that exist, as many as it has, into a student as
    wide as their model: checked on the configs, so ``--dry-run`` names a bad ``student_layers``."""
    from kdbench.students import resolve_teacher_layers

    config = plan.config
    kind, _ = resolved_student_init(plan, teacher_config is not None)
    if plan.preset is None or kind != "teacher":
        return
    source = (load_model_config(config.student_init_from, "student_init_from", config.trust_remote_code)
              if config.student_init_from else teacher_config)
    if source is None:
        raise ConfigError("student_init=teacher needs --teacher (or student_init_from=MODEL)")
    if source.model_type != student.model_type:
        raise ConfigError(f"student_init=teacher needs the same architecture; student is {student.model_type!r}, "
                          f"teacher {source.model_type!r}")
    for size in ("hidden_size", "intermediate_size", "num_attention_heads"):  # the copied tensors' shapes
        if getattr(source, size, None) != getattr(student, size, None):
            raise ConfigError(f"student_init=teacher copies layers of {size} {getattr(source, size, None)} into a "
                              f"student of {size} {getattr(student, size, None)}; use a student shaped like its "
                              "teacher (e.g. teacher-3l) or student_init=random")
    resolve_teacher_layers(resolved_student_layers(plan), source.num_hidden_layers, student.num_hidden_layers)


def build_stages(method: Method, context: MethodContext) -> list[Stage]:
    """Run the method's ``validate``, ``extra_modules`` and ``stages`` on a fresh copy of it (a
    method may keep what it builds on itself). A bug in a plug-in's stage declaration (a wrong
    keyword, an unknown feature) is reported in one line naming the method."""
    probe = type(method)(copy.deepcopy(method.params))
    probe.validate(context)
    try:
        probe.extra_modules(context)
        stages = probe.stages(context)
    except ConfigError:
        raise
    except (TypeError, ValueError, AttributeError, KeyError, NotImplementedError) as error:
        raise ConfigError(f"method {method.name}: its stages cannot be built: {type(error).__name__}: "
                          f"{str(error).strip().splitlines()[0] if str(error).strip() else ''}") from None
    if not stages:
        raise ConfigError(f"method {method.name} declares no stages")
    return list(stages)


def preflight(plan: RunPlan) -> DryRun:
    """Every plan-time check that needs model configs; raises ConfigError naming the bad value."""
    config, spec = plan.config, plan.task.spec
    check_output_folder(config)
    check_model_paths_exist(config)
    check_select_metric(config, spec)
    teacher_config = None
    if config.teacher:
        teacher_config = load_model_config(config.teacher, "teacher", config.trust_remote_code)
        if plan.method.requires_teacher:
            check_teacher_head(config.teacher, teacher_config, spec)
    student = student_config(plan, teacher_config)
    check_copied_layers(plan, teacher_config, student)
    check_sequence_length(config, {"teacher": teacher_config, "student": student})
    context = MethodContext(task=spec, student_config=student, teacher_config=teacher_config, run=config)
    return DryRun(teacher_config, student, build_stages(plan.method, context))
