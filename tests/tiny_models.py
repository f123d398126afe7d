"""Tiny BERT models built from a config (random weights) that speak the real MiniLM tokenizer, saved
as Hugging Face folders. Shared by every test that needs a teacher or student folder."""

from __future__ import annotations

from pathlib import Path


def make_tiny_bert(folder: Path, minilm: Path | str, task: str = "sst2", seed: int = 0, *, layers: int = 2,
                   hidden: int = 32, heads: int = 4) -> Path:
    """A randomly initialised BERT classifier for ``task`` (labels by name) with a tokenizer, in ``folder``."""
    import torch
    from transformers import AutoTokenizer, BertConfig, BertForSequenceClassification

    from kdbench.engine import head_kwargs
    from kdbench.plugins import TASKS

    if (folder / "config.json").is_file():
        return folder
    spec = TASKS.get(task).spec
    tokenizer = AutoTokenizer.from_pretrained(str(minilm))
    torch.manual_seed(seed)
    config = BertConfig(vocab_size=len(tokenizer), hidden_size=hidden, num_hidden_layers=layers,
                        num_attention_heads=heads, intermediate_size=37, max_position_embeddings=128,
                        **head_kwargs(spec, spec.head))
    BertForSequenceClassification(config).eval().save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    return folder


# Run keys that keep one tiny run to a few seconds on 2 CPU cores (real SST-2 rows, 32 of each split).
TINY_RUN = {"max_train_samples": 32, "max_eval_samples": 32, "max_seq_length": 32, "batch_size": 8,
            "eval_batch_size": 32, "max_steps": 4, "eval_steps": 2, "logging_steps": 2, "warmup_ratio": 0.0,
            "lr": 1e-3, "precision": "fp32"}
