"""The distillation engine: runs a method's stages on a task with ``transformers.Trainer``.

The method supplies the loss; the engine supplies everything users of ``Trainer`` expect
(warm-up schedule, gradient accumulation, mixed precision, checkpoints and resume, evaluation on
dev keeping the best checkpoint, progress bars, seeds). The teacher stays outside the trained
module, in eval mode under ``torch.no_grad``.

A run's folder is keyed by the hash of its resolved config: running the same config again finds
the completed record and trains nothing; running it after a crash resumes from the last
checkpoint of the unfinished stage.
"""

from __future__ import annotations

import json
import logging
import os
import shutil
import time
import traceback
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import numpy as np
import torch
from safetensors import SafetensorError
from safetensors.torch import load_file, save_file
from torch import Tensor, nn
from transformers import (
    AutoConfig,
    AutoModelForMaskedLM,
    AutoModelForQuestionAnswering,
    AutoModelForSequenceClassification,
    AutoTokenizer,
    DataCollatorWithPadding,
    PreTrainedModel,
    Trainer,
    TrainerCallback,
    TrainingArguments,
    set_seed,
)
from transformers.trainer_utils import get_last_checkpoint

from kdbench.cache import EXAMPLE_INDEX, CachedTeacher, TeacherCacheSession, add_index_columns
from kdbench.capture import FeatureCapture
from kdbench.config import ConfigError, RunConfig, save_config
from kdbench.errors import TrainingOutOfMemoryError, is_out_of_memory
from kdbench.features import Features
from kdbench.method import Method, MethodContext, ParamGroup, Stage, all_parameters
from kdbench.plugins import METHODS, STUDENTS, TASKS
from kdbench.records import (RESULT_FILE, SCHEMA_VERSION, library_versions, read_record, run_lock,
                             write_json_atomic)
from kdbench.students import StudentPreset, copy_teacher_weights, count_parameters, resolve_teacher_layers
from kdbench.task import MODEL_INPUTS, TRAINING_TARGETS, EncodedSplit, HeadType, Task, TaskSpec

log = logging.getLogger("kdbench")

HEAD_CLASSES = {
    HeadType.CLASSIFICATION: AutoModelForSequenceClassification,
    HeadType.REGRESSION: AutoModelForSequenceClassification,
    HeadType.SPAN: AutoModelForQuestionAnswering,
    HeadType.MASKED_LM: AutoModelForMaskedLM,
}
STUDENT_DIR = "student"
EXTRAS_FILE = "extras.safetensors"
STAGE_DONE = "stage_done.json"


class NonFiniteLossError(FloatingPointError):
    """A loss term became NaN or inf; the message names the term and the first step it happened."""


class CheckpointError(RuntimeError):
    """A checkpoint is missing, truncated or corrupted; the message names the file."""


# ---------------------------------------------------------------------------------------------
# Planning: everything that can be checked cheaply, before any model is loaded.
# ---------------------------------------------------------------------------------------------
@dataclass
class RunPlan:
    config: RunConfig  # resolved: canonical names, typed method parameters
    method: Method
    task: Task
    preset: StudentPreset | None

    @property
    def run_dir(self) -> Path:
        return Path(self.config.output) / f"{self.config.method}-{self.config.task}-{self.config.config_hash()}"


