"""Official GLUE and SQuAD metrics as pure functions (numpy and plain Python only).

Scale: every metric returned here is a float on the **0-100 scale**, as in the papers' tables
(accuracy 84.6, F1 88.9, Matthews correlation 52.1, Pearson/Spearman 85.8, SQuAD EM/F1). The one
exception is ``best_threshold`` (SQuAD v2), which is a threshold on the model's no-answer score.

GLUE (see ``GLUE_TASK_METRICS``): CoLA Matthews correlation; SST-2, QNLI, RTE, WNLI, MNLI-m/-mm
accuracy; MRPC and QQP accuracy and F1 (positive class = label id 1); STS-B Pearson and Spearman
(Spearman uses average ranks for ties). :func:`glue_average` averages one number per task the
papers' way: MRPC/QQP F1, STS-B Spearman, MNLI matched and mismatched both counted.

SQuAD: answers are normalised the way the official v1.1/v2.0 scripts do (lower-case, drop
punctuation, drop the articles a/an/the, collapse white space); EM and token F1 take the maximum
over the gold answers. v2.0 adds unanswerable questions (gold = ``[""]``), HasAns/NoAns splits and
the best no-answer threshold from per-question no-answer probabilities. :func:`squad_scores` gives
the result under kdbench's names (``em``, ``f1``, ``best_em``, ``best_em_thresh``, ...), the one
function behind both a run's SQuAD metrics and the ``kdbench_squad`` evaluate module.

Non-finite values (NaN, inf) among predictions or references are an error naming their position:
a score is never NaN.

``evaluate`` modules: :func:`module_path` gives the installed script of ``kdbench_glue`` or
``kdbench_squad`` (``evaluate.load(module_path("glue"), "mrpc")`` works offline); the metric classes
live in :mod:`kdbench.metric_modules` and call the functions here.
"""

from __future__ import annotations

import collections
import math
import re
import string
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

# ---------------------------------------------------------------------------------------------
# Classification / regression metrics


def _as_1d(values: Any, name: str) -> np.ndarray:
    array = np.asarray(values)
    if array.ndim == 2 and array.shape[1] == 1:
        array = array[:, 0]
    if array.ndim != 1:
        raise ValueError(f"{name}: expected a 1-d array, got shape {array.shape}")
    return array


def _check_pair(predictions: Any, references: Any) -> tuple[np.ndarray, np.ndarray]:
    preds = _as_1d(predictions, "predictions")
    refs = _as_1d(references, "references")
    if preds.shape != refs.shape:
        raise ValueError(f"predictions ({preds.shape[0]}) and references ({refs.shape[0]}) differ in length")
    if preds.size == 0:
        raise ValueError("cannot score an empty set of predictions")
    _check_finite(preds, "predictions")
    _check_finite(refs, "references")
    return preds, refs


def _check_finite(array: np.ndarray, name: str) -> None:
    """A ValueError naming the first NaN/inf position (a NaN would otherwise become a NaN score)."""
    if array.dtype.kind not in "fc":
        return
    bad = np.flatnonzero(~np.isfinite(array))
    if bad.size:
        raise ValueError(f"{name}: value {array[bad[0]]} at index {int(bad[0])} is not a finite number "
                         f"({bad.size} non-finite values)")


def accuracy(predictions: Any, references: Any) -> float:
    """Percentage of exact matches."""
    preds, refs = _check_pair(predictions, references)
    return float(np.mean(preds == refs) * 100.0)


def f1_binary(predictions: Any, references: Any, positive: int = 1) -> float:
    """F1 of the positive class (MRPC: equivalent, QQP: duplicate); 0 when undefined."""
    preds, refs = _check_pair(predictions, references)
    tp = float(np.sum((preds == positive) & (refs == positive)))
    fp = float(np.sum((preds == positive) & (refs != positive)))
    fn = float(np.sum((preds != positive) & (refs == positive)))
    if tp == 0.0:
        return 0.0
    precision = tp / (tp + fp)
    recall = tp / (tp + fn)
    return float(2 * precision * recall / (precision + recall) * 100.0)


