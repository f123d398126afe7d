"""``kdbench bench``: training throughput of every method against its floor, the cache and TextBrewer.

For each method stage, on the same batches in the same process:

- **engine**: examples/s of ``DistillationTrainer`` (the real engine: Trainer, collator,
  length-grouped sampler, the method's loss, optimiser and scheduler), teacher run live;
- **floor**: examples/s of the least a framework must do — teacher forward under ``no_grad``,
  student forward, the stage's loss, backward, gradient clipping, AdamW step — in a bare loop over
  the batches the engine consumed (already collated and on the device);
- **cached**: the engine again, reading teacher outputs from the on-disk cache (stages whose
  teacher features are small; the one-off teacher pass is reported separately).

Measurements are interleaved (engine, floor, cached, engine, floor, cached, ...) and summarised by
medians; ``ratio`` is the median of the paired engine-time/floor-time ratios. A TinyBERT-style job
(attention and hidden-state MSE on mapped layers, embeddings, soft cross-entropy on logits, one stage)
is also run with TextBrewer (``kdbench/textbrewer_job.py``) on the same batches, and
augmentation throughput (sentences/s of :class:`kdbench.augment.Augmenter` with a small MLM built from
a config) is measured. Results: ``bench-<device>-<time>.json`` and ``.md`` under ``--output``.

This module imports nothing heavy at import time (``kdbench --help`` stays fast).
"""

from __future__ import annotations

import argparse
import importlib.metadata
import platform
import statistics
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from kdbench.optimization import resolve_stage
from kdbench.records import cpu_model

DEFAULT_METHODS = ("finetune", "kd", "tinybert", "pkd", "distilbert", "mobilebert")


@dataclass
class BenchOptions:
    task: str = "sst2"
    teacher: str = ""
    student: str = "teacher-3l"
    methods: tuple[str, ...] = DEFAULT_METHODS
    steps: int = 20
    warmup: int = 3
    repeats: int = 3
    batch_size: int = 32
    max_seq_length: int = 64
    precision: str = "auto"
    compile: bool = False
    data_dir: str | None = None
    output: str = "results/benchmarks"
    textbrewer: bool = True
    augment: bool = True
    augment_sentences: int = 64
    profile: bool = False
    cache_budget_mb: float = 0.0  # train.teacher_cache_budget_mb: 0 caches logits only
    overrides: dict[str, str] = field(default_factory=dict)


def add_command(subparsers: Any) -> None:
    bench = subparsers.add_parser("bench", help="training-throughput benchmark: engine vs floor, cache, TextBrewer")
    bench.add_argument("--task", default="sst2")
    bench.add_argument("--teacher", required=True, help="fine-tuned teacher (Hub id or folder) for --task")
    bench.add_argument("--student", default="teacher-3l", help="student preset, Hub id or folder")
    bench.add_argument("--methods", default=",".join(DEFAULT_METHODS), help="comma-separated method names")
    bench.add_argument("--steps", type=int, default=20, help="timed steps per measurement")
    bench.add_argument("--warmup", type=int, default=3, help="untimed steps before them (at least 1)")
    bench.add_argument("--repeats", type=int, default=3, help="interleaved repetitions (medians are reported)")
    bench.add_argument("--batch-size", type=int, default=32)
    bench.add_argument("--max-seq-length", type=int, default=64)
    bench.add_argument("--precision", default="auto", choices=("auto", "fp32", "bf16", "fp16"))
    bench.add_argument("--compile", action="store_true", help="torch.compile student and teacher")
    bench.add_argument("--data-dir")
    bench.add_argument("--output", default="results/benchmarks")
    bench.add_argument("--no-textbrewer", action="store_true")
    bench.add_argument("--no-augment", action="store_true")
    bench.add_argument("--augment-sentences", type=int, default=64)
    bench.add_argument("--cache-budget-mb", type=float, default=0.0,
                       help="disk allowed for cached hidden states and attention maps (train.teacher_cache_budget_mb); "
                            "0 caches logits only, so stages with intermediate losses run the teacher live")
    bench.add_argument("--profile", action="store_true",
                       help="also profile one round of the TextBrewer comparison (torch.profiler op tables)")
    bench.add_argument("overrides", nargs="*", metavar="KEY=VALUE", help="run-config overrides for every method")
    workflow = bench.add_argument_group("workflow benchmark (--workflow): TinyBERT task distillation end to end, "
                                        "kdbench vs TextBrewer; see kdbench.bench_workflow")
    workflow.add_argument("--workflow", action="store_true",
                          help="time whole TinyBERT task-distillation runs instead of training steps; --teacher is "
                               "then TASK=FOLDER,TASK=FOLDER (one fine-tuned teacher per task)")
    workflow.add_argument("--tasks", default="rte,mrpc", help="workflow tasks, comma-separated")
    workflow.add_argument("--intermediate-epochs", type=int, default=20)
    workflow.add_argument("--prediction-epochs", type=int, default=3)
    workflow.add_argument("--max-train-samples", type=int, help="workflow: training rows per task (default: all)")
    workflow.add_argument("--max-eval-samples", type=int, help="workflow: dev rows per task (default: all)")
    workflow.add_argument("--workflow-jobs", default="kdbench,textbrewer,textbrewer-cache",
                          help="which jobs to time: kdbench, textbrewer (teacher live), textbrewer-cache")
    bench.set_defaults(handler=cmd_bench)


