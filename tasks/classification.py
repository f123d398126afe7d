"""Classification (and regression) tasks declared as data: a Hub dataset path, its columns, the
labels and the metric, with no code.

A :class:`ClassificationTaskSpec` is a typed mapping (built with
:func:`kdbench.config.from_mapping`, so a bad key or value is a one-line error naming it)::

    name: imdb
    hub_path: stanfordnlp/imdb       # datasets.load_dataset(hub_path, hub_config, split=...)
    hub_config: plain_text
    text_columns: [text]             # one text, or two for sentence pairs
    label_column: label
    labels: [neg, pos]               # head order; the Hub's ClassLabel ids are mapped by name
    metrics: [acc]                   # acc | f1 | mcc | pearson | spearman; the first is the main one
    dev_split: test                  # the Hub split scored after training (IMDb has no validation)

kdbench ships its spec files in ``results/tasks/`` (registered by name, like the tables); a
package adds its own through the ``kdbench.tasks`` entry point with
``ClassificationTask.from_yaml(path)`` or ``ClassificationTask(ClassificationTaskSpec(...))``.

Data, first found: ``train_file=`` / ``dev_file=`` (``.tsv``/``.csv``/``.json``/``.jsonl`` with the
spec's column names); ``<data dir>/<name>/{train,dev}.{jsonl,json,csv,tsv}`` under ``--data-dir`` /
``$KDBENCH_DATA_DIR``; otherwise the Hub. Labels travel by name as in the GLUE tasks: a Hub
``ClassLabel`` id becomes its name, and files may hold names or ids (ids index ``labels``).
"""

from __future__ import annotations

from argparse import Namespace
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from kdbench.config import ConfigError, DataConfig, from_mapping, load_yaml
from kdbench.constraints import constrained
from kdbench.errors import DataError
from kdbench.tasks._io import BadRows
from kdbench.tasks.glue import GlueSpec, GlueTask, _Rows

METRICS = ("acc", "f1", "mcc", "pearson", "spearman")
REGRESSION_METRICS = ("pearson", "spearman")
FILE_SUFFIXES = (".jsonl", ".json", ".csv", ".tsv")
SPLITS = ("train", "dev")


@dataclass(frozen=True)
class ClassificationTaskSpec:
    """A classification task as data; ``labels: null`` makes it a regression task (one score)."""

    name: str = constrained(non_empty=True)
    hub_path: str = constrained(non_empty=True)
    text_columns: tuple[str, ...] = constrained(non_empty=True)
    labels: tuple[str, ...] | None = constrained(non_empty=True)
    metrics: tuple[str, ...] = constrained(("acc",), choices=METRICS)
    hub_config: str | None = None
    label_column: str = constrained("label", non_empty=True)
    train_split: str = "train"  # the Hub split trained on
    dev_split: str = "validation"  # the Hub split scored after training
    description: str = ""

    def check_combination(self) -> None:
        if len(self.text_columns) not in (1, 2):
            raise ConfigError(f"text_columns: one text column or two (a sentence pair), got {list(self.text_columns)}")
        if not self.metrics:
            raise ConfigError("metrics: name at least one (the first is the main metric)")
        if self.labels is None:
            wrong = [m for m in self.metrics if m not in REGRESSION_METRICS]
            if wrong:
                raise ConfigError(f"metrics: {wrong} need classes, but labels is null (regression); "
                                  f"use {' or '.join(REGRESSION_METRICS)}")
        elif len(self.labels) < 2 or len(set(self.labels)) != len(self.labels):
            raise ConfigError(f"labels: at least two distinct names in head order, got {list(self.labels)}")

    @classmethod
    def from_mapping(cls, values: dict[str, Any], where: str = "") -> ClassificationTaskSpec:
        return from_mapping(cls, dict(values), where=where)


