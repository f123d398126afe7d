"""DistilBERT: losses pinned on hand-computed values, masking, initialisation, the two methods' stages,
and general (pre-training) distillation end to end with a small masked-LM teacher."""

from __future__ import annotations

import math
from pathlib import Path

import pytest
import torch
from transformers import BertConfig

from kdbench.config import ConfigError, build_run_config
from kdbench.features import Features
from kdbench.layer_maps import distilbert_init_layers
from kdbench.losses import (
    cosine_embedding_loss,
    distilbert_mlm_distillation_loss,
    distilbert_span_loss,
    distilbert_task_loss,
    kd_kl_loss,
)
from kdbench.method import MethodContext
from kdbench.methods.distilbert import MlmMasker, count_tokens, token_probabilities
from kdbench.plugins import METHODS
from kdbench.students import resolve_teacher_layers
from kdbench.task import HeadType, TaskSpec

LN2 = math.log(2.0)
LN3 = math.log(3.0)
KL0 = 0.75 * math.log(0.75 / 0.5) + 0.25 * math.log(0.25 / 0.5)  # KL((¾, ¼) ‖ (½, ½)) by hand
SQRT_HALF = math.sqrt(0.5)

SST2 = TaskSpec("sst2", HeadType.CLASSIFICATION, "acc", ("negative", "positive"))
CORPUS = TaskSpec("corpus", HeadType.MASKED_LM, "none")


# ------------------------------------------------------------------------------------------- losses


def test_cosine_embedding_loss_over_real_tokens_only() -> None:
    s = torch.tensor([[[1.0, 0.0], [0.0, 2.0], [5.0, 5.0]]])
    t = torch.tensor([[[1.0, 1.0], [0.0, -1.0], [1.0, -1.0]]])
    mask = torch.tensor([[1, 1, 0]])
    # token 1: cos = 1/√2, token 2: cos = -1, token 3 (padding, cos 0) excluded
    expected = ((1 - SQRT_HALF) + 2.0) / 2
    assert cosine_embedding_loss(s, t, mask).item() == pytest.approx(expected, rel=1e-6)
    assert cosine_embedding_loss(s, t).item() == pytest.approx((expected * 2 + 1.0) / 3, rel=1e-6)
    official = torch.nn.CosineEmbeddingLoss(reduction="mean")(s[0, :2], t[0, :2], torch.ones(2))
    assert cosine_embedding_loss(s, t, mask).item() == pytest.approx(official.item(), rel=1e-6)


def mlm_example() -> dict[str, torch.Tensor]:
    """B=1, L=3, V=2, T=2; token 0 teacher p=(¾, ¼), token 1 teacher = student, token 2 is padding."""
    return {
        "student_logits": torch.zeros(1, 3, 2),
        "teacher_logits": torch.tensor([[[2 * LN3, 0.0], [0.0, 0.0], [10.0, -10.0]]]),
        "mlm_labels": torch.tensor([[1, -100, -100]]),
        "student_last_hidden": torch.tensor([[[1.0, 0.0], [0.0, 2.0], [5.0, 5.0]]]),
        "teacher_last_hidden": torch.tensor([[[1.0, 1.0], [0.0, -1.0], [1.0, -1.0]]]),
        "attention_mask": torch.tensor([[1, 1, 0]]),
    }


def test_mlm_distillation_terms_by_hand() -> None:
    terms = distilbert_mlm_distillation_loss(**mlm_example())
    # ce: α_ce 5 · T² 4 · (KL0 + 0) / 2 real tokens (batchmean over non-padding tokens; padding excluded)
    assert terms["ce"].item() == pytest.approx(5 * 4 * KL0 / 2, rel=1e-5)
    assert terms["mlm"].item() == pytest.approx(2 * LN2, rel=1e-6)  # α_mlm 2 · CE of uniform logits
    assert terms["cos"].item() == pytest.approx(((1 - SQRT_HALF) + 2.0) / 2, rel=1e-6)