def cmd_bench(args: argparse.Namespace) -> int:
    from kdbench.config import ConfigError, parse_overrides

    if args.workflow:
        return cmd_workflow(args)

    options = BenchOptions(
        task=args.task, teacher=args.teacher, student=args.student,
        methods=tuple(m.strip() for m in args.methods.split(",") if m.strip()),
        steps=args.steps, warmup=args.warmup, repeats=args.repeats, batch_size=args.batch_size,
        max_seq_length=args.max_seq_length, precision=args.precision, compile=args.compile, data_dir=args.data_dir,
        output=args.output, textbrewer=not args.no_textbrewer, augment=not args.no_augment,
        augment_sentences=args.augment_sentences, profile=args.profile, cache_budget_mb=args.cache_budget_mb,
        overrides=parse_overrides(args.overrides),
    )
    for name in ("steps", "repeats", "batch_size", "augment_sentences"):
        if getattr(options, name) < 1:
            raise ConfigError(f"--{name.replace('_', '-')}: must be >= 1, got {getattr(options, name)!r}")
    if options.cache_budget_mb < 0:
        raise ConfigError(f"--cache-budget-mb: must be >= 0, got {options.cache_budget_mb!r}")
    if options.warmup < 1:  # the clock starts at the end of the last warm-up step
        raise ConfigError(f"--warmup: must be >= 1, got {options.warmup!r}")
    if not options.methods:
        raise ConfigError("--methods: give at least one method name")
    result = run_bench(options)
    json_path, md_path = write_results(result, Path(options.output))
    print(render_markdown(result))
    print(json_path)
    print(md_path)
    return 0


def cmd_workflow(args: argparse.Namespace) -> int:
    from kdbench.bench_workflow import JOBS, WorkflowOptions, parse_teachers, run_workflow, write_workflow_results
    from kdbench.config import ConfigError, parse_overrides

    tasks = [t.strip() for t in args.tasks.split(",") if t.strip()]
    jobs = tuple(j.strip() for j in args.workflow_jobs.split(",") if j.strip())
    unknown = [j for j in jobs if j not in JOBS]
    if unknown or not jobs:
        raise ConfigError(f"--workflow-jobs {args.workflow_jobs!r}: choose from {', '.join(JOBS)}")
    for name in ("intermediate_epochs", "prediction_epochs", "repeats", "batch_size"):
        if getattr(args, name) < 1:
            raise ConfigError(f"--{name.replace('_', '-')}: must be >= 1, got {getattr(args, name)!r}")
    for name in ("max_train_samples", "max_eval_samples"):
        if getattr(args, name) is not None and getattr(args, name) < 1:
            raise ConfigError(f"--{name.replace('_', '-')}: must be >= 1, got {getattr(args, name)!r}")
    teachers = parse_teachers(args.teacher, tasks)
    for task, folder in teachers.items():
        if not Path(folder).is_dir():
            raise ConfigError(f"--teacher: the {task} teacher {folder!r} is not a folder (a fine-tuned checkpoint)")
    options = WorkflowOptions(
        teachers=teachers, student=args.student, intermediate_epochs=args.intermediate_epochs,
        prediction_epochs=args.prediction_epochs, max_train_samples=args.max_train_samples,
        max_eval_samples=args.max_eval_samples, max_seq_length=args.max_seq_length, batch_size=args.batch_size,
        repeats=args.repeats, jobs=jobs, data_dir=args.data_dir, output=args.output,
        cache_budget_mb=args.cache_budget_mb or WorkflowOptions.cache_budget_mb,
        overrides=parse_overrides(args.overrides))
    progress = Path(options.output) / f"workflow-in-progress-{time.strftime('%Y%m%d-%H%M%S')}.json"
    progress.parent.mkdir(parents=True, exist_ok=True)
    result = run_workflow(options, progress)
    json_path, md_path = write_workflow_results(result, Path(options.output))
    progress.unlink(missing_ok=True)
    print(md_path.read_text())
    print(json_path)
    print(md_path)
    return 0


