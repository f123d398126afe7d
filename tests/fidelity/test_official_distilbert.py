"""DistilBERT's stages (pre-training and task distillation), built through the plug-in, against a float64
transcription of the official code.

Official code: huggingface/transformers-research-projects @ fccd0cdab03c1407bb7def05e1b48528fc817078,
folder ``distillation/`` (``distiller.py``, ``train.py``, ``run_squad_w_distillation.py``), the project
formerly at ``transformers/examples/research_projects/distillation``. One padded batch, float64.
"""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pytest
import torch
from fidelity_models import (
    CLS_ID,
    MASK_ID,
    PAD_ID,
    SEP_ID,
    VOCAB,
    bert_config,
    build,
    capture,
    context,
    padded_batch,
    plugin,
)
from kdbench.methods.distilbert import MlmMasker, token_probabilities
from torch import nn
from transformers import (
    BertForMaskedLM,
    BertForQuestionAnswering,
    BertForSequenceClassification,
    BertTokenizerFast,
)

from kdbench.task import HeadType, TaskSpec

CORPUS = TaskSpec("corpus", HeadType.MASKED_LM, "none")
SST2 = TaskSpec("sst2", HeadType.CLASSIFICATION, "acc", ("negative", "positive"))
SQUAD = TaskSpec("squad", HeadType.SPAN, "f1")
TOLERANCE = {"rel": 1e-12, "abs": 1e-15}
SPECIAL_IDS = (PAD_ID, 1, CLS_ID, SEP_ID, MASK_ID)


# ------------------------------------------------------------------------------ official side


def official_step_losses(student_outputs, teacher_outputs, attention_mask, lm_labels, *, temperature: float,
                         alpha_ce: float, alpha_mlm: float, alpha_cos: float, restrict_ce_to_mask: bool):
    """``distiller.py`` L395-448 (``Distiller.step``, MLM branch, ``alpha_clm = alpha_mse = 0``) with the loss
    functions of L111-116. Returns ``(loss, loss_ce, loss_mlm, loss_cos)``."""
    ce_loss_fct = nn.KLDivLoss(reduction="batchmean")
    lm_loss_fct = nn.CrossEntropyLoss(ignore_index=-100)
    cosine_loss_fct = nn.CosineEmbeddingLoss(reduction="mean")
    s_logits, s_hidden_states = student_outputs["logits"], student_outputs["hidden_states"]
    t_logits, t_hidden_states = teacher_outputs["logits"], teacher_outputs["hidden_states"]
    assert s_logits.size() == t_logits.size()
    if restrict_ce_to_mask:
        mask = (lm_labels > -1).unsqueeze(-1).expand_as(s_logits)
    else:
        mask = attention_mask.unsqueeze(-1).expand_as(s_logits)
    s_logits_slct = torch.masked_select(s_logits, mask)
    s_logits_slct = s_logits_slct.view(-1, s_logits.size(-1))
    t_logits_slct = torch.masked_select(t_logits, mask)
    t_logits_slct = t_logits_slct.view(-1, s_logits.size(-1))
    assert t_logits_slct.size() == s_logits_slct.size()
    loss_ce = (
        ce_loss_fct(
            nn.functional.log_softmax(s_logits_slct / temperature, dim=-1),
            nn.functional.softmax(t_logits_slct / temperature, dim=-1),
        )
        * (temperature) ** 2
    )
    loss = alpha_ce * loss_ce
    loss_mlm = lm_loss_fct(s_logits.view(-1, s_logits.size(-1)), lm_labels.view(-1))
    loss += alpha_mlm * loss_mlm
    s_hidden_states = s_hidden_states[-1]
    t_hidden_states = t_hidden_states[-1]
    mask = attention_mask.unsqueeze(-1).expand_as(s_hidden_states)
    assert s_hidden_states.size() == t_hidden_states.size()
    dim = s_hidden_states.size(-1)
    s_hidden_states_slct = torch.masked_select(s_hidden_states, mask)
    s_hidden_states_slct = s_hidden_states_slct.view(-1, dim)
    t_hidden_states_slct = torch.masked_select(t_hidden_states, mask)
    t_hidden_states_slct = t_hidden_states_slct.view(-1, dim)
    target = s_hidden_states_slct.new(s_hidden_states_slct.size(0)).fill_(1)
    loss_cos = cosine_loss_fct(s_hidden_states_slct, t_hidden_states_slct, target)
    loss += alpha_cos * loss_cos
    return loss, loss_ce, loss_mlm, loss_cos