def plan_run(config: RunConfig) -> RunPlan:
    """Resolve names and parameters; raise ConfigError naming any bad value. Loads no model."""
    method_cls: type[Method] = METHODS.get(config.method)
    method = method_cls.from_overrides(config.method_params)
    task: Task = TASKS.get(config.task)
    if method_cls.requires_teacher and not config.teacher:
        raise ConfigError(f"method {method_cls.name!r} needs a teacher: give --teacher MODEL")
    preset = STUDENTS.get(config.student) if config.student in STUDENTS else None
    if preset is None and not _looks_like_model(config.student):
        STUDENTS.get(config.student)  # raises "unknown student preset ... did you mean"
    if preset is not None and preset.from_teacher and not config.teacher:
        raise ConfigError(f"student preset {preset.name!r} is derived from the teacher: give --teacher MODEL")
    if preset is not None and config.student_init == "pretrained":
        raise ConfigError(f"student_init=pretrained needs a checkpoint, but {config.student!r} is a shape preset")
    if config.teacher and Path(config.teacher).exists() and not (Path(config.teacher) / "config.json").is_file():
        raise ConfigError(f"teacher folder {config.teacher!r} has no config.json (not a Hugging Face model folder)")
    resolved = replace(
        config,
        method=method_cls.name,
        task=task.spec.name,
        method_params=method.params_dict(),
    )
    return RunPlan(resolved, method, task, preset)


def check_model_paths_exist(config: RunConfig) -> None:
    """Raise ConfigError for a student, teacher or tokenizer written as a path that does not exist.

    Not part of :func:`plan_run`: a sweep plans its dependent runs before the runs that produce
    their models exist. A name written as a path (absolute, ``./``, ``../``, ``~``) is never a Hub id.
    """
    for role, source in (("student", config.student), ("teacher", config.teacher), ("tokenizer", config.tokenizer)):
        if source and source.startswith(("/", "./", "../", "~")) and not Path(source).expanduser().exists():
            raise ConfigError(f"{role} folder {source!r} does not exist")


def _looks_like_model(name: str) -> bool:
    """A folder, or something shaped like a Hub id (``org/name`` or a bare known model name)."""
    return Path(name).exists() or "/" in name or name.startswith(("bert-", "distilbert-", "roberta-"))


# ---------------------------------------------------------------------------------------------
# Models
# ---------------------------------------------------------------------------------------------
def head_kwargs(spec: TaskSpec, head: HeadType) -> dict[str, Any]:
    if head in (HeadType.CLASSIFICATION, HeadType.REGRESSION):
        labels = spec.label_names if head is HeadType.CLASSIFICATION else ("score",)
        return {
            "num_labels": spec.num_labels,
            "id2label": dict(enumerate(labels)),
            "label2id": {name: i for i, name in enumerate(labels)},
            "problem_type": "regression" if head is HeadType.REGRESSION else "single_label_classification",
        }
    return {}


def load_model(name: str, head: HeadType, spec: TaskSpec, *, trust_remote_code: bool, role: str) -> PreTrainedModel:
    kwargs = head_kwargs(spec, head) if role == "student" else {}
    try:
        model = HEAD_CLASSES[head].from_pretrained(name, trust_remote_code=trust_remote_code, **kwargs)
    except SafetensorError as error:
        raise CheckpointError(f"{role} checkpoint {name!r} is corrupted or truncated ({error}); "
                              "re-create or re-download it") from None
    except (OSError, ValueError) as error:  # ValueError: unknown architecture, remote code refused, ...
        hint = ("; it ships its own Python code, which kdbench does not run unless you review it and pass "
                "trust_remote_code=true" if "trust_remote_code" in str(error) else "")
        raise ConfigError(f"{role} {name!r} cannot be loaded: {str(error).splitlines()[0]}{hint}") from None
    return model


def teacher_label_order(teacher: PreTrainedModel, spec: TaskSpec) -> list[int] | None:
    """Index permutation putting the teacher's logits in the task's label order (by label NAME).

    ``None`` when the orders already agree. A teacher whose labels are not the task's is an error:
    distilling logits whose classes mean something else would silently produce garbage.
    """
    if spec.head is not HeadType.CLASSIFICATION:
        return None
    id2label = {int(k): str(v) for k, v in teacher.config.id2label.items()}
    teacher_names = [id2label[i] for i in range(len(id2label))]
    wanted = list(spec.label_names or ())
    if sorted(teacher_names) != sorted(wanted):
        raise ConfigError(
            f"teacher labels {teacher_names} are not the labels of task {spec.name!r} {wanted}; "
            f"fine-tune the teacher on {spec.name} first (kdbench run finetune --task {spec.name} --student MODEL)"
        )
    order = [teacher_names.index(name) for name in wanted]
    return None if order == list(range(len(order))) else order


