"""TinyBERT's stages, built through the plug-in, against a float64 transcription of the official code.

Official code: huawei-noah/Pretrained-Language-Model @ 0598f02d7fc4eaa7b4cbc1e9d7ab18bc875c24f9, folder
``TinyBERT/`` (``task_distill.py``, ``general_distill.py``, ``transformer/modeling.py``). The official side
computes its features the official way (``BertSelfAttention.forward`` returns the masked, pre-softmax
scores; ``BertEncoder.forward`` lists the embedding output first; ``fit_dense`` is applied to every student
hidden state) from the same weights; the plug-in side captures them with ``FeatureCapture`` and runs
the stage loss. Both see one padded batch, padding included.
"""

from __future__ import annotations

import math

import pytest
import torch
from fidelity_models import (
    bert_config,
    build,
    capture,
    context,
    padded_batch,
    plugin,
    stage_named,
)
from torch.nn import MSELoss
from transformers import BertForMaskedLM, BertForSequenceClassification

from kdbench.task import HeadType, TaskSpec

SST2 = TaskSpec("sst2", HeadType.CLASSIFICATION, "acc", ("negative", "positive"))
STSB = TaskSpec("stsb", HeadType.REGRESSION, "spearman")
CORPUS = TaskSpec("corpus", HeadType.MASKED_LM, "none")
TOLERANCE = {"rel": 1e-12, "abs": 1e-15}


# ------------------------------------------------------------------------------ official side


def official_outputs(model: torch.nn.Module, batch: dict[str, torch.Tensor],
                     fit_dense: torch.nn.Module | None = None):
    """``(logits, atts, reps)`` as ``TinyBertForSequenceClassification.forward`` returns them.

    Transcribes ``transformer/modeling.py``: the additive mask ``(1.0 - mask) * -10000.0`` (L821-830),
    ``BertSelfAttention.forward`` scores ``q·kᵀ / sqrt(head_size) + attention_mask`` returned before the
    softmax (L391-406, L420), ``BertEncoder.forward`` reps = embedding output then every layer output
    (L509-519), and ``fit_dense`` on every student rep (L1138-1141). Each layer's query/key are applied
    to that layer's input rep, independently of kdbench's hooks.
    """
    inputs = {k: batch[k] for k in ("input_ids", "attention_mask", "token_type_ids")}
    with torch.no_grad():
        out = model(**inputs, output_hidden_states=True)
        reps = list(out.hidden_states)
        extended = batch["attention_mask"][:, None, None, :].to(torch.float64)
        extended = (1.0 - extended) * -10000.0
        atts = []
        heads = model.config.num_attention_heads
        size = model.config.hidden_size // heads

        def transpose_for_scores(x: torch.Tensor) -> torch.Tensor:
            return x.view(*x.size()[:-1], heads, size).permute(0, 2, 1, 3)

        for index, layer in enumerate(model.base_model.encoder.layer):
            self_attention = layer.attention.self
            query = transpose_for_scores(self_attention.query(reps[index]))
            key = transpose_for_scores(self_attention.key(reps[index]))
            scores = torch.matmul(query, key.transpose(-1, -2)) / math.sqrt(size)
            atts.append(scores + extended)
        if fit_dense is not None:
            reps = [fit_dense(rep) for rep in reps]
    return getattr(out, "logits", None), atts, reps


def official_intermediate_loss(student_atts, student_reps, teacher_atts, teacher_reps):
    """``task_distill.py`` L941-966 (identical to ``general_distill.py`` L418-438): uniform mapping,
    entries ``<= -1e2`` zeroed on both sides, ``MSELoss()`` per pair, summed. Returns (att_loss, rep_loss)."""
    loss_mse = MSELoss()
    att_loss = 0.0
    rep_loss = 0.0
    teacher_layer_num = len(teacher_atts)
    student_layer_num = len(student_atts)
    assert teacher_layer_num % student_layer_num == 0
    layers_per_block = int(teacher_layer_num / student_layer_num)
    new_teacher_atts = [teacher_atts[i * layers_per_block + layers_per_block - 1] for i in range(student_layer_num)]
    for student_att, teacher_att in zip(student_atts, new_teacher_atts):
        student_att = torch.where(student_att <= -1e2, torch.zeros_like(student_att), student_att)
        teacher_att = torch.where(teacher_att <= -1e2, torch.zeros_like(teacher_att), teacher_att)
        tmp_loss = loss_mse(student_att, teacher_att)
        att_loss += tmp_loss
    new_teacher_reps = [teacher_reps[i * layers_per_block] for i in range(student_layer_num + 1)]
    new_student_reps = student_reps
    for student_rep, teacher_rep in zip(new_student_reps, new_teacher_reps):
        tmp_loss = loss_mse(student_rep, teacher_rep)
        rep_loss += tmp_loss
    return att_loss, rep_loss


