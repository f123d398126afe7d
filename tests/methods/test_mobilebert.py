"""The mobilebert method plug-in: progressive transfer schedules, teacher copy, capture of the
MobileBERT bottleneck, presets against Table 1, and bad configurations. Tiny models from configs."""

from __future__ import annotations

import csv
from pathlib import Path

import pytest
import torch
from transformers import BertConfig, BertModel, MobileBertConfig, MobileBertForSequenceClassification, MobileBertModel

from kdbench.capture import FeatureCapture
from kdbench.config import ConfigError, RunConfig
from kdbench.features import FeatureRequest
from kdbench.method import MethodContext
from kdbench.methods.mobilebert import MobileBertParams, MobileBertTransfer, copy_from_teacher
from kdbench.plugins import METHODS, STUDENTS
from kdbench.task import HeadType, TaskSpec

VOCAB, POSITIONS = 60, 16
SST2_LIKE = TaskSpec("sst2", HeadType.CLASSIFICATION, "acc", ("negative", "positive"))
REPO = Path(__file__).resolve().parents[2]



def tiny_teacher(layers: int = 3, heads: int = 4) -> BertModel:
    torch.manual_seed(0)
    config = BertConfig(vocab_size=VOCAB, hidden_size=32, num_hidden_layers=layers, num_attention_heads=heads,
                        intermediate_size=37, max_position_embeddings=POSITIONS, hidden_dropout_prob=0.0,
                        attention_probs_dropout_prob=0.0)
    return BertModel(config).eval()


def tiny_student_config(layers: int = 3, hidden: int = 32, norm: str = "layer_norm", **extra) -> MobileBertConfig:
    values = dict(vocab_size=VOCAB, hidden_size=hidden, embedding_size=hidden, trigram_input=False,
                  intra_bottleneck_size=16, true_hidden_size=16, num_attention_heads=4, intermediate_size=32,
                  num_feedforward_networks=2, num_hidden_layers=layers, normalization_type=norm, hidden_act="gelu",
                  max_position_embeddings=POSITIONS, hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0)
    values.update(extra)
    return MobileBertConfig(**values)


def context_for(student, teacher) -> MethodContext:
    return MethodContext(task=SST2_LIKE, student_config=student.config, teacher_config=teacher.config,
                         run=RunConfig(method="mobilebert", task="sst2", student="x"))


def padded_batch() -> dict[str, torch.Tensor]:
    generator = torch.Generator().manual_seed(1)
    input_ids = torch.randint(5, VOCAB, (6, 10), generator=generator)
    attention_mask = torch.ones_like(input_ids)
    attention_mask[1, 6:] = 0
    attention_mask[3, 4:] = 0
    input_ids = input_ids.masked_fill(attention_mask == 0, 0)
    return {"input_ids": input_ids, "attention_mask": attention_mask}


def _named(student):
    return {name: p.detach().clone() for name, p in student.named_parameters()}


def run_stage(stage, student, teacher, extras, steps: int, lr: float):
    groups = stage.param_groups(student, extras)
    optimizer = torch.optim.AdamW([{"params": list(g.params), "lr": lr * g.lr_scale} for g in groups],
                                  lr=lr, weight_decay=0.0)
    batch = padded_batch()
    history: dict[str, list[float]] = {}
    with FeatureCapture(student, stage.student_features) as s_cap, FeatureCapture(teacher, stage.teacher_features) as t_cap:
        for _ in range(steps):
            s_features = s_cap.collect(student(**batch))
            with torch.no_grad():
                t_features = t_cap.collect(teacher(**batch))
            terms = stage.compute(batch, s_features, t_features, extras)
            for name, value in terms.items():
                history.setdefault(name, []).append(value.item())
            sum(terms.values()).backward()
            optimizer.step()
            optimizer.zero_grad(set_to_none=True)
    return groups, history


def build(schedule: str):
    teacher = tiny_teacher()
    torch.manual_seed(1)
    student = MobileBertModel(tiny_student_config())
    context = context_for(student, teacher)
    method = MobileBertTransfer(MobileBertParams(strategy="progressive", use_pd=False, progressive_schedule=schedule))
    method.validate(context)
    method.initialize_student(student, teacher, context)
    extras = method.extra_modules(context)
    return teacher, student, method, extras, method.stages(context)


