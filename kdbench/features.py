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
    """Which intermediate features a stage needs from a model. Logits are always available."""

    hidden_states: bool = False
    attention_scores: bool = False
    attention_probs: bool = False

    @property
    def any(self) -> bool:
        return self.hidden_states or self.attention_scores or self.attention_probs

    def __or__(self, other: FeatureRequest) -> FeatureRequest:
        return FeatureRequest(
            hidden_states=self.hidden_states or other.hidden_states,
            attention_scores=self.attention_scores or other.attention_scores,
            attention_probs=self.attention_probs or other.attention_probs,
        )


NO_FEATURES = FeatureRequest()
HIDDEN = FeatureRequest(hidden_states=True)
ATTENTION_SCORES = FeatureRequest(attention_scores=True)
ATTENTION_PROBS = FeatureRequest(attention_probs=True)


@dataclass
class Features:
    """Outputs of one forward pass of a teacher or student.

    - ``logits``: (B, C) for classification, (B, 1) for regression, (B, L, V) for masked LM.
    - ``start_logits`` / ``end_logits``: (B, L) for span extraction (SQuAD).
    - ``hidden_states``: tuple of (B, L, d), embedding output first.
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
    hidden_states: tuple[Tensor, ...] | None = None
    attention_scores: tuple[Tensor, ...] | None = None
    attention_probs: tuple[Tensor, ...] | None = None
    attention_mask: Tensor | None = None

    @property
    def cls(self) -> tuple[Tensor, ...]:
        """The [CLS] (first-token) vector of every hidden state, (B, d) each."""
        if self.hidden_states is None:
            raise ValueError("[CLS] vectors need hidden_states; request FeatureRequest(hidden_states=True)")
        return tuple(h[:, 0] for h in self.hidden_states)

    @property
    def num_layers(self) -> int:
        if self.hidden_states is not None:
            return len(self.hidden_states) - 1
        for attn in (self.attention_scores, self.attention_probs):
            if attn is not None:
                return len(attn)
        raise ValueError("no per-layer features were captured")
