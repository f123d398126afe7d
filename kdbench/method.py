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
from kdbench.search_space import SearchSpace
from kdbench.task import TaskSpec

Batch = Mapping[str, Tensor]
# A stage loss returns named terms, each already weighted; the engine optimises their sum and logs
# every term by name (so a NaN can be traced to the term that produced it).
LossFn = Callable[[Batch, Features, Features | None], dict[str, Tensor]]


@dataclass(frozen=True)
class ParamGroup:
    """Parameters trained at ``lr_scale`` times the stage's learning rate."""

    params: tuple[nn.Parameter, ...]
    lr_scale: float = 1.0
    name: str = "default"


@dataclass
class Stage:
    """One training stage of a method.

    ``epochs`` / ``lr`` override the run's ``train`` values when set. ``select_best`` chooses the
    checkpoint with the best dev score (meaningless for intermediate-layer stages whose head is not
    trained yet: those keep their last state). ``param_groups`` returns the optimiser groups; by
    default every student parameter plus the method's extra modules, at scale 1.
    """

    name: str
    loss: LossFn
    student_features: FeatureRequest = NO_FEATURES
    teacher_features: FeatureRequest = NO_FEATURES
    uses_teacher: bool = True
    epochs: float | None = None
    lr: float | None = None
    select_best: bool = True
    param_groups: Callable[[nn.Module, nn.Module], list[ParamGroup]] | None = None
    head: str | None = None  # None: the task's head; "masked-lm" for pre-training distillation
    # Applied to every training batch before the forward passes (e.g. MLM masking for pre-training
    # distillation). Pure: takes the collated batch, returns a new mapping; may use torch's RNG,
    # which the engine seeds.
    prepare_batch: Callable[[Batch], Batch] | None = None


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
    :meth:`stages`; they may override :meth:`extra_modules`, :meth:`validate` and
    :meth:`search_space`."""

    name: ClassVar[str]
    description: ClassVar[str] = ""
    Params: ClassVar[type] = NoParams
    requires_teacher: ClassVar[bool] = True
    # How a preset student is initialised when the run says student_init=auto.
    default_student_init: ClassVar[str] = "random"
    default_student_layers: ClassVar[str] = "bottom"

    def __init__(self, params: Any | None = None):
        self.params = params if params is not None else self.Params()

    @classmethod
    def from_overrides(cls, values: Mapping[str, Any]) -> Method:
        """Build the method from raw ``method_params`` (text or typed); unknown names are errors."""
        try:
            params = from_mapping(cls.Params, dict(values), where=f"{cls.name} parameter")
        except ConfigError as error:
            raise ConfigError(f"method {cls.name}: {error}") from None
        return cls(params)

    def params_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self.params)

    def search_space(self) -> SearchSpace:
        return {}

    def validate(self, context: MethodContext) -> None:
        """Raise ConfigError before training when teacher/student/task cannot work together."""

    def extra_modules(self, context: MethodContext) -> nn.ModuleDict:
        """Trainable modules besides the student (e.g. projections); trained and checkpointed."""
        return nn.ModuleDict()

    def stages(self, context: MethodContext) -> list[Stage]:
        raise NotImplementedError


def all_parameters(student: nn.Module, extras: nn.Module) -> list[ParamGroup]:
    params: Iterable[nn.Parameter] = list(student.parameters()) + list(extras.parameters())
    return [ParamGroup(tuple(p for p in params if p.requires_grad))]

