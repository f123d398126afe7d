"""The study's definition: its mini scale, each table's rows, tasks and claims, and the sweep spec
generated from them (``results/reproduction/<table>.yaml``).

The papers distil BERT-base (12 layers, hidden 768) into 4- and 6-layer students. The mini scale
keeps their structure at half depth: the teacher is the pre-trained MiniLM-L6 (``minilm-l6``: 6
layers, hidden 384, 12 heads), fine-tuned on each task's full training set, and the students are
``teacher-3l`` (3 layers of the teacher's width: uniform, skip and last mappings all exist) and
``teacher-3l-192`` (3 layers at half width, where TinyBERT's projection matters). A table is one
:class:`MiniScale` and its :class:`Row` list (``TABLE_ROWS``): a row is a method with fixed keys on
each of the table's tasks and seeds, optionally fine-tuning or distilling from a corpus stage it runs
once (its ``upstream``: DistilBERT pre-training, MobileBERT transfer, TinyBERT GD). Paths in the specs
are relative to the folder the command runs in.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import yaml

from kdbench.claims import Claim

if TYPE_CHECKING:
    from kdbench.tables.plan import SeedsNotRun, StudyPlan

TEACHER_MODEL = "minilm-l6"
WIDE_STUDENT = "teacher-3l"
NARROW_STUDENT = "teacher-3l-192"
OUTPUT = "runs/reproduction"
TEACHER_STAGE = "teacher"  # each task's fine-tuned teacher is stage f"{TEACHER_STAGE}-{task}", one role across tasks


def _spec_folder() -> Path:
    import kdbench.results  # results/ in a checkout, kdbench/results/ in an installed package

    return Path(kdbench.results.__file__).resolve().parent / "reproduction"


SPEC_FOLDER = _spec_folder()


@dataclass(frozen=True)
class TaskScale:
    """How one task runs at mini scale."""

    name: str
    seeds: tuple[int, ...]
    max_train_samples: int | None = None  # None: the full training set
    intermediate_epochs: int = 10  # TinyBERT's intermediate stage (paper: 20; 50 for CoLA; 10 for big sets)
    max_seq_length: int | None = None  # None: the study's default
    train_file: str | None = None  # files a prerequisite builds, instead of the data dir's layout
    dev_file: str | None = None
    # Disk for the teacher's cached layers in a DA cell's intermediate stage (None: the 16 GiB default).
    # An augmented set too big for the budget runs the teacher live on every step, twice as slow on
    # CPU; cached layers are stored in float16, so a row keeps one setting on all its seeds.
    augmented_cache_budget_mb: float | None = None


@dataclass(frozen=True)
class MiniScale:
    """The settings shared by every table of the study (documented in its README)."""

    tasks: tuple[TaskScale, ...] = (
        TaskScale("cola", (1, 2, 3, 4, 5), intermediate_epochs=20),
        TaskScale("sst2", (1, 2, 3), max_train_samples=16000, intermediate_epochs=5),
        TaskScale("mrpc", (1, 2, 3, 4, 5), augmented_cache_budget_mb=40960),  # 32,511 rows: ~35 GB
        TaskScale("stsb", (1, 2, 3, 4, 5)),
        TaskScale("rte", (1, 2, 3, 4, 5)),
        # SQuAD v1.1 has no training file here: train on the dev set's first articles and score on the
        # rest (SQUAD_SPLIT, built by kdbench reproduce); TinyBERT, DistilBERT and MobileBERT use 384.
        TaskScale("squad", (1, 2, 3), intermediate_epochs=3, max_seq_length=384,
                  train_file=f"{OUTPUT}/squad/dev-v1.1.train.json", dev_file=f"{OUTPUT}/squad/dev-v1.1.heldout.json"),
    )
    squad_train_articles: int = 38  # of dev-v1.1's 48 articles: 8,582 questions to train on, 1,988 held out
    max_seq_length: int = 128
    batch_size: int = 32
    teacher: dict[str, Any] = field(default_factory=lambda: {
        "method": "finetune", "student": TEACHER_MODEL, "student_init": "pretrained", "epochs": 3, "lr": 1e-4,
        "seed": 1})
    student_epochs: int = 3
    student_lr: float = 1e-4
    # Pre-training-style stages (MLM adaptation of the teacher, DistilBERT pre-training, MobileBERT
    # transfer, TinyBERT GD) read a corpus of the GLUE training sentences, far smaller than the
    # papers' Wikipedia + BookCorpus: ~97,600 distinct sentences, the first corpus_lines used.
    corpus_tasks: tuple[str, ...] = ("cola", "sst2", "mrpc", "stsb", "rte")
    corpus_lines: int = 50_000
    pretraining_epochs: float = 1.0
    # TinyBERT's data augmentation: N_a variants per training example (paper: 20, reduced for CPU),
    # words replaced by the MLM-adapted teacher's top-K candidates (no GloVe: multi-piece words kept).
    augmentation_variants: int = 4

    def task(self, name: str) -> TaskScale:
        return next(t for t in self.tasks if t.name == name)


MINI = MiniScale()


GLUE_TASKS = ("cola", "sst2", "mrpc", "stsb", "rte")  # the study's GLUE tasks (SQuAD is the other one)


def teacher_stage(scale: MiniScale, task: TaskScale) -> dict[str, Any]:
    return {**scale.teacher, "task": task.name, **_task_keys(task)}


def _task_keys(task: TaskScale) -> dict[str, Any]:
    keys = {"max_train_samples": task.max_train_samples, "max_seq_length": task.max_seq_length,
            "train_file": task.train_file, "dev_file": task.dev_file}
    return {key: value for key, value in keys.items() if value is not None}


@dataclass(frozen=True)
class Row:
    """One row of a study table: a method run with fixed keys, on every task of the table."""

    label: str
    method: str
    keys: dict[str, Any] = field(default_factory=dict)
    # A corpus stage run once for the row (e.g. DistilBERT pre-training); its model is the student
    # every cell of the row starts from. Its keys may refer to ${teacher-mlm}.
    upstream: dict[str, Any] | None = None
    upstream_name: str | None = None  # rows with one upstream share its stage by naming it (default: LABEL-pretrain)
    augmented: bool = False  # train on the task's augmented training set (TinyBERT's DA) instead of its own
    tasks: tuple[str, ...] | None = None  # the only tasks the row runs on (None: every task of its table)
    not_run_reason: str = ""  # with ``tasks``: why the row runs none of the table's other tasks
    paper_row: str | None = None  # the key of the paper table's row it fills (None: its label)

    @property
    def stage(self) -> str:
        return self.upstream_name or f"{self.label}-pretrain"

    def runs_on(self, task: str) -> bool:
        return self.tasks is None or task in self.tasks


def _student_keys(student: str) -> dict[str, Any]:
    """Initialisation shared by every method of a row group: the wide student copies the bottom
    layers of the PRE-TRAINED teacher (BERT-PKD's official student; the fine-tuned teacher's layers
    would already hold the task, so the no-teacher baseline would not be free of the teacher); the
    narrow one has no pre-trained weights of its width and starts at random."""
    if student == WIDE_STUDENT:
        return {"student": student, "student_init": "teacher", "student_init_from": TEACHER_MODEL,
                "student_layers": "bottom"}
    return {"student": student, "student_init": "random"}


def cross_method_rows() -> list[Row]:
    rows: list[Row] = []
    for student, tag in ((WIDE_STUDENT, "3l"), (NARROW_STUDENT, "3l-192")):
        init = _student_keys(student)
        rows += [
            Row(f"finetune-{tag}", "finetune", {**init}),
            Row(f"kd-{tag}", "kd", {**init, "alpha": 0.5, "temperature": 2.0}),
            Row(f"tinybert-td-{tag}", "tinybert", {**init}),
        ]
        if student == WIDE_STUDENT:  # the patient and cosine losses compare hidden vectors of one width
            rows += [
                Row(f"pkd-{strategy}-{tag}", "pkd", {**init, "strategy": strategy}, tasks=GLUE_TASKS,
                    not_run_reason=PKD_TASKS_REASON, paper_row=f"pkd-{strategy}") for strategy in ("skip", "last")]
            rows.append(Row(f"distilbert-{tag}", "distilbert", {**init, "student_layers": "every-other"}))
    # Rows that start from a corpus stage, shared with the tables that study them: TinyBERT's GD then
    # TD, without and with DA (tinybert-procedures' GD stage and its TinyBERT4 row, the same cells),
    # and MobileBERT's progressive transfer then fine-tuning (mobilebert-strategies' PKT stage and row:
    # one label, so the cells the two tables share are one run each).
    rows += [
        Row(GD_TD_LABEL, "tinybert", upstream=_general_distillation(), upstream_name=GENERAL_DISTILLATION),
        Row("tinybert4", "tinybert", upstream=_general_distillation(), upstream_name=GENERAL_DISTILLATION,
            augmented=True, tasks=GLUE_TASKS, not_run_reason=AUGMENTATION_TASKS_REASON),
        Row(PKT_LABEL, "finetune", upstream=_mobilebert_transfer(_PROGRESSIVE), upstream_name=f"{PKT_LABEL}-pretrain"),
    ]
    return rows


PKD_TASKS_REASON = "BERT-PKD's plug-in distils [CLS] vectors into classification and regression heads, not a span head"
AUGMENTATION_TASKS_REASON = ("kdbench augment rewrites sentence and sentence-pair rows, not SQuAD's passages and "
                             "answer spans (TinyBERT's augmentation script covers GLUE only)")

TINYBERT_OBJECTIVES = ("embd", "pred", "trm", "attn", "hidn")  # TinyBERT Table 3: each switched off in turn
TINYBERT_ABLATION_TASKS = ("cola", "sst2", "mrpc", "rte")


def tinybert_objective_rows() -> list[Row]:
    """TinyBERT's Table 3 at mini scale: task distillation (no GD, no DA) into the narrow student,
    with each objective switched off in turn; the full row is table 1's (shared runs)."""
    init = _student_keys(NARROW_STUDENT)
    return [Row("tinybert-td-3l-192", "tinybert", {**init}, paper_row="tinybert4")] + [
        Row(f"tinybert-td-3l-192-wo-{name}", "tinybert", {**init, f"no_{name}": True}, paper_row=f"wo-{name}")
        for name in TINYBERT_OBJECTIVES]


