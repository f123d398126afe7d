"""Fixtures of the task tests: a tiny BERT (any head) sharing the real MiniLM tokenizer."""

from __future__ import annotations

from pathlib import Path

import pytest


@pytest.fixture(scope="session")
def tokenizer_dir(minilm_path: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A folder with only the MiniLM tokenizer (WordPiece, 30,522 ids)."""
    from transformers import AutoTokenizer

    folder = tmp_path_factory.mktemp("tokenizer")
    AutoTokenizer.from_pretrained(str(minilm_path)).save_pretrained(folder)
    return folder


@pytest.fixture(scope="session")
def tokenizer(tokenizer_dir: Path):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(str(tokenizer_dir))


def tiny_bert_config(**kwargs):
    from transformers import BertConfig

    return BertConfig(vocab_size=30522, hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
                      intermediate_size=37, max_position_embeddings=128, **kwargs)


@pytest.fixture(scope="session")
def tiny_bert_dir(tokenizer_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A randomly initialised 2-layer BERT (hidden 32) with the MiniLM tokenizer, saved as a folder
    loadable with any Auto head class."""
    import torch
    from transformers import AutoTokenizer, BertModel

    torch.manual_seed(0)
    folder = tmp_path_factory.mktemp("tiny-bert")
    BertModel(tiny_bert_config()).save_pretrained(folder)
    AutoTokenizer.from_pretrained(str(tokenizer_dir)).save_pretrained(folder)
    return folder
