"""GLUE task adapters: CoLA, SST-2, MRPC, STS-B, QQP, MNLI (matched/mismatched), QNLI, RTE, WNLI, AX.

Data sources, in order:

1. ``run.data.train_file`` / ``run.data.dev_file``: a ``.tsv``/``.csv``/``.json``/``.jsonl`` file with
   named columns (the Hub's column names, e.g. ``sentence1``/``sentence2``/``label``, or the GLUE
   file's header names). A ``.tsv`` whose header is the classic GLUE header (or CoLA's headerless
   layout) is read positionally like the GLUE download.
2. ``run.data.resolved_data_dir()`` (``--data-dir`` or ``$KDBENCH_DATA_DIR``): the classic layout
   ``<dir>/glue_data/<TASK>/{train,dev}.tsv``; ``<dir>`` may also be ``glue_data`` itself or the
   task folder. A missing folder or file is a :class:`DataError` naming the path.
3. Otherwise the Hub: ``datasets.load_dataset("glue", name)``.

Labels are carried by **name** end to end. ``TaskSpec.label_names`` is the head order (stored by the
engine as ``id2label``); it equals the Hub's ClassLabel order, and Hub integer labels are mapped
through the Hub's own ClassLabel names, never by position. GLUE files that write labels as 0/1
(CoLA, SST-2, MRPC, QQP, WNLI) are mapped to names by ``file_labels``.

Prediction files (``kdbench evaluate``) give label names or ids. MNLI and AX order their ids
differently in the Hub's ``glue`` dataset (entailment, neutral, contradiction) and in BERT's GLUE
processor (contradiction, entailment, neutral; ``GlueSpec.bert_label_order``), so a bare id there is
refused unless the caller names the order (``label_order="hub"`` or ``"glue"``); for the other tasks
both conventions agree. STS-B predictions must be finite; submission files clip them to [0, 5].

Metrics are on the 0-100 scale (see :mod:`kdbench.metrics`).
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from kdbench import metrics as M
from kdbench.task import EncodedSplit, HeadType, Task, TaskSpec
from kdbench.tasks._io import BadRows, DataError, read_named_rows, read_tsv_lines

MNLI_LABELS = ("entailment", "neutral", "contradiction")  # the Hub's order
MNLI_BERT_LABELS = ("contradiction", "entailment", "neutral")  # BERT run_classifier.py MnliProcessor.get_labels
LABEL_ORDERS = ("hub", "glue")  # how to read bare label ids in prediction files
STSB_RANGE = (0.0, 5.0)


@dataclass(frozen=True)
class GlueFile:
    """One split's classic TSV layout."""

    name: str  # file name inside the task folder, e.g. "dev_matched.tsv"
    text_cols: tuple[int, ...]  # positional text columns
    label_col: int | None  # positional label column (None: test files); may be negative
    header: bool = True
    num_cols: int | None = None  # expected column count when there is no header
    index_col: int | None = None  # column holding the example index (None: row position)


@dataclass(frozen=True)
class GlueSpec:
    name: str  # kdbench name
    hub_name: str  # datasets.load_dataset("glue", hub_name)
    dir_name: str  # folder under glue_data
    text_fields: tuple[str, ...]  # Hub column names of the text inputs
    label_names: tuple[str, ...] | None  # None: regression (STS-B)
    metrics: tuple[str, ...]
    main_metric: str
    train: GlueFile | None
    dev: tuple[tuple[str, GlueFile, str], ...]  # (split name, file, metric suffix)
    test: tuple[tuple[str, GlueFile, str], ...]  # (split name, file, submission file name)
    hub_splits: Mapping[str, str] = field(default_factory=dict)  # our split name -> Hub split name
    file_labels: Mapping[str, str] = field(default_factory=dict)  # label text in files -> name
    column_aliases: Mapping[str, tuple[str, ...]] = field(default_factory=dict)  # field -> other header names
    int_submission: bool = False  # submission writes label ids (0/1) instead of names
    label_column: str = "label"  # tried first in files with named columns
    bert_label_order: tuple[str, ...] | None = None  # BERT's GLUE processor order, where it differs from the Hub's
    score_range: tuple[float, float] | None = None  # regression: the label range submissions are clipped to
    trained_as: str | None = None  # no training set: the task whose models predict it (AX: mnli)


_LABEL_ALIASES = ("label", "gold_label", "score", "is_duplicate", "Quality", "labels")


def _binary(names: tuple[str, str]) -> dict[str, str]:
    return {"0": names[0], "1": names[1]}