class DistillationModule(nn.Module):
    """What the Trainer optimises and checkpoints: the student plus the method's extra modules."""

    def __init__(self, student: PreTrainedModel, extras: nn.ModuleDict):
        super().__init__()
        self.student = student
        self.extras = extras

    def forward(self, **inputs: Any) -> Any:
        return self.student(**inputs)


# ---------------------------------------------------------------------------------------------
# Checkpoint I/O (safetensors only)
# ---------------------------------------------------------------------------------------------
def save_module(module: DistillationModule, folder: Path, tokenizer: Any | None = None) -> None:
    folder.mkdir(parents=True, exist_ok=True)
    module.student.save_pretrained(folder / STUDENT_DIR)
    if tokenizer is not None:
        tokenizer.save_pretrained(folder / STUDENT_DIR)
    extras = {k: v.detach().contiguous() for k, v in module.extras.state_dict().items()}
    save_file(extras, str(folder / EXTRAS_FILE), metadata={"format": "pt"})


def load_module(module: DistillationModule, folder: Path) -> None:
    weights = folder / STUDENT_DIR / "model.safetensors"
    extras_path = folder / EXTRAS_FILE
    for path in (weights, extras_path):
        if not path.is_file():
            raise CheckpointError(f"checkpoint {folder} is incomplete: {path.name} is missing")
    try:
        state = load_file(str(weights))
        extras = load_file(str(extras_path))
    except (SafetensorError, OSError, ValueError) as error:
        raise CheckpointError(f"checkpoint file in {folder} is corrupted or truncated: {error}") from None
    missing, unexpected = module.student.load_state_dict(state, strict=False)
    tied = _tied_keys(module.student)
    missing = [key for key in missing if key not in tied]
    if missing or unexpected:
        raise CheckpointError(f"checkpoint {weights} does not fit the student: missing {missing[:5]}, "
                              f"unexpected {list(unexpected)[:5]}")
    module.student.tie_weights()
    module.extras.load_state_dict(extras)


def _tied_keys(model: PreTrainedModel) -> set[str]:
    tied = getattr(model, "_tied_weights_keys", None) or {}
    keys = set(tied.keys()) if isinstance(tied, dict) else set(tied)
    # Tied keys are declared relative to the model; the state dict names them in full.
    return {key for key in model.state_dict() if any(key.endswith(t) for t in keys)}


def last_complete_checkpoint(stage_dir: Path) -> str | None:
    """The newest ``checkpoint-N`` that was completely written, or None.

    Trainer writes a checkpoint's files in place and ``trainer_state.json`` last, so a process
    killed while saving leaves a folder without a readable ``trainer_state.json``: such folders are
    removed (the caller holds the run lock) and the previous complete checkpoint is used.
    """
    if not Path(stage_dir).is_dir():
        return None
    while (latest := get_last_checkpoint(str(stage_dir))) is not None:
        folder = Path(latest)
        try:
            json.loads((folder / "trainer_state.json").read_text())
            complete = (folder / STUDENT_DIR / "model.safetensors").is_file() and (folder / EXTRAS_FILE).is_file()
        except (OSError, ValueError):
            complete = False
        if complete:
            return latest
        print(f"[kdbench] removing incomplete checkpoint {folder} (interrupted while saving)", flush=True)
        shutil.rmtree(folder)
    return None


# ---------------------------------------------------------------------------------------------
# Evaluation
# ---------------------------------------------------------------------------------------------
def model_inputs(batch: dict[str, Any]) -> dict[str, Tensor]:
    return {key: batch[key] for key in MODEL_INPUTS if key in batch}


