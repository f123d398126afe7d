"""How a training stage is optimised: declared by the method, overridable by the run.

A method declares, per stage, the optimisation its authors' scripts use (:class:`Optimization`:
optimiser, learning rate, schedule, warm-up, betas, epsilon, weight decay, gradient clipping,
epochs); a field it leaves ``None`` takes kdbench's generic default (:data:`GENERIC`, the Hugging
Face ``Trainer``'s usual fine-tuning setup). A value the user gives explicitly for the run
(``lr=``, ``epochs=``, ``warmup_ratio=``, ``weight_decay=``, any ``train.*`` optimisation field on
the command line or in the YAML file) wins over both, for every stage; a stage's own ``epochs`` /
``lr`` (set from a per-stage method parameter the user gave, e.g. ``kt_lr=``) win over that.
:func:`resolve_stage` applies that order and says where each value came from; the engine builds
the optimiser and schedule from the resolved values and ``result.json`` records them per stage.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass
from typing import Any

from kdbench.constraints import check_fields, constrained

OPTIMIZERS = ("adamw", "lamb", "bertadam")
"""``adamw``: torch's AdamW (bias-corrected), one global gradient-norm clip. ``lamb``:
:class:`kdbench.lamb.Lamb` (MobileBERT's ``lamb_optimizer.py``). ``bertadam``:
:class:`kdbench.bert_adam.BertAdam` (TinyBERT's and BERT-PKD's scripts: no bias correction, each
tensor's gradient clipped on its own)."""
PER_TENSOR_CLIPPING = frozenset({"bertadam"})
"""Optimisers that clip each tensor's gradient themselves, in their step, instead of the engine's global clip."""
SCHEDULES = ("linear", "constant", "mobilebert-phase")
"""``linear``: linear warm-up, then linear decay to 0 (BERT, ``Trainer``'s default). ``constant``:
linear warm-up (if any), then constant. ``mobilebert-phase``: the background rate of MobileBERT's
progressive transfer (:func:`mobilebert_phase_factor`), one period per stage."""

# TrainConfig field -> Optimization field; a non-None TrainConfig value is an explicit run override.
RUN_FIELDS = {
    "optimizer": "optimizer",
    "lr": "lr",
    "lr_schedule": "schedule",
    "warmup_ratio": "warmup_ratio",
    "adam_beta1": "beta1",
    "adam_beta2": "beta2",
    "adam_epsilon": "eps",
    "weight_decay": "weight_decay",
    "max_grad_norm": "max_grad_norm",
    "epochs": "epochs",
}


@dataclass(frozen=True)
class Optimization:
    """A stage's optimisation; ``None`` = not declared (the run's value, else :data:`GENERIC`)."""

    optimizer: str | None = constrained(None, choices=OPTIMIZERS)  # see OPTIMIZERS
    lr: float | None = constrained(None, gt=0)
    schedule: str | None = constrained(None, choices=SCHEDULES)
    warmup_ratio: float | None = constrained(None, ge=0, lt=1)  # fraction of the stage's steps
    beta1: float | None = constrained(None, ge=0, lt=1)
    beta2: float | None = constrained(None, ge=0, lt=1)
    eps: float | None = constrained(None, gt=0)
    weight_decay: float | None = constrained(None, ge=0)  # never applied to biases and LayerNorm weights
    max_grad_norm: float | None = constrained(None, ge=0)  # gradient clipping (per tensor for bertadam); 0 = none
    epochs: float | None = constrained(None, gt=0)

    def __post_init__(self) -> None:  # declared by method code, not built by from_mapping: check here
        check_fields(self, "optimization")


GENERIC = Optimization(optimizer="adamw", lr=5e-5, schedule="linear", warmup_ratio=0.1, beta1=0.9, beta2=0.999,
                       eps=1e-8, weight_decay=0.01, max_grad_norm=1.0, epochs=3.0)
"""kdbench's defaults for whatever neither the run nor the stage declares."""

OPTIMIZER_DEFAULTS = {"bertadam": Optimization(eps=1e-6)}
"""An optimiser's own defaults (``BertAdam``'s ε), before :data:`GENERIC`: a run that chooses
``optimizer=bertadam`` trains with the scripts' ε unless it or the stage sets another."""


@dataclass(frozen=True)
class ResolvedOptimization:
    """Every field set; ``sources`` names where each came from: ``stage`` (a per-stage method
    parameter), ``run`` (an explicit run value), ``method`` (the stage's declaration) or ``default``."""

    optimizer: str
    lr: float
    schedule: str
    warmup_ratio: float
    beta1: float
    beta2: float
    eps: float
    weight_decay: float
    max_grad_norm: float
    epochs: float
    sources: dict[str, str]

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    @property
    def global_max_grad_norm(self) -> float:
        """The norm the engine clips all gradients to at once: 0 where the optimiser clips per tensor."""
        return 0.0 if self.optimizer in PER_TENSOR_CLIPPING else self.max_grad_norm


def resolve(declared: Optimization | None, train: Any) -> ResolvedOptimization:
    """Resolve a stage's optimisation: explicit run values (non-``None`` fields of ``train``, a
    :class:`kdbench.config.TrainConfig`) > the stage's declaration > the chosen optimiser's own
    defaults (:data:`OPTIMIZER_DEFAULTS`) > :data:`GENERIC`."""
    declared = declared or Optimization()
    values: dict[str, Any] = {}
    sources: dict[str, str] = {}
    run_values = {opt_name: getattr(train, run_name, None) for run_name, opt_name in RUN_FIELDS.items()}
    for f in dataclasses.fields(Optimization):  # "optimizer" is the first field: the others' defaults depend on it
        name = f.name
        if run_values.get(name) is not None:
            values[name], sources[name] = run_values[name], "run"
        elif getattr(declared, name) is not None:
            values[name], sources[name] = getattr(declared, name), "method"
        else:
            own_default = getattr(OPTIMIZER_DEFAULTS.get(values.get("optimizer", ""), GENERIC), name)
            values[name] = own_default if own_default is not None else getattr(GENERIC, name)
            sources[name] = "default"
    return ResolvedOptimization(**values, sources=sources)


def as_run_values(optimization: Optimization) -> dict[str, Any]:
    """The run (``train``) values that give a run ``optimization``'s declared fields, e.g. to
    train a plain run with a method's recipe; ``epochs`` is left to the run."""
    return {run_name: getattr(optimization, opt_name) for run_name, opt_name in RUN_FIELDS.items()
            if opt_name != "epochs" and getattr(optimization, opt_name) is not None}


def mobilebert_phase_factor(step: int, steps_per_phase: int) -> float:
    """MobileBERT's background learning-rate factor (``distill_util.get_background_lr``) at ``step``
    of a phase of ``steps_per_phase`` steps: ``min(10·t/T, 0.9 + 0.1·sqrt(1 − t/T))`` with
    ``t = step mod T`` — a linear warm-up over the first ~10% of the phase, then a slow decay from
    1 to 0.9. A one-step phase gets 1."""
    if steps_per_phase <= 1:
        return 1.0
    t = (step % steps_per_phase) / steps_per_phase
    return min(10.0 * t, 0.9 + 0.1 * math.sqrt(1.0 - t))


def resolve_stage(stage: Any, train: Any) -> ResolvedOptimization:
    """:func:`resolve` for a :class:`kdbench.method.Stage` and a run's ``train`` section; the
    stage's own ``epochs`` / ``lr`` (the user's per-stage method parameters, e.g. ``kt_lr=``) win
    over everything (source ``stage``)."""
    resolved = resolve(stage.optimization, train)
    chosen = {name: getattr(stage, name) for name in ("epochs", "lr") if getattr(stage, name, None) is not None}
    if not chosen:
        return resolved
    return dataclasses.replace(resolved, **chosen, sources={**resolved.sources, **dict.fromkeys(chosen, "stage")})
