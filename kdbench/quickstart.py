"""``kdbench quickstart``: the main job of knowledge distillation in one command.

Fine-tune a teacher (the packaged pre-trained MiniLM-L6), distil it into a 3-layer student, train
the same student from the same initialisation without a teacher, over several seeds, and print the
comparison: the teacher's score, both students' mean ± std, and the gain of distillation per seed.

The runs are ordinary kdbench runs (resumable, content-addressed) and the job is an ordinary sweep
spec, written beside them, so the same job runs on a cluster with ``kdbench sweep SPEC --executor
slurm``. The defaults are the setting the reproduction study (``results/reproduction/quickstart/``) found
to show a gain of distillation on a laptop CPU in about 10 minutes; every one can be changed.
"""

from __future__ import annotations

import statistics
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from kdbench.claims import PairedDifference
from kdbench.config import ConfigError

TEACHER_STAGE = "teacher"
DISTILLED = "distilled"
NO_TEACHER = "no-teacher"
SPEC_FILE = "quickstart.yaml"
COMPARISON_FILE = "comparison.md"


@dataclass(frozen=True)
class QuickStart:
    """The job's settings. The defaults are those the study measured a gain with (see
    ``results/reproduction/quickstart/``): TinyBERT's task distillation (intermediate layer
    matching, then prediction distillation) into a narrow 3-layer student from random weights,
    against the same student fine-tuned on the labels for as many epochs in all. Students that
    start from pre-trained layers showed no gain from logit KD at this scale (same README)."""

    task: str = "sst2"
    max_train_samples: int | None = 4000  # None: the whole training set
    max_seq_length: int = 64
    batch_size: int = 32
    seeds: tuple[int, ...] = (1, 2, 3)
    lr: float = 1e-4
    teacher_model: str = "minilm-l6"
    teacher_epochs: int = 1
    student: str = "teacher-3l-192"
    student_keys: Mapping[str, Any] = field(default_factory=lambda: {"student_init": "random"})
    method: str = "tinybert"
    method_keys: Mapping[str, Any] = field(default_factory=lambda: {"intermediate_epochs": 5, "prediction_epochs": 3})
    baseline_epochs: int = 8  # the distilled student's epochs in all: the same passes over the data

    def __post_init__(self) -> None:
        if not self.seeds:
            raise ConfigError("--seeds: needs at least one seed")
        if len(set(self.seeds)) != len(self.seeds):
            raise ConfigError(f"--seeds: each seed once, got {list(self.seeds)}")
        if self.method == "finetune":
            raise ConfigError("--method: must be a distillation method (finetune is the no-teacher baseline)")


def build_spec(job: QuickStart, data_dir: str | None = None) -> dict[str, Any]:
    """The sweep spec of the job: a teacher stage and, per seed, a distilled and a no-teacher cell."""
    defaults: dict[str, Any] = {"task": job.task, "batch_size": job.batch_size, "max_seq_length": job.max_seq_length,
                                "lr": job.lr}
    if job.max_train_samples is not None:
        defaults["max_train_samples"] = job.max_train_samples
    if data_dir is not None:
        defaults["data_dir"] = data_dir
    # Both students take their shape and tokenizer from the teacher and start from the same weights.
    student = {"student": job.student, **dict(job.student_keys), "teacher": f"${{{TEACHER_STAGE}}}"}
    cells = []
    for seed in job.seeds:
        cells.append({"name": f"{DISTILLED}-s{seed}", "label": DISTILLED, "method": job.method, "seed": seed,
                      **student, **dict(job.method_keys)})
        cells.append({"name": f"{NO_TEACHER}-s{seed}", "label": NO_TEACHER, "method": "finetune", "seed": seed,
                      **student, "epochs": job.baseline_epochs})
    return {
        "name": f"quickstart-{job.task}",
        "defaults": defaults,
        "stages": {TEACHER_STAGE: {"method": "finetune", "student": job.teacher_model, "student_init": "pretrained",
                                   "epochs": job.teacher_epochs, "seed": job.seeds[0]}},
        "cells": cells,
    }


@dataclass(frozen=True)
class Comparison:
    """The job's scores: one per seed for each student, the teacher's one."""

    task: str
    metric: str
    method: str
    teacher: float
    distilled: dict[int, float]
    no_teacher: dict[int, float]

    @property
    def gains(self) -> dict[int, float]:
        """Distilled minus no-teacher, seed by seed (both students of a seed share its initialisation)."""
        return dict(self.difference.differences)

    @property
    def difference(self) -> PairedDifference:
        return PairedDifference.of(self.distilled, self.no_teacher)

    def verdict(self) -> str:
        return self.difference.describe()