def test_mlm_distillation_zero_weight_term_is_left_out() -> None:
    """Table 4's ablations: a term weighted 0 is not in the loss; the others keep their values."""
    full = distilbert_mlm_distillation_loss(**mlm_example())
    for dropped in ("ce", "mlm", "cos"):
        terms = distilbert_mlm_distillation_loss(**mlm_example(), **{f"alpha_{dropped}": 0.0})
        assert set(terms) == {"ce", "mlm", "cos"} - {dropped}
        for name, value in terms.items():
            assert value.item() == pytest.approx(full[name].item(), rel=1e-6)


def test_mlm_distillation_ce_restricted_to_masked_tokens() -> None:
    terms = distilbert_mlm_distillation_loss(**mlm_example(), restrict_ce_to_mask=True)
    assert terms["ce"].item() == pytest.approx(5 * 4 * KL0 / 1, rel=1e-5)  # only token 0 is masked


def test_mlm_distillation_matches_the_official_masked_select_form() -> None:
    """distiller.py: masked_select over the attention mask, KLDivLoss(batchmean) · T²."""
    torch.manual_seed(0)
    s, t = torch.randn(2, 4, 7), torch.randn(2, 4, 7)
    attention = torch.tensor([[1, 1, 1, 0], [1, 1, 0, 0]])
    mask = attention.unsqueeze(-1).expand_as(s).bool()
    s_sel, t_sel = torch.masked_select(s, mask).view(-1, 7), torch.masked_select(t, mask).view(-1, 7)
    official = torch.nn.KLDivLoss(reduction="batchmean")(torch.log_softmax(s_sel / 2, -1), torch.softmax(t_sel / 2, -1)) * 4
    ours = kd_kl_loss(s, t, 2.0, reduction="batchmean", mask=attention)
    assert ours.item() == pytest.approx(official.item(), rel=1e-5)


def test_task_loss_is_batchmean_times_t_squared() -> None:
    student = torch.zeros(2, 2)
    teacher = torch.tensor([[2 * LN3, 0.0], [0.0, 0.0]])  # T = 2: row 0 -> (¾, ¼), row 1 -> (½, ½)
    terms = distilbert_task_loss(student, teacher, torch.tensor([0, 1]))
    assert terms["kd"].item() == pytest.approx(0.5 * 4 * KL0 / 2, rel=1e-5)  # batchmean: / 2 rows (not 4)
    assert terms["ce"].item() == pytest.approx(0.5 * LN2, rel=1e-6)


def test_span_loss_averages_start_and_end() -> None:
    zeros = torch.zeros(1, 2)
    teacher_start = torch.tensor([[2 * LN3, 0.0]])
    terms = distilbert_span_loss(zeros, zeros, teacher_start, zeros, torch.tensor([0]), torch.tensor([1]))
    assert terms["kd"].item() == pytest.approx(0.5 * (4 * KL0 + 0.0) / 2, rel=1e-5)
    assert terms["ce"].item() == pytest.approx(0.5 * (LN2 + LN2) / 2, rel=1e-6)
    # an answer outside the window (position 5 >= L) is clamped to L and ignored: start CE counts 0
    out = distilbert_span_loss(zeros, zeros, teacher_start, zeros, torch.tensor([5]), torch.tensor([1]))
    assert out["ce"].item() == pytest.approx(0.5 * (0.0 + LN2) / 2, rel=1e-6)


# ------------------------------------------------------------------------------------------- masking


def test_token_probabilities_smooth_counts_and_zero_special_tokens() -> None:
    probs = token_probabilities([5, 0, 1, 8, 27], special_ids=[0], smoothing=0.7)
    expected = [0.0, 1.0, 1.0, 8**-0.7, 27**-0.7]  # max(count, 1) ** -0.7
    assert probs.tolist() == pytest.approx(expected, rel=1e-6)
    assert token_probabilities([4, 9], [], smoothing=0.0).tolist() == [1.0, 1.0]