def tinybert_mapping_rows() -> list[Row]:
    """TinyBERT's Table 4 at mini scale: uniform (table 1's row), top and bottom layer mappings, 6 -> 3."""
    init = _student_keys(NARROW_STUDENT)
    return [Row("tinybert-td-3l-192", "tinybert", {**init}, paper_row="uniform")] + [
        Row(f"tinybert-td-3l-192-{mapping}", "tinybert", {**init, "mapping": mapping}, paper_row=mapping)
        for mapping in ("top", "bottom")]


MLM_TEACHER = "teacher-mlm"  # the pre-trained teacher with its masked-LM head adapted on the corpus
CORPUS = f"{OUTPUT}/corpus/glue-mini.txt"


def _pretraining(method: str, lr: float, **keys: Any) -> dict[str, Any]:
    """A corpus stage from the MLM-adapted teacher at the method's own learning rate (the spec's
    default lr is the fine-tuning one, and an explicit run value would win over the method's)."""
    return {"method": method, "teacher": f"${{{MLM_TEACHER}}}", "lr": lr, **keys}


def distilbert_ablation_rows() -> list[Row]:
    """DistilBERT's Table 4 at mini scale: pre-training distillation on the corpus (triple loss,
    student from every other teacher layer), each loss or the initialisation removed in turn, then
    fine-tuning on every task."""
    student = {"student": WIDE_STUDENT, "student_init": "teacher", "student_layers": "every-other"}
    variants = {"triple-loss": {}, "wo-cos": {"alpha_cos": 0.0}, "wo-mlm": {"alpha_mlm": 0.0},
                "wo-ce": {"alpha_ce": 0.0}, "random-init": {"student_init": "random", "student_layers": None}}
    rows = []
    for label, change in variants.items():
        keys = {k: v for k, v in {**student, **change}.items() if v is not None}
        rows.append(Row(label, "finetune", upstream=_pretraining("distilbert-pretrain", 5e-4, **keys)))
    return rows