def official_token_probs(counts: np.ndarray, special_ids, mlm_smoothing: float = 0.7) -> torch.Tensor:
    """``train.py`` L271-274."""
    token_probs = np.maximum(counts, 1) ** -mlm_smoothing
    for idx in special_ids:
        token_probs[idx] = 0.0  # do not predict special tokens
    return torch.from_numpy(token_probs)


def official_masked_positions(token_ids: torch.Tensor, lengths: torch.Tensor, token_probs: torch.Tensor,
                              mlm_mask_prop: float = 0.15) -> torch.Tensor:
    """``distiller.py`` L209-223 (``prepare_batch_mlm`` up to the choice of positions, fp32, no fp16
    rounding): ``ceil(0.15·Σ lengths)`` positions drawn without replacement ∝ ``token_probs``."""
    bs, max_seq_len = token_ids.size()
    x_prob = token_probs[token_ids.flatten()]
    n_tgt = math.ceil(mlm_mask_prop * lengths.sum().item())
    tgt_ids = torch.multinomial(x_prob / x_prob.sum(), n_tgt, replacement=False)
    pred_mask = torch.zeros(bs * max_seq_len, dtype=torch.bool, device=token_ids.device)
    pred_mask[tgt_ids] = 1
    pred_mask = pred_mask.view(bs, max_seq_len)
    pred_mask[token_ids == PAD_ID] = 0
    return pred_mask


# ------------------------------------------------------------------------------ pre-training distillation


def word_tokenizer(folder: Path) -> BertTokenizerFast:
    """A WordPiece tokenizer whose ids are fidelity_models' ids (special tokens 0-4, words w5..w39)."""
    tokens = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", *(f"w{i}" for i in range(5, VOCAB))]
    tokenizer = BertTokenizerFast(vocab={token: i for i, token in enumerate(tokens)}, do_lower_case=True)
    tokenizer.save_pretrained(folder)
    return tokenizer


def pretrain_case(tmp_path: Path, **params):
    word_tokenizer(tmp_path / "tok")
    corpus = tmp_path / "corpus.txt"
    corpus.write_text("w5 w6 w7\nw5 w8\n")
    student_config, teacher_config = bert_config(2), bert_config(4)
    ctx = context("distilbert-pretrain", CORPUS, student_config, teacher_config, corpus=str(corpus),
                  tokenizer=str(tmp_path / "tok"))
    method = plugin("distilbert-pretrain", **params)
    method.validate(ctx)
    (stage,) = method.stages(ctx)
    student, teacher = build(BertForMaskedLM, student_config, 21), build(BertForMaskedLM, teacher_config, 22)
    batch = padded_batch(3)
    del batch["token_type_ids"]  # one text per row on the corpus task; DistilBERT has no segments
    labels = torch.full_like(batch["input_ids"], -100)
    labels[0, 2], labels[0, 5], labels[1, 1] = 17, 9, 30  # three masked positions, on real tokens only
    batch["input_ids"] = batch["input_ids"].clone()
    batch["input_ids"][0, 2] = batch["input_ids"][1, 1] = MASK_ID
    batch["labels"] = labels
    with torch.no_grad():
        terms = stage.loss(batch, capture(student, stage.student_features, batch),
                           capture(teacher, stage.teacher_features, batch))
        inputs = {"input_ids": batch["input_ids"], "attention_mask": batch["attention_mask"]}
        student_outputs = student(**inputs, output_hidden_states=True)
        teacher_outputs = teacher(**inputs, output_hidden_states=True)
    return terms, student_outputs, teacher_outputs, batch