def _mean_std(values: Sequence[float]) -> str:
    if len(values) < 2:
        return f"{values[0]:.2f}" if values else "–"
    return f"{statistics.mean(values):.2f} ± {statistics.stdev(values):.2f}"


def format_comparison(result: Comparison) -> str:
    seeds = sorted(set(result.distilled) | set(result.no_teacher))
    header = ["model", *[f"seed {s}" for s in seeds], "mean ± std"]
    rows = [
        ["teacher (fine-tuned)", *["" for _ in seeds], f"{result.teacher:.2f}"],
        [f"student, distilled ({result.method})", *[_score(result.distilled, s) for s in seeds],
         _mean_std(list(result.distilled.values()))],
        ["student, no teacher (finetune)", *[_score(result.no_teacher, s) for s in seeds],
         _mean_std(list(result.no_teacher.values()))],
        ["gain of distillation", *[_score(result.gains, s, signed=True) for s in seeds],
         _mean_std(list(result.gains.values()))],
    ]
    lines = [f"**kdbench quickstart: {result.task}, dev {result.metric}**", "",
             "| " + " | ".join(header) + " |", "|" + "|".join("---" for _ in header) + "|"]
    lines += ["| " + " | ".join(row) + " |" for row in rows]
    lines += ["", f"Gain of distillation: {result.verdict()}."]
    return "\n".join(lines)


def _score(values: Mapping[int, float], seed: int, signed: bool = False) -> str:
    if seed not in values:
        return "–"
    return f"{values[seed]:+.2f}" if signed else f"{values[seed]:.2f}"


def collect(sweep: Any) -> Comparison:
    """The comparison of the quick start sweep's runs (a run without a completed record is an error)."""
    from kdbench.records import read_record

    records = []
    for run in sweep.runs.values():
        record_path = run.run_dir / "result.json"
        record = read_record(record_path) if record_path.is_file() else None
        if record is None or record["status"] != "completed":
            raise ConfigError(f"quickstart: run {run.name} has no completed record in {run.run_dir}")
        records.append(record)
    return compare(records)


def compare(records: Sequence[Mapping[str, Any]]) -> Comparison:
    """The comparison of a quick start's records, told apart by their labels: the teacher stage has
    none, the students are ``distilled`` or ``no-teacher``."""
    from kdbench.plugins import TASKS

    teachers = [r for r in records if r.get("label") is None]
    if len(teachers) != 1:
        raise ConfigError(f"quickstart records: need exactly one teacher record (no label), found {len(teachers)}")
    task = teachers[0]["task"]
    metric = TASKS.get(task).spec.main_metric

    def scores(label: str) -> dict[int, float]:
        return {int(r["seed"]): float(r["metrics"][metric]) for r in records if r.get("label") == label}

    methods = {r["method"] for r in records if r.get("label") == DISTILLED}
    return Comparison(task=task, metric=metric, method=", ".join(sorted(methods)),
                      teacher=float(teachers[0]["metrics"][metric]), distilled=scores(DISTILLED),
                      no_teacher=scores(NO_TEACHER))


def compare_folder(folder: Path) -> Comparison:
    """:func:`compare` over the records under ``folder`` (e.g. a copy of a quick start's records)."""
    from kdbench.records import find_records, read_record

    return compare([read_record(path) for path in find_records(folder)])


def run_quickstart(job: QuickStart, output: Path, data_dir: str | None = None, out: Any = None) -> Comparison:
    """Run (or resume) every run of the job in this process, teacher first; returns the comparison
    and writes it, with the job's sweep spec, into ``output``."""
    import sys

    from kdbench.config import build_run_config
    from kdbench.engine import plan_run, run_experiment
    from kdbench.engine.preflight import preflight
    from kdbench.sweep import expand

    out = out or sys.stdout
    spec = build_spec(job, data_dir)
    sweep = expand(spec, output)
    configs = {name: build_run_config(dict(run.values)) for name, run in sweep.runs.items()}  # bad keys fail here
    preflight(plan_run(configs[TEACHER_STAGE]))  # the data and the teacher model, before anything is written
    output.mkdir(parents=True, exist_ok=True)
    spec_path = output / SPEC_FILE
    spec_path.write_text(yaml.safe_dump({**spec, "output": str(output.resolve())}, sort_keys=False))
    for number, (name, run) in enumerate(sweep.runs.items(), start=1):
        print(f"[kdbench quickstart] {number}/{len(sweep.runs)} {name}: {run.run_dir}", file=out, flush=True)
        run_experiment(configs[name])
    comparison = collect(sweep)
    text = format_comparison(comparison)
    (output / COMPARISON_FILE).write_text(text + "\n")
    print(text, file=out, flush=True)
    print(f"\nRuns, their records and this table: {output}\nThe same job as a sweep (e.g. on Slurm): "
          f"kdbench sweep {spec_path} --executor slurm", file=out, flush=True)
    return comparison


