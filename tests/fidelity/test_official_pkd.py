"""BERT-PKD's stage, built through the plug-in, against a float64 transcription of the official code.

Official code: intersun/PKD-for-BERT-Model-Compression @ 9e9e860997ad4815f6ac655d1beb26a85ddd70bb
(``src/KD_loss.py``, ``NLI_KD_training.py``, ``src/modeling.py``, ``src/utils.py``,
``src/nli_data_processing.py``, ``scripts/run_student_patience.py``, and the bundled
``BERT/pytorch_pretrained_bert/modeling.py``). The official teacher's [CLS] vectors of all N layers are
stored by ``eval_model_dataloader(detailed=True)`` and selected by ``--fc_layer_idx`` (0-based over the
layer outputs); the student's are its layer outputs except the last. One padded batch, float64 on both
sides (the official fp16 casts are the bug not copied).
"""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from fidelity_models import (
    bert_config,
    build,
    capture,
    context,
    padded_batch,
    pkd_distillation_loss,
    plugin,
)
from torch import nn
from transformers import BertForSequenceClassification

from kdbench.task import HeadType, TaskSpec

RTE = TaskSpec("rte", HeadType.CLASSIFICATION, "acc", ("entailment", "not_entailment"))
MNLI = TaskSpec("mnli", HeadType.CLASSIFICATION, "acc", ("entailment", "neutral", "contradiction"))
TOLERANCE = {"rel": 1e-12, "abs": 1e-15}

pytestmark = pytest.mark.filterwarnings("ignore:reduction. 'mean' divides the total loss:UserWarning")


# ------------------------------------------------------------------------------ official side


def patience_loss(teacher_patience, student_patience, normalized_patience=False):
    """``src/KD_loss.py`` L25-30 without the final ``.float()``/``.half()`` casts (fp16: not copied)."""
    if normalized_patience:
        teacher_patience = F.normalize(teacher_patience, p=2, dim=2)
        student_patience = F.normalize(student_patience, p=2, dim=2)
    return F.mse_loss(teacher_patience, student_patience)


def cls_of_every_layer(model: nn.Module, batch: dict[str, torch.Tensor]) -> list[torch.Tensor]:
    """``BertForSequenceClassificationEncoder.forward`` (``src/modeling.py`` L120-123): ``[full_output[i][:, 0]]``
    where ``full_output`` is ``BertEncoder.forward``'s list of the N layer outputs, embedding output
    excluded (``BERT/pytorch_pretrained_bert/modeling.py`` L399-407)."""
    inputs = {k: batch[k] for k in ("input_ids", "attention_mask", "token_type_ids")}
    with torch.no_grad():
        hidden = model(**inputs, output_hidden_states=True).hidden_states[1:]
    return [layer[:, 0] for layer in hidden]


def official_pkd(student, teacher, batch, fc_layer_idx: str, T: float, alpha: float, beta: float,
                 normalize_patience: bool):
    """``NLI_KD_training.py`` L256-278 with the teacher knowledge of ``src/nli_data_processing.py`` L670-671
    (``extra_knowledge[int(i)] for i in fc_layer_idx``) and the teacher logits it stored (``pred_logit``,
    ``src/utils.py`` L176-209). Returns ``(loss, kd_loss, ce_loss, pt_loss)``."""
    inputs = {k: batch[k] for k in ("input_ids", "attention_mask", "token_type_ids")}
    with torch.no_grad():
        teacher_pred = teacher(**inputs).logits
        logits_pred_student = student(**inputs).logits
    feature_maps = cls_of_every_layer(teacher, batch)
    layer_index = [int(i) for i in fc_layer_idx.split(",")]
    teacher_patience = torch.stack([feature_maps[int(i)] for i in layer_index]).transpose(0, 1)
    full_output = cls_of_every_layer(student, batch)
    student_patience = torch.stack(full_output[:-1]).transpose(0, 1)
    loss_dl, kd_loss, ce_loss = pkd_distillation_loss(logits_pred_student, batch["labels"], teacher_pred, T=T, alpha=alpha)
    pt_loss = beta * patience_loss(teacher_patience, student_patience, normalize_patience)
    return loss_dl + pt_loss, kd_loss, ce_loss, pt_loss


