"""kdbench's own reproduction of the four papers' findings at a scale a CPU or one GPU allows ("mini").

The papers distil BERT-base (12 layers, hidden 768) into 4- and 6-layer students. The mini scale
keeps their structure at half depth: the teacher is the pre-trained MiniLM-L6 (``minilm-l6``: 6
layers, hidden 384, 12 heads), fine-tuned on each task's full training set, and the students are
``teacher-3l`` (3 layers of the teacher's width: uniform, skip and last mappings all exist) and
``teacher-3l-192`` (3 layers at half width, where TinyBERT's projection matters).

Every table is a sweep spec generated here (``results/reproduction/<table>.yaml``) from one
:class:`MiniScale` and the table's :class:`Row` list (``TABLE_ROWS``): a row is a method with fixed
keys on each of the table's tasks and seeds, optionally fine-tuning or distilling from a corpus
stage it runs once (its ``upstream``: DistilBERT pre-training, MobileBERT transfer, TinyBERT GD).
``kdbench reproduce TABLE`` builds the table's :class:`Prerequisite` files (the GLUE corpus), runs
the spec (resumably, with any executor), exports the records into
``results/reproduction/<table>/records`` and renders the paper table beside the published numbers
(``PAPER_TABLES``), the paper's claims against seed noise (``TABLE_CLAIMS``, :mod:`kdbench.claims`)
and score-vs-cost plots. Paths in the specs are relative to the folder the command runs in.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from enum import Enum
from pathlib import Path
from typing import TYPE_CHECKING, Any

import yaml

from kdbench.claims import Claim
from kdbench.config import ConfigError

if TYPE_CHECKING:
    from kdbench.tables.plan import StudyPlan

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


@dataclass(frozen=True)
class MiniScale:
    """The settings shared by every table of the study (documented in its README)."""

    tasks: tuple[TaskScale, ...] = (
        TaskScale("cola", (1, 2, 3, 4, 5), intermediate_epochs=20),
        TaskScale("sst2", (1, 2, 3), max_train_samples=16000, intermediate_epochs=5),
        TaskScale("mrpc", (1, 2, 3, 4, 5)),
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


class PrerequisiteKind(Enum):
    GLUE_CORPUS = "glue-corpus"  # kdbench corpus glue --dedupe over the study's GLUE tasks
    AUGMENTED = "augmented"  # kdbench augment of one task's training set with a stage's MLM teacher
    SQUAD_SPLIT = "squad-split"  # SQuAD v1.1 dev split by article into a training and a held-out file


@dataclass(frozen=True)
class Prerequisite:
    """Files a table's runs read that no run produces, built by ``kdbench reproduce`` before the
    runs that read them (their folders hash the files' content) and kept when present: the GLUE
    corpus, the SQuAD split, or a task's augmented training set, which needs a stage's model
    (``after_stage``)."""

    kind: PrerequisiteKind
    paths: tuple[str, ...]  # relative to the folder the command runs in, like the spec's output
    description: str
    after_stage: str | None = None  # the stage whose model/ the builder needs (run first)
    task: str | None = None  # the task an augmented training set is built from

    @property
    def present(self) -> bool:
        return all(Path(path).is_file() for path in self.paths)

    def ensure(self, scale: MiniScale = MINI, stage_model: Path | None = None) -> bool:
        """Build the files unless present; True when they were built now."""
        if self.present:
            return False
        if self.kind is PrerequisiteKind.GLUE_CORPUS:
            from kdbench.tasks.corpus import write_glue_corpus

            write_glue_corpus(scale.corpus_tasks, None, self.paths[0], dedupe=True)
        elif self.kind is PrerequisiteKind.SQUAD_SPLIT:
            _split_squad(scale, Path(self.paths[0]).parent)
        else:
            from kdbench.augment_cli import augment_task_file

            if stage_model is None or not stage_model.is_dir():
                raise ConfigError(f"{self.paths[0]}: needs the model of stage {self.after_stage!r}, not found at "
                                  f"{stage_model}")
            augment_task_file(self.task, mlm_model=str(stage_model), out=self.paths[0],
                              n_aug=scale.augmentation_variants, max_samples=scale.task(self.task).max_train_samples)
        return True


def _split_squad(scale: MiniScale, folder: Path) -> None:
    from kdbench.config import DataConfig
    from kdbench.tasks.squad import V1, SquadTask, split_articles

    data_dir = DataConfig().resolved_data_dir()
    if data_dir is None:
        raise ConfigError("the SQuAD split reads dev-v1.1.json from the data dir: set $KDBENCH_DATA_DIR")
    split_articles(SquadTask(V1).find_file(data_dir, "dev"), folder, scale.squad_train_articles)


GLUE_CORPUS = Prerequisite(PrerequisiteKind.GLUE_CORPUS, (CORPUS,),
                           "the GLUE training sentences of the study's tasks, deduplicated (kdbench corpus glue)")


def augmented_path(task: str, scale: MiniScale = MINI) -> str:
    return f"{OUTPUT}/augmented/{task}-x{scale.augmentation_variants}.tsv"


def prerequisites(table: str, scale: MiniScale = MINI) -> list[Prerequisite]:
    """The table's prerequisite files, in build order (those needing a stage last)."""
    rows = TABLE_ROWS[table]()
    found = [GLUE_CORPUS] if any(row.upstream for row in rows) or any(row.augmented for row in rows) else []
    for task in table_tasks(table, scale):
        if task.name == "squad" and task.train_file and task.dev_file:
            found.append(Prerequisite(PrerequisiteKind.SQUAD_SPLIT, (task.train_file, task.dev_file),
                                      f"SQuAD v1.1 dev, its first {scale.squad_train_articles} articles to train on and "
                                      "the rest held out"))
    if any(row.augmented for row in rows):
        tasks = [t.name for t in table_tasks(table, scale) if any(row.augmented and row.runs_on(t.name) for row in rows)]
        found += [Prerequisite(PrerequisiteKind.AUGMENTED, (augmented_path(task, scale),),
                               f"{task}'s training set augmented by TinyBERT's DA with the MLM-adapted teacher "
                               "(kdbench augment)", after_stage=MLM_TEACHER, task=task)
                  for task in tasks]
    return found


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


# ---------------------------------------------------------------------------------------------
# Records and rendering
# ---------------------------------------------------------------------------------------------
# What a record keeps of a run: its result, config, loss curves and the model's architecture
# (``model/config.json``: tables measure parameters and FLOPs from it, so they re-render anywhere).
RECORD_FILES = ("result.json", "config.yaml", "loss_terms.jsonl", "model/config.json")
MINI_SCALE_NOTE = ("ours = kdbench's mini scale: teacher MiniLM-L6 (6 layers, hidden 384) fine-tuned per task, "
                   "students of 3 layers (`teacher-3l`, `teacher-3l-192`) or the 6-layer bottleneck "
                   "`mobilebert-6l-384`, not the paper's models; see results/reproduction/README.md")
# reproduction table -> the kdbench table spec that renders it
PAPER_TABLES = {"cross-method": "cross-method", "pkd-skip-last": "pkd-table2",
                "tinybert-objectives": "tinybert-v5-table3", "tinybert-mappings": "tinybert-v5-table4",
                "tinybert-procedures": "tinybert-v5-table2", "distilbert-ablation": "distilbert-table4",
                "mobilebert-strategies": "mobilebert-table8", "mobilebert-objectives": "mobilebert-table9"}


def records_folder(table: str, root: Path = SPEC_FOLDER) -> Path:
    return root / table / "records"


def export_records(spec_path: Path, runs_output: Path, destination: Path, supersede: bool = False) -> list[Path]:
    """Copy the record files (never model weights) of every run of the spec that has a record into
    ``destination/<run folder>/``; returns the copied run folders.

    A completed record already there from another training of the same config (another machine or
    session: a different ``created_at``) is kept, and named on standard error, unless ``supersede``:
    records that read its model were trained on its weights, which a new training need not repeat.
    A run that did not complete never replaces a completed record, ``supersede`` or not, and an
    interrupted run is not exported at all: it resumes when the table runs again and is exported
    once it completes (a failed run is, where no completed record is: a table notes its failure)."""
    import json
    import shutil
    import sys

    from kdbench.sweep import expand, load_spec

    copied = []
    runs = expand(load_spec(spec_path), output=runs_output).runs.values()
    for run in runs:
        if not (run.run_dir / "result.json").is_file():
            continue
        target = destination / run.run_dir.name
        kept = target / "result.json"
        fresh_text = (run.run_dir / "result.json").read_bytes()
        kept_text = kept.read_bytes() if kept.is_file() else None
        if fresh_text == kept_text:
            # Already exported. A teacher rebuilt by rebuild_teacher.py holds the committed record beside
            # weights of its own training, whose files (model/config.json) must not replace the record's.
            continue
        reason = _why_not_exported(json.loads(fresh_text), json.loads(kept_text) if kept_text else None, supersede)
        if reason:
            print(f"[kdbench reproduce] {run.run_dir} not exported to {target}: {reason}", file=sys.stderr, flush=True)
            continue
        target.mkdir(parents=True, exist_ok=True)
        for name in RECORD_FILES:
            if (run.run_dir / name).is_file():
                (target / name).parent.mkdir(parents=True, exist_ok=True)
                shutil.copy2(run.run_dir / name, target / name)
        copied.append(target)
    _write_stage_roles(destination, {run.run_dir.name: stage_role_name(run.stage, run.values.get("task"))
                                     for run in runs if run.stage})
    return copied


def stage_role_name(stage: str, task: str | None) -> str:
    """The role a stage plays across tasks: ``teacher-mrpc`` and ``teacher-rte`` are both the task's
    fine-tuned ``teacher`` (one table row spans the tasks); other stages keep their name."""
    suffix = f"-{task}"
    return stage[: -len(suffix)] if task and stage.endswith(suffix) and len(stage) > len(suffix) else stage


def _write_stage_roles(destination: Path, roles: dict[str, str]) -> None:
    """Name each stage run with a record here (the teachers) by its stage in ``stage_roles.json``
    beside the records: a table groups cells by their teacher's role, and records must not need the
    run folders for it. Stages without a record are left out: nothing here reads them, and the name
    of a stage not run yet can change (it hashes prerequisite files that may not exist yet)."""
    import json

    from kdbench.tables.building import STAGE_ROLES_FILE

    path = destination / STAGE_ROLES_FILE
    known = json.loads(path.read_text()) if path.is_file() else {}
    merged = {name: role for name, role in {**known, **roles}.items() if (destination / name).is_dir()}
    if merged != known:
        destination.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(merged, indent=1, sort_keys=True) + "\n")