def tinybert_procedure_rows() -> list[Row]:
    """TinyBERT's Table 2 at mini scale, into the narrow student: GD (general distillation on the
    corpus) + TD (task distillation) + DA (data augmentation), and each of the three left out
    (w/o TD: GD, then prediction distillation alone)."""
    general = _general_distillation()
    # Its Table 2 matches runs by label only: the paper's row keys, and for w/o DA table 1's GD + TD
    # label (a run's label is part of its folder name, so one label makes it one run for both tables).
    return [Row("tinybert4", "tinybert", upstream=general, upstream_name=GENERAL_DISTILLATION, augmented=True),
            Row("wo-gd", "tinybert", {**_student_keys(NARROW_STUDENT)}, augmented=True),
            Row("wo-td", "tinybert", {"mode": "prediction"}, upstream=general, upstream_name=GENERAL_DISTILLATION,
                augmented=True),
            Row(GD_TD_LABEL, "tinybert", upstream=general, upstream_name=GENERAL_DISTILLATION, paper_row="wo-da")]


GENERAL_DISTILLATION = "general-distillation"
GD_TD_LABEL = "tinybert-gd-td-3l-192"  # table 1's GD + TD row, which is also TinyBERT Table 2's w/o DA


def _general_distillation() -> dict[str, Any]:
    """TinyBERT's GD on the corpus into the narrow student: it distils the PRE-TRAINED teacher's
    layers (no masked-LM head needed), at the method's general-distillation learning rate."""
    return {"method": "tinybert", "mode": "general", "teacher": TEACHER_MODEL, "student": NARROW_STUDENT,
            "student_init": "random", "lr": 5e-5}


