"""GLUE adapters: real row counts, MNLI/QQP layouts, named-column files, Hub path, labels by name,
bad-data validation, submission files and the GLUE metrics."""

from __future__ import annotations

import argparse
import json
import random
import shutil
from pathlib import Path

import datasets
import numpy as np
import pytest

from kdbench import metrics as M
from kdbench.config import DataConfig, RunConfig, TrainConfig
from kdbench.errors import DataError
from kdbench.tasks.glue import AX, COLA, MNLI, MNLI_MM, MRPC, QNLI, QQP, RTE, SST2, STSB, WNLI, write_glue_predictions

MNLI_TRAIN_HEADER = ["index", "promptID", "pairID", "genre", "sentence1_binary_parse", "sentence2_binary_parse", "sentence1_parse", "sentence2_parse", "sentence1", "sentence2", "label1", "gold_label"]
MNLI_DEV_HEADER = MNLI_TRAIN_HEADER[:-1] + ["label2", "label3", "label4", "label5", "gold_label"]
MNLI_TEST_HEADER = MNLI_TRAIN_HEADER[:10]
KEYWORD = {"entailment": "yes", "neutral": "maybe", "contradiction": "no"}


def _run(data_dir: Path | None = None, **data) -> argparse.Namespace:
    return RunConfig(method="finetune", task="rte", student="x", train=TrainConfig(max_seq_length=32),
                     data=DataConfig(data_dir=str(data_dir) if data_dir else None, **data))


def _tsv(path: Path, header: list[str] | None, rows: list[list[str]]) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    lines = (["\t".join(header)] if header else []) + ["\t".join(r) for r in rows]
    path.write_text("\n".join(lines) + "\n")
    return path


def _nli_pair(rng: random.Random, label: str) -> tuple[str, str]:
    words = ["cats", "dogs", "birds", "trees", "cars", "boats", "rain", "snow"]
    premise = " ".join(rng.choice(words) for _ in range(5))
    return premise, f"{rng.choice(words)} {KEYWORD[label]} {rng.choice(words)}"


def write_mnli(root: Path, n_train: int = 96, n_dev: int = 30, seed: int = 0) -> Path:
    """MNLI in the GLUE layout (root/glue_data/MNLI): train, dev matched/mismatched, test m/mm."""
    rng = random.Random(seed)
    folder = root / "glue_data" / "MNLI"
    labels = list(KEYWORD)

    def rows(n: int, with_dev_labels: bool | None) -> list[list[str]]:
        out = []
        for i in range(n):
            label = labels[i % 3]
            p, h = _nli_pair(rng, label)
            base = [str(i), str(1000 + i), f"{i}e", "fiction", "(x)", "(y)", "(ROOT x)", "(ROOT y)", p, h]
            if with_dev_labels is None:
                out.append(base)
            else:
                out.append(base + ([label] * 5 if with_dev_labels else [label]) + [label])
        return out

    _tsv(folder / "train.tsv", MNLI_TRAIN_HEADER, rows(n_train, False))
    _tsv(folder / "dev_matched.tsv", MNLI_DEV_HEADER, rows(n_dev, True))
    _tsv(folder / "dev_mismatched.tsv", MNLI_DEV_HEADER, rows(n_dev + 3, True))
    _tsv(folder / "test_matched.tsv", MNLI_TEST_HEADER, rows(7, None))
    _tsv(folder / "test_mismatched.tsv", MNLI_TEST_HEADER, rows(8, None))
    _tsv(root / "glue_data" / "diagnostic" / "diagnostic.tsv", ["index", "sentence1", "sentence2"],
         [[str(i), *_nli_pair(rng, labels[i % 3])] for i in range(5)])
    return root


# -- real data --------------------------------------------------------------------------------------
README_COUNTS = {  # /work/shared/data/README.md: (train, dev, test)
    COLA: (8551, 1043, 1063), SST2: (67349, 872, 1821), MRPC: (3668, 408, 1725), STSB: (5749, 1500, 1379),
    RTE: (2490, 277, 3000), WNLI: (635, 71, 146), QNLI: (None, 5463, 5463), AX: (None, None, 1104),
}


