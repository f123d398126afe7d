"""MobileBERT objectives pinned on hand-computed values, padding included.

FMT (paper MSE and the official normalised form), AT (KL and the official cross-entropy) and PD
(mixed one-hot / teacher targets), as the method plug-in calls them.
"""

from __future__ import annotations

import math

import pytest
import torch

from kdbench.features import Features
from kdbench.layer_maps import LayerMatch
from kdbench.losses import (
    attention_kl_loss,
    attention_kl_loss_from_scores,
    fmt_mse_loss,
    fmt_normalized_loss,
    mixed_target_mlm_loss,
)
from kdbench.methods.mobilebert import MobileBertParams, layer_transfer_terms

MASK = torch.tensor([[1, 1, 0]])  # third token is padding


# ------------------------------------------------------------------------------------------- FMT
def test_fmt_paper_mse_averages_real_tokens_only():
    s = torch.tensor([[[1.0, 2.0], [3.0, 4.0], [9.0, 9.0]]])
    t = torch.tensor([[[0.0, 2.0], [3.0, 6.0], [0.0, 0.0]]])
    # per-token MSE over d=2: 0.5, 2.0, 81.0 (padding)
    assert fmt_mse_loss(s, t, MASK).item() == pytest.approx((0.5 + 2.0) / 2)
    assert fmt_mse_loss(s, t).item() == pytest.approx((0.5 + 2.0 + 81.0) / 3)


# With d = 2 the layer norm of [a, b] is [-1, 1] or [1, -1] (or [0, 0] when a == b), so every term
# can be worked out by hand:
#   token 1: S [1, 3] (mu 2, var 1, LN [-1, 1]); T [4, 0] (mu 2, var 4, LN [1, -1])
#            -> fmt ((2)^2 + (2)^2)/2 = 4, mean (2-2)^2 = 0, var |4-1| = 3
#   token 2: S [0, 2] (mu 1, var 1, LN [-1, 1]); T [1, 3] (mu 2, var 1, LN [-1, 1])
#            -> fmt 0, mean (2-1)^2 = 1, var 0
#   token 3 (padding): S [5, 5] (mu 5, var 0, LN [0, 0]); T [0, 10] (mu 5, var 25, LN [-1, 1])
#            -> fmt 1, mean 0, var 25
S_FMT = torch.tensor([[[1.0, 3.0], [0.0, 2.0], [5.0, 5.0]]])
T_FMT = torch.tensor([[[4.0, 0.0], [1.0, 3.0], [0.0, 10.0]]])


def test_fmt_normalized_official_form_with_padding():
    terms = fmt_normalized_loss(S_FMT, T_FMT, MASK, beta=5000.0, gamma=5.0)
    assert terms["fmt"].item() == pytest.approx((4 + 0) / 2)
    assert terms["mean"].item() == pytest.approx(5000.0 * (0 + 1) / 2)
    assert terms["var"].item() == pytest.approx(5.0 * (3 + 0) / 2)


def test_fmt_normalized_without_mask_counts_every_token():
    terms = fmt_normalized_loss(S_FMT, T_FMT, None, beta=2.0, gamma=3.0)
    assert terms["fmt"].item() == pytest.approx((4 + 0 + 1) / 3)
    assert terms["mean"].item() == pytest.approx(2.0 * 1 / 3)
    assert terms["var"].item() == pytest.approx(3.0 * (3 + 0 + 25) / 3)


def test_fmt_normalized_layer_norm_has_no_parameters_and_gradients_reach_student():
    s = S_FMT.clone().requires_grad_(True)
    total = sum(fmt_normalized_loss(s, T_FMT, MASK).values())
    total.backward()
    assert s.grad is not None and s.grad[0, :2].abs().sum() > 0
    assert s.grad[0, 2].abs().sum() == 0  # the padded token contributes nothing


# -------------------------------------------------------------------------------------------- AT
def _scores():
    """(B=1, H=2, L=3) pre-softmax scores, key 3 padded (-10000 as the capture adds)."""
    pad = -10000.0
    ln3 = math.log(3.0)
    teacher = torch.tensor([[[[0.0, ln3, pad], [ln3, 0.0, pad], [0.0, 0.0, pad]],
                             [[0.0, 0.0, pad], [0.0, 0.0, pad], [0.0, 0.0, pad]]]])
    student = torch.tensor([[[[0.0, 0.0, pad], [0.0, 0.0, pad], [math.log(9.0), 0.0, pad]],
                             [[0.0, 0.0, pad], [0.0, 0.0, pad], [5.0, 0.0, pad]]]])
    return student, teacher


# head 1, rows 1-2: teacher (0.25, 0.75) / (0.75, 0.25) vs student (0.5, 0.5):
#   KL = 0.25 ln 0.5 + 0.75 ln 1.5 = 0.1308121..., cross-entropy = ln 2
# head 2: identical distributions -> KL 0, cross-entropy ln 2. Row 3 is a padded query: excluded.
KL_ROW = 0.25 * math.log(0.5) + 0.75 * math.log(1.5)


