"""MobileBERT-style layer-wise knowledge transfer (Sun et al., 2020, §3.5-3.6), computed as the
released TF code computes it (google-research ``mobilebert/run_pretraining.py``,
``distill_util.py``, ``lamb_optimizer.py``); file and line of every fact, the deviations and the
official bugs not copied: ``docs/fidelity.md``, section "MobileBERT".

Objectives, per transformer layer ℓ = 1..L (the embedding output is not transferred); every term
is ``factor · loss_ℓ / L`` (the code divides each summed transfer loss by the number of layers;
``layer_reduction="sum"`` drops the ``1/L``) and averages over all ``B·L`` token positions and all
query rows, padding included, as the code does (``token_reduction="real"``: real tokens and real
query rows only):

- FMT, feature-map transfer: ``fmt_form="normalized"`` (default, the code):
  ``hidden_weight·MSE(LN(h_T), LN(h_S)) + β·(μ_T − μ_S)² + γ·|σ²_T − σ²_S|`` with a
  non-trainable layer norm and per-token statistics over the hidden dim
  (:func:`kdbench.losses.fmt_normalized_loss`); the teacher statistics are those of the matched
  teacher layer (the released code's teacher_mean/teacher_var over the whole list of teacher
  layers is a bug not copied). ``fmt_form="mse"`` is the paper's plain ``hidden_weight·MSE(h_T, h_S)``
  (:func:`kdbench.losses.fmt_mse_loss`). Factors as the released command: hidden 100, β 5000, γ 5.
- AT, attention transfer: per head and query row ``−Σ_keys p_T·log p_S`` (``at_form="cross_entropy"``,
  default, the code) or the paper's ``KL(p_T ‖ p_S)`` (``at_form="kl"``: same gradient, smaller by
  the teacher's entropy), from the captured pre-softmax scores with ``log_softmax``; factor 1.
- PD, pre-training distillation (masked-LM tasks such as ``corpus``): MLM loss against
  ``pd_alpha·one_hot + (1 − pd_alpha)·softmax(teacher)`` (α = 0.5) on BERT-style dynamic masking.
  On other tasks the final objective is the task's supervised loss instead (``final`` stage "task").

Strategies (``strategy``):

- ``auxiliary``: one stage, every layer's FMT/AT plus PD.
- ``joint``: stage ``kt`` (every layer's FMT/AT), then stage ``pd``.
- ``progressive`` (default, the only strategy in the released code): stages ``kt-L1`` … ``kt-LM``
  (stage ℓ: layer ℓ's FMT/AT only, still divided by L as the code's gated sum), then ``pd``.
  ``progressive_schedule="code"`` (default): layer ℓ at ``current_lr_scale`` (3)×, layers below at
  ``lower_lr_scale`` (0.3)×, higher layers, the embeddings and the head frozen (rate 0: everything
  outside ``bert/encoder/layer_*`` gets a layer-wise rate of 0 in ``lamb_optimizer.py``);
  ``"paper"``: only layer ℓ trains. Frozen parameters get ``requires_grad=False`` for the stage (so
  they neither move nor enter gradient clipping). Optimiser groups are named ``lower`` /
  ``current-L<ℓ>``; the engine logs ``lr/<group>``.

Optimisation (declared per stage, :mod:`kdbench.optimization`; the run's explicit ``lr=``,
``epochs=``, ``train.*`` values win): LAMB (:mod:`kdbench.lamb`) at 1.5e-3, β 0.9/0.999, ε 1e-6,
weight decay 0.01, global-norm clipping 1.0, as the released command. Transfer stages: no warm-up,
no decay, times the code's periodic background rate (``mobilebert-phase``: linear warm-up over
the first ~10% of each layer's phase, then 1 → 0.9). PD: warm-up 2% (10k of 500k steps), then
linear decay. ``joint``/``auxiliary`` have no released code: ``kt`` uses the transfer schedule
(one phase), ``auxiliary`` the PD one.

In ``joint`` and ``progressive`` the embeddings (and, when student and teacher heads have the same
shapes, the head) are copied from the teacher first (``copy_from_teacher``); tensors whose names
or shapes differ are left as they are and listed in the log.

Extensions beyond the paper (documented): when the feature maps differ in width, a learnable
``Linear(d_S → d_T)`` per transferred layer projects the student's map (``fmt_proj_L<ℓ>``, trained
with layer ℓ); when depths differ, TinyBERT's uniform mapping student ℓ ↔ teacher ℓ·N/M
(:func:`kdbench.layer_maps.mobilebert_mapping`), and L is the number of student layers. NSP is not
implemented (the corpus task gives single segments).
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor, nn

from kdbench.capture import architecture_of
from kdbench.config import ConfigError
from kdbench.constraints import constrained, loss_weight
from kdbench.features import FeatureRequest, Features
from kdbench.layer_maps import LayerMapping, LayerMatch, mobilebert_mapping
from kdbench.losses import attention_kl_loss_from_scores, fmt_mse_loss, fmt_normalized_loss, mixed_target_mlm_loss
from kdbench.method import Method, MethodContext, ParamGroup, Stage, require_same_attention_heads
from kdbench.optimization import Optimization
from kdbench.plugins import METHODS
from kdbench.search_space import FloatRange, SearchSpace
from kdbench.task import HeadType
from kdbench.task_loss import task_loss

log = logging.getLogger("kdbench")

STRATEGIES = ("auxiliary", "joint", "progressive")
FMT_FORMS = ("normalized", "mse")
AT_FORMS = ("cross_entropy", "kl")
TOKEN_REDUCTIONS = ("all", "real")
LAYER_REDUCTIONS = ("mean", "sum")
SCHEDULES = ("code", "paper")
COPY_CHOICES = ("auto", "yes", "no")
LOWER_GROUP = "lower"


# The released distillation command (mobilebert/README.md) runs run_pretraining.py with
# --optimizer=lamb --learning_rate=0.0015; optimization.create_optimizer builds LAMB with β 0.9/0.999,
# ε 1e-6, weight decay 0.01 (LayerNorm/bias excluded) and clips the global gradient norm at 1.0.
_LAMB = Optimization(optimizer="lamb", lr=1.5e-3, beta1=0.9, beta2=0.999, eps=1e-6, weight_decay=0.01,
                     max_grad_norm=1.0)
KT_OPTIMIZATION = dataclasses.replace(_LAMB, schedule="mobilebert-phase", warmup_ratio=0.0)
"""Transfer phases: no warm-up, no decay (``end_lr_rate=1.0``), times the periodic background rate."""
PD_OPTIMIZATION = dataclasses.replace(_LAMB, schedule="linear", warmup_ratio=0.02)
"""Pre-training distillation: 10,000 warm-up steps of 500,000 (0.02), then linear decay."""


def projection_key(student_layer: int) -> str:
    return f"fmt_proj_L{student_layer}"


@dataclass
class MobileBertParams:
    strategy: str = constrained("progressive", choices=STRATEGIES)
    use_fmt: bool = True
    use_at: bool = True
    use_pd: bool = True  # the final objective: PD on masked-LM tasks, the task loss elsewhere
    fmt_form: str = constrained("normalized", choices=FMT_FORMS)  # normalized (official code) | mse (paper)
    at_form: str = constrained("cross_entropy", choices=AT_FORMS)  # cross_entropy (official) | kl (paper; same gradient)
    # all (official: every B·L position, padding included) | real
    token_reduction: str = constrained("all", choices=TOKEN_REDUCTIONS)
    # mean (official: each layer's term × factor / L) | sum
    layer_reduction: str = constrained("mean", choices=LAYER_REDUCTIONS)
    hidden_weight: float = loss_weight(100.0)
    attention_weight: float = loss_weight(1.0)
    beta: float = loss_weight(5000.0)
    gamma: float = loss_weight(5.0)
    pd_alpha: float = constrained(0.5, ge=0, le=1)
    pd_weight: float = loss_weight(1.0)
    mlm_probability: float = constrained(0.15, gt=0, lt=1)
    # code (lower layers 0.3x, current 3x, embeddings frozen) | paper
    progressive_schedule: str = constrained("code", choices=SCHEDULES)
    lower_lr_scale: float = constrained(0.3, ge=0)
    current_lr_scale: float = constrained(3.0, ge=0)
    copy_from_teacher: str = constrained("auto", choices=COPY_CHOICES)  # auto: in joint/progressive | yes | no
    kt_epochs: float | None = constrained(None, gt=0)  # transfer epochs in total (progressive: split over the L stages)
    kt_lr: float | None = constrained(None, gt=0)
    final_epochs: float | None = constrained(None, gt=0)  # epochs of the pd/task stage (joint/progressive)
    final_lr: float | None = constrained(None, gt=0)
    nsp: bool = constrained(False, choices=(False,),
                            rule="must be false: next-sentence prediction is not implemented (the corpus task "
                                 "gives single segments)")

    def check_combination(self) -> None:
        if not (self.use_fmt or self.use_at or self.use_pd):
            raise ConfigError("use_fmt, use_at and use_pd are all false; nothing to train")

    @property
    def transfers(self) -> bool:
        return self.use_fmt or self.use_at


# ------------------------------------------------------------------------------------------- losses
def layer_transfer_terms(student: Features, teacher: Features, match_hidden: LayerMatch, match_attention: LayerMatch,
                         params: MobileBertParams, projection: nn.Module | None,
                         num_layers: int = 1) -> dict[str, Tensor]:
    """FMT and AT terms of one transferred layer, weighted, unsuffixed names.

    Each term is ``factor · loss / num_layers`` (``run_pretraining.py`` divides every summed
    transfer loss by the number of layers; pass ``num_layers=1`` for ``layer_reduction="sum"``),
    and averages over every ``B·L`` position and query row (``token_reduction="all"``, the code) or
    over real tokens and real query rows only (``"real"``).
    """
    terms: dict[str, Tensor] = {}
    mask = student.attention_mask if params.token_reduction == "real" else None
    scale = 1.0 / num_layers
    if params.use_fmt:
        h_s = student.hidden_states[match_hidden.student]
        h_t = teacher.hidden_states[match_hidden.teacher]
        if projection is not None:
            h_s = projection(h_s)
        if params.fmt_form == "normalized":
            parts = fmt_normalized_loss(h_s, h_t, mask, beta=params.beta, gamma=params.gamma)
            terms["fmt"] = scale * params.hidden_weight * parts["fmt"]
            terms["mean"] = scale * parts["mean"]
            terms["var"] = scale * parts["var"]
        else:
            terms["fmt"] = scale * params.hidden_weight * fmt_mse_loss(h_s, h_t, mask)
    if params.use_at:
        terms["at"] = scale * params.attention_weight * attention_kl_loss_from_scores(
            student.attention_scores[match_attention.student], teacher.attention_scores[match_attention.teacher],
            mask, form=params.at_form)
    return terms


def _add(total: dict[str, Tensor], terms: Mapping[str, Tensor], suffix: str = "") -> None:
    for name, value in terms.items():
        key = name + suffix
        total[key] = total[key] + value if key in total else value


# -------------------------------------------------------------------------------- parameter groups
@dataclass(frozen=True)
class StudentParts:
    """The student's parameters by role: embeddings, each transformer layer, and the rest (head,
    pooler)."""

    embeddings: tuple[nn.Parameter, ...]
    layers: tuple[tuple[nn.Parameter, ...], ...]
    rest: tuple[nn.Parameter, ...]

    @classmethod
    def of(cls, student: nn.Module) -> StudentParts:
        spec = architecture_of(student)
        base = student.base_model
        embeddings = tuple(base.get_submodule(spec.embeddings).parameters())
        layers = tuple(tuple(layer.parameters()) for layer in base.get_submodule(spec.layers))
        seen = {id(p) for p in embeddings} | {id(p) for layer in layers for p in layer}
        rest = tuple(p for p in student.parameters() if id(p) not in seen)
        return cls(embeddings, layers, rest)


def _groups(student: nn.Module, extras: nn.Module, scaled: list[tuple[str, float, list[nn.Parameter]]]) -> list[ParamGroup]:
    """Set ``requires_grad`` (True exactly for parameters in a group with scale > 0) and return the
    groups. Parameters listed nowhere are frozen for the stage."""
    trainable: dict[int, nn.Parameter] = {}
    groups = []
    for name, scale, params in scaled:
        unique = [p for p in params if id(p) not in trainable]
        if scale > 0 and unique:
            trainable.update((id(p), p) for p in unique)
            groups.append(ParamGroup(tuple(unique), lr_scale=scale, name=name))
    for p in list(student.parameters()) + list(extras.parameters()):
        p.requires_grad_(id(p) in trainable)
    return groups


def everything(student: nn.Module, extras: nn.Module) -> list[ParamGroup]:
    return _groups(student, extras, [("default", 1.0, list(student.parameters()) + list(extras.parameters()))])


def progressive_groups(layer: int, params: MobileBertParams) -> Callable[[nn.Module, nn.Module], list[ParamGroup]]:
    """Optimiser groups of progressive stage ``layer`` (1-based)."""

    def build(student: nn.Module, extras: nn.Module) -> list[ParamGroup]:
        parts = StudentParts.of(student)
        current = list(parts.layers[layer - 1])
        key = projection_key(layer)
        if key in extras:
            current += list(extras[key].parameters())
        if params.progressive_schedule == "paper":
            return _groups(student, extras, [(f"current-L{layer}", 1.0, current)])
        # lamb_optimizer.py gives every variable outside bert/encoder/layer_* a rate of 0: the
        # embeddings (and head) stay frozen; lower layers keep training at 0.3x.
        lower = [p for lay in parts.layers[: layer - 1] for p in lay]
        return _groups(student, extras, [(f"current-L{layer}", params.current_lr_scale, current),
                                         (LOWER_GROUP, params.lower_lr_scale, lower)])

    return build


# ------------------------------------------------------------------------------------ teacher copy
def copy_from_teacher(student: nn.Module, teacher: nn.Module) -> dict[str, list[str]]:
    """Copy the teacher's embedding tensors (and head tensors) into the student where the names
    (relative to the base model for embeddings, to the whole model for the head) and shapes agree,
    and the normalisation modules are of the same kind. Returns ``{"copied": [...], "skipped": [...]}``."""
    spec_s, spec_t = architecture_of(student), architecture_of(teacher)
    copied, skipped = [], []
    t_emb = teacher.base_model.get_submodule(spec_t.embeddings)
    s_emb = student.base_model.get_submodule(spec_s.embeddings)
    t_state = t_emb.state_dict()
    with torch.no_grad():
        for name, tensor in s_emb.state_dict().items():
            owner = name.rsplit(".", 1)[0] if "." in name else ""
            same_kind = (not owner or not _has(t_emb, owner)
                         or type(s_emb.get_submodule(owner)).__name__ == type(t_emb.get_submodule(owner)).__name__)
            if name in t_state and t_state[name].shape == tensor.shape and same_kind:
                tensor.copy_(t_state[name])
                copied.append(f"embeddings.{name}")
            else:
                skipped.append(f"embeddings.{name}")
        base_prefix = student.base_model_prefix + "."
        t_full = teacher.state_dict()
        if student.config.model_type == teacher.config.model_type:
            for name, tensor in student.state_dict().items():
                if name.startswith(base_prefix):
                    continue
                if name in t_full and t_full[name].shape == tensor.shape:
                    tensor.copy_(t_full[name])
                    copied.append(name)
                else:
                    skipped.append(name)
    return {"copied": copied, "skipped": skipped}


def _has(module: nn.Module, path: str) -> bool:
    try:
        module.get_submodule(path)
    except AttributeError:
        return False
    return True


# ------------------------------------------------------------------------------------------ method
class MobileBertTransfer(Method):
    name = "mobilebert"
    description = "MobileBERT layer-wise transfer: FMT + AT (+ PD), auxiliary / joint / progressive strategies"
    Params = MobileBertParams
    default_student_init = "random"

    def search_space(self) -> SearchSpace:
        return {"hidden_weight": FloatRange(10.0, 1000.0, log=True), "attention_weight": FloatRange(0.1, 10.0, log=True),
                "lr": FloatRange(1e-5, 1e-3, log=True)}

    def mapping(self, context: MethodContext) -> LayerMapping:
        n_t = int(context.teacher_config.num_hidden_layers)
        n_s = int(context.student_config.num_hidden_layers)
        try:
            return mobilebert_mapping(n_t, n_s)
        except ValueError as error:
            raise ConfigError(f"mobilebert layer mapping: {error}") from None

    def copies_teacher(self) -> bool:
        p = self.params
        return p.copy_from_teacher == "yes" or (p.copy_from_teacher == "auto" and p.strategy != "auxiliary")

    def validate(self, context: MethodContext) -> None:
        p = self.params
        if context.teacher_config is None:
            raise ConfigError("method mobilebert needs a teacher")
        if p.transfers:
            self.mapping(context)
        if p.use_at:
            require_same_attention_heads(context, self.name)
        head = context.task.head
        if p.use_pd and head is HeadType.MASKED_LM:
            architectures = getattr(context.teacher_config, "architectures", None) or []
            if architectures and not any(a.endswith(("ForMaskedLM", "ForPreTraining")) for a in architectures):
                raise ConfigError(
                    f"mobilebert: pre-training distillation needs a teacher with a masked-LM head, but the teacher "
                    f"is {architectures}; give an MLM teacher (e.g. bert-base-uncased) or set use_pd=false")

    def initialize_student(self, student: nn.Module, teacher: nn.Module | None, context: MethodContext) -> None:
        if teacher is None or not self.copies_teacher():
            return
        outcome = copy_from_teacher(student, teacher)
        if self.params.copy_from_teacher == "yes" and not any(
                name.startswith("embeddings.word_embeddings") for name in outcome["copied"]):
            raise ConfigError("mobilebert copy_from_teacher=yes: the teacher's word embeddings do not fit the student "
                              f"(skipped: {outcome['skipped'][:6]}); use a student with the teacher's embedding size")
        log.info("mobilebert: copied from the teacher: %s; kept: %s", outcome["copied"], outcome["skipped"])
        print(f"[kdbench] mobilebert: copied {len(outcome['copied'])} tensors from the teacher "
              f"({', '.join(outcome['copied'])}); not copied: {', '.join(outcome['skipped']) or 'none'}", flush=True)

    def extra_modules(self, context: MethodContext) -> nn.ModuleDict:
        modules = nn.ModuleDict()
        d_s, d_t = int(context.student_config.hidden_size), int(context.teacher_config.hidden_size)
        if self.params.use_fmt and d_s != d_t:
            for match in self.mapping(context).hidden:
                modules[projection_key(match.student)] = nn.Linear(d_s, d_t)
        return modules

    # -------------------------------------------------------------------------------- stages
    def stages(self, context: MethodContext) -> list[Stage]:
        p = self.params
        head = context.task.head
        prepare = None
        if head is HeadType.MASKED_LM:
            from kdbench.masking import MlmMasking

            prepare = MlmMasking.for_run(context.run, p.mlm_probability)
        request = FeatureRequest(hidden_states=p.use_fmt, attention_scores=p.use_at)
        mapping = self.mapping(context) if p.transfers else LayerMapping([], [])
        pairs = list(zip(mapping.hidden, mapping.attention))
        num_layers = len(pairs) if p.layer_reduction == "mean" else 1
        final = self._final_loss(head) if p.use_pd else None
        final_name = "pd" if head is HeadType.MASKED_LM else "task"

        def transfer(selected: list[tuple[LayerMatch, LayerMatch]], per_layer_names: bool):
            def terms(student: Features, teacher: Features, extras: nn.ModuleDict) -> dict[str, Tensor]:
                total: dict[str, Tensor] = {}
                for hidden, attention in selected:
                    key = projection_key(hidden.student)
                    layer_terms = layer_transfer_terms(student, teacher, hidden, attention, p,
                                                       extras[key] if key in extras else None,  # noqa: SIM401 - ModuleDict has no get()
                                                       num_layers)
                    _add(total, layer_terms, f"/L{hidden.student}" if per_layer_names else "")
                return total

            return terms

        if not p.transfers:
            return [Stage(final_name, lambda b, s, t: final(b, s, t), uses_teacher=final_name == "pd",
                          epochs=p.final_epochs, lr=p.final_lr, select_best=head is not HeadType.MASKED_LM,
                          param_groups=everything, prepare_batch=prepare, optimization=self._final_optimization(head))]

        if p.strategy == "auxiliary":
            kt = transfer(pairs, per_layer_names=False)

            def auxiliary(batch, student, teacher, extras):
                terms = kt(student, teacher, extras)
                if final is not None:
                    terms.update(final(batch, student, teacher))
                return terms

            return [Stage("auxiliary", auxiliary, student_features=request, teacher_features=request,
                          epochs=p.kt_epochs, lr=p.kt_lr, select_best=final is not None and head is not HeadType.MASKED_LM,
                          param_groups=everything, prepare_batch=prepare, optimization=PD_OPTIMIZATION,
                          uses_extras=True)]

        stages: list[Stage] = []
        if p.strategy == "joint":
            kt = transfer(pairs, per_layer_names=False)
            stages.append(Stage("kt", lambda b, s, t, e, kt=kt: kt(s, t, e), student_features=request,
                                teacher_features=request, epochs=p.kt_epochs, lr=p.kt_lr, select_best=False,
                                param_groups=everything, prepare_batch=prepare, optimization=KT_OPTIMIZATION,
                                uses_extras=True))
        else:
            per_stage = p.kt_epochs / len(pairs) if p.kt_epochs is not None else None
            for hidden, attention in pairs:
                layer = hidden.student
                kt = transfer([(hidden, attention)], per_layer_names=True)
                stages.append(Stage(f"kt-L{layer}", lambda b, s, t, e, kt=kt: kt(s, t, e), student_features=request,
                                    teacher_features=request, epochs=per_stage, lr=p.kt_lr, select_best=False,
                                    param_groups=progressive_groups(layer, p), prepare_batch=prepare,
                                    optimization=KT_OPTIMIZATION, uses_extras=True))
        if final is not None:
            stages.append(Stage(final_name, final, uses_teacher=final_name == "pd", epochs=p.final_epochs,
                                lr=p.final_lr, select_best=head is not HeadType.MASKED_LM,
                                param_groups=everything, prepare_batch=prepare,
                                optimization=self._final_optimization(head)))
        return stages

    @staticmethod
    def _final_optimization(head: HeadType) -> Optimization | None:
        """PD on a masked-LM task: the released pre-training setup; a task's supervised loss: kdbench's
        defaults (fine-tuning is not part of the released distillation command)."""
        return PD_OPTIMIZATION if head is HeadType.MASKED_LM else None

    def _final_loss(self, head: HeadType) -> Callable[[Any, Features, Features | None], dict[str, Tensor]]:
        p = self.params
        if head is HeadType.MASKED_LM:
            def pd(batch, student: Features, teacher: Features | None) -> dict[str, Tensor]:
                return {"pd": p.pd_weight * mixed_target_mlm_loss(student.logits, teacher.logits, batch["labels"],
                                                                  p.pd_alpha)}

            return pd

        def supervised(batch, student: Features, teacher: Features | None) -> dict[str, Tensor]:
            return {"task": p.pd_weight * task_loss(batch, student, head)}

        return supervised


METHODS.register("mobilebert", MobileBertTransfer)