@pytest.mark.parametrize("task", list(README_COUNTS), ids=lambda t: t.glue.name)
def test_every_present_glue_task_loads_with_the_readme_row_counts(task, shared_data: Path) -> None:
    train, dev, test = README_COUNTS[task]
    run = _run(shared_data)
    if train is not None:
        assert len(task.load_rows("train", run).texts) == train
    if dev is not None:
        rows = task.load_rows("dev", run)
        assert len(rows.texts) == dev and rows.skipped == 0
        assert all(label is not None for label in rows.labels)
    (test_split,) = [name for name, _, _ in task.glue.test]
    assert len(task.load_rows(test_split, run).texts) == test


def test_real_labels_are_names_in_head_order(shared_data: Path) -> None:
    rows = MRPC.load_rows("dev", _run(shared_data))
    assert set(rows.labels) == {"equivalent", "not_equivalent"} and rows.labels.count("equivalent") == 279
    stsb = STSB.load_rows("dev", _run(shared_data))
    assert min(stsb.labels) == 0.0 and max(stsb.labels) == 5.0


# -- MNLI / QQP on small files in the GLUE layout -----------------------------------------------------
def test_mnli_matched_and_mismatched(tmp_path: Path, tokenizer) -> None:
    root = write_mnli(tmp_path)
    splits = MNLI.encode_eval(tokenizer, _run(root))
    assert [(s.name, len(s), s.metadata["metric_suffix"]) for s in splits] == [
        ("dev_matched", 30, ""), ("dev_mismatched", 33, "_mm")]
    gold = np.asarray(splits[1].features["labels"])
    logits = np.eye(3)[gold]
    logits[0] = np.roll(logits[0], 1)  # one mistake
    assert MNLI.score(splits[0], {"logits": np.eye(3)[np.asarray(splits[0].features["labels"])]}) == {"acc": 100.0}
    assert MNLI.score(splits[1], {"logits": logits}) == {"acc_mm": pytest.approx(100 * 32 / 33)}
    assert MNLI_MM.spec.main_metric == "acc_mm"
    # every metric the two splits report can pick the best checkpoint (train.select_metric), main one first
    assert MNLI.spec.selectable_metrics == ("acc", "acc_mm") and MNLI_MM.spec.selectable_metrics == ("acc_mm", "acc")
    assert (MRPC.spec.selectable_metrics, QQP.spec.selectable_metrics) == (("f1", "acc"), ("f1", "acc"))
    assert STSB.spec.selectable_metrics == ("spearman", "pearson")
    assert MNLI.load_rows("train", _run(root)).labels[:3] == ["entailment", "neutral", "contradiction"]
    assert len(MNLI.encode_train(tokenizer, _run(root))) == 96


def test_qqp_layout(tmp_path: Path) -> None:
    header = ["id", "qid1", "qid2", "question1", "question2", "is_duplicate"]
    folder = tmp_path / "glue_data" / "QQP"
    _tsv(folder / "train.tsv", header, [["7", "1", "2", "How old?", "What age?", "1"], ["8", "3", "4", "Why?", "How?", "0"]])
    _tsv(folder / "dev.tsv", header, [["3", "1", "2", "How old?", "What age?", "1"]])
    _tsv(folder / "test.tsv", ["id", "question1", "question2"], [["0", "a?", "b?"], ["1", "c?", "d?"]])
    run = _run(tmp_path)
    train = QQP.load_rows("train", run)
    assert train.labels == ["duplicate", "not_duplicate"] and train.indices == [7, 8]
    assert QQP.load_rows("dev", run).texts == [("How old?", "What age?")]
    assert QQP.load_rows("test", run).labels == [None, None]
    assert QQP.spec.main_metric == "f1"


def test_named_column_files_csv_and_jsonl(tmp_path: Path) -> None:
    csv_path = tmp_path / "rte.csv"
    csv_path.write_text('sentence1,sentence2,label\n"A man, tall.",A man.,entailment\nX,Y,not_entailment\n')
    rows = RTE.read_file(csv_path, RTE.glue.train, with_labels=True)
    assert rows.texts[0] == ("A man, tall.", "A man.") and rows.labels == ["entailment", "not_entailment"]
    jsonl = tmp_path / "mnli.jsonl"
    jsonl.write_text("\n".join(json.dumps(r) for r in [
        {"premise": "p1", "hypothesis": "h1", "label": "neutral"},
        {"premise": "p2", "hypothesis": "h2", "label": 2}]))  # integers in named files are Hub ids
    rows = MNLI.read_file(jsonl, MNLI.glue.train, with_labels=True)
    assert rows.labels == ["neutral", "contradiction"]