def _why_not_exported(fresh: dict[str, Any], committed: dict[str, Any] | None, supersede: bool) -> str | None:
    """Why the run's record ``fresh`` is not copied where ``committed`` (or nothing) is; None to copy it."""
    from kdbench.records import COMPLETED, INTERRUPTED

    if fresh.get("status") == INTERRUPTED:
        return "it was interrupted; it resumes when the table runs again and is exported when it completes"
    if committed and committed.get("status") == COMPLETED and fresh.get("status") != COMPLETED:
        # e.g. a stage retrained here and stopped half-way: never lose a finished result to it
        return f"it is {fresh.get('status')}, not completed; the completed record stays"
    conflict = _other_training(fresh, committed)
    same_weights = conflict and _same_weights(fresh, committed)
    if same_weights:
        return (f"the record kept there is another training that wrote the same weights (sha256 "
                f"{same_weights[:12]}), so records that read either agree; nothing to rerun")
    if conflict and not supersede:
        return f"{conflict}; --supersede-records replaces it (rerun every record that read its model)"
    return None


def _other_training(fresh: dict[str, Any], old: dict[str, Any] | None) -> str | None:
    """Why the completed record ``old`` is another training than ``fresh``; None when it is the same
    run (or ``old`` is absent or unfinished, so the new one may replace it)."""
    from kdbench.records import COMPLETED

    if old is None:
        return None
    if old.get("status") != COMPLETED or old.get("created_at") == fresh.get("created_at"):
        return None
    return (f"the record kept there is a completed run created {old.get('created_at')} (metrics {old.get('metrics')}), "
            f"this one was created {fresh.get('created_at')} (metrics {fresh.get('metrics')})")


