"""The TinyBERT method plug-in: stages, mappings, projections, ablations, checked on hand-built features
and on features captured from tiny models (padded batches)."""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F
from transformers import BertConfig, BertForSequenceClassification

from kdbench.capture import FeatureCapture
from kdbench.config import ConfigError, RunConfig, TrainConfig
from kdbench.features import Features
from kdbench.method import MethodContext
from kdbench.methods.tinybert import intermediate_optimization
from kdbench.optimization import resolve_stage
from kdbench.plugins import METHODS
from kdbench.task import HeadType, TaskSpec

D_S, D_T, HEADS = 6, 8, 2


def config(layers: int, hidden: int, heads: int = HEADS) -> BertConfig:
    return BertConfig(vocab_size=50, hidden_size=hidden, num_hidden_layers=layers, num_attention_heads=heads,
                      intermediate_size=16, max_position_embeddings=32, num_labels=2)


def context(student_layers: int = 2, teacher_layers: int = 4, head: HeadType = HeadType.CLASSIFICATION,
            student_heads: int = HEADS) -> MethodContext:
    spec = TaskSpec(name="toy", head=head, main_metric="acc",
                    label_names=("a", "b") if head is HeadType.CLASSIFICATION else None)
    return MethodContext(task=spec, student_config=config(student_layers, D_S, student_heads),
                         teacher_config=config(teacher_layers, D_T),
                         run=RunConfig(method="tinybert", task="toy", student="x"))


def method(**params):
    return METHODS.get("tinybert").from_overrides(params)


def features(layers: int, width: int, seed: int, batch: int = 2, length: int = 3) -> Features:
    g = torch.Generator().manual_seed(seed)
    hidden = tuple(torch.randn(batch, length, width, generator=g) for _ in range(layers + 1))
    scores = tuple(torch.randn(batch, HEADS, length, length, generator=g) for _ in range(layers))
    logits = torch.randn(batch, 2, generator=g)
    return Features(logits=logits, hidden_states=hidden, attention_scores=scores)


# --------------------------------------------------------------------------- stages and defaults


def test_task_mode_has_intermediate_then_prediction_with_paper_defaults():
    m = method()
    ctx = context()
    m.extra_modules(ctx)
    stages = m.stages(ctx)
    assert [s.name for s in stages] == ["intermediate", "prediction"]
    inter, pred = stages
    # the paper's values are the stages' declarations; run values given explicitly win over them
    generic = TrainConfig()
    inter_opt, pred_opt = resolve_stage(inter, generic), resolve_stage(pred, generic)
    assert (inter_opt.epochs, inter_opt.lr, inter_opt.schedule, inter_opt.warmup_ratio) == (20.0, 5e-5, "constant", 0.0)
    assert inter_opt.sources["schedule"] == "method" and not inter.select_best
    assert inter.student_features.hidden_states and inter.student_features.attention_scores
    # Each side is asked for the layers the uniform 4 -> 2 mapping reads, no more (the teacher's others keep SDPA).
    assert inter.teacher_features.hidden_layers == (0, 2, 4) and inter.teacher_features.attention_layers == (1, 3)
    assert inter.student_features.hidden_layers == (0, 1, 2) and inter.student_features.attention_layers == (0, 1)
    assert (pred_opt.epochs, pred_opt.lr, pred_opt.schedule) == (3.0, 3e-5, "linear")
    assert (pred.select_best, pred.uses_teacher) == (True, True)
    assert not pred.student_features.any
    explicit = resolve_stage(inter, TrainConfig(lr=1e-4, epochs=2.0))
    assert (explicit.lr, explicit.epochs, explicit.schedule) == (1e-4, 2.0, "constant")
    assert (explicit.sources["lr"], explicit.sources["epochs"]) == ("run", "run")


@pytest.mark.parametrize("task, epochs", [("mnli", 10.0), ("qqp", 10.0), ("qnli", 10.0), ("cola", 50.0),
                                          ("rte", 20.0), ("sst2", 20.0)])
def test_intermediate_stage_epochs_follow_the_paper_per_task(task, epochs):
    assert intermediate_optimization(task).epochs == epochs


