"""Plain fine-tuning: the student alone on the task's labels (also how a teacher is made)."""

from __future__ import annotations

from dataclasses import dataclass

from kdbench.constraints import constrained
from kdbench.features import Features
from kdbench.method import Method, MethodContext, Stage
from kdbench.plugins import METHODS
from kdbench.search_space import Choice, FloatRange, SearchSpace
from kdbench.task import HeadType
from kdbench.task_loss import task_loss
from kdbench.masking import MlmMasking


@dataclass
class FineTuneParams:
    """Fine-tuning has no loss weights; ``temperature`` is accepted so sweeps can set it for every
    method, and it is ignored here."""

    temperature: float | None = constrained(None, gt=0, reason="it divides the logits")


class FineTune(Method):
    name = "finetune"
    description = "Fine-tuning on gold labels, no teacher (the baseline, and how teachers are made)"
    Params = FineTuneParams
    requires_teacher = False
    default_student_init = "teacher"  # when a --teacher is given to finetune, it only initialises the student

    def search_space(self) -> SearchSpace:
        return {"lr": FloatRange(1e-5, 1e-4, log=True), "batch_size": Choice((16, 32))}

    def stages(self, context: MethodContext) -> list[Stage]:
        head = context.task.head

        def loss(batch, student: Features, teacher: Features | None):
            return {"task": task_loss(batch, student, head)}

        # On a plain-text corpus, fine-tuning is masked-LM training: BERT's 15% / 80-10-10 masking.
        masking = MlmMasking.for_run(context.run) if head is HeadType.MASKED_LM else None
        return [Stage("finetune", loss, uses_teacher=False, prepare_batch=masking)]


METHODS.register("finetune", FineTune)
