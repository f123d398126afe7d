"""``DistillationTrainer``: Hugging Face's ``Trainer`` with a method stage's loss, and its arguments."""

from __future__ import annotations

import logging
import time
from pathlib import Path
from typing import Any

import torch
from torch import Tensor, nn
from transformers import PreTrainedModel, Trainer, TrainerCallback, TrainingArguments

from kdbench.bert_adam import BertAdam
from kdbench.cache import EXAMPLE_INDEX, CachedTeacher
from kdbench.capture import FeatureCapture
from kdbench.config import ConfigError, RunConfig
from kdbench.engine.checkpoints import load_module, save_module
from kdbench.engine.evaluation import evaluate_student, model_inputs
from kdbench.engine.optimizer import build_adamw
from kdbench.engine.resume import reproducible_sampler
from kdbench.features import Features
from kdbench.lamb import Lamb
from kdbench.loss_log import LOSS_TERM_PREFIX, WINDOW_STEPS
from kdbench.method import ParamGroup, Stage, all_parameters
from kdbench.optimization import ResolvedOptimization, mobilebert_phase_factor, resolve_stage
from kdbench.task import EncodedSplit, Task
from kdbench.tracking import trainer_report_to

log = logging.getLogger("kdbench")


class NonFiniteLossError(FloatingPointError):
    """A loss term became NaN or inf; the message names the term and the first step it happened."""


