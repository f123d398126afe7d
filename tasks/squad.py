"""SQuAD v1.1 and v2.0: extractive question answering with a span (start/end logits) head.

Data sources, in order:

1. ``run.data.train_file`` / ``run.data.dev_file``: SQuAD JSON files (``{"version", "data": [...]}``).
2. ``run.data.resolved_data_dir()``: ``<dir>/squad/<name>`` or ``<dir>/<name>`` with the official
   names (``train-v1.1.json``, ``dev-v1.1.json``, ``train-v2.0.json``, ``dev-v2.0.json``; for v2 dev
   also ``dev-v2.0.reconstructed.json``).
3. Otherwise the Hub: ``datasets.load_dataset("squad" | "squad_v2", split="train" | "validation")``.

Features follow BERT's ``run_squad.py`` (the code TinyBERT, MobileBERT and DistilBERT's SQuAD runs
use): the question is cut at 64 tokens, the context is split into windows of at most
``max_seq_length - len(question) - 3`` tokens, each window starting ``doc_stride`` (128) tokens
after the previous one (BERT's meaning of doc stride; Hugging Face's ``stride`` is instead the
overlap); ``[CLS] question [SEP] window [SEP]``; a token that appears in several windows is a
valid answer start only in the window where it has the most context. Character offsets from the
fast tokenizer map token spans back to context text. Training targets are the answer's first and
last tokens, or ``[CLS]`` (0, 0) when the answer is outside the window or the question has none.
SQuAD papers use ``max_seq_length=384``; the run's ``train.max_seq_length`` decides.

Post-processing as BERT's ``write_predictions``: the 20 best start and end logits of every window,
spans with end >= start, at most 30 tokens, start at a max-context token; the best span over all
windows of an example wins. v2.0: the null score is the minimum over windows of
``start_logit[CLS] + end_logit[CLS]``; ``score_diff = null - best span`` is the no-answer score
(BERT's ``null_odds``), the answer is empty when ``score_diff > null_score_diff_threshold`` (0.0),
and the v2.0 evaluation's best-threshold search runs on those scores (``best_f1``,
``best_f1_thresh``). The answer text is the context slice given by the token offsets (as Hugging
Face's post-processing; BERT's ``get_final_text`` re-aligns wordpieces to white-space tokens, which
can differ on a few answers).

Metrics (0-100) are the official scripts': v1.1 ``em``/``f1``; v2.0 ``em``/``f1``, HasAns/NoAns
splits and ``best_em``/``best_f1`` with their thresholds ``best_em_thresh``/``best_f1_thresh``
(:func:`kdbench.metrics.squad_scores`, also behind the ``kdbench_squad`` evaluate module).
"""

from __future__ import annotations

import json
import logging
import math
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from kdbench import metrics as M
from kdbench.config import ConfigError
from kdbench.task import EncodedSplit, HeadType, Task, TaskSpec
from kdbench.tasks._io import BadRows, DataError


@dataclass(frozen=True)
class SquadOptions:
    """Feature and post-processing settings (BERT's ``run_squad.py`` defaults)."""

    doc_stride: int = 128
    max_query_length: int = 64
    n_best_size: int = 20
    max_answer_length: int = 30
    null_score_diff_threshold: float = 0.0


@dataclass(frozen=True)
class SquadVersion:
    name: str  # kdbench task name
    version: str  # "1.1" or "2.0"
    hub_name: str
    train_files: tuple[str, ...]
    dev_files: tuple[str, ...]

    @property
    def v2(self) -> bool:
        return self.version.startswith("2")


V1 = SquadVersion("squad", "1.1", "squad", ("train-v1.1.json",), ("dev-v1.1.json",))
V2 = SquadVersion("squad-v2", "2.0", "squad_v2", ("train-v2.0.json",),
                  ("dev-v2.0.json", "dev-v2.0.reconstructed.json"))


@dataclass
class SquadData:
    """Validated examples of one file or Hub split.

    Each example: ``{"id", "title", "context", "question", "answers": [{"text", "answer_start"}],
    "is_impossible"}``; ``articles`` keeps the article (title) of every example, in file order.
    """

    source: str
    examples: list[dict[str, Any]]
    skipped: int = 0
    articles: list[str] = field(default_factory=list)


