"""``kdbench bench --workflow``: TinyBERT task distillation end to end, kdbench against TextBrewer.

For every task (RTE and MRPC by default) the same job — TinyBERT's intermediate stage (default 20
epochs) then its prediction stage (3 epochs), from the same fine-tuned teacher and the same initial
student folder, on the same rows — runs as:

- ``kdbench``: ``python -m kdbench run tinybert ...``, the command a user types, with a fresh (cold)
  teacher-output cache, so its one teacher pass is part of the time;
- ``textbrewer``: ``python -m kdbench.textbrewer_workflow``, the job written with TextBrewer's
  documented API (each stage optimised as kdbench resolves it), teacher run at every step;
- ``textbrewer-cache``: the same with TextBrewer's ``teacher_cache`` (teacher outputs pre-computed
  per fixed batch, in memory).

Each job is one fresh process, timed from its start to its exit (imports, data, model loading,
training, evaluation, checkpoints). Jobs are interleaved (the order rotates every repeat) and the
medians of the wall times are compared. Results: ``workflow-<device>-<time>.json`` and ``.md``.
"""

from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from kdbench.cache_paths import CACHE_ENV

JOBS = ("kdbench", "textbrewer", "textbrewer-cache")


@dataclass
class WorkflowOptions:
    teachers: dict[str, str]  # task -> fine-tuned teacher folder
    student: str = "teacher-3l"  # preset; built once per task with student_init=teacher and saved
    intermediate_epochs: int = 20
    prediction_epochs: int = 3
    max_train_samples: int | None = None
    max_eval_samples: int | None = None
    max_seq_length: int = 128
    batch_size: int = 32
    repeats: int = 1
    jobs: tuple[str, ...] = JOBS
    cache_budget_mb: float = 16384.0
    length_grouped: bool = True  # TextBrewer gets the length-grouped batches kdbench's engine uses
    data_dir: str | None = None
    output: str = "results/benchmarks"
    seed: int = 42
    overrides: dict[str, str] = field(default_factory=dict)


def parse_teachers(text: str, tasks: list[str]) -> dict[str, str]:
    """``rte=PATH,mrpc=PATH``, or one PATH for a single task."""
    from kdbench.config import ConfigError

    if "=" not in text:
        if len(tasks) != 1:
            raise ConfigError(f"--teacher {text!r}: --workflow with tasks {tasks} needs one fine-tuned teacher per "
                              "task, as TASK=PATH,TASK=PATH")
        return {tasks[0]: text}
    found = dict(part.split("=", 1) for part in text.split(",") if part)
    missing = [t for t in tasks if t not in found]
    if missing:
        raise ConfigError(f"--teacher {text!r}: no teacher for task(s) {', '.join(missing)}")
    return {t: found[t] for t in tasks}


def initial_student(options: WorkflowOptions, task: str, folder: Path) -> Path:
    """The student both frameworks start from: the preset with the teacher's bottom layers, saved once."""
    from transformers import AutoTokenizer

    from kdbench.config import build_run_config
    from kdbench.engine import build_student, load_model, plan_run

    values = {"method": "tinybert", "task": task, "teacher": options.teachers[task], "student": options.student,
              "student_init": "teacher", "output": "unused", "seed": options.seed}
    if options.data_dir:
        values["data_dir"] = options.data_dir
    plan = plan_run(build_run_config(values))
    tokenizer = AutoTokenizer.from_pretrained(options.teachers[task])
    teacher = load_model(options.teachers[task], plan.task.spec.head, plan.task.spec, trust_remote_code=False,
                         role="teacher")
    student = build_student(plan, teacher, tokenizer)
    student.save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    return folder