COLA_SPEC = GlueSpec(
    name="cola", hub_name="cola", dir_name="CoLA", text_fields=("sentence",),
    label_names=("unacceptable", "acceptable"), metrics=("mcc",), main_metric="mcc",
    train=GlueFile("train.tsv", (3,), 1, header=False, num_cols=4),
    dev=(("dev", GlueFile("dev.tsv", (3,), 1, header=False, num_cols=4), ""),),
    test=(("test", GlueFile("test.tsv", (1,), None, index_col=0), "CoLA.tsv"),),
    file_labels=_binary(("unacceptable", "acceptable")), int_submission=True,
)
SST2_SPEC = GlueSpec(
    name="sst2", hub_name="sst2", dir_name="SST-2", text_fields=("sentence",),
    label_names=("negative", "positive"), metrics=("acc",), main_metric="acc",
    train=GlueFile("train.tsv", (0,), 1),
    dev=(("dev", GlueFile("dev.tsv", (0,), 1), ""),),
    test=(("test", GlueFile("test.tsv", (1,), None, index_col=0), "SST-2.tsv"),),
    file_labels=_binary(("negative", "positive")), int_submission=True,
)
MRPC_SPEC = GlueSpec(
    name="mrpc", hub_name="mrpc", dir_name="MRPC", text_fields=("sentence1", "sentence2"),
    label_names=("not_equivalent", "equivalent"), metrics=("acc", "f1"), main_metric="f1",
    train=GlueFile("train.tsv", (3, 4), 0),
    dev=(("dev", GlueFile("dev.tsv", (3, 4), 0), ""),),
    test=(("test", GlueFile("test.tsv", (3, 4), None, index_col=0), "MRPC.tsv"),),
    file_labels=_binary(("not_equivalent", "equivalent")), int_submission=True,
    column_aliases={"sentence1": ("#1 String",), "sentence2": ("#2 String",)},
)
STSB_SPEC = GlueSpec(
    name="stsb", hub_name="stsb", dir_name="STS-B", text_fields=("sentence1", "sentence2"),
    label_names=None, metrics=("pearson", "spearman"), main_metric="spearman",
    train=GlueFile("train.tsv", (7, 8), -1, index_col=0),
    dev=(("dev", GlueFile("dev.tsv", (7, 8), -1, index_col=0), ""),),
    test=(("test", GlueFile("test.tsv", (7, 8), None, index_col=0), "STS-B.tsv"),),
    score_range=STSB_RANGE,
)
QQP_SPEC = GlueSpec(
    name="qqp", hub_name="qqp", dir_name="QQP", text_fields=("question1", "question2"),
    label_names=("not_duplicate", "duplicate"), metrics=("acc", "f1"), main_metric="f1",
    train=GlueFile("train.tsv", (3, 4), 5, index_col=0),
    dev=(("dev", GlueFile("dev.tsv", (3, 4), 5, index_col=0), ""),),
    test=(("test", GlueFile("test.tsv", (1, 2), None, index_col=0), "QQP.tsv"),),
    file_labels=_binary(("not_duplicate", "duplicate")), int_submission=True,
)
_MNLI_DEV = (("dev_matched", GlueFile("dev_matched.tsv", (8, 9), -1, index_col=0), ""),
             ("dev_mismatched", GlueFile("dev_mismatched.tsv", (8, 9), -1, index_col=0), "_mm"))
_MNLI_TEST = (("test_matched", GlueFile("test_matched.tsv", (8, 9), None, index_col=0), "MNLI-m.tsv"),
              ("test_mismatched", GlueFile("test_mismatched.tsv", (8, 9), None, index_col=0), "MNLI-mm.tsv"))
_MNLI_HUB = {"dev_matched": "validation_matched", "dev_mismatched": "validation_mismatched",
             "test_matched": "test_matched", "test_mismatched": "test_mismatched"}