# ------------------------------------------------------------------------------------------------
# Reading and validation
# ------------------------------------------------------------------------------------------------
def read_squad_json(path: Path | str, version: SquadVersion = V1, on_bad_row: str = "error",
                    require_answers: bool = False) -> SquadData:
    """Read and validate a SQuAD JSON file.

    Problems (each names the file, the question id and the problem): a missing or empty context or
    question, a duplicate question id, an answer whose ``answer_start`` does not point at its
    ``text`` in the context, a v1.1 question with no answer (when ``require_answers``). Under
    ``on_bad_row="skip"`` the question is dropped and counted. No usable question is an error.
    """
    path = Path(path).expanduser()
    loaded = _load_json(path, "SQuAD")
    articles = loaded.get("data") if isinstance(loaded, dict) else None
    if not isinstance(articles, list):
        raise DataError(f"{path}: expected a SQuAD file, a JSON object with a 'data' list of articles")
    return _validate(str(path), _flatten(articles, path), version, on_bad_row, require_answers)


def _flatten(articles: list[Any], path: Path) -> Iterable[tuple[str, dict[str, Any]]]:
    for a_index, article in enumerate(articles):
        if not isinstance(article, dict) or not isinstance(article.get("paragraphs"), list):
            raise DataError(f"{path}: article {a_index} has no 'paragraphs' list")
        title = str(article.get("title", a_index))
        for p_index, paragraph in enumerate(article["paragraphs"]):
            context = paragraph.get("context") if isinstance(paragraph, dict) else None
            qas = paragraph.get("qas") if isinstance(paragraph, dict) else None
            if not isinstance(qas, list):
                raise DataError(f"{path}: article {title!r} paragraph {p_index} has no 'qas' list")
            for q_index, qa in enumerate(qas):
                qa = qa if isinstance(qa, dict) else {}
                qid = qa.get("id", f"<article {title!r} paragraph {p_index} question {q_index}>")
                yield title, {"id": qid, "title": title, "context": context, "question": qa.get("question"),
                              "answers": qa.get("answers", []), "is_impossible": bool(qa.get("is_impossible", False))}


def _validate(source: str, raw: Iterable[tuple[str, dict[str, Any]]], version: SquadVersion, on_bad_row: str,
              require_answers: bool) -> SquadData:
    bad = BadRows(on_bad_row)
    data = SquadData(source, [])
    seen: set[str] = set()
    for title, example in raw:
        qid = example["id"]
        where = f"{source}, question id {qid!r}"
        problem = _problem(example, version, require_answers)
        if problem is None and qid in seen:
            problem = "duplicate question id"
        if problem is not None:
            bad(where, problem)
            continue
        seen.add(qid)
        data.examples.append(example)
        data.articles.append(title)
    data.skipped = bad.count
    if not data.examples:
        raise DataError(f"{source}: no usable questions" + (f" ({bad.count} malformed ones skipped)" if bad.count else ""))
    return data


def _problem(example: dict[str, Any], version: SquadVersion, require_answers: bool) -> str | None:
    if not isinstance(example["id"], str) or not example["id"].strip():
        return "missing question id"
    context, question = example["context"], example["question"]
    if not isinstance(context, str) or not context.strip():
        return "empty context"
    if not isinstance(question, str) or not question.strip():
        return "empty question"
    answers = example["answers"]
    if not isinstance(answers, list):
        return f"'answers' must be a list, got {type(answers).__name__}"
    for number, answer in enumerate(answers):
        text = answer.get("text") if isinstance(answer, dict) else None
        start = answer.get("answer_start") if isinstance(answer, dict) else None
        if not isinstance(text, str) or not text:
            return f"answer {number} has no text"
        if not isinstance(start, int) or isinstance(start, bool):
            return f"answer {number} ({text!r}) has a non-integer answer_start {start!r}"
        found = context[start:start + len(text)] if start >= 0 else None
        if found != text:
            return (f"answer {number} ({text!r}): answer_start {start} does not match its text "
                    f"(the context there reads {found!r})")
    if version.v2 and example["is_impossible"] and answers:
        return "is_impossible but has answers"
    if not answers and require_answers and not version.v2:
        return "no answer (SQuAD v1.1 questions are all answerable)"
    return None