# ---------------------------------------------------------------------------------------------
# Machine
# ---------------------------------------------------------------------------------------------
def machine_description() -> dict[str, Any]:
    import os

    import torch
    import transformers

    cpu = cpu_model()
    try:
        load = os.getloadavg()
    except OSError:
        load = None
    description = {
        "cpu": cpu,
        "cpu_cores": os.cpu_count(),
        "cpu_cores_usable": len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count(),
        "torch_threads": torch.get_num_threads(),
        "load_average_at_start": load,
        "python": platform.python_version(),
        "torch": torch.__version__,
        "transformers": transformers.__version__,
        "platform": platform.platform(),
        "gpu": torch.cuda.get_device_name(0) if torch.cuda.is_available() else None,
    }
    # Package metadata, not ``textbrewer.__version__``: importing TextBrewer 0.2.1 fails without TensorBoard.
    try:
        description["textbrewer"] = importlib.metadata.version("textbrewer")
    except importlib.metadata.PackageNotFoundError:
        description["textbrewer"] = None
    return description


# ---------------------------------------------------------------------------------------------
# Measurements
# ---------------------------------------------------------------------------------------------
class _Timer:
    """Wall time between the end of step ``warmup`` and the end of the last step (2 syncs)."""

    def __init__(self, device: Any, warmup: int, total: int):
        self.device, self.warmup, self.total = device, warmup, total
        self.start = self.end = None

    def sync(self) -> None:
        import torch

        if self.device.type == "cuda":
            torch.cuda.synchronize()

    def step_done(self, step: int) -> None:
        if step == self.warmup:
            self.sync()
            self.start = time.perf_counter()
        if step == self.total:
            self.sync()
            self.end = time.perf_counter()

    @property
    def seconds(self) -> float:
        return self.end - self.start


def _peak_memory(device: Any) -> dict[str, float]:
    import resource

    import torch

    found = {"max_rss_mb": round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, 1)}
    if device.type == "cuda":
        found["gpu_peak_mb"] = round(torch.cuda.max_memory_allocated() / 2**20, 1)
    return found


def _reset_peak(device: Any) -> None:
    import torch

    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats()


def _engine_run(setup: Setup, config: Any, stage: Any, module: Any, teacher_order: Any, cached: Any,
                workdir: Path, record: bool) -> tuple[float, list[dict[str, Any]], dict[str, float]]:
    """Train ``warmup + steps`` steps with the engine's Trainer; returns seconds of the timed steps."""
    import dataclasses

    from transformers import DataCollatorWithPadding, TrainerCallback

    from kdbench.engine import DistillationTrainer, training_arguments

    options = setup.options
    total = options.warmup + options.steps
    timer = _Timer(setup.device, options.warmup, total)
    batches: list[dict[str, Any]] = []

    class StepClock(TrainerCallback):
        def on_step_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
            timer.step_done(state.global_step)

    class RecordingTrainer(DistillationTrainer):
        def compute_loss(self, model: Any, inputs: Any, *rest: Any, **kwargs: Any) -> Any:
            if record and model.training:
                batches.append(inputs)
            return super().compute_loss(model, inputs, *rest, **kwargs)

    args = training_arguments(config, stage, workdir, setup.task.spec.main_metric, has_eval=False)
    args = dataclasses.replace(args, max_steps=total, save_strategy="no", disable_tqdm=True)
    trainer = RecordingTrainer(
        model=module, args=args, train_dataset=setup.train_dataset,
        data_collator=DataCollatorWithPadding(setup.tokenizer), processing_class=setup.tokenizer,
        callbacks=[StepClock()], stage=stage, teacher=setup.teacher, teacher_order=teacher_order, task=setup.task,
        eval_splits=[], eval_tokenizer=setup.tokenizer, cached_teacher=cached,
    )
    _reset_peak(setup.device)
    try:
        trainer.train()
    finally:
        trainer.release()
    return timer.seconds, batches, _peak_memory(setup.device)


def _floor_run(setup: Setup, stage: Any, module: Any, teacher_order: Any, batches: list[dict[str, Any]],
               lr: float) -> tuple[float, dict[str, float]]:
    """The bare loop over the engine's own batches: teacher forward (no_grad), student step."""
    import contextlib

    import torch

    from kdbench.capture import FeatureCapture
    from kdbench.engine import build_adamw, model_inputs
    from kdbench.method import all_parameters

    options = setup.options
    timer = _Timer(setup.device, options.warmup, len(batches))
    groups = (stage.param_groups or all_parameters)(module.student, module.extras)
    params = [p for group in groups for p in group.params if p.requires_grad]
    optimizer = build_adamw(params, lr=lr, weight_decay=0.01)
    student_capture = FeatureCapture(module.student, stage.student_features)
    teacher_capture = FeatureCapture(setup.teacher, stage.teacher_features) if stage.uses_teacher else None
    autocast = (torch.autocast(setup.device.type, dtype=torch.bfloat16) if setup.precision == "bf16"
                else contextlib.nullcontext())
    module.train()
    _reset_peak(setup.device)
    try:
        for step, batch in enumerate(batches, start=1):
            if stage.prepare_batch is not None:
                batch = dict(stage.prepare_batch(batch))
            inputs = model_inputs(batch)
            with autocast:
                teacher_features = None
                if teacher_capture is not None:
                    with torch.no_grad():
                        teacher_features = teacher_capture.collect(setup.teacher(**inputs))
                    if teacher_order is not None and teacher_features.logits is not None:
                        teacher_features.logits = teacher_features.logits[:, teacher_order]
                student_features = student_capture.collect(module.student(**inputs))
                terms = stage.compute(batch, student_features, teacher_features, module.extras)
                loss = torch.stack([value.float() for value in terms.values()]).sum()
            loss.backward()
            torch.nn.utils.clip_grad_norm_(params, 1.0)
            optimizer.step()
            optimizer.zero_grad(set_to_none=True)
            timer.step_done(step)
    finally:
        student_capture.remove()
        if teacher_capture is not None:
            teacher_capture.remove()
    return timer.seconds, _peak_memory(setup.device)


