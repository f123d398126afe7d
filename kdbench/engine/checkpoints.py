"""Checkpoint I/O of the trained module (student + the method's extra modules), safetensors only."""

from __future__ import annotations

import json
import logging
import shutil
import struct
import zipfile
from pathlib import Path
from typing import TYPE_CHECKING, Any

from safetensors import SafetensorError
from safetensors.torch import load_file, save_file
from transformers import PreTrainedModel
from transformers.trainer_utils import get_last_checkpoint

if TYPE_CHECKING:
    from kdbench.engine.models import DistillationModule


log = logging.getLogger("kdbench")


class CheckpointError(RuntimeError):
    """A checkpoint is missing, truncated or corrupted; the message names the file."""


STUDENT_DIR = "student"


EXTRAS_FILE = "extras.safetensors"


def save_module(module: DistillationModule, folder: Path, tokenizer: Any | None = None) -> None:
    folder.mkdir(parents=True, exist_ok=True)
    module.student.save_pretrained(folder / STUDENT_DIR)
    if tokenizer is not None:
        tokenizer.save_pretrained(folder / STUDENT_DIR)
    extras = {k: v.detach().contiguous() for k, v in module.extras.state_dict().items()}
    save_file(extras, str(folder / EXTRAS_FILE), metadata={"format": "pt"})


def load_module(module: DistillationModule, folder: Path) -> None:
    weights = folder / STUDENT_DIR / "model.safetensors"
    extras_path = folder / EXTRAS_FILE
    for path in (weights, extras_path):
        if not path.is_file():
            raise CheckpointError(f"checkpoint {folder} is incomplete: {path.name} is missing")
    try:
        state = load_file(str(weights))
        extras = load_file(str(extras_path))
    except (SafetensorError, OSError, ValueError) as error:
        raise CheckpointError(f"checkpoint file in {folder} is corrupted or truncated: {error}") from None
    missing, unexpected = module.student.load_state_dict(state, strict=False)
    tied = _tied_keys(module.student)
    missing = [key for key in missing if key not in tied]
    if missing or unexpected:
        raise CheckpointError(f"checkpoint {weights} does not fit the student: missing {missing[:5]}, "
                              f"unexpected {list(unexpected)[:5]}")
    module.student.tie_weights()
    module.extras.load_state_dict(extras)


def _tied_keys(model: PreTrainedModel) -> set[str]:
    tied = getattr(model, "_tied_weights_keys", None) or {}
    keys = set(tied.keys()) if isinstance(tied, dict) else set(tied)
    # Tied keys are declared relative to the model; the state dict names them in full.
    return {key for key in model.state_dict() if any(key.endswith(t) for t in keys)}


def last_complete_checkpoint(stage_dir: Path) -> str | None:
    """The newest ``checkpoint-N`` that was completely written, or None.

    Trainer writes a checkpoint's files in place and ``trainer_state.json`` last, so a process
    killed while saving leaves a folder without a readable ``trainer_state.json``: such folders are
    removed (the caller holds the run lock) and the previous complete checkpoint is used.
    """
    if not Path(stage_dir).is_dir():
        return None
    while (latest := get_last_checkpoint(str(stage_dir))) is not None:
        folder = Path(latest)
        problem = checkpoint_problem(folder)
        if problem is None:
            return latest
        earlier = [p for p in Path(stage_dir).glob("checkpoint-*") if p != folder and p.is_dir()]
        fallback = "falling back to the previous checkpoint" if earlier else "no earlier checkpoint: starting the stage over"
        print(f"[kdbench] checkpoint {folder} is unusable ({problem}); removing it, {fallback}", flush=True)
        log.warning("checkpoint %s is unusable (%s); %s", folder, problem, fallback)
        shutil.rmtree(folder)
    return None


def checkpoint_problem(folder: Path) -> str | None:
    """Why ``folder`` cannot be resumed from (missing/unreadable state, a weights file cut short, a
    truncated optimiser archive), or None when it is intact. Reads headers and sizes only."""
    try:
        json.loads((folder / "trainer_state.json").read_text())
    except (OSError, ValueError):
        return "trainer_state.json missing or unreadable: interrupted while saving"
    for weights in (folder / STUDENT_DIR / "model.safetensors", folder / EXTRAS_FILE):
        problem = safetensors_problem(weights)
        if problem is not None:
            return problem
    for archive in (folder / "optimizer.pt", folder / "scheduler.pt"):
        if archive.exists() and not zipfile.is_zipfile(archive):
            return f"{archive.name} is truncated or corrupted"
    return None


def safetensors_problem(path: Path) -> str | None:
    """None when ``path`` is a complete safetensors file: its header parses and the tensors it
    declares end exactly at the end of the file."""
    if not path.is_file():
        return f"{path.name} is missing"
    size = path.stat().st_size
    try:
        with open(path, "rb") as handle:
            (header_size,) = struct.unpack("<Q", handle.read(8))
            if header_size > size - 8:
                raise ValueError
            header = json.loads(handle.read(header_size))
    except (OSError, ValueError, struct.error):
        return f"{path.name} is truncated or corrupted ({size} bytes, unreadable header)"
    ends = [entry["data_offsets"][1] for key, entry in header.items() if key != "__metadata__"]
    expected = 8 + header_size + max(ends, default=0)
    if size != expected:
        return f"{path.name} is truncated ({size} of {expected} bytes)"
    return None