def read_squad_hub(version: SquadVersion, split: str) -> SquadData:
    """A split of the Hub's ``squad`` / ``squad_v2`` (columns id, title, context, question,
    answers{text, answer_start})."""
    import datasets

    hub_split = {"dev": "validation"}.get(split, split)
    try:
        dataset = datasets.load_dataset(version.hub_name, split=hub_split)
    except Exception as error:
        raise DataError(f"{version.name}: could not load the Hub dataset {version.hub_name} split {hub_split!r} "
                        f"({type(error).__name__}: {error}); give --data-dir with {version.dev_files[0]} "
                        "or train_file=/dev_file= paths") from None
    if isinstance(dataset, Mapping):
        dataset = dataset[hub_split]
    source = f"hub:{version.hub_name}[{hub_split}]"

    def rows() -> Iterable[tuple[str, dict[str, Any]]]:
        for row in dataset:
            answers = [{"text": t, "answer_start": int(s)}
                       for t, s in zip(row["answers"]["text"], row["answers"]["answer_start"])]
            yield row.get("title", ""), {"id": row["id"], "title": row.get("title", ""), "context": row["context"],
                                         "question": row["question"], "answers": answers,
                                         "is_impossible": version.v2 and not answers}

    return _validate(source, rows(), version, "error", require_answers=False)


def split_articles(path: Path | str, out_dir: Path | str, train_articles: int) -> tuple[Path, Path]:
    """Split a SQuAD file by article: the first ``train_articles`` articles to ``<stem>.train.json``,
    the rest to ``<stem>.heldout.json`` in ``out_dir`` (small real train/eval runs when only a dev
    set is at hand). Returns both paths."""
    path = Path(path)
    loaded = json.loads(path.read_text(encoding="utf-8"))
    articles = loaded["data"]
    if not 0 < train_articles < len(articles):
        raise ConfigError(f"train_articles must be in [1, {len(articles) - 1}] for {path}, got {train_articles}")
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    paths = []
    for suffix, part in (("train", articles[:train_articles]), ("heldout", articles[train_articles:])):
        target = out / f"{path.stem}.{suffix}.json"
        target.write_text(json.dumps({"version": loaded.get("version", ""), "data": part}))
        paths.append(target)
    return paths[0], paths[1]


# ------------------------------------------------------------------------------------------------
# Features
# ------------------------------------------------------------------------------------------------
def doc_windows(num_tokens: int, max_tokens: int, doc_stride: int) -> list[tuple[int, int]]:
    """``(start, length)`` of BERT's sliding windows over ``num_tokens`` context tokens: each at most
    ``max_tokens`` long, each starting ``min(length, doc_stride)`` after the previous one."""
    windows = []
    start = 0
    while start < num_tokens:
        length = min(num_tokens - start, max_tokens)
        windows.append((start, length))
        if start + length == num_tokens:
            break
        start += min(length, doc_stride)
    return windows or [(0, 0)]


def max_context_flags(windows: Sequence[tuple[int, int]], index: int) -> list[bool]:
    """For window ``index``: per token, whether this window gives it the most context
    (``min(left, right) + 0.01 * length``; ties go to the earliest window), as BERT's
    ``_check_is_max_context``."""
    start, length = windows[index]
    flags = []
    for position in range(start, start + length):
        best_score, best_window = None, None
        for w, (w_start, w_length) in enumerate(windows):
            end = w_start + w_length - 1
            if position < w_start or position > end:
                continue
            score = min(position - w_start, end - position) + 0.01 * w_length
            if best_score is None or score > best_score:
                best_score, best_window = score, w
        flags.append(best_window == index)
    return flags