# ---------------------------------------------------------------------------------------------
# Setup shared by every method
# ---------------------------------------------------------------------------------------------
@dataclass
class Setup:
    options: BenchOptions
    device: Any
    precision: str
    tokenizer: Any
    task: Any
    teacher: Any
    train_dataset: Any
    workdir: Path
    cache_root: Path


def _run_config(options: BenchOptions, method: str, method_overrides: bool = True) -> Any:
    """The run config of ``method`` in the bench; ``method_overrides=False`` drops the overrides that are
    method parameters (the TextBrewer job runs its own stage, whatever methods are measured)."""
    from kdbench.config import build_run_config, is_method_parameter

    values: dict[str, Any] = {
        "method": method, "task": options.task, "teacher": options.teacher, "student": options.student,
        "batch_size": options.batch_size, "max_seq_length": options.max_seq_length, "precision": options.precision,
        "max_train_samples": (options.warmup + options.steps) * options.batch_size, "output": "unused",
        "train.compile": options.compile,
    }
    if options.data_dir:
        values["data_dir"] = options.data_dir
    values.update({key: value for key, value in options.overrides.items()
                   if method_overrides or not is_method_parameter(key)})
    return build_run_config(values)


def _setup(options: BenchOptions, workdir: Path) -> Setup:
    import torch

    from kdbench.engine import load_data, load_teacher, plan_run, resolved_precision

    # Data, tokenizer and teacher do not depend on the method: they are set up once, by the engine's
    # own setup functions. The first requested method validates the overrides, which may be
    # parameters of that method (e.g. tinybert's mapping=[...]).
    config = _run_config(options, options.methods[0])
    plan = plan_run(config)
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    data = load_data(plan)
    teacher = load_teacher(plan, device)
    return Setup(options, device, resolved_precision(config), data.tokenizer, plan.task, teacher,
                 data.train_dataset(), workdir, workdir / "teacher-cache")


# ---------------------------------------------------------------------------------------------
# Per method
# ---------------------------------------------------------------------------------------------
def _build_method(setup: Setup, method_name: str, method_overrides: bool = True) -> tuple[Any, Any, Any, list[Any], Any]:
    """The method's module and stages, built by the engine's own :func:`~kdbench.engine.build_distillation`
    (student, validation, the method's student initialisation, extra modules), as ``kdbench run`` builds them."""
    from kdbench.engine import build_distillation, plan_run

    config = _run_config(setup.options, method_name, method_overrides)
    plan = plan_run(config)
    distillation = build_distillation(plan, setup.teacher, setup.tokenizer, setup.device)
    return config, plan, distillation.module, distillation.stages, distillation.teacher_order


def _summary(values: list[float]) -> dict[str, Any]:
    return {"median": round(statistics.median(values), 3), "min": round(min(values), 3),
            "max": round(max(values), 3), "all": [round(v, 3) for v in values]}


def _cache_session(setup: Setup, config: Any) -> Any:
    """A teacher-output cache over the bench's training rows, with the bench's disk budget."""
    from transformers import DataCollatorWithPadding

    from kdbench.cache import TeacherCacheSession

    return TeacherCacheSession(
        teacher=setup.teacher, dataset=setup.train_dataset, collate=DataCollatorWithPadding(setup.tokenizer),
        device=setup.device, head=setup.task.spec.head.value, max_length=setup.options.max_seq_length,
        batch_size=config.train.eval_batch_size, precision=setup.precision, budget_mb=setup.options.cache_budget_mb,
        root=setup.cache_root)