_NLI_ALIASES = {"premise": ("sentence1",), "hypothesis": ("sentence2",)}
MNLI_SPEC = GlueSpec(
    name="mnli", hub_name="mnli", dir_name="MNLI", text_fields=("premise", "hypothesis"),
    label_names=MNLI_LABELS, metrics=("acc",), main_metric="acc",
    train=GlueFile("train.tsv", (8, 9), -1, index_col=0), dev=_MNLI_DEV, test=_MNLI_TEST,
    hub_splits=_MNLI_HUB, column_aliases=_NLI_ALIASES, bert_label_order=MNLI_BERT_LABELS,
)
MNLI_MM_SPEC = GlueSpec(
    name="mnli-mm", hub_name="mnli", dir_name="MNLI", text_fields=("premise", "hypothesis"),
    label_names=MNLI_LABELS, metrics=("acc",), main_metric="acc_mm",
    train=GlueFile("train.tsv", (8, 9), -1, index_col=0), dev=_MNLI_DEV, test=_MNLI_TEST,
    hub_splits=_MNLI_HUB, column_aliases=_NLI_ALIASES, bert_label_order=MNLI_BERT_LABELS,
)
QNLI_SPEC = GlueSpec(
    name="qnli", hub_name="qnli", dir_name="QNLI", text_fields=("question", "sentence"),
    label_names=("entailment", "not_entailment"), metrics=("acc",), main_metric="acc",
    train=GlueFile("train.tsv", (1, 2), -1, index_col=0),
    dev=(("dev", GlueFile("dev.tsv", (1, 2), -1, index_col=0), ""),),
    test=(("test", GlueFile("test.tsv", (1, 2), None, index_col=0), "QNLI.tsv"),),
)
RTE_SPEC = GlueSpec(
    name="rte", hub_name="rte", dir_name="RTE", text_fields=("sentence1", "sentence2"),
    label_names=("entailment", "not_entailment"), metrics=("acc",), main_metric="acc",
    train=GlueFile("train.tsv", (1, 2), -1, index_col=0),
    dev=(("dev", GlueFile("dev.tsv", (1, 2), -1, index_col=0), ""),),
    test=(("test", GlueFile("test.tsv", (1, 2), None, index_col=0), "RTE.tsv"),),
)
WNLI_SPEC = GlueSpec(
    name="wnli", hub_name="wnli", dir_name="WNLI", text_fields=("sentence1", "sentence2"),
    label_names=("not_entailment", "entailment"), metrics=("acc",), main_metric="acc",
    train=GlueFile("train.tsv", (1, 2), -1, index_col=0),
    dev=(("dev", GlueFile("dev.tsv", (1, 2), -1, index_col=0), ""),),
    test=(("test", GlueFile("test.tsv", (1, 2), None, index_col=0), "WNLI.tsv"),),
    file_labels=_binary(("not_entailment", "entailment")), int_submission=True,
)
AX_SPEC = GlueSpec(
    name="ax", hub_name="ax", dir_name="diagnostic", text_fields=("premise", "hypothesis"),
    label_names=MNLI_LABELS, metrics=("mcc",), main_metric="mcc",
    train=None, dev=(),
    test=(("test", GlueFile("diagnostic.tsv", (1, 2), None, index_col=0), "AX.tsv"),),
    column_aliases=_NLI_ALIASES, bert_label_order=MNLI_BERT_LABELS, trained_as="mnli",
)


@dataclass
class _Rows:
    """Parsed rows of one split before tokenisation."""

    source: str
    texts: list[tuple[str, ...]]
    labels: list[Any]  # label names (classification), floats (regression), or None (test)
    indices: list[int]
    skipped: int = 0


def _dev_metric_names(spec: GlueSpec) -> tuple[str, ...]:
    """Every metric the task's dev splits report (MNLI's mismatched split adds ``_mm``), main one first."""
    suffixes = [suffix for _, _, suffix in spec.dev] or [""]
    return tuple(dict.fromkeys([spec.main_metric, *(metric + suffix for suffix in suffixes for metric in spec.metrics)]))


