"""Running an experiment: the run folder, its lock and record, and the stages in order.

A run's folder is keyed by the hash of its resolved config and of its inputs' content
(:mod:`kdbench.fingerprint`): running the same config on the same inputs again finds
the completed record and trains nothing; running it after a crash resumes from the last
checkpoint of the unfinished stage.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import os
import shutil
import time
import traceback
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from transformers import DataCollatorWithPadding, PreTrainedModel, TrainerCallback
from transformers.trainer_callback import ProgressCallback

from kdbench.cache import TeacherCacheSession
from kdbench.config import ConfigError, RunConfig, save_config
from kdbench.disk import STAGE_FINAL, STAGES_DIR, folder_bytes, human_bytes, prune_stage
from kdbench.engine.checkpoints import last_complete_checkpoint, load_module, save_module
from kdbench.engine.evaluation import evaluate_student
from kdbench.engine.models import DistillationModule, training_device
from kdbench.engine.planning import RunPlan, plan_run
from kdbench.engine.preflight import preflight
from kdbench.engine.resume import RunClock, StageClock, interrupted_status
from kdbench.engine.run_log import StageProgress, TimedCheckpoints, run_log_file
from kdbench.engine.setup import prepare_run
from kdbench.engine.trainer import (
    DistillationTrainer,
    ResumeLogger,
    resolved_precision,
    stage_optimization,
    training_arguments,
)
from kdbench.errors import DataError, TrainingOutOfMemoryError, is_out_of_memory
from kdbench.fingerprint import content_digest, local_models_read
from kdbench.loss_log import last_epoch_loss_terms
from kdbench.method import Stage
from kdbench.model_card import write_model_card
from kdbench.records import (INTERRUPTED, RESULT_FILE, SCHEMA_VERSION, compute_environment, kdbench_revision,
                             library_versions, read_record, run_lock, write_json_atomic)
from kdbench.registry import UnknownNameError
from kdbench.students import count_parameters
from kdbench.task import EncodedSplit, Task
from kdbench.tracking import RunTracking

log = logging.getLogger("kdbench")


STAGE_DONE = "stage_done.json"
# Errors in what the user gave (data, config, names): a run that never trained leaves no folder.
USER_INPUT_ERRORS = (ConfigError, DataError, UnknownNameError)


@dataclass
class StageResult:
    name: str
    steps: int
    seconds: float
    metrics: dict[str, float] = field(default_factory=dict)
    resumed_from: str | None = None
    skipped: bool = False
    # Per-term means of the last logged window: with a step count that is not a multiple of
    # logging_steps, a short tail of the epoch, which reads low under length-grouped batches.
    final_loss_terms: dict[str, float] = field(default_factory=dict)
    # Per-term means over the last epoch (the second half of a stage under two epochs), and the steps they cover.
    last_epoch_loss_terms: dict[str, float] = field(default_factory=dict)
    last_epoch_loss_steps: int = 0
    optimization: dict[str, Any] = field(default_factory=dict)  # resolved values and where each came from


def run_experiment(config: RunConfig, callbacks: Sequence[TrainerCallback] = ()) -> Path:
    """Run (or resume, or skip) one experiment; returns its run folder.

    ``callbacks`` are added to every stage's Trainer (e.g. Optuna pruning, graceful preemption).

    Writes ``result.json`` with status ``completed``, or ``failed`` with the error, and re-raises
    on failure.
    """
    plan = plan_run(config)
    preflight(plan)  # model configs, heads, lengths, the method's stages: before any run folder exists
    fresh = not plan.run_dir.exists()
    if not is_main_process():  # the other ranks of a multi-GPU job train alongside rank 0 and write nothing
        return _run_planned(plan, callbacks, fresh)
    # One writer per run folder (the lock is released by the kernel if killed); its log in train.log.
    with run_lock(plan.run_dir), run_log_file(plan.run_dir):
        return _run_planned(plan, callbacks, fresh)


def is_main_process() -> bool:
    """True for a plain process and for rank 0 of a ``torch.distributed`` job: the one that writes
    the run folder (config, checkpoints' summaries, the final model, the record)."""
    return int(os.environ.get("RANK", "0")) == 0


def _run_planned(plan: RunPlan, callbacks: Sequence[TrainerCallback], fresh: bool = False) -> Path:
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
    revision, machine = kdbench_revision(), compute_environment()
    # train_seconds add up over attempts (requeue, resume); each attempt names its code and machine
    clock = RunClock(run_dir, writer, provenance={"kdbench_revision": revision, "machine": machine})
    mixed = clock.mixed_provenance()
    if mixed:
        log.warning("run %s: its attempts ran at other kdbench revisions or on other machines (%s); the record "
                    "lists each in attempt_provenance", run_dir,
                    "; ".join(f"attempt {a['attempt']}: {(a['kdbench_revision'] or {}).get('commit', '?')!s:.7}, "
                              f"{(a['machine'] or {}).get('cpu_capability')}" for a in mixed))
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
        "machine": machine,
        # where this run trained and the precision `auto` became there (bf16 on a GPU that has it, else fp32)
        "training": {"device": str(training_device()), "precision": resolved_precision(plan.config)},
        "kdbench_revision": revision,
        "inputs": plan.inputs,
        # the content of every local model read (a teacher run's folder is named by its config only)
        # (a student built with new weights reads none of its checkpoint's: student_init=random)
        "weights_sha256": local_models_read({"teacher": plan.config.teacher,
                                             "student": None if plan.config.student_init == "random"
                                             else plan.config.student,
                                             "student_init_from": plan.config.student_init_from}),
        "run_dir": str(run_dir),
        "metrics": {},
        "created_at": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
    }
    if mixed:  # the record's revision and machine are this attempt's; the earlier ones differ
        record["attempt_provenance"] = mixed
    try:
        outcome = _execute(plan, run_dir, callbacks, clock)
        record.update(outcome, status="completed", error=None)
        if writer:
            write_model_card(run_dir / "model", record)
    except KeyboardInterrupt:  # the user stopped it: not a failure of the method; re-running resumes
        clock.save(ended=INTERRUPTED)
        record.update(status=INTERRUPTED, error="interrupted (KeyboardInterrupt)",
                      train_seconds=clock.total_seconds(), attempts=clock.count)
        if writer:
            write_json_atomic(record_path, record)
            log.warning("run %s interrupted; run the same command again to resume", run_dir)
        raise
    except USER_INPUT_ERRORS as error:
        if writer and fresh and not any(run_dir.rglob("checkpoint-*")):
            # Bad data or config found after planning: nothing was trained, so nothing is kept.
            shutil.rmtree(run_dir, ignore_errors=True)
            raise
        clock.save(ended="failed")
        record.update(status="failed", error=f"{type(error).__name__}: {error}", input_error=True,
                      train_seconds=clock.total_seconds(), attempts=clock.count)
        if writer:
            write_json_atomic(record_path, record)
        raise
    except BaseException as error:
        status = interrupted_status(error)  # requeued by submitit, or failed
        clock.save(ended=status)
        record.update(status=status, error=f"{type(error).__name__}: {error}", traceback=traceback.format_exc(limit=20),
                      train_seconds=clock.total_seconds(), attempts=clock.count)
        if writer:
            write_json_atomic(record_path, record)
        raise
    clock.save(ended="completed")
    record.update(train_seconds=clock.total_seconds(), attempts=clock.count)
    if writer:
        if (run_dir / "model").is_dir():
            record["weights_sha256"]["model"] = content_digest(run_dir / "model")["sha256"]
        record["disk_bytes"] = folder_bytes(run_dir)
        write_json_atomic(record_path, record)
        print(f"[kdbench] run folder {run_dir} holds {human_bytes(record['disk_bytes'])} "
              f"(kdbench prune {run_dir.parent} removes finished runs' checkpoints)", flush=True)
    return run_dir


