"""kdbench: a comparative knowledge-distillation benchmark for BERT-style models."""

__version__ = "0.1.0"
