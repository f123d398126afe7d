"""Declared value constraints of typed configuration fields.

One mechanism validates run configs, method parameters, table specs and sweep specs alike: a
dataclass field declares its constraint in its metadata (:func:`constrained`, :func:`loss_weight`,
:func:`softmax_temperature`), and :func:`kdbench.config.from_mapping`, which builds every such
dataclass from user input, enforces it (:func:`check_fields`). A rule that involves several fields
lives in the dataclass's ``check_combination(self)`` method, which ``from_mapping`` calls after the
field constraints.

A violated constraint is a :class:`ConfigError` of one line naming the field and
the bad value: ``train.lr: must be > 0, got -1.0``.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any


class ConfigError(ValueError):
    """A configuration value is invalid; the message names the field and the bad value.

    Defined here (the bottom of the import graph) and re-exported by :mod:`kdbench.config`."""


CONSTRAINT_KEY = "kdbench.constraint"
COMBINATION_HOOK = "check_combination"


@dataclass(frozen=True)
class Constraint:
    """What values a field accepts.

    Bounds (``gt``, ``ge``, ``lt``, ``le``) apply to numbers, ``choices`` to text; a list or tuple
    value is checked item by item; ``None`` (an unset optional field) always passes, and so do the
    values in ``allow`` (e.g. ``-1`` meaning "no limit"). ``non_empty`` refuses empty or blank text.
    ``rule`` replaces the generated description; ``reason`` is appended to the error in brackets.
    """

    gt: float | None = None
    ge: float | None = None
    lt: float | None = None
    le: float | None = None
    choices: tuple[Any, ...] | None = None
    allow: tuple[Any, ...] = ()
    non_empty: bool = False
    rule: str | None = None
    reason: str | None = None

    def describe(self) -> str:
        if self.rule:
            return self.rule
        parts = []
        if self.choices is not None:
            parts.append(f"one of {', '.join(str(c) for c in self.choices)}")
        low = (f"{_number(self.gt)}", "(") if self.gt is not None else (f"{_number(self.ge)}", "[") \
            if self.ge is not None else None
        high = (f"{_number(self.lt)}", ")") if self.lt is not None else (f"{_number(self.le)}", "]") \
            if self.le is not None else None
        if low and high:
            parts.append(f"in {low[1]}{low[0]}, {high[0]}{high[1]}")
        elif low:
            parts.append(f"{'>' if low[1] == '(' else '>='} {low[0]}")
        elif high:
            parts.append(f"{'<' if high[1] == ')' else '<='} {high[0]}")
        if self.non_empty:
            parts.append("a non-empty string")
        allowed = [repr(a) if isinstance(a, str) else str(a) for a in self.allow]
        return "must be " + " or ".join(allowed + parts)

    def accepts(self, value: Any) -> bool:
        if value is None or any(value == a and type(value) is type(a) for a in self.allow):
            return True
        if isinstance(value, str):
            if self.non_empty and not value.strip():
                return False
            return self.choices is None or value in self.choices
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            return self.choices is None or value in self.choices
        return ((self.gt is None or value > self.gt) and (self.ge is None or value >= self.ge)
                and (self.lt is None or value < self.lt) and (self.le is None or value <= self.le))

    def check(self, value: Any, name: str) -> None:
        """Raise ConfigError naming ``name`` and the bad value (an item of a list, with the list)."""
        items = value if isinstance(value, (list, tuple)) else [value]
        for item in items:
            if not self.accepts(item):
                shown = f"{item!r}" if item is value else f"{item!r} in {value!r}"
                because = f" ({self.reason})" if self.reason else ""
                raise ConfigError(f"{name}: {self.describe()}, got {shown}{because}")


def _number(value: float) -> str:
    return str(int(value)) if float(value).is_integer() else str(value)


def constrained(default: Any = dataclasses.MISSING, *, default_factory: Any = dataclasses.MISSING,
                gt: float | None = None, ge: float | None = None, lt: float | None = None, le: float | None = None,
                choices: Sequence[Any] | None = None, allow: Sequence[Any] = (), non_empty: bool = False,
                rule: str | None = None, reason: str | None = None) -> Any:
    """A dataclass field with a declared constraint, e.g. ``alpha: float = constrained(0.5, ge=0, le=1)``."""
    constraint = Constraint(gt=gt, ge=ge, lt=lt, le=le, choices=tuple(choices) if choices is not None else None,
                            allow=tuple(allow), non_empty=non_empty, rule=rule, reason=reason)
    return dataclasses.field(default=default, default_factory=default_factory,
                             metadata={CONSTRAINT_KEY: constraint})


def loss_weight(default: Any = dataclasses.MISSING, *, default_factory: Any = dataclasses.MISSING) -> Any:
    """A loss weight (or a list of them): ``>= 0``, since a negative weight would maximise its loss."""
    return constrained(default, default_factory=default_factory, ge=0, reason="a loss weight")


def softmax_temperature(default: float) -> Any:
    """A softmax temperature: ``> 0``, since it divides the logits."""
    return constrained(default, gt=0, reason="it divides the logits")


def constraint_of(field: dataclasses.Field) -> Constraint | None:
    return field.metadata.get(CONSTRAINT_KEY)


def check_fields(instance: Any, where: str = "") -> None:
    """Enforce every declared field constraint of dataclass ``instance``, then its
    ``check_combination()`` when it has one. ``where`` prefixes the field names (``train``)."""
    prefix = f"{where}." if where else ""
    for field in dataclasses.fields(instance):
        constraint = constraint_of(field)
        if constraint is not None:
            constraint.check(getattr(instance, field.name), f"{prefix}{field.name}")
    combination = getattr(instance, COMBINATION_HOOK, None)
    if callable(combination):
        combination()
