"""The contract between the engine and a distillation method.

A method is a small object: typed hyperparameters (``Params``), optional extra trainable modules
(projections), and a list of :class:`Stage` declarations. Each stage names the features it needs
from teacher and student and a pure loss function over them. The engine does everything else
(data, optimisation, evaluation, checkpoints), so a method never touches a training loop.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any, ClassVar

from torch import Tensor, nn
from transformers import PretrainedConfig

from kdbench.config import ConfigError, RunConfig, from_mapping
from kdbench.features import NO_FEATURES, FeatureRequest, Features
from kdbench.optimization import Optimization
from kdbench.search_space import SearchSpace
from kdbench.task import HeadType, TaskSpec

Batch = Mapping[str, Tensor]
# A stage loss returns named terms, each already weighted; the engine optimises their sum and logs
# every term by name (so a NaN can be traced to the term that produced it).
LossFn = Callable[[Batch, Features, Features | None], dict[str, Tensor]]
# The loss of a stage with ``uses_extras=True``: also given the method's extra modules (the
# ``nn.ModuleDict`` that :meth:`Method.extra_modules` built, trained and checkpointed with the student).
LossWithExtrasFn = Callable[[Batch, Features, Features | None, nn.ModuleDict], dict[str, Tensor]]
ALL_HEADS: tuple[HeadType, ...] = tuple(HeadType)


@dataclass(frozen=True)
class ParamGroup:
    """Parameters trained at ``lr_scale`` times the stage's learning rate."""

    params: tuple[nn.Parameter, ...]
    lr_scale: float = 1.0
    name: str = "default"


@dataclass
class Stage:
    """One training stage of a method.

    ``optimization`` declares how the stage is optimised in its authors' code (optimiser, schedule,
    warm-up, betas, weight decay, clipping, epochs; :mod:`kdbench.optimization`): values the user
    gives explicitly for the run (``lr=``, ``epochs=``, ``train.*``) win over it, and undeclared
    fields take kdbench's generic defaults. ``epochs`` / ``lr`` are the user's own choice for this
    stage through the method's parameters (e.g. ``kt_lr=``); set, they win over both. ``select_best`` chooses the
    checkpoint with the best dev score (meaningless for intermediate-layer stages whose head is not
    trained yet: those keep their last state). ``param_groups`` returns the optimiser groups; by
    default every student parameter plus the method's extra modules, at scale 1.
    """

    name: str
    loss: LossFn | LossWithExtrasFn
    student_features: FeatureRequest = NO_FEATURES
    teacher_features: FeatureRequest = NO_FEATURES
    uses_teacher: bool = True
    epochs: float | None = None
    lr: float | None = None
    optimization: Optimization | None = None
    select_best: bool = True
    param_groups: Callable[[nn.Module, nn.Module], list[ParamGroup]] | None = None
    head: str | None = None  # None: the task's head; "masked-lm" for pre-training distillation
    # Applied to every training batch before the forward passes (e.g. MLM masking for pre-training
    # distillation). Pure: takes the collated batch, returns a new mapping; may use torch's RNG,
    # which the engine seeds.
    prepare_batch: Callable[[Batch], Batch] | None = None
    # True: ``loss`` takes the method's extra modules as a fourth argument (projections live there,
    # not on the method object, so the loss reads exactly the modules the engine trains).
    uses_extras: bool = False

    def compute(self, batch: Batch, student: Features, teacher: Features | None,
                extras: nn.ModuleDict) -> dict[str, Tensor]:
        """The stage's loss terms; ``extras`` reach the loss when the stage ``uses_extras``."""
        if self.uses_extras:
            return self.loss(batch, student, teacher, extras)  # type: ignore[call-arg]
        return self.loss(batch, student, teacher)  # type: ignore[call-arg]


@dataclass(frozen=True)
class MethodContext:
    """What a method may know when it declares its stages."""

    task: TaskSpec
    student_config: PretrainedConfig
    teacher_config: PretrainedConfig | None
    run: RunConfig


@dataclass
class NoParams:
    """A method without hyperparameters of its own."""