def _same_weights(fresh: dict[str, Any], old: dict[str, Any]) -> str | None:
    """The sha256 of the weights both records wrote, when both name them and they are equal (a
    deterministic retraining: same code, libraries and thread count); else None."""
    written = [(record.get("weights_sha256") or {}).get("model") for record in (fresh, old)]
    return written[0] if written[0] and written[0] == written[1] else None


def render(table: str, records: Path, out: Path) -> Path:
    """The paper-style table of ``records`` as markdown (published rows above measured), written to
    ``out``, and beside it ``claims.md``: each of the paper's claims the table tests, per task, with
    the paired seed difference and its verdict against seed noise."""
    from kdbench import tables

    text = tables.render(tables.build_table(PAPER_TABLES[table], records, plan=study_plan(table)), "markdown")
    text += f"\n- {MINI_SCALE_NOTE}\n"
    if table == "tinybert-procedures":
        text += (f"- ours: DA with {MINI.augmentation_variants} variants per example (paper: 20), GD on the study's "
                 "GLUE corpus; w/o TD = GD, then prediction distillation alone\n")
    out.write_text(text)
    render_claims(table, records, out.parent / "claims.md")
    return out


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


def study_plan(table: str, scale: MiniScale = MINI) -> StudyPlan:
    """What the study runs for ``table``: its rows (by the paper table's row keys; table 1's by label,
    with the fine-tuned teachers as row ``teacher``), their tasks and seeds, and why the rest is not
    run, so the rendered table marks every empty cell (:mod:`kdbench.tables.plan`)."""
    from kdbench.tables.plan import PlannedRow, StudyPlan

    tasks = table_tasks(table, scale)
    cross_method = table == "cross-method"
    rows = [PlannedRow(key=row.label if cross_method else row.paper_row or row.label,
                       tasks=tuple(task.name for task in tasks if row.runs_on(task.name)), method=row.method,
                       student=row.stage if row.upstream else str(row.keys.get("student", "")),
                       teacher=TEACHER_STAGE if _needs_task_teacher(row) else "", not_run_reason=row.not_run_reason)
            for row in TABLE_ROWS[table]()]
    if cross_method:  # the fine-tuned teachers are a row of table 1, one seed each
        rows.append(PlannedRow(key=TEACHER_STAGE, tasks=tuple(task.name for task in tasks), method="finetune",
                               student=TEACHER_MODEL, seeds=1))
    left_out = "; ".join(filter(None, (TABLE_TASKS_WHY.get(table), TASKS_LEFT_OUT)))
    return StudyPlan(tuple(rows), seeds={task.name: len(task.seeds) for task in tasks}, not_in_study=left_out,
                     pending_where=PENDING_WHERE)