@pytest.mark.parametrize("restrict", [False, True], ids=["ce-over-real-tokens", "restrict_ce_to_mask"])
def test_pretrain_stage_equals_distiller_step(tmp_path: Path, restrict: bool) -> None:
    """``Distiller.step`` (``distiller.py`` L395-448) with the README run's weights α_ce 5, α_mlm 2, α_cos 1
    and ``train.py``'s T 2 (L129): the plug-in's ``ce``, ``mlm`` and ``cos`` terms equal the weighted
    official terms, with the KL over non-padding tokens (L404) or masked tokens only (L402)."""
    terms, student_outputs, teacher_outputs, batch = pretrain_case(tmp_path, restrict_ce_to_mask=restrict)
    loss, loss_ce, loss_mlm, loss_cos = official_step_losses(
        student_outputs, teacher_outputs, batch["attention_mask"].bool(), batch["labels"], temperature=2.0,
        alpha_ce=5.0, alpha_mlm=2.0, alpha_cos=1.0, restrict_ce_to_mask=restrict)
    assert float(terms["ce"]) == pytest.approx(float(5.0 * loss_ce), **TOLERANCE)
    assert float(terms["mlm"]) == pytest.approx(float(2.0 * loss_mlm), **TOLERANCE)
    assert float(terms["cos"]) == pytest.approx(float(1.0 * loss_cos), **TOLERANCE)
    assert float(sum(terms.values())) == pytest.approx(float(loss), **TOLERANCE)


def test_masker_draws_the_positions_prepare_batch_mlm_draws() -> None:
    """``train.py`` L271-274 (``max(count, 1)^-0.7``, special tokens 0) and ``distiller.py`` L209-223: from
    the same generator state, kdbench's ``MlmMasker`` picks exactly the official positions on a padded
    batch (``ceil(0.15·Σ lengths)`` draws without replacement over the flattened batch). The 80/10/10
    replacement that follows draws the same distribution in another order (official: random ids, then the
    kind, L237-239), so only the positions are compared."""
    counts = np.random.default_rng(0).integers(0, 50, size=VOCAB)
    official_probs = official_token_probs(counts, SPECIAL_IDS)
    ours = token_probabilities(counts, SPECIAL_IDS, 0.7)
    assert torch.equal(ours, official_probs.float())
    batch = padded_batch(5)
    lengths = batch["attention_mask"].sum(1)
    masker = MlmMasker(ours, MASK_ID, VOCAB)
    for seed in range(5):
        torch.manual_seed(seed)
        expected = official_masked_positions(batch["input_ids"], lengths, ours)
        torch.manual_seed(seed)
        chosen = masker(batch)["labels"] != -100
        assert expected.sum() == math.ceil(0.15 * int(lengths.sum()))
        assert torch.equal(chosen, expected)


# ------------------------------------------------------------------------------ task distillation


def official_task_loss(student_loss, student_logits, teacher_logits, *, temperature, alpha_ce, alpha_squad):
    """``run_squad_w_distillation.py`` L230-241 for one pair of logits: ``KLDivLoss(reduction="batchmean")``
    of the softened distributions × T², then ``alpha_ce·loss_ce + alpha_squad·loss`` where ``loss`` is the
    student model's own loss (L214-215)."""
    loss_fct = nn.KLDivLoss(reduction="batchmean")
    loss_ce = loss_fct(
        nn.functional.log_softmax(student_logits / temperature, dim=-1),
        nn.functional.softmax(teacher_logits / temperature, dim=-1),
    ) * (temperature**2)
    return alpha_ce * loss_ce + alpha_squad * student_loss, loss_ce