class Method:
    """Base class of distillation methods. Subclasses set ``name`` and ``Params`` and implement
    :meth:`stages`; they may override :meth:`extra_modules`, :meth:`validate`,
    :meth:`initialize_student`, :meth:`supported_heads` and :meth:`search_space`.

    ``Params`` is a dataclass whose fields declare their constraints
    (:func:`kdbench.constraints.constrained`, :func:`~kdbench.constraints.loss_weight`); rules over
    several fields go in its ``check_combination()``. Both run when the method is built from a run's
    parameters, before anything is loaded.
    """

    name: ClassVar[str]
    description: ClassVar[str] = ""
    Params: ClassVar[type] = NoParams
    requires_teacher: ClassVar[bool] = True
    # The task heads the method can train; a run on another head fails at planning, before any model loads.
    heads: ClassVar[tuple[HeadType, ...]] = ALL_HEADS
    # For a head the method does not train: the method to use instead (named in the error).
    instead_for_head: ClassVar[Mapping[HeadType, str]] = {}
    # How a preset student is initialised when the run says student_init=auto (and a teacher is given):
    # random | teacher (copy the teacher layers named by default_student_layers).
    default_student_init: ClassVar[str] = "random"
    default_student_layers: ClassVar[str] = "bottom"

    def __init__(self, params: Any | None = None):
        self.params = params if params is not None else self.Params()

    @classmethod
    def from_overrides(cls, values: Mapping[str, Any]) -> Method:
        """Build the method from raw ``method_params`` (text or typed); unknown names are errors."""
        try:
            params = from_mapping(cls.Params, dict(values), where="")
        except ConfigError as error:
            raise ConfigError(f"method {cls.name}: {error}") from None
        return cls(params)

    def params_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self.params)

    def search_space(self) -> SearchSpace:
        return {}

    def supported_heads(self) -> tuple[HeadType, ...]:
        """The task heads this configured method trains (default: the class's ``heads``)."""
        return self.heads

    def check_head(self, task: TaskSpec) -> None:
        """Raise ConfigError when the method cannot train ``task``'s head (called by planning)."""
        supported = self.supported_heads()
        if task.head not in supported:
            instead = self.instead_for_head.get(task.head)
            hint = f"; use method {instead!r}" if instead else ""
            raise ConfigError(f"method {self.name} does not support task {task.name!r} (head {task.head.value}); "
                              f"it trains {', '.join(h.value for h in supported)} heads{hint}")

    def validate(self, context: MethodContext) -> None:
        """Raise ConfigError before training when teacher/student/task cannot work together."""

    def initialize_student(self, student: nn.Module, teacher: nn.Module | None, context: MethodContext) -> None:
        """Method-specific initialisation of the built student from the teacher (e.g. MobileBERT's
        joint/progressive strategies copy the embeddings); runs after :meth:`validate`, before
        :meth:`extra_modules`. No-op by default."""

    def extra_modules(self, context: MethodContext) -> nn.ModuleDict:
        """Trainable modules besides the student (e.g. projections); trained and checkpointed. A
        stage declared with ``uses_extras=True`` receives them as its loss's fourth argument."""
        return nn.ModuleDict()

    def stages(self, context: MethodContext) -> list[Stage]:
        raise NotImplementedError


def require_same_attention_heads(context: MethodContext, method: str) -> None:
    """For methods that match attention maps head by head (TinyBERT, MobileBERT, MiniLM v1): raise
    ConfigError unless teacher and student have the same number of attention heads. Call it from
    :meth:`Method.validate`; it runs after the models are built and before any training step."""
    if context.teacher_config is None:
        return
    teacher_heads = getattr(context.teacher_config, "num_attention_heads", None)
    student_heads = getattr(context.student_config, "num_attention_heads", None)
    if teacher_heads != student_heads:
        raise ConfigError(
            f"method {method} compares attention maps head by head, but the teacher has {teacher_heads} "
            f"attention heads and the student {student_heads}; use a student with num_attention_heads="
            f"{teacher_heads} (e.g. a teacher-derived preset) or a method that does not transfer attention"
        )


def all_parameters(student: nn.Module, extras: nn.Module) -> list[ParamGroup]:
    params: Iterable[nn.Parameter] = list(student.parameters()) + list(extras.parameters())
    return [ParamGroup(tuple(p for p in params if p.requires_grad))]