def matthews_corrcoef(predictions: Any, references: Any) -> float:
    """Matthews correlation (multi-class form, as scikit-learn); 0 when undefined."""
    preds, refs = _check_pair(predictions, references)
    classes = np.unique(np.concatenate([preds, refs]))
    index = {c: i for i, c in enumerate(classes.tolist())}
    k = len(classes)
    confusion = np.zeros((k, k), dtype=np.float64)
    for p, r in zip(preds.tolist(), refs.tolist()):
        confusion[index[r], index[p]] += 1
    t_sum = confusion.sum(axis=1)  # true counts per class
    p_sum = confusion.sum(axis=0)  # predicted counts per class
    n_correct = np.trace(confusion)
    n = confusion.sum()
    cov_ytyp = n_correct * n - float(np.dot(t_sum, p_sum))
    cov_ypyp = n * n - float(np.dot(p_sum, p_sum))
    cov_ytyt = n * n - float(np.dot(t_sum, t_sum))
    if cov_ypyp == 0 or cov_ytyt == 0:
        return 0.0
    return float(cov_ytyp / math.sqrt(cov_ytyt * cov_ypyp) * 100.0)


def pearson(predictions: Any, references: Any) -> float:
    """Pearson correlation coefficient (x100); 0 when a side is constant."""
    preds, refs = _check_pair(predictions, references)
    x = preds.astype(np.float64) - preds.astype(np.float64).mean()
    y = refs.astype(np.float64) - refs.astype(np.float64).mean()
    denom = math.sqrt(float(np.dot(x, x)) * float(np.dot(y, y)))
    if denom == 0.0:
        return 0.0
    return float(np.dot(x, y) / denom * 100.0)


def rankdata(values: Any) -> np.ndarray:
    """Ranks starting at 1, ties get the average of their ranks (scipy's ``method='average'``)."""
    array = _as_1d(values, "values")
    order = np.argsort(array, kind="mergesort")
    sorted_values = array[order]
    ranks = np.empty(len(array), dtype=np.float64)
    start = 0
    n = len(array)
    while start < n:
        end = start
        while end + 1 < n and sorted_values[end + 1] == sorted_values[start]:
            end += 1
        ranks[order[start:end + 1]] = (start + end) / 2.0 + 1.0
        start = end + 1
    return ranks


def spearman(predictions: Any, references: Any) -> float:
    """Spearman rank correlation (x100): Pearson on average ranks."""
    preds, refs = _check_pair(predictions, references)
    return pearson(rankdata(preds.astype(np.float64)), rankdata(refs.astype(np.float64)))


# Per GLUE task: the metrics reported, and the one number the papers' average uses.
GLUE_TASK_METRICS: dict[str, tuple[str, ...]] = {
    "cola": ("mcc",),
    "sst2": ("acc",),
    "mrpc": ("acc", "f1"),
    "stsb": ("pearson", "spearman"),
    "qqp": ("acc", "f1"),
    "mnli": ("acc",),  # acc_mm for the mismatched dev set
    "mnli-mm": ("acc_mm",),
    "qnli": ("acc",),
    "rte": ("acc",),
    "wnli": ("acc",),
    "ax": ("mcc",),
}
GLUE_AVERAGE_METRICS: dict[str, tuple[str, ...]] = {
    "cola": ("mcc",),
    "sst2": ("acc",),
    "mrpc": ("f1",),
    "stsb": ("spearman",),
    "qqp": ("f1",),
    "mnli": ("acc", "acc_mm"),
    "qnli": ("acc",),
    "rte": ("acc",),
}


def glue_metrics(task: str, predictions: Any, references: Any) -> dict[str, float]:
    """The metrics of GLUE ``task`` (a key of :data:`GLUE_TASK_METRICS`; ``mnli-mm`` gives ``acc_mm``)
    for class ids (or STS-B scores) ``predictions`` against ``references``, 0-100."""
    if task not in GLUE_TASK_METRICS:
        raise ValueError(f"unknown GLUE task {task!r} (known: {', '.join(GLUE_TASK_METRICS)})")
    names = GLUE_TASK_METRICS[task]
    base = [name.removesuffix("_mm") for name in names]
    result = classification_metrics(predictions, references, base)
    return {name: result[plain] for name, plain in zip(names, base)}