def paper_metrics(table: str) -> dict[str, str]:
    """Task -> the dev metric the paper's table prints for it (its first column of that task), so
    a claim is tested on the paper's own metric: TinyBERT's and MobileBERT's ablation tables print
    MRPC's accuracy, not its F1. A cross-method table uses each task's main metric (empty mapping)."""
    from kdbench.tables.specs import TableSpec, load_spec

    spec = load_spec(PAPER_TABLES[table])
    metrics: dict[str, str] = {}
    if isinstance(spec, TableSpec):
        for column in spec.columns:
            for task, metric in column.run:
                metrics.setdefault(task, metric)
    return metrics


def _paper_evaluations(table: str, frame: Any, rows: Mapping[str, Any]) -> Any:
    """The table's rows' runs scored on the dev evaluation the paper's script reports (its spec's
    ``evaluation`` rules, e.g. TinyBERT's accuracy-best MRPC evaluation), as the rendered table is."""
    from kdbench.evaluations import reselect
    from kdbench.tables.specs import TableSpec, load_spec

    spec = load_spec(PAPER_TABLES[table])
    if frame is None or len(frame) == 0 or not isinstance(spec, TableSpec) or not spec.evaluation:
        return frame
    in_rows = frame.index[frame["label"].isin(list(rows))] if "label" in frame else []
    return reselect(frame, spec.evaluation_rules(), only=in_rows)


def render_claims(table: str, records: Path, out: Path) -> Path:
    from kdbench.claims import VERDICT_LEGEND, claims_table
    from kdbench.records import load_records

    frame = load_records(records) if records.is_dir() else None
    tasks = [task.name for task in table_tasks(table)]
    rows = {row.label: row for row in TABLE_ROWS[table]()}
    frame = _paper_evaluations(table, frame, rows)
    text = (f"**Claims tested by table {table!r}** (regenerated by `kdbench reproduce {table} --render-only`; "
            f"each on the dev metric the paper's table prints for the task)\n\n"
            + claims_table(TABLE_CLAIMS.get(table, []), frame, tasks,
                           applies=lambda claim, task: rows[claim.better].runs_on(task) and rows[claim.worse].runs_on(task),
                           metrics=paper_metrics(table))
            + "\n\n" + VERDICT_LEGEND + "\n")
    text += "\n" + compute_summary(frame) + "\n"
    out.write_text(text)
    return out


def compute_summary(frame: Any) -> str:
    """The training time behind a table: completed runs and their summed ``train_seconds``, and the
    kdbench commits that produced them."""
    if frame is None or len(frame) == 0:
        return "Compute: no run recorded yet."
    done = frame[frame["status"] == "completed"]
    hours = float(done["train_seconds"].fillna(0).sum()) / 3600 if "train_seconds" in done else 0.0
    commits = sorted({r["commit"][:7] for r in done.get("kdbench_revision", []) if isinstance(r, dict) and r.get("commit")})
    return (f"Compute: {len(done)} completed runs, {hours:.2f} hours of training (summed `train_seconds`; "
            f"the machine is named in the study's README); commits: {', '.join(commits) or 'unknown'}.")


def plot(records: Path, out_dir: Path) -> list[Path]:
    """Score-vs-cost plots (FLOPs and parameters; PNG) per task of the records."""
    from kdbench.plots import plot_tradeoffs, tradeoff_frame
    from kdbench.records import load_records

    frame = tradeoff_frame(load_records(records, include_failed=False))
    written = plot_tradeoffs(frame, out_dir, title_prefix="kdbench mini-scale study, ")
    for path in [p for p in written if p.suffix == ".svg"]:  # PNG only: SVGs bloat the repository
        path.unlink()
    return [p for p in written if p.suffix == ".png"]


# ---------------------------------------------------------------------------------------------
# Running part of a table
# ---------------------------------------------------------------------------------------------
def select_runs(spec: dict[str, Any], patterns: list[str]) -> dict[str, Any]:
    """The spec with only the cells whose name matches one of ``patterns`` (shell-style, e.g.
    ``kd-3l-*``, ``*-mrpc-s[1-3]``); a pattern naming a stage (``teacher-rte``) runs that stage alone,
    as a cell with the stage's keys (the same run folder). The stages the kept cells refer to come
    along when the sweep resolves them. A pattern that matches nothing is an error naming it."""
    from fnmatch import fnmatchcase

    cells, stages = spec.get("cells") or [], spec.get("stages") or {}
    for pattern in patterns:
        if not any(fnmatchcase(cell["name"], pattern) for cell in cells) and \
                not any(fnmatchcase(name, pattern) for name in stages):
            example = cells[0]["name"] if cells else "none"
            raise ConfigError(f"--only {pattern!r} matches no cell or stage of {spec['name']} "
                              f"(cells are named like {example!r}; stages: {', '.join(stages) or 'none'})")
    chosen = [cell for cell in cells if any(fnmatchcase(cell["name"], pattern) for pattern in patterns)]
    needed = _referenced_stages(chosen, stages)
    alone = [{"name": name, **keys} for name, keys in stages.items()
             if name not in needed and any(fnmatchcase(name, pattern) for pattern in patterns)]
    return {**spec, "cells": alone + chosen}


