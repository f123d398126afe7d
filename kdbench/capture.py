"""One feature-capture mechanism for every method.

Models are never edited; what a stage asks for is recorded where the model computes it:

- hidden states: forward hooks on the embedding module and on the requested layers;
- attention scores: while a capture is active, the model runs transformers' attention interface
  under the name :data:`ATTENTION_FUNCTION` (registered below, with the eager mask preparation so
  padding is honoured). For the layers a stage asks for it computes what eager attention computes
  and keeps the pre-softmax scores it has just computed, once, with no recomputation:

      scores = q·kᵀ · scaling + mask,   mask = -10000 on padded key columns (TinyBERT's value),
      probs  = softmax(scores)          (before attention dropout; identical to eager's, whose
                                         mask is the dtype's minimum: both give exactly 0)

  Every other layer, and every model nobody captures, runs PyTorch's SDPA. The capture hands the
  function its recorder through the model's keyword arguments (a forward pre-hook adds it), which
  transformers passes down to every attention call, so no state is global.

On removal the model gets its own attention implementation back. The test suite checks the
captured scores and probabilities against eager attention on padded batches for BERT, RoBERTa,
DistilBERT and MobileBERT, and that the logits equal the model's own SDPA logits.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor, nn
from transformers import AttentionInterface, AttentionMaskInterface
from transformers.integrations.sdpa_attention import sdpa_attention_forward
from transformers.masking_utils import eager_mask

from kdbench.features import FeatureRequest, Features

PADDED_KEY_SCORE = -10000.0
ATTENTION_FUNCTION = "kdbench_scores"  # the name the captured model's config uses while captured
RECORDER_KWARG = "kdbench_attention_recorder"


@dataclass(frozen=True)
class ArchitectureSpec:
    """Where the pieces of a transformer encoder live, relative to ``model.base_model``."""

    embeddings: str
    layers: str
    attention: str  # the module that calls the attention interface, relative to one layer


ARCHITECTURES: dict[str, ArchitectureSpec] = {
    "bert": ArchitectureSpec("embeddings", "encoder.layer", "attention.self"),
    "roberta": ArchitectureSpec("embeddings", "encoder.layer", "attention.self"),
    "xlm-roberta": ArchitectureSpec("embeddings", "encoder.layer", "attention.self"),
    "electra": ArchitectureSpec("embeddings", "encoder.layer", "attention.self"),
    "mobilebert": ArchitectureSpec("embeddings", "encoder.layer", "attention.self"),
    "distilbert": ArchitectureSpec("embeddings", "transformer.layer", "attention"),
}


class UnsupportedArchitectureError(ValueError):
    pass


def architecture_of(model: nn.Module) -> ArchitectureSpec:
    model_type = getattr(getattr(model, "config", None), "model_type", None)
    if model_type not in ARCHITECTURES:
        known = ", ".join(sorted(ARCHITECTURES))
        raise UnsupportedArchitectureError(
            f"feature capture does not know model_type {model_type!r} (known: {known}); "
            "add an ArchitectureSpec to kdbench.capture.ARCHITECTURES"
        )
    return ARCHITECTURES[model_type]


def encoder_layers(model: nn.Module) -> nn.ModuleList:
    """The list of transformer layers of a model (any head)."""
    return model.base_model.get_submodule(architecture_of(model).layers)


def num_attention_heads(model: nn.Module) -> int:
    return int(model.config.num_attention_heads)


class AttentionRecorder:
    """The attention modules whose scores a capture wants, by layer index, and what they recorded."""

    def __init__(self, modules: dict[nn.Module, int], keep_probs: bool = False):
        self._index = {id(module): index for module, index in modules.items()}
        self.keep_probs = keep_probs
        self.scores: dict[int, Tensor] = {}
        self.probs: dict[int, Tensor] = {}

    def layer_of(self, module: nn.Module) -> int | None:
        return self._index.get(id(module))


def scores_attention_forward(module: nn.Module, query: Tensor, key: Tensor, value: Tensor,
                             attention_mask: Tensor | None, scaling: float | None = None, dropout: float = 0.0,
                             **kwargs: Any) -> tuple[Tensor, Tensor | None]:
    """transformers' attention-interface signature; q/k/v are (B, H, L, d), the mask additive (B, 1, L, L)
    from ``eager_mask`` (0 or the dtype's minimum) or None without padding.

    A layer the recorder asks for gets eager attention, and its pre-softmax scores (padded keys at
    -10000) are recorded; any other call is SDPA.
    """
    recorder: AttentionRecorder | None = kwargs.pop(RECORDER_KWARG, None)
    index = recorder.layer_of(module) if recorder is not None else None
    if index is None:
        return sdpa_attention_forward(module, query, key, value, attention_mask, scaling=scaling, dropout=dropout,
                                      **kwargs)
    if scaling is None:
        scaling = query.size(-1) ** -0.5
    scores = torch.matmul(query, key.transpose(2, 3)) * scaling
    if attention_mask is not None:
        scores = scores + attention_mask.clamp(min=PADDED_KEY_SCORE)
    recorder.scores[index] = scores
    probs = torch.softmax(scores, dim=-1)
    if recorder.keep_probs:
        recorder.probs[index] = probs  # before dropout, as the features promise
    probs = nn.functional.dropout(probs, p=dropout, training=module.training)
    output = torch.matmul(probs, value).transpose(1, 2).contiguous()
    return output, probs


AttentionInterface.register(ATTENTION_FUNCTION, scores_attention_forward)
# Without a mask function of its own, transformers treats an unknown implementation as maskless and
# silently ignores padding.
AttentionMaskInterface.register(ATTENTION_FUNCTION, eager_mask)


class FeatureCapture:
    """Records the requested features of ``model`` during its forward passes.

    Use as a context manager around a stage, then call :meth:`collect` after each forward::

        with FeatureCapture(student, request) as capture:
            outputs = student(**inputs)
            features = capture.collect(outputs)

    Layers a request leaves out (``FeatureRequest.hidden_layers`` / ``attention_layers``) are None in
    the returned tuples, which keep the model's full layer indexing.
    """

    def __init__(self, model: nn.Module, request: FeatureRequest):
        self.model = model
        self.request = request
        self._handles: list[Any] = []
        self._embedding: Tensor | None = None
        self._layers: dict[int, Tensor] = {}
        self._hidden_wanted: tuple[int, ...] = ()
        self._recorder: AttentionRecorder | None = None
        self._num_layers = 0
        self._restore_attention: str | None = None
        self._attention_mask: Tensor | None = None
        self._install()

    # -- hooks -------------------------------------------------------------------------------
    def _install(self) -> None:
        self._handles.append(self.model.register_forward_pre_hook(self._before_forward, with_kwargs=True))
        if not self.request.any:
            return
        spec = architecture_of(self.model)
        base = self.model.base_model
        layers = base.get_submodule(spec.layers)
        self._num_layers = len(layers)
        if self.request.hidden_states:
            self._hidden_wanted = self.request.hidden_indices(self._num_layers)
            if 0 in self._hidden_wanted:
                self._handles.append(base.get_submodule(spec.embeddings).register_forward_hook(self._store_embedding))
            for index in self._hidden_wanted:
                if index > 0:
                    self._handles.append(layers[index - 1].register_forward_hook(self._store_layer(index)))
        if self.request.wants_attention:
            if not type(self.model)._can_set_attn_implementation():
                raise UnsupportedArchitectureError(
                    f"{type(self.model).__name__} does not call transformers' attention interface, so its "
                    "attention scores cannot be captured")
            wanted = self.request.attention_indices(self._num_layers)
            self._recorder = AttentionRecorder({layers[i].get_submodule(spec.attention): i for i in wanted},
                                               keep_probs=self.request.attention_probs)
            current = self.model.config._attn_implementation
            if current != ATTENTION_FUNCTION:
                self._restore_attention = current
                self.model.set_attn_implementation(ATTENTION_FUNCTION)

    def _before_forward(self, module: nn.Module, args: tuple, kwargs: dict) -> tuple[tuple, dict]:
        mask = kwargs.get("attention_mask")
        if mask is None and len(args) > 1 and isinstance(args[1], Tensor):
            mask = args[1]
        self._attention_mask = mask
        input_ids = kwargs.get("input_ids", args[0] if args else None)
        if mask is None and isinstance(input_ids, Tensor):
            self._attention_mask = torch.ones_like(input_ids)
        if self._recorder is not None:
            kwargs = {**kwargs, RECORDER_KWARG: self._recorder}
        return args, kwargs

    def _store_embedding(self, module: nn.Module, args: tuple, output: Any) -> None:
        self._embedding = output[0] if isinstance(output, tuple) else output

    def _store_layer(self, index: int):
        def hook(module: nn.Module, args: tuple, output: Any) -> None:
            self._layers[index] = output[0] if isinstance(output, tuple) else output

        return hook

    # -- results -----------------------------------------------------------------------------
    def collect(self, outputs: Any) -> Features:
        """Features of the last forward pass; clears the recorded tensors."""
        features = Features(
            logits=getattr(outputs, "logits", None),
            start_logits=getattr(outputs, "start_logits", None),
            end_logits=getattr(outputs, "end_logits", None),
            attention_mask=self._attention_mask,
        )
        if self.request.hidden_states:
            found = {**self._layers, **({0: self._embedding} if self._embedding is not None else {})}
            if sorted(found) != list(self._hidden_wanted):
                raise RuntimeError("hidden-state hooks did not fire for every requested layer; was the model run?")
            features.hidden_states = tuple(found.get(i) for i in range(self._num_layers + 1))
        if self._recorder is not None:
            recorded = self._recorder.scores
            wanted = self.request.attention_indices(self._num_layers)
            if sorted(recorded) != list(wanted):
                raise RuntimeError(
                    f"the attention function recorded layers {sorted(recorded)} of {list(wanted)}; was the model "
                    f"run, and does {type(self.model).__name__} pass its keyword arguments to its attention layers?")
            scores = tuple(recorded.get(i) for i in range(self._num_layers))
            if self.request.attention_scores:
                features.attention_scores = scores
            if self.request.attention_probs:
                features.attention_probs = tuple(self._recorder.probs.get(i) for i in range(self._num_layers))
            recorded.clear()
            self._recorder.probs.clear()
        self._embedding = None
        self._layers.clear()
        return features

    def remove(self) -> None:
        for handle in self._handles:
            handle.remove()
        self._handles.clear()
        if self._restore_attention is not None:
            self.model.set_attn_implementation(self._restore_attention)
            self._restore_attention = None
        self._recorder = None

    def __enter__(self) -> FeatureCapture:
        return self

    def __exit__(self, *exc: object) -> None:
        self.remove()