# ------------------------------------------------------------------------------ comparisons


def plugin_terms(task: TaskSpec, n_student: int, labels: list[int], **params):
    labels_count = len(task.label_names or ())
    student_config = bert_config(n_student, num_labels=labels_count)
    teacher_config = bert_config(12, num_labels=labels_count)
    method = plugin("pkd", **params)
    ctx = context("pkd", task, student_config, teacher_config)
    method.validate(ctx)
    (stage,) = method.stages(ctx)
    student = build(BertForSequenceClassification, student_config, 11)
    teacher = build(BertForSequenceClassification, teacher_config, 12)
    batch = {**padded_batch(), "labels": torch.tensor(labels)}
    with torch.no_grad():
        terms = stage.loss(batch, capture(student, stage.student_features, batch),
                           capture(teacher, stage.teacher_features, batch))
    return terms, student, teacher, batch


@pytest.mark.parametrize("normalize", [True, False])
@pytest.mark.parametrize("task,labels", [(RTE, [0, 1, 1]), (MNLI, [2, 0, 1])], ids=["2-classes", "3-classes"])
def test_pkd_skip_12_to_6_equals_the_official_kd_cls_step(task: TaskSpec, labels: list[int], normalize: bool) -> None:
    """The ``kd.cls`` preset (``src/argument_parser.py`` L256-267: α 0.7, β 500, T 10, ``fc_layer_idx 1,3,5,7,9``,
    normalised patience) and ``NLI_KD_training.py`` L268-275: the plug-in's default ``pkd`` stage (skip)
    gives the same CE, KD (``KLDivLoss(reduction='mean')·T²``) and PT terms, for 2 and 3 classes."""
    terms, student, teacher, batch = plugin_terms(task, 6, labels, normalize=normalize)
    loss, kd_loss, ce_loss, pt_loss = official_pkd(student, teacher, batch, "1,3,5,7,9", T=10.0, alpha=0.7,
                                                   beta=500.0, normalize_patience=normalize)
    assert float(terms["ce"]) == pytest.approx(float(0.3 * ce_loss), **TOLERANCE)
    assert float(terms["kd"]) == pytest.approx(float(0.7 * kd_loss), **TOLERANCE)
    assert float(terms["pt"]) == pytest.approx(float(pt_loss), **TOLERANCE)
    assert float(sum(terms.values())) == pytest.approx(float(loss), **TOLERANCE)


def test_pkd_12_to_3_with_the_official_teacher_layers_equals_the_official_step() -> None:
    """``scripts/run_student_patience.py`` L60-64: the official 12→3 runs use ``fc_layer_idx 9,10`` (teacher
    layers 10 and 11, 1-based). With those layers (``teacher_layers=[10,11]``) and the grid's α 0.5,
    β 100, T 5 the plug-in's stage equals the official step."""
    terms, student, teacher, batch = plugin_terms(RTE, 3, [1, 0, 1], teacher_layers="[10, 11]", alpha=0.5,
                                                  beta=100.0, temperature=5.0)
    loss, _kd_loss, _ce_loss, pt_loss = official_pkd(student, teacher, batch, "9,10", T=5.0, alpha=0.5, beta=100.0,
                                                   normalize_patience=True)
    assert float(terms["pt"]) == pytest.approx(float(pt_loss), **TOLERANCE)
    assert float(sum(terms.values())) == pytest.approx(float(loss), **TOLERANCE)


def test_pkd_default_teacher_layers_are_the_official_ones_for_12_to_3() -> None:
    """``scripts/run_student_patience.py`` L60-66: teacher 12 → student 3 uses ``9,10`` (0-based), 12 → 6
    uses ``1,3,5,7,9``; as 1-based layers [10, 11] and [2, 4, 6, 8, 10]."""
    method = plugin("pkd")
    assert method.teacher_layers(12, 6) == [2, 4, 6, 8, 10]
    assert method.teacher_layers(12, 3) == [10, 11]