def encode_examples(examples: Sequence[dict[str, Any]], tokenizer: Any, max_length: int, options: SquadOptions,
                    training: bool, max_features: int | None = None) -> dict[str, list[Any]]:
    """Feature columns of ``examples``: model inputs, ``start_positions``/``end_positions`` (when
    ``training``), ``example_index``, ``offset_start``/``offset_end`` (character span of each token in
    the context, -1 outside it) and ``max_context`` (1 where the token may start an answer)."""
    if not getattr(tokenizer, "is_fast", False):
        raise ConfigError("SQuAD needs a fast tokenizer (character offsets); this tokenizer is not one")
    cls_id, sep_id = tokenizer.cls_token_id, tokenizer.sep_token_id
    contexts: dict[str, int] = {}
    for example in examples:
        contexts.setdefault(example["context"], len(contexts))
    context_list = list(contexts)
    encoded_contexts = tokenizer(context_list, add_special_tokens=False, return_offsets_mapping=True, verbose=False)
    encoded_questions = tokenizer([e["question"].lstrip() for e in examples], add_special_tokens=False)
    columns: dict[str, list[Any]] = {k: [] for k in ("input_ids", "attention_mask", "token_type_ids", "example_index",
                                                     "offset_start", "offset_end", "max_context")}
    if training:
        columns["start_positions"], columns["end_positions"] = [], []
    for index, example in enumerate(examples):
        question = encoded_questions["input_ids"][index][:options.max_query_length]
        c = contexts[example["context"]]
        context_ids = encoded_contexts["input_ids"][c]
        offsets = encoded_contexts["offset_mapping"][c]
        max_tokens = max_length - len(question) - 3
        if max_tokens < 1:
            raise ConfigError(f"max_seq_length {max_length} leaves no room for the context after a "
                              f"{len(question)}-token question; raise max_seq_length")
        windows = doc_windows(len(context_ids), max_tokens, options.doc_stride)
        answer_tokens = _answer_tokens(example, offsets) if training else None
        for w, (start, length) in enumerate(windows):
            ids = [cls_id, *question, sep_id, *context_ids[start:start + length], sep_id]
            prefix = len(question) + 2
            columns["input_ids"].append(ids)
            columns["attention_mask"].append([1] * len(ids))
            columns["token_type_ids"].append([0] * prefix + [1] * (length + 1))
            columns["example_index"].append(index)
            window_offsets = offsets[start:start + length]
            columns["offset_start"].append([-1] * prefix + [o[0] for o in window_offsets] + [-1])
            columns["offset_end"].append([-1] * prefix + [o[1] for o in window_offsets] + [-1])
            flags = max_context_flags(windows, w) if len(windows) > 1 else [True] * length
            columns["max_context"].append([0] * prefix + [int(f) for f in flags] + [0])
            if training:
                start_position = end_position = 0
                if answer_tokens is not None:
                    first, last = answer_tokens
                    if start <= first and last < start + length:
                        start_position, end_position = first - start + prefix, last - start + prefix
                columns["start_positions"].append(start_position)
                columns["end_positions"].append(end_position)
            if max_features is not None and len(columns["input_ids"]) >= max_features:
                return columns
    return columns


def _answer_tokens(example: dict[str, Any], offsets: Sequence[tuple[int, int]]) -> tuple[int, int] | None:
    """Context token indices of the first answer's first and last character (None: no answer)."""
    if not example["answers"]:
        return None
    answer = example["answers"][0]
    char_start = answer["answer_start"]
    char_end = char_start + len(answer["text"])
    first = next((i for i, (s, e) in enumerate(offsets) if e > char_start), None)
    last = next((i for i in range(len(offsets) - 1, -1, -1) if offsets[i][0] < char_end), None)
    if first is None or last is None or last < first:
        return None
    return first, last


# ------------------------------------------------------------------------------------------------
# Post-processing
# ------------------------------------------------------------------------------------------------
@dataclass
class SquadPredictions:
    """Per question id: the answer text, the no-answer score (v2: ``null - best span``; v1: absent)
    and the n-best list ``[(text, score)]``."""

    answers: dict[str, str]
    null_odds: dict[str, float]
    nbest: dict[str, list[tuple[str, float]]]


