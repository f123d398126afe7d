"""BERT-PKD: losses pinned on hand-computed values, teacher-layer selection, the method's stage."""

from __future__ import annotations

import math
from pathlib import Path

import pytest
import torch
from transformers import BertConfig

from kdbench.config import ConfigError, RunConfig, TrainConfig, build_run_config
from kdbench.features import Features
from kdbench.losses import kd_kl_loss, patient_loss, pkd_loss
from kdbench.method import MethodContext
from kdbench.optimization import resolve_stage
from kdbench.plugins import METHODS
from kdbench.search_space import Choice
from kdbench.students import resolve_teacher_layers
from kdbench.task import HeadType, TaskSpec

LN2 = math.log(2.0)
# KL(p_t ‖ p_s) for p_t = (3/4, 1/4), p_s = (1/2, 1/2): written out by hand.
KL0 = 0.75 * math.log(0.75 / 0.5) + 0.25 * math.log(0.25 / 0.5)

SST2 = TaskSpec("sst2", HeadType.CLASSIFICATION, "acc", ("negative", "positive"))


def two_rows(temperature: float) -> tuple[torch.Tensor, torch.Tensor]:
    """Student logits 0 (p_s = ½, ½); teacher row 0 gives p_t = (¾, ¼) at ``temperature``, row 1 = student."""
    student = torch.zeros(2, 2)
    teacher = torch.tensor([[temperature * math.log(3.0), 0.0], [0.0, 0.0]])
    return student, teacher


# ------------------------------------------------------------------------------------------- losses


@pytest.mark.parametrize("temperature", [1.0, 2.0, 10.0])
def test_kl_mean_is_batch_times_classes_and_batchmean_is_rows_both_times_t_squared(temperature: float) -> None:
    student, teacher = two_rows(temperature)
    total = KL0 + 0.0  # row 1 contributes nothing
    t2 = temperature**2
    assert kd_kl_loss(student, teacher, temperature, "batchmean").item() == pytest.approx(t2 * total / 2, rel=1e-5)
    assert kd_kl_loss(student, teacher, temperature, "mean").item() == pytest.approx(t2 * total / 4, rel=1e-5)
    assert kd_kl_loss(student, teacher, temperature, "sum").item() == pytest.approx(t2 * total, rel=1e-5)


def test_kl_mean_matches_torch_kldivloss_mean_times_t_squared() -> None:
    """The official PKD code: ``KLDivLoss(reduction='mean')(log_softmax(s/T), softmax(t/T)) * T * T``."""
    torch.manual_seed(0)
    s, t = torch.randn(5, 3), torch.randn(5, 3)
    official = torch.nn.KLDivLoss(reduction="mean")(torch.log_softmax(s / 10, 1), torch.softmax(t / 10, 1)) * 100
    assert kd_kl_loss(s, t, 10.0, "mean").item() == pytest.approx(official.item(), rel=1e-5)


def test_patient_loss_normalised_and_raw() -> None:
    # [3, 4] -> [.6, .8] vs [0, 5] -> [0, 1]: squared differences .36 + .04; [1, 0] vs [2, 0] -> equal after norm.
    student = [torch.tensor([[3.0, 4.0], [1.0, 0.0]])]
    teacher = [torch.tensor([[0.0, 5.0], [2.0, 0.0]])]
    assert patient_loss(student, teacher, normalize=True).item() == pytest.approx((0.36 + 0.04) / 4, rel=1e-6)
    # raw: (9 + 1 + 1 + 0) / (B·K·d = 4)
    assert patient_loss(student, teacher, normalize=False).item() == pytest.approx(11 / 4, rel=1e-6)


def test_patient_loss_averages_over_layers_too() -> None:
    a = torch.tensor([[1.0, 0.0]])
    b = torch.tensor([[0.0, 1.0]])
    # layer 1 identical (0), layer 2 orthogonal unit vectors: (1 + 1) / (B·K·d = 1·2·2)
    assert patient_loss([a, a], [a, b]).item() == pytest.approx(0.5)


