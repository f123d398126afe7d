"""LAMB as MobileBERT's official ``lamb_optimizer.py`` applies it (You et al., 2019).

No maintained LAMB fits kdbench's dependencies (torch has none), and the common PyTorch ports
differ from the MobileBERT code (they bias-correct the moments or clamp the trust ratio), so this
is a small transcription of the official update. Per parameter ``w`` with gradient ``g``::

    m ← β1·m + (1 − β1)·g
    v ← β2·v + (1 − β2)·g²
    u = m / (sqrt(v) + ε) + λ·w            (no bias correction; λ·w only where weight decay applies)
    r = ‖w‖ / ‖u‖ if ‖w‖ > 0 and ‖u‖ > 0 else 1   (1 where layer adaptation is excluded)
    w ← w − lr·r·u

The official code excludes biases and LayerNorm weights (names matching ``LayerNorm``,
``layer_norm``, ``bias``) from both weight decay and layer adaptation; here a parameter group says
so with ``weight_decay=0`` and ``layer_adaptation=False`` (the engine puts those parameters in such
a group). Defaults are the official ones: β 0.9 / 0.999, ε 1e-6, weight decay 0.01. The official
progressive schedule's per-layer rates are parameter groups with their own ``lr``; gradient clipping
(global norm 1.0 in ``optimization.py``) is the caller's, before :meth:`Lamb.step`.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any

import torch
from torch import Tensor


class Lamb(torch.optim.Optimizer):
    """LAMB without bias correction, trust ratio ``‖w‖/‖update‖`` (see the module docstring).

    Group options: ``lr``, ``betas``, ``eps``, ``weight_decay``, ``layer_adaptation`` (bool).
    """

    def __init__(self, params: Iterable[Any], lr: float = 1e-3, betas: tuple[float, float] = (0.9, 0.999),
                 eps: float = 1e-6, weight_decay: float = 0.01, layer_adaptation: bool = True):
        if not lr >= 0:
            raise ValueError(f"lr must be >= 0, got {lr!r}")
        if not (0 <= betas[0] < 1 and 0 <= betas[1] < 1):
            raise ValueError(f"betas must lie in [0, 1), got {betas!r}")
        if not eps > 0:
            raise ValueError(f"eps must be > 0, got {eps!r}")
        if not weight_decay >= 0:
            raise ValueError(f"weight_decay must be >= 0, got {weight_decay!r}")
        defaults = {"lr": lr, "betas": tuple(betas), "eps": eps, "weight_decay": weight_decay,
                    "layer_adaptation": layer_adaptation}
        super().__init__(params, defaults)

    @torch.no_grad()
    def step(self, closure: Callable[[], Tensor] | None = None) -> Tensor | None:
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        for group in self.param_groups:
            beta1, beta2 = group["betas"]
            for p in group["params"]:
                if p.grad is None:
                    continue
                if p.grad.is_sparse:
                    raise RuntimeError(f"{type(self).__name__} does not support sparse gradients")
                grad = self._gradient(p, group)
                state = self.state[p]
                if not state:
                    state["exp_avg"] = torch.zeros_like(p, memory_format=torch.preserve_format)
                    state["exp_avg_sq"] = torch.zeros_like(p, memory_format=torch.preserve_format)
                m, v = state["exp_avg"], state["exp_avg_sq"]
                m.mul_(beta1).add_(grad, alpha=1.0 - beta1)
                v.mul_(beta2).addcmul_(grad, grad, value=1.0 - beta2)
                update = m / (v.sqrt() + group["eps"])
                if group["weight_decay"]:
                    update.add_(p, alpha=group["weight_decay"])
                ratio: Tensor | float = 1.0
                if group["layer_adaptation"]:
                    w_norm = torch.linalg.vector_norm(p)
                    u_norm = torch.linalg.vector_norm(update)
                    ratio = torch.where((w_norm > 0) & (u_norm > 0), w_norm / u_norm, torch.ones_like(w_norm))
                p.sub_(update * (ratio * group["lr"]))
        return loss

    def _gradient(self, p: Tensor, group: dict[str, Any]) -> Tensor:
        """The gradient of ``p`` that the update uses: ``p.grad`` (:class:`kdbench.bert_adam.BertAdam` clips it first)."""
        return p.grad