# ------------------------------------------------------------------------------- progressive
def test_progressive_declares_one_stage_per_layer_then_the_final_objective():
    teacher = tiny_teacher()
    student = MobileBertModel(tiny_student_config())
    method = MobileBertTransfer(MobileBertParams(strategy="progressive", kt_epochs=3.0, final_epochs=2.0))
    stages = method.stages(context_for(student, teacher))
    assert [s.name for s in stages] == ["kt-L1", "kt-L2", "kt-L3", "task"]
    assert [s.epochs for s in stages] == [1.0, 1.0, 1.0, 2.0]  # total transfer epochs split over the layers
    assert not any(s.select_best for s in stages[:3]) and stages[3].select_best


@pytest.mark.parametrize("schedule", ["paper", "code"])
def test_progressive_stage_trains_its_layer_and_freezes_or_slows_the_others(schedule):
    teacher, student, _, extras, stages = build(schedule)
    lr = 3e-3
    run_stage(stages[0], student, teacher, extras, steps=2, lr=lr)  # stage 1 moves layer 1 first
    before = _named(student)
    stage = stages[1]  # kt-L2
    groups, history = run_stage(stage, student, teacher, extras, steps=1, lr=lr)
    after_one = _named(student)
    _, more = run_stage(stage, student, teacher, extras, steps=10, lr=lr)
    losses = history["fmt/L2"] + more["fmt/L2"]
    assert set(history) == {"fmt/L2", "mean/L2", "var/L2", "at/L2"}  # only layer 2's transfer loss
    assert losses[-1] < 0.7 * losses[0], losses  # layer 2's FMT falls during its stage
    assert more["at/L2"][-1] < history["at/L2"][0]
    after = _named(student)

    def delta(prefix, snapshot_a, snapshot_b):
        return max((snapshot_b[n] - snapshot_a[n]).abs().max().item() for n in snapshot_a if n.startswith(prefix))

    # the current layer moves; Adam's first step moves each parameter by lr x scale (|g| >> eps)
    current_scale = 1.0 if schedule == "paper" else 3.0
    assert delta("encoder.layer.1.", before, after_one) == pytest.approx(lr * current_scale, rel=1e-3)
    # higher layers and the pooler are frozen in both schedules
    assert delta("encoder.layer.2.", before, after) == 0.0
    assert delta("pooler.", before, after) == 0.0
    assert not any(p.requires_grad for p in student.encoder.layer[2].parameters())
    # the embeddings are frozen in both: lamb_optimizer.py gives every variable outside
    # bert/encoder/layer_* a layer-wise rate of 0
    assert delta("embeddings.", before, after) == 0.0
    assert not any(p.requires_grad for p in student.embeddings.parameters())
    if schedule == "paper":
        assert delta("encoder.layer.0.", before, after) == 0.0
        assert [g.name for g in groups] == ["current-L2"]
    else:  # official code: lower layers at 0.3x
        assert delta("encoder.layer.0.", before, after_one) == pytest.approx(lr * 0.3, rel=1e-3)
        assert {g.name: g.lr_scale for g in groups} == {"current-L2": 3.0, "lower": 0.3}


def test_final_stage_unfreezes_everything():
    teacher, student, _, extras, stages = build("paper")
    stages[0].param_groups(student, extras)
    assert not student.encoder.layer[2].attention.self.query.weight.requires_grad
    method_full = MobileBertTransfer(MobileBertParams(strategy="progressive", use_pd=True))
    final = method_full.stages(context_for(student, teacher))[-1]
    groups = final.param_groups(student, extras)
    assert all(p.requires_grad for p in student.parameters())
    assert sum(len(g.params) for g in groups) == len(list(student.parameters()))


def test_auxiliary_and_joint_stage_shapes():
    teacher = tiny_teacher()
    student = MobileBertModel(tiny_student_config())
    ctx = context_for(student, teacher)
    aux = MobileBertTransfer(MobileBertParams(strategy="auxiliary")).stages(ctx)
    joint = MobileBertTransfer(MobileBertParams(strategy="joint")).stages(ctx)
    assert [s.name for s in aux] == ["auxiliary"]
    assert [s.name for s in joint] == ["kt", "task"]
    assert MobileBertTransfer(MobileBertParams(strategy="auxiliary")).copies_teacher() is False
    assert MobileBertTransfer(MobileBertParams(strategy="joint")).copies_teacher() is True