def _referenced_stages(cells: list[dict[str, Any]], stages: dict[str, Any]) -> set[str]:
    """The stages ``cells`` refer to, directly or through other stages (a stage they need runs
    anyway: it is not added a second time as a cell of its own)."""
    import json

    from kdbench.sweep import REFERENCE, RUN_DIR_SUFFIX

    found: set[str] = set()
    todo = [json.dumps(cells, default=str)]
    while todo:
        for reference in REFERENCE.findall(todo.pop()):
            name = reference.removesuffix(RUN_DIR_SUFFIX)
            if name in stages and name not in found:
                found.add(name)
                depends_on = [f"${{{other}}}" for other in stages[name].get("depends_on") or []]
                todo.append(json.dumps([stages[name], depends_on], default=str))
    return found


def recorded_cells(runs: dict[str, Any], records: Path) -> set[str]:
    """The names of the cells among ``runs`` (an expanded sweep's runs) that already have a completed
    record in ``records``.

    A record's folder is named like its run's folder, and run folders are named by content, not
    location (:func:`kdbench.fingerprint.run_identity`): a cell planned on another machine or into
    another runs folder finds the record exported from the first training."""
    from kdbench.sweep import record_completed

    return {name for name, run in runs.items() if run.kind == "cell" and record_completed(records / run.run_dir.name)}


def recorded_cells_to_retrain(runs: dict[str, Any], records: Path) -> list[str]:
    """The cells among ``runs`` that have a completed record in ``records`` but no completed run folder
    here: a sweep without ``--missing`` trains them again (e.g. committed records on a new machine)."""
    from kdbench.sweep import record_completed

    return sorted(name for name in recorded_cells(runs, records) if not record_completed(runs[name].run_dir))


def _first_names(names: Sequence[str], shown: int = 8) -> str:
    """``names`` for a message: the first ``shown``, then "..." if there are more."""
    return ", ".join(names[:shown]) + (", ..." if len(names) > shown else "")


def _say_which_recorded_cells_retrain(run_spec: Path, output: Path, records: Path) -> None:
    from kdbench.sweep import expand, load_spec

    again = recorded_cells_to_retrain(expand(load_spec(run_spec), output=output).runs, records)
    if again:
        shown = _first_names(again)
        print(f"[kdbench reproduce] {len(again)} chosen cell(s) have a completed record in {records} but no "
              f"completed run folder in {output}, so they train again ({shown}); --missing leaves them out",
              flush=True)


def stages_retrained_elsewhere(table: str, spec_path: Path, run_spec: Path, output: Path,
                               records: Path) -> dict[str, str]:
    """The stages this run of the table will train (those its chosen runs and the prerequisites they
    read need, with no completed run folder here) whose record in ``records`` was trained on other
    hardware or libraries than this machine's: stage name -> what differs.

    Retrained on the processor, thread count and library versions its record names, a stage writes
    its recorded weights bit for bit; elsewhere its weights differ in their last bits, so the cells run
    now read another teacher than the recorded cells did (their claims read *teachers differ*)."""
    import json

    from kdbench.records import compute_environment, library_versions
    from kdbench.sweep import expand, load_spec, record_completed

    spec = load_spec(spec_path)
    stage_folders = {name: run.run_dir for name, run in expand(spec, output=output).runs.items() if run.kind == "stage"}
    chosen = expand(load_spec(run_spec), output=output).runs
    needed = {name for name in chosen if name in stage_folders}
    read = _strings_of(chosen.values())
    for prerequisite in prerequisites(table):  # a stage a prerequisite needs (DA's MLM teacher) may be no run's
        stage = prerequisite.after_stage
        if stage and not prerequisite.present and any(path in read for path in prerequisite.paths):
            stage_folders[stage] = expand(_stage_alone(spec, stage), output=output).runs[stage].run_dir
            needed.add(stage)
    here = {"machine": compute_environment(), "versions": library_versions()}
    found = {}
    for name in sorted(needed):
        record_path = records / stage_folders[name].name / "result.json"
        if record_completed(stage_folders[name]) or not record_completed(record_path.parent):
            continue
        record = json.loads(record_path.read_text())
        differences = _hardware_and_library_differences(record, here)
        if differences:
            found[name] = differences
    return found


def _hardware_and_library_differences(record: dict[str, Any], here: dict[str, Any]) -> str:
    """What of the processor, threads, GPU and torch/transformers versions differs between a record
    and ``here`` (``{"machine": ..., "versions": ...}``), as "recorded X, here Y" phrases; "" if nothing."""
    def describe(machine: dict[str, Any]) -> str:
        text = f"{machine.get('cpu')}, {machine.get('cpu_capability')}, {machine.get('torch_threads')} threads"
        return text + (f", GPU {machine['gpu']}" if machine.get("gpu") else "")

    phrases = []
    machine = record.get("machine")
    if not machine:
        phrases.append(f"its record predates the machine field; here {describe(here['machine'])}")
    elif machine != here["machine"]:
        phrases.append(f"recorded on {describe(machine)}, here {describe(here['machine'])}")
    versions = record.get("versions") or {}
    for library in ("torch", "transformers"):
        if versions.get(library) and versions[library] != here["versions"].get(library):
            phrases.append(f"{library} {versions[library]} recorded, {here['versions'].get(library)} here")
    return "; ".join(phrases)