def bench_stage(setup: Setup, method: str, config: Any, stage: Any, module: Any, order: Any) -> dict[str, Any]:
    options = setup.options
    examples = options.steps * options.batch_size
    uses_teacher = stage.uses_teacher
    lr = resolve_stage(stage, config.train).lr
    session = cached = None
    plan_note = "stage runs no teacher"
    if uses_teacher:
        session = _cache_session(setup, config)
        cached = session.for_stage(stage)
        plan_note = session.plans[0].reason
    engine_s, floor_s, cached_s, ratios, speedups = [], [], [], [], []
    memory: dict[str, dict[str, float]] = {}
    tokens = 0
    if setup.device.type == "cuda":  # one untimed round: kernel selection and allocator growth happen here
        _, batches, _ = _engine_run(setup, config, stage, module, order, None, setup.workdir, record=True)
        _floor_run(setup, stage, module, order, batches, lr)
    for _ in range(options.repeats):
        seconds, batches, memory["engine"] = _engine_run(setup, config, stage, module, order, None, setup.workdir,
                                                         record=True)
        timed = batches[options.warmup:]
        tokens = int(sum(int(b["attention_mask"].sum()) for b in timed))
        floor, memory["floor"] = _floor_run(setup, stage, module, order, batches, lr)
        engine_s.append(seconds)
        floor_s.append(floor)
        ratios.append(seconds / floor)
        if cached is not None:
            with_cache, _, memory["cached"] = _engine_run(setup, config, stage, module, order, cached, setup.workdir,
                                                          record=False)
            cached_s.append(with_cache)
            speedups.append(seconds / with_cache)
    if cached is not None:
        cached.close()
    row: dict[str, Any] = {
        "method": method, "stage": stage.name, "uses_teacher": uses_teacher,
        "timed_examples": examples, "timed_tokens": tokens,
        "engine_examples_per_s": _summary([examples / s for s in engine_s]),
        "floor_examples_per_s": _summary([examples / s for s in floor_s]),
        "engine_over_floor": _summary(ratios),
        "peak_memory": memory,
    }
    if cached is not None:
        plan = session.plans[0]
        row["cached_examples_per_s"] = _summary([examples / s for s in cached_s])
        row["cache_speedup"] = _summary(speedups)
        row["cache"] = {"fields": list(plan.fields), "precompute_seconds": plan.precompute_seconds,
                        "rows": setup.train_dataset.num_rows, "bytes": plan.bytes}
    else:
        row["cache"] = {"used": False, "reason": plan_note}
    return row


def tinybert_joint_stage(teacher_layers: int, student_layers: int) -> Any:
    """One stage with TinyBERT's losses summed: embeddings + hidden MSE on uniformly mapped layers,
    attention-score MSE, soft cross-entropy (T = 1) on the logits — the job given to TextBrewer."""
    from kdbench.features import FeatureRequest
    from kdbench.losses import hidden_mse_loss, soft_cross_entropy, tinybert_attention_loss
    from kdbench.method import Stage

    step = teacher_layers // student_layers
    student_request = FeatureRequest(hidden_states=True, attention_scores=True)
    # The teacher is asked for the layers the mapping reads (as the tinybert method asks): they are
    # recorded, its other layers keep SDPA.
    request = FeatureRequest(hidden_states=True, attention_scores=True,
                             hidden_layers=tuple(s * step for s in range(student_layers + 1)),
                             attention_layers=tuple(s * step - 1 for s in range(1, student_layers + 1)))

    def loss(batch: Any, student: Any, teacher: Any) -> dict[str, Any]:
        terms = {"embd": hidden_mse_loss(student.hidden_states[0], teacher.hidden_states[0])}
        hidden = attention = 0.0
        for s in range(1, student_layers + 1):
            hidden = hidden + hidden_mse_loss(student.hidden_states[s], teacher.hidden_states[s * step])
            attention = attention + tinybert_attention_loss(student.attention_scores[s - 1],
                                                            teacher.attention_scores[s * step - 1])
        terms.update(hidn=hidden, attn=attention, pred=soft_cross_entropy(student.logits, teacher.logits, 1.0))
        return terms

    return Stage("tinybert-joint", loss, student_features=student_request, teacher_features=request)