MOBILEBERT_STUDENT = "mobilebert-6l-384"
PKT_LABEL = "pkt"  # MobileBERT Table 8's progressive-transfer row, which is also a row of table 1
_PROGRESSIVE = {"strategy": "progressive", "progressive_schedule": "code"}


def _mobilebert_transfer(strategy: dict[str, Any]) -> dict[str, Any]:
    return _pretraining("mobilebert", 1.5e-3, student=MOBILEBERT_STUDENT, use_fmt=True, use_at=True, **strategy)


def mobilebert_strategy_rows() -> list[Row]:
    """MobileBERT's Table 8 at mini scale: auxiliary, joint, progressive knowledge transfer on the
    corpus into a 6-layer bottleneck student, then fine-tuning."""
    return [Row(label, "finetune", upstream=_mobilebert_transfer(strategy))
            for label, strategy in (("akt", {"strategy": "auxiliary"}), ("jkt", {"strategy": "joint"}),
                                    (PKT_LABEL, _PROGRESSIVE))]


def mobilebert_objective_rows() -> list[Row]:
    """MobileBERT's Table 9 at mini scale: the student pre-trained on the corpus by masked LM alone
    (bare), then with PD, + FMT, + AT (progressive transfer), each fine-tuned. PD + FMT + AT is the
    full progressive transfer: Table 8's PKT row, the same stage and cells."""
    from kdbench.methods.mobilebert import PD_OPTIMIZATION
    from kdbench.optimization import as_run_values

    # The teacher gives the student its shape and tokenizer only. The bare student is trained as PD's is
    # (LAMB, its warm-up and decay), so that the two rows differ in the objective alone.
    bare = {"method": "finetune", "teacher": f"${{{MLM_TEACHER}}}", "student": MOBILEBERT_STUDENT,
            "student_init": "random", **as_run_values(PD_OPTIMIZATION)}
    rows = [Row("bare", "finetune", upstream=bare)]
    for label, fmt in (("pd", False), ("pd-fmt", True)):
        rows.append(Row(label, "finetune", upstream=_pretraining(
            "mobilebert", 1.5e-3, student=MOBILEBERT_STUDENT, use_pd=True, use_fmt=fmt, use_at=False, **_PROGRESSIVE)))
    rows.append(Row(PKT_LABEL, "finetune", upstream=_mobilebert_transfer(_PROGRESSIVE), paper_row="pd-fmt-at"))
    return rows


