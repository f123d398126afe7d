"""Masked-LM batch preparation for methods that train or distil a masked-LM head.

A stage plugs :class:`MlmMasking` in as ``Stage.prepare_batch``; the ``corpus`` task supplies
unmasked token ids and never knows which method masks them.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from kdbench.config import ConfigError


@dataclass(frozen=True)
class MlmMasking:
    """BERT's dynamic masking, usable as ``Stage.prepare_batch``.

    Of the non-special, non-padding positions, each is chosen with ``probability`` (0.15); a chosen
    token becomes ``[MASK]`` with 80 %, a random vocabulary id with 10 %, and stays with 10 %
    (``mask_ratio``/``random_ratio``). ``labels`` holds the original id at chosen positions and
    -100 elsewhere. Uses torch's global RNG (seeded by the engine). Returns a new mapping.
    """

    mask_token_id: int
    vocab_size: int
    special_token_ids: tuple[int, ...]
    probability: float = 0.15
    mask_ratio: float = 0.8
    random_ratio: float = 0.1

    def __post_init__(self) -> None:
        if not 0.0 < self.probability < 1.0:
            raise ConfigError(f"mlm probability must be in (0, 1), got {self.probability!r}")
        if self.mask_ratio < 0 or self.random_ratio < 0 or self.mask_ratio + self.random_ratio > 1:
            raise ConfigError(f"mask_ratio + random_ratio must be within [0, 1], got {self.mask_ratio}, {self.random_ratio}")

    @classmethod
    def from_tokenizer(cls, tokenizer: Any, probability: float = 0.15) -> MlmMasking:
        if tokenizer.mask_token_id is None:
            raise ConfigError(f"tokenizer {getattr(tokenizer, 'name_or_path', tokenizer)!r} has no mask token")
        return cls(int(tokenizer.mask_token_id), len(tokenizer), tuple(int(i) for i in tokenizer.all_special_ids),
                   probability)

    @classmethod
    def for_run(cls, run: Any, probability: float = 0.15) -> MlmMasking:
        """Masking for a run's tokenizer (``tokenizer``, else the teacher's, else the student's)."""
        from transformers import AutoTokenizer

        source = run.tokenizer or run.teacher or run.student
        return cls.from_tokenizer(AutoTokenizer.from_pretrained(source, trust_remote_code=run.trust_remote_code),
                                  probability)

    def __call__(self, batch: Mapping[str, Any]) -> dict[str, Any]:
        import torch

        input_ids = batch["input_ids"]
        candidates = torch.ones_like(input_ids, dtype=torch.bool)
        for special in self.special_token_ids:
            candidates &= input_ids != special
        if "attention_mask" in batch:
            candidates &= batch["attention_mask"].bool()
        probabilities = torch.full(input_ids.shape, self.probability, device=input_ids.device)
        chosen = torch.bernoulli(probabilities).bool() & candidates
        labels = torch.where(chosen, input_ids, torch.full_like(input_ids, -100))
        draw = torch.rand(input_ids.shape, device=input_ids.device)
        masked = chosen & (draw < self.mask_ratio)
        randomised = chosen & (draw >= self.mask_ratio) & (draw < self.mask_ratio + self.random_ratio)
        random_ids = torch.randint(self.vocab_size, input_ids.shape, device=input_ids.device, dtype=input_ids.dtype)
        new_ids = torch.where(masked, torch.full_like(input_ids, self.mask_token_id), input_ids)
        new_ids = torch.where(randomised, random_ids, new_ids)
        return {**batch, "input_ids": new_ids, "labels": labels}