def _say_which_stages_retrain_elsewhere(table: str, spec_path: Path, run_spec: Path, output: Path,
                                        records: Path) -> None:
    found = stages_retrained_elsewhere(table, spec_path, run_spec, output, records)
    if found:
        listed = "; ".join(f"{name} ({why})" for name, why in found.items())
        print(f"[kdbench reproduce] {len(found)} recorded stage(s) train again on other hardware or libraries than "
              f"their records in {records} name (or on a machine a record does not name): {listed}. Trained on other "
              "hardware or libraries, a stage writes other weights in their last bits, so the cells run now read "
              "other stage weights than the recorded cells did (claims pairing them read 'teachers differ' where "
              "the stage is a teacher); on the machine and libraries its record names, it trains again bit for "
              "bit.", flush=True)


@dataclass(frozen=True)
class TrainingEstimate:
    """How long the runs still to do will train, judged from the records: a run by its own earlier
    training where one is recorded (a teacher, a corpus stage), a cell by the median ``train_seconds``
    of its row's recorded runs on the same task or, where its row has none there, of the recorded runs
    of the same method and student on that task that train as many steps (another row of one
    ablation: a mapping, an objective left out; not a row on another training file or with other
    epochs, such as TinyBERT's DA rows beside its rows without DA). On the machines that wrote those
    records: a guide, not a promise."""

    seconds: float
    estimated: int
    unestimated: tuple[str, ...]  # the runs with no record to judge from
    by_another_row: int = 0  # of ``estimated``, those judged by another row of their method and student

    @classmethod
    def of(cls, runs: dict[str, Any], records: Path) -> TrainingEstimate:
        """``runs``: the runs to do (name -> an expanded sweep's run)."""
        import statistics

        from kdbench.records import load_records

        frame = load_records(records, include_failed=False) if records.is_dir() else None
        if frame is None or "train_seconds" not in frame:
            frame = None
        else:
            frame = frame[frame["status"] == "completed"].dropna(subset=["train_seconds"])
        own: dict[str, float] = {}
        by_row: dict[tuple[Any, Any], list[float]] = {}
        by_model: dict[tuple[Any, ...], list[float]] = {}
        for _, record in frame.iterrows() if frame is not None else []:
            took = float(record["train_seconds"])
            own[Path(record["run_dir"]).name] = took
            by_row.setdefault((record.get("label"), record["task"]), []).append(took)
            workload = _workload(record.get("config") or {})
            by_model.setdefault((record.get("method"), record.get("student"), record["task"], workload), []).append(took)
        seconds, estimated, by_another_row, unestimated = 0.0, 0, 0, []
        for name, run in runs.items():
            past = own.get(run.run_dir.name)
            if past is None and run.values.get("label"):
                task = run.values.get("task")
                times = by_row.get((run.values["label"], task))
                if not times:
                    times = by_model.get((run.values.get("method"), run.values.get("student"), task,
                                          _workload(_resolved_config(run.values))))
                    by_another_row += bool(times)
                past = statistics.median(times) if times else None
            if past is None:
                unestimated.append(name)
            else:
                seconds, estimated = seconds + past, estimated + 1
        return cls(seconds, estimated, tuple(unestimated), by_another_row)

    def __str__(self) -> str:
        if not self.estimated and not self.unestimated:
            return "Nothing left to train."
        shown = _first_names(self.unestimated)
        if not self.estimated:
            return f"No record to judge the training time of the {len(self.unestimated)} runs to do from ({shown})."
        text = (f"Training time of the {self.estimated} runs to do that the records can judge (stages included): "
                f"about {self.seconds / 3600:.1f} h on the machines that wrote them")
        if self.by_another_row:
            text += (f" ({self.by_another_row} of them judged by another row of the same method and student on "
                     "their task)")
        if self.unestimated:
            text += f"; no record to judge the other {len(self.unestimated)} from ({shown})"
        return text + "."


def _workload(config: Mapping[str, Any]) -> tuple[Any, ...]:
    """What sets how many steps a run trains, from its config as a record stores it: the training
    file's name, the sample cap, the epochs and step limit, and the method's own epoch and step counts
    (TinyBERT's ``intermediate_epochs``, ...)."""
    data, train = config.get("data") or {}, config.get("train") or {}
    train_file = data.get("train_file")
    own_counts = tuple(sorted((name, value) for name, value in (config.get("method_params") or {}).items()
                              if name.endswith(("_epochs", "_steps"))))
    return (Path(train_file).name if train_file else None, data.get("max_train_samples"), train.get("epochs"),
            train.get("max_steps"), own_counts)


def _resolved_config(values: Mapping[str, Any]) -> dict[str, Any]:
    """A sweep run's config as its record will store it: method parameters with their defaults."""
    from kdbench.config import build_run_config
    from kdbench.plugins import METHODS

    config = build_run_config(dict(values))
    method = METHODS.get(config.method).from_overrides(config.method_params)
    return replace(config, method_params=method.params_dict()).to_dict()