def test_general_mode_is_intermediate_only_and_has_its_own_name():
    m = METHODS.get("tinybert-general").from_overrides({})
    ctx = context()
    m.extra_modules(ctx)
    (stage,) = m.stages(ctx)
    resolved = resolve_stage(stage, TrainConfig())
    assert (stage.name, resolved.epochs, resolved.lr, stage.select_best) == ("general", 3.0, 5e-5, False)
    with pytest.raises(ConfigError, match="no_pred"):
        METHODS.get("tinybert").from_overrides({"mode": "general", "no_pred": "true"})


def test_a_stage_parameter_wins_over_the_run_value():
    m = method(intermediate_epochs="4", prediction_lr="1e-5")
    ctx = context()
    m.extra_modules(ctx)
    inter, pred = m.stages(ctx)
    run = TrainConfig(lr=2e-5, epochs=7.0)
    assert resolve_stage(inter, run).epochs == 4.0 and resolve_stage(inter, run).sources["epochs"] == "stage"
    assert resolve_stage(pred, run).lr == 1e-5 and resolve_stage(pred, run).epochs == 7.0


# --------------------------------------------------------------------------- loss terms by hand


def test_intermediate_loss_equals_hand_sum_with_shared_projection():
    m = method()
    ctx = context()
    extras = m.extra_modules(ctx)
    assert list(extras) == ["fit_dense"]
    W = extras["fit_dense"]
    s, t = features(2, D_S, seed=0), features(4, D_T, seed=1)
    terms = m.stages(ctx)[0].compute({}, s, t, extras)
    assert set(terms) == {"attn", "embd", "hidn"}
    # uniform 4 -> 2 (k = 2): hidden 0-0, 1-2, 2-4; attention 0-1, 1-3
    with torch.no_grad():
        assert terms["embd"].item() == pytest.approx(F.mse_loss(W(s.hidden_states[0]), t.hidden_states[0]).item())
        hidn = sum(F.mse_loss(W(s.hidden_states[i]), t.hidden_states[j]) for i, j in ((1, 2), (2, 4)))
        assert terms["hidn"].item() == pytest.approx(hidn.item())
        attn = sum(F.mse_loss(s.attention_scores[i], t.attention_scores[j]) for i, j in ((0, 1), (1, 3)))
        assert terms["attn"].item() == pytest.approx(attn.item())


@pytest.mark.parametrize("projection, names", [
    ("shared", ["fit_dense"]),
    ("paper", ["embedding", "hidden"]),
    ("per-layer", ["hidden_0", "hidden_1", "hidden_2"]),
])
def test_projection_options_create_and_use_their_matrices(projection, names):
    m = method(projection=projection)
    ctx = context()
    extras = m.extra_modules(ctx)
    assert sorted(extras) == names
    s, t = features(2, D_S, seed=2), features(4, D_T, seed=3)
    terms = m.stages(ctx)[0].compute({}, s, t, extras)
    (terms["embd"] + terms["hidn"]).backward()
    for name in names:  # every matrix receives a gradient: it is really used
        assert extras[name].weight.grad is not None and extras[name].weight.grad.abs().sum() > 0
    if projection == "per-layer":
        W1, W2 = extras["hidden_1"], extras["hidden_2"]
        expected = F.mse_loss(W1(s.hidden_states[1]), t.hidden_states[2]) + F.mse_loss(W2(s.hidden_states[2]), t.hidden_states[4])
        assert terms["hidn"].item() == pytest.approx(expected.item())


def test_shared_and_per_layer_differ_once_the_matrices_differ():
    s, t = features(2, D_S, seed=4), features(4, D_T, seed=5)
    shared, per_layer = method(projection="shared"), method(projection="per-layer")
    ctx = context()
    e_shared, e_layer = shared.extra_modules(ctx), per_layer.extra_modules(ctx)
    with torch.no_grad():
        for name in e_layer:  # start every per-layer matrix equal to the shared one: same loss
            e_layer[name].load_state_dict(e_shared["fit_dense"].state_dict())
        a = shared.stages(ctx)[0].compute({}, s, t, e_shared)["hidn"].item()
        b = per_layer.stages(ctx)[0].compute({}, s, t, e_layer)["hidn"].item()
        assert a == pytest.approx(b)
        e_layer["hidden_2"].weight.mul_(2.0)
        assert per_layer.stages(ctx)[0].compute({}, s, t, e_layer)["hidn"].item() != pytest.approx(a)


