"""One feature-capture mechanism for every method: forward hooks by module path.

Models are never edited and keep their attention implementation (SDPA by default). Hidden states
come from hooks on the embedding module and on every layer; attention scores are recomputed from
the outputs of each layer's query and key projections, which the hooks record:

    scores = q·kᵀ / √d_head + mask,   mask = -10000 on padded key columns (TinyBERT's value),
    probs  = softmax(scores)          (before attention dropout)

This matches the eager attention of transformers exactly (the test suite checks it on padded
batches) and costs one extra q·kᵀ per captured layer, paid only when a stage asks for attention.
Only the features a stage requests get hooks.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor, nn

from kdbench.features import FeatureRequest, Features

PADDED_KEY_SCORE = -10000.0


@dataclass(frozen=True)
class ArchitectureSpec:
    """Where the pieces of a transformer encoder live, relative to ``model.base_model``."""

    embeddings: str
    layers: str
    query: str  # relative to one layer
    key: str


ARCHITECTURES: dict[str, ArchitectureSpec] = {
    "bert": ArchitectureSpec("embeddings", "encoder.layer", "attention.self.query", "attention.self.key"),
    "roberta": ArchitectureSpec("embeddings", "encoder.layer", "attention.self.query", "attention.self.key"),
    "xlm-roberta": ArchitectureSpec("embeddings", "encoder.layer", "attention.self.query", "attention.self.key"),
    "electra": ArchitectureSpec("embeddings", "encoder.layer", "attention.self.query", "attention.self.key"),
    "mobilebert": ArchitectureSpec("embeddings", "encoder.layer", "attention.self.query", "attention.self.key"),
    "distilbert": ArchitectureSpec("embeddings", "transformer.layer", "attention.q_lin", "attention.k_lin"),
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


class FeatureCapture:
    """Records the requested features of ``model`` during its forward passes.

    Use as a context manager around a stage, then call :meth:`collect` after each forward::

        with FeatureCapture(student, request) as capture:
            outputs = student(**inputs)
            features = capture.collect(outputs)
    """

    def __init__(self, model: nn.Module, request: FeatureRequest):
        self.model = model
        self.request = request
        self._handles: list[Any] = []
        self._embedding: Tensor | None = None
        self._layers: dict[int, Tensor] = {}
        self._queries: dict[int, Tensor] = {}
        self._keys: dict[int, Tensor] = {}
        self._attention_mask: Tensor | None = None
        self._install()

    # -- hooks -------------------------------------------------------------------------------
    def _install(self) -> None:
        self._handles.append(self.model.register_forward_pre_hook(self._remember_mask, with_kwargs=True))
        if not self.request.any:
            return
        spec = architecture_of(self.model)
        base = self.model.base_model
        layers = base.get_submodule(spec.layers)
        if self.request.hidden_states:
            self._handles.append(base.get_submodule(spec.embeddings).register_forward_hook(self._store_embedding))
            for index, layer in enumerate(layers):
                self._handles.append(layer.register_forward_hook(self._store_into(self._layers, index)))
        if self.request.attention_scores or self.request.attention_probs:
            for index, layer in enumerate(layers):
                query = layer.get_submodule(spec.query)
                key = layer.get_submodule(spec.key)
                self._handles.append(query.register_forward_hook(self._store_into(self._queries, index)))
                self._handles.append(key.register_forward_hook(self._store_into(self._keys, index)))

    def _remember_mask(self, module: nn.Module, args: tuple, kwargs: dict) -> None:
        mask = kwargs.get("attention_mask")
        if mask is None and len(args) > 1 and isinstance(args[1], Tensor):
            mask = args[1]
        self._attention_mask = mask
        input_ids = kwargs.get("input_ids", args[0] if args else None)
        if mask is None and isinstance(input_ids, Tensor):
            self._attention_mask = torch.ones_like(input_ids)

    def _store_embedding(self, module: nn.Module, args: tuple, output: Any) -> None:
        self._embedding = output[0] if isinstance(output, tuple) else output

    @staticmethod
    def _store_into(store: dict[int, Tensor], index: int):
        def hook(module: nn.Module, args: tuple, output: Any) -> None:
            store[index] = output[0] if isinstance(output, tuple) else output

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
            count = len(self._layers)
            if self._embedding is None or sorted(self._layers) != list(range(count)):
                raise RuntimeError("hidden-state hooks did not fire for every layer; was the model run?")
            features.hidden_states = (self._embedding, *(self._layers[i] for i in range(count)))
        if self.request.attention_scores or self.request.attention_probs:
            scores = tuple(self._scores(i) for i in range(len(self._queries)))
            if self.request.attention_scores:
                features.attention_scores = scores
            if self.request.attention_probs:
                features.attention_probs = tuple(torch.softmax(s, dim=-1) for s in scores)
        self._embedding = None
        self._layers.clear()
        self._queries.clear()
        self._keys.clear()
        return features

    def _scores(self, index: int) -> Tensor:
        query, key = self._queries[index], self._keys[index]
        batch, length, width = query.shape
        heads = num_attention_heads(self.model)
        head_dim = width // heads
        q = query.view(batch, length, heads, head_dim).transpose(1, 2)
        k = key.view(batch, key.shape[1], heads, head_dim).transpose(1, 2)
        scores = torch.matmul(q, k.transpose(-1, -2)) * head_dim**-0.5
        if self._attention_mask is not None:
            padded = (self._attention_mask[:, None, None, :] == 0).to(scores.dtype)
            scores = scores + padded * PADDED_KEY_SCORE
        return scores

    def remove(self) -> None:
        for handle in self._handles:
            handle.remove()
        self._handles.clear()

    def __enter__(self) -> FeatureCapture:
        return self

    def __exit__(self, *exc: object) -> None:
        self.remove()