# ------------------------------------------------------------------------- widths and depths
def test_width_mismatch_gets_per_layer_projections_and_depth_mismatch_a_uniform_map():
    teacher = tiny_teacher(layers=4)
    student = MobileBertModel(tiny_student_config(layers=2, hidden=24))
    ctx = context_for(student, teacher)
    method = MobileBertTransfer(MobileBertParams(strategy="joint", use_pd=False))
    method.validate(ctx)
    extras = method.extra_modules(ctx)
    assert sorted(extras) == ["fmt_proj_L1", "fmt_proj_L2"]
    assert extras["fmt_proj_L1"].in_features == 24 and extras["fmt_proj_L1"].out_features == 32
    hidden, attention = method.mapping(ctx)
    assert [(m.student, m.teacher) for m in hidden] == [(1, 2), (2, 4)]
    assert [(m.student, m.teacher) for m in attention] == [(0, 1), (1, 3)]
    _, history = run_stage(method.stages(ctx)[0], student, teacher, extras, steps=2, lr=1e-3)
    assert set(history) == {"fmt", "mean", "var", "at"}


def test_depth_that_does_not_divide_is_a_config_error():
    teacher = tiny_teacher(layers=3)
    student = MobileBertModel(tiny_student_config(layers=2))
    with pytest.raises(ConfigError, match="mapping"):
        MobileBertTransfer(MobileBertParams()).validate(context_for(student, teacher))


# -------------------------------------------------------------------------------- teacher copy
def test_copy_from_teacher_copies_matching_embeddings_only():
    teacher = tiny_teacher()
    student = MobileBertModel(tiny_student_config())
    outcome = copy_from_teacher(student, teacher)
    assert set(outcome["copied"]) == {"embeddings.word_embeddings.weight", "embeddings.position_embeddings.weight",
                                      "embeddings.token_type_embeddings.weight", "embeddings.LayerNorm.weight",
                                      "embeddings.LayerNorm.bias"}
    assert torch.equal(student.embeddings.word_embeddings.weight, teacher.embeddings.word_embeddings.weight)
    no_norm = MobileBertModel(tiny_student_config(norm="no_norm"))
    skipped = copy_from_teacher(no_norm, teacher)["skipped"]
    assert "embeddings.LayerNorm.weight" in skipped  # NoNorm is not a layer norm: not copied


def test_copy_yes_with_factorised_embedding_is_an_error():
    teacher = tiny_teacher()
    student = MobileBertModel(tiny_student_config(embedding_size=8, trigram_input=True))
    method = MobileBertTransfer(MobileBertParams(copy_from_teacher="yes"))
    with pytest.raises(ConfigError, match="word embeddings"):
        method.initialize_student(student, teacher, context_for(student, teacher))


# ---------------------------------------------------------------------- capture of MobileBERT
def test_capture_matches_eager_mobilebert_attention_on_a_padded_batch():
    torch.manual_seed(3)
    config = tiny_student_config(norm="no_norm", embedding_size=8, trigram_input=True)
    config._attn_implementation = "eager"
    model = MobileBertModel(config).eval()
    batch = padded_batch()
    request = FeatureRequest(hidden_states=True, attention_probs=True, attention_scores=True)
    with FeatureCapture(model, request) as capture, torch.no_grad():
        outputs = model(**batch, output_attentions=True, output_hidden_states=True)
        features = capture.collect(outputs)
    assert len(features.hidden_states) == 4 and features.hidden_states[1].shape == (6, 10, 32)  # feature map
    assert features.attention_probs[0].shape == (6, 4, 10, 10)  # 4 heads over the 16-wide bottleneck
    for mine, eager in zip(features.attention_probs, outputs.attentions):
        torch.testing.assert_close(mine, eager, atol=1e-6, rtol=1e-5)
    assert features.attention_probs[0][1, :, :, 6:].abs().max() < 1e-30  # padded keys: zero probability
    if outputs.hidden_states is not None:
        for mine, reference in zip(features.hidden_states, outputs.hidden_states):
            torch.testing.assert_close(mine, reference)


