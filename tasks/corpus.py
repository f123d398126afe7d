"""The ``corpus`` task: plain text for general (pre-training) distillation.

TinyBERT's general distillation, MobileBERT's pre-training distillation and DistilBERT's
pre-training all train on raw text with a masked-LM head. This task reads ``data.corpus``:

- a plain-text file, one document or sentence per line (UTF-8); blank lines are skipped and
  counted (``EncodedSplit.skipped_rows`` and ``metadata["empty_lines"]``, so they reach the run
  record as ``train_skipped_rows``); or
- a Hub dataset ``hub:NAME[:CONFIG][:SPLIT][:COLUMN]`` (defaults: no config, split ``train``,
  column ``text``), loaded with ``datasets.load_dataset``.

Each line becomes one example truncated at ``train.max_seq_length`` (``[CLS] line [SEP]``); the
first ``data.max_train_samples`` non-empty lines are used. The features carry no ``labels``:
masking is per batch, by the method's ``Stage.prepare_batch`` (:class:`kdbench.masking.MlmMasking`
is the BERT recipe ready to plug in). There is no dev metric (``main_metric`` is ``"none"``, ``encode_eval``
returns ``[]``), so the engine trains without evaluation and keeps the last state.

:func:`write_glue_corpus` extracts GLUE training sentences into a corpus file (the TinyBERT /
MobileBERT practice of building a transfer corpus from task data); ``kdbench corpus glue`` is its
command-line form.
"""

from __future__ import annotations

import argparse
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from kdbench.config import HUB_SOURCE_PREFIX, ConfigError
from kdbench.errors import DataError
from kdbench.task import EncodedSplit, HeadType, Task, TaskSpec

HUB_PREFIX = HUB_SOURCE_PREFIX
NO_METRIC = "none"


@dataclass(frozen=True)
class HubCorpus:
    """A parsed ``hub:NAME[:CONFIG][:SPLIT][:COLUMN]`` source."""

    name: str
    config: str | None = None
    split: str = "train"
    column: str = "text"

    @classmethod
    def parse(cls, source: str) -> HubCorpus:
        parts = source[len(HUB_PREFIX):].split(":")
        if not parts[0] or len(parts) > 4:
            raise ConfigError(f"data.corpus: {source!r} is not of the form hub:NAME[:CONFIG][:SPLIT][:COLUMN]")
        name, config, split, column = (parts + [""] * 4)[:4]
        return cls(name=name, config=config or None, split=split or "train", column=column or "text")

    def __str__(self) -> str:
        return f"{HUB_PREFIX}{self.name}:{self.config or ''}:{self.split}:{self.column}"


@dataclass
class CorpusLines:
    """Non-empty lines of a corpus, with how many empty ones were skipped."""

    source: str
    lines: list[str]
    empty_lines: int


def read_corpus(source: str | Path, limit: int | None = None) -> CorpusLines:
    """The first ``limit`` non-empty lines of a corpus file or Hub dataset (whitespace-stripped).

    An empty corpus (no non-empty line) is a :class:`DataError` naming the source.
    """
    text = str(source)
    if text.startswith(HUB_PREFIX):
        hub = HubCorpus.parse(text)
        raw: Iterable[Any] = _hub_column(hub)
        where = str(hub)
    else:
        path = Path(text).expanduser()
        if not path.is_file():
            raise DataError(f"corpus file {str(path)!r} does not exist")
        raw = _file_lines(path)
        where = str(path)
    lines: list[str] = []
    empty = 0
    for value in raw:
        line = "" if value is None else str(value).strip()
        if not line:
            empty += 1
            continue
        lines.append(line)
        if limit is not None and len(lines) >= limit:
            break
    if not lines:
        raise DataError(f"corpus {where!r} is empty: no non-empty line" + (f" ({empty} blank lines)" if empty else ""))
    return CorpusLines(where, lines, empty)


def _file_lines(path: Path) -> Iterator[str]:
    try:
        with open(path, encoding="utf-8-sig") as handle:
            yield from handle
    except UnicodeDecodeError as error:
        raise DataError(f"corpus file {str(path)!r} is not UTF-8 text ({error})") from None


def _hub_column(hub: HubCorpus) -> Iterable[Any]:
    import datasets

    try:
        dataset = datasets.load_dataset(hub.name, hub.config, split=hub.split)
    except Exception as error:
        raise DataError(f"corpus {str(hub)!r}: could not load the Hub dataset ({type(error).__name__}: {error}); "
                        "give a plain-text file instead (data.corpus=PATH)") from None
    if isinstance(dataset, Mapping):
        dataset = dataset[hub.split]
    if hub.column not in dataset.column_names:
        raise DataError(f"corpus {str(hub)!r}: no column {hub.column!r} (columns: {', '.join(dataset.column_names)})")
    return dataset[hub.column]