def _seeds(text: str) -> tuple[int, ...]:
    try:
        return tuple(int(part) for part in text.split(",") if part.strip())
    except ValueError:
        raise ConfigError(f"--seeds: comma-separated integers, got {text!r}") from None


def cmd_quickstart(args: Any) -> int:
    job = QuickStart(task=args.task, seeds=_seeds(args.seeds),
                     max_train_samples=None if args.max_train_samples == 0 else args.max_train_samples)
    run_quickstart(job, Path(args.output), args.data_dir)
    return 0


def add_command(subparsers: Any) -> None:
    defaults = QuickStart()
    quickstart = subparsers.add_parser(
        "quickstart", help="fine-tune a teacher, distil a student, train the no-teacher baseline, compare (one command)")
    quickstart.add_argument("--task", default=defaults.task, help=f"a classification task (default {defaults.task})")
    quickstart.add_argument("--data-dir", help="GLUE data folder (default: $KDBENCH_DATA_DIR, then the Hub)")
    quickstart.add_argument("--output", default="runs/quickstart", help="runs folder (default runs/quickstart)")
    quickstart.add_argument("--seeds", default=",".join(map(str, defaults.seeds)),
                            help="students' seeds, comma-separated (default %(default)s)")
    quickstart.add_argument("--max-train-samples", type=int, default=defaults.max_train_samples,
                            help="training rows used (default %(default)s; 0: all)")
    quickstart.set_defaults(handler=cmd_quickstart)


# ---------------------------------------------------------------------------------------------
# The search behind the defaults (results/reproduction/quickstart/search/)
# ---------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class SearchSetting:
    """One setting tried for the quick start: its distilled runs live in ``search/<name>/``, its
    no-teacher runs (method ``finetune``) in ``search/<baseline>/``."""

    name: str
    description: str
    baseline: str


SEARCH: tuple[SearchSetting, ...] = (
    SearchSetting("A-kd-pretrained-3l", "`kd` (α 0.5, T 2), 2 epochs, 3-layer student from the pre-trained "
                  "MiniLM's bottom layers; baseline: same student fine-tuned 2 epochs", "A-kd-pretrained-3l"),
    SearchSetting("B-kd-transfer-12k", "`kd` with α 1 (soft targets only: gold labels weigh 0) on 12,000 rows, the "
                  "4,000 labelled ones and 8,000 more, 1 epoch, same student; baseline: A's", "A-kd-pretrained-3l"),
    SearchSetting("C-tinybert-td-narrow-5+3", "`tinybert` task distillation (5 intermediate + 3 prediction epochs) "
                  "into `teacher-3l-192` from random weights; baseline: same student fine-tuned 8 epochs",
                  "C-tinybert-td-narrow-5+3"),
    SearchSetting("D-tinybert-td-narrow-10+3", "as C with 10 intermediate epochs; baseline fine-tuned 13 epochs",
                  "D-tinybert-td-narrow-10+3"),
)


def _scores(folder: Path, distilled: bool) -> dict[int, float]:
    from kdbench.plugins import TASKS
    from kdbench.records import read_record

    scores = {}
    for path in sorted(folder.glob("*/result.json")):
        record = read_record(path)
        if record["status"] == "completed" and (record["method"] != "finetune") == distilled:
            scores[int(record["seed"])] = float(record["metrics"][TASKS.get(record["task"]).spec.main_metric])
    return scores


def render_search(folder: Path, settings: Sequence[SearchSetting] = SEARCH) -> str:
    """Markdown: per setting tried, both students' dev scores and the paired gain's verdict."""
    lines = ["| setting | distilled (per seed) | no teacher (per seed) | gain, paired | verdict |", "|---|---|---|---|---|"]
    for setting in settings:
        if not (folder / setting.name).is_dir():
            continue
        distilled, baseline = _scores(folder / setting.name, True), _scores(folder / setting.baseline, False)
        difference = PairedDifference.of(distilled, baseline)
        per_seed = [f"{_mean_std(list(v.values()))} ({', '.join(f'{v[s]:.2f}' for s in sorted(v))})"
                    for v in (distilled, baseline)]
        lines.append(f"| **{setting.name}**: {setting.description} | {per_seed[0]} | {per_seed[1]} | "
                     f"{_mean_std(list(difference.differences.values()))} | {difference.verdict} |")
    return "\n".join(lines)
