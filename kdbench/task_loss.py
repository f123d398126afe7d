"""The supervised (hard-label) objective of each head type, shared by fine-tuning and KD methods."""

from __future__ import annotations

from collections.abc import Mapping

import torch.nn.functional as F
from torch import Tensor

from kdbench.features import Features
from kdbench.task import HeadType


def task_loss(batch: Mapping[str, Tensor], student: Features, head: HeadType) -> Tensor:
    """Mean supervised loss of one batch.

    - classification: cross-entropy, mean over the batch;
    - regression: MSE between the single output and the gold score, mean over the batch;
    - span: (CE(start) + CE(end)) / 2, each a mean over the batch (as BERT's SQuAD code);
    - masked LM: cross-entropy over positions whose label is not -100, mean over those positions.
    """
    if head is HeadType.CLASSIFICATION:
        return F.cross_entropy(student.logits, batch["labels"])
    if head is HeadType.REGRESSION:
        return F.mse_loss(student.logits.squeeze(-1), batch["labels"].to(student.logits.dtype))
    if head is HeadType.SPAN:
        length = student.start_logits.shape[1]
        start = batch["start_positions"].clamp(0, length - 1)
        end = batch["end_positions"].clamp(0, length - 1)
        return (F.cross_entropy(student.start_logits, start) + F.cross_entropy(student.end_logits, end)) / 2
    if head is HeadType.MASKED_LM:
        logits = student.logits
        return F.cross_entropy(logits.reshape(-1, logits.shape[-1]), batch["labels"].reshape(-1), ignore_index=-100)
    raise ValueError(f"no task loss for head {head!r}")