class CorpusTask(Task):
    """Plain-text corpus for masked-LM (general) distillation."""

    def __init__(self) -> None:
        self.spec = TaskSpec(name="corpus", head=HeadType.MASKED_LM, main_metric=NO_METRIC)

    def __repr__(self) -> str:
        return "CorpusTask()"

    def encode_train(self, tokenizer: Any, run: Any) -> EncodedSplit:
        import datasets

        source = run.data.corpus
        if not source:
            raise ConfigError("task corpus needs data.corpus: a text file (one document or sentence per line) "
                              "or hub:NAME[:CONFIG][:SPLIT][:COLUMN]")
        corpus = read_corpus(source, run.data.max_train_samples)
        columns: dict[str, list[list[int]]] = {}
        chunk = 2048
        for start in range(0, len(corpus.lines), chunk):
            encoded = tokenizer(corpus.lines[start:start + chunk], truncation=True,
                                max_length=run.train.max_seq_length, padding=False)
            for key in ("input_ids", "attention_mask", "token_type_ids"):
                if key in encoded:
                    columns.setdefault(key, []).extend(list(x) for x in encoded[key])
        features = datasets.Dataset.from_dict(columns)
        metadata = {"task": "corpus", "split": "train", "source": corpus.source, "num_rows": len(corpus.lines),
                    "empty_lines": corpus.empty_lines}
        return EncodedSplit(name="train", features=features, skipped_rows=corpus.empty_lines, metadata=metadata)

    def encode_eval(self, tokenizer: Any, run: Any) -> list[EncodedSplit]:
        return []

    def data_sources(self, run: Any) -> list[Path | str]:
        source = run.data.corpus
        if not source:
            return []
        return [source if source.startswith(HUB_PREFIX) else Path(source).expanduser()]

    def score(self, split: EncodedSplit, outputs: Mapping[str, Any]) -> dict[str, float]:
        return {}


CORPUS = CorpusTask()


# ------------------------------------------------------------------------------------------------
# GLUE training sentences -> corpus file
# ------------------------------------------------------------------------------------------------
def glue_sentences(task_names: Iterable[str], data_dir: str | Path | None, on_bad_row: str = "error") -> Iterator[str]:
    """Every text field of every training row of the named GLUE tasks, one string each (pair tasks
    give both sentences), in file order."""
    from kdbench.config import DataConfig
    from kdbench.plugins import TASKS

    for name in task_names:
        task = TASKS.get(name)
        if not hasattr(task, "load_rows"):
            raise ConfigError(f"task {name!r} is not a GLUE task")
        run = argparse.Namespace(data=DataConfig(data_dir=str(data_dir) if data_dir else None, on_bad_row=on_bad_row))
        rows = task.load_rows("train", run)
        for texts in rows.texts:
            yield from (text for text in texts if text)


def write_glue_corpus(task_names: Iterable[str], data_dir: str | Path | None, out: str | Path,
                      dedupe: bool = False, on_bad_row: str = "error") -> dict[str, int]:
    """Write the training sentences of GLUE tasks to ``out``, one per line (newlines inside a text
    become spaces). Returns ``{"lines": written, "duplicates": dropped}``; duplicates are dropped
    only with ``dedupe=True``."""
    names = [n.strip() for n in task_names if n.strip()]
    if not names:
        raise ConfigError("give at least one GLUE task (e.g. --tasks sst2,rte)")
    out = Path(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    seen: set[str] = set()
    written = duplicates = 0
    tmp = out.with_name(out.name + ".tmp")
    with open(tmp, "w", encoding="utf-8") as handle:
        for sentence in glue_sentences(names, data_dir, on_bad_row):
            line = " ".join(sentence.split())
            if not line:
                continue
            if dedupe:
                if line in seen:
                    duplicates += 1
                    continue
                seen.add(line)
            handle.write(line + "\n")
            written += 1
    tmp.replace(out)
    return {"lines": written, "duplicates": duplicates}


def add_command(subparsers: Any) -> None:
    """``kdbench corpus glue --tasks sst2,rte --data-dir DIR --out corpus.txt [--dedupe]``."""
    parser = subparsers.add_parser("corpus", help="build a plain-text corpus for general distillation")
    sources = parser.add_subparsers(dest="corpus_source", required=True)
    glue = sources.add_parser("glue", help="GLUE training sentences, one per line")
    glue.add_argument("--tasks", required=True, help="comma-separated GLUE tasks, e.g. sst2,rte")
    glue.add_argument("--data-dir", default=None, help="folder with glue_data/ (default: $KDBENCH_DATA_DIR, then the Hub)")
    glue.add_argument("--out", required=True, help="the corpus file to write")
    glue.add_argument("--dedupe", action="store_true", help="drop repeated sentences")
    glue.add_argument("--on-bad-row", default="error", choices=("error", "skip"))
    glue.set_defaults(handler=_cmd_corpus_glue)


def _cmd_corpus_glue(args: argparse.Namespace) -> int:
    counts = write_glue_corpus(args.tasks.split(","), args.data_dir, args.out, args.dedupe, args.on_bad_row)
    print(f"wrote {counts['lines']} lines to {args.out}" + (f" ({counts['duplicates']} duplicates dropped)" if args.dedupe else ""))
    return 0