class GlueTask(Task):
    """A GLUE task parametrised by a :class:`GlueSpec`."""

    def __init__(self, spec: GlueSpec) -> None:
        self.glue = spec
        head = HeadType.REGRESSION if spec.label_names is None else HeadType.CLASSIFICATION
        self.spec = TaskSpec(name=spec.name, head=head, main_metric=spec.main_metric,
                             label_names=spec.label_names, selectable_metrics=_dev_metric_names(spec),
                             trained_as=spec.trained_as)

    def __repr__(self) -> str:
        return f"GlueTask({self.glue.name!r})"

    # ----------------------------------------------------------------------------- locating files
    def task_dir(self, data_dir: Path | str) -> Path:
        """The task folder under ``data_dir`` (which may be the data root, ``glue_data`` or the
        task folder itself); a DataError naming the tried paths when there is none."""
        root = Path(data_dir).expanduser()
        candidates = [root / "glue_data" / self.glue.dir_name, root / self.glue.dir_name]
        for candidate in candidates:
            if candidate.is_dir():
                return candidate
        wanted = {f.name for f in ([self.glue.train] if self.glue.train else [])}
        wanted |= {f.name for _, f, _ in self.glue.dev} | {f.name for _, f, _ in self.glue.test}
        if root.is_dir() and (root.name.lower() == self.glue.dir_name.lower()
                              or any((root / name).is_file() for name in wanted)):
            return root
        tried = ", ".join(repr(str(c)) for c in candidates)
        raise DataError(f"no {self.glue.dir_name} data folder for task {self.glue.name!r} under data dir "
                        f"{str(root)!r} (looked for {tried})")

    def _file(self, data_dir: Path | str, glue_file: GlueFile) -> Path:
        path = self.task_dir(data_dir) / glue_file.name
        if not path.is_file():
            raise DataError(f"{self.glue.name}: data file {str(path)!r} does not exist")
        return path

    # ----------------------------------------------------------------------------- reading rows
    def _parse_label(self, value: Any, where: str, bad: BadRows) -> tuple[bool, Any]:
        """(ok, label name or float)."""
        if self.glue.label_names is None:
            try:
                number = float(value)
            except (TypeError, ValueError):
                bad(where, f"score {value!r} is not a number")
                return False, None
            if not math.isfinite(number):
                bad(where, f"score {value!r} is not a finite number")
                return False, None
            return True, number
        name = self.label_name(value)
        if name is None:
            bad(where, f"unknown label {value!r} (expected one of {', '.join(self.glue.label_names)})")
            return False, None
        return True, name

    def label_name(self, value: Any) -> str | None:
        """The label name for a file/prediction value: a name, a file code (``0``/``1``) or an id."""
        names = self.glue.label_names or ()
        if isinstance(value, (bool, np.bool_)):
            value = int(value)
        if isinstance(value, (int, np.integer)):
            text = str(int(value))
            if text in self.glue.file_labels:
                return self.glue.file_labels[text]
            return names[int(value)] if 0 <= int(value) < len(names) else None
        text = str(value).strip()
        if text in names:
            return text
        if text in self.glue.file_labels:
            return self.glue.file_labels[text]
        if text.isdigit() and int(text) < len(names) and not self.glue.file_labels:
            return names[int(text)]
        return None

    def _accept_row(self, rows: _Rows, texts: Sequence[Any], label: Any, has_label: bool, index: int,
                    where: str, bad: BadRows) -> None:
        cleaned = []
        for field_name, text in zip(self.glue.text_fields, texts):
            if text is None or not isinstance(text, str) or text.strip() == "":
                bad(where, f"empty text in column {field_name!r}")
                return
            cleaned.append(text)
        if has_label:
            ok, parsed = self._parse_label(label, where, bad)
            if not ok:
                return
        else:
            parsed = None
        rows.texts.append(tuple(cleaned))
        rows.labels.append(parsed)
        rows.indices.append(index)

    def read_glue_file(self, path: Path, glue_file: GlueFile, on_bad_row: str = "error") -> _Rows:
        """Read a classic GLUE TSV (split on tabs, no quoting) and validate every row."""
        bad = BadRows(on_bad_row)
        rows = _Rows(str(path), [], [], [])
        lines = read_tsv_lines(path)
        expected = glue_file.num_cols
        if glue_file.header:
            first = next(lines, None)
            if first is None:
                raise DataError(f"{path}: the file is empty")
            expected = len(first[1])
        position = 0
        for number, fields in lines:
            where = f"{path}, line {number}"
            if expected is not None and len(fields) != expected:
                bad(where, f"expected {expected} tab-separated columns, found {len(fields)}")
                continue
            texts = [fields[c] for c in glue_file.text_cols]
            label = fields[glue_file.label_col] if glue_file.label_col is not None else None
            index = position
            if glue_file.index_col is not None:
                try:
                    index = int(fields[glue_file.index_col])
                except ValueError:
                    bad(where, f"index {fields[glue_file.index_col]!r} is not an integer")
                    continue
            position += 1
            self._accept_row(rows, texts, label, glue_file.label_col is not None, index, where, bad)
        rows.skipped = bad.count
        if not rows.texts:
            raise DataError(f"{path}: no usable rows" + (f" ({bad.count} malformed rows skipped)" if bad.count else ""))
        return rows

    def _is_classic_tsv(self, path: Path, glue_file: GlueFile | None) -> bool:
        if glue_file is None or path.suffix.lower() != ".tsv":
            return False
        first = next(read_tsv_lines(path), None)
        if first is None:
            return True
        header = [h.strip() for h in first[1]]
        if not glue_file.header:
            return len(header) == glue_file.num_cols and not set(self.glue.text_fields) & set(header)
        if self.glue.name.startswith("mnli") and "sentence1_binary_parse" in header:
            return True
        if set(header) & set(_LABEL_ALIASES):  # a named-column file: a missing text column is an error
            return False
        return not set(self._columns_for(self.glue.text_fields[0])) & set(header)

    def _columns_for(self, field_name: str) -> tuple[str, ...]:
        return (field_name, *self.glue.column_aliases.get(field_name, ()))

    def read_named_file(self, path: Path, with_labels: bool, on_bad_row: str = "error") -> _Rows:
        """Read a file with named columns (tsv/csv header, json, jsonl)."""
        bad = BadRows(on_bad_row)
        header, records = read_named_rows(path)
        columns = []
        for field_name in self.glue.text_fields:
            found = next((c for c in self._columns_for(field_name) if c in header), None)
            if found is None:
                raise DataError(f"{path}: no column {field_name!r} for task {self.glue.name} "
                                f"(columns: {', '.join(header)})")
            columns.append(found)
        label_columns = tuple(dict.fromkeys((self.glue.label_column, *_LABEL_ALIASES)))
        label_column = next((c for c in label_columns if c in header), None) if with_labels else None
        if with_labels and label_column is None:
            raise DataError(f"{path}: no label column (one of {', '.join(label_columns)}; columns: {', '.join(header)})")
        index_column = next((c for c in ("idx", "index", "id") if c in header), None)
        rows = _Rows(str(path), [], [], [])
        for position, (number, record) in enumerate(records):
            where = f"{path}, {'line' if path.suffix.lower() in ('.tsv', '.csv', '.jsonl') else 'record'} {number}"
            if "__bad__" in record:
                bad(where, record["__bad__"])
                continue
            index = position
            if index_column is not None:
                try:
                    index = int(record[index_column])
                except (TypeError, ValueError):
                    index = position
            label = record.get(label_column) if label_column else None
            if with_labels and label is None:
                bad(where, f"missing label in column {label_column!r}")
                continue
            self._accept_row(rows, [record.get(c) for c in columns], label, with_labels, index, where, bad)
        rows.skipped = bad.count
        if not rows.texts:
            raise DataError(f"{path}: no usable rows" + (f" ({bad.count} malformed rows skipped)" if bad.count else ""))
        return rows

    def read_file(self, path: Path | str, glue_file: GlueFile | None, with_labels: bool,
                  on_bad_row: str = "error") -> _Rows:
        path = Path(path)
        if not path.is_file():
            raise DataError(f"{self.glue.name}: data file {str(path)!r} does not exist")
        if self._is_classic_tsv(path, glue_file):
            return self.read_glue_file(path, glue_file, on_bad_row)
        return self.read_named_file(path, with_labels, on_bad_row)

    def read_hub(self, split: str, with_labels: bool) -> _Rows:
        """A split from ``datasets.load_dataset("glue", hub_name)``; labels mapped through the Hub's
        ClassLabel names."""
        import datasets

        hub_split = self.glue.hub_splits.get(split) or {"dev": "validation"}.get(split, split)
        try:
            dataset = datasets.load_dataset("glue", self.glue.hub_name, split=hub_split)
        except Exception as error:
            raise DataError(f"{self.glue.name}: could not load the Hub dataset glue/{self.glue.hub_name} "
                            f"split {hub_split!r} ({type(error).__name__}: {error}); give --data-dir "
                            f"with the glue_data/{self.glue.dir_name} folder or set KDBENCH_DATA_DIR") from None
        if isinstance(dataset, Mapping):  # a patched loader may hand back the whole DatasetDict
            dataset = dataset[hub_split]
        source = f"hub:glue/{self.glue.hub_name}[{hub_split}]"
        label_feature = dataset.features.get("label") if hasattr(dataset, "features") else None
        hub_names = list(getattr(label_feature, "names", None) or [])
        rows = _Rows(source, [], [], [])
        bad = BadRows("error")
        columns = [dataset[f] for f in self.glue.text_fields]
        labels = dataset["label"] if "label" in dataset.column_names else [None] * len(dataset)
        indices = dataset["idx"] if "idx" in dataset.column_names else list(range(len(dataset)))
        for position, (texts, label, index) in enumerate(zip(zip(*columns), labels, indices)):
            where = f"{source}, row {position}"
            has_label = with_labels and label is not None and not (isinstance(label, (int, np.integer)) and label < 0)
            if has_label and self.glue.label_names is not None:
                if not hub_names or not 0 <= int(label) < len(hub_names):
                    bad(where, f"label {label!r} not in the Hub's ClassLabel names {hub_names}")
                label = hub_names[int(label)]
            self._accept_row(rows, texts, label, has_label, int(index), where, bad)
        if not rows.texts:
            raise DataError(f"{source}: no rows")
        return rows

    def split_file(self, split: str, run: Any) -> tuple[Path | None, bool]:
        """``(file, explicit)``: the file ``split`` is read from and whether the run named it
        (``train_file``/``dev_file``) rather than the data-dir layout; ``None`` for the Hub."""
        data = run.data
        explicit = data.train_file if split == "train" else data.dev_file if split.startswith("dev") else None
        if explicit:
            return Path(explicit).expanduser(), True
        data_dir = data.resolved_data_dir()
        if data_dir is None:
            return None, False
        glue_file = self._glue_file(split)
        if glue_file is None:
            raise DataError(f"task {self.glue.name!r} has no {split} split")
        return self._file(data_dir, glue_file), False

    def load_rows(self, split: str, run: Any) -> _Rows:
        """Rows of ``train``, a dev split (``dev``, ``dev_matched``, ``dev_mismatched``) or a test split."""
        glue_file = self._glue_file(split)
        with_labels = not split.startswith("test")
        path, explicit = self.split_file(split, run)
        if path is None:
            return self.read_hub(split, with_labels)
        if explicit:
            return self.read_file(path, glue_file, with_labels, run.data.on_bad_row)
        return self.read_glue_file(path, glue_file, run.data.on_bad_row)

    def data_sources(self, run: Any) -> list[Path | str]:
        sources: list[Path | str] = []
        for split in ("train", *(name for name, _ in self.eval_splits(run))):
            path, _ = self.split_file(split, run)
            sources.append(path if path is not None else f"hub:glue/{self.glue.hub_name}/{split}")
        return sources

    def _glue_file(self, split: str) -> GlueFile | None:
        if split == "train":
            return self.glue.train
        for name, glue_file, _ in (*self.glue.dev, *self.glue.test):
            if name == split:
                return glue_file
        return None

    # ----------------------------------------------------------------------------- encoding
    def _encode(self, rows: _Rows, tokenizer: Any, max_length: int, limit: int | None, split: str,
                keep_index: bool, extra: Mapping[str, Any] | None = None) -> EncodedSplit:
        import datasets

        n = len(rows.texts) if limit is None else min(limit, len(rows.texts))
        columns: dict[str, list[Any]] = {}
        chunk = 2048
        for start in range(0, n, chunk):
            batch = rows.texts[start:min(start + chunk, n)]
            firsts = [t[0] for t in batch]
            seconds = [t[1] for t in batch] if len(self.glue.text_fields) > 1 else None
            encoded = tokenizer(firsts, seconds, truncation=True, max_length=max_length, padding=False)
            for key in ("input_ids", "attention_mask", "token_type_ids"):
                if key in encoded:
                    columns.setdefault(key, []).extend(list(x) for x in encoded[key])
        labels = rows.labels[:n]
        if labels and labels[0] is not None:
            if self.glue.label_names is None:
                columns["labels"] = [float(x) for x in labels]
            else:
                ids = {name: i for i, name in enumerate(self.glue.label_names)}
                columns["labels"] = [ids[x] for x in labels]
        if keep_index:
            columns["idx"] = list(rows.indices[:n])
        features = datasets.Dataset.from_dict(columns)
        metadata = {"task": self.glue.name, "split": split, "source": rows.source, "num_rows": len(rows.texts)}
        metadata.update(extra or {})
        return EncodedSplit(name=split, features=features, skipped_rows=rows.skipped, metadata=metadata)

    def encode_train(self, tokenizer: Any, run: Any) -> EncodedSplit:
        if self.glue.train is None:
            raise DataError(f"task {self.glue.name!r} has no training data: it is a diagnostic test set "
                            f"scored with a {self.glue.trained_as} model (train on {self.glue.trained_as}, then "
                            f"predict {self.glue.name})")
        rows = self.load_rows("train", run)
        return self._encode(rows, tokenizer, run.train.max_seq_length, run.data.max_train_samples, "train",
                            keep_index=False)

    def eval_splits(self, run: Any = None) -> list[tuple[str, str]]:
        """``(split name, metric suffix)`` of the dev splits encode_eval returns."""
        if run is not None and run.data.dev_file:
            suffix = "_mm" if self.glue.main_metric.endswith("_mm") else ""
            return [("dev_mismatched" if suffix else (self.glue.dev[0][0] if self.glue.dev else "dev"), suffix)]
        return [(name, suffix) for name, _, suffix in self.glue.dev]

    def encode_eval(self, tokenizer: Any, run: Any) -> list[EncodedSplit]:
        if not self.glue.dev:
            raise DataError(f"task {self.glue.name!r} has no labelled dev set: it is a diagnostic test set "
                            f"for prediction only (train on {self.glue.trained_as}, then predict {self.glue.name})")
        splits = []
        all_rows = [(name, suffix, self.load_rows(name, run)) for name, suffix in self.eval_splits(run)]
        for name, suffix, rows in all_rows:  # every file is read and validated before tokenising
            splits.append(self._encode(rows, tokenizer, run.train.max_seq_length, run.data.max_eval_samples,
                                       name, keep_index=True, extra={"metric_suffix": suffix}))
        return splits

    def encode_test(self, tokenizer: Any, run: Any) -> list[EncodedSplit]:
        """The unlabelled test split(s) for ``kdbench predict`` (MNLI: matched and mismatched), with an
        ``idx`` column; ``metadata["submission_file"]`` names the leaderboard file."""
        all_rows = []
        for name, glue_file, submission in self.glue.test:
            data_dir = run.data.resolved_data_dir()
            if data_dir is not None:
                rows = self.read_glue_file(self._file(data_dir, glue_file), glue_file, run.data.on_bad_row)
            else:
                rows = self.read_hub(name, with_labels=False)
            all_rows.append((name, submission, rows))
        return [self._encode(rows, tokenizer, run.train.max_seq_length, None, name, keep_index=True,
                             extra={"submission_file": submission})
                for name, submission, rows in all_rows]

    # ----------------------------------------------------------------------------- scoring
    def predictions_from_logits(self, logits: Any) -> np.ndarray:
        """Class ids (argmax) or regression scores from model logits."""
        array = np.asarray(logits)
        if self.glue.label_names is None:
            return array.reshape(len(array), -1)[:, 0].astype(np.float64) if array.ndim > 1 else array.astype(np.float64)
        if array.ndim == 1:
            return array.astype(np.int64)
        return array.argmax(axis=-1)

    def compute_metrics(self, predictions: Any, references: Any, suffix: str = "") -> dict[str, float]:
        names = self.glue.metrics
        if self.glue.name == "ax":
            names = ("mcc",)
        result = M.classification_metrics(np.asarray(predictions), np.asarray(references), names)
        return {f"{k}{suffix}": v for k, v in result.items()}

    def score(self, split: EncodedSplit, outputs: Mapping[str, np.ndarray]) -> dict[str, float]:
        if "labels" not in split.features.column_names:
            raise DataError(f"{self.glue.name}: split {split.name!r} has no labels to score")
        predictions = self.predictions_from_logits(outputs["logits"])
        references = np.asarray(split.features["labels"])
        if len(predictions) != len(references):
            raise ValueError(f"{self.glue.name}: {len(predictions)} predictions for {len(references)} examples")
        return self.compute_metrics(predictions, references, split.metadata.get("metric_suffix", ""))

    def score_prediction_file(self, path: Path, data_dir: Path | None, split: str = "dev",
                              label_order: str | None = None) -> dict[str, float]:
        """Score a TSV ``index<TAB>prediction`` (header allowed; prediction = label name, label id or
        STS-B score) against the dev labels. MNLI: ``split`` ``dev``/``dev_matched`` or
        ``dev_mismatched``/``dev_mm``. ``label_order`` (``hub`` or ``glue``) says how to read bare
        label ids where the conventions differ (MNLI); see :meth:`read_prediction_file`."""
        if label_order is not None and label_order not in LABEL_ORDERS:
            raise DataError(f"label order must be one of {', '.join(LABEL_ORDERS)}, got {label_order!r}")
        split_name, suffix = self._dev_split(split)
        glue_file = self._glue_file(split_name)
        if data_dir is None:
            import os

            env = os.environ.get("KDBENCH_DATA_DIR")
            data_dir = Path(env) if env else None
        if data_dir is not None:
            gold = self.read_glue_file(self._file(data_dir, glue_file), glue_file)
        else:
            gold = self.read_hub(split_name, with_labels=True)
        predicted = self.read_prediction_file(Path(path), label_order)
        gold_by_index = dict(zip(gold.indices, gold.labels))
        missing = [i for i in gold_by_index if i not in predicted]
        extra = [i for i in predicted if i not in gold_by_index]
        if missing or extra:
            raise DataError(f"{path}: predictions do not match the {split_name} set of {self.glue.name} "
                            f"({len(missing)} indices missing, e.g. {missing[:3]}; {len(extra)} unknown, e.g. {extra[:3]})")
        order = list(gold_by_index)
        if self.glue.label_names is None:
            refs = np.array([gold_by_index[i] for i in order], dtype=np.float64)
            preds = np.array([predicted[i] for i in order], dtype=np.float64)
        else:
            ids = {name: k for k, name in enumerate(self.glue.label_names)}
            refs = np.array([ids[gold_by_index[i]] for i in order])
            preds = np.array([ids[predicted[i]] for i in order])
        return self.compute_metrics(preds, refs, suffix)

    def _dev_split(self, split: str) -> tuple[str, str]:
        if not self.glue.dev:
            raise DataError(f"task {self.glue.name!r} has no labelled dev set")
        aliases = {"dev_mm": "dev_mismatched", "mm": "dev_mismatched", "mismatched": "dev_mismatched",
                   "dev_m": "dev_matched", "matched": "dev_matched", "validation": "dev"}
        split = aliases.get(split, split)
        if split == "dev":
            wanted = "_mm" if self.glue.main_metric.endswith("_mm") else ""
            for name, _, suffix in self.glue.dev:
                if suffix == wanted:
                    return name, suffix
        for name, _, suffix in self.glue.dev:
            if name == split:
                return name, suffix
        raise DataError(f"task {self.glue.name!r} has no split {split!r} "
                        f"(choose from {', '.join(n for n, _, _ in self.glue.dev)})")

    def read_prediction_file(self, path: Path, label_order: str | None = None) -> dict[int, Any]:
        """``{index: label name or float}`` from a TSV ``index<TAB>prediction`` file.

        A prediction is a label name, a GLUE file code (``0``/``1`` of the binary tasks) or a label id.
        Where the Hub and BERT's GLUE processor order the ids differently (MNLI, AX), a bare id is
        an error unless ``label_order`` is ``"hub"`` or ``"glue"``. STS-B scores must be finite.
        """
        result: dict[int, Any] = {}
        for number, fields in read_tsv_lines(path):
            where = f"{path}, line {number}"
            if len(fields) != 2:
                raise DataError(f"{where}: expected 'index<TAB>prediction', found {len(fields)} columns")
            if number == 1 and not fields[0].strip().lstrip("-").isdigit():
                continue  # header
            try:
                index = int(fields[0])
            except ValueError:
                raise DataError(f"{where}: index {fields[0]!r} is not an integer") from None
            if index in result:
                raise DataError(f"{where}: duplicate index {index}")
            if self.glue.label_names is None:
                try:
                    score = float(fields[1])
                except ValueError:
                    raise DataError(f"{where}: prediction {fields[1]!r} is not a number") from None
                if not math.isfinite(score):
                    raise DataError(f"{where}: prediction {fields[1]!r} for index {index} is not a finite number")
                result[index] = score
            else:
                result[index] = self._predicted_label(fields[1], label_order, where)
        if not result:
            raise DataError(f"{path}: no predictions")
        return result

    def _predicted_label(self, value: str, label_order: str | None, where: str) -> str:
        text = value.strip()
        names = self.glue.label_names or ()
        bert_order = self.glue.bert_label_order
        if text not in names and text.lstrip("-").isdigit() and bert_order is not None:
            if label_order is None:
                raise DataError(f"{where}: bare label id {text!r} is ambiguous for {self.glue.name}: the Hub's glue "
                                f"dataset orders the labels {', '.join(names)}, BERT's GLUE processor "
                                f"{', '.join(bert_order)}; write label names or give the order "
                                "(--label-order hub|glue)")
            order = names if label_order == "hub" else bert_order
            if 0 <= int(text) < len(order):
                return order[int(text)]
        name = self.label_name(text)
        if name is None:
            raise DataError(f"{where}: unknown label {value!r} "
                            f"(expected one of {', '.join(names)} or a label id)")
        return name


