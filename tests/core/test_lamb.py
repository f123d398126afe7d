"""kdbench.lamb.Lamb against a numpy transcription of MobileBERT's ``lamb_optimizer.py``
(``LAMBOptimizer.apply_gradients`` with ``use_layer_wise_warmup=False``), float64, a few steps."""

import re

import numpy as np
import pytest
import torch

from kdbench.lamb import Lamb

EXCLUDE = ["teacher", "LayerNorm", "layer_norm", "bias", "FakeLayerNorm"]  # optimization.py's list


def official_step(name, param, grad, m, v, lr, wd=0.01, beta_1=0.9, beta_2=0.999, epsilon=1e-6):
    """One official LAMB update of one variable (numpy float64), as written in lamb_optimizer.py."""
    next_m = beta_1 * m + (1.0 - beta_1) * grad
    next_v = beta_2 * v + (1.0 - beta_2) * np.square(grad)
    update = next_m / (np.sqrt(next_v) + epsilon)
    excluded = any(re.search(r, name) is not None for r in EXCLUDE)
    if wd and not excluded:
        update = update + wd * param
    ratio = 1.0
    if not excluded:
        w_norm = np.linalg.norm(param.reshape(-1), ord=2)
        g_norm = np.linalg.norm(update.reshape(-1), ord=2)
        ratio = np.where(w_norm > 0, np.where(g_norm > 0, w_norm / g_norm, 1.0), 1.0)
    return param - ratio * lr * update, next_m, next_v


def test_three_steps_match_the_official_update_with_exclusions_and_a_zero_tensor():
    rng = np.random.default_rng(0)
    names = ["bert/encoder/layer_0/attention/self/query/kernel", "bert/encoder/layer_0/attention/self/query/bias",
             "bert/encoder/layer_0/output/LayerNorm/gamma", "cls/zero_kernel"]
    shapes = [(6, 4), (4,), (4,), (3, 3)]
    start = [rng.standard_normal(s) for s in shapes]
    start[3] = np.zeros(shapes[3])  # ‖w‖ = 0: trust ratio 1
    grads = [[rng.standard_normal(s) for s in shapes] for _ in range(3)]
    lr = 1.5e-3

    params = [torch.nn.Parameter(torch.tensor(x, dtype=torch.float64)) for x in start]
    excluded = [any(re.search(r, n) for r in EXCLUDE) for n in names]
    groups = [{"params": [p for p, e in zip(params, excluded) if not e]},
              {"params": [p for p, e in zip(params, excluded) if e], "weight_decay": 0.0, "layer_adaptation": False}]
    optimizer = Lamb(groups, lr=lr, weight_decay=0.01)

    ref = [x.copy() for x in start]
    m = [np.zeros(s) for s in shapes]
    v = [np.zeros(s) for s in shapes]
    for step_grads in grads:
        for p, g in zip(params, step_grads):
            p.grad = torch.tensor(g, dtype=torch.float64)
        optimizer.step()
        for i, name in enumerate(names):
            ref[i], m[i], v[i] = official_step(name, ref[i], step_grads[i], m[i], v[i], lr)
    for p, expected, first in zip(params, ref, start):
        np.testing.assert_allclose(p.detach().numpy(), expected, rtol=1e-12, atol=1e-15)
        assert np.abs(p.detach().numpy() - first).max() > 1e-5  # every tensor moved


def test_no_bias_correction_first_step_size_is_lr_times_trust_ratio():
    # Official step 1: m = 0.1 g, v = 0.001 g², u = m/(sqrt(v)+eps) ≈ sign(g)·0.1/sqrt(0.001) = 3.162...·sign(g);
    # with bias correction it would be sign(g). Without weight decay the step is lr·‖w‖ in norm.
    w = torch.nn.Parameter(torch.tensor([3.0, -4.0], dtype=torch.float64))
    w.grad = torch.tensor([1.0, 1.0], dtype=torch.float64)
    Lamb([w], lr=0.1, weight_decay=0.0).step()
    moved = torch.tensor([3.0, -4.0], dtype=torch.float64) - w.detach()
    assert torch.linalg.vector_norm(moved).item() == pytest.approx(0.1 * 5.0, rel=1e-9)
    assert moved[0].item() == pytest.approx(moved[1].item())


@pytest.mark.parametrize("kwargs, message", [({"lr": -1.0}, "lr"), ({"betas": (1.0, 0.9)}, "betas"),
                                             ({"eps": 0.0}, "eps"), ({"weight_decay": -0.1}, "weight_decay")])
def test_bad_hyperparameters_are_named(kwargs, message):
    with pytest.raises(ValueError, match=message):
        Lamb([torch.nn.Parameter(torch.zeros(2))], **kwargs)