# -- the Hub path, loader patched ---------------------------------------------------------------------
def _hub_mnli(names: list[str], rows: list[tuple[str, str, str]]) -> datasets.Dataset:
    features = datasets.Features({"premise": datasets.Value("string"), "hypothesis": datasets.Value("string"),
                                  "label": datasets.ClassLabel(names=names), "idx": datasets.Value("int32")})
    return datasets.Dataset.from_dict({"premise": [r[0] for r in rows], "hypothesis": [r[1] for r in rows],
                                       "label": [names.index(r[2]) for r in rows], "idx": list(range(len(rows)))},
                                      features=features)


def test_hub_path_maps_labels_through_classlabel_names(monkeypatch: pytest.MonkeyPatch) -> None:
    rows = [("p", "h", "contradiction"), ("q", "i", "entailment")]
    calls = []

    def fake_load(path, name=None, split=None):
        calls.append((path, name, split))
        return _hub_mnli(["contradiction", "entailment", "neutral"], rows)  # a different order on purpose

    monkeypatch.setattr(datasets, "load_dataset", fake_load)
    monkeypatch.delenv("KDBENCH_DATA_DIR", raising=False)
    got = MNLI.load_rows("dev_mismatched", _run(None))
    assert calls == [("glue", "mnli", "validation_mismatched")]
    assert got.labels == ["contradiction", "entailment"] and got.source.startswith("hub:glue/mnli")


# -- bad data: one test per case ----------------------------------------------------------------------
def _rte_dir(tmp_path: Path, rows: list[list[str]]) -> Path:
    _tsv(tmp_path / "glue_data" / "RTE" / "train.tsv", ["index", "sentence1", "sentence2", "label"], rows)
    return tmp_path


def test_wrong_column_count(tmp_path: Path) -> None:
    root = _rte_dir(tmp_path, [["0", "a", "b", "entailment"], ["1", "a", "entailment"]])
    with pytest.raises(DataError, match=r"RTE/train\.tsv, line 3: expected 4 tab-separated columns, found 3"):
        RTE.load_rows("train", _run(root))
    rows = RTE.load_rows("train", _run(root, on_bad_row="skip"))
    assert len(rows.texts) == 1 and rows.skipped == 1


def test_unknown_label(tmp_path: Path) -> None:
    root = _rte_dir(tmp_path, [["0", "a", "b", "entailment"], ["1", "a", "b", "contradiction"]])
    with pytest.raises(DataError, match=r"train\.tsv, line 3: unknown label 'contradiction'"):
        RTE.load_rows("train", _run(root))


def test_empty_text(tmp_path: Path) -> None:
    root = _rte_dir(tmp_path, [["0", "a", " ", "entailment"], ["1", "a", "b", "entailment"]])
    with pytest.raises(DataError, match=r"line 2: empty text in column 'sentence2'"):
        RTE.load_rows("train", _run(root))


def test_non_numeric_stsb_score(tmp_path: Path) -> None:
    header = ["index", "genre", "filename", "year", "old_index", "source1", "source2", "sentence1", "sentence2", "score"]
    _tsv(tmp_path / "glue_data" / "STS-B" / "train.tsv", header,
         [["0", "g", "f", "y", "0", "s", "s", "A dog.", "A cat.", "2.5"],
          ["1", "g", "f", "y", "1", "s", "s", "A dog.", "A cat.", "high"]])
    with pytest.raises(DataError, match=r"STS-B/train\.tsv, line 3: score 'high' is not a number"):
        STSB.load_rows("train", _run(tmp_path))


def test_empty_dataset_is_an_error(tmp_path: Path) -> None:
    root = _rte_dir(tmp_path, [["0", "a", "b", "maybe"]])
    with pytest.raises(DataError, match="no usable rows"):
        RTE.load_rows("train", _run(root, on_bad_row="skip"))
    with pytest.raises(DataError, match="does not exist"):
        RTE.load_rows("dev", _run(root))


