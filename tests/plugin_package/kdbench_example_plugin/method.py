"""``cosine-cls``: the task loss plus a cosine distance between the last-layer [CLS] vectors of
student and teacher, through a trained projection (so student and teacher widths may differ)."""

from __future__ import annotations

from dataclasses import dataclass

import torch.nn.functional as F
from torch import nn

from kdbench.api import HIDDEN, FloatRange, HeadType, Method, MethodContext, Stage, constrained, loss_weight, task_loss

PROJECTION = "cls_projection"


@dataclass
class CosineParams:
    weight: float = loss_weight(1.0)  # weight of the [CLS] cosine term
    layer: int = constrained(-1, allow=(-1,), ge=1)  # student hidden state whose [CLS] is compared; -1: last


class CosineCLS(Method):
    name = "cosine-cls"
    description = "task loss + weight * (1 - cos) between projected student [CLS] and teacher [CLS], last layers"
    Params = CosineParams
    heads = (HeadType.CLASSIFICATION, HeadType.REGRESSION)
    default_student_init = "teacher"

    def search_space(self):
        return {"weight": FloatRange(0.1, 10.0, log=True)}

    def extra_modules(self, context: MethodContext) -> nn.ModuleDict:
        d_student = context.student_config.hidden_size
        d_teacher = context.teacher_config.hidden_size
        return nn.ModuleDict({PROJECTION: nn.Linear(d_student, d_teacher)})

    def stages(self, context: MethodContext) -> list[Stage]:
        head, weight, layer = context.task.head, self.params.weight, self.params.layer

        def loss(batch, student, teacher, extras):
            """task loss (mean over batch) + weight * mean over batch of (1 - cos(W·s_cls, t_cls))."""
            cosine = F.cosine_similarity(extras[PROJECTION](student.cls[layer]), teacher.cls[-1], dim=-1)
            return {"task": task_loss(batch, student, head), "cls": weight * (1 - cosine).mean()}

        return [Stage("distil", loss, student_features=HIDDEN, teacher_features=HIDDEN, uses_extras=True)]
