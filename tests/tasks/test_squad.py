"""SQuAD v1.1/v2.0: official metric semantics, features, post-processing, validation, engine run."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import datasets
import numpy as np
import pytest

from kdbench import metrics as M
from kdbench.config import DataConfig, RunConfig, TrainConfig
from kdbench.errors import DataError
from kdbench.tasks.squad import (SQUAD_V1, SQUAD_V2, V1, V2, SquadOptions, doc_windows, encode_examples,
                                 max_context_flags, postprocess, read_squad_json, split_articles)

REFERENCE = "squad/reference_predictions/bert_large_ensemble_google.dev-v1.1.predictions.json"


def _squad_file(path: Path, qas_by_context: list[tuple[str, list[dict]]], version: str = "1.1") -> Path:
    data = {"version": version, "data": [{"title": "T", "paragraphs": [{"context": c, "qas": q} for c, q in qas_by_context]}]}
    path.write_text(json.dumps(data))
    return path


def _qa(qid: str, question: str, answers: list[tuple[str, int]], impossible: bool = False) -> dict:
    qa = {"id": qid, "question": question, "answers": [{"text": t, "answer_start": s} for t, s in answers]}
    if impossible:
        qa["is_impossible"] = True
    return qa


def test_reference_predictions_score_as_the_official_script(shared_data: Path) -> None:
    """The published BERT-large ensemble predictions: official v1.1 script gives EM 86.206, F1 92.196."""
    result = SQUAD_V1.score_prediction_file(shared_data / REFERENCE, shared_data / "squad")
    assert round(result["em"], 3) == 86.206
    assert round(result["f1"], 3) == 92.196


def test_evaluate_command_prints_the_reference_figures(shared_data: Path) -> None:
    out = subprocess.run([sys.executable, "-m", "kdbench", "evaluate", "squad", "--predictions",
                          str(shared_data / REFERENCE), "--data-dir", str(shared_data / "squad")],
                         capture_output=True, text=True, check=True)
    metrics = json.loads(out.stdout.strip().splitlines()[-1])
    assert (round(metrics["em"], 3), round(metrics["f1"], 3)) == (86.206, 92.196)


def test_v1_f1_differs_from_v2_on_empty_answers() -> None:
    # v1.1's f1 is 0 when nothing is shared, even if both normalise to empty; v2.0 gives 1.
    assert M.f1_score_v1("the", "a") == 0.0 and M.f1_score("the", "a") == 1.0
    assert M.exact_match_score("The  Cat!", "cat") == 1.0
    assert M.f1_score_v1("the big cat", "a cat") == pytest.approx(2 * 0.5 * 1.0 / 1.5)


def test_v2_metrics_hasans_noans_and_best_threshold() -> None:
    golds = {"a": ["Paris"], "b": [""], "c": ["blue sky"], "d": [""]}
    has = {"a": True, "b": False, "c": True, "d": False}
    preds = {"a": "Paris", "b": "London", "c": "sky", "d": ""}
    na = {"a": 0.1, "b": 0.9, "c": 0.5, "d": 0.7}
    r = M.squad_v2(golds, preds, na, 1.0, has_answer=has)
    # exact: a 1, b 0, c 0, d 1 -> 50; f1: a 1, b 0, c 2/3, d 1
    assert r["exact"] == 50.0 and r["f1"] == pytest.approx(100 * (1 + 0 + 2 / 3 + 1) / 4)
    assert r["has_ans_exact"] == 50.0 and r["no_ans_exact"] == 50.0 and r["has_ans_total"] == 2
    # the official walk by rising na_prob from "answer nothing" (2 of 4): a +1 -> 3 (at 0.1), c +0,
    # d +0 (empty prediction), b -1: best exact 3/4 at 0.1; f1: a +1, c +2/3 -> best at 0.5
    assert r["best_exact"] == 75.0 and r["best_exact_thresh"] == 0.1
    assert r["best_f1"] == pytest.approx(100 * (1 + 1 + 2 / 3 + 1) / 4) and r["best_f1_thresh"] == 0.5
    r2 = M.squad_v2(golds, preds, na, 0.6, has_answer=has)
    assert r2["exact"] == 75.0
    # the metrics a run may keep its best checkpoint on (train.select_metric) are ones the scores carry
    assert SQUAD_V2.spec.selectable_metrics == ("f1", "em", "best_f1", "best_em") and set(r) >= {"em", "best_em"}
    assert SQUAD_V1.spec.selectable_metrics == ("f1", "em")


def test_doc_windows_and_max_context_follow_bert() -> None:
    assert doc_windows(10, 4, 2) == [(0, 4), (2, 4), (4, 4), (6, 4)]
    assert doc_windows(300, 500, 128) == [(0, 300)]
    assert doc_windows(600, 350, 128) == [(0, 350), (128, 350), (256, 344)]
    windows = doc_windows(10, 4, 2)
    # token 2: window 0 min(2,1)=1 beats window 1 min(0,3)=0; token 3: window 1 min(1,2)=1 beats 0
    assert max_context_flags(windows, 0) == [True, True, True, False]
    assert max_context_flags(windows, 1) == [False, True, True, False]
    assert max_context_flags(windows, 3) == [False, True, True, True]


def test_features_and_oracle_logits_recover_answers(tokenizer) -> None:
    context = "The quick brown fox jumps over the lazy dog. " * 12 + "Marie Curie won the Nobel Prize in 1903."
    start = context.index("1903")
    examples = [{"id": "q1", "context": context, "question": "When did Curie win?",
                 "answers": [{"text": "1903", "answer_start": start}], "is_impossible": False}]
    cols = encode_examples(examples, tokenizer, 64, SquadOptions(doc_stride=16), training=True)
    assert len(cols["input_ids"]) > 3 and all(len(ids) <= 64 for ids in cols["input_ids"])
    hits = [i for i, s in enumerate(cols["start_positions"]) if s > 0]
    assert hits, "the answer lies in some window"
    i = hits[0]
    s, e = cols["start_positions"][i], cols["end_positions"][i]
    assert context[cols["offset_start"][i][s]:cols["offset_end"][i][e]] == "1903"
    assert cols["token_type_ids"][i][s] == 1 and cols["input_ids"][i][0] == tokenizer.cls_token_id
    # Oracle logits through post-processing give the answer back.
    width = max(len(x) for x in cols["input_ids"])
    start_logits = np.full((len(cols["input_ids"]), width), -5.0)
    end_logits = start_logits.copy()
    start_logits[i, s], end_logits[i, e] = 5.0, 5.0
    predicted = postprocess(examples, cols, start_logits, end_logits, SquadOptions(), v2=False)
    assert predicted.answers == {"q1": "1903"}


def test_postprocess_v2_null_score_and_max_answer_length() -> None:
    examples = [{"id": "x", "context": "aa bb cc dd", "question": "?", "answers": [], "is_impossible": True}]
    features = {"example_index": [0], "offset_start": [[-1, -1, 0, 3, 6, 9, -1]],
                "offset_end": [[-1, -1, 2, 5, 8, 11, -1]], "max_context": [[0, 0, 1, 1, 1, 1, 0]]}
    start = np.array([[1.0, 0, 3.0, 0, 0, 0, 0]])
    end = np.array([[1.0, 0, 0, 0, 0, 2.5, 0]])  # best span "aa bb cc dd" scores 5.5, null 2.0
    opts = SquadOptions(max_answer_length=4)
    p = postprocess(examples, features, start, end, opts, v2=True)
    assert p.answers["x"] == "aa bb cc dd" and p.null_odds["x"] == pytest.approx(2.0 - 5.5)
    p = postprocess(examples, features, start, end, SquadOptions(max_answer_length=3), v2=True)
    assert p.answers["x"] == "aa"  # 4-token span now too long; "aa" (3.0 + 0) beats others
    start[0, 0] = 10.0  # null 11 > best span: no answer
    p = postprocess(examples, features, start, end, opts, v2=True)
    assert p.answers["x"] == "" and p.null_odds["x"] > 0


# -- bad data: one test per case ------------------------------------------------------------------
def test_answer_start_not_matching_text(tmp_path: Path) -> None:
    path = _squad_file(tmp_path / "s.json", [("Paris is big.", [_qa("q1", "Where?", [("Paris", 3)])])])
    with pytest.raises(DataError, match=r"s\.json.*'q1'.*answer_start 3 does not match"):
        read_squad_json(path)
    data = read_squad_json(_squad_file(tmp_path / "t.json", [("Paris is big.", [
        _qa("q1", "Where?", [("Paris", 3)]), _qa("q2", "Where?", [("Paris", 0)])])]), on_bad_row="skip")
    assert [e["id"] for e in data.examples] == ["q2"] and data.skipped == 1


def test_duplicate_question_id(tmp_path: Path) -> None:
    path = _squad_file(tmp_path / "s.json", [("Paris is big.", [_qa("q1", "Where?", [("Paris", 0)]),
                                                                 _qa("q1", "What?", [("big", 9)])])])
    with pytest.raises(DataError, match=r"'q1'.*duplicate question id"):
        read_squad_json(path)


def test_empty_question_and_no_usable_questions(tmp_path: Path) -> None:
    path = _squad_file(tmp_path / "s.json", [("Paris is big.", [_qa("q1", "  ", [("Paris", 0)])])])
    with pytest.raises(DataError, match=r"'q1'.*empty question"):
        read_squad_json(path)
    with pytest.raises(DataError, match="no usable questions"):
        read_squad_json(path, on_bad_row="skip")


def test_v1_training_question_without_answer(tmp_path: Path) -> None:
    path = _squad_file(tmp_path / "s.json", [("Paris is big.", [_qa("q1", "Where?", [])])])
    with pytest.raises(DataError, match="'q1'.*no answer"):
        read_squad_json(path, V1, require_answers=True)
    assert read_squad_json(path, V2, require_answers=True).examples  # v2: fine (unanswerable)


def test_prediction_file_with_unknown_ids(shared_data: Path, tmp_path: Path) -> None:
    preds = tmp_path / "p.json"
    preds.write_text(json.dumps({"not-a-question": "x"}))
    with pytest.raises(DataError, match="not-a-question"):
        SQUAD_V1.score_prediction_file(preds, shared_data)


def test_hub_squad_with_patched_loader(monkeypatch: pytest.MonkeyPatch, tokenizer) -> None:
    rows = {"id": ["a", "b"], "title": ["T", "T"], "context": ["Paris is big.", "Rome is old."],
            "question": ["Which city is big?", "Which is old?"],
            "answers": [{"text": ["Paris"], "answer_start": [0]}, {"text": [], "answer_start": []}]}
    calls = []

    def fake_load(name, config=None, split=None):
        calls.append((name, split))
        return datasets.Dataset.from_dict(rows)

    monkeypatch.setattr(datasets, "load_dataset", fake_load)
    monkeypatch.delenv("KDBENCH_DATA_DIR", raising=False)
    run = RunConfig(method="finetune", task="squad-v2", student="x", train=TrainConfig(max_seq_length=32))
    split = SQUAD_V2.encode_eval(tokenizer, run)[0]
    assert calls == [("squad_v2", "validation")]
    assert [e["is_impossible"] for e in split.examples] == [False, True]
    train = SQUAD_V2.encode_train(tokenizer, run)
    assert calls[-1] == ("squad_v2", "train") and len(train) == 2
    assert train.features["start_positions"][1] == 0  # unanswerable -> [CLS]


def test_split_articles_and_v2_reconstructed_file_found(shared_data: Path, tmp_path: Path) -> None:
    train, held = split_articles(shared_data / "squad" / "dev-v1.1.json", tmp_path, 40)
    a = read_squad_json(train)
    b = read_squad_json(held)
    assert len(a.examples) + len(b.examples) == 10570 and not set(a.articles) & set(b.articles)
    assert SQUAD_V2.find_file(shared_data, "dev").name == "dev-v2.0.reconstructed.json"
    v2 = read_squad_json(SQUAD_V2.find_file(shared_data, "dev"), V2)
    assert len(v2.examples) == 11873 and sum(e["is_impossible"] for e in v2.examples) == 5945


def test_squad_through_the_engine(tmp_path: Path, tiny_bert_dir: Path) -> None:
    """Fine-tune a tiny span model on a small SQuAD file; record has em/f1 computed from start/end
    logits of every window mapped back to the questions."""
    from kdbench.engine import run_experiment

    context = "Alice lives in Paris. Bob lives in Rome. Carol lives in Oslo. " * 3
    qas = [_qa(f"q{i}", f"Where does {n} live?", [(c, context.index(c))])
           for i, (n, c) in enumerate([("Alice", "Paris"), ("Bob", "Rome"), ("Carol", "Oslo")] * 4)]
    for i, qa in enumerate(qas):
        qa["id"] = f"q{i}"
    path = _squad_file(tmp_path / "small.json", [(context, qas)])
    config = RunConfig(method="finetune", task="squad", student=str(tiny_bert_dir), output=str(tmp_path / "runs"),
                       train=TrainConfig(max_seq_length=32, batch_size=8, epochs=1, precision="fp32", lr=1e-3),
                       data=DataConfig(train_file=str(path), dev_file=str(path), max_eval_samples=6))
    run_dir = run_experiment(config)
    record = json.loads((run_dir / "result.json").read_text())
    assert record["status"] == "completed"
    assert set(record["metrics"]) == {"em", "f1"} and 0.0 <= record["metrics"]["f1"] <= 100.0
    assert record["data"]["train_rows"] > 12  # several windows per question at length 32


def test_v2_score_from_logits_reports_hasans_noans_and_best(tokenizer) -> None:
    examples = [
        {"id": "a", "context": "Paris is the capital of France.", "question": "Capital?", "is_impossible": False,
         "answers": [{"text": "Paris", "answer_start": 0}]},
        {"id": "b", "context": "Rome is old.", "question": "Who won?", "is_impossible": True, "answers": []},
    ]
    split = SQUAD_V2.encode_examples_for_eval(examples, tokenizer, 32, "dev")
    rows = split.features[:]
    width = max(len(x) for x in rows["input_ids"])
    start, end = np.zeros((2, width)), np.zeros((2, width))
    paris = rows["offset_start"][0].index(0)
    start[0, paris], end[0, paris] = 4.0, 4.0  # "Paris" scores 8 > null 0
    start[1, 0], end[1, 0] = 3.0, 3.0  # b: null 6 beats every span (0)
    metrics = SQUAD_V2.score(split, {"start_logits": start, "end_logits": end})
    assert metrics["em"] == 100.0 and metrics["f1"] == 100.0
    assert metrics["has_ans_em"] == 100.0 and metrics["no_ans_em"] == 100.0 and metrics["total"] == 2
    assert metrics["best_f1"] == 100.0 and "best_f1_thresh" in metrics


def test_evaluate_v2_with_no_answer_scores(shared_data: Path, tmp_path: Path) -> None:
    data = read_squad_json(SQUAD_V2.find_file(shared_data, "dev"), V2)
    answers = {e["id"]: (e["answers"][0]["text"] if e["answers"] else "") for e in data.examples}
    preds, probs = tmp_path / "p.json", tmp_path / "na.json"
    preds.write_text(json.dumps(answers))
    probs.write_text(json.dumps(dict.fromkeys(answers, 0.0)))
    result = SQUAD_V2.score_prediction_file(preds, shared_data, na_probs=probs)
    assert result["em"] == 100.0 and result["has_ans_total"] == 5928 and result["no_ans_total"] == 5945
    assert result["best_f1"] == 100.0


def test_predict_command_writes_squad_v2_files(tmp_path: Path, tiny_bert_dir: Path) -> None:
    from kdbench.cli import main

    context = "Alice lives in Paris. Bob lives in Rome."
    path = _squad_file(tmp_path / "v2.json", [(context, [_qa("q1", "Where does Alice live?", [("Paris", 15)]),
                                                         _qa("q2", "Where does Eve live?", [], impossible=True)])], "v2.0")
    out = tmp_path / "pred"
    assert main(["predict", "squad-v2", "--model", str(tiny_bert_dir), "--out", str(out), "--dev-file", str(path),
                 "--max-seq-length", "32"]) == 0
    answers = json.loads((out / "predictions.json").read_text())
    odds = json.loads((out / "null_odds.json").read_text())
    assert set(answers) == set(odds) == {"q1", "q2"}
    assert all(answers[q] == "" or answers[q] in context for q in answers)
    assert all((answers[q] == "") == (odds[q] > 0.0) for q in answers)  # threshold 0 on null - best span
    nbest = json.loads((out / "nbest_predictions.json").read_text())
    assert 1 <= len(nbest["q1"]) <= 20
