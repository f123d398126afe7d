"""Search-space dimensions a method declares for tuning (mapped onto Optuna by ``kdbench.tuning``)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class FloatRange:
    low: float
    high: float
    log: bool = False


@dataclass(frozen=True)
class IntRange:
    low: int
    high: int
    step: int = 1


@dataclass(frozen=True)
class Choice:
    values: tuple[Any, ...]


SearchDimension = FloatRange | IntRange | Choice
SearchSpace = dict[str, SearchDimension]
