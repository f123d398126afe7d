"""Pure distillation losses of every method (TinyBERT, MobileBERT, DistilBERT, BERT-PKD, Hinton KD).

Every function takes tensors and returns a scalar tensor (or a ``dict`` of named, already weighted
scalar terms whose sum is the training loss). Docstrings state the exact reduction and weighting
and the official code each one follows (see ``docs/fidelity.md``, one section per method).

Conventions:

- Shapes follow :class:`kdbench.features.Features`: logits ``(B, C)`` / ``(B, L, V)``, hidden states
  ``(B, L, d)``, attention ``(B, H, L, L)``, ``attention_mask`` ``(B, L)`` with 1 on real tokens.
- Teacher tensors are used as given: compute them under ``torch.no_grad()`` (nothing is detached
  here, so these functions stay pure math).
- Nothing modifies its inputs (no in-place ops).
- ``temperature`` must be a finite number > 0 and loss weights finite numbers >= 0; a convex weight
  ``alpha`` (used as ``alpha`` and ``1 - alpha``) must lie in ``[0, 1]``. Violations raise
  ``ValueError`` naming the value.
- "batchmean" here means: sum of the per-distribution KL divided by the number of distributions
  (rows of the flattened ``(-1, C)`` logits, or the selected positions when a mask is given). For
  2-D logits that is exactly ``torch.nn.KLDivLoss(reduction="batchmean")``.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from kdbench.layer_maps import LayerMatch

__all__ = [
    "KL_REDUCTIONS",
    "TINYBERT_MASK_THRESHOLD",
    "attention_kl_loss",
    "attention_kl_loss_from_scores",
    "cosine_embedding_loss",
    "distilbert_mlm_distillation_loss",
    "distilbert_span_loss",
    "distilbert_task_loss",
    "fmt_mse_loss",
    "fmt_normalized_loss",
    "hidden_mse_loss",
    "hinton_kd_loss",
    "kd_kl_loss",
    "matched_layers_loss",
    "mixed_target_mlm_loss",
    "patient_loss",
    "pkd_loss",
    "regression_kd_loss",
    "regression_mse_loss",
    "soft_cross_entropy",
    "tinybert_attention_loss",
]

KL_REDUCTIONS = ("batchmean", "mean", "sum")
TINYBERT_MASK_THRESHOLD = -1e2
"""TinyBERT zeroes attention-score entries ``<= -1e2`` (the masked ones) in student and teacher."""


# --------------------------------------------------------------------------- validation helpers


def _check_temperature(temperature: float) -> float:
    if isinstance(temperature, bool) or not isinstance(temperature, (int, float)):
        raise ValueError(f"temperature must be a number > 0, got {temperature!r}")
    if not math.isfinite(temperature) or temperature <= 0:
        raise ValueError(f"temperature must be a finite number > 0, got {temperature!r}")
    return float(temperature)


def _check_weight(name: str, value: float) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise ValueError(f"{name} must be a number >= 0, got {value!r}")
    if not math.isfinite(value) or value < 0:
        raise ValueError(f"{name} must be a finite number >= 0, got {value!r}")
    return float(value)


def _check_alpha(name: str, value: float) -> float:
    value = _check_weight(name, value)
    if value > 1:
        raise ValueError(f"{name} weights a convex combination and must lie in [0, 1], got {value!r}")
    return value


def _check_same_shape(what: str, student: Tensor, teacher: Tensor) -> None:
    if student.shape != teacher.shape:
        raise ValueError(
            f"{what}: student and teacher shapes differ: student {tuple(student.shape)} vs "
            f"teacher {tuple(teacher.shape)}"
        )


def _token_mask(mask: Tensor | None, shape: torch.Size, what: str) -> Tensor | None:
    """A bool mask of ``shape`` (leading dims of a feature tensor), or None."""
    if mask is None:
        return None
    if tuple(mask.shape) != tuple(shape):
        raise ValueError(f"{what}: mask shape {tuple(mask.shape)} does not match the positions {tuple(shape)}")
    return mask.bool()


def _zero_like_loss(reference: Tensor) -> Tensor:
    """A 0 scalar that still depends on ``reference`` (keeps the autograd graph connected)."""
    return reference.sum() * 0.0


# --------------------------------------------------------------------------- logit distillation


def kd_kl_loss(
    student_logits: Tensor,
    teacher_logits: Tensor,
    temperature: float,
    reduction: str = "batchmean",
    mask: Tensor | None = None,
) -> Tensor:
    """``KL(softmax(t/T) ‖ softmax(s/T)) · T²`` over the last (class / vocabulary) dimension.

    Per distribution: ``Σ_c p_t[c]·(log p_t[c] − log p_s[c])`` with ``p = softmax(logits / T)``,
    computed from ``log_softmax`` of both sides (so ``0·log 0`` terms are exactly 0). Then:

    - ``reduction="batchmean"`` (Hinton; DistilBERT ``KLDivLoss(reduction="batchmean")``): sum over
      everything / number of distributions (rows of the ``(-1, C)`` view, or selected positions).
    - ``reduction="mean"`` (BERT-PKD official ``KLDivLoss(reduction="mean")``): sum / (number of
      distributions × C), i.e. ``C`` times smaller than ``batchmean``.
    - ``reduction="sum"``: plain sum.

    The result is always multiplied by ``T²``. ``mask`` (optional, shape ``logits.shape[:-1]``,
    e.g. ``(B, L)`` for token-level ``(B, L, V)`` logits) selects the positions that count:
    DistilBERT uses the attention mask (non-padding tokens) or, with ``restrict_ce_to_mask``, the
    MLM-masked tokens only. With no selected position the loss is 0.
    """
    T = _check_temperature(temperature)
    if reduction not in KL_REDUCTIONS:
        raise ValueError(f"reduction must be one of {KL_REDUCTIONS}, got {reduction!r}")
    _check_same_shape("kd_kl_loss logits", student_logits, teacher_logits)
    num_classes = student_logits.shape[-1]
    selected = _token_mask(mask, student_logits.shape[:-1], "kd_kl_loss")
    if selected is not None:
        s = student_logits[selected]
        t = teacher_logits[selected]
    else:
        s = student_logits.reshape(-1, num_classes)
        t = teacher_logits.reshape(-1, num_classes)
    if s.shape[0] == 0:
        return _zero_like_loss(student_logits)
    log_p_s = F.log_softmax(s / T, dim=-1)
    log_p_t = F.log_softmax(t / T, dim=-1)
    total = (log_p_t.exp() * (log_p_t - log_p_s)).sum()
    if reduction == "batchmean":
        total = total / s.shape[0]
    elif reduction == "mean":
        total = total / (s.shape[0] * num_classes)
    return total * (T * T)


def hinton_kd_loss(
    student_logits: Tensor,
    teacher_logits: Tensor,
    labels: Tensor,
    alpha: float,
    temperature: float,
    reduction: str = "batchmean",
) -> dict[str, Tensor]:
    """Vanilla KD (Hinton et al.): ``{"ce": (1−α)·CE(labels, s), "kd": α·T²·KL}``.

    ``CE`` is ``F.cross_entropy`` (mean over the batch, labels ``-100`` ignored); ``KL`` is
    :func:`kd_kl_loss` (which already includes ``T²``) with ``reduction="batchmean"`` (Hinton's
    per-example KL) or ``"mean"`` (BERT-PKD's vanilla-KD baseline, ``KLDivLoss(reduction='mean')``:
    ``C`` times smaller for ``C`` classes). The training loss is ``sum(terms.values())``. ``alpha``
    in ``[0, 1]``.
    """
    a = _check_alpha("alpha", alpha)
    _check_temperature(temperature)
    ce = F.cross_entropy(student_logits, labels)
    kd = kd_kl_loss(student_logits, teacher_logits, temperature, reduction=reduction)
    return {"ce": (1.0 - a) * ce, "kd": a * kd}


def soft_cross_entropy(student_logits: Tensor, teacher_logits: Tensor, temperature: float = 1.0) -> Tensor:
    """TinyBERT prediction-layer loss: ``(-softmax(t/T) * log_softmax(s/T)).mean()``.

    Mean over batch **and** classes (every element of the ``(B, C)`` product), no ``T²`` factor,
    no hard-label term; the official code uses ``T = 1``.
    """
    T = _check_temperature(temperature)
    _check_same_shape("soft_cross_entropy logits", student_logits, teacher_logits)
    return (-F.softmax(teacher_logits / T, dim=-1) * F.log_softmax(student_logits / T, dim=-1)).mean()


def _as_scores(x: Tensor, what: str) -> Tensor:
    if x.dim() == 2 and x.shape[-1] == 1:
        return x.reshape(-1)
    if x.dim() != 1:
        raise ValueError(f"{what}: expected a (B,) or (B, 1) regression output, got shape {tuple(x.shape)}")
    return x


def regression_mse_loss(prediction: Tensor, target: Tensor) -> Tensor:
    """Regression (STS-B) loss: ``mean((prediction − target)²)`` over the batch.

    ``prediction`` and ``target`` may each be ``(B,)`` or ``(B, 1)``. TinyBERT's prediction stage
    on STS-B uses this against the **gold** score (instead of :func:`soft_cross_entropy`).
    """
    p = _as_scores(prediction, "regression_mse_loss prediction")
    t = _as_scores(target, "regression_mse_loss target").to(p.dtype)
    _check_same_shape("regression_mse_loss", p, t)
    return F.mse_loss(p, t)


def regression_kd_loss(student_prediction: Tensor, teacher_prediction: Tensor) -> Tensor:
    """KD for regression heads (one output, no distribution): ``mean((s − t)²)`` over the batch.

    Used in place of the KL term for STS-B by the logit-distillation methods (Hinton, PKD,
    DistilBERT task distillation); no temperature, no ``T²``.
    """
    return regression_mse_loss(student_prediction, teacher_prediction)


# --------------------------------------------------------------------------- TinyBERT intermediate


def tinybert_attention_loss(student_scores: Tensor, teacher_scores: Tensor) -> Tensor:
    """TinyBERT attention loss for one layer pair, on PRE-softmax scores ``(B, H, L, L)``.

    Entries ``<= -1e2`` (the additive ``-10000`` on padded key columns) are replaced by 0 in
    **both** student and teacher (``torch.where``, inputs untouched), then ``MSELoss()``: mean over
    all ``B·H·L·L`` entries, padded query rows included (as the official code). Sum over mapped
    layers with weight 1 (:func:`matched_layers_loss`). Student and teacher need the same head count.
    """
    if student_scores.dim() != 4 or teacher_scores.dim() != 4:
        raise ValueError(
            "tinybert_attention_loss expects (B, H, L, L) scores, got student "
            f"{tuple(student_scores.shape)} and teacher {tuple(teacher_scores.shape)}"
        )
    if student_scores.shape[1] != teacher_scores.shape[1]:
        raise ValueError(
            "tinybert_attention_loss needs the same number of heads in student and teacher: student "
            f"scores {tuple(student_scores.shape)} have {student_scores.shape[1]} heads, teacher "
            f"scores {tuple(teacher_scores.shape)} have {teacher_scores.shape[1]}"
        )
    _check_same_shape("tinybert_attention_loss scores", student_scores, teacher_scores)
    s = torch.where(student_scores <= TINYBERT_MASK_THRESHOLD, torch.zeros_like(student_scores), student_scores)
    t = torch.where(teacher_scores <= TINYBERT_MASK_THRESHOLD, torch.zeros_like(teacher_scores), teacher_scores)
    return F.mse_loss(s, t)


def hidden_mse_loss(
    student_hidden: Tensor, teacher_hidden: Tensor, projection: nn.Module | None = None
) -> Tensor:
    """TinyBERT hidden / embedding loss: ``MSE(W·h_S, h_T)``, mean over all ``B·L·d_T`` entries.

    Padding positions are included (as the official code). ``projection`` maps ``d_S → d_T``
    (``None`` when the widths match). Official TinyBERT shares ONE projection for the embedding
    and all hidden layers (pass the same module each time); the paper's separate ``W_e``/``W_h`` is
    the caller passing different modules.
    """
    projected = projection(student_hidden) if projection is not None else student_hidden
    if projected.shape != teacher_hidden.shape:
        hint = "" if projection is not None else " (pass a projection when the hidden sizes differ)"
        raise ValueError(
            f"hidden_mse_loss: (projected) student hidden {tuple(projected.shape)} does not match "
            f"teacher hidden {tuple(teacher_hidden.shape)}{hint}"
        )
    return F.mse_loss(projected, teacher_hidden)


def matched_layers_loss(
    loss_fn: Callable[..., Tensor],
    student_features: Sequence[Tensor],
    teacher_features: Sequence[Tensor],
    matches: Sequence[LayerMatch],
    **kwargs: object,
) -> Tensor:
    """``Σ_matches weight · loss_fn(student_features[m.student], teacher_features[m.teacher], **kwargs)``.

    The layer-summing wrapper of TinyBERT (weight 1 per pair) and MobileBERT. ``matches`` index
    the given sequences (hidden indices for hidden states, attention indices for attention).
    Raises ``ValueError`` naming the match when an index is outside a sequence, or when
    ``matches`` is empty.
    """
    if not matches:
        raise ValueError("matched_layers_loss: no layer matches given")
    total: Tensor | None = None
    for m in matches:
        if not 0 <= m.student < len(student_features) or not 0 <= m.teacher < len(teacher_features):
            raise ValueError(
                f"{m} is out of range: student has {len(student_features)} features "
                f"(0..{len(student_features) - 1}), teacher has {len(teacher_features)} "
                f"(0..{len(teacher_features) - 1})"
            )
        _check_weight(f"weight of {m}", m.weight)
        term = m.weight * loss_fn(student_features[m.student], teacher_features[m.teacher], **kwargs)
        total = term if total is None else total + term
    assert total is not None
    return total


# --------------------------------------------------------------------------- MobileBERT


def _masked_token_mean(per_token: Tensor, mask: Tensor | None) -> Tensor:
    """Mean of a (B, L) tensor over the tokens where mask is 1 (all tokens when mask is None)."""
    if mask is None:
        return per_token.mean()
    m = mask.to(per_token.dtype)
    return (per_token * m).sum() / m.sum().clamp_min(1.0)  # no real token -> 0


def fmt_mse_loss(student_hidden: Tensor, teacher_hidden: Tensor, attention_mask: Tensor | None = None) -> Tensor:
    """MobileBERT feature-map transfer, paper form: plain MSE between the feature maps of one layer.

    Mean over all ``B·L·d`` entries, padding included, when ``attention_mask`` is ``None`` (the
    reduction of MobileBERT's code, ``tf.losses.mean_squared_error``); with ``attention_mask``
    ``(B, L)`` given, over real tokens only (``n_real·d`` entries). Student and teacher share the
    feature-map width.
    """
    _check_same_shape("fmt_mse_loss hidden", student_hidden, teacher_hidden)
    mask = _token_mask(attention_mask, student_hidden.shape[:-1], "fmt_mse_loss")
    per_token = (student_hidden - teacher_hidden).pow(2).mean(dim=-1)
    return _masked_token_mean(per_token, mask)


def fmt_normalized_loss(
    student_hidden: Tensor,
    teacher_hidden: Tensor,
    attention_mask: Tensor | None = None,
    beta: float = 5000.0,
    gamma: float = 5.0,
    eps: float = 1e-12,
) -> dict[str, Tensor]:
    """MobileBERT feature-map transfer, official-code form, for one layer ``(B, L, d)``.

    Returns ``{"fmt": MSE(LN(h_T), LN(h_S)), "mean": β·mean_tok (μ_T − μ_S)², "var": γ·mean_tok
    |σ²_T − σ²_S|}`` where ``LN`` is a non-trainable layer norm over the hidden dim
    (``F.layer_norm`` without affine, ``eps = 1e-12`` by default, the TF ``layer_norm`` epsilon)
    and ``μ``, ``σ²`` are the per-token mean and population variance over the hidden dim.
    ``"fmt"`` is the mean over tokens and hidden units, unweighted (the README's factor 100 for
    the hidden loss is applied by the caller); β and γ default to the README's 5000 and 5.

    Padding: ``attention_mask=None`` averages all three terms over every ``B·L`` token, padding
    included — what ``run_pretraining.py`` computes (``tf.losses.mean_squared_error`` and
    ``tf.reduce_mean``); with ``attention_mask`` given, over REAL tokens only. The teacher's
    statistics are those of the one teacher layer passed in (the released code's
    ``teacher_mean``/``teacher_variance`` over the whole list of teacher layers is a bug not copied).
    Per-layer factors (``hidden_distill_factor``/L etc.) are the caller's.
    """
    b = _check_weight("beta", beta)
    g = _check_weight("gamma", gamma)
    if not eps > 0:
        raise ValueError(f"eps must be > 0, got {eps!r}")
    _check_same_shape("fmt_normalized_loss hidden", student_hidden, teacher_hidden)
    mask = _token_mask(attention_mask, student_hidden.shape[:-1], "fmt_normalized_loss")
    d = student_hidden.shape[-1]
    ln_s = F.layer_norm(student_hidden, (d,), eps=eps)
    ln_t = F.layer_norm(teacher_hidden, (d,), eps=eps)
    fmt = _masked_token_mean((ln_t - ln_s).pow(2).mean(dim=-1), mask)
    mu_s, mu_t = student_hidden.mean(dim=-1), teacher_hidden.mean(dim=-1)
    var_s = student_hidden.var(dim=-1, unbiased=False)
    var_t = teacher_hidden.var(dim=-1, unbiased=False)
    mean_term = _masked_token_mean((mu_t - mu_s).pow(2), mask)
    var_term = _masked_token_mean((var_t - var_s).abs(), mask)
    return {"fmt": fmt, "mean": b * mean_term, "var": g * var_term}


_AT_FORMS = ("kl", "cross_entropy")


def _attention_rows_mean(per_row: Tensor, attention_mask: Tensor | None) -> Tensor:
    """Average a (B, H, Lq) per-row loss over heads and real query positions."""
    if attention_mask is None:
        return per_row.mean()
    if tuple(attention_mask.shape) != (per_row.shape[0], per_row.shape[2]):
        raise ValueError(
            f"attention_mask shape {tuple(attention_mask.shape)} does not match (B, L) = "
            f"{(per_row.shape[0], per_row.shape[2])}"
        )
    q = attention_mask.to(per_row.dtype)[:, None, :].expand_as(per_row)
    return (per_row * q).sum() / q.sum().clamp_min(1.0)  # no real query -> 0


def attention_kl_loss(
    student_probs: Tensor,
    teacher_probs: Tensor,
    attention_mask: Tensor | None = None,
    form: str = "kl",
) -> Tensor:
    """MobileBERT attention transfer for one layer, on post-softmax probabilities ``(B, H, L, L)``.

    Per head and query row: ``KL(p_T ‖ p_S) = Σ_keys p_T·(log p_T − log p_S)`` (default,
    ``form="kl"``, the paper's objective) or the official code's cross-entropy
    ``−Σ_keys p_T·log p_S`` (``form="cross_entropy"``; same student gradient, larger by the
    teacher's entropy). ``0·log 0`` is 0 (``torch.xlogy``), so padded keys (zero probability in
    both) contribute nothing; ``p_S`` is clamped to the smallest positive float inside the log.
    Averaged over heads and REAL query positions (``attention_mask`` ``(B, L)``, 1 = real), or
    with ``attention_mask=None`` over all ``B·H·L`` query rows, padded rows included (the official
    code's ``tf.reduce_mean(tf.reduce_sum(-p_T·log p_S, axis=-1))``).
    """
    if form not in _AT_FORMS:
        raise ValueError(f"form must be one of {_AT_FORMS}, got {form!r}")
    _check_same_shape("attention_kl_loss probs", student_probs, teacher_probs)
    if student_probs.dim() != 4:
        raise ValueError(f"attention_kl_loss expects (B, H, L, L) probabilities, got {tuple(student_probs.shape)}")
    tiny = torch.finfo(student_probs.dtype).tiny
    cross = -torch.xlogy(teacher_probs, student_probs.clamp_min(tiny)).sum(dim=-1)
    if form == "kl":
        per_row = torch.xlogy(teacher_probs, teacher_probs).sum(dim=-1) + cross
    else:
        per_row = cross
    return _attention_rows_mean(per_row, attention_mask)


def attention_kl_loss_from_scores(
    student_scores: Tensor,
    teacher_scores: Tensor,
    attention_mask: Tensor | None = None,
    form: str = "kl",
) -> Tensor:
    """:func:`attention_kl_loss` computed from PRE-softmax scores with ``log_softmax`` (stabler).

    Same definition, reduction and ``form`` options; the scores carry the model's additive mask on
    padded keys (a large negative number in Hugging Face models), so those keys get (numerically)
    zero probability in both distributions. The released MobileBERT model masks with ``-6``
    instead (``modeling.py``), so there padded keys keep a small probability: that belongs to the
    model being distilled, not to this loss.
    """
    if form not in _AT_FORMS:
        raise ValueError(f"form must be one of {_AT_FORMS}, got {form!r}")
    _check_same_shape("attention_kl_loss_from_scores scores", student_scores, teacher_scores)
    if student_scores.dim() != 4:
        raise ValueError(
            f"attention_kl_loss_from_scores expects (B, H, L, L) scores, got {tuple(student_scores.shape)}"
        )
    log_s = F.log_softmax(student_scores, dim=-1)
    log_t = F.log_softmax(teacher_scores, dim=-1)
    p_t = log_t.exp()
    per_row = (p_t * (log_t - log_s)).sum(dim=-1) if form == "kl" else -(p_t * log_s).sum(dim=-1)
    return _attention_rows_mean(per_row, attention_mask)


def mixed_target_mlm_loss(
    student_logits: Tensor, teacher_logits: Tensor, labels: Tensor, alpha: float = 0.5
) -> Tensor:
    """MobileBERT pre-training distillation (MLM part).

    Target distribution per masked position: ``α·one_hot(label) + (1−α)·softmax(teacher)``; loss
    ``−Σ_v target[v]·log_softmax(student)[v]``, averaged over masked positions (``labels != -100``;
    ``-100`` positions are ignored). ``α = 0.5`` in MobileBERT. Logits ``(B, L, V)`` or ``(N, V)``
    with labels of the leading shape. No masked position → 0.
    """
    a = _check_alpha("alpha", alpha)
    _check_same_shape("mixed_target_mlm_loss logits", student_logits, teacher_logits)
    if tuple(labels.shape) != tuple(student_logits.shape[:-1]):
        raise ValueError(
            f"mixed_target_mlm_loss: labels {tuple(labels.shape)} do not match logits positions "
            f"{tuple(student_logits.shape[:-1])}"
        )
    selected = labels != -100
    s = student_logits[selected]
    if s.shape[0] == 0:
        return _zero_like_loss(student_logits)
    t = teacher_logits[selected]
    y = labels[selected]
    log_p_s = F.log_softmax(s, dim=-1)
    hard = -log_p_s.gather(-1, y.long().unsqueeze(-1)).squeeze(-1)
    soft = -(F.softmax(t, dim=-1) * log_p_s).sum(dim=-1)
    return (a * hard + (1.0 - a) * soft).mean()


# --------------------------------------------------------------------------- DistilBERT


def cosine_embedding_loss(
    student_hidden: Tensor, teacher_hidden: Tensor, attention_mask: Tensor | None = None
) -> Tensor:
    """DistilBERT cosine loss: ``mean over non-padding tokens of (1 − cos(h_S, h_T))``.

    Equals ``torch.nn.CosineEmbeddingLoss(reduction="mean")`` with target +1 on the tokens selected
    by ``attention_mask`` (``(B, L)``, 1 = real; ``None`` = all tokens), including its
    stabiliser: ``cos = s·t / sqrt((|s|² + 1e-12)(|t|² + 1e-12))``. Used on the LAST hidden
    layer; student and teacher need the same width. No selected token → 0.
    """
    _check_same_shape("cosine_embedding_loss hidden", student_hidden, teacher_hidden)
    mask = _token_mask(attention_mask, student_hidden.shape[:-1], "cosine_embedding_loss")
    d = student_hidden.shape[-1]
    if mask is not None:
        s, t = student_hidden[mask], teacher_hidden[mask]
    else:
        s, t = student_hidden.reshape(-1, d), teacher_hidden.reshape(-1, d)
    if s.shape[0] == 0:
        return _zero_like_loss(student_hidden)
    eps = 1e-12
    cos = (s * t).sum(-1) / torch.sqrt((s.pow(2).sum(-1) + eps) * (t.pow(2).sum(-1) + eps))
    return (1.0 - cos).mean()


def distilbert_mlm_distillation_loss(
    student_logits: Tensor,
    teacher_logits: Tensor,
    mlm_labels: Tensor,
    student_last_hidden: Tensor,
    teacher_last_hidden: Tensor,
    attention_mask: Tensor,
    alpha_ce: float = 5.0,
    alpha_mlm: float = 2.0,
    alpha_cos: float = 1.0,
    temperature: float = 2.0,
    restrict_ce_to_mask: bool = False,
) -> dict[str, Tensor]:
    """DistilBERT pre-training loss terms (Hugging Face ``distillation/distiller.py``).

    ``{"ce": α_ce·T²·KL_batchmean(s/T ‖ t/T), "mlm": α_mlm·CE(mlm_labels), "cos": α_cos·cosine}``:

    - ``ce``: :func:`kd_kl_loss` over the ``(B, L, V)`` logits, batchmean over the selected
      positions: non-padding tokens (``attention_mask``), or only MLM-masked tokens
      (``mlm_labels != -100``) with ``restrict_ce_to_mask=True``.
    - ``mlm``: ``F.cross_entropy`` mean over positions with ``mlm_labels != -100``.
    - ``cos``: :func:`cosine_embedding_loss` on the last hidden layer over non-padding tokens.

    Defaults are the DistilBERT run's α_ce 5, α_mlm 2, α_cos 1, T 2. A term whose weight is 0 is neither
    computed nor returned (the official distiller skips it the same way; its ablations set one weight to 0).
    """
    a_ce = _check_weight("alpha_ce", alpha_ce)
    a_mlm = _check_weight("alpha_mlm", alpha_mlm)
    a_cos = _check_weight("alpha_cos", alpha_cos)
    terms: dict[str, Tensor] = {}
    if a_ce > 0:
        mask = (mlm_labels != -100) if restrict_ce_to_mask else attention_mask.bool()
        terms["ce"] = a_ce * kd_kl_loss(student_logits, teacher_logits, temperature, reduction="batchmean", mask=mask)
    if a_mlm > 0:
        flat_labels = mlm_labels.reshape(-1)
        mlm_sum = F.cross_entropy(
            student_logits.reshape(-1, student_logits.shape[-1]), flat_labels, ignore_index=-100, reduction="sum"
        )
        terms["mlm"] = a_mlm * mlm_sum / (flat_labels != -100).sum().clamp_min(1)  # mean over masked; none -> 0
    if a_cos > 0:
        terms["cos"] = a_cos * cosine_embedding_loss(student_last_hidden, teacher_last_hidden, attention_mask)
    return terms


def distilbert_task_loss(
    student_logits: Tensor,
    teacher_logits: Tensor,
    labels: Tensor,
    alpha_ce: float = 0.5,
    alpha_task: float = 0.5,
    temperature: float = 2.0,
) -> dict[str, Tensor]:
    """DistilBERT task-specific distillation for classification logits ``(B, C)``.

    ``{"ce": α_task·CE(labels, s), "kd": α_ce·T²·KL_batchmean}`` — note the names: ``"ce"`` is
    the hard-label term (weighted by ``alpha_task``, HF's ``alpha_squad``), ``"kd"`` the soft term
    (weighted by ``alpha_ce``). Defaults 0.5 / 0.5, T = 2 (HF ``run_squad_w_distillation.py``).
    Two independent non-negative weights, not a convex pair.
    """
    a_ce = _check_weight("alpha_ce", alpha_ce)
    a_task = _check_weight("alpha_task", alpha_task)
    kd = kd_kl_loss(student_logits, teacher_logits, temperature, reduction="batchmean")
    ce = F.cross_entropy(student_logits, labels)
    return {"ce": a_task * ce, "kd": a_ce * kd}


def distilbert_span_loss(
    student_start_logits: Tensor,
    student_end_logits: Tensor,
    teacher_start_logits: Tensor,
    teacher_end_logits: Tensor,
    start_positions: Tensor,
    end_positions: Tensor,
    alpha_ce: float = 0.5,
    alpha_task: float = 0.5,
    temperature: float = 2.0,
) -> dict[str, Tensor]:
    """DistilBERT task distillation for span extraction (SQuAD), logits ``(B, L)``.

    ``{"ce": α_task·(CE_start + CE_end)/2, "kd": α_ce·T²·(KL_start + KL_end)/2}`` with batchmean
    KL over the sequence dimension (no padding mask, as HF's ``run_squad_w_distillation.py``) and
    the BERT QA head's CE: positions clamped to ``[0, L]`` and position ``L`` ignored (so
    out-of-range answers do not count; a batch where every answer is ignored gives CE 0, where
    HF's ``CrossEntropyLoss`` would give NaN).
    """
    a_ce = _check_weight("alpha_ce", alpha_ce)
    a_task = _check_weight("alpha_task", alpha_task)
    kd_start = kd_kl_loss(student_start_logits, teacher_start_logits, temperature, reduction="batchmean")
    kd_end = kd_kl_loss(student_end_logits, teacher_end_logits, temperature, reduction="batchmean")
    ignored = student_start_logits.shape[-1]
    start = start_positions.reshape(-1).clamp(0, ignored)
    end = end_positions.reshape(-1).clamp(0, ignored)
    ce_start = _cross_entropy_ignoring(student_start_logits, start, ignored)
    ce_end = _cross_entropy_ignoring(student_end_logits, end, ignored)
    return {"ce": a_task * (ce_start + ce_end) / 2.0, "kd": a_ce * (kd_start + kd_end) / 2.0}


def _cross_entropy_ignoring(logits: Tensor, target: Tensor, ignore_index: int) -> Tensor:
    """``F.cross_entropy`` mean over non-ignored targets; 0 (not NaN) when every target is ignored."""
    total = F.cross_entropy(logits, target, ignore_index=ignore_index, reduction="sum")
    return total / (target != ignore_index).sum().clamp_min(1)


# --------------------------------------------------------------------------- BERT-PKD


def patient_loss(student_cls: Sequence[Tensor], teacher_cls: Sequence[Tensor], normalize: bool = True) -> Tensor:
    """BERT-PKD patient loss over the selected layers' [CLS] vectors (each ``(B, d)``).

    Stacks to ``(B, K, d)``, L2-normalises every vector over ``d`` when ``normalize`` (the
    paper's form and the official preset; ``F.normalize``, eps 1e-12), then ``F.mse_loss`` with
    mean reduction over ``B·K·d``. Computed in the inputs' dtype (the official fp16 cast is a bug
    not copied). Student and teacher widths must match; lists must have the same length ``K >= 1``.
    """
    if len(student_cls) != len(teacher_cls):
        raise ValueError(
            f"patient_loss: {len(student_cls)} student [CLS] vectors vs {len(teacher_cls)} teacher ones"
        )
    if len(student_cls) == 0:
        raise ValueError("patient_loss: no layers selected (empty [CLS] lists)")
    s = torch.stack(list(student_cls), dim=1)
    t = torch.stack(list(teacher_cls), dim=1)
    _check_same_shape("patient_loss [CLS] stacks", s, t)
    if normalize:
        s = F.normalize(s, p=2, dim=-1)
        t = F.normalize(t, p=2, dim=-1)
    return F.mse_loss(s, t)


def pkd_loss(
    student_logits: Tensor,
    teacher_logits: Tensor,
    labels: Tensor,
    student_cls: Sequence[Tensor],
    teacher_cls: Sequence[Tensor],
    alpha: float = 0.7,
    beta: float = 500.0,
    temperature: float = 10.0,
    normalize: bool = True,
) -> dict[str, Tensor]:
    """BERT-PKD: ``{"ce": (1−α)·CE, "kd": α·T²·KL_mean, "pt": β·PT}``.

    ``KL_mean`` is :func:`kd_kl_loss` with ``reduction="mean"`` (``KLDivLoss(reduction='mean')``,
    mean over batch × classes; ``T²`` included); ``CE`` is ``F.cross_entropy`` (batch mean);
    ``PT`` is :func:`patient_loss` over the given [CLS] lists (empty lists, e.g. a 1-layer
    student, give ``pt = 0``). Defaults are the official PT preset: α 0.7, β 500, T 10, normalised.
    """
    a = _check_alpha("alpha", alpha)
    b = _check_weight("beta", beta)
    ce = F.cross_entropy(student_logits, labels)
    kd = kd_kl_loss(student_logits, teacher_logits, temperature, reduction="mean")
    if len(student_cls) == 0 and len(teacher_cls) == 0:
        pt = _zero_like_loss(student_logits)
    else:
        pt = patient_loss(student_cls, teacher_cls, normalize=normalize)
    return {"ce": (1.0 - a) * ce, "kd": a * kd, "pt": b * pt}