def test_count_tokens_counts_training_tokens_with_truncation(minilm_path: Path) -> None:
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(minilm_path)
    the = tok.convert_tokens_to_ids("the")
    counts = count_tokens(["the cat", "the dog the"], tok, tok.vocab_size)
    assert counts[the] == 3 and counts[tok.cls_token_id] == 2 and counts[tok.sep_token_id] == 2
    assert counts.sum() == 9
    truncated = count_tokens(["the cat", "the dog the"], tok, tok.vocab_size, max_length=3)
    assert truncated[the] == 2 and truncated.sum() == 6  # [CLS] the [SEP] twice


def masker(vocab: int = 1000, **kwargs) -> MlmMasker:
    probs = torch.ones(vocab)
    probs[:3] = 0.0  # 0 = [PAD], 1 = [CLS], 2 = [MASK]: special, never chosen
    return MlmMasker(probs, mask_token_id=2, vocab_size=vocab, **kwargs)


def test_masker_chooses_ceil_15_percent_of_real_tokens_never_special_or_padding() -> None:
    torch.manual_seed(0)
    ids = torch.randint(3, 1000, (4, 10))
    ids[:, 0] = 1
    attention = torch.ones_like(ids)
    attention[0, 6:] = 0
    attention[3, 2:] = 0
    ids[attention == 0] = 0
    before = ids.clone()
    out = masker()({"input_ids": ids, "attention_mask": attention})
    chosen = out["labels"] != -100
    assert int(chosen.sum()) == math.ceil(0.15 * int(attention.sum()))  # 0.15 · 28 -> 5
    assert not chosen[attention == 0].any() and not chosen[:, 0].any()
    assert torch.equal(out["labels"][chosen], before[chosen])
    assert torch.equal(out["input_ids"][~chosen], before[~chosen])
    assert torch.equal(ids, before)  # inputs untouched


def test_masker_80_10_10() -> None:
    torch.manual_seed(1)
    ids = torch.randint(3, 1000, (200, 50))
    out = masker()({"input_ids": ids, "attention_mask": torch.ones_like(ids)})
    chosen = out["labels"] != -100
    assert int(chosen.sum()) == 1500
    new, old = out["input_ids"][chosen], ids[chosen]
    masked = (new == 2).float().mean().item()
    kept = (new == old).float().mean().item()
    assert masked == pytest.approx(0.8, abs=0.04)
    assert kept == pytest.approx(0.1 + 0.1 / 1000, abs=0.03)
    assert 1 - masked - kept == pytest.approx(0.1, abs=0.03)


def test_masker_prefers_rare_tokens_by_frequency_smoothing() -> None:
    """Tokens 5 (count 1) and 6 (count 8^(1/0.7), weight 1/8): rare ones are masked far more often."""
    counts = torch.zeros(10, dtype=torch.float64)
    counts[5], counts[6] = 1.0, 8 ** (1 / 0.7)
    ids = torch.tensor([[5, 6] * 50] * 40)
    batch = {"input_ids": ids, "attention_mask": torch.ones_like(ids)}
    torch.manual_seed(2)
    smoothed = MlmMasker(token_probabilities(counts.numpy(), [0, 1, 2]), 2, 10)(batch)["labels"]
    rare, frequent = int((smoothed == 5).sum()), int((smoothed == 6).sum())
    assert rare + frequent == 600 and rare > 4 * frequent
    torch.manual_seed(2)
    uniform = MlmMasker(token_probabilities(counts.numpy(), [0, 1, 2], smoothing=0.0), 2, 10)(batch)["labels"]
    assert abs(int((uniform == 5).sum()) - int((uniform == 6).sum())) < 100


# ------------------------------------------------------------------------------------------- init & params