def test_projection_none_requires_equal_widths():
    m = method(projection="none")
    with pytest.raises(ConfigError, match="equal hidden sizes"):
        m.validate(context())


def test_layer_weights_scale_each_layer():
    m = method(layer_weights="[0.5, 2.0, 0.0]", no_attn="false")
    ctx = context()
    extras = m.extra_modules(ctx)
    W = extras["fit_dense"]
    s, t = features(2, D_S, seed=6), features(4, D_T, seed=7)
    terms = m.stages(ctx)[0].compute({}, s, t, extras)
    with torch.no_grad():
        assert terms["embd"].item() == pytest.approx(0.5 * F.mse_loss(W(s.hidden_states[0]), t.hidden_states[0]).item())
        assert terms["hidn"].item() == pytest.approx(2.0 * F.mse_loss(W(s.hidden_states[1]), t.hidden_states[2]).item())
        assert terms["attn"].item() == pytest.approx(2.0 * F.mse_loss(s.attention_scores[0], t.attention_scores[1]).item())
    with pytest.raises(ConfigError, match="needs 3 values"):
        method(layer_weights="[1, 1]").mapping(ctx)


@pytest.mark.parametrize("switch, expected", [
    ("no_embd", {"attn", "hidn"}),
    ("no_attn", {"embd", "hidn"}),
    ("no_hidn", {"attn", "embd"}),
    ("no_trm", {"embd"}),
])
def test_ablation_switches_drop_their_terms(switch, expected):
    m = method(**{switch: "true"})
    ctx = context()
    extras = m.extra_modules(ctx)
    inter = m.stages(ctx)[0]
    terms = inter.compute({}, features(2, D_S, seed=8), features(4, D_T, seed=9), extras)
    assert set(terms) == expected
    assert inter.student_features.attention_scores == ("attn" in expected)


def test_all_intermediate_objectives_off_leaves_only_the_prediction_stage():
    m = method(no_embd="true", no_trm="true")
    ctx = context()
    m.extra_modules(ctx)
    assert [s.name for s in m.stages(ctx)] == ["prediction"]
    with pytest.raises(ConfigError, match="no loss"):
        method(mode="general", no_embd="true", no_trm="true")


def test_prediction_soft_ce_no_pred_hard_ce_and_regression_gold_mse():
    s = Features(logits=torch.tensor([[0.0, 0.0]]))
    t = Features(logits=torch.tensor([[0.0, math.log(3.0)]]))
    ctx = context()
    pred = method(temperature="1").stages(ctx)[-1]
    assert pred.loss({}, s, t)["pred"].item() == pytest.approx(math.log(2) / 2)
    no_pred = method(no_pred="true").stages(ctx)[-1]
    assert not no_pred.uses_teacher
    batch = {"labels": torch.tensor([1])}
    assert no_pred.loss(batch, s, None)["ce"].item() == pytest.approx(math.log(2))
    reg = method().stages(context(head=HeadType.REGRESSION))[-1]
    assert not reg.uses_teacher
    out = reg.loss({"labels": torch.tensor([2.0])}, Features(logits=torch.tensor([[0.5]])), None)
    assert out["mse"].item() == pytest.approx(2.25)