def soft_cross_entropy(predicts: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    """``task_distill.py`` L905-908."""
    student_likelihood = torch.nn.functional.log_softmax(predicts, dim=-1)
    targets_prob = torch.nn.functional.softmax(targets, dim=-1)
    return (-targets_prob * student_likelihood).mean()


# ------------------------------------------------------------------------------ comparisons


def intermediate_case(method_name: str, task: TaskSpec, model_class: type, student_hidden: int, stage_name: str,
                      **params):
    student_config, teacher_config = bert_config(2, student_hidden), bert_config(4, 16)
    if model_class is BertForSequenceClassification:
        student_config.num_labels = teacher_config.num_labels = 2
    ctx = context(method_name, task, student_config, teacher_config, corpus="c.txt")
    method = plugin(method_name, **params)
    extras = method.extra_modules(ctx).double()
    stage = stage_named(method.stages(ctx), stage_name)
    student, teacher = build(model_class, student_config, 1), build(model_class, teacher_config, 2)
    batch = padded_batch()
    with torch.no_grad():
        terms = stage.compute(batch, capture(student, stage.student_features, batch),
                              capture(teacher, stage.teacher_features, batch), extras)
    return terms, extras, student, teacher, batch


@pytest.mark.parametrize("student_hidden", [12, 16], ids=["projected-12-to-16", "same-width-still-projected"])
def test_task_intermediate_stage_equals_task_distill(student_hidden: int) -> None:
    """``task_distill.py`` L935-966 on a 4-layer teacher and 2-layer student (k = 2): attention loss and
    rep loss (embedding + hidden, through the one shared ``fit_dense``) equal the plug-in's ``attn`` and
    ``embd + hidn`` terms of the ``intermediate`` stage (``projection=shared``, the default)."""
    terms, extras, student, teacher, batch = intermediate_case("tinybert", SST2, BertForSequenceClassification,
                                                               student_hidden, "intermediate")
    assert set(terms) == {"attn", "embd", "hidn"}
    _, student_atts, student_reps = official_outputs(student, batch, fit_dense=extras["fit_dense"])
    _, teacher_atts, teacher_reps = official_outputs(teacher, batch)
    att_loss, rep_loss = official_intermediate_loss(student_atts, student_reps, teacher_atts, teacher_reps)
    assert (student_atts[0][1, :, :, 4:] < -1000).all()  # the padded keys carry the -10000 mask
    assert float(terms["attn"]) == pytest.approx(float(att_loss), **TOLERANCE)
    assert float(terms["embd"] + terms["hidn"]) == pytest.approx(float(rep_loss), **TOLERANCE)


def test_general_stage_equals_general_distill() -> None:
    """``general_distill.py`` L413-438 with ``TinyBertForPreTraining.forward`` (``modeling.py`` L938-948:
    ``fit_dense`` on every student rep): the ``tinybert-general`` stage on masked-LM models."""
    terms, extras, student, teacher, batch = intermediate_case("tinybert-general", CORPUS, BertForMaskedLM, 12,
                                                               "general")
    _, student_atts, student_reps = official_outputs(student, batch, fit_dense=extras["fit_dense"])
    _, teacher_atts, teacher_reps = official_outputs(teacher, batch)
    att_loss, rep_loss = official_intermediate_loss(student_atts, student_reps, teacher_atts, teacher_reps)
    assert float(terms["attn"]) == pytest.approx(float(att_loss), **TOLERANCE)
    assert float(terms["embd"] + terms["hidn"]) == pytest.approx(float(rep_loss), **TOLERANCE)


@pytest.mark.parametrize("temperature", [1.0, 2.0])
def test_prediction_stage_equals_soft_cross_entropy_of_task_distill(temperature: float) -> None:
    """``task_distill.py`` L968-970 with ``--pred_distill``: ``soft_cross_entropy(s/T, t/T)`` (L905-908,
    mean over batch and classes, no T²), against the plug-in's ``prediction`` stage ``pred`` term."""
    student_config, teacher_config = bert_config(2, 12, num_labels=3), bert_config(4, 16, num_labels=3)
    task = TaskSpec("mnli", HeadType.CLASSIFICATION, "acc", ("entailment", "neutral", "contradiction"))
    ctx = context("tinybert", task, student_config, teacher_config)
    method = plugin("tinybert", mode="prediction", temperature=temperature)
    method.extra_modules(ctx)
    stage = stage_named(method.stages(ctx), "prediction")
    student = build(BertForSequenceClassification, student_config, 3)
    teacher = build(BertForSequenceClassification, teacher_config, 4)
    batch = {**padded_batch(), "labels": torch.tensor([0, 2, 1])}
    with torch.no_grad():
        terms = stage.loss(batch, capture(student, stage.student_features, batch),
                           capture(teacher, stage.teacher_features, batch))
    student_logits, _, _ = official_outputs(student, batch)
    teacher_logits, _, _ = official_outputs(teacher, batch)
    expected = soft_cross_entropy(student_logits / temperature, teacher_logits / temperature)
    assert set(terms) == {"pred"}
    assert float(terms["pred"]) == pytest.approx(float(expected), **TOLERANCE)


def test_regression_prediction_stage_fits_the_gold_score_as_task_distill() -> None:
    """``task_distill.py`` L971-973: for STS-B the prediction stage is ``MSELoss()(student_logits.view(-1),
    label_ids.view(-1))`` against the gold score, no teacher."""
    student_config = bert_config(2, 12, num_labels=1, problem_type="regression")
    teacher_config = bert_config(4, 16, num_labels=1, problem_type="regression")
    ctx = context("tinybert", STSB, student_config, teacher_config)
    method = plugin("tinybert", mode="prediction")
    method.extra_modules(ctx)
    stage = stage_named(method.stages(ctx), "prediction")
    assert stage.uses_teacher is False
    student = build(BertForSequenceClassification, student_config, 5)
    batch = {**padded_batch(), "labels": torch.tensor([4.2, 0.4, 2.5], dtype=torch.float64)}
    with torch.no_grad():
        terms = stage.loss(batch, capture(student, stage.student_features, batch), None)
    student_logits, _, _ = official_outputs(student, batch)
    expected = MSELoss()(student_logits.view(-1), batch["labels"].view(-1))
    assert float(terms["mse"]) == pytest.approx(float(expected), **TOLERANCE)