class ClassificationTask(GlueTask):
    """A task built from a :class:`ClassificationTaskSpec`; reading, encoding and scoring are the
    GLUE adapter's, from named-column files or the spec's Hub dataset."""

    def __init__(self, spec: ClassificationTaskSpec) -> None:
        self.task_spec = spec
        super().__init__(GlueSpec(
            name=spec.name, hub_name=spec.hub_config or "", dir_name=spec.name, text_fields=spec.text_columns,
            label_names=spec.labels, metrics=spec.metrics, main_metric=spec.metrics[0], train=None,
            dev=(("dev", None, ""),), test=(), label_column=spec.label_column))  # type: ignore[arg-type]

    @classmethod
    def from_yaml(cls, path: str | Path) -> ClassificationTask:
        """The task a spec file declares; a bad key or value is a ConfigError naming the file."""
        try:
            return cls(ClassificationTaskSpec.from_mapping(load_yaml(path)))
        except ConfigError as error:
            raise ConfigError(f"task spec {str(path)!r}: {error}") from None

    def __repr__(self) -> str:
        return f"ClassificationTask({self.task_spec.name!r}, hub {self.task_spec.hub_path!r})"

    @property
    def description(self) -> str:
        return self.task_spec.description

    # ----------------------------------------------------------------------------- sources
    def split_file(self, split: str, run: Any) -> tuple[Path | None, bool]:
        if split not in SPLITS:
            raise DataError(f"task {self.task_spec.name!r} has no {split} split (it has {', '.join(SPLITS)})")
        data = run.data
        explicit = data.train_file if split == "train" else data.dev_file
        if explicit:
            return Path(explicit).expanduser(), True
        data_dir = data.resolved_data_dir()
        folder = data_dir / self.task_spec.name if data_dir is not None else None
        if folder is None or not folder.is_dir():
            return None, False  # the Hub
        for suffix in FILE_SUFFIXES:
            if (folder / f"{split}{suffix}").is_file():
                return folder / f"{split}{suffix}", False
        raise DataError(f"{self.task_spec.name}: folder {str(folder)!r} has no {split} file "
                        f"({', '.join(split + s for s in FILE_SUFFIXES)})")

    def hub_source(self, split: str) -> str:
        spec = self.task_spec
        return f"hub:{spec.hub_path}/{spec.hub_config or ''}/{self.hub_split(split)}"

    def hub_split(self, split: str) -> str:
        return self.task_spec.train_split if split == "train" else self.task_spec.dev_split

    def data_sources(self, run: Any) -> list[Path | str]:
        sources: list[Path | str] = []
        for split in SPLITS:
            path, _ = self.split_file(split, run)
            sources.append(path if path is not None else self.hub_source(split))
        return sources

    def load_rows(self, split: str, run: Any) -> _Rows:
        with_labels = not split.startswith("test")
        path, _ = self.split_file(split, run)
        if path is None:
            return self.read_hub(split, with_labels)
        return self.read_named_file(path, with_labels, run.data.on_bad_row)

    def read_hub(self, split: str, with_labels: bool) -> _Rows:
        """A split of ``datasets.load_dataset(hub_path, hub_config)``; ClassLabel ids become names."""
        import datasets

        spec, hub_split = self.task_spec, self.hub_split(split)
        source = self.hub_source(split)
        try:
            dataset = datasets.load_dataset(spec.hub_path, spec.hub_config, split=hub_split)
        except Exception as error:
            raise DataError(f"{spec.name}: could not load the Hub dataset {spec.hub_path!r} split {hub_split!r} "
                            f"({type(error).__name__}: {error}); give train_file=/dev_file= or put "
                            f"{spec.name}/{{train,dev}}.jsonl under --data-dir") from None
        missing = [c for c in (*spec.text_columns, *([spec.label_column] if with_labels else []))
                   if c not in dataset.column_names]
        if missing:
            raise DataError(f"{source}: no column(s) {missing} (columns: {', '.join(dataset.column_names)})")
        feature = dataset.features.get(spec.label_column) if hasattr(dataset, "features") else None
        hub_names = list(getattr(feature, "names", None) or [])
        rows = _Rows(source, [], [], [])
        bad = BadRows("error")
        labels = dataset[spec.label_column] if with_labels else [None] * len(dataset)
        for position, (texts, label) in enumerate(zip(zip(*(dataset[c] for c in spec.text_columns)), labels)):
            if hub_names and isinstance(label, (int, np.integer)) and 0 <= label < len(hub_names):
                label = hub_names[int(label)]
            self._accept_row(rows, texts, label, with_labels, position, f"{source}, row {position}", bad)
        if not rows.texts:
            raise DataError(f"{source}: no rows")
        return rows

    # ----------------------------------------------------------------------------- training / scoring
    def encode_train(self, tokenizer: Any, run: Any):
        rows = self.load_rows("train", run)
        return self._encode(rows, tokenizer, run.train.max_seq_length, run.data.max_train_samples, "train",
                            keep_index=False)

    def score_prediction_file(self, path: Path, data_dir: Path | None, split: str = "dev") -> dict[str, float]:
        """Score a TSV ``index<TAB>prediction`` against the dev labels (index = row position)."""
        gold = self.load_rows("dev", Namespace(data=DataConfig(data_dir=str(data_dir) if data_dir else None)))
        predicted = self.read_prediction_file(Path(path))
        if sorted(predicted) != list(range(len(gold.labels))):
            raise DataError(f"{path}: predictions must cover the {len(gold.labels)} dev rows by position 0..N-1")
        if self.glue.label_names is None:
            refs = np.array(gold.labels, dtype=np.float64)
            preds = np.array([predicted[i] for i in range(len(gold.labels))], dtype=np.float64)
        else:
            ids = {name: k for k, name in enumerate(self.glue.label_names)}
            refs = np.array([ids[label] for label in gold.labels])
            preds = np.array([ids[predicted[i]] for i in range(len(gold.labels))])
        return self.compute_metrics(preds, refs)

