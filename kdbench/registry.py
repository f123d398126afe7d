"""Name-keyed registries for methods, tasks, student presets and tables.

Entries are either registered objects or lazy ``"module:attribute"`` targets that are imported on
first use, so ``kdbench list methods`` imports no method code. Third-party packages add entries
through the entry-point group named by the registry (``kdbench.methods``, ``kdbench.tasks``, ...).
"""

from __future__ import annotations

import difflib
import importlib
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from importlib.metadata import entry_points
from typing import Generic, TypeVar

T = TypeVar("T")


class UnknownNameError(KeyError):
    """A registry lookup failed; the message names the bad value and the closest known names."""

    def __init__(self, kind: str, name: str, known: list[str]):
        close = difflib.get_close_matches(name, known, n=3, cutoff=0.5)
        hint = f"; did you mean {' or '.join(repr(c) for c in close)}?" if close else ""
        message = f"unknown {kind} {name!r}{hint} (known: {', '.join(sorted(known)) or 'none'})"
        super().__init__(message)
        self.message = message

    def __str__(self) -> str:  # KeyError would otherwise repr() the message
        return self.message


def _normalise(name: str) -> str:
    return name.strip().lower().replace("_", "-")


@dataclass
class Registry(Generic[T]):
    """A registry of one kind of plug-in.

    Names are case-insensitive and treat ``_`` and ``-`` alike. ``aliases`` map extra names to a
    canonical one without listing them twice.
    """

    kind: str
    entry_point_group: str | None = None
    _entries: dict[str, T | str] = field(default_factory=dict, repr=False)
    _aliases: dict[str, str] = field(default_factory=dict, repr=False)
    _entry_points_loaded: bool = field(default=False, repr=False)

    def register(self, name: str, obj: T | None = None, *, aliases: tuple[str, ...] = ()):
        """Register ``obj`` under ``name``; without ``obj`` this is a decorator."""

        def add(target: T) -> T:
            self._add(name, target, aliases)
            return target

        return add if obj is None else add(obj)

    def register_lazy(self, name: str, target: str, *, aliases: tuple[str, ...] = ()) -> None:
        """Register ``"package.module:attribute"``, imported when the entry is first used."""
        if ":" not in target:
            raise ValueError(f"lazy target {target!r} must look like 'module:attribute'")
        self._add(name, target, aliases)

    def _add(self, name: str, target: T | str, aliases: tuple[str, ...]) -> None:
        key = _normalise(name)
        existing = self._entries.get(key)
        if existing is not None and existing is not target and not isinstance(existing, str):
            raise ValueError(f"{self.kind} {name!r} is already registered")
        self._entries[key] = target
        for alias in aliases:
            self._aliases[_normalise(alias)] = key

    def _load_entry_points(self) -> None:
        if self._entry_points_loaded or self.entry_point_group is None:
            return
        self._entry_points_loaded = True
        for ep in entry_points(group=self.entry_point_group):
            key = _normalise(ep.name)
            if key not in self._entries:
                self._entries[key] = ep.value

    def canonical(self, name: str) -> str:
        """The canonical registered name for ``name`` (or UnknownNameError)."""
        self._load_entry_points()
        key = _normalise(name)
        key = self._aliases.get(key, key)
        if key not in self._entries:
            raise UnknownNameError(self.kind, name, self.names(include_aliases=True))
        return key

    def get(self, name: str) -> T:
        key = self.canonical(name)
        entry = self._entries[key]
        if isinstance(entry, str):
            module_name, attribute = entry.split(":", 1)
            obj = importlib.import_module(module_name)
            for part in attribute.split("."):
                obj = getattr(obj, part)
            self._entries[key] = entry = obj
        return entry  # type: ignore[return-value]

    def __contains__(self, name: str) -> bool:
        try:
            self.canonical(name)
        except UnknownNameError:
            return False
        return True

    def names(self, include_aliases: bool = False) -> list[str]:
        self._load_entry_points()
        names = sorted(self._entries)
        return sorted(names + list(self._aliases)) if include_aliases else names

    def aliases(self, name: str) -> list[str]:
        """The other names that resolve to ``name`` (what ``kdbench list`` shows beside it)."""
        key = self.canonical(name)
        return sorted(alias for alias, target in self._aliases.items() if target == key)

    def __iter__(self) -> Iterator[str]:
        return iter(self.names())

    def items(self) -> Iterator[tuple[str, T]]:
        for name in self.names():
            yield name, self.get(name)


Factory = Callable[..., T]