def job_command(options: WorkflowOptions, job: str, task: str, student: Path, output: Path) -> list[str]:
    teacher = options.teachers[task]
    if job == "kdbench":
        command = [sys.executable, "-m", "kdbench", "run", "tinybert", "--task", task, "--teacher", teacher,
                   "--student", str(student), "--output", str(output), "student_init=pretrained",
                   f"intermediate_epochs={options.intermediate_epochs}",
                   f"prediction_epochs={options.prediction_epochs}", f"max_seq_length={options.max_seq_length}",
                   f"batch_size={options.batch_size}", f"seed={options.seed}",
                   f"train.teacher_cache_budget_mb={options.cache_budget_mb:g}"]
        for name in ("max_train_samples", "max_eval_samples"):
            if getattr(options, name) is not None:
                command.append(f"{name}={getattr(options, name)}")
        if options.data_dir:
            command += ["--data-dir", options.data_dir]
        return command + [f"{key}={value}" for key, value in options.overrides.items()]
    command = [sys.executable, "-m", "kdbench.textbrewer_workflow", "--task", task, "--teacher", teacher,
               "--student", str(student),
               "--output", str(output), "--intermediate-epochs", str(options.intermediate_epochs),
               "--prediction-epochs", str(options.prediction_epochs), "--max-seq-length", str(options.max_seq_length),
               "--batch-size", str(options.batch_size), "--seed", str(options.seed)]
    for name in ("max_train_samples", "max_eval_samples", "data_dir"):
        if getattr(options, name) is not None:
            command += [f"--{name.replace('_', '-')}", str(getattr(options, name))]
    if options.length_grouped:
        command.append("--length-grouped")
    if job == "textbrewer-cache":
        command.append("--teacher-cache")
    return command


def run_job(options: WorkflowOptions, job: str, task: str, student: Path, workdir: Path) -> dict[str, Any]:
    output = Path(tempfile.mkdtemp(prefix=f"{job}-{task}-", dir=workdir))
    env = {**os.environ, CACHE_ENV: str(output / "kdbench-cache")}  # cold caches: their passes are timed
    command = job_command(options, job, task, student, output)
    load = os.getloadavg()
    started = time.perf_counter()
    done = subprocess.run(command, env=env, capture_output=True, text=True, check=False)
    wall = time.perf_counter() - started
    if done.returncode != 0:
        tail = (done.stderr or done.stdout).strip().splitlines()[-5:]
        raise RuntimeError(f"workflow job {job} on {task} failed ({done.returncode}): " + " | ".join(tail))
    found: dict[str, Any] = {"job": job, "task": task, "wall_seconds": round(wall, 2), "load_average_before": load,
                             "load_average_after": os.getloadavg()}
    if job == "kdbench":
        run_dir = Path(done.stdout.strip().splitlines()[-1])
        record = json.loads((run_dir / "result.json").read_text())
        found.update(train_seconds=record["train_seconds"], metrics=record["metrics"],
                     stages=[{k: s.get(k) for k in ("name", "steps", "seconds", "best_score") if k in s}
                             for s in record["stages"]],
                     teacher_cache=record["teacher_cache"])
    else:
        found.update(json.loads(done.stdout.strip().splitlines()[-1]))
    return found


def run_workflow(options: WorkflowOptions, progress: Path | None = None) -> dict[str, Any]:
    """Run every job; with ``progress``, the result so far is written there after each job (a long run
    that is stopped keeps the jobs it finished)."""
    from kdbench.bench import machine_description
    from kdbench.records import write_json_atomic

    result: dict[str, Any] = {"started_at": time.strftime("%Y-%m-%dT%H:%M:%S%z"), "machine": machine_description(),
                              "options": asdict(options), "runs": []}
    with tempfile.TemporaryDirectory(prefix="kdbench-workflow-") as tmp:
        workdir = Path(tmp)
        students = {task: initial_student(options, task, workdir / f"student-{task}") for task in options.teachers}
        for repeat in range(options.repeats):
            jobs = list(options.jobs[repeat % len(options.jobs):]) + list(options.jobs[:repeat % len(options.jobs)])
            for task in options.teachers:
                for job in jobs:
                    print(f"[kdbench bench --workflow] repeat {repeat + 1}: {job} on {task}", file=sys.stderr,
                          flush=True)
                    found = run_job(options, job, task, students[task], workdir)
                    found["repeat"] = repeat
                    result["runs"].append(found)
                    if progress is not None:
                        write_json_atomic(progress, result)
    result["summary"] = summarise(result["runs"], options)
    result["finished_at"] = time.strftime("%Y-%m-%dT%H:%M:%S%z")
    return result


