"""A tiny, fully local world for reliability tests: a word-level tokenizer, tiny BERT teacher and
students saved as Hugging Face folders, and a tiny SST-2 dataset in the classic GLUE layout.

Everything is built from configs in a temporary folder (seconds, no network, no real weights)."""

from __future__ import annotations

import random
from dataclasses import dataclass
from pathlib import Path

import pytest

WORDS = ["the", "a", "movie", "film", "plot", "acting", "story", "good", "great", "fun", "lovely", "bad", "awful", "boring", "dull", "weak", "was", "is", "very", "not", "really", "quite"]
POSITIVE = ("good", "great", "fun", "lovely")
NEGATIVE = ("bad", "awful", "boring", "dull")
SPECIALS = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"]


@dataclass(frozen=True)
class TinyWorld:
    root: Path
    data_dir: Path  # holds glue_data/SST-2/{train,dev}.tsv
    teacher: Path  # 2 layers, 4 heads, SST-2 labels, with its tokenizer
    teacher_3_layers: Path  # 3 layers, 4 heads, with its tokenizer
    student: Path  # 1 layer, 4 heads, same vocabulary, no tokenizer of its own
    student_2_heads: Path  # 1 layer, 2 heads
    student_other_vocab: Path  # same vocabulary size, different tokens, ships its own tokenizer

    def run_args(self, method: str, output: Path, *extra: str, student: Path | None = None,
                 data_dir: Path | None = None) -> list[str]:
        """``kdbench run`` arguments for a run of a few steps on the tiny world."""
        return ["run", method, "--task", "sst2", "--teacher", str(self.teacher),
                "--student", str(student or self.student), "--data-dir", str(data_dir or self.data_dir),
                "--output", str(output), "max_steps=4", "batch_size=4", "eval_batch_size=8",
                "max_seq_length=16", "logging_steps=1", "eval_steps=2", "precision=fp32", *extra]


def sentence(rng: random.Random, positive: bool) -> str:
    words = rng.sample(POSITIVE if positive else NEGATIVE, 2)
    return f"the {rng.choice(['movie', 'film', 'plot'])} was {words[0]} and {words[1]}".replace(" and", " very")


def write_sst2(folder: Path, train_rows: int = 48, dev_rows: int = 16, seed: int = 0) -> Path:
    rng = random.Random(seed)
    task_dir = folder / "glue_data" / "SST-2"
    task_dir.mkdir(parents=True, exist_ok=True)
    for name, count in (("train.tsv", train_rows), ("dev.tsv", dev_rows)):
        lines = ["sentence\tlabel"]
        for i in range(count):
            positive = i % 2 == 0
            lines.append(f"{sentence(rng, positive)}\t{int(positive)}")
        (task_dir / name).write_text("\n".join(lines) + "\n")
    return folder


def _tokenizer(folder: Path, words: list[str]):
    from transformers import BertTokenizerFast

    folder.mkdir(parents=True, exist_ok=True)
    tokenizer = BertTokenizerFast(vocab={token: i for i, token in enumerate(SPECIALS + words)}, do_lower_case=True)
    assert len(tokenizer) == len(SPECIALS) + len(words)
    return tokenizer


def _bert(folder: Path, vocab_size: int, layers: int, heads: int, seed: int):
    import torch
    from transformers import BertConfig, BertForSequenceClassification

    torch.manual_seed(seed)
    config = BertConfig(vocab_size=vocab_size, hidden_size=32, num_hidden_layers=layers, num_attention_heads=heads,
                        intermediate_size=37, max_position_embeddings=64, num_labels=2,
                        id2label={0: "negative", 1: "positive"}, label2id={"negative": 0, "positive": 1})
    model = BertForSequenceClassification(config)
    model.save_pretrained(folder)
    return model


def build_tiny_world(root: Path) -> TinyWorld:
    root.mkdir(parents=True, exist_ok=True)
    words = list(WORDS) + ["and"]
    teacher = root / "teacher"
    tokenizer = _tokenizer(teacher, words)
    tokenizer.save_pretrained(teacher)
    size = len(tokenizer)
    _bert(teacher, size, layers=2, heads=4, seed=1)
    teacher_3_layers = root / "teacher-3-layers"
    tokenizer.save_pretrained(teacher_3_layers)
    _bert(teacher_3_layers, size, layers=3, heads=4, seed=5)
    student = root / "student"
    _bert(student, size, layers=1, heads=4, seed=2)
    student_2_heads = root / "student-2-heads"
    _bert(student_2_heads, size, layers=1, heads=2, seed=3)
    other = root / "student-other-vocab"
    other_tokenizer = _tokenizer(other, [w + "x" for w in words])
    other_tokenizer.save_pretrained(other)
    _bert(other, len(other_tokenizer), layers=1, heads=4, seed=4)
    return TinyWorld(root, write_sst2(root / "data"), teacher, teacher_3_layers, student, student_2_heads, other)


@pytest.fixture(scope="session")
def tiny_world(tmp_path_factory: pytest.TempPathFactory) -> TinyWorld:
    return build_tiny_world(tmp_path_factory.mktemp("tiny-world"))

