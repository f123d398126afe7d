"""Classification tasks declared as data (kdbench.tasks.classification): spec validation, the local
folder layout, the Hub path with labels mapped by name, and the shipped IMDb spec.

The Hub is unreachable here: the Hub-path test replaces ``datasets.load_dataset`` with a function
that returns a real ``datasets.Dataset`` (ClassLabel feature included) built from real SST-2 rows.
"""

from __future__ import annotations

import json

import datasets
import pytest

from kdbench.config import ConfigError, DataConfig, RunConfig, TrainConfig
from kdbench.errors import DataError
from kdbench.plugins import TASKS
from kdbench.task import HeadType
from kdbench.tasks.classification import ClassificationTask, ClassificationTaskSpec

SPEC = {"name": "reviews", "hub_path": "someone/reviews", "text_columns": ["review"], "label_column": "stars",
        "labels": ["bad", "good"], "metrics": ["acc", "f1"], "dev_split": "test"}


def sst2_rows(shared_data, split: str, n: int) -> list[tuple[str, int]]:
    lines = (shared_data / "glue_data" / "SST-2" / f"{split}.tsv").read_text().splitlines()[1:n + 1]
    return [(line.split("\t")[0], int(line.split("\t")[1])) for line in lines]


def run_config(data_dir=None, **data) -> RunConfig:
    return RunConfig(method="finetune", task="reviews", student="x", train=TrainConfig(max_seq_length=32),
                     data=DataConfig(data_dir=str(data_dir) if data_dir else None, **data))


@pytest.mark.parametrize(("change", "message"), [
    ({"metrics": ["accuracy"]}, "metrics: must be one of acc, f1, mcc, pearson, spearman, got 'accuracy' in"),
    ({"text_columns": ["a", "b", "c"]}, "text_columns: one text column or two"),
    ({"labels": None}, "metrics: ['acc', 'f1'] need classes, but labels is null"),
    ({"labels": ["good", "good"]}, "labels: at least two distinct names"),
    ({"hub_pth": "x"}, "unknown key hub_pth='x'; did you mean 'hub_path'?"),
])
def test_bad_specs_are_one_line_errors_naming_the_value(change, message):
    with pytest.raises(ConfigError) as error:
        ClassificationTaskSpec.from_mapping({**SPEC, **change})
    assert message in str(error.value) and "\n" not in str(error.value)


def test_a_yaml_spec_becomes_a_task(tmp_path):
    path = tmp_path / "reviews.yaml"
    path.write_text(json.dumps(SPEC))  # JSON is YAML
    task = ClassificationTask.from_yaml(path)
    assert (task.spec.name, task.spec.head, task.spec.main_metric, task.spec.label_names) == \
        ("reviews", HeadType.CLASSIFICATION, "acc", ("bad", "good"))
    path.write_text(json.dumps({**SPEC, "metrics": ["acc", "bleu"]}))
    with pytest.raises(ConfigError, match=rf"task spec '{path}': metrics: .*'bleu'"):
        ClassificationTask.from_yaml(path)


def test_local_folder_files_with_named_columns(shared_data, tmp_path, tokenizer):
    folder = tmp_path / "data" / "reviews"
    folder.mkdir(parents=True)
    names = ("bad", "good")
    train, dev = sst2_rows(shared_data, "train", 12), sst2_rows(shared_data, "dev", 5)
    (folder / "train.jsonl").write_text("".join(json.dumps({"review": t, "stars": names[y]}) + "\n" for t, y in train))
    (folder / "dev.csv").write_text("review,stars\n" + "".join(f"\"{t}\",{y}\n" for t, y in dev))  # ids index labels
    task = ClassificationTask(ClassificationTaskSpec.from_mapping(SPEC))
    run = run_config(tmp_path / "data")
    assert task.data_sources(run) == [folder / "train.jsonl", folder / "dev.csv"]
    encoded = task.encode_train(tokenizer, run)
    assert encoded.features["labels"] == [y for _, y in train]
    (dev_split,) = task.encode_eval(tokenizer, run)
    assert dev_split.features["labels"] == [y for _, y in dev]
    perfect = task.score(dev_split, {"logits": [[1.0 - y, float(y)] for _, y in dev]})
    assert perfect == {"acc": 100.0, "f1": 100.0}


def test_hub_labels_are_mapped_by_name(shared_data, tokenizer, monkeypatch):
    rows = sst2_rows(shared_data, "dev", 8)
    hub_names = ["good", "bad"]  # the Hub's ClassLabel order differs from the head order
    features = datasets.Features({"review": datasets.Value("string"), "stars": datasets.ClassLabel(names=hub_names)})
    table = datasets.Dataset.from_dict({"review": [t for t, _ in rows], "stars": [1 - y for _, y in rows]},
                                       features=features)  # SST-2 1 (positive) -> hub id 0 ("good")
    calls = []

    def load_dataset(path, name=None, split=None):
        calls.append((path, name, split))
        return table

    monkeypatch.setattr(datasets, "load_dataset", load_dataset)
    task = ClassificationTask(ClassificationTaskSpec.from_mapping({**SPEC, "hub_config": "plain"}))
    run = run_config()
    assert task.data_sources(run) == ["hub:someone/reviews/plain/train", "hub:someone/reviews/plain/test"]
    encoded = task.encode_train(tokenizer, run)
    task.encode_eval(tokenizer, run)
    assert calls == [("someone/reviews", "plain", "train"), ("someone/reviews", "plain", "test")]
    assert encoded.features["labels"] == [y for _, y in rows]  # head order: bad = 0, good = 1


def test_imdb_is_shipped_as_a_spec_and_offline_says_what_to_do(tokenizer, monkeypatch):
    imdb = TASKS.get("imdb")
    assert isinstance(imdb, ClassificationTask)
    assert (imdb.task_spec.hub_path, imdb.task_spec.dev_split, imdb.spec.label_names) == \
        ("stanfordnlp/imdb", "test", ("neg", "pos"))
    monkeypatch.delenv("KDBENCH_DATA_DIR", raising=False)
    with pytest.raises(DataError, match=r"could not load the Hub dataset 'stanfordnlp/imdb'.*give train_file="):
        imdb.encode_train(tokenizer, run_config())