# -- metrics ------------------------------------------------------------------------------------------
def test_glue_metrics_on_hand_computed_values() -> None:
    # preds 1 1 0 0 1, refs 1 0 0 1 1: tp 2 fp 1 fn 1 tn 1
    preds, refs = np.array([1, 1, 0, 0, 1]), np.array([1, 0, 0, 1, 1])
    assert M.accuracy(preds, refs) == 60.0
    assert M.f1_binary(preds, refs) == pytest.approx(100 * 2 / 3)
    assert M.matthews_corrcoef(preds, refs) == pytest.approx(100 * (2 * 1 - 1 * 1) / np.sqrt(3 * 2 * 3 * 2))
    assert M.spearman([1, 2, 3, 4], [10, 20, 30, 25]) == pytest.approx(80.0)
    assert M.pearson([1, 2, 3], [2, 4, 6]) == pytest.approx(100.0)
    results = {"cola": {"mcc": 50}, "sst2": {"acc": 90}, "mrpc": {"acc": 80, "f1": 86}, "stsb": {"pearson": 85, "spearman": 84},
               "qqp": {"acc": 88, "f1": 70}, "mnli": {"acc": 82, "acc_mm": 81}, "qnli": {"acc": 89}, "rte": {"acc": 66},
               "wnli": {"acc": 56}}
    assert M.glue_average(results) == pytest.approx((50 + 90 + 86 + 84 + 70 + 82 + 81 + 89 + 66) / 9)


# -- submissions and the prediction-file evaluator -------------------------------------------------------
def test_submission_files_have_leaderboard_names_and_values(tmp_path: Path) -> None:
    (mnli_m, mnli_mm) = write_glue_predictions(MNLI, {"test_matched": ([0, 1], np.array([[0, 0, 1.0], [1.0, 0, 0]])),
                                                      "test_mismatched": ([5], np.array([1]))}, tmp_path)
    assert (mnli_m.name, mnli_mm.name) == ("MNLI-m.tsv", "MNLI-mm.tsv")
    assert mnli_m.read_text() == "index\tprediction\n0\tcontradiction\n1\tentailment\n"
    assert mnli_mm.read_text() == "index\tprediction\n5\tneutral\n"
    (sst,) = write_glue_predictions(SST2, np.array([[0.1, 0.9], [2.0, 1.0]]), tmp_path)
    assert sst.name == "SST-2.tsv" and sst.read_text() == "index\tprediction\n0\t1\n1\t0\n"
    (sts,) = write_glue_predictions(STSB, np.array([[3.14159]]), tmp_path)
    assert sts.name == "STS-B.tsv" and sts.read_text().splitlines()[1] == "0\t3.142"
    (ax,) = write_glue_predictions(AX, np.array([2, 0]), tmp_path)
    assert ax.name == "AX.tsv" and ax.read_text().splitlines()[1:] == ["0\tcontradiction", "1\tentailment"]


def test_evaluate_glue_prediction_file(shared_data: Path, tmp_path: Path) -> None:
    gold = RTE.load_rows("dev", _run(shared_data))
    lines = ["index\tprediction"] + [f"{i}\t{'entailment' if k % 4 else label}" for k, (i, label)
                                     in enumerate(zip(gold.indices, gold.labels))]
    path = tmp_path / "rte.tsv"
    path.write_text("\n".join(lines) + "\n")
    expected = 100 * np.mean([(("entailment" if k % 4 else g) == g) for k, g in enumerate(gold.labels)])
    assert RTE.score_prediction_file(path, shared_data) == {"acc": pytest.approx(expected)}
    path.write_text("index\tprediction\n0\tentailment\n")
    with pytest.raises(DataError, match="indices missing"):
        RTE.score_prediction_file(path, shared_data)


