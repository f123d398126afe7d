"""BERT-PKD: patient knowledge distillation (Sun et al., 2019; intersun/PKD-for-BERT-Model-Compression).

``L = (1−α)·CE(y, z_S) + α·T²·KL_mean(z_T/T ‖ z_S/T) + β·PT`` where ``KL_mean`` is the official
``KLDivLoss(reduction='mean')`` (mean over batch × classes, NOT batchmean) and ``PT`` is the MSE
between the L2-normalised [CLS] vectors of student layers ``1..M−1`` and their teacher layers
(PKD-Skip: every ``N/M``-th teacher layer; PKD-Last: the last ``M−1`` layers below the top one).
The student's top layer is left to the KD term, as in the official code.

Defaults as the official runs (``scripts/run_student_patience.py``, ``src/argument_parser.py``):

- teacher layers (``strategy=official``): the script's ``--fc_layer_idx`` for a 12-layer teacher,
  ``1,3,5,7,9`` for 6 student layers (= skip: teacher layers 2, 4, 6, 8, 10) and ``9,10`` for 3
  (teacher layers 10, 11, not skip's 4, 8); other depths use the skip rule. ``strategy=skip`` /
  ``last`` / ``teacher_layers=[...]`` choose explicitly.
- optimisation (declared on the stage; the run's explicit ``lr=``/``epochs=`` win): 4 epochs
  (``--num_train_epochs 4.0``) at 1e-5 (the ``kd.cls`` preset's ``--learning_rate``; the script's
  grid is {5e-5, 2e-5, 1e-5}), linear warm-up 0.1.
- student initialisation: the official student starts from the bottom layers of the PRE-TRAINED
  BERT (``--encoder_checkpoint`` defaults to ``pretrained/bert-base-uncased``), not of the
  fine-tuned teacher. A kdbench run knows only the fine-tuned teacher (not the checkpoint it was
  fine-tuned from), so the default copies the fine-tuned teacher's bottom layers; name the
  pre-trained checkpoint with ``student_init_from=MODEL`` to start as the official runs do.

Differences from the official code, on purpose (see ``docs/fidelity.md``, section BERT-PKD):

- the PT loss is computed in the training precision (the official code casts it to fp16);
- training data is shuffled (the released script never shuffles);
- regression heads (STS-B, not in the paper) use ``(1−α)·MSE(gold) + α·MSE(teacher) + β·PT``.
"""

from __future__ import annotations

from dataclasses import dataclass

from kdbench.config import ConfigError
from kdbench.constraints import constrained, loss_weight, softmax_temperature
from kdbench.features import HIDDEN, Features
from kdbench.layer_maps import PKD_STRATEGIES, pkd_layers
from kdbench.losses import pkd_loss, patient_loss, regression_kd_loss
from kdbench.method import Method, MethodContext, Stage
from kdbench.optimization import Optimization
from kdbench.plugins import METHODS
from kdbench.search_space import Choice, SearchSpace
from kdbench.task import HeadType
from kdbench.task_loss import task_loss

# The paper's grid (§4.2): every combination was tried, the best picked on dev.
PKD_GRID = {
    "temperature": (5.0, 10.0, 20.0),
    "alpha": (0.2, 0.5, 0.7),
    "beta": (10.0, 100.0, 500.0, 1000.0),
    "lr": (1e-5, 2e-5, 5e-5),
}


STRATEGIES = ("official", *PKD_STRATEGIES)
# run_student_patience.py, 12-layer teacher: --fc_layer_idx (0-based) per student depth, as 1-based layers.
OFFICIAL_TEACHER_LAYERS = {(12, 6): (2, 4, 6, 8, 10), (12, 3): (10, 11)}
PKD_OPTIMIZATION = Optimization(lr=1e-5, epochs=4.0)