def pkd_rows() -> list[Row]:
    """BERT-PKD's Table 2 (Skip vs Last): table 1's PKD rows, the same cells (so the same run folders)."""
    return [row for row in cross_method_rows() if row.method == "pkd"]


TABLE_ROWS = {
    "cross-method": cross_method_rows,
    "pkd-skip-last": pkd_rows,
    "tinybert-objectives": tinybert_objective_rows,
    "tinybert-mappings": tinybert_mapping_rows,
    "tinybert-procedures": tinybert_procedure_rows,
    "distilbert-ablation": distilbert_ablation_rows,
    "mobilebert-strategies": mobilebert_strategy_rows,
    "mobilebert-objectives": mobilebert_objective_rows,
}
TABLE_TASKS: dict[str, tuple[str, ...]] = {  # tables on a subset of the study's tasks (default: all)
    "pkd-skip-last": GLUE_TASKS,
    "distilbert-ablation": GLUE_TASKS,  # its paper table is a GLUE macro-score
    "tinybert-objectives": TINYBERT_ABLATION_TASKS,
    "tinybert-mappings": TINYBERT_ABLATION_TASKS,
    "tinybert-procedures": TINYBERT_ABLATION_TASKS,
    "mobilebert-strategies": ("sst2", "mrpc"),  # the tasks the paper's tables share with the study
    "mobilebert-objectives": ("sst2", "mrpc"),
}

# The papers' claims each table tests: row `better` beats row `worse` (kdbench.claims decides,
# per task, whether the paired seed difference exceeds the seed noise).
TABLE_CLAIMS: dict[str, list[Claim]] = {
    "cross-method": [
        Claim("Hinton et al.", "KD beats fine-tuning without a teacher (wide student)", "kd-3l", "finetune-3l"),
        Claim("Hinton et al.", "KD beats fine-tuning without a teacher (narrow student)", "kd-3l-192", "finetune-3l-192"),
        Claim("BERT-PKD", "patient KD (skip) beats vanilla KD", "pkd-skip-3l", "kd-3l"),
        Claim("BERT-PKD", "PKD-skip beats PKD-last (Table 2)", "pkd-skip-3l", "pkd-last-3l"),
        Claim("DistilBERT", "task distillation beats fine-tuning", "distilbert-3l", "finetune-3l"),
        Claim("TinyBERT", "task distillation (TD) beats vanilla KD (wide student)", "tinybert-td-3l", "kd-3l"),
        Claim("TinyBERT", "task distillation (TD) beats vanilla KD (narrow student)", "tinybert-td-3l-192", "kd-3l-192"),
        Claim("TinyBERT", "TinyBERT beats BERT-PKD (Table 1)", "tinybert-td-3l", "pkd-skip-3l"),
        Claim("TinyBERT", "general distillation before TD helps (Table 2)", GD_TD_LABEL, "tinybert-td-3l-192"),
        Claim("TinyBERT", "data augmentation helps GD + TD (Table 2)", "tinybert4", GD_TD_LABEL),
    ],
    "pkd-skip-last": [Claim("BERT-PKD", "PKD-skip beats PKD-last (Table 2)", "pkd-skip-3l", "pkd-last-3l")],
    "tinybert-objectives": [
        Claim("TinyBERT", f"every objective helps: removing {name} hurts (Table 3)", "tinybert-td-3l-192",
              f"tinybert-td-3l-192-wo-{name}") for name in TINYBERT_OBJECTIVES],
    "tinybert-procedures": [
        Claim("TinyBERT", "general distillation helps (Table 2, w/o GD)", "tinybert4", "wo-gd"),
        Claim("TinyBERT", "task distillation helps (Table 2, w/o TD)", "tinybert4", "wo-td"),
        Claim("TinyBERT", "data augmentation helps (Table 2, w/o DA)", "tinybert4", GD_TD_LABEL),
    ],
    "distilbert-ablation": [
        Claim("DistilBERT", f"the triple loss with teacher init beats {name} (Table 4: {delta} GLUE macro-score)",
              "triple-loss", label)
        for label, name, delta in (("wo-cos", "−L_cos", "−1.46"), ("wo-mlm", "−L_mlm", "−0.31"),
                                   ("wo-ce", "−L_ce", "−2.96"), ("random-init", "random init", "−3.69"))],
    "mobilebert-strategies": [
        Claim("MobileBERT", "joint transfer beats auxiliary transfer (Table 8)", "jkt", "akt"),
        Claim("MobileBERT", "progressive transfer beats joint transfer (Table 8)", PKT_LABEL, "jkt"),
    ],
    "mobilebert-objectives": [
        Claim("MobileBERT", "pre-training distillation (PD) beats the bare student (Table 9)", "pd", "bare"),
        Claim("MobileBERT", "adding FMT to PD helps (Table 9)", "pd-fmt", "pd"),
        Claim("MobileBERT", "adding AT to PD + FMT helps (Table 9)", PKT_LABEL, "pd-fmt"),
    ],
    "tinybert-mappings": [
        Claim("TinyBERT", "the uniform mapping beats the top mapping (Table 4)", "tinybert-td-3l-192",
              "tinybert-td-3l-192-top"),
        Claim("TinyBERT", "the uniform mapping beats the bottom mapping (Table 4)", "tinybert-td-3l-192",
              "tinybert-td-3l-192-bottom"),
    ],
}


