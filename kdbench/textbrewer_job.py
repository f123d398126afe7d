"""The TinyBERT-style distillation job run with TextBrewer, for ``kdbench bench``.

Same teacher, student, batches, batch size and losses as kdbench's ``tinybert-joint`` bench stage:
embeddings + hidden-state MSE on uniformly mapped layers (student layer s <- teacher layer s*k),
attention MSE on the matching layers, and soft cross-entropy on the logits (``kd_loss_type="ce"``,
temperature 1, no hard-label term), gradient clipping at 1.0, the engine's AdamW. TextBrewer's own training loop
(``GeneralDistiller.train`` with ``num_steps``) runs over the very batches kdbench's engine consumed.
It can also run without the teacher, the way TextBrewer 0.2.1 offers: outputs pre-computed per batch
are passed in each batch's ``teacher_cache`` (the counterpart of kdbench's teacher-output cache).

TextBrewer reads attention maps from ``output_attentions=True`` (Hugging Face's post-softmax
probabilities), which needs eager attention; kdbench keeps SDPA and rebuilds pre-softmax scores
from q/k hooks. TextBrewer 0.2.1 imports a TensorBoard ``SummaryWriter`` at import time; it is only
used when ``log_dir`` is set, so when neither ``tensorboardX`` nor ``tensorboard`` is installed a
no-op stand-in is registered first (it is never called: ``log_dir`` stays None).

Optional dependency: ``pip install 'kdbench[bench]'`` (textbrewer).
"""

from __future__ import annotations

import contextlib
import copy
import importlib.util
import sys
import time
import types
from pathlib import Path
from typing import Any

MODEL_INPUTS = ("input_ids", "attention_mask", "token_type_ids")


def _install_summary_writer_stand_in() -> None:
    if "tensorboardX" in sys.modules or importlib.util.find_spec("tensorboardX") or importlib.util.find_spec("tensorboard"):
        return

    class SummaryWriter:  # never instantiated: TrainingConfig.log_dir stays None
        def __init__(self, *args: Any, **kwargs: Any):
            raise RuntimeError("TensorBoard is not installed; run TextBrewer with log_dir=None")

    module = types.ModuleType("tensorboardX")
    module.SummaryWriter = SummaryWriter
    sys.modules.setdefault("tensorboardX", module)


def available() -> bool:
    if importlib.util.find_spec("textbrewer") is None:
        return False
    _install_summary_writer_stand_in()
    try:
        import textbrewer  # noqa: F401
    except Exception:
        return False
    return True


def eager_copy(model: Any) -> Any:
    """A copy of ``model`` on eager attention (the only one that returns attention maps)."""
    clone = copy.deepcopy(model)
    clone.set_attn_implementation("eager")
    return clone


def _adaptor(batch: Any, outputs: Any) -> dict[str, Any]:
    # Indexing, not attributes: pre-computed teacher outputs reach the adaptor as a plain dict
    # (TextBrewer's move_to_device rebuilds mappings).
    return {"logits": outputs["logits"], "hidden": outputs["hidden_states"], "attention": outputs["attentions"]}


def precompute_teacher_outputs(teacher: Any, batches: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """TextBrewer's own way to skip the teacher (0.2.1, "teacher_cache" in the batch): the user runs the
    teacher once per batch and keeps what the adaptor reads. Kept in memory on the device, which is
    the most favourable form for TextBrewer (kdbench reads its cache from disk)."""
    import torch

    teacher.eval()
    found = []
    with torch.no_grad():
        for batch in batches:
            outputs = teacher(**{key: batch[key] for key in MODEL_INPUTS if key in batch}, output_hidden_states=True,
                              output_attentions=True)
            found.append({"logits": outputs.logits, "hidden_states": outputs.hidden_states,
                          "attentions": outputs.attentions})
    return found


def intermediate_matches(teacher_layers: int, student_layers: int) -> list[dict[str, Any]]:
    step = teacher_layers // student_layers
    matches = [{"layer_T": 0, "layer_S": 0, "feature": "hidden", "loss": "hidden_mse", "weight": 1}]
    for s in range(1, student_layers + 1):
        matches.append({"layer_T": s * step, "layer_S": s, "feature": "hidden", "loss": "hidden_mse", "weight": 1})
        matches.append({"layer_T": s * step - 1, "layer_S": s - 1, "feature": "attention", "loss": "attention_mse",
                        "weight": 1})
    return matches


def run(teacher: Any, student: Any, batches: list[dict[str, Any]], *, warmup: int, teacher_layers: int,
        student_layers: int, lr: float, device: Any, bf16: bool, workdir: Path,
        teacher_outputs: list[dict[str, Any]] | None = None) -> float:
    """Train ``student`` with TextBrewer over ``batches``; seconds of the steps after ``warmup``.

    With ``teacher_outputs`` (from :func:`precompute_teacher_outputs`, one per batch) TextBrewer
    reads them instead of running the teacher.
    """
    import torch

    _install_summary_writer_stand_in()
    from textbrewer import DistillationConfig, GeneralDistiller, TrainingConfig

    from kdbench.engine import build_adamw

    workdir.mkdir(parents=True, exist_ok=True)
    # One extra batch: its pre-step stamp closes the timing of the last real step. The only
    # checkpoint TextBrewer writes comes after it.
    feed = list(range(len(batches) + 1))  # batch positions; the postprocessor builds each batch
    train_config = TrainingConfig(device=device, output_dir=str(workdir), ckpt_steps=len(feed), log_dir=None)
    distill_config = DistillationConfig(temperature=1, hard_label_weight=0, kd_loss_type="ce", kd_loss_weight=1,
                                        intermediate_matches=intermediate_matches(teacher_layers, student_layers))
    teacher.eval()
    student.train()
    distiller = GeneralDistiller(train_config, distill_config, teacher, student, _adaptor, _adaptor)
    # The engine's optimiser (fused AdamW where available), so the ratio compares the loops only.
    optimizer = build_adamw(list(student.parameters()), lr=lr, weight_decay=0.01)
    stamps: list[float] = []

    def build_and_clock(position: int) -> dict[str, Any]:
        # Called before every step: the time between two calls is one TextBrewer step.
        if device.type == "cuda" and len(stamps) in (warmup, len(batches)):
            torch.cuda.synchronize()
        stamps.append(time.perf_counter())
        position = min(position, len(batches) - 1)
        inputs = {key: batches[position][key] for key in MODEL_INPUTS if key in batches[position]}
        if teacher_outputs is None:
            return inputs
        return {"teacher": inputs, "student": inputs, "teacher_cache": teacher_outputs[position]}

    autocast = torch.autocast(device.type, dtype=torch.bfloat16) if bf16 else contextlib.nullcontext()
    with autocast:
        distiller.train(optimizer, feed, num_steps=len(feed), max_grad_norm=1.0,
                        batch_postprocessor=build_and_clock, output_hidden_states=True, output_attentions=True)
    return stamps[len(batches)] - stamps[warmup]
