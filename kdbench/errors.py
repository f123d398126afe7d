"""Errors shared across kdbench."""

from __future__ import annotations


class DataError(ValueError):
    """A data file is missing, malformed or empty; the message names the file, the line number or
    question id, and the problem."""


class TrainingOutOfMemoryError(RuntimeError):
    """The accelerator (or host) ran out of memory during training; the message names the batch
    size and suggests the same effective batch through gradient accumulation."""

    def __init__(self, stage: str, batch_size: int, grad_accum: int, device: str, detail: str):
        smaller = max(1, batch_size // 2)
        accum = grad_accum * max(1, batch_size // smaller)
        fix = (f"try batch_size={smaller} grad_accum={accum} (same effective batch of {batch_size * grad_accum})"
               if batch_size > 1 else "the model does not fit even one example: lower max_seq_length or use a "
               "smaller student")
        super().__init__(f"out of memory on {device} in stage {stage!r} at batch_size={batch_size} "
                         f"grad_accum={grad_accum}; {fix} [{detail}]")


def is_out_of_memory(error: BaseException) -> bool:
    """True for torch's OutOfMemoryError and the RuntimeErrors allocators raise when memory runs out."""
    try:
        import torch

        if isinstance(error, torch.OutOfMemoryError):
            return True
    except (ImportError, AttributeError):  # pragma: no cover - torch < 2.5
        pass
    if isinstance(error, MemoryError):
        return True
    return isinstance(error, RuntimeError) and "out of memory" in str(error).lower()
