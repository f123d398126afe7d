"""Stage optimisation declarations: resolution order, sources, validation, the MobileBERT phase
schedule, and what the engine builds from them (optimiser kind, Trainer arguments)."""

from __future__ import annotations

import math
from pathlib import Path

import pytest
import torch

from kdbench.config import ConfigError, RunConfig, TrainConfig, build_run_config
from kdbench.engine import DistillationTrainer, training_arguments
from kdbench.lamb import Lamb
from kdbench.method import Stage
from kdbench.optimization import GENERIC, Optimization, mobilebert_phase_factor, resolve, resolve_stage

DECLARED = Optimization(optimizer="lamb", lr=1.5e-3, schedule="constant", warmup_ratio=0.0, beta2=0.98, eps=1e-6,
                        weight_decay=0.0, max_grad_norm=5.0, epochs=4.0)


def no_loss(batch, student, teacher):
    return {}


def test_the_declaration_wins_over_defaults_and_explicit_run_values_win_over_it():
    resolved = resolve(DECLARED, TrainConfig())
    assert (resolved.optimizer, resolved.lr, resolved.schedule, resolved.beta1, resolved.beta2) == \
        ("lamb", 1.5e-3, "constant", GENERIC.beta1, 0.98)
    assert resolved.sources["lr"] == "method" and resolved.sources["beta1"] == "default"
    run = build_run_config({"method": "kd", "task": "sst2", "student": "x", "lr": "1e-4", "warmup_ratio": "0.2",
                            "train.optimizer": "adamw", "train.max_grad_norm": "0"}).train
    resolved = resolve(DECLARED, run)
    assert (resolved.optimizer, resolved.lr, resolved.warmup_ratio, resolved.max_grad_norm, resolved.epochs) == \
        ("adamw", 1e-4, 0.2, 0.0, 4.0)
    assert [resolved.sources[k] for k in ("optimizer", "lr", "epochs")] == ["run", "run", "method"]


def test_nothing_declared_is_exactly_the_old_generic_setup():
    resolved = resolve(None, TrainConfig())
    assert (resolved.optimizer, resolved.lr, resolved.schedule, resolved.warmup_ratio, resolved.beta1,
            resolved.beta2, resolved.eps, resolved.weight_decay, resolved.max_grad_norm, resolved.epochs) == \
        ("adamw", 5e-5, "linear", 0.1, 0.9, 0.999, 1e-8, 0.01, 1.0, 3.0)
    assert set(resolved.sources.values()) == {"default"}


def test_a_stages_own_epochs_and_lr_win_over_the_run():
    stage = Stage("s", no_loss, epochs=2.0, lr=3e-4, optimization=DECLARED)
    resolved = resolve_stage(stage, TrainConfig(lr=1e-4, epochs=9.0))
    assert (resolved.lr, resolved.epochs, resolved.sources["lr"], resolved.sources["epochs"]) == (3e-4, 2.0, "stage", "stage")


def test_the_config_yaml_round_trip_keeps_unset_values_unset(tmp_path: Path):
    from kdbench.config import load_yaml, save_config

    config = build_run_config({"method": "kd", "task": "sst2", "student": "x", "epochs": "2"})
    save_config(config, tmp_path / "config.yaml")
    again = build_run_config(load_yaml(tmp_path / "config.yaml"))
    assert again.train.lr is None and again.train.epochs == 2.0 and again.config_hash() == config.config_hash()


@pytest.mark.parametrize(("values", "message"), [
    ({"train.optimizer": "sgd"}, "train.optimizer: must be one of adamw, lamb, bertadam, got 'sgd'"),
    ({"train.lr_schedule": "cosine"}, "train.lr_schedule: must be one of linear, constant, mobilebert-phase"),
    ({"train.adam_beta2": "1"}, "train.adam_beta2: must be in \\[0, 1\\)"),
    ({"train.max_grad_norm": "-1"}, "train.max_grad_norm: must be >= 0"),
])
def test_bad_run_values_are_named(values, message):
    with pytest.raises(ConfigError, match=message):
        build_run_config({"method": "kd", "task": "sst2", "student": "x", **values})


def test_bad_declarations_are_named():
    with pytest.raises(ConfigError, match="optimization.warmup_ratio"):
        Optimization(warmup_ratio=1.5)


def test_mobilebert_phase_factor_is_distill_utils_background_rate():
    # min(polynomial_decay(1 -> 0.9, power 0.5), polynomial_decay(0 -> 10, power 1)) over a phase of T steps
    T = 1000
    for step in (0, 1, 50, 99, 100, 101, 500, 999, 1000, 1050):
        t = (step % T) / T
        expected = min((1.0 - 0.9) * (1 - t) ** 0.5 + 0.9, (0.0 - 10.0) * (1 - t) + 10.0)
        assert mobilebert_phase_factor(step, T) == pytest.approx(expected, abs=1e-15)
    assert mobilebert_phase_factor(0, T) == 0.0 and mobilebert_phase_factor(50, T) == pytest.approx(0.5)
    assert mobilebert_phase_factor(999, T) == pytest.approx(0.9 + 0.1 * math.sqrt(0.001))
    assert mobilebert_phase_factor(7, 1) == 1.0


def test_the_engine_builds_lamb_and_the_phase_schedule_from_the_resolution(tmp_path: Path):
    stage = Stage("kt", no_loss, optimization=Optimization(optimizer="lamb", lr=2e-3, schedule="mobilebert-phase",
                                                           warmup_ratio=0.0, eps=1e-6, max_grad_norm=1.0))
    config = RunConfig(method="kd", task="sst2", student="x", train=TrainConfig(max_steps=10))
    args = training_arguments(config, stage, tmp_path, "acc", has_eval=False)
    assert (args.learning_rate, args.adam_epsilon, args.max_grad_norm, args.weight_decay) == (2e-3, 1e-6, 1.0, 0.01)

    class Module(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.student = torch.nn.Sequential(torch.nn.Linear(3, 3), torch.nn.LayerNorm(3))
            self.extras = torch.nn.ModuleDict()

        def forward(self, **kwargs):
            return None

    from kdbench.engine.trainer import stage_optimization

    trainer = DistillationTrainer(model=Module(), args=args, stage=stage, teacher=None, teacher_order=None, task=None,
                                  eval_splits=[], eval_tokenizer=None, optimization=stage_optimization(config, stage))
    optimizer = trainer.create_optimizer()
    assert isinstance(optimizer, Lamb)
    adapted = {group["layer_adaptation"] for group in optimizer.param_groups if group["weight_decay"] > 0}
    excluded = {group["layer_adaptation"] for group in optimizer.param_groups if group["weight_decay"] == 0}
    assert adapted == {True} and excluded == {False}  # biases and LayerNorm weights: no decay, no trust ratio
    scheduler = trainer.create_scheduler(100, optimizer)
    rates = []
    for _ in range(12):
        rates.append(optimizer.param_groups[0]["lr"])
        optimizer.step()
        scheduler.step()
    assert rates[0] == 0.0 and rates[5] == pytest.approx(2e-3 * 0.5) and rates[10] == pytest.approx(
        2e-3 * (0.9 + 0.1 * math.sqrt(0.9)))
