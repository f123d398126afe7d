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
the best no-answer threshold from per-question no-answer probabilities.
"""

from __future__ import annotations

import collections
import math
import re
import string
from collections.abc import Iterable, Mapping, Sequence
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
    return preds, refs


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
                    has_answer: Mapping[str, bool]) -> tuple[float, float]:
    """The official search: start from "answer nothing" and walk questions by rising na_prob."""
    num_no_ans = sum(1 for qid in has_answer if not has_answer[qid])
    current = best = float(num_no_ans)
    best_threshold = 0.0
    for qid in sorted(na_probs, key=lambda q: na_probs[q]):
        if qid not in scores:
            continue
        if has_answer[qid]:
            diff = scores[qid]
        elif predictions.get(qid):
            diff = -1.0
        else:
            diff = 0.0
        current += diff
        if current > best:
            best = current
            best_threshold = na_probs[qid]
    return 100.0 * best / len(scores), float(best_threshold)


def squad_v2(golds: Mapping[str, Sequence[str]], predictions: Mapping[str, str],
             na_probs: Mapping[str, float] | None = None, na_prob_threshold: float = 1.0,
             has_answer: Mapping[str, bool] | None = None) -> dict[str, float]:
    """Official v2.0 scores (0-100): ``exact``/``em``/``exact_match``, ``f1``, ``total``,
    ``has_ans_*``/``no_ans_*`` (when present) and, with ``na_probs``, ``best_exact``/``best_em``,
    ``best_f1`` and their thresholds (``best_exact_thresh``, ``best_f1_thresh``, ``best_threshold``).

    An empty prediction string means "no answer". Without ``na_probs`` every question has
    na_prob 0 (so the threshold changes nothing), as in the official script. ``has_answer`` is the
    HasAns/NoAns split (:func:`squad_has_answer`, the script's ``bool(qa["answers"])``); by default
    a question whose golds are ``[""]`` is NoAns. Deviation: the official script leaves questions
    with no prediction out of the total (and crashes on the HasAns/NoAns split); here they score 0.
    The best-threshold search walks questions in the order of ``na_probs`` (stable sort by value),
    as the script does.
    """
    if not golds:
        raise ValueError("no gold questions to score")
    if has_answer is None:
        has_answer = {qid: any(normalize_answer(x) for x in answers) for qid, answers in golds.items()}
    else:
        has_answer = {qid: bool(has_answer[qid]) for qid in golds}
    order = [q for q in na_probs if q in golds] if na_probs else []
    order += [q for q in golds if not na_probs or q not in na_probs]
    probs = {qid: float(na_probs.get(qid, 0.0)) if na_probs else 0.0 for qid in order}
    exact_raw, f1_raw = _raw_scores(golds, predictions)
    # Unanswered questions (missing from predictions) score 0, as "no prediction".
    exact_all = {qid: exact_raw.get(qid, 0.0) for qid in golds}
    f1_all = {qid: f1_raw.get(qid, 0.0) for qid in golds}
    exact = _apply_threshold(exact_all, probs, has_answer, na_prob_threshold)
    f1 = _apply_threshold(f1_all, probs, has_answer, na_prob_threshold)
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
        best_exact, exact_thresh = _best_threshold(predictions, exact_all, probs, has_answer)
        best_f1, f1_thresh = _best_threshold(predictions, f1_all, probs, has_answer)
        result.update({"best_exact": best_exact, "best_em": best_exact, "best_exact_thresh": exact_thresh,
                       "best_f1": best_f1, "best_f1_thresh": f1_thresh, "best_threshold": f1_thresh})
    return result
