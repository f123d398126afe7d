"""Vanilla KD (``kd``): its stage through the plug-in against a transcription of the KD loss of BERT-PKD's
code, and ``hinton_kd_loss`` plus the regression (STS-B) and span (SQuAD) branches pinned on hand-computed
values.

Hinton et al. released no code; the reference implementation transcribed here is ``distillation_loss`` of
intersun/PKD-for-BERT-Model-Compression @ 9e9e860997ad4815f6ac655d1beb26a85ddd70bb ``src/KD_loss.py``
L7-22, the vanilla-KD baseline of the BERT-PKD tables: with ``reduction_kd="batchmean"`` it is Hinton's
per-example KL (kdbench's default), with its own default ``reduction_kd="mean"`` it is PKD's baseline
(``kl_reduction=mean``).
"""

from __future__ import annotations

import math

import pytest
import torch
from fidelity_models import bert_config, build, capture, context, padded_batch, pkd_distillation_loss, plugin
from transformers import BertForSequenceClassification

from kdbench.config import ConfigError
from kdbench.features import Features
from kdbench.losses import hinton_kd_loss
from kdbench.task import HeadType, TaskSpec

MNLI = TaskSpec("mnli", HeadType.CLASSIFICATION, "acc", ("entailment", "neutral", "contradiction"))
STSB = TaskSpec("stsb", HeadType.REGRESSION, "spearman")
SQUAD = TaskSpec("squad", HeadType.SPAN, "f1")
TOLERANCE = {"rel": 1e-12, "abs": 1e-15}
LN2, LN3 = math.log(2.0), math.log(3.0)
KL0 = 0.75 * math.log(0.75 / 0.5) + 0.25 * math.log(0.25 / 0.5)  # KL((¾, ¼) ‖ (½, ½)) by hand

pytestmark = pytest.mark.filterwarnings("ignore:reduction. 'mean' divides the total loss:UserWarning")


@pytest.mark.parametrize("params,reduction_kd", [
    ({}, "batchmean"),  # kdbench's defaults: Hinton, α 0.5, T 2
    ({"alpha": 0.7, "temperature": 20.0, "kl_reduction": "mean"}, "mean"),  # PKD's kd preset, argument_parser L248-255
], ids=["hinton-batchmean", "pkd-baseline-mean"])
def test_kd_stage_equals_the_reference_distillation_loss(params: dict, reduction_kd: str) -> None:
    """``src/KD_loss.py`` L7-22 (``alpha·d_loss + (1 − alpha)·nll_loss``) on the logits of two tiny float64
    models and a padded 3-class batch, against the plug-in's ``kd`` stage terms ``kd`` and ``ce``."""
    student_config, teacher_config = bert_config(2, num_labels=3), bert_config(4, num_labels=3)
    (stage,) = plugin("kd", **params).stages(context("kd", MNLI, student_config, teacher_config))
    student = build(BertForSequenceClassification, student_config, 41)
    teacher = build(BertForSequenceClassification, teacher_config, 42)
    batch = {**padded_batch(), "labels": torch.tensor([2, 0, 1])}
    with torch.no_grad():
        terms = stage.loss(batch, capture(student, stage.student_features, batch),
                           capture(teacher, stage.teacher_features, batch))
        inputs = {k: batch[k] for k in ("input_ids", "attention_mask", "token_type_ids")}
        y, teacher_scores = student(**inputs).logits, teacher(**inputs).logits
    alpha, temperature = params.get("alpha", 0.5), params.get("temperature", 2.0)
    total, d_loss, nll_loss = pkd_distillation_loss(y, batch["labels"], teacher_scores, temperature, alpha, reduction_kd)
    assert float(terms["kd"]) == pytest.approx(float(alpha * d_loss), **TOLERANCE)
    assert float(terms["ce"]) == pytest.approx(float((1 - alpha) * nll_loss), **TOLERANCE)
    assert float(sum(terms.values())) == pytest.approx(float(total), **TOLERANCE)


# ------------------------------------------------------------------------------ hand-computed values


def two_rows() -> tuple[torch.Tensor, torch.Tensor]:
    """Student uniform; teacher at T = 2: row 0 softmax(ln3, 0) = (¾, ¼), row 1 (½, ½)."""
    return torch.zeros(2, 2), torch.tensor([[2 * LN3, 0.0], [0.0, 0.0]])