def _runs_to_do(runs: dict[str, Any], cells: set[str]) -> dict[str, Any]:
    """``cells`` and the stages they need, directly or through other stages, not yet completed in
    their run folders."""
    from kdbench.sweep import record_completed

    needed, todo = set(), list(cells)
    while todo:
        name = todo.pop()
        if name not in needed:
            needed.add(name)
            todo.extend(runs[name].depends_on)
    return {name: run for name, run in runs.items()
            if name in needed and (name in cells or not record_completed(run.run_dir))}


def write_selection(spec_path: Path, patterns: list[str], output: Path,
                    leave_out_recorded_in: Path | None = None) -> Path:
    """Write the selected part of the spec beside the runs (``OUTPUT/.selections/``) and return its path.

    ``patterns`` as for :func:`select_runs` (none: every cell); with ``leave_out_recorded_in``, the
    cells with a completed record there are left out too (``--missing``)."""
    import hashlib

    from kdbench.sweep import expand, load_spec

    spec = load_spec(spec_path)
    selected = select_runs(spec, patterns) if patterns else spec
    how = f"only: {' '.join(patterns)}" if patterns else "every cell"
    if leave_out_recorded_in is not None:
        runs = expand(selected, output=output).runs
        recorded = recorded_cells(runs, leave_out_recorded_in)
        kept = [cell for cell in selected.get("cells") or [] if cell["name"] not in recorded]
        selected = {**selected, "cells": kept}
        estimate = TrainingEstimate.of(_runs_to_do(runs, {cell["name"] for cell in kept}), leave_out_recorded_in)
        print(f"[kdbench reproduce] --missing: {len(recorded)} of {len(kept) + len(recorded)} chosen cells have a "
              f"completed record in {leave_out_recorded_in} and are left out; {len(kept)} to run. {estimate}",
              flush=True)
        how += f", missing from {leave_out_recorded_in}"
    digest = hashlib.sha256(how.encode()).hexdigest()[:8]
    path = output / ".selections" / f"{spec_path.stem}-{digest}.yaml"
    path.parent.mkdir(parents=True, exist_ok=True)
    header = f"# {spec_path.name}, {how} (written by kdbench reproduce)\n"
    path.write_text(header + yaml.safe_dump(selected, sort_keys=False))
    return path


def _read_paths(spec_path: Path, output: Path) -> set[str]:
    """Every string value of the runs of a spec (resolved, stages included): the files they read."""
    from kdbench.sweep import expand, load_spec

    return _strings_of(expand(load_spec(spec_path), output=output).runs.values())


def _strings_of(runs: Iterable[Any]) -> set[str]:
    """Every string value of expanded sweep runs (nested in dicts and lists)."""
    found: set[str] = set()

    def walk(value: Any) -> None:
        if isinstance(value, dict):
            for item in value.values():
                walk(item)
        elif isinstance(value, list):
            for item in value:
                walk(item)
        elif isinstance(value, str):
            found.add(value)

    for run in runs:
        walk(run.values)
    return found


# ---------------------------------------------------------------------------------------------
# Command line
# ---------------------------------------------------------------------------------------------
def cmd_reproduce(args: Any) -> int:
    from kdbench.cli import main as kdbench_main
    from kdbench.sweep import load_spec

    spec_folder = Path(args.spec_dir)
    spec_path = spec_folder / f"{args.table}.yaml"
    if args.write_spec:
        print(write_spec(args.table, spec_folder))
        return 0
    if args.table not in TABLE_ROWS:
        raise KeyError(f"unknown reproduction table {args.table!r} (known: {', '.join(sorted(TABLE_ROWS))})")
    records = Path(args.records) if args.records else records_folder(args.table, spec_folder)
    records.mkdir(parents=True, exist_ok=True)  # a table nothing has run for yet renders as "not run"
    if not args.render_only:
        sweep_options = ["--executor", args.executor, "--output", args.output]
        if args.profile:
            sweep_options += ["--profile", args.profile]
        patterns = [p.strip() for p in (args.only or "").split(",") if p.strip()]
        run_spec = write_selection(spec_path, patterns, Path(args.output)) if patterns else spec_path
        code = build_prerequisites(
            args.table, run_spec, Path(args.output), sweep_options, dry_run=args.dry_run,
            before_training=lambda: _say_which_stages_retrain_elsewhere(args.table, spec_path, run_spec,
                                                                         Path(args.output), records))
        if code != 0:
            return code
        if args.missing:  # after the prerequisites: building augmented data renames the runs that read it
            run_spec = write_selection(spec_path, patterns, Path(args.output), leave_out_recorded_in=records)
        else:
            _say_which_recorded_cells_retrain(run_spec, Path(args.output), records)
        if args.missing and not load_spec(run_spec).get("cells"):
            code = 0  # every chosen cell is recorded: nothing to train, the table is still exported and rendered
        else:
            code = kdbench_main(["sweep", str(run_spec), *sweep_options, *(["--dry-run"] if args.dry_run else [])])
        if args.dry_run:
            return code
        copied = export_records(spec_path, Path(args.output), records, supersede=args.supersede_records)
        print(f"[kdbench reproduce] {len(copied)} records in {records}")
        if code != 0:
            return code
    out = render(args.table, records, records.parent / "table.md")
    if not args.no_plots and records.is_dir():
        plot(records, records.parent / "plots")
    print(out.read_text())
    print((out.parent / "claims.md").read_text())
    return 0


