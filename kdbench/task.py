"""The contract between the engine and a task adapter.

A task turns files (or a Hub dataset) into tokenised splits, says which head the model needs and
scores model outputs with the official metric. It never knows which method is running: methods
see only tensors (logits, start/end logits, hidden states) through :class:`kdbench.features.Features`.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ClassVar

import numpy as np


class HeadType(str, enum.Enum):
    CLASSIFICATION = "classification"
    REGRESSION = "regression"
    SPAN = "span"  # extractive QA: start/end logits
    MASKED_LM = "masked-lm"  # general (pre-training) distillation on a plain-text corpus


@dataclass(frozen=True)
class TaskSpec:
    """What the engine and methods may know about a task."""

    name: str
    head: HeadType
    main_metric: str  # the metric tuning maximises and tables report first
    label_names: tuple[str, ...] | None = None  # classification labels, by name, in head order
    # The dev metrics a run may pick its best checkpoint on (train.select_metric), main metric
    # included; () declares none, and then any name is taken as given.
    selectable_metrics: tuple[str, ...] = ()
    # Where the task has no training set of its own, the task its models are fine-tuned on
    # (GLUE's diagnostic AX is predicted with an MNLI model); None: the task itself.
    trained_as: str | None = None

    @property
    def num_labels(self) -> int:
        if self.head is HeadType.REGRESSION:
            return 1
        if self.label_names is None:
            raise ValueError(f"task {self.name!r} has no labels")
        return len(self.label_names)


MODEL_INPUTS = ("input_ids", "attention_mask", "token_type_ids")
TRAINING_TARGETS = ("labels", "start_positions", "end_positions")


@dataclass
class EncodedSplit:
    """A tokenised split.

    ``features`` is a ``datasets.Dataset`` whose columns are model inputs (``MODEL_INPUTS``), the
    training targets (``TRAINING_TARGETS``) and, for evaluation, whatever scoring needs (example
    ids, offsets). ``examples`` holds the raw examples when scoring needs them (SQuAD).
    ``skipped_rows`` counts malformed rows dropped under ``on_bad_row=skip``.
    """

    name: str
    features: Any
    examples: list[dict[str, Any]] | None = None
    skipped_rows: int = 0
    metadata: dict[str, Any] = field(default_factory=dict)

    def __len__(self) -> int:
        return len(self.features)


class Task:
    """Base class of task adapters. Subclasses set ``spec`` (or build it in ``__init__``)."""

    spec: TaskSpec
    aliases: ClassVar[tuple[str, ...]] = ()

    def encode_train(self, tokenizer: Any, run: Any) -> EncodedSplit:
        """The training split, tokenised, capped at ``run.data.max_train_samples``."""
        raise NotImplementedError

    def encode_eval(self, tokenizer: Any, run: Any) -> list[EncodedSplit]:
        """The dev split(s) scored after training (MNLI: matched and mismatched)."""
        raise NotImplementedError

    def encode_test(self, tokenizer: Any, run: Any) -> list[EncodedSplit]:
        """The unlabelled test split(s) for ``kdbench predict`` (GLUE: with an ``idx`` column and
        ``metadata["submission_file"]``). Optional: tasks without public test inputs leave it out."""
        raise NotImplementedError(f"task {self.spec.name!r} has no test split to predict")

    def data_sources(self, run: Any) -> list[Path | str]:
        """Where the training and dev splits of ``run`` are read from: file paths, or descriptors
        (text) of Hub datasets. Their fingerprints enter the run's identity, so a changed file makes
        a new run. Adapters that read files must list every one of them."""
        return []

    def score(self, split: EncodedSplit, outputs: dict[str, np.ndarray]) -> dict[str, float]:
        """Official metrics from model outputs (``logits`` or ``start_logits``/``end_logits``).

        Metric names carry the split when a task has several (``acc`` and ``acc_mm`` for MNLI).
        Span tasks get one row of start/end logits per feature (window), in ``split.features``
        order, right-padded with -10000; they map windows back to examples themselves.
        """
        raise NotImplementedError

    def score_prediction_file(self, path: Path, data_dir: Path | None, split: str = "dev") -> dict[str, float]:
        """Score a prediction file with no model (``kdbench evaluate``)."""
        raise NotImplementedError(f"task {self.spec.name!r} cannot score prediction files yet")
