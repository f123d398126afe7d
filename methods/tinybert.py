"""TinyBERT (Jiao et al., 2020): Transformer distillation in two stages.

What the official code (huawei-noah/Pretrained-Language-Model ``TinyBERT/``) computes, and this
plug-in reproduces (see ``docs/fidelity.md``, section TinyBERT):

- **Intermediate stage** (embedding + attention + hidden, no prediction loss):
  attention MSE on PRE-softmax scores with entries ``<= -1e2`` zeroed in student and teacher
  (:func:`kdbench.losses.tinybert_attention_loss`), hidden/embedding ``MSE(W·h_S, h_T)``
  (:func:`kdbench.losses.hidden_mse_loss`), each summed over the mapped layer pairs. The code uses
  ONE projection ``W`` (``fit_dense``, d_S → d_T, applied even when the widths match) for the
  embedding and every hidden state: ``projection=shared`` (default). ``projection=paper`` uses the
  paper's separate ``W_e`` and ``W_h``; ``projection=per-layer`` one matrix per mapped hidden state;
  ``projection=none`` no projection (widths must match).
- **Prediction stage**: soft cross-entropy ``(-softmax(z_T/T)·log_softmax(z_S/T)).mean()`` (mean over
  batch AND classes, no T², T = 1); regression tasks (STS-B) use MSE against the gold score as the
  code does; span tasks, which the released code does not cover, average the soft CE of start and
  end logits (each a mean over batch and positions).
- Per-layer weights ``λ_m`` (``layer_weights``: one per student hidden index 0..M, i.e. embedding
  then each layer; the attention of layer m shares λ_m) and ``prediction_weight`` (λ_{M+1}); all 1
  in the paper.
- Mapping (``mapping``): ``uniform`` (default; N % M must be 0), ``top``, ``bottom``, a list of M
  1-based teacher layers, or a list of ``[student, teacher]`` hidden-index pairs. Bad mappings and
  head-count mismatches are ``ConfigError`` before any training.
- Ablations of the paper's objective table: ``no_embd``, ``no_attn``, ``no_hidn``, ``no_trm``
  (= no attention and no hidden), ``no_pred``. With ``no_pred`` the prediction stage trains the
  classifier on the gold labels (hard CE) instead of the teacher's soft targets: the paper reports
  dev scores for "w/o Pred", so its head was trained, and gold labels are the only other signal.
- ``mode``: ``task`` (default; intermediate stage then prediction stage), ``general`` (general
  distillation: intermediate losses only, 3 epochs at 5e-5; use the ``corpus`` task with a
  pre-trained, not fine-tuned, teacher; the run's ``model/`` is the reusable general student),
  ``intermediate`` or ``prediction`` (one stage alone, as the official two commands).
- Optimisation, declared per stage (:mod:`kdbench.optimization`): the intermediate stage runs at a
  constant 5e-5 without warm-up (``task_distill.py`` builds ``BertAdam(schedule='none')`` when not
  ``--pred_distill``) for the paper's epochs per task (§4.2: 10 on MNLI, QQP and QNLI, 50 on CoLA,
  20 elsewhere); the prediction stage 3 epochs at 3e-5 (README) with linear warm-up 0.1 and decay.
  The run's explicit ``lr=``/``epochs=``/``train.*`` values win over these, and a stage's own
  ``intermediate_lr=``, ``prediction_epochs=`` ... win over the run's.
- Not copied (deviations of the official code): ``task_distill.py`` never puts the teacher in eval
  mode, so its dropout is on while it produces targets; kdbench's teacher runs in eval mode. The
  official ``TinyBertForSequenceClassification`` computes ``classifier(relu(pooled))``; kdbench uses
  the standard Hugging Face head ``classifier(dropout(pooled))`` so students and teachers stay
  ordinary ``transformers`` models.

Data augmentation is not part of the method: ``kdbench augment TASK ...`` writes the augmented
training file once (cached, keyed by its inputs) and runs use it with ``train_file=...``, as the
official pipeline does (the task never knows the method).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from torch import Tensor, nn

from kdbench.config import ConfigError
from kdbench.constraints import constrained, loss_weight, softmax_temperature
from kdbench.features import FeatureRequest, Features
from kdbench.layer_maps import LayerMapping, LayerMatch, tinybert_mapping
from kdbench.losses import hidden_mse_loss, regression_mse_loss, soft_cross_entropy, tinybert_attention_loss
from kdbench.method import Method, MethodContext, Stage
from kdbench.optimization import Optimization
from kdbench.plugins import METHODS
from kdbench.search_space import Choice, FloatRange, SearchSpace
from kdbench.task import HeadType
from kdbench.task_loss import task_loss

MODES = ("task", "general", "intermediate", "prediction")
PROJECTIONS = ("shared", "paper", "per-layer", "none")
# Names of the projection modules inside Method.extra_modules (also their checkpoint keys).
SHARED_PROJECTION = "fit_dense"
EMBEDDING_PROJECTION = "embedding"
HIDDEN_PROJECTION = "hidden"


def _per_layer_projection(student_hidden_index: int) -> str:
    return f"hidden_{student_hidden_index}"


@dataclass
class TinyBERTParams:
    mode: str = constrained("task", choices=MODES)
    mapping: str | list[Any] = "uniform"
    projection: str = constrained("shared", choices=PROJECTIONS)
    no_embd: bool = False
    no_attn: bool = False
    no_hidn: bool = False
    no_trm: bool = False  # no Transformer-layer distillation: no attention and no hidden loss
    no_pred: bool = False
    layer_weights: list[float] | None = loss_weight(None)  # λ_0..λ_M (embedding, then each student layer)
    prediction_weight: float = loss_weight(1.0)  # λ_{M+1}
    temperature: float = softmax_temperature(1.0)
    # None: the stage's declaration (intermediate_optimization etc.), overridable by the run's lr=/epochs=;
    # a value given here wins for that stage.
    intermediate_epochs: float | None = constrained(None, gt=0)
    intermediate_lr: float | None = constrained(None, gt=0)
    prediction_epochs: float | None = constrained(None, gt=0)
    prediction_lr: float | None = constrained(None, gt=0)
    general_epochs: float | None = constrained(None, gt=0)
    general_lr: float | None = constrained(None, gt=0)

    def check_combination(self) -> None:
        if self.mode in ("general", "intermediate") and not self.intermediate_objectives:
            raise ConfigError(f"tinybert mode={self.mode} with no_embd, no_attn and no_hidn/no_trm leaves "
                              "no loss to train")
        if self.mode == "general" and self.no_pred:
            raise ConfigError("tinybert mode=general has no prediction stage; drop no_pred")

    @property
    def use_embedding(self) -> bool:
        return not self.no_embd

    @property
    def use_attention(self) -> bool:
        return not (self.no_attn or self.no_trm)

    @property
    def use_hidden(self) -> bool:
        return not (self.no_hidn or self.no_trm)

    @property
    def intermediate_objectives(self) -> bool:
        return self.use_embedding or self.use_attention or self.use_hidden


class TinyBERT(Method):
    name = "tinybert"
    description = ("TinyBERT: embedding/attention(pre-softmax)/hidden MSE through a projection, then soft-CE "
                   "prediction distillation; general or task-specific, with ablation switches")
    Params = TinyBERTParams
    default_student_init = "random"
    instead_for_head = {HeadType.MASKED_LM: "tinybert-general"}

    def supported_heads(self) -> tuple[HeadType, ...]:
        """Intermediate-only modes (general, intermediate) train any head, a masked-LM corpus included;
        the prediction stage distils task outputs, so task and prediction modes need a task head."""
        if self.params.mode in ("general", "intermediate"):
            return self.heads
        return (HeadType.CLASSIFICATION, HeadType.REGRESSION, HeadType.SPAN)

    def search_space(self) -> SearchSpace:
        return {"prediction_lr": Choice((1e-5, 2e-5, 3e-5)), "temperature": Choice((1.0, 2.0, 4.0)),
                "intermediate_lr": FloatRange(1e-5, 1e-4, log=True)}

    # ---------------------------------------------------------------------------- planning
    def mapping(self, context: MethodContext) -> LayerMapping:
        """The layer pairs (hidden indices / 0-based attention indices) with the λ weights applied."""
        if context.teacher_config is None:
            raise ConfigError("tinybert needs a teacher")
        n_teacher = int(context.teacher_config.num_hidden_layers)
        n_student = int(context.student_config.num_hidden_layers)
        strategy = self.params.mapping
        try:
            base = tinybert_mapping(strategy, n_teacher, n_student)
        except ValueError as error:
            raise ConfigError(f"tinybert parameter mapping={strategy!r}: {error}") from None
        weights = self.params.layer_weights
        if weights is None:
            return base
        if len(weights) != n_student + 1:
            raise ConfigError(f"tinybert parameter layer_weights: needs {n_student + 1} values (embedding, then "
                              f"each of the student's {n_student} layers), got {len(weights)}: {weights}")
        hidden = [LayerMatch(m.student, m.teacher, float(weights[m.student])) for m in base.hidden]
        attention = [LayerMatch(m.student, m.teacher, float(weights[m.student + 1])) for m in base.attention]
        return LayerMapping(hidden, attention)

    def validate(self, context: MethodContext) -> None:
        p = self.params
        mapping = self.mapping(context)  # raises on a bad mapping
        if not self._has_intermediate_stage():
            return
        student, teacher = context.student_config, context.teacher_config
        if p.use_attention:
            if not mapping.attention:
                raise ConfigError(f"tinybert mapping={p.mapping!r} maps no transformer layer, so there is no "
                                  "attention pair; add layer pairs or set no_attn=true")
            if student.num_attention_heads != teacher.num_attention_heads:
                raise ConfigError(
                    f"tinybert attention distillation needs the same number of heads: student has "
                    f"{student.num_attention_heads}, teacher {teacher.num_attention_heads} (set no_attn=true "
                    "or use a student with the teacher's head count)")
        if p.projection == "none" and (p.use_hidden or p.use_embedding) and student.hidden_size != teacher.hidden_size:
            raise ConfigError(f"tinybert projection=none needs equal hidden sizes, student {student.hidden_size} "
                              f"vs teacher {teacher.hidden_size}; use projection=shared")
        if p.use_hidden and not any(m.student > 0 for m in mapping.hidden):
            raise ConfigError(f"tinybert mapping={p.mapping!r} has no transformer-layer hidden pair; set no_hidn=true")
        if p.use_embedding and not any(m.student == 0 for m in mapping.hidden):
            raise ConfigError(f"tinybert mapping={p.mapping!r} has no embedding pair (0, 0); add it or set no_embd=true")

    def _has_intermediate_stage(self) -> bool:
        return self.params.mode in ("task", "general", "intermediate") and self.params.intermediate_objectives

    def extra_modules(self, context: MethodContext) -> nn.ModuleDict:
        """The projection(s) W (d_S → d_T), trained with the student and checkpointed by the engine."""
        p = self.params
        modules = nn.ModuleDict()
        if self._has_intermediate_stage() and p.projection != "none" and (p.use_hidden or p.use_embedding):
            d_s, d_t = int(context.student_config.hidden_size), int(context.teacher_config.hidden_size)
            if p.projection == "shared":
                modules[SHARED_PROJECTION] = nn.Linear(d_s, d_t)
            elif p.projection == "paper":
                if p.use_embedding:
                    modules[EMBEDDING_PROJECTION] = nn.Linear(d_s, d_t)
                if p.use_hidden:
                    modules[HIDDEN_PROJECTION] = nn.Linear(d_s, d_t)
            else:
                for match in self.mapping(context).hidden:
                    if (match.student == 0 and p.use_embedding) or (match.student > 0 and p.use_hidden):
                        key = _per_layer_projection(match.student)
                        if key not in modules:
                            modules[key] = nn.Linear(d_s, d_t)
        return modules

    def _projection_for(self, modules: nn.ModuleDict, student_hidden_index: int) -> nn.Module | None:
        """The projection of student hidden state ``student_hidden_index`` among the extra modules."""
        projection = self.params.projection
        if projection == "none":
            return None
        if projection == "shared":
            return modules[SHARED_PROJECTION]
        if projection == "paper":
            return modules[EMBEDDING_PROJECTION if student_hidden_index == 0 else HIDDEN_PROJECTION]
        return modules[_per_layer_projection(student_hidden_index)]

    # ---------------------------------------------------------------------------- stages
    def stages(self, context: MethodContext) -> list[Stage]:
        p = self.params
        stages: list[Stage] = []
        if p.mode == "general":
            return [self._intermediate_stage(context, "general", p.general_epochs, p.general_lr, GENERAL_OPTIMIZATION)]
        if p.mode in ("task", "intermediate") and p.intermediate_objectives:
            stages.append(self._intermediate_stage(context, "intermediate", p.intermediate_epochs, p.intermediate_lr,
                                                   intermediate_optimization(context.task.name)))
        if p.mode in ("task", "prediction"):
            stages.append(self._prediction_stage(context))
        return stages

    def _intermediate_stage(self, context: MethodContext, name: str, epochs: float | None,
                            lr: float | None, optimization: Optimization) -> Stage:
        p = self.params
        mapping = self.mapping(context)
        embedding_pairs = [m for m in mapping.hidden if m.student == 0] if p.use_embedding else []
        hidden_pairs = [m for m in mapping.hidden if m.student > 0] if p.use_hidden else []
        attention_pairs = list(mapping.attention) if p.use_attention else []
        # Each model is asked for the layers the mapping reads, no more: the teacher records (and
        # caches) only its mapped layers, and its other layers keep SDPA.
        hidden_matches = embedding_pairs + hidden_pairs

        def request_of(side: str) -> FeatureRequest:
            return FeatureRequest(hidden_states=bool(hidden_matches), attention_scores=bool(attention_pairs),
                                  hidden_layers=tuple(getattr(m, side) for m in hidden_matches),
                                  attention_layers=tuple(getattr(m, side) for m in attention_pairs))

        def loss(batch: Any, student: Features, teacher: Features | None, extras: nn.ModuleDict) -> dict[str, Tensor]:
            assert teacher is not None
            terms: dict[str, Tensor] = {}
            if attention_pairs:
                terms["attn"] = _sum_pairs(attention_pairs, lambda m: tinybert_attention_loss(
                    student.attention_scores[m.student], teacher.attention_scores[m.teacher]))
            if embedding_pairs:
                terms["embd"] = _sum_pairs(embedding_pairs, lambda m: hidden_mse_loss(
                    student.hidden_states[m.student], teacher.hidden_states[m.teacher],
                    self._projection_for(extras, m.student)))
            if hidden_pairs:
                terms["hidn"] = _sum_pairs(hidden_pairs, lambda m: hidden_mse_loss(
                    student.hidden_states[m.student], teacher.hidden_states[m.teacher],
                    self._projection_for(extras, m.student)))
            return terms

        # The head is not trained here, so dev scores mean nothing: keep the last state.
        return Stage(name, loss, student_features=request_of("student"), teacher_features=request_of("teacher"),
                     epochs=epochs, lr=lr, select_best=False, optimization=optimization, uses_extras=True)

    def _prediction_stage(self, context: MethodContext) -> Stage:
        p = self.params
        head = context.task.head
        weight, temperature = p.prediction_weight, p.temperature
        # Regression: the official code fits the gold score; no_pred: the gold labels replace the teacher.
        uses_teacher = not (p.no_pred or head is HeadType.REGRESSION)

        def loss(batch: Any, student: Features, teacher: Features | None) -> dict[str, Tensor]:
            if head is HeadType.REGRESSION:
                return {"mse": weight * regression_mse_loss(student.logits, batch["labels"])}
            if not uses_teacher:
                return {"ce": weight * task_loss(batch, student, head)}
            assert teacher is not None
            if head is HeadType.CLASSIFICATION:
                return {"pred": weight * soft_cross_entropy(student.logits, teacher.logits, temperature)}
            # span (supported_heads leaves no other)
            soft = (soft_cross_entropy(student.start_logits, teacher.start_logits, temperature)
                    + soft_cross_entropy(student.end_logits, teacher.end_logits, temperature)) / 2
            return {"pred": weight * soft}

        return Stage("prediction", loss, uses_teacher=uses_teacher, epochs=p.prediction_epochs, lr=p.prediction_lr,
                     optimization=PREDICTION_OPTIMIZATION)


# Paper §4.2: intermediate-layer distillation for 10 epochs on the large tasks, 50 on CoLA, 20 elsewhere.
INTERMEDIATE_EPOCHS = {"mnli": 10.0, "mnli-mm": 10.0, "qqp": 10.0, "qnli": 10.0, "cola": 50.0}
DEFAULT_INTERMEDIATE_EPOCHS = 20.0
PREDICTION_OPTIMIZATION = Optimization(lr=3e-5, epochs=3.0)  # README's prediction-stage example
GENERAL_OPTIMIZATION = Optimization(lr=5e-5, epochs=3.0)


def intermediate_optimization(task: str) -> Optimization:
    """``BertAdam(schedule='none')`` in ``task_distill.py``: a constant rate, no warm-up; 5e-5 and the
    paper's epochs for ``task``."""
    return Optimization(lr=5e-5, schedule="constant", warmup_ratio=0.0,
                        epochs=INTERMEDIATE_EPOCHS.get(task, DEFAULT_INTERMEDIATE_EPOCHS))


@dataclass
class TinyBERTGeneralParams(TinyBERTParams):
    """``tinybert`` parameters with ``mode=general`` as the default."""

    mode: str = "general"


class TinyBERTGeneral(TinyBERT):
    """General distillation as its own name (for sweeps): ``tinybert`` with ``mode=general``."""

    name = "tinybert-general"
    description = "TinyBERT general distillation: intermediate losses only, on a corpus, pre-trained teacher"
    Params = TinyBERTGeneralParams


def _sum_pairs(pairs: Sequence[LayerMatch], term: Any) -> Tensor:
    total: Tensor | None = None
    for match in pairs:
        value = match.weight * term(match)
        total = value if total is None else total + value
    assert total is not None
    return total


METHODS.register("tinybert", TinyBERT)
METHODS.register("tinybert-general", TinyBERTGeneral)

__all__ = ["MODES", "PROJECTIONS", "TinyBERT", "TinyBERTGeneral", "TinyBERTGeneralParams", "TinyBERTParams"]