def postprocess(examples: Sequence[dict[str, Any]], features: Any, start_logits: np.ndarray, end_logits: np.ndarray,
                options: SquadOptions, v2: bool) -> SquadPredictions:
    """Answers from per-feature start/end logits (rows in ``features`` order; columns beyond a
    feature's length are ignored)."""
    start_logits = np.asarray(start_logits, dtype=np.float64)
    end_logits = np.asarray(end_logits, dtype=np.float64)
    if hasattr(features, "select_columns"):  # a datasets.Dataset: read the columns once, as lists
        features = features.select_columns(["example_index", "offset_start", "offset_end", "max_context"])[:]
    example_index = list(features["example_index"])
    if len(example_index) != len(start_logits):
        raise ValueError(f"{len(start_logits)} rows of logits for {len(example_index)} features")
    offset_start, offset_end, max_context = features["offset_start"], features["offset_end"], features["max_context"]
    by_example: dict[int, list[int]] = {}
    for row, index in enumerate(example_index):
        by_example.setdefault(index, []).append(row)
    n_best, max_answer = options.n_best_size, options.max_answer_length
    result = SquadPredictions({}, {}, {})
    for index, rows in by_example.items():
        example = examples[index]
        context = example["context"]
        candidates: list[tuple[float, int, int]] = []
        null_score = None
        for row in rows:
            starts_ok = np.asarray(max_context[row], dtype=bool)
            ends_ok = np.asarray(offset_start[row]) >= 0
            length = len(starts_ok)
            s, e = start_logits[row, :length], end_logits[row, :length]
            feature_null = s[0] + e[0]
            if null_score is None or feature_null < null_score:
                null_score = feature_null
            top_s = np.argsort(-s, kind="stable")[:n_best]
            top_e = np.argsort(-e, kind="stable")[:n_best]
            span = top_e[None, :] - top_s[:, None]
            valid = starts_ok[top_s][:, None] & ends_ok[top_e][None, :] & (span >= 0) & (span < max_answer)
            for i, j in zip(*np.nonzero(valid)):
                si, ei = int(top_s[i]), int(top_e[j])
                candidates.append((float(s[si] + e[ei]), offset_start[row][si], offset_end[row][ei]))
        candidates.sort(key=lambda c: -c[0])
        nbest: list[tuple[str, float]] = []
        seen: set[str] = set()
        for score, char_start, char_end in candidates:
            if len(nbest) >= n_best:
                break
            text = context[char_start:char_end]
            if text in seen:
                continue
            seen.add(text)
            nbest.append((text, score))
        best_text, best_score = nbest[0] if nbest else ("", float("-inf"))
        qid = example["id"]
        if v2:
            score_diff = float(null_score - best_score) if nbest else float("inf")
            result.null_odds[qid] = score_diff
            result.answers[qid] = "" if score_diff > options.null_score_diff_threshold else best_text
            if "" not in seen:
                nbest.append(("", float(null_score)))
                nbest.sort(key=lambda item: -item[1])
                nbest = nbest[:n_best]
        else:
            result.answers[qid] = best_text
        result.nbest[qid] = nbest
    return result


