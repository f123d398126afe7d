"""The corpus task (general distillation text), MLM masking and the GLUE -> corpus helper."""

from __future__ import annotations

import json
from pathlib import Path

import datasets
import pytest
import torch

from kdbench.config import ConfigError, DataConfig, RunConfig, TrainConfig
from kdbench.errors import DataError
from kdbench.masking import MlmMasking
from kdbench.tasks.corpus import CORPUS, HubCorpus, read_corpus, write_glue_corpus


def _run(corpus: str, **data) -> RunConfig:
    return RunConfig(method="finetune", task="corpus", student="x",
                     train=TrainConfig(max_seq_length=16), data=DataConfig(corpus=corpus, **data))


def test_corpus_file_skips_and_counts_blank_lines(tmp_path: Path, tokenizer) -> None:
    path = tmp_path / "c.txt"
    path.write_text("The cat sat on the mat.\n\n   \nA second line that is rather long and will be truncated at sixteen tokens for sure.\nthird\n")
    split = CORPUS.encode_train(tokenizer, _run(str(path)))
    assert len(split) == 3
    assert split.skipped_rows == 2 and split.metadata["empty_lines"] == 2
    assert set(split.features.column_names) == {"input_ids", "attention_mask", "token_type_ids"}
    lengths = [len(ids) for ids in split.features["input_ids"]]
    assert lengths[1] == 16 and lengths[2] == 3  # [CLS] third [SEP]
    assert split.features["input_ids"][0][0] == tokenizer.cls_token_id
    assert CORPUS.encode_eval(tokenizer, _run(str(path))) == []
    assert CORPUS.spec.head.value == "masked-lm"


def test_corpus_max_train_samples(tmp_path: Path, tokenizer) -> None:
    path = tmp_path / "c.txt"
    path.write_text("".join(f"line {i}\n" for i in range(50)))
    assert len(CORPUS.encode_train(tokenizer, _run(str(path), max_train_samples=7))) == 7


def test_empty_corpus_is_an_error_naming_the_file(tmp_path: Path, tokenizer) -> None:
    path = tmp_path / "empty.txt"
    path.write_text("\n  \n\n")
    with pytest.raises(DataError, match="empty.txt.*empty"):
        CORPUS.encode_train(tokenizer, _run(str(path)))
    with pytest.raises(DataError, match="missing.txt"):
        read_corpus(tmp_path / "missing.txt")
    with pytest.raises(ConfigError, match="data.corpus"):
        CORPUS.encode_train(tokenizer, RunConfig(method="finetune", task="corpus", student="x"))


def test_hub_corpus_with_patched_loader(monkeypatch: pytest.MonkeyPatch, tokenizer) -> None:
    calls = []

    def fake_load(name, config=None, split=None):
        calls.append((name, config, split))
        return datasets.Dataset.from_dict({"content": ["first text", "", "second text"], "id": [1, 2, 3]})

    monkeypatch.setattr(datasets, "load_dataset", fake_load)
    split = CORPUS.encode_train(tokenizer, _run("hub:wikitext:wikitext-2-raw-v1:validation:content"))
    assert calls == [("wikitext", "wikitext-2-raw-v1", "validation")]
    assert len(split) == 2 and split.skipped_rows == 1
    assert HubCorpus.parse("hub:bookcorpus") == HubCorpus("bookcorpus", None, "train", "text")
    with pytest.raises(DataError, match="no column 'text'"):
        read_corpus("hub:bookcorpus")
    with pytest.raises(ConfigError, match="hub:NAME"):
        HubCorpus.parse("hub:")


def test_mlm_masking_follows_the_bert_recipe() -> None:
    masking = MlmMasking(mask_token_id=4, vocab_size=50, special_token_ids=(0, 1, 2), probability=0.5)
    torch.manual_seed(0)
    ids = torch.randint(5, 50, (64, 40))
    ids[:, 0], ids[:, -1] = 1, 2
    attention = torch.ones_like(ids)
    attention[:, 30:] = 0
    ids[:, 30:] = 0
    batch = {"input_ids": ids, "attention_mask": attention}
    out = masking(batch)
    labels = out["labels"]
    chosen = labels != -100
    assert not chosen[:, 0].any() and not chosen[:, 30:].any()  # specials and padding never chosen
    assert torch.equal(labels[chosen], ids[chosen])
    assert torch.equal(out["input_ids"][~chosen], ids[~chosen])
    rate = chosen[:, 1:30].float().mean().item()
    assert 0.45 < rate < 0.55
    mask_share = (out["input_ids"][chosen] == 4).float().mean().item()
    kept_share = (out["input_ids"][chosen] == ids[chosen]).float().mean().item()
    assert 0.75 < mask_share < 0.85 and 0.06 < kept_share < 0.16  # kept: 10 % + random hits of itself
    assert batch["input_ids"] is ids and "labels" not in batch  # input untouched


def test_write_glue_corpus(shared_data: Path, tmp_path: Path) -> None:
    out = tmp_path / "corpus.txt"
    counts = write_glue_corpus(["wnli", "rte"], shared_data, out)
    lines = out.read_text().splitlines()
    assert counts["lines"] == len(lines) == 2 * 635 + 2 * 2490  # pair tasks give both sentences
    deduped = write_glue_corpus(["wnli"], shared_data, tmp_path / "d.txt", dedupe=True)
    assert deduped["lines"] + deduped["duplicates"] == 2 * 635 and deduped["duplicates"] > 0
    assert len(set((tmp_path / "d.txt").read_text().splitlines())) == deduped["lines"]


def test_general_distillation_run_end_to_end(tmp_path: Path, tiny_bert_dir: Path, monkeypatch) -> None:
    """A masked-LM stage trains on the corpus through the engine (no dev split, no evaluation)."""
    from kdbench.engine import run_experiment
    from kdbench.method import Method, Stage
    from kdbench.plugins import METHODS
    from kdbench.task_loss import task_loss

    class MaskedLM(Method):
        name = "test-mlm"
        requires_teacher = False

        def stages(self, context):
            head = context.task.head
            return [Stage("mlm", lambda batch, s, t: {"mlm": task_loss(batch, s, head)}, uses_teacher=False,
                          prepare_batch=MlmMasking.for_run(context.run))]

    monkeypatch.setitem(METHODS._entries, "test-mlm", MaskedLM)
    corpus = tmp_path / "corpus.txt"
    corpus.write_text("".join(f"sentence number {i} about cats and dogs.\n\n" for i in range(24)))
    config = RunConfig(method="test-mlm", task="corpus", student=str(tiny_bert_dir), output=str(tmp_path / "runs"),
                       train=TrainConfig(max_seq_length=16, batch_size=8, epochs=1, precision="fp32"),
                       data=DataConfig(corpus=str(corpus)))
    run_dir = run_experiment(config)
    record = json.loads((run_dir / "result.json").read_text())
    assert record["status"] == "completed" and record["metrics"] == {}
    assert record["data"]["train_rows"] == 24 and record["data"]["train_skipped_rows"] == 24
    assert record["stages"][0]["steps"] == 3