def classification_metrics(predictions: Any, references: Any, names: Iterable[str]) -> dict[str, float]:
    """Compute the named metrics (``acc``, ``f1``, ``mcc``, ``pearson``, ``spearman``)."""
    functions = {"acc": accuracy, "f1": f1_binary, "mcc": matthews_corrcoef, "pearson": pearson,
                 "spearman": spearman}
    result = {}
    for name in names:
        if name not in functions:
            raise ValueError(f"unknown metric {name!r} (known: {', '.join(functions)})")
        result[name] = functions[name](predictions, references)
    return result


def glue_average(results: Mapping[str, Mapping[str, float]], include_wnli: bool = False) -> float:
    """The papers' GLUE score: mean of one number per task (MRPC/QQP F1, STS-B Spearman, CoLA MCC,
    others accuracy), MNLI matched and mismatched counted separately.

    ``results`` maps task names (``mnli``, ``mnli-mm``, ``sst2``, ...) to their metric dicts. MNLI
    mismatched is taken from ``results["mnli"]["acc_mm"]`` or ``results["mnli-mm"]["acc_mm"]``.
    WNLI is left out (as in BERT, TinyBERT, MobileBERT) unless ``include_wnli``.
    """
    wanted = dict(GLUE_AVERAGE_METRICS)
    if include_wnli:
        wanted["wnli"] = ("acc",)
    numbers: list[float] = []
    for task, metric_names in wanted.items():
        for metric in metric_names:
            value = None
            for source in (task, f"{task}-mm") if metric == "acc_mm" else (task,):
                if source in results and metric in results[source]:
                    value = results[source][metric]
                    break
            if value is None and task == "mnli" and metric == "acc" and "mnli-mm" in results:
                value = results["mnli-mm"].get("acc")
            if value is not None:
                numbers.append(float(value))
    if not numbers:
        raise ValueError("no GLUE task results to average")
    return float(np.mean(numbers))


# ---------------------------------------------------------------------------------------------
# SQuAD (official v1.1 / v2.0 evaluation semantics)

_ARTICLES = re.compile(r"\b(a|an|the)\b", re.UNICODE)
_PUNCTUATION = set(string.punctuation)


def normalize_answer(text: str) -> str:
    """Lower-case, remove punctuation, remove articles a/an/the, collapse white space."""
    text = text.lower()
    text = "".join(ch for ch in text if ch not in _PUNCTUATION)
    text = _ARTICLES.sub(" ", text)
    return " ".join(text.split())


def _tokens(text: str) -> list[str]:
    return normalize_answer(text).split() if text else []


def exact_match_score(prediction: str, gold: str) -> float:
    return float(normalize_answer(prediction) == normalize_answer(gold))


def f1_score(prediction: str, gold: str) -> float:
    """Token F1 in [0, 1]; both empty (no-answer) -> 1, one empty -> 0 (as the v2.0 script)."""
    pred_tokens = _tokens(prediction)
    gold_tokens = _tokens(gold)
    if not pred_tokens or not gold_tokens:
        return float(pred_tokens == gold_tokens)
    return _token_f1(pred_tokens, gold_tokens)


def _token_f1(pred_tokens: list[str], gold_tokens: list[str]) -> float:
    """Harmonic mean of token precision and recall over the shared multiset; 0 when none is shared."""
    common = collections.Counter(pred_tokens) & collections.Counter(gold_tokens)
    same = sum(common.values())
    if same == 0:
        return 0.0
    precision = same / len(pred_tokens)
    recall = same / len(gold_tokens)
    return 2 * precision * recall / (precision + recall)


def max_over_golds(metric: Any, prediction: str, golds: Sequence[str]) -> float:
    return max(metric(prediction, gold) for gold in golds)


