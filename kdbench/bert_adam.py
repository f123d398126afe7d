"""``BertAdam``, the Adam of the BERT-era PyTorch scripts that TinyBERT and BERT-PKD train with.

TinyBERT's ``transformer/optimization.py`` (and the fp32 path of BERT-PKD's bundled
``pytorch_pretrained_bert``) update each parameter ``w`` with gradient ``g`` as::

    g ← g · min(1, c / (‖g‖ + 1e-6))       (per tensor, torch's clip_grad_norm_; c = max_grad_norm, 0 = none)
    m ← β1·m + (1 − β1)·g
    v ← β2·v + (1 − β2)·g²
    u = m / (sqrt(v) + ε) + λ·w            (no bias correction; λ·w only where weight decay applies)
    w ← w − lr·u

Two things set it apart from ``torch.optim.AdamW``. Without bias correction the first steps are
larger: the step's scale is ``(1 − β1^t) / sqrt(1 − β2^t)`` times AdamW's, 3.2× at step 1, 6.6×
near step 12, still 1.3× at step 1,000, which matters in TinyBERT's intermediate stage (constant
rate, no warm-up). And the clipping bounds each tensor's gradient norm, not the global one. The
update is LAMB's with layer adaptation off (:class:`kdbench.lamb.Lamb`), so this class adds only
the per-tensor clipping, before each tensor's update as in the official loop. Defaults are the official ones: β 0.9 / 0.999, ε 1e-6, weight decay 0.01,
clipping 1.0. The learning-rate schedule is the caller's (the scripts' ``none`` is the engine's
``constant`` schedule, their ``warmup_linear`` its ``linear`` one up to the warm-up's rounding to
whole steps).
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import torch
from torch import Tensor

from kdbench.lamb import Lamb


class BertAdam(Lamb):
    """Adam without bias correction, decoupled weight decay, per-tensor gradient clipping (see the
    module docstring).

    Group options: ``lr``, ``betas``, ``eps``, ``weight_decay``, ``max_grad_norm`` (0 = no clipping).
    """

    def __init__(self, params: Iterable[Any], lr: float = 1e-3, betas: tuple[float, float] = (0.9, 0.999),
                 eps: float = 1e-6, weight_decay: float = 0.01, max_grad_norm: float = 1.0):
        if not max_grad_norm >= 0:
            raise ValueError(f"max_grad_norm must be >= 0, got {max_grad_norm!r}")
        super().__init__(params, lr=lr, betas=betas, eps=eps, weight_decay=weight_decay, layer_adaptation=False)
        for group in self.param_groups:
            group.setdefault("max_grad_norm", max_grad_norm)
            if group["layer_adaptation"]:
                raise ValueError("BertAdam has no layer adaptation: a parameter group sets layer_adaptation=True")

    def _gradient(self, p: Tensor, group: dict[str, Any]) -> Tensor:
        if group["max_grad_norm"] > 0:  # clip_grad_norm_(p, ...) in the official loop: this tensor alone, in place
            torch.nn.utils.clip_grad_norm_(p, group["max_grad_norm"])
        return p.grad
