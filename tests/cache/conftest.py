"""Fixtures of the teacher-cache tests: a tiny SST-2 teacher built from a config (random weights)."""

from __future__ import annotations

from pathlib import Path

import pytest


def build_tiny_teacher(folder: Path, tokenizer_path: str, seed: int = 0) -> Path:
    import torch
    from transformers import AutoTokenizer, BertConfig, BertForSequenceClassification

    torch.manual_seed(seed)
    tokenizer = AutoTokenizer.from_pretrained(tokenizer_path)
    config = BertConfig(vocab_size=len(tokenizer), hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
                        intermediate_size=37, max_position_embeddings=128, num_labels=2,
                        id2label={0: "negative", 1: "positive"}, label2id={"negative": 0, "positive": 1})
    model = BertForSequenceClassification(config).eval()
    model.save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    return folder


@pytest.fixture(scope="session")
def tiny_teacher(tmp_path_factory: pytest.TempPathFactory, minilm_path: str) -> Path:
    return build_tiny_teacher(tmp_path_factory.mktemp("tiny-teacher"), str(minilm_path))