def squad_gold_answers(dataset: Sequence[Mapping[str, Any]] | Mapping[str, Any],
                       version: str = "2.0") -> dict[str, list[str]]:
    """``{question_id: [gold answer texts]}`` from SQuAD JSON ``data`` (or the whole JSON object).

    ``version="1.1"``: every answer text, as the v1.1 script reads them. ``version="2.0"``: answers
    whose normalised text is empty are dropped and a question left with none gets ``[""]`` (no
    answer), as the v2.0 script does.
    """
    articles = dataset["data"] if isinstance(dataset, Mapping) else dataset
    golds: dict[str, list[str]] = {}
    for article in articles:
        for paragraph in article["paragraphs"]:
            for qa in paragraph["qas"]:
                if version.startswith("1"):
                    golds[qa["id"]] = [a["text"] for a in qa.get("answers", [])]
                    continue
                texts = [a["text"] for a in qa.get("answers", []) if normalize_answer(a["text"])]
                golds[qa["id"]] = texts or [""]
    return golds


def squad_has_answer(dataset: Sequence[Mapping[str, Any]] | Mapping[str, Any]) -> dict[str, bool]:
    """``{question_id: bool(answers)}``: the v2.0 script's HasAns/NoAns split (by the raw answer list)."""
    articles = dataset["data"] if isinstance(dataset, Mapping) else dataset
    return {qa["id"]: bool(qa.get("answers")) for article in articles
            for paragraph in article["paragraphs"] for qa in paragraph["qas"]}


def f1_score_v1(prediction: str, gold: str) -> float:
    """Token F1 in [0, 1] exactly as the v1.1 script: 0 when no token is shared (also both empty)."""
    return _token_f1(normalize_answer(prediction).split(), normalize_answer(gold).split())


def squad_v1(golds: Mapping[str, Sequence[str]], predictions: Mapping[str, str]) -> dict[str, float]:
    """Official v1.1 scores: unanswered questions count as wrong. Returns ``exact_match``, ``f1``
    and ``em`` (= ``exact_match``), 0-100. ``golds`` as :func:`squad_gold_answers` with ``version="1.1"``."""
    if not golds:
        raise ValueError("no gold questions to score")
    em = f1 = 0.0
    for qid, answers in golds.items():
        if qid not in predictions:
            continue
        em += max_over_golds(exact_match_score, predictions[qid], answers)
        f1 += max_over_golds(f1_score_v1, predictions[qid], answers)
    em = 100.0 * em / len(golds)
    f1 = 100.0 * f1 / len(golds)
    return {"exact_match": em, "em": em, "f1": f1}


def _raw_scores(golds: Mapping[str, Sequence[str]], predictions: Mapping[str, str]) -> tuple[dict, dict]:
    """EM and F1 (v2.0 form) of every question that has a prediction, in gold order."""
    exact, f1 = {}, {}
    for qid, answers in golds.items():
        if qid not in predictions:
            continue
        exact[qid] = max_over_golds(exact_match_score, predictions[qid], answers)
        f1[qid] = max_over_golds(f1_score, predictions[qid], answers)
    return exact, f1


def _apply_threshold(scores: Mapping[str, float], na_probs: Mapping[str, float], has_answer: Mapping[str, bool],
                     threshold: float) -> dict[str, float]:
    out = {}
    for qid, score in scores.items():
        if na_probs[qid] > threshold:
            out[qid] = float(not has_answer[qid])
        else:
            out[qid] = score
    return out


def _best_threshold(predictions: Mapping[str, str], scores: Mapping[str, float], na_probs: Mapping[str, float],
                    has_answer: Mapping[str, bool], total: int) -> tuple[float, float]:
    """The official search: start from "answer nothing" and walk the answered questions by rising
    na_prob (stable: ties keep the order of ``na_probs``). ``scores`` holds the answered questions;
    a question without a prediction is wrong at every threshold and counts only in ``total``."""
    current = best = float(sum(1 for qid in scores if not has_answer[qid]))
    best_threshold = 0.0
    for qid in sorted(na_probs, key=lambda q: na_probs[q]):
        if qid not in scores:
            continue
        if has_answer[qid]:
            diff = scores[qid]
        elif predictions[qid]:
            diff = -1.0
        else:
            diff = 0.0
        current += diff
        if current > best:
            best = current
            best_threshold = na_probs[qid]
    return 100.0 * best / total, float(best_threshold)


