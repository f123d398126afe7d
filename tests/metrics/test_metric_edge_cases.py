"""Metric edge cases (issue 17 §5), through `kdbench evaluate` / `kdbench predict` on real files:
extra and missing SQuAD predictions, an empty prediction file, bad no-answer scores, the best
thresholds, non-finite and out-of-range STS-B values, and MNLI label-id order."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from squad_fixtures import (DEV_V1, DEV_V2, KDBENCH_V2_NAMES, OFFICIAL_V1, OFFICIAL_V2, REFERENCE_V1,
                            v2_leaderboard_style)

from kdbench import metrics as M
from kdbench.cli import main
from kdbench.errors import DataError
from kdbench.tasks.glue import MNLI, RTE, STSB, write_glue_predictions


def _evaluate(capsys: pytest.CaptureFixture, *argv: str) -> tuple[int, dict | None, list[str]]:
    """(exit code, the JSON printed on stdout or None, the lines on stderr) of `kdbench evaluate ...`."""
    code = main(["evaluate", *argv])
    out, err = capsys.readouterr()
    lines = out.strip().splitlines()
    return code, (json.loads(lines[-1]) if lines else None), err.strip().splitlines()


def _write_json(path: Path, value: object) -> Path:
    path.write_text(json.dumps(value))
    return path


# -- SQuAD: ids outside the dev set, missing predictions, empty files -------------------------------------
def test_extra_ids_are_ignored_with_a_warning_as_the_official_script(shared_data: Path, tmp_path: Path,
                                                                     capsys: pytest.CaptureFixture) -> None:
    predictions = json.loads((shared_data / REFERENCE_V1).read_text())
    predictions.update({"not-a-dev-id-1": "Paris", "not-a-dev-id-2": "x", "not-a-dev-id-3": ""})
    path = _write_json(tmp_path / "extra.json", predictions)
    code, metrics, err = _evaluate(capsys, "squad", "--predictions", str(path), "--data-dir", str(shared_data))
    assert code == 0
    assert (round(metrics["em"], 3), round(metrics["f1"], 3)) == (OFFICIAL_V1["exact_match"], OFFICIAL_V1["f1"])
    assert metrics["unknown_ids"] == 3 and metrics["missing_predictions"] == 0
    assert len(err) == 1 and err[0].startswith("kdbench: warning: 3 of 10573 prediction ids are not questions")
    assert "ignored" in err[0]


def test_real_v1_leaderboard_file_scored_as_v2(shared_data: Path, capsys: pytest.CaptureFixture) -> None:
    """The v1.1 ensemble file against dev-v2.0: 4,642 of its ids are not v2.0 questions (ignored) and
    the 5,945 unanswerable questions have no prediction (wrong): warned, counted, exit 0."""
    code, metrics, err = _evaluate(capsys, "squad-v2", "--predictions", str(shared_data / REFERENCE_V1),
                                   "--data-dir", str(shared_data))
    assert code == 0
    assert metrics["unknown_ids"] == 4642 and metrics["missing_predictions"] == 5945
    assert [line.split(" of ")[0] for line in err] == ["kdbench: warning: 4642", "kdbench: warning: 5945"]
    # HasAns is the official score of the answered questions (same answers as the complete v2.0 file);
    # every missing question is wrong, so the overall EM is HasAns EM x 5928 / 11873.
    official = OFFICIAL_V2[1.0]
    assert metrics["has_ans_em"] == pytest.approx(official["HasAns_exact"], abs=1e-9)
    assert metrics["no_ans_em"] == 0.0 and metrics["total"] == 11873
    assert metrics["em"] == pytest.approx(official["HasAns_exact"] * 5928 / 11873, abs=1e-9)


def test_missing_predictions_are_counted_and_score_zero(shared_data: Path, tmp_path: Path,
                                                        capsys: pytest.CaptureFixture) -> None:
    predictions = json.loads((shared_data / REFERENCE_V1).read_text())
    golds = M.squad_gold_answers(json.loads((shared_data / DEV_V1).read_text()), "1.1")
    right = [qid for qid, text in predictions.items() if M.max_over_golds(M.exact_match_score, text, golds[qid])]
    for qid in right[:25]:  # 25 questions the ensemble got exactly right
        del predictions[qid]
    path = _write_json(tmp_path / "partial.json", predictions)
    code, metrics, err = _evaluate(capsys, "squad", "--predictions", str(path), "--data-dir", str(shared_data))
    assert code == 0 and metrics["missing_predictions"] == 25 and metrics["unknown_ids"] == 0
    # v1.1 script: an unanswered question counts 0 over all 10,570
    assert metrics["em"] == pytest.approx((len(right) - 25) / 10570 * 100, abs=1e-9)
    assert err == [f"kdbench: warning: 25 of 10570 questions have no prediction (e.g. {right[0]!r}); scored as wrong"]


@pytest.mark.parametrize("task", ["squad", "squad-v2"])
def test_empty_or_foreign_prediction_file_is_an_error(task: str, shared_data: Path, tmp_path: Path,
                                                      capsys: pytest.CaptureFixture) -> None:
    code, metrics, err = _evaluate(capsys, task, "--predictions", str(_write_json(tmp_path / "e.json", {})),
                                   "--data-dir", str(shared_data))
    assert (code, metrics) == (2, None) and len(err) == 1 and "no predictions" in err[0]
    foreign = _write_json(tmp_path / "f.json", {"q-from-elsewhere": "x"})
    code, metrics, err = _evaluate(capsys, task, "--predictions", str(foreign), "--data-dir", str(shared_data))
    assert (code, metrics) == (2, None) and len(err) == 1 and "'q-from-elsewhere'" in err[0]


# -- SQuAD v2.0: no-answer scores and best thresholds ---------------------------------------------------
@pytest.mark.parametrize("threshold", [1.0, 0.5])
def test_v2_scores_equal_the_official_script(threshold: float, shared_data: Path, tmp_path: Path,
                                             capsys: pytest.CaptureFixture) -> None:
    predictions, na_probs = v2_leaderboard_style(shared_data)
    preds = _write_json(tmp_path / "p.json", predictions)
    probs = _write_json(tmp_path / "na.json", na_probs)
    code, metrics, err = _evaluate(capsys, "squad-v2", "--predictions", str(preds), "--na-probs", str(probs),
                                   "--na-prob-thresh", str(threshold), "--data-dir", str(shared_data))
    assert code == 0 and err == []
    official = OFFICIAL_V2[threshold]
    for ours, theirs in KDBENCH_V2_NAMES.items():
        assert metrics[ours] == pytest.approx(official[theirs], abs=1e-9), ours
    assert metrics["best_em_thresh"] == 0.798 and metrics["best_f1_thresh"] == 0.798
    assert metrics["missing_predictions"] == 0 and metrics["unknown_ids"] == 0


def _small_v2(tmp_path: Path) -> Path:
    """A data dir with a 3-question SQuAD v2.0 dev file (two answerable, one not)."""
    context = "Alice lives in Paris. Bob lives in Rome."
    qas = [{"id": "q1", "question": "Where does Alice live?", "answers": [{"text": "Paris", "answer_start": 15}]},
           {"id": "q2", "question": "Where does Bob live?", "answers": [{"text": "Rome", "answer_start": 35}]},
           {"id": "q3", "question": "Where does Eve live?", "answers": [], "is_impossible": True}]
    folder = tmp_path / "data" / "squad"
    folder.mkdir(parents=True)
    _write_json(folder / "dev-v2.0.json", {"version": "v2.0", "data": [{"title": "T", "paragraphs": [
        {"context": context, "qas": qas}]}]})
    return tmp_path / "data"


@pytest.mark.parametrize("bad, named", [({"q1": 0.1, "q2": None, "q3": 0.9}, "'q2'"),
                                        ({"q1": 0.1, "q2": "high", "q3": 0.9}, "'q2'"),
                                        ({"q1": 0.1, "q2": True, "q3": 0.9}, "'q2'"),
                                        ({"q1": 0.1, "q3": 0.9}, "'q2'")])
def test_bad_or_missing_no_answer_scores_are_one_line_errors(bad: dict, named: str, tmp_path: Path,
                                                             capsys: pytest.CaptureFixture) -> None:
    data = _small_v2(tmp_path)
    preds = _write_json(tmp_path / "p.json", {"q1": "Paris", "q2": "Rome", "q3": ""})
    probs = _write_json(tmp_path / "na.json", bad)
    code, metrics, err = _evaluate(capsys, "squad-v2", "--predictions", str(preds), "--na-probs", str(probs),
                                   "--data-dir", str(data))
    assert (code, metrics) == (2, None) and len(err) == 1
    assert err[0].startswith("kdbench: error: ") and named in err[0]


def test_no_answer_scores_of_other_ids_are_ignored_and_infinity_is_a_score(tmp_path: Path,
                                                                           capsys: pytest.CaptureFixture) -> None:
    data = _small_v2(tmp_path)
    preds = _write_json(tmp_path / "p.json", {"q1": "Paris", "q2": "Bob", "q3": "Rome"})
    # kdbench predict writes Infinity for a question with no span candidate
    (tmp_path / "na.json").write_text('{"q1": 0.2, "q2": 0.4, "q3": Infinity, "other": 0.0}')
    code, metrics, _ = _evaluate(capsys, "squad-v2", "--predictions", str(preds), "--na-probs",
                                 str(tmp_path / "na.json"), "--data-dir", str(data))
    assert code == 0
    # q1 right, q2 wrong, q3's answer is dropped (no-answer score inf > threshold 1) -> right: em 2/3.
    # Best: start from "answer nothing" (1 of 3: q3), q1 +1 -> 2 at 0.2, q2 +0, q3 -1: 2/3 at 0.2.
    assert metrics["em"] == pytest.approx(200 / 3) and metrics["no_ans_em"] == 100.0
    assert metrics["best_em"] == pytest.approx(200 / 3) and metrics["best_em_thresh"] == 0.2


def test_v2_missing_question_is_wrong_at_every_threshold() -> None:
    """Deviation from the v2.0 script (which drops it from the total): a missing question scores 0,
    and the best-threshold walk does not count a missing unanswerable question as right."""
    golds = {"a": ["Paris"], "b": [""], "c": [""]}
    has = {"a": True, "b": False, "c": False}
    result = M.squad_v2(golds, {"a": "Paris", "b": ""}, {"a": 0.3, "b": 0.6}, 0.0, has_answer=has)
    # threshold 0: a and b predicted "no answer" -> a wrong, b right, c missing
    assert result["exact"] == pytest.approx(100 / 3)
    # walk: start 1 (b), a +1 -> 2 at 0.3, b +0: best 2/3 at 0.3 (c never counts)
    assert result["best_exact"] == pytest.approx(200 / 3) and result["best_exact_thresh"] == 0.3


# -- STS-B: non-finite predictions, clipped submissions ---------------------------------------------------
@pytest.mark.parametrize("value", ["nan", "inf", "-Infinity"])
def test_stsb_prediction_file_with_non_finite_values_is_rejected(value: str, shared_data: Path, tmp_path: Path,
                                                                 capsys: pytest.CaptureFixture) -> None:
    gold = STSB.load_rows("dev", _glue_run(shared_data))
    rows = [f"{i}\t{value if k == 7 else score}" for k, (i, score) in enumerate(zip(gold.indices, gold.labels))]
    path = tmp_path / "stsb.tsv"
    path.write_text("index\tprediction\n" + "\n".join(rows) + "\n")
    code, metrics, err = _evaluate(capsys, "stsb", "--predictions", str(path), "--data-dir", str(shared_data))
    assert (code, metrics) == (2, None) and len(err) == 1
    assert f"line 9: prediction '{value}' for index {gold.indices[7]} is not a finite number" in err[0]


def test_stsb_metrics_reject_nan_naming_the_position() -> None:
    with pytest.raises(ValueError, match=r"predictions: value nan at index 2 is not a finite number"):
        M.pearson([1.0, 2.0, float("nan"), 4.0], [1.0, 2.0, 3.0, 4.0])
    with pytest.raises(ValueError, match=r"references: value inf at index 0"):
        M.glue_metrics("stsb", [1.0, 2.0], [float("inf"), 2.0])


def test_stsb_submission_is_clipped_to_the_label_range_and_nan_is_refused(tmp_path: Path) -> None:
    (path,) = write_glue_predictions(STSB, np.array([[-0.7], [5.9], [2.5], [4.9996]]), tmp_path, indices=[3, 4, 5, 6])
    assert path.read_text().splitlines() == ["index\tprediction", "3\t0.000", "4\t5.000", "5\t2.500", "6\t5.000"]
    with pytest.raises(DataError, match=r"STS-B.tsv, index 11: the prediction is nan"):
        write_glue_predictions(STSB, np.array([1.0, np.nan]), tmp_path / "nan", indices=[10, 11])
    assert not (tmp_path / "nan" / "STS-B.tsv").exists()


def test_predict_refuses_a_model_that_outputs_nan(tmp_path: Path, tiny_stsb_model: Path, shared_data: Path,
                                                  capsys: pytest.CaptureFixture) -> None:
    code = main(["predict", "stsb", "--model", str(tiny_stsb_model), "--out", str(tmp_path / "out"), "--split",
                 "dev", "--data-dir", str(shared_data), "--max-eval-samples", "8", "--max-seq-length", "32"])
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2 and "the model predicted nan for index 0" in err[-1]
    assert not list((tmp_path / "out").glob("*.tsv"))


@pytest.fixture
def tiny_stsb_model(tmp_path: Path, minilm_path: Path) -> Path:
    """A tiny regression BERT whose head outputs NaN (a diverged model)."""
    import torch
    from tiny_models import make_tiny_bert
    from transformers import AutoModelForSequenceClassification

    folder = make_tiny_bert(tmp_path / "stsb", minilm_path, task="stsb")
    model = AutoModelForSequenceClassification.from_pretrained(folder)
    with torch.no_grad():
        model.classifier.bias.fill_(float("nan"))
    model.save_pretrained(folder)
    return folder


# -- MNLI: label names, and ids only with a stated order ---------------------------------------------------
HUB_ORDER = ("entailment", "neutral", "contradiction")  # datasets glue/mnli ClassLabel
BERT_ORDER = ("contradiction", "entailment", "neutral")  # BERT run_classifier.py MnliProcessor.get_labels


def _mnli_dev(root: Path, n: int = 50) -> tuple[Path, list[str]]:
    """root/glue_data/MNLI/dev_matched.tsv and dev_mismatched.tsv (GLUE layout); the gold labels."""
    header = ["index", "promptID", "pairID", "genre", "sentence1_binary_parse", "sentence2_binary_parse", "sentence1_parse", "sentence2_parse", "sentence1", "sentence2", "label1", "label2", "label3", "label4", "label5", "gold_label"]
    gold = [HUB_ORDER[(k * 7) % 3] for k in range(n)]
    lines = ["\t".join(header)] + ["\t".join([str(k), str(k), f"{k}e", "fiction", "(x)", "(y)", "(ROOT x)", "(ROOT y)",
                                              f"premise {k}", f"hypothesis {k}", *[g] * 5, g])
                                   for k, g in enumerate(gold)]
    folder = root / "glue_data" / "MNLI"
    folder.mkdir(parents=True)
    for name in ("dev_matched.tsv", "dev_mismatched.tsv"):
        (folder / name).write_text("\n".join(lines) + "\n")
    return root, gold


def _mnli_predictions(gold: list[str]) -> list[str]:
    """41 of 50 right (82%): every sixth is wrong, the next label in the Hub order."""
    return [HUB_ORDER[(HUB_ORDER.index(g) + 1) % 3] if k % 6 == 0 else g for k, g in enumerate(gold)]


def test_mnli_label_names_and_ordered_ids(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    root, gold = _mnli_dev(tmp_path / "data")
    predicted = _mnli_predictions(gold)
    expected = 100 * np.mean([p == g for p, g in zip(predicted, gold)])
    assert expected == 82.0

    def write(name: str, values: list[str]) -> str:
        path = tmp_path / name
        path.write_text("index\tprediction\n" + "".join(f"{k}\t{v}\n" for k, v in enumerate(values)))
        return str(path)

    names = write("names.tsv", predicted)
    bert_ids = write("bert_ids.tsv", [str(BERT_ORDER.index(p)) for p in predicted])
    code, metrics, _ = _evaluate(capsys, "mnli", "--predictions", names, "--data-dir", str(root))
    assert code == 0 and metrics == {"acc": pytest.approx(expected)}
    # bare ids: refused without an order, one line naming the value and both orders
    code, metrics, err = _evaluate(capsys, "mnli", "--predictions", bert_ids, "--data-dir", str(root))
    assert (code, metrics) == (2, None) and len(err) == 1
    assert f"line 2: bare label id '{BERT_ORDER.index(predicted[0])}' is ambiguous for mnli" in err[0]
    assert "entailment, neutral, contradiction" in err[0] and "contradiction, entailment, neutral" in err[0]
    code, metrics, _ = _evaluate(capsys, "mnli", "--predictions", bert_ids, "--label-order", "glue",
                                 "--data-dir", str(root))
    assert code == 0 and metrics == {"acc": pytest.approx(expected)}
    # the same ids read in the Hub's order: the silent collapse the refusal prevents
    misread = [HUB_ORDER[BERT_ORDER.index(p)] for p in predicted]
    code, metrics, _ = _evaluate(capsys, "mnli", "--predictions", bert_ids, "--label-order", "hub",
                                 "--data-dir", str(root))
    assert code == 0 and metrics["acc"] == pytest.approx(100 * np.mean([m == g for m, g in zip(misread, gold)]))
    assert metrics["acc"] < 20.0
    hub_ids = write("hub_ids.tsv", [str(HUB_ORDER.index(p)) for p in predicted])
    code, metrics, _ = _evaluate(capsys, "mnli", "--predictions", hub_ids, "--label-order", "hub", "--split",
                                 "dev_mm", "--data-dir", str(root))
    assert code == 0 and metrics == {"acc_mm": pytest.approx(expected)}
    assert MNLI.read_prediction_file(Path(hub_ids), "hub")[0] == predicted[0]


def test_tasks_whose_conventions_agree_take_bare_ids(shared_data: Path, tmp_path: Path,
                                                     capsys: pytest.CaptureFixture) -> None:
    """RTE: the Hub and BERT's processor both order entailment, not_entailment; ids need no order."""
    gold = RTE.load_rows("dev", _glue_run(shared_data))
    ids = [("entailment", "not_entailment").index(label) for label in gold.labels]
    ids = [1 - v if k % 5 == 0 else v for k, v in enumerate(ids)]
    path = tmp_path / "rte.tsv"
    path.write_text("index\tprediction\n" + "".join(f"{i}\t{v}\n" for i, v in zip(gold.indices, ids)))
    code, metrics, _ = _evaluate(capsys, "rte", "--predictions", str(path), "--data-dir", str(shared_data))
    expected = 100 * np.mean([k % 5 != 0 for k in range(len(ids))])
    assert code == 0 and metrics == {"acc": pytest.approx(expected)}


def test_options_for_another_kind_of_task_are_refused(shared_data: Path, capsys: pytest.CaptureFixture) -> None:
    code, _, err = _evaluate(capsys, "squad", "--predictions", str(shared_data / REFERENCE_V1), "--label-order",
                             "glue", "--data-dir", str(shared_data))
    assert code == 2 and "--label-order" in err[0]
    code, _, err = _evaluate(capsys, "rte", "--predictions", str(shared_data / DEV_V2), "--na-probs",
                             str(shared_data / DEV_V2), "--data-dir", str(shared_data))
    assert code == 2 and "--na-probs" in err[0]


def _glue_run(data_dir: Path):
    from kdbench.config import DataConfig, RunConfig

    return RunConfig(method="finetune", task="rte", student="x", data=DataConfig(data_dir=str(data_dir)))
