"""Tiny models built from configs that speak the real MiniLM tokenizer, saved as Hub-style folders."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from transformers import AutoTokenizer, BertConfig, BertForSequenceClassification


def save_tiny_bert(folder: Path, tokenizer_source: Path, *, layers: int = 2, hidden: int = 32, heads: int = 4,
                   labels: tuple[str, ...] = ("negative", "positive"), seed: int = 0) -> Path:
    torch.manual_seed(seed)
    tokenizer = AutoTokenizer.from_pretrained(tokenizer_source)
    config = BertConfig(vocab_size=len(tokenizer), hidden_size=hidden, num_hidden_layers=layers,
                        num_attention_heads=heads, intermediate_size=hidden * 2, max_position_embeddings=128,
                        num_labels=len(labels), id2label=dict(enumerate(labels)),
                        label2id={name: i for i, name in enumerate(labels)})
    BertForSequenceClassification(config).save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    return folder


@pytest.fixture(scope="session")
def tiny_teacher(tmp_path_factory, minilm_path) -> Path:
    """A 2-layer, 32-wide BERT with an SST-2 head (random weights) and the MiniLM tokenizer."""
    return save_tiny_bert(tmp_path_factory.mktemp("tiny-teacher"), minilm_path)