def test_pkd_loss_terms_by_hand() -> None:
    student, teacher = two_rows(10.0)
    labels = torch.tensor([0, 1])
    s_cls = [torch.tensor([[3.0, 4.0], [1.0, 0.0]])]
    t_cls = [torch.tensor([[0.0, 5.0], [2.0, 0.0]])]
    terms = pkd_loss(student, teacher, labels, s_cls, t_cls, alpha=0.7, beta=500.0, temperature=10.0)
    assert set(terms) == {"ce", "kd", "pt"}
    assert terms["ce"].item() == pytest.approx(0.3 * LN2, rel=1e-6)  # CE of uniform logits = ln 2
    assert terms["kd"].item() == pytest.approx(0.7 * 100 * KL0 / 4, rel=1e-5)  # mean over B×C = 4, × T²
    assert terms["pt"].item() == pytest.approx(500 * 0.1, rel=1e-5)


def test_pkd_loss_without_intermediate_layers_has_zero_patience() -> None:
    student, teacher = two_rows(10.0)
    terms = pkd_loss(student, teacher, torch.tensor([0, 1]), [], [])
    assert terms["pt"].item() == 0.0


# ------------------------------------------------------------------------------------------- layers

PKD_LAYERS = {  # (N, M): (skip, last), 1-based teacher layers for student layers 1..M-1
    (12, 6): ([2, 4, 6, 8, 10], [7, 8, 9, 10, 11]),
    (12, 4): ([3, 6, 9], [9, 10, 11]),
    (12, 3): ([4, 8], [10, 11]),
    (24, 6): ([4, 8, 12, 16, 20], [19, 20, 21, 22, 23]),
    (6, 3): ([2, 4], [4, 5]),
    (6, 4): ([2, 3, 5], [3, 4, 5]),  # round(j·6/4) with halves up: 1.5 -> 2, 3, 4.5 -> 5
    (6, 2): ([3], [5]),
    (6, 6): ([1, 2, 3, 4, 5], [1, 2, 3, 4, 5]),
    (6, 1): ([], []),
}


@pytest.mark.parametrize(("n_teacher", "n_student"), sorted(PKD_LAYERS))
def test_method_teacher_layers_skip_and_last(n_teacher: int, n_student: int) -> None:
    skip, last = PKD_LAYERS[(n_teacher, n_student)]
    pkd = METHODS.get("pkd")
    assert pkd.from_overrides({"strategy": "skip"}).teacher_layers(n_teacher, n_student) == skip
    assert pkd.from_overrides({"strategy": "last"}).teacher_layers(n_teacher, n_student) == last


def test_explicit_teacher_layers_override_and_are_checked() -> None:
    pkd = METHODS.get("pkd")
    assert pkd.from_overrides({"teacher_layers": "[1, 5]"}).teacher_layers(6, 3) == [1, 5]
    with pytest.raises(ConfigError, match="one teacher layer per student layer 1..2"):
        pkd.from_overrides({"teacher_layers": "[1]"}).teacher_layers(6, 3)
    with pytest.raises(ConfigError, match=r"\[7\] outside the teacher's layers 1..6"):
        pkd.from_overrides({"teacher_layers": "[1, 7]"}).teacher_layers(6, 3)


@pytest.mark.parametrize(("n_teacher", "n_student", "expected"), [(12, 6, [0, 1, 2, 3, 4, 5]), (6, 3, [0, 1, 2])])
def test_default_init_is_the_teachers_bottom_layers(n_teacher: int, n_student: int, expected: list[int]) -> None:
    pkd = METHODS.get("pkd")
    assert pkd.default_student_init == "teacher"
    assert resolve_teacher_layers(pkd.default_student_layers, n_teacher, n_student) == expected


# ------------------------------------------------------------------------------------------- params


