"""Tiny BERT models built from a config (hidden 32, 2 layers) with the real MiniLM tokenizer, saved to
folders, for sweep / tuning / Slurm tests. Shared by tests/sweep, tests/tuning and tests/slurm."""

from __future__ import annotations

from pathlib import Path


def make_tiny_bert(folder: Path, minilm: Path, task: str = "sst2", seed: int = 0) -> Path:
    """A randomly initialised 2-layer BERT classifier for ``task`` (labels by name), with a tokenizer."""
    import torch
    from transformers import AutoTokenizer, BertConfig, BertForSequenceClassification

    from kdbench.engine import head_kwargs
    from kdbench.plugins import TASKS

    if (folder / "config.json").is_file():
        return folder
    spec = TASKS.get(task).spec
    torch.manual_seed(seed)
    config = BertConfig(vocab_size=30522, hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
                        intermediate_size=37, max_position_embeddings=128, **head_kwargs(spec, spec.head))
    BertForSequenceClassification(config).save_pretrained(folder)
    AutoTokenizer.from_pretrained(str(minilm)).save_pretrained(folder)
    return folder


# Run keys that keep one tiny run to a few seconds on 2 CPU cores (real SST-2 rows, 32 of each split).
TINY_RUN = {"max_train_samples": 32, "max_eval_samples": 32, "max_seq_length": 32, "batch_size": 8,
            "eval_batch_size": 32, "max_steps": 4, "eval_steps": 2, "logging_steps": 2, "warmup_ratio": 0.0,
            "lr": 1e-3, "precision": "fp32"}