# ----------------------------------------------------------------------------------- presets
def _table1(model: str) -> dict[str, str]:
    path = REPO / "results" / "published" / "mobilebert_table1_model_settings.csv"
    with path.open() as handle:
        return {row["metric"]: row["value"] for row in csv.DictReader(handle) if row["model"] == model}


@pytest.mark.parametrize("preset, model", [("mobilebert-24l", "MobileBERT"), ("mobilebert-tiny", "MobileBERT_TINY"),
                                           ("ib-bert-large", "IB-BERT_LARGE")])
def test_presets_follow_table1(preset, model):
    row = _table1(model)
    config = STUDENTS.get(preset).build_config(None)
    assert isinstance(config, MobileBertConfig)
    assert config.num_hidden_layers == int(row["layers"])
    assert config.hidden_size == int(row["h_inter"])
    assert config.true_hidden_size == int(row["linear_in_h_output"])
    assert config.num_attention_heads == int(row["heads"])
    assert config.intermediate_size == int(row["h_FFN"])
    assert config.num_feedforward_networks == int(row["num_FFN"])
    assert config.embedding_size == int(row["h_embedding"])
    assert config.trigram_input is (row["embedding_op"] == "3-convolution")
    # the attention's value input: the 512 feature map, or the bottleneck (MobileBERT_TINY)
    assert (config.true_hidden_size if config.use_bottleneck_attention else config.hidden_size) == int(row["mha_h_input"])


def test_384_preset_matches_a_384_wide_teacher():
    teacher_config = BertConfig(hidden_size=384, num_attention_heads=12, num_hidden_layers=6, vocab_size=VOCAB)
    config = STUDENTS.get("mobilebert-6l-384").build_config(teacher_config)
    assert (config.hidden_size, config.num_attention_heads, config.true_hidden_size, config.num_feedforward_networks) == (
        384, 12, 192, 2)
    assert config.vocab_size == VOCAB  # borrowed from the teacher


# ---------------------------------------------------------------------------------- bad input
@pytest.mark.parametrize("values, message", [
    ({"strategy": "sideways"}, "strategy"), ({"fmt_form": "l1"}, "fmt_form"), ({"nsp": "true"}, "nsp"),
    ({"pd_alpha": "1.5"}, "pd_alpha"), ({"progressive_schedule": "fast"}, "progressive_schedule"),
    ({"use_fmt": "false", "use_at": "false", "use_pd": "false"}, "nothing to train"),
])
def test_bad_parameters_are_named(values, message):
    with pytest.raises(ConfigError, match=message):
        METHODS.get("mobilebert").from_overrides(values)


def test_attention_transfer_needs_equal_head_counts():
    teacher = tiny_teacher(heads=2)
    student = MobileBertModel(tiny_student_config())
    with pytest.raises(ConfigError, match="heads"):
        MobileBertTransfer(MobileBertParams()).validate(context_for(student, teacher))
    MobileBertTransfer(MobileBertParams(use_at=False)).validate(context_for(student, teacher))


def test_pd_refuses_a_teacher_without_an_mlm_head():
    teacher = tiny_teacher()
    teacher.config.architectures = ["BertModel"]
    student = MobileBertModel(tiny_student_config())
    context = MethodContext(task=TaskSpec("corpus", HeadType.MASKED_LM, "none"), student_config=student.config,
                            teacher_config=teacher.config, run=RunConfig(method="mobilebert", task="corpus", student="x"))
    with pytest.raises(ConfigError, match="masked-LM head"):
        MobileBertTransfer(MobileBertParams()).validate(context)


# ------------------------------------------------------------- fine-tuning a MobileBERT checkpoint
def test_a_hub_mobilebert_loads_for_fine_tuning(tmp_path, monkeypatch):
    """`--student google/mobilebert-uncased`: the Hub id is accepted and loaded with the task head
    (the Hub loader is redirected to a small MobileBERT saved from a config)."""
    from transformers import AutoModelForSequenceClassification

    from kdbench import engine

    MobileBertForSequenceClassification(tiny_student_config(norm="no_norm")).save_pretrained(tmp_path)
    original = AutoModelForSequenceClassification.from_pretrained.__func__
    seen = []

    def from_hub(cls, name, *args, **kwargs):
        seen.append(name)
        return original(cls, str(tmp_path) if name == "google/mobilebert-uncased" else name, *args, **kwargs)

    monkeypatch.setattr(AutoModelForSequenceClassification, "from_pretrained", classmethod(from_hub))
    plan = engine.plan_run(RunConfig(method="finetune", task="sst2", student="google/mobilebert-uncased"))
    assert plan.preset is None
    model = engine.load_model("google/mobilebert-uncased", HeadType.CLASSIFICATION, SST2_LIKE,
                              trust_remote_code=False, role="student")
    assert seen == ["google/mobilebert-uncased"]
    assert isinstance(model, MobileBertForSequenceClassification)
    assert model.config.id2label == {0: "negative", 1: "positive"}