def _submission_value(task: GlueTask, value: Any, where: str) -> str:
    if task.glue.label_names is None:
        score = float(value)
        if not math.isfinite(score):
            raise DataError(f"{where}: the prediction is {score}, not a finite score; nothing written")
        if task.glue.score_range is not None:
            low, high = task.glue.score_range
            score = min(max(score, low), high)
        return f"{score:.3f}"
    name = task.label_name(value)
    if name is None:
        raise ValueError(f"{task.glue.name}: prediction {value!r} is not a label")
    if task.glue.int_submission:
        return str(task.glue.label_names.index(name))
    return name


def write_glue_predictions(task: GlueTask | str, predictions: Any, out_dir: Path | str,
                           indices: Any = None) -> list[Path]:
    """Write GLUE leaderboard submission TSVs (``index<TAB>prediction`` with a header).

    ``predictions``: for a task with one test split, an array; for MNLI, a mapping from split name
    (``test_matched``/``test_mismatched``) or submission file name (``MNLI-m.tsv``) to an array. An
    array holds logits ``(N, C)``, class ids ``(N,)``, label names, or floats for STS-B; a mapping's
    values may also be ``(indices, values)`` pairs or :class:`EncodedSplit`-keyed dicts. ``indices``
    (same shape as ``predictions``) gives the example indices; default ``0..N-1``.
    CoLA, SST-2, MRPC, QQP and WNLI get 0/1 ids, STS-B scores clipped to [0, 5] (a NaN or infinite
    score is a DataError naming the index), the NLI tasks label names. Returns the written paths.
    """
    if isinstance(task, str):
        from kdbench.plugins import TASKS

        task = TASKS.get(task) if hasattr(TASKS, "get") else TASKS[task]
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    tests = {name: submission for name, _, submission in task.glue.test}
    if not isinstance(predictions, Mapping):
        if len(tests) != 1:
            raise ValueError(f"{task.glue.name} has {len(tests)} test splits ({', '.join(tests)}): pass a mapping")
        predictions = {next(iter(tests)): predictions}
        indices = {next(iter(tests)): indices} if indices is not None else None
    written = []
    for key, values in predictions.items():
        split_key = getattr(key, "name", key)
        if split_key in tests:
            submission = tests[split_key]
        elif split_key in tests.values():
            submission = split_key
        else:
            raise ValueError(f"{task.glue.name}: unknown test split {split_key!r} (expected {', '.join(tests)})")
        split_indices = indices.get(key) if isinstance(indices, Mapping) else None
        if isinstance(values, tuple) and len(values) == 2:
            split_indices, values = values
        if hasattr(key, "features") and split_indices is None and "idx" in key.features.column_names:
            split_indices = key.features["idx"]
        array = np.asarray(values)
        if array.dtype.kind == "f" and array.ndim == 2 and task.glue.label_names is not None:
            array = array.argmax(axis=-1)
        elif array.ndim == 2:
            array = array[:, 0]
        if split_indices is None:
            split_indices = range(len(array))
        split_indices = list(split_indices)
        if len(split_indices) != len(array):
            raise ValueError(f"{submission}: {len(array)} predictions for {len(split_indices)} indices")
        path = out / submission
        lines = ["index\tprediction"]
        for i, v in zip(split_indices, array):
            value = _submission_value(task, v.item() if hasattr(v, "item") else v, f"{submission}, index {int(i)}")
            lines.append(f"{int(i)}\t{value}")
        path.write_text("\n".join(lines) + "\n")
        written.append(path)
    return written


COLA = GlueTask(COLA_SPEC)
SST2 = GlueTask(SST2_SPEC)
MRPC = GlueTask(MRPC_SPEC)
STSB = GlueTask(STSB_SPEC)
QQP = GlueTask(QQP_SPEC)
MNLI = GlueTask(MNLI_SPEC)
MNLI_MM = GlueTask(MNLI_MM_SPEC)
QNLI = GlueTask(QNLI_SPEC)
RTE = GlueTask(RTE_SPEC)
WNLI = GlueTask(WNLI_SPEC)
AX = GlueTask(AX_SPEC)

GLUE_TASKS: dict[str, GlueTask] = {t.glue.name: t for t in (COLA, SST2, MRPC, STSB, QQP, MNLI, MNLI_MM, QNLI, RTE, WNLI, AX)}