def _no_answer_probabilities(answered: Sequence[str], na_probs: Mapping[str, Any] | None) -> dict[str, float]:
    """``{qid: na_prob}`` for the answered questions, in the order of ``na_probs`` (the order the
    official search breaks ties in); 0 for all without ``na_probs``. A missing, non-numeric or NaN
    value is a ValueError naming the question id."""
    if na_probs is None:
        return dict.fromkeys(answered, 0.0)
    wanted = set(answered)
    missing = [qid for qid in answered if qid not in na_probs]
    if missing:
        raise ValueError(f"no-answer scores: {len(missing)} answered questions have none, e.g. question id "
                         f"{missing[0]!r}")
    probs: dict[str, float] = {}
    for qid, value in na_probs.items():
        if qid not in wanted:
            continue
        if isinstance(value, bool) or not isinstance(value, (int, float, np.integer, np.floating)) \
                or math.isnan(float(value)):
            raise ValueError(f"no-answer scores: question id {qid!r} has {value!r}, not a number")
        probs[qid] = float(value)
    return probs


def squad_v2(golds: Mapping[str, Sequence[str]], predictions: Mapping[str, str],
             na_probs: Mapping[str, float] | None = None, na_prob_threshold: float = 1.0,
             has_answer: Mapping[str, bool] | None = None) -> dict[str, float]:
    """Official v2.0 scores (0-100), under the official names: ``exact`` (also ``em``/``exact_match``),
    ``f1``, ``total``, ``has_ans_*``/``no_ans_*`` (when present) and, with ``na_probs``,
    ``best_exact`` (also ``best_em``), ``best_exact_thresh``, ``best_f1``, ``best_f1_thresh``
    (also ``best_threshold``).

    An empty prediction string means "no answer". Without ``na_probs`` every question has
    na_prob 0 (so the threshold changes nothing), as in the official script; with them, every
    answered question needs a numeric value (ids of other questions are ignored). ``has_answer`` is
    the HasAns/NoAns split (:func:`squad_has_answer`, the script's ``bool(qa["answers"])``); by
    default a question whose golds are ``[""]`` is NoAns. Predictions for ids not in ``golds`` are
    ignored, as by the official script.

    Deviation: the official script leaves questions with no prediction out of the total (and then
    fails on the HasAns/NoAns split); here they count as wrong, in every score and at every
    threshold (as the v1.1 script counts them). With every question answered the two agree exactly.
    """
    if not golds:
        raise ValueError("no gold questions to score")
    if has_answer is None:
        has_answer = {qid: any(normalize_answer(x) for x in answers) for qid, answers in golds.items()}
    else:
        has_answer = {qid: bool(has_answer[qid]) for qid in golds}
    exact_raw, f1_raw = _raw_scores(golds, predictions)
    probs = _no_answer_probabilities(list(exact_raw), na_probs)
    exact_answered = _apply_threshold(exact_raw, probs, has_answer, na_prob_threshold)
    f1_answered = _apply_threshold(f1_raw, probs, has_answer, na_prob_threshold)
    exact = {qid: exact_answered.get(qid, 0.0) for qid in golds}
    f1 = {qid: f1_answered.get(qid, 0.0) for qid in golds}
    n = len(golds)
    result: dict[str, float] = {
        "exact": 100.0 * sum(exact.values()) / n,
        "f1": 100.0 * sum(f1.values()) / n,
        "total": float(n),
    }
    result["em"] = result["exact_match"] = result["exact"]
    has = [q for q in golds if has_answer[q]]
    no = [q for q in golds if not has_answer[q]]
    if has:
        result["has_ans_exact"] = 100.0 * sum(exact[q] for q in has) / len(has)
        result["has_ans_f1"] = 100.0 * sum(f1[q] for q in has) / len(has)
        result["has_ans_total"] = float(len(has))
    if no:
        result["no_ans_exact"] = 100.0 * sum(exact[q] for q in no) / len(no)
        result["no_ans_f1"] = 100.0 * sum(f1[q] for q in no) / len(no)
        result["no_ans_total"] = float(len(no))
    for key in ("has_ans", "no_ans"):
        if f"{key}_exact" in result:
            result[f"{key}_em"] = result[f"{key}_exact"]
    if na_probs is not None:
        best_exact, exact_thresh = _best_threshold(predictions, exact_raw, probs, has_answer, n)
        best_f1, f1_thresh = _best_threshold(predictions, f1_raw, probs, has_answer, n)
        result.update({"best_exact": best_exact, "best_em": best_exact, "best_exact_thresh": exact_thresh,
                       "best_f1": best_f1, "best_f1_thresh": f1_thresh, "best_threshold": f1_thresh})
    return result