@torch.no_grad()
def predict(model: PreTrainedModel, split: EncodedSplit, tokenizer: Any, batch_size: int) -> dict[str, np.ndarray]:
    """Raw outputs of ``model`` on ``split`` (``logits`` or ``start_logits``/``end_logits``).

    Span logits of batches with different lengths are right-padded with -10000 to one width.
    """
    was_training = model.training
    model.eval()
    device = next(model.parameters()).device
    columns = [c for c in MODEL_INPUTS if c in split.features.column_names]
    collate = DataCollatorWithPadding(tokenizer)
    features = split.features.select_columns(columns)
    outputs: dict[str, list[np.ndarray]] = {}
    for start in range(0, len(features), batch_size):
        rows = [features[i] for i in range(start, min(start + batch_size, len(features)))]
        batch = {k: v.to(device) for k, v in collate(rows).items()}
        result = model(**batch)
        for name in ("logits", "start_logits", "end_logits"):
            value = getattr(result, name, None)
            if value is not None:
                outputs.setdefault(name, []).append(value.float().cpu().numpy())
    model.train(was_training)
    merged = {}
    for name, parts in outputs.items():
        if parts[0].ndim == 2 and name != "logits":
            width = max(p.shape[1] for p in parts)
            parts = [np.pad(p, ((0, 0), (0, width - p.shape[1])), constant_values=-10000.0) for p in parts]
        merged[name] = np.concatenate(parts, axis=0)
    return merged


def evaluate_student(model: PreTrainedModel, task: Task, splits: list[EncodedSplit], tokenizer: Any,
                     batch_size: int) -> dict[str, float]:
    metrics: dict[str, float] = {}
    for split in splits:
        metrics.update(task.score(split, predict(model, split, tokenizer, batch_size)))
    return metrics


# ---------------------------------------------------------------------------------------------
# Trainer
# ---------------------------------------------------------------------------------------------
FUSED_ADAMW_DEVICES = ("cpu", "cuda")


def build_adamw(param_groups: Any, lr: float, weight_decay: float = 0.0) -> torch.optim.AdamW:
    """AdamW (β 0.9/0.999, ε 1e-8) as every kdbench loop builds it: the engine, and the floor and
    TextBrewer loops of ``kdbench bench``, so that a speed ratio never compares two optimisers.

    ``param_groups`` is a list of parameters or of torch parameter-group dicts. The fused kernel is
    used when every parameter is a floating-point tensor on a device that has one (CPU, CUDA): it
    applies the same update as torch's default per-tensor loop in one pass over all tensors (for a
    17M-parameter student on one CPU thread, 19 ms a step instead of 163 ms).
    """
    params = [p for group in param_groups for p in (group["params"] if isinstance(group, dict) else [group])]
    fused = bool(params) and all(p.is_floating_point() and p.device.type in FUSED_ADAMW_DEVICES for p in params)
    return torch.optim.AdamW(param_groups, lr=lr, betas=(0.9, 0.999), eps=1e-8, weight_decay=weight_decay,
                             fused=True if fused else None)


class DistillationTrainer(Trainer):
    """``Trainer`` whose loss is a method stage's loss over captured teacher/student features."""

    def __init__(self, *args: Any, stage: Stage, teacher: PreTrainedModel | None, teacher_order: list[int] | None,
                 task: Task, eval_splits: list[EncodedSplit], eval_tokenizer: Any,
                 cached_teacher: CachedTeacher | None = None, **kwargs: Any):
        super().__init__(*args, **kwargs)
        self.stage = stage
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
        terms = self.stage.loss(inputs, student_features, teacher_features)
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
            logs.update({f"loss/{name}": value for name, value in self.last_loss_terms.items()})
            self._term_sums.clear()
            self._term_steps = 0
            if self.optimizer is not None and len({g["name"] for g in self.optimizer.param_groups}) > 1:
                for group in self.optimizer.param_groups:  # per-group rates (e.g. progressive transfer)
                    logs[f"lr/{group['name']}"] = group["lr"]
        logs.setdefault("stage", self.stage.name)  # type: ignore[arg-type]
        super().log(logs, start_time)

    # -- optimiser -------------------------------------------------------------------------
    def create_optimizer(self, model: nn.Module | None = None) -> torch.optim.Optimizer:
        if self.optimizer is None:
            module = self.model
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
            if not param_groups:
                raise ConfigError(f"stage {self.stage.name!r} has no trainable parameters")
            self.optimizer = build_adamw(param_groups, lr=self.args.learning_rate)
        return self.optimizer

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