@pytest.mark.parametrize(("n_teacher", "n_student", "expected"), [
    (12, 6, [0, 2, 4, 7, 9, 11]),  # DistilBERT's extract_distilbert.py
    (12, 4, [0, 4, 7, 11]),  # round(i·11/3): 0, 3.67, 7.33, 11
    (12, 3, [0, 6, 11]),  # 5.5 rounds up
    (6, 3, [0, 3, 5]),  # 2.5 rounds up
    (6, 2, [0, 5]),
    (24, 6, [0, 5, 9, 14, 18, 23]),  # 4.6, 9.2, 13.8, 18.4
    (6, 1, [0]),
])
def test_distilbert_init_layers_rule(n_teacher: int, n_student: int, expected: list[int]) -> None:
    assert distilbert_init_layers(n_teacher, n_student) == expected
    for name in ("distilbert", "distilbert-pretrain"):
        method = METHODS.get(name)
        assert method.default_student_init == "teacher"
        assert resolve_teacher_layers(method.default_student_layers, n_teacher, n_student) == expected


def test_defaults() -> None:
    pre = METHODS.get("distilbert-pretrain")().params
    assert (pre.alpha_ce, pre.alpha_mlm, pre.alpha_cos, pre.temperature) == (5.0, 2.0, 1.0, 2.0)
    assert (pre.mlm_mask_prop, pre.word_mask, pre.word_keep, pre.word_rand, pre.mlm_smoothing) == (0.15, 0.8, 0.1, 0.1, 0.7)
    assert not pre.restrict_ce_to_mask and pre.freeze_position_embeddings
    task = METHODS.get("distilbert")().params
    assert (task.alpha_ce, task.alpha_task, task.temperature) == (0.5, 0.5, 2.0)


