"""TinyBERT's loss functions pinned on hand-computed values (docs/fidelity.md, TinyBERT)."""

from __future__ import annotations

import math

import pytest
import torch
from torch import nn

from kdbench.losses import hidden_mse_loss, regression_mse_loss, soft_cross_entropy, tinybert_attention_loss

MASK = -10000.0


# --------------------------------------------------------------------------- attention


def test_attention_masked_entries_are_zeroed_in_both_and_count_in_the_mean():
    # B=1, H=1, L=2; the second key column is padding (-10000 added) in both models.
    student = torch.tensor([[[[1.0, 0.5 + MASK], [2.0, 7.0 + MASK]]]])
    teacher = torch.tensor([[[[0.0, MASK], [3.0, 1.0 + MASK]]]])
    # After zeroing entries <= -100: s = [[1, 0], [2, 0]], t = [[0, 0], [3, 0]].
    # Squared differences 1, 0, 1, 0 -> mean over all B*H*L*L = 4 entries = 0.5.
    assert tinybert_attention_loss(student, teacher).item() == pytest.approx(0.5)


def test_attention_threshold_is_minus_100_inclusive():
    student = torch.tensor([[[[-100.0, -99.0]]]])  # -100 is zeroed, -99 is kept
    teacher = torch.zeros(1, 1, 1, 2)
    assert tinybert_attention_loss(student, teacher).item() == pytest.approx((0.0 + 99.0 ** 2) / 2)


def test_attention_one_side_masked_only_counts_the_other_side():
    # A teacher entry masked where the student is not: teacher's becomes 0, student's 4 stays.
    student = torch.tensor([[[[4.0]]]])
    teacher = torch.tensor([[[[MASK]]]])
    assert tinybert_attention_loss(student, teacher).item() == pytest.approx(16.0)


def test_attention_mean_is_over_heads_and_padded_query_rows_too():
    # B=2, H=3, L=2, every entry differs by 1 except masked ones -> sum of unmasked / 24.
    student = torch.ones(2, 3, 2, 2)
    teacher = torch.zeros(2, 3, 2, 2)
    student[1, :, :, 1] = MASK  # second example: key 1 padded (both rows, incl. the padded query row)
    teacher[1, :, :, 1] = MASK
    unmasked = 2 * 3 * 2 * 2 - 3 * 2
    assert tinybert_attention_loss(student, teacher).item() == pytest.approx(unmasked / 24)


def test_attention_does_not_modify_inputs_and_needs_equal_heads():
    student = torch.tensor([[[[MASK, 1.0]]]])
    kept = student.clone()
    tinybert_attention_loss(student, torch.zeros_like(student))
    assert torch.equal(student, kept)
    with pytest.raises(ValueError, match="same number of heads"):
        tinybert_attention_loss(torch.zeros(1, 2, 3, 3), torch.zeros(1, 4, 3, 3))


# --------------------------------------------------------------------------- hidden / embedding


def _linear(weight: list[list[float]], bias: list[float]) -> nn.Linear:
    layer = nn.Linear(len(weight[0]), len(weight))
    with torch.no_grad():
        layer.weight.copy_(torch.tensor(weight))
        layer.bias.copy_(torch.tensor(bias))
    return layer


def test_hidden_mse_through_projection_hand_computed():
    W = _linear([[1.0, 0.0], [0.0, 2.0], [1.0, 1.0]], [0.0, 0.0, 1.0])  # d_S=2 -> d_T=3
    h_s = torch.tensor([[[1.0, 2.0], [0.0, 0.0]]])  # B=1, L=2 (second token: padding, still counted)
    # W h_s = [[1, 4, 4], [0, 0, 1]]
    h_t = torch.tensor([[[1.0, 2.0, 4.0], [1.0, 0.0, 0.0]]])
    # differences [[0, 2, 0], [-1, 0, 1]] -> squares 0+4+0+1+0+1 = 6, mean over B*L*d_T = 6 -> 1.0
    assert hidden_mse_loss(h_s, h_t, W).item() == pytest.approx(1.0)


def test_hidden_mse_without_projection_needs_equal_width():
    h = torch.tensor([[[1.0, 3.0]]])
    assert hidden_mse_loss(h, torch.zeros(1, 1, 2)).item() == pytest.approx(5.0)
    with pytest.raises(ValueError, match="pass a projection"):
        hidden_mse_loss(h, torch.zeros(1, 1, 3))


# --------------------------------------------------------------------------- prediction


def test_soft_cross_entropy_mean_over_batch_and_classes():
    student = torch.tensor([[0.0, 0.0]])
    teacher = torch.tensor([[0.0, math.log(3.0)]])  # p_T = [1/4, 3/4]
    # -p_T * log_softmax(s) = [ln2/4, 3 ln2/4]; mean over the C=2 entries = ln2/2 (sum would be ln2).
    assert soft_cross_entropy(student, teacher).item() == pytest.approx(math.log(2) / 2)


def test_soft_cross_entropy_four_classes_two_examples():
    student = torch.log(torch.tensor([[0.1, 0.2, 0.3, 0.4], [0.25, 0.25, 0.25, 0.25]]))
    teacher = torch.log(torch.tensor([[0.4, 0.3, 0.2, 0.1], [1.0, 1e-30, 1e-30, 1e-30]]))
    row0 = -(0.4 * math.log(0.1) + 0.3 * math.log(0.2) + 0.2 * math.log(0.3) + 0.1 * math.log(0.4))
    row1 = -math.log(0.25)
    expected = (row0 + row1) / (2 * 4)  # mean over B*C = 8 entries
    assert soft_cross_entropy(student, teacher).item() == pytest.approx(expected, rel=1e-5)


def test_soft_cross_entropy_has_no_temperature_squared():
    student = torch.tensor([[0.0, 0.0]])
    teacher = torch.tensor([[0.0, 2.0]])
    # A uniform student gives ln2 / 2 at every T; with a T² factor T=4 would give 16x that.
    for T in (1.0, 4.0):
        assert soft_cross_entropy(student, teacher, T).item() == pytest.approx(math.log(2) / 2)
    # Non-uniform student, T=2, by hand: s/2 = [0, 1], t/2 = [0, 1] -> p = q = [1, e]/(1+e).
    s2 = torch.tensor([[0.0, 2.0]])
    p = [1 / (1 + math.e), math.e / (1 + math.e)]
    expected = -(p[0] * math.log(p[0]) + p[1] * math.log(p[1])) / 2
    assert soft_cross_entropy(s2, teacher, 2.0).item() == pytest.approx(expected)


def test_regression_prediction_is_mse_against_gold():
    assert regression_mse_loss(torch.tensor([[1.0], [3.0]]), torch.tensor([2.0, 5.0])).item() == pytest.approx(2.5)