def test_span_prediction_averages_start_and_end_soft_ce_each_a_mean_over_positions():
    # TinyBERT's released code has no span task; kdbench applies its soft CE (mean over batch AND
    # the last axis, here the window's positions) to start and end logits and averages the two.
    ctx = context(head=HeadType.SPAN)
    student = Features(start_logits=torch.zeros(1, 4), end_logits=torch.tensor([[0.0, 0.0, 0.0, math.log(3.0)]]))
    teacher = Features(start_logits=torch.tensor([[1.0, 2.0, 3.0, 4.0]]),
                       end_logits=torch.tensor([[0.0, 0.0, 0.0, 100.0]]))
    # start: the student is uniform, so −Σ p_T·log(1/4) = ln 4 whatever p_T is, then /4 positions;
    # end: p_T is one-hot on the last position, where the student gives 3/6: ln 2, then /4.
    start, end = math.log(4) / 4, math.log(2) / 4
    pred = method(prediction_weight="2").stages(ctx)[-1]
    assert pred.uses_teacher
    assert pred.loss({}, student, teacher)["pred"].item() == pytest.approx(2 * (start + end) / 2)
    no_pred = method(no_pred="true").stages(ctx)[-1]
    batch = {"start_positions": torch.tensor([0]), "end_positions": torch.tensor([3])}
    # hard CE: start uniform, ln 4; end on the position the student gives 1/2, ln 2
    assert no_pred.loss(batch, student, None)["ce"].item() == pytest.approx((math.log(4) + math.log(2)) / 2)


# --------------------------------------------------------------------------- errors before training


def test_bad_mappings_and_head_counts_are_config_errors():
    with pytest.raises(ConfigError, match="divisible"):
        method().validate(context(student_layers=3, teacher_layers=4))
    with pytest.raises(ConfigError, match="out of range"):
        method(mapping="[[0, 0], [1, 5]]").validate(context())
    with pytest.raises(ConfigError, match="one entry per student layer"):
        method(mapping="[1, 2, 3]").validate(context())
    with pytest.raises(ConfigError, match="unknown TinyBERT layer-mapping"):
        method(mapping="middle").validate(context())
    with pytest.raises(ConfigError, match="same number of heads"):
        method().validate(context(student_heads=1))
    method(no_attn="true").validate(context(student_heads=1))  # fine without attention
    with pytest.raises(ConfigError, match="mode"):
        method(mode="joint")


def test_explicit_and_top_mappings():
    assert [(m.student, m.teacher) for m in method(mapping="top").mapping(context()).hidden] == [(0, 0), (1, 3), (2, 4)]
    pairs = method(mapping="[3, 4]").mapping(context())
    assert [(m.student, m.teacher) for m in pairs.attention] == [(0, 2), (1, 3)]


# --------------------------------------------------------------------------- real capture, padded batch


def test_attention_term_on_captured_scores_ignores_padded_keys():
    torch.manual_seed(0)
    teacher = BertForSequenceClassification(config(4, D_T)).eval()
    student = BertForSequenceClassification(config(2, D_S)).eval()
    m = method(no_embd="true", no_hidn="true")
    ctx = MethodContext(task=context().task, student_config=student.config, teacher_config=teacher.config,
                        run=context().run)
    m.validate(ctx)
    extras = m.extra_modules(ctx)
    inter = m.stages(ctx)[0]
    inputs = {"input_ids": torch.tensor([[1, 5, 7, 2], [1, 9, 2, 0]]),
              "attention_mask": torch.tensor([[1, 1, 1, 1], [1, 1, 1, 0]])}
    with FeatureCapture(student, inter.student_features) as cs, FeatureCapture(teacher, inter.teacher_features) as ct:
        with torch.no_grad():
            fs = cs.collect(student(**inputs))
            ft = ct.collect(teacher(**inputs))
        loss = inter.compute(inputs, fs, ft, extras)["attn"]
    assert (fs.attention_scores[0][1, :, :, 3] < -1000).all()  # the padded key carries the -10000 mask
    expected = 0.0
    for i, j in ((0, 1), (1, 3)):
        s, t = fs.attention_scores[i].clone(), ft.attention_scores[j].clone()
        s[1, :, :, 3] = 0.0  # padded key column zeroed on both sides; padded query row (1, :, 3, :) kept
        t[1, :, :, 3] = 0.0
        expected += ((s - t) ** 2).sum().item() / s.numel()
    assert loss.item() == pytest.approx(expected, rel=1e-5)