def build_prerequisites(table: str, spec_path: Path, output: Path, sweep_options: list[str],
                        dry_run: bool = False, before_training: Callable[[], None] | None = None) -> int:
    """Build the table's prerequisite files in order. One that needs a stage's model (augmented data
    needs the MLM-adapted teacher) first runs that stage alone, as a sweep of the spec's stage with
    the same executor (waiting for it on Slurm). ``before_training`` is called once, when the files
    that need no stage exist: before the first such stage trains, or at the end (a stage's folder can
    hash those files). With ``dry_run`` only what needs no stage is built."""
    from kdbench.cli import main as kdbench_main
    from kdbench.sweep import expand, load_spec

    spec = load_spec(spec_path)
    read = _read_paths(spec_path, output)
    stage_models: dict[str, Path] = {}  # each stage run once
    for prerequisite in prerequisites(table):
        if not any(path in read for path in prerequisite.paths):
            continue  # none of the runs to do reads it (a part of the table chosen with --only)
        files = ", ".join(prerequisite.paths)
        if prerequisite.present:
            print(f"[kdbench reproduce] {files}: present ({prerequisite.description})", flush=True)
            continue
        stage_model = stage_models.get(prerequisite.after_stage or "")
        if prerequisite.after_stage is not None and stage_model is None:
            if dry_run:
                print(f"[kdbench reproduce] {files}: to build after stage {prerequisite.after_stage} "
                      f"({prerequisite.description}); the folders of runs reading it change once it exists",
                      flush=True)
                continue
            if before_training is not None:
                before_training()
                before_training = None
            stage_spec = _stage_alone(spec, prerequisite.after_stage)
            stage_path = output / ".prerequisites" / f"{table}-{prerequisite.after_stage}.yaml"
            stage_path.parent.mkdir(parents=True, exist_ok=True)
            stage_path.write_text(yaml.safe_dump(stage_spec, sort_keys=False))
            waiting = ["--wait"] if "slurm" in sweep_options else []
            code = kdbench_main(["sweep", str(stage_path), *sweep_options, *waiting])
            if code != 0:
                return code
            stage_model = expand(stage_spec, output).runs[prerequisite.after_stage].run_dir / "model"
            stage_models[prerequisite.after_stage] = stage_model
        prerequisite.ensure(MINI, stage_model)
        print(f"[kdbench reproduce] {files}: built ({prerequisite.description})", flush=True)
    if before_training is not None:
        before_training()
    return 0


def _stage_alone(spec: dict[str, Any], stage: str) -> dict[str, Any]:
    """A sweep spec that runs one of ``spec``'s stages as its only cell (the same run folder)."""
    return {"name": f"{spec['name']}-{stage}", "output": spec.get("output"), "defaults": spec.get("defaults", {}),
            "cells": [{"name": stage, **spec["stages"][stage]}]}


def add_command(subparsers: Any) -> None:
    reproduce = subparsers.add_parser(
        "reproduce", help="run one table of kdbench's reproduction study (mini scale), or re-render it")
    reproduce.add_argument("table", help=f"one of: {', '.join(sorted(TABLE_ROWS))}")
    reproduce.add_argument("--executor", default="local", help="debug | local | slurm (default local)")
    reproduce.add_argument("--profile", help="cluster profile for --executor slurm")
    reproduce.add_argument("--output", default=OUTPUT, help=f"runs folder (default {OUTPUT})")
    reproduce.add_argument("--records", help="where records are exported and read (default: results/reproduction/TABLE/records)")
    reproduce.add_argument("--spec-dir", default=str(SPEC_FOLDER), help="folder of the generated sweep specs")
    reproduce.add_argument("--render-only", action="store_true", help="re-render the table from the records; train nothing")
    reproduce.add_argument("--write-spec", action="store_true", help="regenerate the table's sweep spec and exit")
    reproduce.add_argument("--dry-run", action="store_true", help="list the runs and their folders; train nothing")
    reproduce.add_argument("--no-plots", action="store_true", help="skip the score-vs-cost plots (plots/)")
    reproduce.add_argument("--supersede-records", action="store_true",
                           help="replace committed records of another training of the same run (e.g. a teacher "
                                "retrained on a new machine) instead of keeping them")
    reproduce.add_argument("--only", metavar="PATTERNS",
                           help="run only the cells (or stages) whose names match these comma-separated shell "
                                "patterns, e.g. 'kd-3l-*' or '*-mrpc-s*' or 'teacher-rte' (see --dry-run for names); "
                                "every completed run of the table is still exported and rendered")
    reproduce.add_argument("--missing", action="store_true",
                           help="leave out the cells that already have a completed record in --records, e.g. to "
                                "continue a study whose records are committed on a new machine or cluster (the "
                                "stages the other cells need still run); combines with --only")
    reproduce.set_defaults(handler=cmd_reproduce)