def summarise(runs: list[dict[str, Any]], options: WorkflowOptions) -> dict[str, Any]:
    """Median wall time per task and job, and kdbench's speed-up over each other job."""
    summary: dict[str, Any] = {}
    for task in options.teachers:
        walls = {job: [r["wall_seconds"] for r in runs if r["task"] == task and r["job"] == job] for job in options.jobs}
        row: dict[str, Any] = {f"{job}_wall_seconds": {"median": round(statistics.median(v), 2), "all": v}
                               for job, v in walls.items() if v}
        if walls.get("kdbench"):
            for job in options.jobs:
                if job != "kdbench" and walls.get(job):
                    # kdbench's speed-up: the other job's time over kdbench's, per repeat, then the median.
                    ratios = [other / ours for other, ours in zip(walls[job], walls["kdbench"], strict=False)]
                    row[f"speedup_vs_{job}"] = {"median": round(statistics.median(ratios), 3),
                                                "all": [round(r, 3) for r in ratios]}
        summary[task] = row
    totals = {job: sum(statistics.median([r["wall_seconds"] for r in runs if r["task"] == t and r["job"] == job])
                       for t in options.teachers) for job in options.jobs}
    summary["all_tasks"] = {f"{job}_wall_seconds": round(total, 2) for job, total in totals.items()}
    for job in options.jobs:
        if job != "kdbench" and "kdbench" in totals:
            summary["all_tasks"][f"speedup_vs_{job}"] = round(totals[job] / totals["kdbench"], 3)
    return summary


def write_workflow_results(result: dict[str, Any], folder: Path) -> tuple[Path, Path]:
    from kdbench.records import write_json_atomic

    folder.mkdir(parents=True, exist_ok=True)
    tag = "gpu" if result["machine"].get("gpu") else "cpu"
    stamp = time.strftime("%Y%m%d-%H%M%S")
    json_path, md_path = folder / f"workflow-{tag}-{stamp}.json", folder / f"workflow-{tag}-{stamp}.md"
    write_json_atomic(json_path, result)
    md_path.write_text(render_workflow(result))
    return json_path, md_path


def render_workflow(result: dict[str, Any]) -> str:
    options, machine, summary = result["options"], result["machine"], result["summary"]
    rows = options["max_train_samples"] or "all"
    lines = [
        f"### TinyBERT task distillation end to end — {machine.get('gpu') or machine['cpu']}, "
        f"torch {machine['torch']}, transformers {machine['transformers']}, TextBrewer {machine.get('textbrewer')}",
        "",
        f"Intermediate stage {options['intermediate_epochs']} epochs + prediction stage "
        f"{options['prediction_epochs']} epochs, {rows} training rows per task, batch {options['batch_size']}, "
        f"max length {options['max_seq_length']}, student `{options['student']}` (teacher's bottom layers); "
        f"{options['repeats']} interleaved repeat(s), each job a fresh process; kdbench with a cold cache "
        f"(budget {options['cache_budget_mb']:g} MB). Load average at start: {machine.get('load_average_at_start')}.",
        "",
        "| task | " + " | ".join(f"{job} wall s" for job in options["jobs"]) + " | "
        + " | ".join(f"kdbench speed-up vs {job}" for job in options["jobs"] if job != "kdbench") + " |",
        "|---|" + "---:|" * (2 * len(options["jobs"]) - 1),
    ]
    for task, row in summary.items():
        walls = [f"{row[f'{job}_wall_seconds']['median']:.1f}" if task != "all_tasks"
                 else f"{row[f'{job}_wall_seconds']:.1f}" for job in options["jobs"]]
        speedups = []
        for job in options["jobs"]:
            if job == "kdbench":
                continue
            value = row.get(f"speedup_vs_{job}")
            speedups.append(f"**{value['median'] if isinstance(value, dict) else value:.2f}x**" if value else "—")
        lines.append(f"| {task} | " + " | ".join(walls) + " | " + " | ".join(speedups) + " |")
    return "\n".join(lines) + "\n"