def bench_textbrewer(setup: Setup) -> dict[str, Any]:
    """kdbench engine vs TextBrewer on the same TinyBERT-style job and the same batches."""
    import copy

    options = setup.options
    from kdbench import textbrewer_job

    if not textbrewer_job.available():
        return {"skipped": "textbrewer is not installed (pip install 'kdbench[bench]')"}
    config, plan, module, _, order = _build_method(setup, "kd", method_overrides=False)
    layers_t = setup.teacher.config.num_hidden_layers
    layers_s = module.student.config.num_hidden_layers
    stage = tinybert_joint_stage(layers_t, layers_s)
    lr = resolve_stage(stage, config.train).lr
    # TextBrewer reads attention maps from output_attentions, which needs eager attention.
    eager_teacher = textbrewer_job.eager_copy(setup.teacher)
    # With a disk budget that holds the teacher's hidden states and attention maps, both frameworks
    # also run the job without the teacher: kdbench from its on-disk cache, TextBrewer (0.2.1) from
    # teacher outputs pre-computed per batch and passed in as "teacher_cache" (held in memory).
    session = _cache_session(setup, config)
    cached = session.for_stage(stage)
    ours, theirs, ratios, floors, ours_cached, theirs_cached = [], [], [], [], [], []
    examples = options.steps * options.batch_size
    memory: dict[str, Any] = {}
    for _ in range(options.repeats):
        seconds, batches, memory["engine"] = _engine_run(setup, config, stage, module, order, None, setup.workdir,
                                                         record=True)
        floor, _ = _floor_run(setup, stage, module, order, batches, lr)
        student = textbrewer_job.eager_copy(copy.deepcopy(module.student))
        _reset_peak(setup.device)
        tb_seconds = textbrewer_job.run(eager_teacher, student, batches, warmup=options.warmup,
                                        teacher_layers=layers_t, student_layers=layers_s, lr=lr,
                                        device=setup.device, bf16=setup.precision == "bf16",
                                        workdir=setup.workdir / "textbrewer")
        memory["textbrewer"] = _peak_memory(setup.device)
        ours.append(seconds)
        floors.append(floor)
        theirs.append(tb_seconds)
        ratios.append(tb_seconds / seconds)
        if cached is not None:
            with_cache, _, memory["engine_cached"] = _engine_run(setup, config, stage, module, order, cached,
                                                                 setup.workdir, record=False)
            teacher_outputs = textbrewer_job.precompute_teacher_outputs(eager_teacher, batches)
            student = textbrewer_job.eager_copy(copy.deepcopy(module.student))
            tb_cached = textbrewer_job.run(eager_teacher, student, batches, warmup=options.warmup,
                                           teacher_layers=layers_t, student_layers=layers_s, lr=lr,
                                           device=setup.device, bf16=setup.precision == "bf16",
                                           workdir=setup.workdir / "textbrewer", teacher_outputs=teacher_outputs)
            del teacher_outputs
            ours_cached.append(with_cache)
            theirs_cached.append(tb_cached)
    if cached is not None:
        cached.close()
    profile = _profile_joint_job(setup, config, stage, module, order, eager_teacher, layers_t, layers_s,
                                 textbrewer_job) if options.profile else None
    plan = session.plans[0]
    if cached is not None:
        cache = {"fields": list(plan.fields), "bytes": plan.bytes, "hit": plan.hit,
                 "precompute_seconds": plan.precompute_seconds,
                 "kdbench_cached_examples_per_s": _summary([examples / s for s in ours_cached]),
                 "textbrewer_cached_examples_per_s": _summary([examples / s for s in theirs_cached]),
                 "kdbench_cached_over_textbrewer_live_throughput": _summary(
                     [t / c for t, c in zip(theirs, ours_cached, strict=True)]),
                 "kdbench_cached_over_textbrewer_cached_throughput": _summary(
                     [t / c for t, c in zip(theirs_cached, ours_cached, strict=True)])}
    else:
        cache = {"used": False, "reason": plan.reason}
    return {
        "profile": profile,
        "cache": cache,
        "job": f"TinyBERT-style, one stage: embeddings + hidden MSE on layers T{{{step_list(layers_t, layers_s)}}} "
               "+ attention MSE + soft CE on logits",
        "kdbench_examples_per_s": _summary([examples / s for s in ours]),
        "floor_examples_per_s": _summary([examples / s for s in floors]),
        "textbrewer_examples_per_s": _summary([examples / s for s in theirs]),
        "kdbench_over_textbrewer_throughput": _summary(ratios),
        "peak_memory": memory,
        "notes": "kdbench: attention scores recorded inside its registered attention function (eager maths) "
                 "for the mapped layers, SDPA for the teacher's other layers; TextBrewer: "
                 "eager attention (output_attentions), attention MSE on its attention probabilities, "
                 "kd_loss_type=ce, temperature 1, its own loop (GeneralDistiller.train, num_steps).",
    }


def _profile_joint_job(setup: Setup, config: Any, stage: Any, module: Any, order: Any, eager_teacher: Any,
                       layers_t: int, layers_s: int, textbrewer_job: Any) -> dict[str, Any]:
    """One profiled round of engine, floor and TextBrewer: wall time vs time inside aten operators."""
    import copy

    from torch.profiler import ProfilerActivity, profile

    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if setup.device.type == "cuda" else [])
    found: dict[str, Any] = {}
    lr = resolve_stage(stage, config.train).lr
    batches: list[dict[str, Any]] = []

    def engine() -> None:
        nonlocal batches
        _, batches, _ = _engine_run(setup, config, stage, module, order, None, setup.workdir, record=True)

    def floor() -> None:
        _floor_run(setup, stage, module, order, batches, lr)

    def textbrewer() -> None:
        student = textbrewer_job.eager_copy(copy.deepcopy(module.student))
        textbrewer_job.run(eager_teacher, student, batches, warmup=setup.options.warmup, teacher_layers=layers_t,
                           student_layers=layers_s, lr=lr, device=setup.device,
                           bf16=setup.precision == "bf16", workdir=setup.workdir / "textbrewer")

    for name, job in (("engine", engine), ("floor", floor), ("textbrewer", textbrewer)):
        started = time.perf_counter()
        with profile(activities=activities) as prof:
            job()
        wall = time.perf_counter() - started
        averages = prof.key_averages()
        top = sorted(averages, key=lambda e: e.self_cpu_time_total, reverse=True)[:12]
        found[name] = {
            "wall_seconds_incl_setup": round(wall, 3),
            "self_cpu_seconds_in_ops": round(sum(e.self_cpu_time_total for e in averages) / 1e6, 3),
            "top_ops": [{"op": e.key, "calls": e.count, "self_cpu_ms": round(e.self_cpu_time_total / 1e3, 2)}
                        for e in top],
        }
    return found