# ---------------------------------------------------------------------------------------------
# Running
# ---------------------------------------------------------------------------------------------
@dataclass
class StageResult:
    name: str
    steps: int
    seconds: float
    metrics: dict[str, float] = field(default_factory=dict)
    resumed_from: str | None = None
    skipped: bool = False
    final_loss_terms: dict[str, float] = field(default_factory=dict)  # per-term means, last logged window


def resolved_precision(config: RunConfig) -> str:
    precision = config.train.precision
    if precision == "auto":
        precision = "bf16" if torch.cuda.is_available() and torch.cuda.is_bf16_supported() else "fp32"
    return precision


def training_arguments(config: RunConfig, stage: Stage, folder: Path, main_metric: str, has_eval: bool) -> TrainingArguments:
    train = config.train
    precision = resolved_precision(config)
    evaluate_now = has_eval and stage.select_best
    strategy = "steps" if train.eval_steps else "epoch"
    return TrainingArguments(
        output_dir=str(folder),
        num_train_epochs=stage.epochs if stage.epochs is not None else train.epochs,
        max_steps=train.max_steps,
        per_device_train_batch_size=train.batch_size,
        per_device_eval_batch_size=train.eval_batch_size,
        gradient_accumulation_steps=train.grad_accum,
        learning_rate=stage.lr if stage.lr is not None else train.lr,
        weight_decay=train.weight_decay,
        warmup_steps=train.warmup_ratio,
        lr_scheduler_type="linear",
        eval_strategy=strategy if evaluate_now else "no",
        save_strategy=strategy,
        eval_steps=train.eval_steps,
        save_steps=train.eval_steps,
        save_total_limit=train.save_total_limit,
        load_best_model_at_end=evaluate_now,
        metric_for_best_model=f"eval_{main_metric}" if evaluate_now else None,
        greater_is_better=True,
        logging_steps=train.logging_steps,
        logging_nan_inf_filter=False,
        seed=train.seed,
        bf16=precision == "bf16",
        fp16=precision == "fp16",
        report_to="none",
        remove_unused_columns=False,
        dataloader_num_workers=train.dataloader_workers,
        dataloader_pin_memory=torch.cuda.is_available(),
        train_sampling_strategy="group_by_length" if train.group_by_length else "random",
        disable_tqdm=False,
        save_only_model=False,
    )


def run_experiment(config: RunConfig, callbacks: Sequence[TrainerCallback] = ()) -> Path:
    """Run (or resume, or skip) one experiment; returns its run folder.

    ``callbacks`` are added to every stage's Trainer (e.g. Optuna pruning, graceful preemption).

    Writes ``result.json`` with status ``completed``, or ``failed`` with the error, and re-raises
    on failure.
    """
    plan = plan_run(config)
    check_model_paths_exist(config)
    if not is_main_process():  # the other ranks of a multi-GPU job train alongside rank 0 and write nothing
        return _run_planned(plan, callbacks)
    with run_lock(plan.run_dir):  # one writer per run folder, released by the kernel if killed
        return _run_planned(plan, callbacks)


def is_main_process() -> bool:
    """True for a plain process and for rank 0 of a ``torch.distributed`` job: the one that writes
    the run folder (config, checkpoints' summaries, the final model, the record)."""
    return int(os.environ.get("RANK", "0")) == 0


