"""DistilBERT (Sanh et al., 2019; Hugging Face ``examples/research_projects/distillation``).

Two methods, because the two phases have different losses, defaults and tasks:

- ``distilbert-pretrain`` (general distillation, the ``corpus`` task, masked-LM head):
  ``α_ce·T²·KL_batchmean(t/T ‖ s/T) + α_mlm·MLM + α_cos·(1 − cos(h_S, h_T))``, the KL over
  non-padding tokens (or the masked ones only, ``restrict_ce_to_mask``), the cosine on the LAST
  hidden layer over non-padding tokens. Defaults of the DistilBERT run: α_ce 5, α_mlm 2,
  α_cos 1, T 2, position embeddings frozen (the released run's student never trained them). Masking is dynamic (per batch,
  :class:`MlmMasker`): 15% of the real tokens, chosen with probability ∝ count^−0.7 (counts from
  the corpus, special tokens never chosen), then 80% ``[MASK]`` / 10% kept / 10% random token.
  The result (run folder ``model/``) is a general student to fine-tune or distil on a task.
  Optimisation as ``train.py``/``distiller.py``: AdamW lr 5e-4, β (0.9, 0.98), ε 1e-6, no weight
  decay, linear warm-up over 5% then linear decay, gradient norm clipped at 5, 3 epochs (the run's
  explicit ``lr=``, ``epochs=``, ``train.*`` values win).
- ``distilbert`` (task-specific distillation, ``run_squad_w_distillation.py``):
  ``α_ce·T²·KL_batchmean + α_task·task loss``, defaults 0.5 / 0.5, T 2; on SQuAD the KL is the
  average of the start and end distributions, on classification it is over the class logits.
  Regression heads (not in the paper) use ``α_task·MSE(gold) + α_ce·MSE(teacher)``.

Student initialisation (both): teacher blocks ``distilbert_init_layers(N, M)`` — round(i·(N−1)/(M−1))
for student block i, halves up: ``[0, 2, 4, 7, 9, 11]`` for 12 → 6, ``[0, 3, 5]`` for 6 → 3 — plus
the embeddings (``student_layers=every-other``); ``distilbert-pretrain`` also copies the teacher's whole
masked-LM head, as ``extract_distilbert.py --vocab_transform`` does (without that flag, its default, the
script copies only the decoder and bias). See ``docs/fidelity.md``, section DistilBERT.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
from torch import Tensor, nn

from kdbench.config import ConfigError
from kdbench.constraints import constrained, loss_weight, softmax_temperature
from kdbench.features import HIDDEN, Features
from kdbench.losses import (
    distilbert_mlm_distillation_loss,
    distilbert_span_loss,
    distilbert_task_loss,
    regression_kd_loss,
    regression_mse_loss,
)
from kdbench.method import Batch, Method, MethodContext, ParamGroup, Stage
from kdbench.optimization import Optimization
from kdbench.plugins import METHODS
from kdbench.search_space import Choice, FloatRange, SearchSpace
from kdbench.task import HeadType

IGNORE_INDEX = -100
FROZEN_POSITION_PARAMETER = "embeddings.position_embeddings.weight"


# --------------------------------------------------------------------------- masking


def count_tokens(texts: Iterable[str], tokenizer: Any, vocab_size: int, max_length: int | None = None,
                 chunk: int = 1000) -> np.ndarray:
    """How often each token id occurs in ``texts``, shape ``(vocab_size,)``.

    Each text is tokenised as the ``corpus`` task feeds it to the model (special tokens added,
    truncated at ``max_length`` when given), so the counts are those of the training tokens, as
    DistilBERT's ``token_counts.py`` counts its binarised training data. Deterministic. An id
    ``>= vocab_size`` is an error (the tokenizer does not belong to the model).
    """
    counts = np.zeros(vocab_size, dtype=np.int64)
    batch: list[str] = []

    def flush() -> None:
        encoded = tokenizer(batch, truncation=max_length is not None, max_length=max_length)["input_ids"]
        ids = np.fromiter((i for row in encoded for i in row), dtype=np.int64)
        if ids.size and ids.max() >= vocab_size:
            raise ConfigError(f"the tokenizer produced token id {int(ids.max())} but the model's vocabulary has "
                              f"{vocab_size} entries")
        counts[:] += np.bincount(ids, minlength=vocab_size)
        batch.clear()

    for text in texts:
        batch.append(text)
        if len(batch) >= chunk:
            flush()
    if batch:
        flush()
    return counts


def token_probabilities(counts: np.ndarray, special_ids: Sequence[int], smoothing: float = 0.7) -> Tensor:
    """DistilBERT's masking weights ``max(count, 1)^−smoothing``, 0 for special tokens.

    Unnormalised (the masker normalises over the batch's positions). ``smoothing = 0.7`` is
    ``--mlm_smoothing`` (XLM-style emphasis on rare tokens); ``0`` gives uniform choice.
    """
    weights = np.maximum(np.asarray(counts, dtype=np.float64), 1.0) ** (-float(smoothing))
    for index in special_ids:
        if 0 <= index < len(weights):
            weights[index] = 0.0
    return torch.from_numpy(weights).float()


@dataclass(frozen=True)
class MlmMasker:
    """Dynamic MLM masking of one collated batch, as DistilBERT's ``Distiller.prepare_batch_mlm``.

    ``n = ceil(mask_prop · number of real tokens in the batch)`` positions are drawn without
    replacement over the whole batch with probability ∝ ``token_probs[id]`` (0 for special tokens
    and padding). Each drawn position becomes ``[MASK]`` (``word_mask``), keeps its token
    (``word_keep``) or gets a uniformly random id in ``[0, vocab_size)`` (``word_rand``).
    ``labels`` hold the original id at drawn positions and ``-100`` elsewhere. Uses torch's global
    RNG (seeded by the engine); inputs are not modified.
    """

    token_probs: Tensor
    mask_token_id: int
    vocab_size: int
    mask_prop: float = 0.15
    word_mask: float = 0.8
    word_keep: float = 0.1
    word_rand: float = 0.1

    def __call__(self, batch: Batch) -> dict[str, Tensor]:
        input_ids = batch["input_ids"]
        attention = batch.get("attention_mask")
        real = torch.ones_like(input_ids, dtype=torch.bool) if attention is None else attention.bool()
        weights = self.token_probs.to(input_ids.device)[input_ids] * real
        flat = weights.reshape(-1)
        candidates = int((flat > 0).sum())
        wanted = math.ceil(self.mask_prop * int(real.sum()))
        chosen = torch.zeros(flat.shape[0], dtype=torch.bool, device=input_ids.device)
        if min(wanted, candidates) > 0:
            chosen[torch.multinomial(flat / flat.sum(), min(wanted, candidates), replacement=False)] = True
        chosen = chosen.view_as(input_ids)
        if not chosen.any():  # nothing maskable in this batch (only special tokens)
            return {**batch, "labels": torch.full_like(input_ids, IGNORE_INDEX)}
        original = input_ids[chosen]
        kind = torch.multinomial(
            torch.tensor([self.word_mask, self.word_keep, self.word_rand], device=input_ids.device),
            original.shape[0], replacement=True,
        )
        random_ids = torch.randint_like(original, self.vocab_size)
        replacement = torch.where(kind == 0, torch.full_like(original, self.mask_token_id),
                                  torch.where(kind == 1, original, random_ids))
        masked = input_ids.masked_scatter(chosen, replacement)
        labels = torch.where(chosen, input_ids, torch.full_like(input_ids, IGNORE_INDEX))
        return {**batch, "input_ids": masked, "labels": labels}


# --------------------------------------------------------------------------- pre-training distillation


@dataclass
class DistilBertPretrainParams:
    """Defaults: the DistilBERT run (README command; ``train.py`` defaults for masking and T)."""

    alpha_ce: float = loss_weight(5.0)  # soft-target KL (x T^2)
    alpha_mlm: float = loss_weight(2.0)  # masked-LM cross-entropy on the gold tokens
    alpha_cos: float = loss_weight(1.0)  # cosine embedding loss on the last hidden layer
    temperature: float = softmax_temperature(2.0)
    restrict_ce_to_mask: bool = False  # KL over masked tokens only (default: every non-padding token)
    mlm_mask_prop: float = constrained(0.15, gt=0, le=1)
    word_mask: float = constrained(0.8, ge=0, le=1)
    word_keep: float = constrained(0.1, ge=0, le=1)
    word_rand: float = constrained(0.1, ge=0, le=1)
    mlm_smoothing: float = constrained(0.7, ge=0)  # token choice ∝ count^-mlm_smoothing
    freeze_position_embeddings: bool = True  # README's --freeze_pos_embs

    def check_combination(self) -> None:
        total = self.word_mask + self.word_keep + self.word_rand
        if not math.isclose(total, 1.0, abs_tol=1e-6):
            raise ConfigError(f"word_mask + word_keep + word_rand must sum to 1, got "
                              f"{self.word_mask} + {self.word_keep} + {self.word_rand} = {total}")
        if self.alpha_ce + self.alpha_mlm + self.alpha_cos <= 0:
            raise ConfigError("alpha_ce, alpha_mlm and alpha_cos are all 0; nothing to train")


def trainable_without_position_embeddings(student: nn.Module, extras: nn.Module) -> list[ParamGroup]:
    """Every trainable parameter except the student's position embeddings (kept as initialised)."""
    params = [p for name, p in student.named_parameters()
              if p.requires_grad and not name.endswith(FROZEN_POSITION_PARAMETER)]
    params += [p for p in extras.parameters() if p.requires_grad]
    return [ParamGroup(tuple(params))]


def copy_head_weights(student: nn.Module, teacher: nn.Module) -> list[str]:
    """Copy every weight outside the encoder (``base_model``) that student and teacher share by name
    and shape (for ``BertForMaskedLM``: ``cls.predictions.*``). Returns the copied names."""
    prefix = student.base_model_prefix + "."
    teacher_state = teacher.state_dict()
    head = {name: teacher_state[name].detach().clone() for name, tensor in student.state_dict().items()
            if not name.startswith(prefix) and name in teacher_state and teacher_state[name].shape == tensor.shape}
    student.load_state_dict(head, strict=False)
    return sorted(head)


# train.py's defaults (--learning_rate 5e-4, --warmup_prop 0.05, --adam_epsilon 1e-6,
# --max_grad_norm 5.0, --weight_decay 0.0, --n_epoch 3) and distiller.py's
# AdamW(..., betas=(0.9, 0.98)) with get_linear_schedule_with_warmup.
PRETRAIN_OPTIMIZATION = Optimization(optimizer="adamw", lr=5e-4, schedule="linear", warmup_ratio=0.05, beta1=0.9,
                                     beta2=0.98, eps=1e-6, weight_decay=0.0, max_grad_norm=5.0, epochs=3.0)


class DistilBertPretrain(Method):
    name = "distilbert-pretrain"
    description = ("DistilBERT general distillation on a text corpus: 5*T^2*KL + 2*MLM + 1*cosine(last hidden), "
                   "dynamic frequency-smoothed masking")
    Params = DistilBertPretrainParams
    heads = (HeadType.MASKED_LM,)
    instead_for_head = dict.fromkeys((HeadType.CLASSIFICATION, HeadType.REGRESSION, HeadType.SPAN), "distilbert")
    default_student_init = "teacher"
    default_student_layers = "every-other"  # distilbert_init_layers: [0, 2, 4, 7, 9, 11] for 12 -> 6

    def search_space(self) -> SearchSpace:
        return {"temperature": Choice((1.0, 2.0, 4.0)), "lr": FloatRange(1e-4, 1e-3, log=True)}

    def validate(self, context: MethodContext) -> None:
        teacher = context.teacher_config
        if teacher is None:
            raise ConfigError("distilbert-pretrain needs a masked-LM teacher")
        if self.params.alpha_cos > 0 and teacher.hidden_size != context.student_config.hidden_size:
            raise ConfigError(f"distilbert-pretrain: the cosine loss compares hidden states, so student and teacher "
                              f"need one width; student hidden_size {context.student_config.hidden_size} != teacher "
                              f"{teacher.hidden_size} (or set alpha_cos=0)")
        if not context.run.data.corpus:
            raise ConfigError("distilbert-pretrain needs a text corpus: give corpus=PATH (one text per line)")

    def initialize_student(self, student: nn.Module, teacher: nn.Module | None, context: MethodContext) -> None:
        """When the student's layers come from the teacher (a preset with ``student_init`` auto or
        teacher), also copy the teacher's whole masked-LM head (vocab transform, its LayerNorm and the output
        bias; the decoder is tied to the copied embeddings), as ``extract_distilbert.py --vocab_transform``
        does; the script's default copies only the decoder and the bias."""
        from kdbench.plugins import STUDENTS

        run = context.run
        if teacher is None or run.student not in STUDENTS or run.student_init not in ("auto", "teacher"):
            return
        copy_head_weights(student, teacher)

    def masker(self, context: MethodContext, tokenizer: Any | None = None) -> MlmMasker:
        """The batch masker. Token counts come from the lines the ``corpus`` task trains on
        (``data.corpus``, first ``max_train_samples`` lines) tokenised by the run's tokenizer."""
        from kdbench.tasks.corpus import read_corpus

        run = context.run
        if tokenizer is None:
            from transformers import AutoTokenizer

            source = run.tokenizer or run.teacher or run.student
            tokenizer = AutoTokenizer.from_pretrained(source, trust_remote_code=run.trust_remote_code)
        if tokenizer.mask_token_id is None:
            raise ConfigError(f"tokenizer {type(tokenizer).__name__} has no mask token; masked-LM distillation needs one")
        p, vocab_size = self.params, context.student_config.vocab_size
        lines = read_corpus(run.data.corpus, run.data.max_train_samples).lines
        counts = count_tokens(lines, tokenizer, vocab_size, max_length=run.train.max_seq_length)
        probs = token_probabilities(counts, tokenizer.all_special_ids, p.mlm_smoothing)
        return MlmMasker(probs, tokenizer.mask_token_id, vocab_size, p.mlm_mask_prop, p.word_mask, p.word_keep,
                         p.word_rand)

    def stages(self, context: MethodContext) -> list[Stage]:
        p = self.params

        def loss(batch, student: Features, teacher: Features | None):
            assert teacher is not None and student.hidden_states is not None and teacher.hidden_states is not None
            attention = batch.get("attention_mask")
            if attention is None:
                attention = torch.ones_like(batch["input_ids"])
            return distilbert_mlm_distillation_loss(
                student.logits, teacher.logits, batch["labels"], student.hidden_states[-1], teacher.hidden_states[-1],
                attention, alpha_ce=p.alpha_ce, alpha_mlm=p.alpha_mlm, alpha_cos=p.alpha_cos,
                temperature=p.temperature, restrict_ce_to_mask=p.restrict_ce_to_mask,
            )

        groups = trainable_without_position_embeddings if p.freeze_position_embeddings else None
        return [Stage("distilbert-pretrain", loss, student_features=HIDDEN, teacher_features=HIDDEN,
                      head=HeadType.MASKED_LM.value, prepare_batch=self.masker(context), param_groups=groups,
                      optimization=PRETRAIN_OPTIMIZATION)]


# --------------------------------------------------------------------------- task-specific distillation


# run_squad_w_distillation.py: AdamW at 5e-5 (eps 1e-8), weight decay 0, no warm-up, clipping 1.0, 3 epochs
# (docs/fidelity.md, DistilBERT task distillation).
TASK_OPTIMIZATION = Optimization(optimizer="adamw", lr=5e-5, schedule="linear", warmup_ratio=0.0, weight_decay=0.0,
                                 max_grad_norm=1.0, epochs=3.0)


@dataclass
class DistilBertParams:
    """Defaults of ``run_squad_w_distillation.py``: α_ce 0.5, α_task (``alpha_squad``) 0.5, T 2."""

    alpha_ce: float = loss_weight(0.5)  # soft-target KL (x T^2, batchmean)
    alpha_task: float = loss_weight(0.5)  # the task's own loss on gold labels
    temperature: float = softmax_temperature(2.0)


class DistilBertTask(Method):
    name = "distilbert"
    description = "DistilBERT task-specific distillation: 0.5*T^2*KL(batchmean) + 0.5*task loss, T=2"
    Params = DistilBertParams
    heads = (HeadType.CLASSIFICATION, HeadType.REGRESSION, HeadType.SPAN)
    instead_for_head = {HeadType.MASKED_LM: "distilbert-pretrain"}
    default_student_init = "teacher"
    default_student_layers = "every-other"

    def search_space(self) -> SearchSpace:
        return {"alpha_ce": FloatRange(0.1, 0.9), "temperature": Choice((1.0, 2.0, 4.0)),
                "lr": FloatRange(1e-5, 1e-4, log=True)}

    def stages(self, context: MethodContext) -> list[Stage]:
        p, head = self.params, context.task.head

        def loss(batch, student: Features, teacher: Features | None):
            assert teacher is not None
            if head is HeadType.CLASSIFICATION:
                return distilbert_task_loss(student.logits, teacher.logits, batch["labels"],
                                            p.alpha_ce, p.alpha_task, p.temperature)
            if head is HeadType.SPAN:
                return distilbert_span_loss(student.start_logits, student.end_logits, teacher.start_logits,
                                            teacher.end_logits, batch["start_positions"], batch["end_positions"],
                                            p.alpha_ce, p.alpha_task, p.temperature)
            # regression (the declared heads leave no other)
            return {"ce": p.alpha_task * regression_mse_loss(student.logits, batch["labels"]),
                    "kd": p.alpha_ce * regression_kd_loss(student.logits, teacher.logits)}

        return [Stage("distilbert", loss, optimization=TASK_OPTIMIZATION)]


METHODS.register("distilbert-pretrain", DistilBertPretrain)
METHODS.register("distilbert", DistilBertTask)
