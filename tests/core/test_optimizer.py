"""The one AdamW every kdbench loop builds (engine, bench floor, TextBrewer job)."""

import torch

from kdbench.engine import build_adamw


def _params(seed: int) -> list[torch.nn.Parameter]:
    generator = torch.Generator().manual_seed(seed)
    params = [torch.nn.Parameter(torch.randn(shape, generator=generator)) for shape in ((7, 5), (5,), (3, 7))]
    for p in params:
        p.grad = torch.randn(p.shape, generator=generator)
    return params


def test_cpu_parameters_get_the_fused_kernel():
    optimizer = build_adamw(_params(0), lr=1e-3)
    assert optimizer.defaults["fused"] is True


def test_fused_steps_equal_torchs_default_adamw_with_groups_and_decay():
    ours, reference = _params(1), _params(1)
    groups = [{"params": ours[:2], "weight_decay": 0.01}, {"params": ours[2:], "weight_decay": 0.0, "lr": 5e-3}]
    ref_groups = [{"params": reference[:2], "weight_decay": 0.01},
                  {"params": reference[2:], "weight_decay": 0.0, "lr": 5e-3}]
    fused = build_adamw(groups, lr=1e-3)
    plain = torch.optim.AdamW(ref_groups, lr=1e-3, betas=(0.9, 0.999), eps=1e-8)
    for step in range(3):
        fused.step()
        plain.step()
        for a, b in zip(ours, reference):
            b.grad = a.grad = torch.full_like(a, 0.1 * (step + 1)) - a.detach()
    for a, b, start in zip(ours, reference, _params(1)):
        torch.testing.assert_close(a, b, rtol=1e-6, atol=1e-7)
        assert (a - start).abs().max() > 1e-3  # three steps moved every tensor


def test_an_empty_parameter_list_is_not_fused_and_raises_like_torch():
    try:
        build_adamw([], lr=1e-3)
    except ValueError as error:
        assert "empty" in str(error)
    else:  # pragma: no cover
        raise AssertionError("an optimiser over no parameters must fail")