def _execute(plan: RunPlan, run_dir: Path, callbacks: Sequence[TrainerCallback] = (),
             clock: RunClock | None = None) -> dict[str, Any]:
    with RunTracking(plan.config, run_dir, writer=is_main_process()) as tracking:
        outcome = _execute_stages(plan, run_dir, callbacks, clock, tracking)
        tracking.log_result(outcome)
        return outcome


def _execute_stages(plan: RunPlan, run_dir: Path, callbacks: Sequence[TrainerCallback], clock: RunClock | None,
                    tracking: RunTracking) -> dict[str, Any]:
    config, task = plan.config, plan.task
    prepared = prepare_run(plan, training_device())
    data, teacher, distillation = prepared.data, prepared.teacher, prepared.distillation
    student = distillation.module.student
    print(f"[kdbench] student initialisation: {distillation.student_init.describe()}", flush=True)
    stage_results = []
    for index, stage in enumerate(distillation.stages):
        stage_results.append(_run_stage(index, stage, distillation.module, teacher, distillation.teacher_order, task,
                                        prepared.train_dataset, data.eval_splits, data.tokenizer, config, run_dir,
                                        [*callbacks, *tracking.stage_callbacks(index, stage.name)],
                                        prepared.teacher_cache, clock))

    eval_splits = data.eval_splits
    metrics = evaluate_student(student, task, eval_splits, data.tokenizer, config.train.eval_batch_size) if eval_splits else {}
    model_dir = run_dir / "model"
    if is_main_process():
        student.save_pretrained(model_dir)
        data.tokenizer.save_pretrained(model_dir)
    return {
        "metrics": metrics,
        "student_params": count_parameters(student),
        "teacher_params": count_parameters(teacher) if teacher is not None else None,
        "stages": [stage.__dict__ for stage in stage_results],
        "data": {"train_rows": len(data.train_split), "train_skipped_rows": data.train_split.skipped_rows,
                 **{f"{s.name}_rows": len(s) for s in eval_splits},
                 **{f"{s.name}_skipped_rows": s.skipped_rows for s in eval_splits}},
        "model_dir": str(model_dir),
        "student_init": dataclasses.asdict(distillation.student_init),
        "teacher_cache": prepared.teacher_cache.summary() if prepared.teacher_cache is not None else None,
    }