def test_hinton_kd_loss_by_hand() -> None:
    """KL per row: KL0 and 0; batchmean KL0/2, × T² = 4 → 2·KL0; CE of a uniform student = ln 2.
    α = 0.25: ce = 0.75·ln 2, kd = 0.25·2·KL0; with ``reduction="mean"`` the KL is also divided by C = 2."""
    student, teacher = two_rows()
    labels = torch.tensor([0, 1])
    terms = hinton_kd_loss(student, teacher, labels, alpha=0.25, temperature=2.0)
    assert terms["ce"].item() == pytest.approx(0.75 * LN2, rel=1e-6)
    assert terms["kd"].item() == pytest.approx(0.25 * 2 * KL0, rel=1e-6)
    mean = hinton_kd_loss(student, teacher, labels, alpha=0.25, temperature=2.0, reduction="mean")
    assert mean["kd"].item() == pytest.approx(0.25 * KL0, rel=1e-6)
    assert mean["ce"].item() == pytest.approx(0.75 * LN2, rel=1e-6)


def test_hinton_kd_loss_alpha_ends_and_bad_values() -> None:
    student, teacher = two_rows()
    labels = torch.tensor([0, 1])
    only_ce = hinton_kd_loss(student, teacher, labels, alpha=0.0, temperature=2.0)
    only_kd = hinton_kd_loss(student, teacher, labels, alpha=1.0, temperature=2.0)
    assert (only_ce["kd"].item(), only_ce["ce"].item()) == (0.0, pytest.approx(LN2, rel=1e-6))
    assert (only_kd["ce"].item(), only_kd["kd"].item()) == (0.0, pytest.approx(2 * KL0, rel=1e-6))
    with pytest.raises(ValueError, match="alpha"):
        hinton_kd_loss(student, teacher, labels, alpha=1.5, temperature=2.0)
    with pytest.raises(ValueError, match="temperature"):
        hinton_kd_loss(student, teacher, labels, alpha=0.5, temperature=0.0)
    with pytest.raises(ValueError, match="reduction"):
        hinton_kd_loss(student, teacher, labels, alpha=0.5, temperature=2.0, reduction="none")


def kd_stage(task: TaskSpec, **params):
    config = bert_config(2, num_labels=1 if task.head is HeadType.REGRESSION else 2)
    (stage,) = plugin("kd", **params).stages(context("kd", task, config, bert_config(4)))
    return stage


def test_kd_regression_branch_by_hand() -> None:
    """STS-B: ``task = (1 − α)·mean((s − y)²)``, ``kd = α·mean((s − t)²)``, no temperature.
    s = (1, 3), gold y = (0, 3), teacher t = (2, 2), α = 0.25: task = 0.75·(1 + 0)/2, kd = 0.25·(1 + 1)/2."""
    stage = kd_stage(STSB, alpha=0.25, temperature=7.0)
    student = Features(logits=torch.tensor([[1.0], [3.0]]))
    teacher = Features(logits=torch.tensor([[2.0], [2.0]]))
    terms = stage.loss({"labels": torch.tensor([0.0, 3.0])}, student, teacher)
    assert terms["task"].item() == pytest.approx(0.375)
    assert terms["kd"].item() == pytest.approx(0.25)


def test_kd_span_branch_by_hand() -> None:
    """SQuAD: ``task = (1 − α)·(CE_start + CE_end)/2``, ``kd = α·(KL_start + KL_end)/2`` (batchmean, × T²).
    L = 2, uniform student: CE = ln 2 at each end; teacher start softmax(ln3, 0) = (¾, ¼) at T = 2 (KL0 × 4),
    teacher end uniform (0). α = 0.5: task = 0.5·ln 2, kd = 0.5·(4·KL0 + 0)/2 = KL0; with
    ``kl_reduction=mean`` the KL is divided by L = 2 as well."""
    student = Features(start_logits=torch.zeros(1, 2), end_logits=torch.zeros(1, 2))
    teacher = Features(start_logits=torch.tensor([[2 * LN3, 0.0]]), end_logits=torch.zeros(1, 2))
    batch = {"start_positions": torch.tensor([0]), "end_positions": torch.tensor([1])}
    terms = kd_stage(SQUAD, alpha=0.5, temperature=2.0).loss(batch, student, teacher)
    assert terms["task"].item() == pytest.approx(0.5 * LN2, rel=1e-6)
    assert terms["kd"].item() == pytest.approx(KL0, rel=1e-6)
    mean = kd_stage(SQUAD, alpha=0.5, temperature=2.0, kl_reduction="mean").loss(batch, student, teacher)
    assert mean["kd"].item() == pytest.approx(KL0 / 2, rel=1e-6)


def test_kd_rejects_an_unknown_reduction() -> None:
    with pytest.raises(ConfigError, match="kl_reduction.*'sum'"):
        plugin("kd", kl_reduction="sum")