def training_device() -> torch.device:
    """This process's device: its own GPU (``LOCAL_RANK``) in a multi-GPU job, else the GPU or CPU."""
    if torch.cuda.is_available():
        return torch.device("cuda", int(os.environ.get("LOCAL_RANK", "0")))
    return torch.device("cpu")


def _run_planned(plan: RunPlan, callbacks: Sequence[TrainerCallback]) -> Path:
    run_dir = plan.run_dir
    record_path = run_dir / RESULT_FILE
    if record_path.is_file():
        previous = read_record(record_path)
        if previous["status"] == "completed":
            log.info("run %s already completed; nothing to do", run_dir)
            return run_dir
    writer = is_main_process()
    run_dir.mkdir(parents=True, exist_ok=True)
    if writer:
        save_config(plan.config, run_dir / "config.yaml")
    started = time.perf_counter()
    record: dict[str, Any] = {
        "schema_version": SCHEMA_VERSION,
        "method": plan.config.method,
        "task": plan.config.task,
        "teacher": plan.config.teacher,
        "student": plan.config.student,
        "label": plan.config.label,
        "config": plan.config.to_dict(),
        "seed": plan.config.train.seed,
        "versions": library_versions(),
        "run_dir": str(run_dir),
        "metrics": {},
        "created_at": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
    }
    try:
        outcome = _execute(plan, run_dir, callbacks)
        record.update(outcome, status="completed", error=None)
    except BaseException as error:
        record.update(status="failed", error=f"{type(error).__name__}: {error}",
                      traceback=traceback.format_exc(limit=20), train_seconds=round(time.perf_counter() - started, 2))
        if writer:
            write_json_atomic(record_path, record)
        raise
    record["train_seconds"] = round(time.perf_counter() - started, 2)
    if writer:
        write_json_atomic(record_path, record)
    return run_dir


def _execute(plan: RunPlan, run_dir: Path, callbacks: Sequence[TrainerCallback] = ()) -> dict[str, Any]:
    config, method, task = plan.config, plan.method, plan.task
    set_seed(config.train.seed)
    device = training_device()

    # Tokenizer and data first: a missing or malformed file fails here, before any model loads.
    tokenizer_source = config.tokenizer or config.teacher or config.student
    if plan.preset is not None and not (config.tokenizer or config.teacher):
        raise ConfigError(f"student preset {config.student!r} has no tokenizer of its own: give --teacher or tokenizer=NAME")
    tokenizer = AutoTokenizer.from_pretrained(tokenizer_source, trust_remote_code=config.trust_remote_code)
    if plan.preset is None and tokenizer_source != config.student:
        check_student_tokenizer(config.student, tokenizer_source, tokenizer, config.trust_remote_code)
    train_split = task.encode_train(tokenizer, config)
    eval_splits = task.encode_eval(tokenizer, config)
    if len(train_split) == 0:
        raise ConfigError(f"task {task.spec.name!r}: the training split is empty")

    spec = task.spec
    teacher = None
    teacher_order = None
    if config.teacher:
        teacher = load_model(config.teacher, spec.head, spec, trust_remote_code=config.trust_remote_code, role="teacher")
        teacher.to(device).eval()
        for parameter in teacher.parameters():
            parameter.requires_grad_(False)
        if method.requires_teacher:
            teacher_order = teacher_label_order(teacher, spec)
    student = build_student(plan, teacher, tokenizer)
    student.to(device)
    if config.train.compile:  # compiles forward in place: attribute access and capture hooks keep working
        for model in (student, teacher):
            if model is not None:
                model.compile()

    context = MethodContext(task=spec, student_config=student.config,
                            teacher_config=teacher.config if teacher is not None else None, run=config)
    method.validate(context)
    method.initialize_student(student, teacher, context)
    extras = method.extra_modules(context).to(device)
    stages = method.stages(context)
    module = DistillationModule(student, extras)

    columns = [c for c in (*MODEL_INPUTS, *TRAINING_TARGETS) if c in train_split.features.column_names]
    train_dataset = add_index_columns(train_split.features.select_columns(columns))
    teacher_cache = None
    if teacher is not None and method.requires_teacher:
        teacher_cache = TeacherCacheSession.from_run(config, teacher, train_dataset, DataCollatorWithPadding(tokenizer),
                                                     device, spec.head.value, resolved_precision(config))
    stage_results = []
    for index, stage in enumerate(stages):
        stage_results.append(_run_stage(index, stage, module, teacher, teacher_order, task, train_dataset,
                                        eval_splits, tokenizer, config, run_dir, callbacks, teacher_cache))

    metrics = evaluate_student(student, task, eval_splits, tokenizer, config.train.eval_batch_size) if eval_splits else {}
    model_dir = run_dir / "model"
    if is_main_process():
        student.save_pretrained(model_dir)
        tokenizer.save_pretrained(model_dir)
    return {
        "metrics": metrics,
        "student_params": count_parameters(student),
        "teacher_params": count_parameters(teacher) if teacher is not None else None,
        "stages": [stage.__dict__ for stage in stage_results],
        "data": {"train_rows": len(train_split), "train_skipped_rows": train_split.skipped_rows,
                 **{f"{s.name}_rows": len(s) for s in eval_splits},
                 **{f"{s.name}_skipped_rows": s.skipped_rows for s in eval_splits}},
        "model_dir": str(model_dir),
        "teacher_cache": teacher_cache.summary() if teacher_cache is not None else None,
    }


TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "vocab.txt", "vocab.json", "spiece.model",
                   "sentencepiece.bpe.model")


def check_student_tokenizer(student: str, source: str, tokenizer: Any, trust_remote_code: bool) -> None:
    """A student checkpoint that ships its own tokenizer must use the run's (teacher's) vocabulary:
    the same text must give the same ids, or the student's embeddings read the wrong tokens.
    Checked for local folders that hold tokenizer files (a Hub id is not fetched just for this)."""
    folder = Path(student)
    if not folder.is_dir() or not any((folder / name).is_file() for name in TOKENIZER_FILES):
        return
    try:
        own = AutoTokenizer.from_pretrained(student, trust_remote_code=trust_remote_code)
    except (OSError, ValueError):  # no tokenizer of its own: it is trained with the run's
        return
    ours, theirs = tokenizer.get_vocab(), own.get_vocab()
    if ours == theirs:
        return
    differing = sorted({token for token in ours.keys() | theirs.keys() if ours.get(token) != theirs.get(token)},
                       key=lambda token: min(ours.get(token, 1 << 30), theirs.get(token, 1 << 30)))[:3]
    examples = ", ".join(f"{token!r}: {source} id {ours.get(token)}, student id {theirs.get(token)}"
                         for token in differing)
    raise ConfigError(f"student {student!r} has a different tokenizer than {source!r} ({len(theirs)} vs "
                      f"{len(ours)} tokens; e.g. {examples}); teacher and student must share one vocabulary")


def build_student(plan: RunPlan, teacher: PreTrainedModel | None, tokenizer: Any) -> PreTrainedModel:
    config, spec = plan.config, plan.task.spec
    head_class = HEAD_CLASSES[spec.head]
    if plan.preset is None:
        if config.student_init == "teacher":
            raise ConfigError("student_init=teacher copies teacher layers into a preset shape; "
                              f"{config.student!r} is a checkpoint (use student_init=auto or pretrained)")
        student = load_model(config.student, spec.head, spec, trust_remote_code=config.trust_remote_code, role="student")
    else:
        model_config = plan.preset.build_config(teacher.config if teacher is not None else None)
        for key, value in head_kwargs(spec, spec.head).items():
            setattr(model_config, key, value)
        model_config._attn_implementation = "sdpa"
        student = head_class.from_config(model_config)
        init = config.student_init
        if init == "auto":
            init = plan.method.default_student_init if teacher is not None else "random"
        if init == "teacher":
            if teacher is None:
                raise ConfigError("student_init=teacher needs --teacher")
            choice = config.student_layers if config.student_layers != "auto" else plan.method.default_student_layers
            layers = resolve_teacher_layers(choice, teacher.config.num_hidden_layers, model_config.num_hidden_layers)
            copy_teacher_weights(student, teacher, layers)
            log.info("student initialised from teacher layers %s", layers)
    vocab = len(tokenizer)
    if student.config.vocab_size < vocab:
        raise ConfigError(f"student vocabulary ({student.config.vocab_size}) is smaller than the tokenizer's ({vocab})")
    if teacher is not None and teacher.config.vocab_size != student.config.vocab_size:
        raise ConfigError(f"teacher and student vocabularies differ ({teacher.config.vocab_size} vs "
                          f"{student.config.vocab_size}): distillation needs one tokenizer for both")
    return student