def table_tasks(table: str, scale: MiniScale = MINI) -> list[TaskScale]:
    """The study's tasks ``table`` has columns for, in the study's order."""
    return [task for task in scale.tasks if task.name in TABLE_TASKS.get(table, (task.name,))]


def build_spec(table: str, scale: MiniScale = MINI) -> dict[str, Any]:
    """The sweep spec of ``table``: one teacher stage per task, one cell per row, task and seed."""
    if table not in TABLE_ROWS:
        raise KeyError(f"unknown reproduction table {table!r} (known: {', '.join(sorted(TABLE_ROWS))})")
    rows = TABLE_ROWS[table]()
    tasks = table_tasks(table, scale)
    stages = {f"{TEACHER_STAGE}-{task.name}": teacher_stage(scale, task) for task in tasks
              if any(_needs_task_teacher(row) for row in rows)}
    if any(row.upstream or row.augmented for row in rows):
        corpus = {"task": "corpus", "corpus": CORPUS, "max_train_samples": scale.corpus_lines,
                  "epochs": scale.pretraining_epochs}
        # (with DA only, no run refers to the MLM teacher: the augmentation step runs it first)
        if any(row.augmented for row in rows) or any(
                f"${{{MLM_TEACHER}}}" in row.upstream.values() for row in rows if row.upstream):
            stages[MLM_TEACHER] = {"method": "finetune", "student": TEACHER_MODEL, "student_init": "pretrained",
                                   "seed": 1, **corpus}
        for row in rows:
            if row.upstream:
                stages[row.stage] = {"seed": 1, **corpus, **row.upstream}
    cells = []
    for row in rows:
        for task in tasks:
            if not row.runs_on(task.name):
                continue
            for seed in task.seeds:
                cell: dict[str, Any] = {"name": f"{row.label}-{task.name}-s{seed}", "label": row.label,
                                        "method": row.method, "task": task.name, "seed": seed}
                if row.augmented:  # the whole augmented file: it was built from the task's rows in use
                    cell["train_file"] = augmented_path(task.name, scale)
                    if task.augmented_cache_budget_mb is not None:
                        cell["train.teacher_cache_budget_mb"] = task.augmented_cache_budget_mb
                else:
                    cell.update(_task_keys(task))
                if row.upstream:  # the row's pre-trained student, fine-tuned or distilled
                    cell.update(student=f"${{{row.stage}}}", student_init="pretrained")
                if _needs_task_teacher(row):  # (a finetune cell uses it for the student's shape and tokenizer)
                    cell["teacher"] = f"${{{TEACHER_STAGE}-{task.name}}}"
                if row.method == "tinybert" and row.keys.get("mode") != "prediction":
                    cell["intermediate_epochs"] = task.intermediate_epochs
                cell.update(row.keys)
                cells.append(cell)
    return {
        "name": f"reproduction-{table}",
        "output": OUTPUT,
        "defaults": {"batch_size": scale.batch_size, "max_seq_length": scale.max_seq_length,
                     "epochs": scale.student_epochs, "lr": scale.student_lr},
        "stages": stages,
        "cells": cells,
    }



