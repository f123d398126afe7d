"""Prediction and dev-set scoring of a student."""

from __future__ import annotations

from typing import Any

import numpy as np
import torch
from torch import Tensor
from transformers import DataCollatorWithPadding, PreTrainedModel

from kdbench.task import MODEL_INPUTS, EncodedSplit, Task


def model_inputs(batch: dict[str, Any]) -> dict[str, Tensor]:
    return {key: batch[key] for key in MODEL_INPUTS if key in batch}


@torch.no_grad()
def predict(model: PreTrainedModel, split: EncodedSplit, tokenizer: Any, batch_size: int) -> dict[str, np.ndarray]:
    """Raw outputs of ``model`` on ``split`` (``logits`` or ``start_logits``/``end_logits``).

    Span logits of batches with different lengths are right-padded with -10000 to one width.
    """
    was_training = model.training
    model.eval()
    device = next(model.parameters()).device
    columns = [c for c in MODEL_INPUTS if c in split.features.column_names]
    collate = DataCollatorWithPadding(tokenizer)
    features = split.features.select_columns(columns)
    outputs: dict[str, list[np.ndarray]] = {}
    for start in range(0, len(features), batch_size):
        rows = [features[i] for i in range(start, min(start + batch_size, len(features)))]
        batch = {k: v.to(device) for k, v in collate(rows).items()}
        result = model(**batch)
        for name in ("logits", "start_logits", "end_logits"):
            value = getattr(result, name, None)
            if value is not None:
                outputs.setdefault(name, []).append(value.float().cpu().numpy())
    model.train(was_training)
    merged = {}
    for name, parts in outputs.items():
        if parts[0].ndim == 2 and name != "logits":
            width = max(p.shape[1] for p in parts)
            parts = [np.pad(p, ((0, 0), (0, width - p.shape[1])), constant_values=-10000.0) for p in parts]
        merged[name] = np.concatenate(parts, axis=0)
    return merged


def evaluate_student(model: PreTrainedModel, task: Task, splits: list[EncodedSplit], tokenizer: Any,
                     batch_size: int) -> dict[str, float]:
    metrics: dict[str, float] = {}
    for split in splits:
        metrics.update(task.score(split, predict(model, split, tokenizer, batch_size)))
    return metrics
