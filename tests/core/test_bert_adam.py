"""kdbench.bert_adam.BertAdam against a numpy transcription of ``BertAdam.step`` in TinyBERT's
``transformer/optimization.py`` (float64, a few steps), and the engine's wiring of it."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch

from kdbench.bert_adam import BertAdam
from kdbench.config import RunConfig, TrainConfig, build_run_config
from kdbench.engine import DistillationTrainer, training_arguments
from kdbench.engine.trainer import stage_optimization
from kdbench.method import Stage
from kdbench.optimization import Optimization, resolve


def official_step(param, grad, m, v, lr, weight_decay, max_grad_norm, beta_1=0.9, beta_2=0.999, e=1e-6):
    """One official BertAdam update of one tensor, as written in optimization.py (numpy float64)."""
    if max_grad_norm > 0:  # clip_grad_norm_(p, max_grad_norm): this tensor's norm alone
        coefficient = max_grad_norm / (np.linalg.norm(grad.reshape(-1)) + 1e-6)
        if coefficient < 1:
            grad = grad * coefficient
    next_m = beta_1 * m + (1 - beta_1) * grad
    next_v = beta_2 * v + (1 - beta_2) * grad * grad
    update = next_m / (np.sqrt(next_v) + e)
    if weight_decay > 0.0:
        update = update + weight_decay * param
    return param - lr * update, next_m, next_v


@pytest.mark.parametrize("max_grad_norm", [1.0, 0.0])
def test_four_steps_match_the_official_update_with_a_decay_group_and_per_tensor_clipping(max_grad_norm):
    rng = np.random.default_rng(1)
    shapes = [(5, 3), (3,), (4, 4)]
    start = [rng.standard_normal(s) for s in shapes]
    # the first tensor's gradients are large (clipped), the second's small (left alone)
    grads = [[3.0 * rng.standard_normal(shapes[0]), 0.01 * rng.standard_normal(shapes[1]),
              rng.standard_normal(shapes[2])] for _ in range(4)]
    decays = [0.01, 0.0, 0.01]
    lr = 5e-3
    params = [torch.nn.Parameter(torch.tensor(x, dtype=torch.float64)) for x in start]
    optimizer = BertAdam([{"params": [params[0], params[2]]}, {"params": [params[1]], "weight_decay": 0.0}],
                         lr=lr, max_grad_norm=max_grad_norm)
    ref, m, v = [x.copy() for x in start], [np.zeros(s) for s in shapes], [np.zeros(s) for s in shapes]
    for step_grads in grads:
        for p, g in zip(params, step_grads):
            p.grad = torch.tensor(g, dtype=torch.float64)
        optimizer.step()
        for i in range(3):
            ref[i], m[i], v[i] = official_step(ref[i], step_grads[i], m[i], v[i], lr, decays[i], max_grad_norm)
    for p, expected in zip(params, ref):
        np.testing.assert_allclose(p.detach().numpy(), expected, rtol=1e-12, atol=1e-15)
    if max_grad_norm:  # the clipped tensor's stored gradient is the clipped one, as clip_grad_norm_ leaves it
        assert torch.linalg.vector_norm(params[0].grad).item() == pytest.approx(1.0, rel=1e-5)


def test_the_first_step_is_larger_than_adamws_by_the_missing_bias_correction():
    # one step, one weight, gradient 0.5: BertAdam moves 0.1·0.5 / sqrt(0.001·0.5²) = 3.162 lr,
    # bias-corrected AdamW exactly lr (ε aside)
    weights = [torch.nn.Parameter(torch.zeros(1, dtype=torch.float64)) for _ in range(2)]
    bert_adam = BertAdam([weights[0]], lr=1e-3, weight_decay=0.0)
    adamw = torch.optim.AdamW([weights[1]], lr=1e-3, weight_decay=0.0, eps=1e-6)
    for w, optimizer in zip(weights, (bert_adam, adamw)):
        w.grad = torch.tensor([0.5], dtype=torch.float64)
        optimizer.step()
    assert -weights[0].item() == pytest.approx(1e-3 * 0.05 / (0.00025 ** 0.5 + 1e-6), rel=1e-12)
    assert -weights[0].item() / -weights[1].item() == pytest.approx(0.1 / 0.001 ** 0.5, rel=1e-4)


def test_bad_arguments_are_named():
    with pytest.raises(ValueError, match="max_grad_norm must be >= 0, got -1"):
        BertAdam([torch.nn.Parameter(torch.zeros(1))], max_grad_norm=-1)
    with pytest.raises(ValueError, match="layer_adaptation=True"):
        BertAdam([{"params": [torch.nn.Parameter(torch.zeros(1))], "layer_adaptation": True}])


def test_choosing_bertadam_gives_its_epsilon_unless_the_run_or_the_stage_sets_one():
    run = build_run_config({"method": "kd", "task": "sst2", "student": "x", "train.optimizer": "bertadam"}).train
    resolved = resolve(None, run)
    assert (resolved.optimizer, resolved.eps, resolved.sources["eps"]) == ("bertadam", 1e-6, "default")
    assert resolve(Optimization(eps=1e-8), run).eps == 1e-8
    assert resolve(None, TrainConfig(optimizer="bertadam", adam_epsilon=1e-7)).eps == 1e-7
    assert resolve(None, TrainConfig()).eps == 1e-8  # AdamW keeps kdbench's generic ε


def test_the_engine_builds_bertadam_and_leaves_the_clipping_to_it(tmp_path: Path):
    stage = Stage("s", lambda batch, student, teacher: {},
                  optimization=Optimization(lr=5e-5, schedule="constant", warmup_ratio=0.0))
    config = RunConfig(method="kd", task="sst2", student="x", train=TrainConfig(max_steps=10, optimizer="bertadam",
                                                                                 max_grad_norm=2.0))
    args = training_arguments(config, stage, tmp_path, "acc", has_eval=False)
    assert (args.max_grad_norm, args.adam_epsilon) == (0.0, 1e-6)  # no global clip on top of BertAdam's own

    class Module(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.student = torch.nn.Sequential(torch.nn.Linear(3, 3), torch.nn.LayerNorm(3))
            self.extras = torch.nn.ModuleDict()

    trainer = DistillationTrainer(model=Module(), args=args, stage=stage, teacher=None, teacher_order=None, task=None,
                                  eval_splits=[], eval_tokenizer=None, optimization=stage_optimization(config, stage))
    optimizer = trainer.create_optimizer()
    assert isinstance(optimizer, BertAdam)
    assert {g["max_grad_norm"] for g in optimizer.param_groups} == {2.0}
    assert {g["eps"] for g in optimizer.param_groups} == {1e-6}
    assert sorted(g["weight_decay"] for g in optimizer.param_groups) == [0.0, 0.01]  # biases, LayerNorm: no decay


def test_a_run_trains_with_bertadam_and_records_it(tiny_teacher, shared_data, tmp_path, capsys):
    from kdbench.cli import main

    code = main(["run", "kd", "--task", "sst2", "--teacher", str(tiny_teacher), "--student", "teacher-1l",
                 "--data-dir", str(shared_data / "glue_data"), "--output", str(tmp_path / "runs"),
                 "max_train_samples=48", "max_eval_samples=32", "max_seq_length=32", "batch_size=8",
                 "max_steps=3", "train.optimizer=bertadam"])
    assert code == 0
    record = json.loads((Path(capsys.readouterr().out.strip().splitlines()[-1]) / "result.json").read_text())
    assert record["status"] == "completed"
    optimization = record["stages"][0]["optimization"]
    assert (optimization["optimizer"], optimization["eps"], optimization["max_grad_norm"]) == ("bertadam", 1e-6, 1.0)
    assert (optimization["sources"]["optimizer"], optimization["sources"]["eps"]) == ("run", "default")
    assert all(0.0 < value < 50.0 for value in record["stages"][0]["final_loss_terms"].values())
