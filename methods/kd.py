"""Vanilla knowledge distillation (Hinton et al., 2015): ``(1-α)·CE + α·T²·KL`` (batchmean).

``kl_reduction=mean`` is BERT-PKD's vanilla-KD baseline (``src/KD_loss.py``:
``KLDivLoss(reduction='mean')``, mean over batch × classes); see docs/fidelity.md, "Hinton KD".
"""

from __future__ import annotations

from dataclasses import dataclass

from kdbench.constraints import constrained, softmax_temperature
from kdbench.features import Features
from kdbench.losses import hinton_kd_loss, kd_kl_loss, regression_kd_loss
from kdbench.method import Method, MethodContext, Stage
from kdbench.plugins import METHODS
from kdbench.search_space import Choice, FloatRange, SearchSpace
from kdbench.task import HeadType
from kdbench.task_loss import task_loss

KD_REDUCTIONS = ("batchmean", "mean")


@dataclass
class KDParams:
    alpha: float = constrained(0.5, ge=0, le=1)  # weight of the soft (teacher) term; the hard-label CE gets 1 - alpha
    temperature: float = softmax_temperature(2.0)
    # batchmean (Hinton) | mean (BERT-PKD's vanilla-KD baseline)
    kl_reduction: str = constrained("batchmean", choices=KD_REDUCTIONS)


class HintonKD(Method):
    name = "kd"
    description = "Vanilla KD (Hinton): (1-a)*CE + a*T^2*KL(batchmean) on the task logits"
    Params = KDParams
    heads = (HeadType.CLASSIFICATION, HeadType.REGRESSION, HeadType.SPAN)
    default_student_init = "random"

    def search_space(self) -> SearchSpace:
        return {
            "alpha": FloatRange(0.1, 0.9),
            "temperature": Choice((1.0, 2.0, 4.0, 8.0)),
            "lr": FloatRange(1e-5, 2e-4, log=True),
        }

    def stages(self, context: MethodContext) -> list[Stage]:
        head, alpha, temperature = context.task.head, self.params.alpha, self.params.temperature
        reduction = self.params.kl_reduction

        def loss(batch, student: Features, teacher: Features | None):
            if head is HeadType.CLASSIFICATION:
                return hinton_kd_loss(student.logits, teacher.logits, batch["labels"], alpha, temperature, reduction)
            if head is HeadType.REGRESSION:  # no distribution to soften: match the teacher's output
                return {"task": (1 - alpha) * task_loss(batch, student, head),
                        "kd": alpha * regression_kd_loss(student.logits, teacher.logits)}
            # span (the declared heads leave no other): soft targets over start and end positions, averaged
            kd = (kd_kl_loss(student.start_logits, teacher.start_logits, temperature, reduction)
                  + kd_kl_loss(student.end_logits, teacher.end_logits, temperature, reduction)) / 2
            return {"task": (1 - alpha) * task_loss(batch, student, head), "kd": alpha * kd}

        return [Stage("kd", loss)]


METHODS.register("kd", HintonKD)