@dataclass
class PKDParams:
    """Defaults: the official PKD preset (``kd.cls``): α 0.7, β 500, T 10, normalised patience.

    ``teacher_layers`` (1-based, one per student layer ``1..M−1``) overrides ``strategy``.
    """

    strategy: str = constrained("official", choices=STRATEGIES)  # official (the released runs' layers) | skip | last
    alpha: float = constrained(0.7, ge=0, le=1)  # weight of the soft KD term; the hard-label CE gets 1 - alpha
    beta: float = loss_weight(500.0)  # weight of the patient (PT) loss
    temperature: float = softmax_temperature(10.0)
    normalize: bool = True  # L2-normalise the [CLS] vectors before the PT MSE (paper form)
    teacher_layers: list[int] | None = None


class PatientKD(Method):
    name = "pkd"
    description = "BERT-PKD: (1-a)*CE + a*T^2*KL(mean) + b*MSE(normalised [CLS]), strategy skip|last"
    Params = PKDParams
    heads = (HeadType.CLASSIFICATION, HeadType.REGRESSION)
    default_student_init = "teacher"  # the teacher's bottom M layers and embeddings
    default_student_layers = "bottom"

    def search_space(self) -> SearchSpace:
        return {name: Choice(values) for name, values in PKD_GRID.items()}

    def teacher_layers(self, n_teacher: int, n_student: int) -> list[int]:
        """1-based teacher layers whose [CLS] vectors student layers ``1..M−1`` learn from."""
        if n_student > n_teacher:
            raise ConfigError(f"pkd: the student has {n_student} layers, more than the teacher's {n_teacher}")
        explicit = self.params.teacher_layers
        if explicit is None:
            if self.params.strategy == "official":
                official = OFFICIAL_TEACHER_LAYERS.get((n_teacher, n_student))
                return list(official) if official is not None else pkd_layers("skip", n_teacher, n_student)
            return pkd_layers(self.params.strategy, n_teacher, n_student)
        if len(explicit) != n_student - 1:
            raise ConfigError(f"pkd parameter teacher_layers: {explicit} needs one teacher layer per student "
                              f"layer 1..{n_student - 1} (the top layer is left to KD), got {len(explicit)}")
        bad = [g for g in explicit if not 1 <= g <= n_teacher]
        if bad:
            raise ConfigError(f"pkd parameter teacher_layers: {bad} outside the teacher's layers 1..{n_teacher}")
        return list(explicit)

    def validate(self, context: MethodContext) -> None:
        teacher = context.teacher_config
        if teacher is None:
            raise ConfigError("pkd needs a teacher")
        self.teacher_layers(teacher.num_hidden_layers, context.student_config.num_hidden_layers)
        if self.params.beta > 0 and teacher.hidden_size != context.student_config.hidden_size:
            raise ConfigError(f"pkd: the patient loss compares [CLS] vectors, so student and teacher need one "
                              f"width; student hidden_size {context.student_config.hidden_size} != teacher "
                              f"{teacher.hidden_size} (use e.g. --student teacher-3l, or beta=0)")

    def stages(self, context: MethodContext) -> list[Stage]:
        p, head = self.params, context.task.head
        assert context.teacher_config is not None
        n_student = context.student_config.num_hidden_layers
        selected = self.teacher_layers(context.teacher_config.num_hidden_layers, n_student)
        student_layers = list(range(1, n_student))  # hidden indices = 1-based layer numbers

        def loss(batch, student: Features, teacher: Features | None):
            assert teacher is not None
            s_cls, t_cls = student.cls, teacher.cls
            student_cls = [s_cls[j] for j in student_layers]
            teacher_cls = [t_cls[g] for g in selected]
            if head is HeadType.CLASSIFICATION:
                return pkd_loss(student.logits, teacher.logits, batch["labels"], student_cls, teacher_cls,
                                alpha=p.alpha, beta=p.beta, temperature=p.temperature, normalize=p.normalize)
            terms = {"task": (1 - p.alpha) * task_loss(batch, student, head),
                     "kd": p.alpha * regression_kd_loss(student.logits, teacher.logits)}
            if student_cls:
                terms["pt"] = p.beta * patient_loss(student_cls, teacher_cls, normalize=p.normalize)
            return terms

        return [Stage("pkd", loss, student_features=HIDDEN, teacher_features=HIDDEN, optimization=PKD_OPTIMIZATION)]


METHODS.register("pkd", PatientKD)