# ------------------------------------------------------------------------ through the engine
def test_progressive_run_with_pd_through_the_engine_logs_stages_and_layer_rates(tmp_path, minilm_path):
    """A tiny MLM teacher and MobileBERT student on a 24-line corpus: progressive stages kt-L1, kt-L2
    and pd run in order, each stage's log names it, and the per-group learning rates are logged."""
    import json

    from transformers import AutoTokenizer, BertForMaskedLM, MobileBertForMaskedLM

    from kdbench.config import build_run_config
    from kdbench.engine import run_experiment

    tokenizer = AutoTokenizer.from_pretrained(minilm_path)
    vocab = len(tokenizer)
    torch.manual_seed(0)
    teacher = BertForMaskedLM(BertConfig(vocab_size=vocab, hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
                                         intermediate_size=37, max_position_embeddings=64))
    teacher.save_pretrained(tmp_path / "teacher")
    tokenizer.save_pretrained(tmp_path / "teacher")
    student = MobileBertForMaskedLM(tiny_student_config(layers=2, vocab_size=vocab, max_position_embeddings=64))
    student.save_pretrained(tmp_path / "student")
    corpus = tmp_path / "corpus.txt"
    corpus.write_text("\n".join(f"the film number {i} was {'good' if i % 2 else 'dull'} and long" for i in range(24)))
    config = build_run_config({
        "method": "mobilebert", "task": "corpus", "teacher": str(tmp_path / "teacher"),
        "student": str(tmp_path / "student"), "output": str(tmp_path / "runs"), "corpus": str(corpus),
        "batch_size": 8, "epochs": 1, "max_seq_length": 16, "logging_steps": 1, "lr": 1e-3,
        "strategy": "progressive", "kt_epochs": 2, "final_epochs": 1, "seed": 3,
        "checkpoint_minutes": 1e-9})  # stages that select no best model checkpoint on the clock: every step here
    run_dir = run_experiment(config)
    record = json.loads((run_dir / "result.json").read_text())
    assert record["status"] == "completed"
    assert [stage["name"] for stage in record["stages"]] == ["kt-L1", "kt-L2", "pd"]
    # result.json records each stage's resolved optimisation: LAMB as the released command, the
    # run's explicit lr, the stage's own epochs (kt_epochs split over the layers, final_epochs)
    kt, pd = record["stages"][1]["optimization"], record["stages"][2]["optimization"]
    assert (kt["optimizer"], kt["schedule"], kt["eps"], kt["weight_decay"]) == ("lamb", "mobilebert-phase", 1e-6, 0.01)
    assert (kt["lr"], kt["sources"]["lr"], kt["epochs"], kt["sources"]["epochs"]) == (1e-3, "run", 1.0, "stage")
    assert (pd["optimizer"], pd["schedule"], pd["sources"]["schedule"]) == ("lamb", "linear", "method")

    def logs(index: int, name: str) -> list[dict]:
        states = sorted((run_dir / "stages" / f"{index}-{name}").glob("checkpoint-*/trainer_state.json"))
        return [entry for entry in json.loads(states[-1].read_text())["log_history"] if "loss" in entry]

    second = logs(1, "kt-L2")
    assert {entry["stage"] for entry in second} == {"kt-L2"}
    assert {"loss/fmt/L2", "loss/at/L2", "lr/current-L2", "lr/lower"} <= set(second[0])
    moving = [entry for entry in second if entry["lr/lower"] > 0]
    assert moving and all(e["lr/current-L2"] == pytest.approx(10 * e["lr/lower"]) for e in moving)  # 3x vs 0.3x
    final = logs(2, "pd")
    assert {"loss/pd"} <= set(final[0]) and "loss/fmt/L2" not in final[0]
