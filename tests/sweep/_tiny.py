"""Tiny BERT models built from a config (hidden 32, 2 layers) with the real MiniLM tokenizer, saved to
folders, for sweep / tuning / Slurm tests. Shared by tests/sweep, tests/tuning and tests/slurm."""

from __future__ import annotations

from tiny_models import make_tiny_bert  # noqa: F401  (re-exported for the sweep/tuning/Slurm tests)


# Run keys that keep one tiny run to a few seconds on 2 CPU cores (real SST-2 rows, 32 of each split).
TINY_RUN = {"max_train_samples": 32, "max_eval_samples": 32, "max_seq_length": 32, "batch_size": 8,
            "eval_batch_size": 32, "max_steps": 4, "eval_steps": 2, "logging_steps": 2, "warmup_ratio": 0.0,
            "lr": 1e-3, "precision": "fp32"}