def test_span_stage_equals_run_squad_w_distillation() -> None:
    """``run_squad_w_distillation.py`` L202-241: the student's own QA loss (transformers'
    ``BertForQuestionAnswering``: positions clamped to ``[0, L]``, ``L`` ignored, start/end averaged),
    KL(batchmean)·T² over the whole sequence (padding included) averaged over start and end
    (``loss_ce = (loss_start + loss_end) / 2``), defaults α_ce 0.5, α_squad 0.5, T 2 (L532-538). One
    answer lies beyond the sequence (ignored by both)."""
    student_config, teacher_config = bert_config(2), bert_config(4)
    method = plugin("distilbert")
    (stage,) = method.stages(context("distilbert", SQUAD, student_config, teacher_config))
    student = build(BertForQuestionAnswering, student_config, 31)
    teacher = build(BertForQuestionAnswering, teacher_config, 32)
    batch = {**padded_batch(), "start_positions": torch.tensor([2, 1, 12]), "end_positions": torch.tensor([4, 2, 12])}
    with torch.no_grad():
        terms = stage.loss(batch, capture(student, stage.student_features, batch),
                           capture(teacher, stage.teacher_features, batch))
        inputs = {k: batch[k] for k in ("input_ids", "attention_mask", "token_type_ids")}
        outputs = student(**inputs, start_positions=batch["start_positions"], end_positions=batch["end_positions"])
        loss, start_logits_stu, end_logits_stu = outputs.loss, outputs.start_logits, outputs.end_logits
        teacher_outputs = teacher(**inputs)
    _, loss_start = official_task_loss(loss, start_logits_stu, teacher_outputs.start_logits, temperature=2.0,
                                       alpha_ce=0.5, alpha_squad=0.5)
    _, loss_end = official_task_loss(loss, end_logits_stu, teacher_outputs.end_logits, temperature=2.0,
                                     alpha_ce=0.5, alpha_squad=0.5)
    loss_ce = (loss_start + loss_end) / 2.0
    official = 0.5 * loss_ce + 0.5 * loss
    assert float(terms["kd"]) == pytest.approx(float(0.5 * loss_ce), **TOLERANCE)
    assert float(terms["ce"]) == pytest.approx(float(0.5 * loss), **TOLERANCE)
    assert float(sum(terms.values())) == pytest.approx(float(official), **TOLERANCE)


def test_classification_stage_is_the_same_form_on_class_logits() -> None:
    """kdbench applies ``run_squad_w_distillation.py``'s form (L230-241) to class logits (the released code
    has no GLUE distillation script): KL(batchmean)·T² of the class distributions with the student
    model's own cross-entropy (``BertForSequenceClassification``), α_ce 0.5, α_task 0.5, T 2."""
    student_config, teacher_config = bert_config(2, num_labels=2), bert_config(4, num_labels=2)
    (stage,) = plugin("distilbert", alpha_ce=0.7, alpha_task=0.2, temperature=3.0).stages(
        context("distilbert", SST2, student_config, teacher_config))
    student = build(BertForSequenceClassification, student_config, 33)
    teacher = build(BertForSequenceClassification, teacher_config, 34)
    batch = {**padded_batch(), "labels": torch.tensor([1, 0, 1])}
    with torch.no_grad():
        terms = stage.loss(batch, capture(student, stage.student_features, batch),
                           capture(teacher, stage.teacher_features, batch))
        inputs = {k: batch[k] for k in ("input_ids", "attention_mask", "token_type_ids")}
        outputs = student(**inputs, labels=batch["labels"])
        teacher_logits = teacher(**inputs).logits
    official, loss_ce = official_task_loss(outputs.loss, outputs.logits, teacher_logits, temperature=3.0,
                                           alpha_ce=0.7, alpha_squad=0.2)
    assert float(terms["kd"]) == pytest.approx(float(0.7 * loss_ce), **TOLERANCE)
    assert float(sum(terms.values())) == pytest.approx(float(official), **TOLERANCE)
