"""The plug-in API: everything a distillation method or a task needs, from one module.

Plug-ins import from here only (``from kdbench.api import Method, Stage, ...``); these names are
kept stable across releases, while the modules they come from may move. Register a plug-in through
the entry-point groups ``kdbench.methods`` / ``kdbench.tasks`` (see the README's "Adding a method"
and "Adding a task").

Methods
    :class:`Method` (subclass it), :class:`Stage` (one training stage: features, loss,
    ``uses_extras``), :class:`MethodContext` (what a method may know when declaring stages),
    :class:`ParamGroup` and :func:`all_parameters` (optimiser groups), :class:`Optimization` (a
    stage's official optimiser settings), :func:`require_same_attention_heads`,
    :class:`MlmMasking` (BERT masking as ``Stage.prepare_batch``), :func:`task_loss` (the
    supervised loss of each head).
Features a loss reads
    :class:`FeatureRequest` (``hidden_states``, ``attention_scores``, ``attention_probs``; logits
    always come), :class:`Features`, and the requests ``HIDDEN``, ``ATTENTION_SCORES``,
    ``ATTENTION_PROBS``, ``NO_FEATURES``.
Parameters
    :func:`constrained`, :func:`loss_weight`, :func:`softmax_temperature` (declared field
    constraints, enforced when a run's parameters are read; rules over several fields go in the
    params dataclass's ``check_combination``), :class:`ConfigError`, and the tuning dimensions
    :class:`FloatRange`, :class:`IntRange`, :class:`Choice`.
Tasks
    :class:`Task`, :class:`TaskSpec`, :class:`HeadType`, :class:`EncodedSplit`, :class:`DataError`;
    classification tasks as data: :class:`ClassificationTask`, :class:`ClassificationTaskSpec`.
"""

from __future__ import annotations

from kdbench.constraints import ConfigError, constrained, loss_weight, softmax_temperature
from kdbench.errors import DataError
from kdbench.features import ATTENTION_PROBS, ATTENTION_SCORES, HIDDEN, NO_FEATURES, FeatureRequest, Features
from kdbench.masking import MlmMasking
from kdbench.method import (Batch, LossFn, LossWithExtrasFn, Method, MethodContext, ParamGroup, Stage,
                            all_parameters, require_same_attention_heads)
from kdbench.optimization import Optimization
from kdbench.search_space import Choice, FloatRange, IntRange, SearchSpace
from kdbench.task import EncodedSplit, HeadType, Task, TaskSpec
from kdbench.task_loss import task_loss
from kdbench.tasks.classification import ClassificationTask, ClassificationTaskSpec

__all__ = [
    "ATTENTION_PROBS", "ATTENTION_SCORES", "HIDDEN", "NO_FEATURES",
    "Batch", "Choice", "ClassificationTask", "ClassificationTaskSpec", "ConfigError", "DataError", "EncodedSplit",
    "FeatureRequest", "Features", "FloatRange", "HeadType", "IntRange", "LossFn", "LossWithExtrasFn", "Method",
    "MethodContext", "MlmMasking", "Optimization", "ParamGroup", "SearchSpace", "Stage", "Task", "TaskSpec",
    "all_parameters", "constrained", "loss_weight", "require_same_attention_heads", "softmax_temperature",
    "task_loss",
]