def test_attention_kl_averages_heads_and_real_queries():
    s, t = _scores()
    expected = (2 * KL_ROW + 0 + 0) / 4
    assert attention_kl_loss_from_scores(s, t, MASK).item() == pytest.approx(expected, rel=1e-6)
    probs = attention_kl_loss(torch.softmax(s, -1), torch.softmax(t, -1), MASK)
    assert probs.item() == pytest.approx(expected, rel=1e-5)


def test_attention_cross_entropy_form_is_the_official_code():
    s, t = _scores()
    assert attention_kl_loss_from_scores(s, t, MASK, form="cross_entropy").item() == pytest.approx(math.log(2.0))


def test_attention_padded_query_rows_change_nothing():
    s, t = _scores()
    s2 = s.clone()
    s2[..., 2, :2] = torch.tensor([7.0, -3.0])  # a different padded query row
    assert attention_kl_loss_from_scores(s2, t, MASK).item() == pytest.approx(
        attention_kl_loss_from_scores(s, t, MASK).item())
    assert attention_kl_loss_from_scores(s, t, None).item() > attention_kl_loss_from_scores(s, t, MASK).item()


# -------------------------------------------------------------------------------------------- PD
def test_pd_mixed_targets_hand_computed():
    # position 1 masked (label 0): teacher softmax [0.2, 0.6, 0.2], student softmax [0.5, 0.25, 0.25]
    # target 0.5*[1,0,0] + 0.5*teacher = [0.6, 0.3, 0.1]
    # loss = -(0.6 ln 0.5 + 0.3 ln 0.25 + 0.1 ln 0.25); position 2 (label -100) is ignored.
    teacher = torch.tensor([[[0.0, math.log(3.0), 0.0], [9.0, -9.0, 0.0]]])
    student = torch.tensor([[[math.log(2.0), 0.0, 0.0], [-9.0, 9.0, 0.0]]])
    labels = torch.tensor([[0, -100]])
    expected = -(0.6 * math.log(0.5) + 0.3 * math.log(0.25) + 0.1 * math.log(0.25))
    assert mixed_target_mlm_loss(student, teacher, labels, alpha=0.5).item() == pytest.approx(expected)
    assert mixed_target_mlm_loss(student, teacher, labels, alpha=1.0).item() == pytest.approx(-math.log(0.5))
    assert mixed_target_mlm_loss(student, teacher, torch.tensor([[-100, -100]])).item() == 0.0


# ------------------------------------------------------------------------- per-layer terms (method)
def test_layer_transfer_terms_apply_readme_factors_over_every_position_by_default():
    s_scores, t_scores = _scores()
    student = Features(hidden_states=(S_FMT, S_FMT), attention_scores=(s_scores,), attention_mask=MASK)
    teacher = Features(hidden_states=(T_FMT, T_FMT), attention_scores=(t_scores,), attention_mask=MASK)
    # default = run_pretraining.py: every B·L token and every query row, padding included
    terms = layer_transfer_terms(student, teacher, LayerMatch(1, 1), LayerMatch(0, 0), MobileBertParams(), None)
    assert terms["fmt"].item() == pytest.approx(100.0 * (4 + 0 + 1) / 3)  # hidden factor 100
    assert terms["mean"].item() == pytest.approx(5000.0 * (0 + 1 + 0) / 3)  # beta 5000 inside
    assert terms["var"].item() == pytest.approx(5.0 * (3 + 0 + 25) / 3)  # gamma 5 inside
    # cross-entropy (the code's AT form) over 2 heads x 3 query rows; padded query rows: teacher
    # (1/2, 1/2) against student (0.9, 0.1) in head 1 and softmax(5, 0) in head 2
    p5 = math.exp(5.0) / (math.exp(5.0) + 1.0)
    rows = [math.log(2.0)] * 4 + [-(0.5 * math.log(0.9) + 0.5 * math.log(0.1)),
                                  -(0.5 * math.log(p5) + 0.5 * math.log(1.0 - p5))]
    assert terms["at"].item() == pytest.approx(sum(rows) / 6, rel=1e-6)  # attention factor 1
    # L transferred layers: every term is divided by L, as the code's factor / num_layers
    quarter = layer_transfer_terms(student, teacher, LayerMatch(1, 1), LayerMatch(0, 0), MobileBertParams(), None,
                                   num_layers=4)
    assert all(quarter[k].item() == pytest.approx(terms[k].item() / 4) for k in terms)
    # the real-token option and the paper's KL
    real = layer_transfer_terms(student, teacher, LayerMatch(1, 1), LayerMatch(0, 0),
                                MobileBertParams(token_reduction="real", at_form="kl"), None)
    assert real["fmt"].item() == pytest.approx(100.0 * 2.0)
    assert real["mean"].item() == pytest.approx(2500.0)
    assert real["var"].item() == pytest.approx(7.5)
    assert real["at"].item() == pytest.approx(KL_ROW / 2, rel=1e-6)
    paper = layer_transfer_terms(student, teacher, LayerMatch(1, 1), LayerMatch(0, 0),
                                 MobileBertParams(fmt_form="mse", use_at=False, hidden_weight=1.0,
                                                  token_reduction="real"), None)
    expected_mse = ((9 + 9) / 2 + (1 + 1) / 2) / 2  # token 1: (1-4)^2,(3-0)^2; token 2: 1, 1
    assert set(paper) == {"fmt"} and paper["fmt"].item() == pytest.approx(expected_mse)