class DistillationTrainer(Trainer):
    """``Trainer`` whose loss is a method stage's loss over captured teacher/student features."""

    def __init__(self, *args: Any, stage: Stage, teacher: PreTrainedModel | None, teacher_order: list[int] | None,
                 task: Task, eval_splits: list[EncodedSplit], eval_tokenizer: Any,
                 cached_teacher: CachedTeacher | None = None, optimization: ResolvedOptimization | None = None,
                 **kwargs: Any):
        super().__init__(*args, **kwargs)
        self.stage = stage
        # The optimiser kind and schedule the stage resolved to; lr, betas, epsilon, weight decay and
        # global clipping come from ``args`` (see training_arguments), per-tensor clipping from here.
        # None: AdamW with ``args``' schedule.
        self.optimization = optimization
        self.teacher = teacher if stage.uses_teacher else None
        self.teacher_order = teacher_order
        self.kd_task = task
        self.eval_splits = eval_splits
        self.eval_tokenizer = eval_tokenizer
        self.student_capture = FeatureCapture(self.model.student, stage.student_features)
        # With a teacher-output cache the teacher is never run: its features are read by example index.
        self.cached_teacher = cached_teacher if self.teacher is not None else None
        live = self.teacher is not None and self.cached_teacher is None
        self.teacher_capture = FeatureCapture(self.teacher, stage.teacher_features) if live else None
        self._term_sums: dict[str, Tensor] = {}
        self._first_nonfinite: dict[str, Tensor] = {}
        self._term_steps = 0
        self.last_loss_terms: dict[str, float] = {}  # per-term means of the last logged window

    def release(self) -> None:
        self.student_capture.remove()
        if self.teacher_capture is not None:
            self.teacher_capture.remove()

    # -- loss ------------------------------------------------------------------------------
    def compute_loss(self, model: nn.Module, inputs: dict[str, Any], return_outputs: bool = False,
                     num_items_in_batch: Any = None) -> Tensor | tuple[Tensor, Any]:
        if self.stage.prepare_batch is not None and model.training:
            inputs = dict(self.stage.prepare_batch(inputs))
        student_inputs = model_inputs(inputs)
        outputs = model(**student_inputs)  # through the wrapper, so DDP synchronises gradients
        student_features = self.student_capture.collect(outputs)
        teacher_features = self.teacher_features(inputs) if self.teacher is not None else None
        terms = self.stage.compute(inputs, student_features, teacher_features, self.model.extras)
        if not terms:
            raise RuntimeError(f"stage {self.stage.name!r} returned no loss terms")
        loss = torch.stack([value.float() for value in terms.values()]).sum()
        if model.training:
            self._accumulate(terms)
        return (loss, outputs) if return_outputs else loss

    def teacher_features(self, inputs: dict[str, Tensor]) -> Features:
        if self.cached_teacher is not None:
            features = self.cached_teacher.features(inputs[EXAMPLE_INDEX], inputs["attention_mask"])
        else:
            with torch.no_grad():
                outputs = self.teacher(**model_inputs(inputs))
                features = self.teacher_capture.collect(outputs)
        if self.teacher_order is not None and features.logits is not None:
            features.logits = features.logits[:, self.teacher_order]
        return features

    def _accumulate(self, terms: dict[str, Tensor]) -> None:
        # Everything stays on the loss's device: no host synchronisation per step (check_finite
        # reads the result once per logging interval).
        for name, value in terms.items():
            value = value.detach().float()
            self._term_sums[name] = self._term_sums.get(name, 0.0) + value
            step = torch.full((), self.state.global_step + 1, dtype=torch.long, device=value.device)
            first = self._first_nonfinite.get(name)
            if first is None:
                first = torch.full((), -1, dtype=torch.long, device=value.device)
            self._first_nonfinite[name] = torch.where(~torch.isfinite(value) & (first < 0), step, first)
        self._term_steps += 1

    def check_finite(self) -> None:
        """Raise NonFiniteLossError if any loss term was NaN/inf since the last check (one sync)."""
        for name, first in self._first_nonfinite.items():
            if int(first) >= 0:
                raise NonFiniteLossError(
                    f"loss term {name!r} of stage {self.stage.name!r} became non-finite at step {int(first)}; "
                    "the last good checkpoint is kept (lower the learning rate or check the inputs)"
                )

    def log(self, logs: dict[str, float], start_time: float | None = None) -> None:
        # "train_loss" marks Trainer's end-of-training summary: it carries the steps after the last
        # periodic log, so a stage shorter than logging_steps still reports its terms.
        if ("loss" in logs or "train_loss" in logs) and self._term_steps:
            self.check_finite()
            self.last_loss_terms = {name: float(total) / self._term_steps for name, total in self._term_sums.items()}
            logs.update({f"{LOSS_TERM_PREFIX}{name}": value for name, value in self.last_loss_terms.items()})
            logs[WINDOW_STEPS] = self._term_steps
            self._term_sums.clear()
            self._term_steps = 0
            if self.optimizer is not None and len({g["name"] for g in self.optimizer.param_groups}) > 1:
                for group in self.optimizer.param_groups:  # per-group rates (e.g. progressive transfer)
                    logs[f"lr/{group['name']}"] = group["lr"]
        logs.setdefault("stage", self.stage.name)  # type: ignore[arg-type]
        super().log(logs, start_time)

    def _get_train_sampler(self, train_dataset: Any = None) -> Any:
        # the epoch's order from (seed, epoch) alone, so a resumed run sees the batches it would have
        seed = self.args.data_seed if self.args.data_seed is not None else self.args.seed
        return reproducible_sampler(super()._get_train_sampler(train_dataset), seed)

    # -- optimiser -------------------------------------------------------------------------
    def create_optimizer(self, model: nn.Module | None = None) -> torch.optim.Optimizer:
        if self.optimizer is None:
            module = self.model
            lamb = self.optimization is not None and self.optimization.optimizer == "lamb"
            groups: list[ParamGroup] = (self.stage.param_groups or all_parameters)(module.student, module.extras)
            names = {id(p): n for n, p in module.named_parameters()}
            decay_names = set(self.get_decay_parameter_names(module))
            param_groups = []
            for group in groups:
                params = [p for p in group.params if p.requires_grad]
                decay = [p for p in params if names.get(id(p)) in decay_names]
                no_decay = [p for p in params if names.get(id(p)) not in decay_names]
                lr = self.args.learning_rate * group.lr_scale
                for chosen, weight_decay in ((decay, self.args.weight_decay), (no_decay, 0.0)):
                    if chosen:
                        param_groups.append({"params": chosen, "lr": lr, "weight_decay": weight_decay,
                                             "name": group.name})
                        if lamb:  # lamb_optimizer.py: biases and LayerNorm weights skip decay and trust ratio
                            param_groups[-1]["layer_adaptation"] = chosen is decay
            if not param_groups:
                raise ConfigError(f"stage {self.stage.name!r} has no trainable parameters")
            betas = (self.args.adam_beta1, self.args.adam_beta2)
            if lamb:
                self.optimizer = Lamb(param_groups, lr=self.args.learning_rate, betas=betas, eps=self.args.adam_epsilon)
            elif self.optimization is not None and self.optimization.optimizer == "bertadam":
                self.optimizer = BertAdam(param_groups, lr=self.args.learning_rate, betas=betas,
                                          eps=self.args.adam_epsilon, max_grad_norm=self.optimization.max_grad_norm)
            else:
                self.optimizer = build_adamw(param_groups, lr=self.args.learning_rate, betas=betas,
                                             eps=self.args.adam_epsilon)
        return self.optimizer

    def create_scheduler(self, num_training_steps: int, optimizer: torch.optim.Optimizer | None = None) -> Any:
        if self.lr_scheduler is None and self.optimization is not None \
                and self.optimization.schedule == "mobilebert-phase":
            steps = num_training_steps
            self.lr_scheduler = torch.optim.lr_scheduler.LambdaLR(
                optimizer if optimizer is not None else self.optimizer,
                lambda step: mobilebert_phase_factor(step, steps))
            return self.lr_scheduler
        return super().create_scheduler(num_training_steps, optimizer)

    # -- evaluation ------------------------------------------------------------------------
    def evaluate(self, eval_dataset: Any = None, ignore_keys: Any = None, metric_key_prefix: str = "eval") -> dict[str, float]:
        started = time.perf_counter()
        metrics = evaluate_student(self.model.student, self.kd_task, self.eval_splits, self.eval_tokenizer,
                                   self.args.per_device_eval_batch_size)
        metrics = {f"{metric_key_prefix}_{k}": v for k, v in metrics.items()}
        metrics[f"{metric_key_prefix}_runtime"] = round(time.perf_counter() - started, 3)
        self.log(metrics)
        self.control = self.callback_handler.on_evaluate(self.args, self.state, self.control, metrics)
        return metrics

    # -- checkpoints -----------------------------------------------------------------------
    def _save_checkpoint(self, model: nn.Module, trial: Any) -> None:
        self.check_finite()  # never save weights produced by a NaN step
        super()._save_checkpoint(model, trial)

    def _save(self, output_dir: str | None = None, state_dict: dict | None = None) -> None:
        folder = Path(output_dir or self.args.output_dir)
        save_module(self.model, folder, self.processing_class)
        torch.save(self.args.to_dict(), folder / "training_args.bin")

    def _load_from_checkpoint(self, resume_from_checkpoint: str, model: nn.Module | None = None) -> None:
        load_module(self.model, Path(resume_from_checkpoint))
        log.info("resumed stage %s from %s", self.stage.name, resume_from_checkpoint)

    def _load_best_model(self) -> None:
        self.accelerator.wait_for_everyone()  # rank 0 may still be writing the checkpoint
        best = self.state.best_model_checkpoint
        if best:
            load_module(self.model, Path(best))
            log.info("loaded best checkpoint %s (%s = %s)", best, self.args.metric_for_best_model,
                     self.state.best_metric)