# kdbench's names of the v2.0 scores (result.json, `kdbench evaluate`, the evaluate module), taken from
# :func:`squad_v2`'s official names. ``best_em_thresh`` is the official ``best_exact_thresh``.
SQUAD_V2_NAMES: dict[str, str] = {
    "em": "exact", "f1": "f1", "total": "total",
    "has_ans_em": "has_ans_exact", "has_ans_f1": "has_ans_f1", "has_ans_total": "has_ans_total",
    "no_ans_em": "no_ans_exact", "no_ans_f1": "no_ans_f1", "no_ans_total": "no_ans_total",
    "best_em": "best_exact", "best_em_thresh": "best_exact_thresh",
    "best_f1": "best_f1", "best_f1_thresh": "best_f1_thresh", "best_threshold": "best_f1_thresh",
}


def squad_scores(references: Mapping[str, Sequence[str]], predictions: Mapping[str, str], version: str = "1.1",
                 na_probs: Mapping[str, float] | None = None, na_prob_threshold: float = 1.0) -> dict[str, float]:
    """kdbench's SQuAD result for ``{question_id: answer texts as in the data file}`` and
    ``{question_id: predicted text}``: v1.1 ``em``/``f1``; v2.0 ``em``, ``f1``, ``total``, the
    HasAns/NoAns splits and, with ``na_probs``, ``best_em``/``best_em_thresh``/``best_f1``/
    ``best_f1_thresh`` (and ``best_threshold``, the F1 one), all 0-100 except totals and thresholds.

    v1.1 golds are every answer text; v2.0 drops answers that normalise to nothing and gives a
    question left without any the gold ``[""]``, and splits HasAns/NoAns by the raw answer list, as
    the official scripts do. Questions without a prediction count as wrong; predictions for other
    ids are ignored. This is the single implementation behind runs, ``kdbench evaluate`` and the
    ``kdbench_squad`` evaluate module.
    """
    if version.startswith("1"):
        result = squad_v1({qid: list(texts) for qid, texts in references.items()}, predictions)
        return {"em": result["em"], "f1": result["f1"]}
    golds = {qid: [t for t in texts if normalize_answer(t)] or [""] for qid, texts in references.items()}
    has_answer = {qid: bool(texts) for qid, texts in references.items()}
    result = squad_v2(golds, predictions, na_probs, na_prob_threshold, has_answer=has_answer)
    return {ours: result[official] for ours, official in SQUAD_V2_NAMES.items() if official in result}


# ---------------------------------------------------------------------------------------------
# evaluate modules

METRIC_MODULES: dict[str, str] = {"glue": "kdbench_glue", "squad": "kdbench_squad"}


def module_path(name: str) -> str:
    """The installed script of kdbench's ``evaluate`` module ``name`` (``glue`` or ``squad``), for
    ``evaluate.load(module_path("glue"), "mrpc")`` or ``evaluate.load(module_path("squad"), "squad-v2")``
    (offline: a local script, never the Hub)."""
    if name not in METRIC_MODULES:
        raise ValueError(f"unknown kdbench metric module {name!r} (known: {', '.join(METRIC_MODULES)})")
    path = Path(__file__).resolve().parent / "data" / f"{METRIC_MODULES[name]}.py"
    if not path.is_file():  # pragma: no cover - a broken installation
        raise FileNotFoundError(f"kdbench metric module {str(path)!r} is missing from the installation")
    return str(path)