# -- labels by name end to end: train on TSVs, evaluate on Hub-order data --------------------------------
def test_label_order_tsv_teacher_keeps_accuracy_on_hub_order_data(tmp_path: Path, tiny_bert_dir: Path,
                                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    import torch
    from transformers import AutoModelForSequenceClassification

    from kdbench.engine import run_experiment
    from kdbench.predict import predict_task

    root = write_mnli(tmp_path / "data")
    # one malformed training row, skipped and counted in the record
    with open(root / "glue_data" / "MNLI" / "train.tsv", "a") as handle:
        handle.write("999\tonly\tthree\n")
    config = RunConfig(method="finetune", task="mnli", student=str(tiny_bert_dir), output=str(tmp_path / "runs"),
                       train=TrainConfig(max_seq_length=24, batch_size=8, epochs=3, lr=3e-3, precision="fp32",
                                         warmup_ratio=0.0),
                       data=DataConfig(data_dir=str(root), on_bad_row="skip"))
    run_dir = run_experiment(config)
    record = json.loads((run_dir / "result.json").read_text())
    assert record["data"]["train_skipped_rows"] == 1 and record["data"]["train_rows"] == 96
    tsv_acc = record["metrics"]["acc"]
    assert tsv_acc > 60.0  # learnt the keyword (chance is 33)

    # The same dev rows from the "Hub": integer labels in the Hub's order.
    dev = MNLI.load_rows("dev_matched", _run(root))
    hub_rows = [(p, h, label) for (p, h), label in zip(dev.texts, dev.labels)]
    monkeypatch.setattr(datasets, "load_dataset",
                        lambda path, name=None, split=None: _hub_mnli(["entailment", "neutral", "contradiction"], hub_rows))
    monkeypatch.delenv("KDBENCH_DATA_DIR", raising=False)
    hub_run = RunConfig(method="finetune", task="mnli", student="x", train=TrainConfig(max_seq_length=24))
    hub = predict_task(MNLI, run_dir / "model", hub_run, tmp_path / "pred", "dev")
    assert hub["metrics"]["acc"] == pytest.approx(tsv_acc)

    # A teacher whose head is in the original TSV code's order (contradiction, entailment, neutral).
    model = AutoModelForSequenceClassification.from_pretrained(run_dir / "model")
    order = [2, 0, 1]  # TSV id -> Hub id
    with torch.no_grad():
        model.classifier.weight.copy_(model.classifier.weight[order])
        model.classifier.bias.copy_(model.classifier.bias[order])
    model.config.id2label = {0: "contradiction", 1: "entailment", 2: "neutral"}
    model.config.label2id = {v: k for k, v in model.config.id2label.items()}
    permuted = tmp_path / "tsv-order"
    model.save_pretrained(permuted)
    for item in (run_dir / "model").iterdir():  # the tokenizer files
        if item.name.startswith(("tokenizer", "special_tokens", "vocab")):
            shutil.copy(item, permuted / item.name)
    again = predict_task(MNLI, permuted, hub_run, tmp_path / "pred2", "dev")
    assert again["metrics"]["acc"] == pytest.approx(tsv_acc)
    assert (tmp_path / "pred2" / "mnli-dev_matched.tsv").read_text() == (tmp_path / "pred" / "mnli-dev_matched.tsv").read_text()

    # Test-set submissions (MNLI-m/-mm) and AX with the MNLI model, from the GLUE layout.
    test_run = RunConfig(method="finetune", task="mnli", student="x", train=TrainConfig(max_seq_length=24),
                         data=DataConfig(data_dir=str(root)))
    files = predict_task(MNLI, permuted, test_run, tmp_path / "sub")["files"]
    files += predict_task(AX, permuted, test_run, tmp_path / "sub")["files"]
    assert sorted(p.name for p in files) == ["AX.tsv", "MNLI-m.tsv", "MNLI-mm.tsv"]
    lines = (tmp_path / "sub" / "MNLI-mm.tsv").read_text().splitlines()
    assert lines[0] == "index\tprediction" and len(lines) == 9
    assert {line.split("\t")[1] for line in lines[1:]} <= set(KEYWORD)


def test_a_wrong_teacher_for_ax_is_told_to_fine_tune_on_mnli_which_ax_is_predicted_with():
    """AX has no training set: 'fine-tune the teacher on ax' was advice that cannot be followed."""
    from transformers import BertConfig

    from kdbench.config import ConfigError
    from kdbench.engine.preflight import check_teacher_head

    sst2_teacher = BertConfig(architectures=["BertForSequenceClassification"], num_labels=2)
    with pytest.raises(ConfigError, match=r"fine-tune a teacher on mnli first \(kdbench run finetune --task mnli "):
        check_teacher_head("sst2-teacher", sst2_teacher, AX.spec)
    with pytest.raises(ConfigError, match=r"fine-tune a teacher on rte first"):
        check_teacher_head("sst2-teacher", BertConfig(architectures=["BertForSequenceClassification"], num_labels=3),
                           RTE.spec)