def _run_stage(index: int, stage: Stage, module: DistillationModule, teacher: PreTrainedModel | None,
               teacher_order: list[int] | None, task: Task, train_dataset: Any, eval_splits: list[EncodedSplit],
               tokenizer: Any, config: RunConfig, run_dir: Path,
               callbacks: Sequence[TrainerCallback] = (),
               teacher_cache: TeacherCacheSession | None = None, clock: RunClock | None = None) -> StageResult:
    folder = run_dir / STAGES_DIR / f"{index}-{stage.name}"
    done = folder / STAGE_DONE
    if done.is_file():
        load_module(module, folder / STAGE_FINAL)
        summary = json.loads(done.read_text())
        print(f"[kdbench] stage {stage.name} already finished; loaded its final weights", flush=True)
        return StageResult(**{**summary, "skipped": True})
    if stage.uses_teacher and teacher is None:
        raise ConfigError(f"stage {stage.name!r} needs a teacher")
    world = int(os.environ.get("WORLD_SIZE", "1"))
    optimization = stage_optimization(config, stage)
    print(f"[kdbench] stage {index}: {stage.name} ({optimization.optimizer} lr {optimization.lr:g}, "
          f"{optimization.schedule} schedule, epochs {optimization.epochs:g}"
          f"{f', {world} processes' if world > 1 else ''})", flush=True)
    checkpoint = last_complete_checkpoint(folder)
    stage_clock = StageClock(folder, checkpoint, clock, is_main_process())  # seconds go on from the checkpoint's
    selection_metric = config.train.select_metric or task.spec.main_metric
    args = training_arguments(config, stage, folder, selection_metric, has_eval=bool(eval_splits))
    progress = StageProgress(stage.name, run_dir, selection_metric if args.load_best_model_at_end else None,
                             show_bar=is_main_process())
    # The stage owns its cached teacher (a trainer may share one, as the bench's repeats do): closed below.
    cached_teacher = teacher_cache.for_stage(stage) if teacher_cache is not None and stage.uses_teacher else None
    trainer = DistillationTrainer(
        model=module,
        args=args,
        train_dataset=train_dataset,
        # Trainer insists on an eval dataset when it evaluates; our evaluate() scores eval_splits itself.
        eval_dataset=eval_splits[0].features if eval_splits else None,
        data_collator=DataCollatorWithPadding(tokenizer),
        processing_class=tokenizer,
        callbacks=[ResumeLogger(checkpoint), progress, TimedCheckpoints(config.train.checkpoint_minutes), stage_clock,
                   *callbacks],
        stage=stage,
        teacher=teacher,
        teacher_order=teacher_order,
        task=task,
        eval_splits=eval_splits,
        eval_tokenizer=tokenizer,
        cached_teacher=cached_teacher,
        optimization=optimization,
    )
    trainer.remove_callback(ProgressCallback)  # StageProgress shows the bar, with the loss terms
    try:
        trainer.train(resume_from_checkpoint=checkpoint)
    except (RuntimeError, MemoryError) as error:
        if not is_out_of_memory(error):
            raise
        raise TrainingOutOfMemoryError(stage.name, config.train.batch_size, config.train.grad_accum,
                                       str(next(module.parameters()).device), str(error).splitlines()[0]) from error
    finally:
        trainer.release()
        if cached_teacher is not None:
            cached_teacher.close()
    seconds = stage_clock.seconds()
    metrics = {}
    if trainer.state.best_metric is not None:
        metrics[args.metric_for_best_model] = trainer.state.best_metric
    last_epoch, last_epoch_steps = last_epoch_loss_terms(progress.terms_file.stage_lines(stage.name))
    result = StageResult(stage.name, trainer.state.global_step, round(seconds, 2), metrics, checkpoint,
                         final_loss_terms={name: round(value, 6) for name, value in trainer.last_loss_terms.items()},
                         last_epoch_loss_terms={name: round(value, 6) for name, value in last_epoch.items()},
                         last_epoch_loss_steps=last_epoch_steps, optimization=optimization.to_dict())
    if is_main_process():
        save_module(module, folder / STAGE_FINAL, tokenizer)
        write_json_atomic(done, result.__dict__)
        prune_stage(folder, config.train.keep_checkpoints)
    return result