def test_defaults_are_the_official_preset_and_grid_is_the_papers() -> None:
    pkd = METHODS.get("pkd")()
    assert (pkd.params.alpha, pkd.params.beta, pkd.params.temperature, pkd.params.normalize) == (0.7, 500.0, 10.0, True)
    assert pkd.params.strategy == "official"
    # run_student_patience.py: --fc_layer_idx 1,3,5,7,9 (12 -> 6) and 9,10 (12 -> 3), 0-based
    assert pkd.teacher_layers(12, 6) == [2, 4, 6, 8, 10] and pkd.teacher_layers(12, 3) == [10, 11]
    assert pkd.teacher_layers(6, 3) == [2, 4]  # no official run: the skip rule
    resolved = resolve_stage(pkd.stages(context(12, 3))[0], TrainConfig())
    assert (resolved.lr, resolved.epochs) == (1e-5, 4.0) and resolved.sources["lr"] == "method"
    space = pkd.search_space()
    assert space == {"temperature": Choice((5.0, 10.0, 20.0)), "alpha": Choice((0.2, 0.5, 0.7)),
                     "beta": Choice((10.0, 100.0, 500.0, 1000.0)), "lr": Choice((1e-5, 2e-5, 5e-5))}


@pytest.mark.parametrize(("key", "value", "message"), [
    ("strategy", "middle", "strategy: must be one of official, skip, last, got 'middle'"),
    ("alpha", "1.5", "alpha: must be in \\[0, 1\\], got 1.5"),
    ("beta", "-1", "beta"),
    ("temperature", "0", "temperature"),
    ("gamma", "1", "unknown key"),
])
def test_bad_parameters_name_the_value(key: str, value: str, message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        METHODS.get("pkd").from_overrides({key: value})


def context(n_teacher: int, n_student: int, *, task: TaskSpec = SST2, student_width: int = 8) -> MethodContext:
    def cfg(layers: int, width: int) -> BertConfig:
        return BertConfig(num_hidden_layers=layers, hidden_size=width, num_attention_heads=2, intermediate_size=16)

    return MethodContext(task=task, student_config=cfg(n_student, student_width), teacher_config=cfg(n_teacher, 8),
                         run=RunConfig(method="pkd", task=task.name, student="s", teacher="t"))


def test_validate_rejects_widths_spans_and_deep_students() -> None:
    pkd = METHODS.get("pkd")()
    pkd.validate(context(6, 3))
    with pytest.raises(ConfigError, match="student hidden_size 4 != teacher 8"):
        pkd.validate(context(6, 3, student_width=4))
    METHODS.get("pkd").from_overrides({"beta": 0}).validate(context(6, 3, student_width=4))  # no PT: widths free
    with pytest.raises(ConfigError, match="head span"):  # the declared heads, checked at planning
        pkd.check_head(TaskSpec("squad", HeadType.SPAN, "f1"))
    with pytest.raises(ConfigError, match="student has 4 layers, more than the teacher's 3"):
        pkd.validate(context(3, 4))


# ------------------------------------------------------------------------------------------- stage


def features_with_cls(cls_rows: list[torch.Tensor], logits: torch.Tensor) -> Features:
    """Features whose hidden state ``i`` has [CLS] vector ``cls_rows[i]`` (B=2, L=2, d)."""
    hidden = tuple(torch.stack([row, torch.full_like(row, 9.0)], dim=1) for row in cls_rows)
    return Features(logits=logits, hidden_states=hidden)


def test_stage_matches_student_layers_to_the_selected_teacher_layers() -> None:
    """A 3-layer student whose layers 1, 2 carry exactly the [CLS] of teacher layers 2, 4 (skip, 6 -> 3):
    PKD-Skip sees no patience gap, PKD-Last (teacher layers 4, 5) does."""
    torch.manual_seed(0)
    teacher_cls = [torch.randn(2, 8) for _ in range(7)]  # embedding + 6 layers
    student_cls = [torch.randn(2, 8), teacher_cls[2], teacher_cls[4], torch.randn(2, 8)]
    logits = torch.zeros(2, 2)
    batch = {"labels": torch.tensor([0, 1])}
    teacher = features_with_cls(teacher_cls, logits)
    student = features_with_cls(student_cls, logits)
    skip_terms = METHODS.get("pkd")().stages(context(6, 3))[0].loss(batch, student, teacher)
    assert skip_terms["pt"].item() == pytest.approx(0.0, abs=1e-7)
    assert skip_terms["kd"].item() == pytest.approx(0.0, abs=1e-7)
    last = METHODS.get("pkd").from_overrides({"strategy": "last"})
    last_terms = last.stages(context(6, 3))[0].loss(batch, student, teacher)
    expected = 500 * patient_loss([teacher_cls[2], teacher_cls[4]], [teacher_cls[4], teacher_cls[5]])
    assert last_terms["pt"].item() == pytest.approx(expected.item(), rel=1e-5)


def test_stage_requests_hidden_states_of_both_models() -> None:
    (stage,) = METHODS.get("pkd")().stages(context(6, 3))
    assert stage.student_features.hidden_states and stage.teacher_features.hidden_states
    assert stage.uses_teacher


def test_regression_uses_mse_to_gold_and_teacher() -> None:
    stsb = TaskSpec("stsb", HeadType.REGRESSION, "spearman")
    (stage,) = METHODS.get("pkd").from_overrides({"alpha": 0.5, "beta": 0}).stages(context(6, 2, task=stsb))
    cls = [torch.zeros(2, 8)] * 7
    student = features_with_cls(cls[:3], torch.tensor([[1.0], [2.0]]))
    teacher = features_with_cls(cls, torch.tensor([[2.0], [2.0]]))
    terms = stage.loss({"labels": torch.tensor([1.0, 4.0])}, student, teacher)
    assert terms["task"].item() == pytest.approx(0.5 * (0 + 4) / 2)
    assert terms["kd"].item() == pytest.approx(0.5 * (1 + 0) / 2)


# ------------------------------------------------------------------------------------------- end to end


def tiny_teacher(folder: Path, minilm_path: Path) -> Path:
    from transformers import AutoTokenizer, BertForSequenceClassification

    torch.manual_seed(0)
    config = BertConfig(vocab_size=30522, hidden_size=32, num_hidden_layers=4, num_attention_heads=4,
                        intermediate_size=37, max_position_embeddings=64, num_labels=2,
                        id2label={0: "negative", 1: "positive"}, label2id={"negative": 0, "positive": 1})
    BertForSequenceClassification(config).save_pretrained(folder)
    AutoTokenizer.from_pretrained(minilm_path).save_pretrained(folder)
    return folder


def test_pkd_runs_end_to_end_on_sst2(tmp_path: Path, shared_data: Path, minilm_path: Path) -> None:
    from transformers import TrainerCallback

    from kdbench.engine import run_experiment
    from kdbench.records import read_record

    class Recorder(TrainerCallback):
        def __init__(self) -> None:
            self.logs: list[dict] = []

        def on_log(self, args, state, control, logs=None, **kwargs):
            self.logs.append(dict(logs or {}))

    teacher = tiny_teacher(tmp_path / "teacher", minilm_path)
    config = build_run_config({
        "method": "pkd", "task": "sst2", "teacher": str(teacher), "student": "teacher-2l",
        "output": str(tmp_path / "runs"), "data_dir": str(shared_data), "strategy": "last",
        "max_train_samples": 32, "max_eval_samples": 32, "epochs": 1, "batch_size": 16, "max_seq_length": 32,
        "logging_steps": 1, "precision": "fp32",
    })
    recorder = Recorder()
    run_dir = run_experiment(config, callbacks=[recorder])
    record = read_record(run_dir / "result.json")
    assert record["status"] == "completed"
    assert record["config"]["method_params"]["strategy"] == "last"
    assert 0.0 <= record["metrics"]["acc"] <= 100.0
    terms = [log for log in recorder.logs if "loss/pt" in log]
    assert terms and all(math.isfinite(log["loss/pt"]) and log["loss/pt"] > 0 for log in terms)
    assert (run_dir / "model" / "config.json").is_file()
