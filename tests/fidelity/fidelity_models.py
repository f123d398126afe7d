"""Shared pieces of the fidelity tests: tiny float64 BERTs built from configs, one padded batch, and the
plug-in side of every comparison (method from the registry, its stages for those models, features captured
by :class:`kdbench.capture.FeatureCapture` exactly as the engine captures them).

The official side of each comparison lives in the test module that uses it, transcribed from the
official file named in each test's docstring."""

from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F
from torch import nn
from transformers import BertConfig

from kdbench.capture import FeatureCapture
from kdbench.config import build_run_config
from kdbench.features import FeatureRequest, Features
from kdbench.method import Method, MethodContext, Stage
from kdbench.plugins import METHODS
from kdbench.task import TaskSpec

VOCAB = 40
PAD_ID, CLS_ID, SEP_ID, MASK_ID = 0, 2, 3, 4
LENGTHS = (7, 4, 2)  # one full row, two padded rows: every loss sees padding
SEQ = max(LENGTHS)


def bert_config(layers: int, hidden: int = 16, heads: int = 2, **extra: Any) -> BertConfig:
    """A tiny BERT; weights drawn with std 0.2 (not 0.02) so that teacher and student logits differ
    clearly and every KL term is far above float64 rounding."""
    extra.setdefault("initializer_range", 0.2)
    return BertConfig(vocab_size=VOCAB, hidden_size=hidden, num_hidden_layers=layers, num_attention_heads=heads,
                      intermediate_size=24, max_position_embeddings=16, pad_token_id=PAD_ID, **extra)


def build(model_class: type, config: BertConfig, seed: int) -> torch.nn.Module:
    """A randomly initialised model in float64 and eval mode (dropout off, so both sides see one tensor)."""
    torch.manual_seed(seed)
    return model_class(config).double().eval()


def padded_batch(seed: int = 0) -> dict[str, torch.Tensor]:
    """``[CLS] w w ... [SEP] [PAD] ...`` rows of lengths 7, 4, 2 with two segments in the long rows."""
    g = torch.Generator().manual_seed(seed)
    ids = torch.full((len(LENGTHS), SEQ), PAD_ID, dtype=torch.long)
    mask = torch.zeros_like(ids)
    segments = torch.zeros_like(ids)
    for row, length in enumerate(LENGTHS):
        words = torch.randint(5, VOCAB, (length - 2,), generator=g)
        ids[row, :length] = torch.cat([torch.tensor([CLS_ID]), words, torch.tensor([SEP_ID])])
        mask[row, :length] = 1
        segments[row, length // 2:length] = 1 if length > 3 else 0
    return {"input_ids": ids, "attention_mask": mask, "token_type_ids": segments}


def context(method: str, task: TaskSpec, student: BertConfig, teacher: BertConfig, **run: Any) -> MethodContext:
    config = build_run_config({"method": method, "task": task.name, "student": "s", "teacher": "t", **run})
    return MethodContext(task=task, student_config=student, teacher_config=teacher, run=config)


def plugin(name: str, **params: Any) -> Method:
    """The method as a run builds it: from the registry, parameters given as text like overrides."""
    return METHODS.get(name).from_overrides({k: str(v) for k, v in params.items()})


def stage_named(stages: list[Stage], name: str) -> Stage:
    found = [stage for stage in stages if stage.name == name]
    assert len(found) == 1, f"no single stage {name!r} in {[s.name for s in stages]}"
    return found[0]


def capture(model: torch.nn.Module, request: FeatureRequest, batch: dict[str, torch.Tensor]) -> Features:
    """The features a stage receives: ``FeatureCapture`` around one forward pass, as the engine does it."""
    inputs = {k: v for k, v in batch.items() if k in ("input_ids", "attention_mask", "token_type_ids")}
    with FeatureCapture(model, request) as hooks, torch.no_grad():
        return hooks.collect(model(**inputs))


def as_float(terms: dict[str, torch.Tensor]) -> dict[str, float]:
    return {name: float(value) for name, value in terms.items()}


# BERT-PKD's distillation loss, used by its KD baseline and by the patient student (official side).
def pkd_distillation_loss(y, labels, teacher_scores, T, alpha, reduction_kd="mean", reduction_nll="mean"):
    """intersun/PKD-for-BERT-Model-Compression ``src/KD_loss.py`` L7-22, transcribed."""
    if teacher_scores is not None:
        d_loss = nn.KLDivLoss(reduction=reduction_kd)(F.log_softmax(y / T, dim=1),
                                                      F.softmax(teacher_scores / T, dim=1)) * T * T
    else:
        assert alpha == 0, f"alpha cannot be {alpha} when teacher scores are not provided"
        d_loss = 0.0
    nll_loss = F.cross_entropy(y, labels, reduction=reduction_nll)
    tol_loss = alpha * d_loss + (1.0 - alpha) * nll_loss
    return tol_loss, d_loss, nll_loss