def _run_stage(index: int, stage: Stage, module: DistillationModule, teacher: PreTrainedModel | None,
               teacher_order: list[int] | None, task: Task, train_dataset: Any, eval_splits: list[EncodedSplit],
               tokenizer: Any, config: RunConfig, run_dir: Path,
               callbacks: Sequence[TrainerCallback] = (),
               teacher_cache: TeacherCacheSession | None = None) -> StageResult:
    folder = run_dir / "stages" / f"{index}-{stage.name}"
    done = folder / STAGE_DONE
    if done.is_file():
        load_module(module, folder / "final")
        summary = json.loads(done.read_text())
        print(f"[kdbench] stage {stage.name} already finished; loaded its final weights", flush=True)
        return StageResult(**{**summary, "skipped": True})
    if stage.uses_teacher and teacher is None:
        raise ConfigError(f"stage {stage.name!r} needs a teacher")
    world = int(os.environ.get("WORLD_SIZE", "1"))
    print(f"[kdbench] stage {index}: {stage.name} (lr {stage.lr or config.train.lr}, "
          f"epochs {stage.epochs or config.train.epochs}"
          f"{f', {world} processes' if world > 1 else ''})", flush=True)
    checkpoint = last_complete_checkpoint(folder)
    args = training_arguments(config, stage, folder, task.spec.main_metric, has_eval=bool(eval_splits))
    trainer = DistillationTrainer(
        model=module,
        args=args,
        train_dataset=train_dataset,
        # Trainer insists on an eval dataset when it evaluates; our evaluate() scores eval_splits itself.
        eval_dataset=eval_splits[0].features if eval_splits else None,
        data_collator=DataCollatorWithPadding(tokenizer),
        processing_class=tokenizer,
        callbacks=[ResumeLogger(checkpoint), *callbacks],
        stage=stage,
        teacher=teacher,
        teacher_order=teacher_order,
        task=task,
        eval_splits=eval_splits,
        eval_tokenizer=tokenizer,
        cached_teacher=teacher_cache.for_stage(stage) if teacher_cache is not None and stage.uses_teacher else None,
    )
    started = time.perf_counter()
    try:
        trainer.train(resume_from_checkpoint=checkpoint)
    except (RuntimeError, MemoryError) as error:
        if not is_out_of_memory(error):
            raise
        raise TrainingOutOfMemoryError(stage.name, config.train.batch_size, config.train.grad_accum,
                                       str(next(module.parameters()).device), str(error).splitlines()[0]) from error
    finally:
        trainer.release()
    seconds = time.perf_counter() - started
    metrics = {}
    if trainer.state.best_metric is not None:
        metrics[args.metric_for_best_model] = trainer.state.best_metric
    result = StageResult(stage.name, trainer.state.global_step, round(seconds, 2), metrics, checkpoint,
                         final_loss_terms={name: round(value, 6) for name, value in trainer.last_loss_terms.items()})
    if is_main_process():
        save_module(module, folder / "final", tokenizer)
        write_json_atomic(done, result.__dict__)
    return result