class ResumeLogger(TrainerCallback):
    """Makes a resume visible in the log: the step training continues from."""

    def __init__(self, checkpoint: str | None):
        self.checkpoint = checkpoint

    def on_train_begin(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        if self.checkpoint:
            print(f"[kdbench] resuming from {self.checkpoint} at step {state.global_step}", flush=True)


def resolved_precision(config: RunConfig) -> str:
    precision = config.train.precision
    if precision == "auto":
        precision = "bf16" if torch.cuda.is_available() and torch.cuda.is_bf16_supported() else "fp32"
    return precision


SCHEDULER_TYPES = {"linear": "linear", "constant": "constant_with_warmup",
                   "mobilebert-phase": "constant"}  # the last is replaced in create_scheduler


def stage_optimization(config: RunConfig, stage: Stage) -> ResolvedOptimization:
    """The stage's optimisation: the run's explicit values, else the stage's declaration, else kdbench's."""
    return resolve_stage(stage, config.train)


def training_arguments(config: RunConfig, stage: Stage, folder: Path, selection_metric: str,
                       has_eval: bool) -> TrainingArguments:
    """The stage's Trainer arguments; a stage that selects a best model keeps the checkpoint with the
    highest dev ``selection_metric``."""
    train = config.train
    optimization = stage_optimization(config, stage)
    precision = resolved_precision(config)
    evaluate_now = has_eval and stage.select_best
    strategy = "steps" if train.eval_steps else "epoch"
    return TrainingArguments(
        output_dir=str(folder),
        num_train_epochs=optimization.epochs,
        max_steps=train.max_steps,
        per_device_train_batch_size=train.batch_size,
        per_device_eval_batch_size=train.eval_batch_size,
        gradient_accumulation_steps=train.grad_accum,
        learning_rate=optimization.lr,
        weight_decay=optimization.weight_decay,
        warmup_steps=optimization.warmup_ratio,
        lr_scheduler_type=SCHEDULER_TYPES[optimization.schedule],
        adam_beta1=optimization.beta1,
        adam_beta2=optimization.beta2,
        adam_epsilon=optimization.eps,
        max_grad_norm=optimization.global_max_grad_norm,
        eval_strategy=strategy if evaluate_now else "no",
        # A stage that selects no best model needs a checkpoint only to resume: TimedCheckpoints
        # saves one every train.checkpoint_minutes (and on preemption) instead of after every
        # epoch, which in TinyBERT's 20-epoch intermediate stage on a small task cost more than training.
        save_strategy=strategy if evaluate_now else "no",
        eval_steps=train.eval_steps,
        save_steps=train.eval_steps,
        save_total_limit=train.save_total_limit,
        load_best_model_at_end=evaluate_now,
        metric_for_best_model=f"eval_{selection_metric}" if evaluate_now else None,
        greater_is_better=True,
        logging_steps=train.logging_steps,
        logging_nan_inf_filter=False,
        seed=train.seed,
        bf16=precision == "bf16",
        fp16=precision == "fp16",
        report_to=trainer_report_to(train.report_to),  # TensorBoard: kdbench.tracking.RunTracking
        run_name=f"{folder.parent.parent.name}/{folder.name}",  # <run>/<index>-<stage>
        remove_unused_columns=False,
        dataloader_num_workers=train.dataloader_workers,
        dataloader_pin_memory=torch.cuda.is_available(),
        train_sampling_strategy="group_by_length" if train.group_by_length else "random",
        disable_tqdm=False,
        save_only_model=False,
    )