@pytest.mark.parametrize(("name", "key", "value", "message"), [
    ("distilbert-pretrain", "word_mask", "0.5", "must sum to 1"),
    ("distilbert-pretrain", "mlm_mask_prop", "0", "mlm_mask_prop: must be in \\(0, 1\\], got 0.0"),
    ("distilbert-pretrain", "temperature", "-2", "temperature"),
    ("distilbert", "alpha_ce", "-1", "alpha_ce"),
    ("distilbert", "alpha_mlm", "1", "unknown key"),
])
def test_bad_parameters_name_the_value(name: str, key: str, value: str, message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        METHODS.get(name).from_overrides({key: value})


def context(task: TaskSpec, method: str, *, student_width: int = 8, corpus: str | None = None) -> MethodContext:
    def cfg(layers: int, width: int) -> BertConfig:
        return BertConfig(vocab_size=50, num_hidden_layers=layers, hidden_size=width, num_attention_heads=2,
                          intermediate_size=16)

    run = build_run_config({"method": method, "task": task.name, "student": "s", "teacher": "t", "corpus": corpus})
    return MethodContext(task=task, student_config=cfg(2, student_width), teacher_config=cfg(4, 8), run=run)


def test_each_method_refuses_the_other_phase() -> None:
    # Checked at planning, from the declared heads, before any model loads.
    with pytest.raises(ConfigError, match="use method 'distilbert-pretrain'"):
        METHODS.get("distilbert")().check_head(CORPUS)
    with pytest.raises(ConfigError, match="use method 'distilbert'"):
        METHODS.get("distilbert-pretrain")().check_head(SST2)
    with pytest.raises(ConfigError, match="needs a text corpus"):
        METHODS.get("distilbert-pretrain")().validate(context(CORPUS, "distilbert-pretrain"))
    with pytest.raises(ConfigError, match="student hidden_size 4 != teacher 8"):
        METHODS.get("distilbert-pretrain")().validate(context(CORPUS, "distilbert-pretrain", student_width=4,
                                                              corpus="c.txt"))


def test_task_stage_on_classification_logits() -> None:
    (stage,) = METHODS.get("distilbert")().stages(context(SST2, "distilbert"))
    student = Features(logits=torch.zeros(2, 2))
    teacher = Features(logits=torch.tensor([[2 * LN3, 0.0], [0.0, 0.0]]))
    terms = stage.loss({"labels": torch.tensor([0, 1])}, student, teacher)
    assert terms["kd"].item() == pytest.approx(KL0, rel=1e-5) and terms["ce"].item() == pytest.approx(0.5 * LN2)
    assert not stage.student_features.any  # logits only


def test_pretrain_stage_masks_freezes_positions_and_computes_three_terms(tmp_path: Path, minilm_path: Path) -> None:
    from transformers import AutoTokenizer, BertForMaskedLM

    corpus = tmp_path / "corpus.txt"
    corpus.write_text("the cat sat\n\nthe dog ran\n")
    tok = AutoTokenizer.from_pretrained(minilm_path)
    ctx = context(CORPUS, "distilbert-pretrain", corpus=str(corpus))
    ctx = MethodContext(ctx.task, BertConfig(vocab_size=tok.vocab_size, num_hidden_layers=2, hidden_size=8,
                                             num_attention_heads=2, intermediate_size=16), ctx.teacher_config, ctx.run)
    method = METHODS.get("distilbert-pretrain")()
    masker_ = method.masker(ctx, tokenizer=tok)
    weights = masker_.token_probs
    the, cat = tok.convert_tokens_to_ids(["the", "cat"])
    assert weights[the].item() == pytest.approx(2**-0.7) and weights[cat].item() == pytest.approx(1.0)
    assert all(weights[i].item() == 0 for i in tok.all_special_ids)

    (stage,) = method.stages(MethodContext(ctx.task, ctx.student_config, ctx.teacher_config,
                                           build_run_config({**ctx.run.to_dict(), "tokenizer": str(minilm_path)})))
    assert stage.prepare_batch is not None and stage.student_features.hidden_states
    student = BertForMaskedLM(ctx.student_config)
    names = {id(p) for group in stage.param_groups(student, torch.nn.ModuleDict()) for p in group.params}
    frozen = [n for n, p in student.named_parameters() if id(p) not in names]
    assert frozen == ["bert.embeddings.position_embeddings.weight"]


# ------------------------------------------------------------------------------------------- end to end


def small_tokenizer(folder: Path, lines: list[str]):
    """A real WordPiece tokenizer whose vocabulary is the corpus' words (keeps the MLM head small)."""
    import re

    from transformers import BertTokenizerFast

    words = sorted({w for line in lines for w in re.findall(r"\w+|[^\w\s]", line.lower())})
    tokens = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", *words]
    tokenizer = BertTokenizerFast(vocab={token: i for i, token in enumerate(tokens)}, do_lower_case=True)
    tokenizer.save_pretrained(folder)
    return tokenizer


def test_general_distillation_end_to_end_loss_falls(tmp_path: Path, shared_data: Path) -> None:
    """A small BertForMaskedLM teacher built from a config (no MLM checkpoint offline) and saved with a
    tokenizer; 2-layer student from teacher layers [0, 3]; the loss falls and a general student is saved."""
    from transformers import AutoModelForMaskedLM, BertForMaskedLM, TrainerCallback

    from kdbench.engine import run_experiment
    from kdbench.records import read_record

    # Real SST-2 sentences, a few of them repeated: a corpus small enough to learn in a few steps.
    rows = (shared_data / "glue_data" / "SST-2" / "train.tsv").read_text().splitlines()[1:9]
    lines = [row.split("\t")[0] for row in rows] * 24
    corpus = tmp_path / "corpus.txt"
    corpus.write_text("\n".join(lines) + "\n")
    teacher_dir = tmp_path / "teacher"
    tokenizer = small_tokenizer(teacher_dir, lines)
    torch.manual_seed(0)
    teacher = BertForMaskedLM(BertConfig(vocab_size=len(tokenizer), hidden_size=32, num_hidden_layers=4,
                                         num_attention_heads=4, intermediate_size=37, max_position_embeddings=64))
    teacher.save_pretrained(teacher_dir)

    class Recorder(TrainerCallback):
        def __init__(self) -> None:
            self.logs: list[dict] = []

        def on_log(self, args, state, control, logs=None, **kwargs):
            self.logs.append(dict(logs or {}))

    recorder = Recorder()
    config = build_run_config({
        "method": "distilbert-pretrain", "task": "corpus", "teacher": str(teacher_dir), "student": "teacher-2l",
        "output": str(tmp_path / "runs"), "corpus": str(corpus), "epochs": 4, "batch_size": 32,
        "max_seq_length": 32, "lr": 1e-2, "logging_steps": 3, "precision": "fp32", "warmup_ratio": 0.0,
        "eval_steps": 1000,  # no intermediate checkpoints: the test is about the loss
    })
    run_dir = run_experiment(config, callbacks=[recorder])
    record = read_record(run_dir / "result.json")
    assert record["status"] == "completed"
    losses = [log["loss"] for log in recorder.logs if "loss" in log and "loss/ce" in log]
    assert len(losses) == 8 and all(math.isfinite(x) for x in losses)
    assert {"loss/ce", "loss/mlm", "loss/cos"} <= set(next(log for log in recorder.logs if "loss/ce" in log))
    # Logged every 3 steps (each value a 3-step mean, the masking differs per step): a steady fall well
    # beyond that noise, from 2·ln|V| + KL + cos toward the corpus' unigram entropy.
    assert losses[-1] < 0.92 * losses[0], losses
    assert max(losses[-3:]) < min(losses[:3]), losses
    general = AutoModelForMaskedLM.from_pretrained(run_dir / "model")
    assert general.config.num_hidden_layers == 2
    assert torch.equal(general.bert.embeddings.position_embeddings.weight,
                       teacher.bert.embeddings.position_embeddings.weight)  # copied, then frozen


def test_pretrain_student_gets_the_teachers_mlm_head() -> None:
    from transformers import BertForMaskedLM

    def mlm(layers: int) -> BertForMaskedLM:
        return BertForMaskedLM(BertConfig(vocab_size=50, num_hidden_layers=layers, hidden_size=8,
                                          num_attention_heads=2, intermediate_size=16))

    torch.manual_seed(0)
    teacher, student = mlm(4), mlm(2)
    method = METHODS.get("distilbert-pretrain")()
    run = build_run_config({"method": "distilbert-pretrain", "task": "corpus", "student": "teacher-2l", "teacher": "t"})
    method.initialize_student(student, teacher, MethodContext(CORPUS, student.config, teacher.config, run))
    for name in ("cls.predictions.transform.dense.weight", "cls.predictions.transform.LayerNorm.weight",
                 "cls.predictions.bias"):
        assert torch.equal(student.state_dict()[name], teacher.state_dict()[name]), name
    untouched = mlm(2)
    random_run = build_run_config({**run.to_dict(), "student_init": "random"})
    before = untouched.state_dict()["cls.predictions.transform.dense.weight"].clone()
    method.initialize_student(untouched, teacher, MethodContext(CORPUS, untouched.config, teacher.config, random_run))
    assert torch.equal(untouched.state_dict()["cls.predictions.transform.dense.weight"], before)


def test_task_distillation_declares_the_official_scripts_optimiser():
    """run_squad_w_distillation.py: AdamW 5e-5, weight decay 0, no warm-up; explicit run values win."""
    from kdbench.config import TrainConfig
    from kdbench.optimization import resolve
    from kdbench.methods.distilbert import TASK_OPTIMIZATION

    resolved = resolve(TASK_OPTIMIZATION, TrainConfig())
    assert (resolved.lr, resolved.weight_decay, resolved.warmup_ratio, resolved.epochs) == (5e-5, 0.0, 0.0, 3.0)
    assert resolved.sources["weight_decay"] == "method"
    assert resolve(TASK_OPTIMIZATION, TrainConfig(weight_decay=0.01)).weight_decay == 0.01
