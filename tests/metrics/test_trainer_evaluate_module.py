"""A plain `transformers.Trainer`, outside kdbench's engine, whose `compute_metrics` is kdbench's
evaluate module: a tiny BERT (from a config) trained a few steps on real MRPC rows; the metrics the
Trainer logs equal a direct computation on the same predictions."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

evaluate = pytest.importorskip("evaluate")


def _mrpc_rows(path: Path, limit: int) -> dict[str, list]:
    """The classic MRPC TSV (Quality, #1 ID, #2 ID, #1 String, #2 String), read without kdbench."""
    lines = path.read_text(encoding="utf-8").splitlines()[1:limit + 1]
    fields = [line.split("\t") for line in lines]
    return {"sentence1": [f[3] for f in fields], "sentence2": [f[4] for f in fields],
            "label": [int(f[0]) for f in fields]}


def test_trainer_compute_metrics_with_kdbench_glue_module(shared_data: Path, minilm_path: Path,
                                                          tmp_path: Path) -> None:
    import datasets
    import torch
    from sklearn.metrics import accuracy_score, f1_score
    from transformers import (AutoTokenizer, BertConfig, BertForSequenceClassification, DataCollatorWithPadding,
                              Trainer, TrainingArguments)

    from kdbench.metrics import module_path

    tokenizer = AutoTokenizer.from_pretrained(str(minilm_path))
    torch.manual_seed(0)
    model = BertForSequenceClassification(BertConfig(
        vocab_size=len(tokenizer), hidden_size=32, num_hidden_layers=2, num_attention_heads=4, intermediate_size=37,
        max_position_embeddings=128, num_labels=2, id2label={0: "not_equivalent", 1: "equivalent"},
        label2id={"not_equivalent": 0, "equivalent": 1}))

    def encode(rows: dict[str, list]) -> datasets.Dataset:
        encoded = tokenizer(rows["sentence1"], rows["sentence2"], truncation=True, max_length=64)
        return datasets.Dataset.from_dict({**encoded, "labels": rows["label"]})

    train = encode(_mrpc_rows(shared_data / "glue_data" / "MRPC" / "train.tsv", 64))
    dev = encode(_mrpc_rows(shared_data / "glue_data" / "MRPC" / "dev.tsv", 96))

    # What the README shows: the module loaded from kdbench's installed files, offline.
    metric = evaluate.load(module_path("glue"), "mrpc")

    def compute_metrics(eval_pred):
        logits, labels = eval_pred
        return metric.compute(predictions=np.argmax(logits, axis=-1), references=labels)

    args = TrainingArguments(output_dir=str(tmp_path / "out"), max_steps=6, per_device_train_batch_size=16,
                             per_device_eval_batch_size=32, learning_rate=1e-3, warmup_steps=0, eval_strategy="steps",
                             eval_steps=3, logging_steps=3, save_strategy="no", report_to="none", use_cpu=True,
                             seed=0, disable_tqdm=True)
    trainer = Trainer(model=model, args=args, train_dataset=train, eval_dataset=dev,
                      data_collator=DataCollatorWithPadding(tokenizer), compute_metrics=compute_metrics)
    trainer.train()
    logged = [entry for entry in trainer.state.log_history if "eval_f1" in entry]
    assert [entry["step"] for entry in logged] == [3, 6]  # the Trainer's own evaluation loop used the module
    result = trainer.evaluate()

    # direct computation on the same predictions
    output = trainer.predict(dev)
    predictions = np.argmax(output.predictions, axis=-1)
    labels = np.asarray(dev["labels"])
    assert {"eval_acc", "eval_f1"} <= set(result)
    assert result["eval_acc"] == pytest.approx(100 * accuracy_score(labels, predictions), abs=1e-9)
    assert result["eval_f1"] == pytest.approx(100 * f1_score(labels, predictions), abs=1e-9)
    assert result["eval_acc"] == logged[-1]["eval_acc"]  # same model, same dev rows, same score
    assert output.metrics["test_acc"] == result["eval_acc"]
    print(json.dumps({"trainer.evaluate": {k: result[k] for k in ("eval_acc", "eval_f1", "eval_loss")},
                      "direct": {"acc": 100 * accuracy_score(labels, predictions),
                                 "f1": 100 * f1_score(labels, predictions)},
                      "predicted_positive": int(predictions.sum()), "dev_rows": len(labels),
                      "eval_history": [{k: e[k] for k in ("step", "eval_acc", "eval_f1")} for e in logged]}))