def step_list(teacher_layers: int, student_layers: int) -> str:
    step = teacher_layers // student_layers
    return ",".join(str(s * step) for s in range(1, student_layers + 1))


def bench_augmentation(setup: Setup) -> dict[str, Any]:
    """Sentences/s of TinyBERT augmentation with a small MLM built from a config (random weights)."""
    import numpy as np
    import torch
    from transformers import BertConfig, BertForMaskedLM

    from kdbench.augment import AugmentConfig, Augmenter, Glove

    options = setup.options
    torch.manual_seed(0)
    mlm_config = BertConfig(vocab_size=len(setup.tokenizer), hidden_size=128, num_hidden_layers=2,
                            num_attention_heads=2, intermediate_size=512, max_position_embeddings=512)
    mlm = BertForMaskedLM(mlm_config).to(setup.device).eval()
    vocab = [w for w in setup.tokenizer.get_vocab() if w.isalpha()][:20000]
    rng = np.random.default_rng(0)
    glove = Glove(vocab, rng.standard_normal((len(vocab), 50)).astype(np.float32))
    rows = setup.train_dataset.num_rows
    sentences = [setup.tokenizer.decode(setup.train_dataset[i]["input_ids"], skip_special_tokens=True)
                 for i in range(min(rows, options.augment_sentences))]
    rates = []
    for repeat in range(options.repeats):
        augmenter = Augmenter(mlm, setup.tokenizer, AugmentConfig(n_aug=20, top_k=15, seed=repeat), glove=glove)
        started = time.perf_counter()
        produced = augmenter.augment(sentences)
        rates.append(len(sentences) / (time.perf_counter() - started))
    return {"sentences": len(sentences), "n_aug": 20, "top_k": 15,
            "mlm": "BertForMaskedLM 2 layers, hidden 128 (random weights, from config)",
            "glove": f"{len(vocab)} words x 50 d (random vectors)",
            "variants_per_sentence": round(sum(len(v) for v in produced) / len(produced), 2),
            "sentences_per_s": _summary(rates)}


# ---------------------------------------------------------------------------------------------
# Whole benchmark
# ---------------------------------------------------------------------------------------------
def run_bench(options: BenchOptions) -> dict[str, Any]:
    import torch

    started = time.strftime("%Y-%m-%dT%H:%M:%S%z")
    with tempfile.TemporaryDirectory(prefix="kdbench-bench-") as tmp:
        workdir = Path(tmp)
        setup = _setup(options, workdir)
        result: dict[str, Any] = {
            "started_at": started,
            "machine": machine_description(),
            "device": str(setup.device),
            "precision": setup.precision,
            "compile": options.compile,
            "options": dict(options.__dict__),
            "teacher_attention": setup.teacher.config._attn_implementation,
            "train_rows": setup.train_dataset.num_rows,
            "methods": [],
            "skipped_methods": {},
        }
        for method in options.methods:
            try:
                config, _, module, stages, order = _build_method(setup, method)
            except Exception as error:
                result["skipped_methods"][method] = f"{type(error).__name__}: {str(error).splitlines()[0]}"
                continue
            for stage in stages:
                print(f"[kdbench bench] {method} / {stage.name}", file=sys.stderr, flush=True)
                try:
                    result["methods"].append(bench_stage(setup, method, config, stage, module, order))
                except Exception as error:
                    result["skipped_methods"][f"{method}/{stage.name}"] = f"{type(error).__name__}: {error}"
            del module
            if setup.device.type == "cuda":
                torch.cuda.empty_cache()
        if options.textbrewer:
            print("[kdbench bench] textbrewer", file=sys.stderr, flush=True)
            result["textbrewer"] = bench_textbrewer(setup)
        if options.augment:
            print("[kdbench bench] augmentation", file=sys.stderr, flush=True)
            result["augmentation"] = bench_augmentation(setup)
    result["finished_at"] = time.strftime("%Y-%m-%dT%H:%M:%S%z")
    return result


def write_results(result: dict[str, Any], folder: Path) -> tuple[Path, Path]:
    from kdbench.records import write_json_atomic

    folder.mkdir(parents=True, exist_ok=True)
    tag = "gpu" if result["machine"].get("gpu") else "cpu"
    stamp = time.strftime("%Y%m%d-%H%M%S")
    json_path = folder / f"bench-{tag}-{stamp}.json"
    md_path = folder / f"bench-{tag}-{stamp}.md"
    write_json_atomic(json_path, result)
    md_path.write_text(render_markdown(result))
    return json_path, md_path