# ------------------------------------------------------------------------------------------------
# The task
# ------------------------------------------------------------------------------------------------
class SquadTask(Task):
    """SQuAD v1.1 or v2.0 (span head; ``em``/``f1`` and, for v2.0, ``best_f1``)."""

    def __init__(self, version: SquadVersion, options: SquadOptions | None = None) -> None:
        self.squad = version
        self.options = options or SquadOptions()
        selectable = ("f1", "em", "best_f1", "best_em") if version.v2 else ("f1", "em")
        self.spec = TaskSpec(name=version.name, head=HeadType.SPAN, main_metric="f1", selectable_metrics=selectable)

    def __repr__(self) -> str:
        return f"SquadTask({self.squad.name!r})"

    # -- files ---------------------------------------------------------------------------------
    def find_file(self, data_dir: Path | str, split: str) -> Path:
        names = self.squad.train_files if split == "train" else self.squad.dev_files
        root = Path(data_dir).expanduser()
        candidates = [folder / name for name in names for folder in (root / "squad", root)]
        for candidate in candidates:
            if candidate.is_file():
                return candidate
        tried = ", ".join(repr(str(c)) for c in candidates)
        raise DataError(f"{self.squad.name}: no {split} file under data dir {str(root)!r} (looked for {tried}); "
                        f"give {'train_file' if split == 'train' else 'dev_file'}=PATH")

    def split_file(self, split: str, run: Any) -> Path | None:
        """The JSON file ``split`` (``train`` or ``dev``) is read from; ``None`` for the Hub."""
        data = run.data
        explicit = data.train_file if split == "train" else data.dev_file
        if explicit:
            return Path(explicit).expanduser()
        data_dir = data.resolved_data_dir()
        return self.find_file(data_dir, split) if data_dir is not None else None

    def data_sources(self, run: Any) -> list[Path | str]:
        return [self.split_file(split, run) or f"hub:{self.squad.name}/{split}" for split in ("train", "dev")]

    def load(self, split: str, run: Any) -> SquadData:
        """Validated examples of ``train`` or ``dev``."""
        path = self.split_file(split, run)
        if path is None:
            return read_squad_hub(self.squad, split)
        return read_squad_json(path, self.squad, run.data.on_bad_row, require_answers=split == "train")

    # -- encoding ------------------------------------------------------------------------------
    def encode_train(self, tokenizer: Any, run: Any) -> EncodedSplit:
        import datasets

        data = self.load("train", run)
        columns = encode_examples(data.examples, tokenizer, run.train.max_seq_length, self.options, training=True,
                                  max_features=run.data.max_train_samples)
        keep = ("input_ids", "attention_mask", "token_type_ids", "start_positions", "end_positions", "example_index")
        features = datasets.Dataset.from_dict({k: columns[k] for k in keep})
        examples_used = len(set(columns["example_index"]))
        metadata = {"task": self.squad.name, "split": "train", "source": data.source, "num_rows": len(data.examples),
                    "examples_used": examples_used}
        return EncodedSplit("train", features, skipped_rows=data.skipped, metadata=metadata)

    def encode_eval(self, tokenizer: Any, run: Any) -> list[EncodedSplit]:
        data = self.load("dev", run)
        examples = data.examples
        if run.data.max_eval_samples is not None:
            examples = examples[:run.data.max_eval_samples]
        return [self.encode_examples_for_eval(examples, tokenizer, run.train.max_seq_length, "dev", data.source,
                                              data.skipped)]

    def encode_examples_for_eval(self, examples: list[dict[str, Any]], tokenizer: Any, max_length: int, name: str,
                                 source: str = "", skipped: int = 0) -> EncodedSplit:
        import datasets

        columns = encode_examples(examples, tokenizer, max_length, self.options, training=False)
        metadata = {"task": self.squad.name, "split": name, "source": source, "num_rows": len(examples)}
        return EncodedSplit(name, datasets.Dataset.from_dict(columns), examples=list(examples), skipped_rows=skipped,
                            metadata=metadata)

    # -- scoring -------------------------------------------------------------------------------
    def predictions(self, split: EncodedSplit, outputs: Mapping[str, np.ndarray]) -> SquadPredictions:
        if split.examples is None:
            raise ValueError(f"{self.squad.name}: split {split.name!r} carries no examples to map answers to")
        if "start_logits" not in outputs or "end_logits" not in outputs:
            raise ValueError(f"{self.squad.name}: scoring needs start_logits and end_logits, got {sorted(outputs)}")
        return postprocess(split.examples, split.features, outputs["start_logits"], outputs["end_logits"],
                           self.options, self.squad.v2)

    def score(self, split: EncodedSplit, outputs: Mapping[str, np.ndarray]) -> dict[str, float]:
        predicted = self.predictions(split, outputs)
        return self.score_answers(split.examples, predicted.answers, predicted.null_odds if self.squad.v2 else None)

    def score_answers(self, examples: Sequence[dict[str, Any]], answers: Mapping[str, str],
                      na_probs: Mapping[str, float] | None = None, na_prob_threshold: float = 1.0) -> dict[str, float]:
        """kdbench's metrics (:func:`kdbench.metrics.squad_scores`) of ``answers`` on ``examples``."""
        references = {e["id"]: [a["text"] for a in e["answers"]] for e in examples}
        return M.squad_scores(references, answers, self.squad.version, na_probs, na_prob_threshold)

    def score_prediction_file(self, path: Path, data_dir: Path | None, split: str = "dev",
                              na_probs: Path | None = None, na_prob_threshold: float = 1.0,
                              warn: Callable[[str], None] | None = None) -> dict[str, float]:
        """Score ``{question_id: answer_text}`` JSON (the official scripts' prediction format) against
        the dev file; v2.0 takes an optional ``{question_id: no-answer score}`` file for the
        threshold and best-threshold search.

        As the official scripts: ids not in the dev set are ignored, and questions without a
        prediction score 0 (v2.0's script instead drops them from the total: see
        :func:`kdbench.metrics.squad_v2`). Both are reported through ``warn`` (default: a logged
        warning) and counted in the result as ``unknown_ids`` and ``missing_predictions``. A file
        with no prediction for any dev question (``{}`` included) is an error, as is a no-answer
        file lacking an answered question or holding a value that is not a number.
        """
        if split not in ("dev", "validation"):
            raise DataError(f"{self.squad.name}: only the dev split has answers to score (got {split!r})")
        from argparse import Namespace

        from kdbench.config import DataConfig

        warn = warn or logging.getLogger(__name__).warning
        data = self.load("dev", Namespace(data=DataConfig(data_dir=str(data_dir) if data_dir else None)))
        answers = _read_json_mapping(path, "predictions")
        if not answers:
            raise DataError(f"{path}: no predictions (an empty JSON object)")
        bad = [qid for qid, text in answers.items() if not isinstance(text, str)]
        if bad:
            raise DataError(f"{path}: answers must be text; question id {bad[0]!r} has {answers[bad[0]]!r}")
        known = {e["id"] for e in data.examples}
        unknown = [qid for qid in answers if qid not in known]
        if len(unknown) == len(answers):
            raise DataError(f"{path}: none of its {len(answers)} question ids is in {data.source} "
                            f"(e.g. {unknown[0]!r}): wrong file or wrong SQuAD version?")
        missing = [e["id"] for e in data.examples if e["id"] not in answers]
        if unknown:
            warn(f"{len(unknown)} of {len(answers)} prediction ids are not questions of {data.source} "
                 f"(e.g. {unknown[0]!r}); ignored, as the official script does")
        if missing:
            warn(f"{len(missing)} of {len(data.examples)} questions have no prediction (e.g. {missing[0]!r}); "
                 "scored as wrong")
        probs = None
        if na_probs is not None:
            if not self.squad.v2:
                raise DataError(f"{self.squad.name}: no-answer scores are for SQuAD v2.0 only")
            probs = _read_json_mapping(na_probs, "no-answer scores")
            answered = [qid for qid in answers if qid in known]
            absent = [qid for qid in answered if qid not in probs]
            if absent:
                raise DataError(f"{na_probs}: no no-answer score for {len(absent)} answered questions, "
                                f"e.g. question id {absent[0]!r}")
            for qid in answered:
                value = probs[qid]
                if isinstance(value, bool) or not isinstance(value, (int, float)) or math.isnan(value):
                    raise DataError(f"{na_probs}: question id {qid!r} has no-answer score {json.dumps(value)}, "
                                    "not a number")
        result = self.score_answers(data.examples, answers, probs, na_prob_threshold)
        result.update(missing_predictions=len(missing), unknown_ids=len(unknown))
        return result


def _load_json(path: Path, what: str) -> Any:
    """The parsed JSON of ``path``; a missing or unparsable file is a DataError naming it."""
    if not path.is_file():
        raise DataError(f"{what} file {str(path)!r} does not exist")
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except (json.JSONDecodeError, UnicodeDecodeError) as error:
        raise DataError(f"{path}: not valid JSON ({error})") from None


def _read_json_mapping(path: Path | str, what: str) -> dict[str, Any]:
    path = Path(path)
    loaded = _load_json(path, what)
    if not isinstance(loaded, dict):
        raise DataError(f"{path}: expected a JSON object {{question_id: value}}")
    return loaded


SQUAD_V1 = SquadTask(V1)
SQUAD_V2 = SquadTask(V2)