def augmented_path(task: str, scale: MiniScale = MINI) -> str:
    return f"{OUTPUT}/augmented/{task}-x{scale.augmentation_variants}.tsv"


def _needs_task_teacher(row: Row) -> bool:
    """Every cell names its task's fine-tuned teacher, except fine-tuning a row's pre-trained student."""
    return not (row.upstream and row.method == "finetune")


def write_spec(table: str, folder: Path = SPEC_FOLDER, scale: MiniScale = MINI) -> Path:
    path = folder / f"{table}.yaml"
    header = (f"# kdbench reproduction study, mini scale: table {table!r}. Generated by kdbench.reproduce "
              f"(do not edit; change MiniScale and regenerate).\n# Run:  kdbench reproduce {table} "
              "--executor local|slurm [--profile NAME]\n")
    path.write_text(header + yaml.safe_dump(build_spec(table, scale), sort_keys=False, width=120))
    return path


# Why the study leaves out the tasks and rows its tables have no cells for (the "–" of an ours row).
TASKS_LEFT_OUT = ("MNLI, QQP and QNLI have no training set on the offline machines the study ran on, and at "
                  "105,000-393,000 pairs a cell would cost 6-25x an SST-2 cell of the study (16,000 rows) on 2 CPU "
                  "cores; BERT-style models stay at WNLI's majority class, so it separates no method; the papers' "
                  "BERT-large and BERT-base reference rows have no counterpart at mini scale")
_SQUAD_IN_TABLE_ONE_ONLY = "SQuAD runs in table 1 only (a cell costs several SST-2 cells on 2 CPU cores)"
TABLE_TASKS_WHY: dict[str, str] = {  # why a table runs fewer of the study's tasks than it has columns for
    "mobilebert-strategies": _SQUAD_IN_TABLE_ONE_ONLY,
    "mobilebert-objectives": _SQUAD_IN_TABLE_ONE_ONLY,
}
PENDING_WHERE = ("what is left, in order and with its cost on 2 CPU cores: results/reproduction/README.md, "
                 "'Order of work for the next sessions'")


def plan_row_key(table: str, row: Row) -> str:
    """The key ``row`` has in ``table``'s rendered table: the paper table's row key; table 1's label."""
    return row.label if table == "cross-method" else row.paper_row or row.label


def study_plan(table: str, scale: MiniScale = MINI, seeds_not_run: tuple[SeedsNotRun, ...] = ()) -> StudyPlan:
    """What the study runs for ``table``: its rows (by the paper table's row keys; table 1's by label,
    with the fine-tuned teachers as row ``teacher``), their tasks and seeds, and why the rest is not
    run, so the rendered table marks every empty cell (:mod:`kdbench.tables.plan`); ``seeds_not_run``:
    the planned seeds its records lack on purpose (:mod:`kdbench.reproduce.not_run`)."""
    from kdbench.tables.plan import PlannedRow, StudyPlan

    tasks = table_tasks(table, scale)
    cross_method = table == "cross-method"
    rows = [PlannedRow(key=plan_row_key(table, row),
                       tasks=tuple(task.name for task in tasks if row.runs_on(task.name)), method=row.method,
                       student=row.stage if row.upstream else str(row.keys.get("student", "")),
                       teacher=TEACHER_STAGE if _needs_task_teacher(row) else "", not_run_reason=row.not_run_reason)
            for row in TABLE_ROWS[table]()]
    if cross_method:  # the fine-tuned teachers are a row of table 1, one seed each
        rows.append(PlannedRow(key=TEACHER_STAGE, tasks=tuple(task.name for task in tasks), method="finetune",
                               student=TEACHER_MODEL, seeds=1))
    left_out = "; ".join(filter(None, (TABLE_TASKS_WHY.get(table), TASKS_LEFT_OUT)))
    return StudyPlan(tuple(rows), seeds={task.name: len(task.seeds) for task in tasks}, not_in_study=left_out,
                     pending_where=PENDING_WHERE, seeds_not_run=seeds_not_run)

