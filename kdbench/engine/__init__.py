"""The distillation engine: runs a method's stages on a task with ``transformers.Trainer``.

The method supplies the loss; the engine supplies everything users of ``Trainer`` expect
(warm-up schedule, gradient accumulation, mixed precision, checkpoints and resume, evaluation on
dev keeping the best checkpoint, progress bars, seeds). The teacher stays outside the trained
module, in eval mode under ``torch.no_grad``.

One module per job:

- :mod:`~kdbench.engine.planning`: resolve and check a run's config before any model loads;
- :mod:`~kdbench.engine.models`: load teacher and student with the task's head, build students;
- :mod:`~kdbench.engine.setup`: data, teacher, student and method, set up once for ``run`` and
  ``bench`` alike;
- :mod:`~kdbench.engine.trainer`: the ``Trainer`` subclass whose loss is the stage's, and its arguments;
- :mod:`~kdbench.engine.optimizer`: the optimiser every training loop builds;
- :mod:`~kdbench.engine.checkpoints`: checkpoint I/O of student + extra modules;
- :mod:`~kdbench.engine.evaluation`: prediction and dev scoring;
- :mod:`~kdbench.engine.runner`: the run folder, its lock and record, and the stages in order.
"""

from kdbench.engine.checkpoints import CheckpointError, last_complete_checkpoint, load_module, save_module
from kdbench.engine.evaluation import evaluate_student, model_inputs, predict
from kdbench.engine.models import (HEAD_CLASSES, DistillationModule, build_student, head_kwargs, load_model,
                                   teacher_label_order, training_device)
from kdbench.engine.optimizer import build_adamw
from kdbench.engine.planning import RunPlan, check_model_paths_exist, plan_run
from kdbench.engine.runner import StageResult, is_main_process, run_experiment
from kdbench.engine.setup import PreparedRun, build_distillation, load_data, load_teacher, prepare_run
from kdbench.engine.trainer import DistillationTrainer, NonFiniteLossError, resolved_precision, training_arguments

__all__ = [
    "HEAD_CLASSES", "CheckpointError", "DistillationModule", "DistillationTrainer", "NonFiniteLossError",
    "PreparedRun", "RunPlan", "StageResult", "build_adamw", "build_distillation", "build_student",
    "check_model_paths_exist", "evaluate_student", "head_kwargs", "is_main_process", "last_complete_checkpoint",
    "load_data", "load_model", "load_module", "load_teacher", "model_inputs", "plan_run", "predict",
    "prepare_run", "resolved_precision", "run_experiment", "save_module", "teacher_label_order",
    "training_arguments", "training_device",
]
