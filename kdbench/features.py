"""What a forward pass exposes to a distillation loss.

Layer indexing follows the reference semantics: ``hidden_states[0]`` is the embedding output and
``hidden_states[i]`` the output of layer ``i`` (N+1 entries for N layers); ``attention_scores[i]``
and ``attention_probs[i]`` belong to layer ``i + 1`` (N entries).
"""

from __future__ import annotations

from dataclasses import dataclass

from torch import Tensor


@dataclass(frozen=True)
class FeatureRequest:
    """Which intermediate features a stage needs from a model. Logits are always available.

    ``hidden_layers`` / ``attention_layers`` narrow a request to some layers (indices as in
    :class:`Features`: hidden 0 is the embedding output, attention i belongs to layer i + 1); None
    means every layer. Only the selected layers are captured (and cached, for a teacher); the
    others are None in the feature tuples, which keep the full indexing.
    """

    hidden_states: bool = False
    attention_scores: bool = False
    attention_probs: bool = False
    hidden_layers: tuple[int, ...] | None = None
    attention_layers: tuple[int, ...] | None = None

    def __post_init__(self) -> None:
        for name in ("hidden_layers", "attention_layers"):
            value = getattr(self, name)
            if value is not None:
                if any(int(i) < 0 for i in value):
                    raise ValueError(f"FeatureRequest.{name}: layer indices must be >= 0, got {value}")
                object.__setattr__(self, name, tuple(sorted({int(i) for i in value})))

    @property
    def any(self) -> bool:
        return self.hidden_states or self.attention_scores or self.attention_probs

    @property
    def wants_attention(self) -> bool:
        return self.attention_scores or self.attention_probs

    def hidden_indices(self, num_layers: int) -> tuple[int, ...]:
        """Indices of the hidden states to capture for a model of ``num_layers`` layers."""
        return _selected(self.hidden_layers, num_layers + 1, "hidden_layers") if self.hidden_states else ()

    def attention_indices(self, num_layers: int) -> tuple[int, ...]:
        """Indices of the attention maps to capture for a model of ``num_layers`` layers."""
        return _selected(self.attention_layers, num_layers, "attention_layers") if self.wants_attention else ()

    def __or__(self, other: FeatureRequest) -> FeatureRequest:
        return FeatureRequest(
            hidden_states=self.hidden_states or other.hidden_states,
            attention_scores=self.attention_scores or other.attention_scores,
            attention_probs=self.attention_probs or other.attention_probs,
            hidden_layers=_union(self.hidden_states, self.hidden_layers, other.hidden_states, other.hidden_layers),
            attention_layers=_union(self.wants_attention, self.attention_layers, other.wants_attention,
                                    other.attention_layers),
        )


def _selected(layers: tuple[int, ...] | None, count: int, name: str) -> tuple[int, ...]:
    if layers is None:
        return tuple(range(count))
    if layers and layers[-1] >= count:
        raise ValueError(f"FeatureRequest.{name}={list(layers)}: the model has only {count} of them (0..{count - 1})")
    return layers


def _union(wants_a: bool, layers_a: tuple[int, ...] | None, wants_b: bool,
           layers_b: tuple[int, ...] | None) -> tuple[int, ...] | None:
    """Layers of two requests together; a side that does not ask for the feature adds nothing."""
    chosen = [layers for wants, layers in ((wants_a, layers_a), (wants_b, layers_b)) if wants]
    if not chosen or any(layers is None for layers in chosen):
        return None
    return tuple(sorted(set().union(*chosen)))


NO_FEATURES = FeatureRequest()
HIDDEN = FeatureRequest(hidden_states=True)
ATTENTION_SCORES = FeatureRequest(attention_scores=True)
ATTENTION_PROBS = FeatureRequest(attention_probs=True)


@dataclass
class Features:
    """Outputs of one forward pass of a teacher or student.

    - ``logits``: (B, C) for classification, (B, 1) for regression, (B, L, V) for masked LM.
    - ``start_logits`` / ``end_logits``: (B, L) for span extraction (SQuAD).
    - ``hidden_states``: tuple of (B, L, d), embedding output first; entries a request left out
      (``FeatureRequest.hidden_layers``) are None, and the same holds for the attention tuples.
    - ``attention_scores``: tuple of (B, H, L, L) PRE-softmax scores ``q·kᵀ/√d + mask`` where the
      additive mask is -10000 on padded key columns (the value TinyBERT's code uses); padded query
      rows keep their values.
    - ``attention_probs``: tuple of (B, H, L, L) softmax of those scores (before dropout), so
      padded keys carry zero probability.
    - ``attention_mask``: (B, L), 1 on real tokens.
    """

    logits: Tensor | None = None
    start_logits: Tensor | None = None
    end_logits: Tensor | None = None
    hidden_states: tuple[Tensor | None, ...] | None = None
    attention_scores: tuple[Tensor | None, ...] | None = None
    attention_probs: tuple[Tensor | None, ...] | None = None
    attention_mask: Tensor | None = None

    @property
    def cls(self) -> tuple[Tensor | None, ...]:
        """The [CLS] (first-token) vector of every captured hidden state, (B, d) each (None where not captured)."""
        if self.hidden_states is None:
            raise ValueError("[CLS] vectors need hidden_states; request FeatureRequest(hidden_states=True)")
        return tuple(None if h is None else h[:, 0] for h in self.hidden_states)

    @property
    def num_layers(self) -> int:
        if self.hidden_states is not None:
            return len(self.hidden_states) - 1
        for attn in (self.attention_scores, self.attention_probs):
            if attn is not None:
                return len(attn)
        raise ValueError("no per-layer features were captured")