def render_markdown(result: dict[str, Any]) -> str:
    machine = result["machine"]
    device = machine["gpu"] or f"{machine['cpu']} ({machine['cpu_cores_usable']} usable cores)"
    options = result["options"]
    lines = [
        f"### Training throughput — {device}, torch {machine['torch']}, transformers {machine['transformers']}, "
        f"{result['precision']}{', compiled' if result['compile'] else ''}",
        "",
        f"Task {options['task']}, teacher `{Path(options['teacher']).name}` ({result['teacher_attention']} attention), "
        f"student `{options['student']}`, batch {options['batch_size']}, max length {options['max_seq_length']}, "
        f"dynamic padding + length-grouped batches; {options['steps']} timed steps after {options['warmup']} warm-up, "
        f"{options['repeats']} interleaved repeats, medians. Load average at start: "
        f"{machine.get('load_average_at_start')}.",
        "",
        "| method | stage | engine ex/s | floor ex/s | engine/floor time | cached ex/s | cache speed-up | peak memory |",
        "|---|---|---:|---:|---:|---:|---:|---:|",
    ]
    for row in result["methods"]:
        cached = row.get("cached_examples_per_s")
        memory = row["peak_memory"].get("engine", {})
        peak = f"{memory['gpu_peak_mb']:.0f} MB GPU" if "gpu_peak_mb" in memory else f"{memory.get('max_rss_mb', 0):.0f} MB RSS"
        lines.append(
            f"| {row['method']} | {row['stage']} | {row['engine_examples_per_s']['median']:.1f} | "
            f"{row['floor_examples_per_s']['median']:.1f} | {row['engine_over_floor']['median']:.3f}x | "
            f"{cached['median']:.1f} | {row['cache_speedup']['median']:.2f}x | {peak} |" if cached else
            f"| {row['method']} | {row['stage']} | {row['engine_examples_per_s']['median']:.1f} | "
            f"{row['floor_examples_per_s']['median']:.1f} | {row['engine_over_floor']['median']:.3f}x | — | — | {peak} |"
        )
    for name, why in result.get("skipped_methods", {}).items():
        lines.append(f"| {name} | skipped | {why} | | | | | |")
    textbrewer = result.get("textbrewer")
    if textbrewer:
        lines.append("")
        if "skipped" in textbrewer:
            lines.append(f"TextBrewer: not measured ({textbrewer['skipped']}).")
        else:
            lines += [
                f"**Against TextBrewer** ({textbrewer['job']}), same teacher, student, batches: "
                f"kdbench {textbrewer['kdbench_examples_per_s']['median']:.1f} ex/s, "
                f"TextBrewer {textbrewer['textbrewer_examples_per_s']['median']:.1f} ex/s, "
                f"floor {textbrewer['floor_examples_per_s']['median']:.1f} ex/s: kdbench is "
                f"**{textbrewer['kdbench_over_textbrewer_throughput']['median']:.2f}x** TextBrewer's throughput.",
            ]
            cache = textbrewer.get("cache", {})
            if "kdbench_cached_examples_per_s" in cache:
                filled = ("already on disk from an earlier stage" if cache.get("hit")
                          else f"one teacher pass of {cache['precompute_seconds']:.1f} s")
                lines.append(
                    f"Without the teacher: kdbench reads its {', '.join(cache['fields'])} from its cache "
                    f"({cache['bytes'] / 2**20:.0f} MB on disk, {filled}), "
                    f"{cache['kdbench_cached_examples_per_s']['median']:.1f} ex/s; TextBrewer reads teacher outputs "
                    f"pre-computed per batch (its `teacher_cache`, in memory), "
                    f"{cache['textbrewer_cached_examples_per_s']['median']:.1f} ex/s: kdbench is "
                    f"**{cache['kdbench_cached_over_textbrewer_cached_throughput']['median']:.2f}x** TextBrewer's "
                    f"throughput ({cache['kdbench_cached_over_textbrewer_live_throughput']['median']:.2f}x TextBrewer "
                    "with its teacher live)."
                )
            elif cache.get("reason"):
                lines.append(f"kdbench's teacher cache was not used for this job: {cache['reason']}.")
        profile = textbrewer.get("profile")
        if profile:
            lines += ["", "Profile of one round (self time inside operators vs wall time, setup included):", ""]
            for name, part in profile.items():
                top = ", ".join(f"{op['op']} {op['self_cpu_ms']:.0f} ms" for op in part["top_ops"][:5])
                lines.append(f"- {name}: wall {part['wall_seconds_incl_setup']:.2f} s, in operators "
                             f"{part['self_cpu_seconds_in_ops']:.2f} s; top: {top}")
    augmentation = result.get("augmentation")
    if augmentation:
        lines += ["", f"**Augmentation** (TinyBERT, n_aug {augmentation['n_aug']}, K {augmentation['top_k']}, "
                      f"{augmentation['mlm']}): {augmentation['sentences_per_s']['median']:.1f} sentences/s."]
    return "\n".join(lines) + "\n"
