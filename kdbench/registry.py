"""Name-keyed registries for methods, tasks, student presets and tables.

Entries are either registered objects or lazy ``"module:attribute"`` targets that are imported on
first use, so ``kdbench list methods`` imports no method code. Third-party packages add entries
through the entry-point group named by the registry (``kdbench.methods``, ``kdbench.tasks``, ...).

A third-party entry named like a built-in (or like another plug-in) makes that name unusable: using
it is a :class:`PluginConflictError` naming both entries, since silently preferring one of the two
would run code the user did not ask for. Every other name works as before, so one clashing package
does not stop every command. A plug-in that cannot be imported is a :class:`PluginLoadError` when
it is used. Listings (:meth:`Registry.loadable_items`) skip either kind with a warning.
"""

from __future__ import annotations

import difflib
import importlib
import warnings
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from importlib.metadata import entry_points
from typing import Generic, TypeVar

from kdbench.config import ConfigError

T = TypeVar("T")


class PluginConflictError(ConfigError):
    """A third-party plug-in is named like a built-in entry or like another plug-in."""


class PluginLoadError(ConfigError):
    """A registered entry (typically a third-party entry point) cannot be imported."""


class PluginWarning(UserWarning):
    """A plug-in was skipped while listing (it cannot be imported)."""


@dataclass(frozen=True)
class _Loader:
    """An entry built by calling ``load()`` on first use (e.g. a spec file read when needed)."""

    load: Callable[[], object]
    source: str


@dataclass(frozen=True)
class _EntryPoint:
    """A third-party entry not imported yet: where it comes from, for the messages."""

    target: str  # "module:attribute"
    distribution: str

    def describe(self) -> str:
        return f"{self.target!r} (from distribution {self.distribution})"


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
    # Called once before the first lookup, with the registry, to register entries found at run
    # time (e.g. the table specs in a folder).
    discover: Callable[[Registry[T]], None] | None = field(default=None, repr=False)
    _entries: dict[str, T | str | _Loader | _EntryPoint] = field(default_factory=dict, repr=False)
    _aliases: dict[str, str] = field(default_factory=dict, repr=False)
    _entry_points_loaded: bool = field(default=False, repr=False)
    _conflicts: dict[str, str] = field(default_factory=dict, repr=False)  # name -> why it is unusable

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

    def register_loader(self, name: str, load: Callable[[], T], source: str) -> None:
        """Register an entry that ``load()`` builds on first use; ``source`` names where it comes from."""
        self._add(name, _Loader(load, source), ())

    def _add(self, name: str, target: T | str | _Loader, aliases: tuple[str, ...]) -> None:
        key = _normalise(name)
        existing = self._entries.get(key)
        # A lazy "module:attribute" entry may be replaced by the object its own module registers on
        # import (built-in modules do so); anything else under a taken name is a conflict.
        replaces_lazy = isinstance(existing, str) and not isinstance(target, str) \
            and getattr(target, "__module__", None) == existing.split(":", 1)[0]
        if existing is not None and existing is not target and existing != target and not replaces_lazy:
            raise PluginConflictError(f"{self.kind} {name!r} is already registered ({_describe(existing)}); "
                                      f"give the new one another name")
        self._entries[key] = target
        for alias in aliases:
            self._aliases[_normalise(alias)] = key

    def _load_entry_points(self) -> None:
        if self._entry_points_loaded:
            return
        self._entry_points_loaded = True
        if self.discover is not None:
            self.discover(self)
        if self.entry_point_group is None:
            return
        for ep in entry_points(group=self.entry_point_group):
            key = _normalise(ep.name)
            dist = getattr(getattr(ep, "dist", None), "name", None) or "unknown"
            entry = _EntryPoint(ep.value, dist)
            taken_key = key if key in self._entries else self._aliases.get(key)
            if taken_key is not None:
                taken = self._entries[taken_key]
                owner = "a plug-in" if isinstance(taken, _EntryPoint) else "the built-in"
                self._conflicts[key] = (
                    f"plug-in {self.kind} {ep.name!r} = {entry.describe()} (entry point group "
                    f"{self.entry_point_group}) has the name of {owner} {self.kind} {key!r} = {_source(taken)}, so "
                    f"neither runs under that name; rename it in that package's pyproject.toml "
                    f"[project.entry-points.\"{self.entry_point_group}\"]")
                continue
            self._entries[key] = entry

    def canonical(self, name: str) -> str:
        """The canonical registered name for ``name`` (or UnknownNameError)."""
        self._load_entry_points()
        key = _normalise(name)
        if key in self._conflicts:
            raise PluginConflictError(self._conflicts[key])
        key = self._aliases.get(key, key)
        if key not in self._entries:
            raise UnknownNameError(self.kind, name, self.names(include_aliases=True))
        return key

    def get(self, name: str) -> T:
        key = self.canonical(name)
        entry = self._entries[key]
        if isinstance(entry, _EntryPoint):
            try:
                obj = _import(entry.target)
            except Exception as error:
                raise PluginLoadError(f"plug-in {self.kind} {key!r} = {entry.describe()} cannot be loaded: "
                                      f"{type(error).__name__}: {error}") from error
            self._entries[key] = entry = obj
        elif isinstance(entry, _Loader):
            self._entries[key] = entry = entry.load()
        elif isinstance(entry, str):
            self._entries[key] = entry = _import(entry)
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

    def loadable_items(self) -> Iterator[tuple[str, T]]:
        """Like :meth:`items`, but a plug-in that cannot be imported, or a name two entries claim, is
        skipped with a :class:`PluginWarning` naming it and why (for listings)."""
        self._load_entry_points()
        for key, why in self._conflicts.items():
            if key not in self._entries:  # the plug-in took an alias's name: nothing listed says so
                warnings.warn(f"skipped: {why}", PluginWarning, stacklevel=2)
        for name in self.names():
            try:
                yield name, self.get(name)
            except (PluginLoadError, PluginConflictError) as error:
                warnings.warn(f"skipped: {error}", PluginWarning, stacklevel=2)


def _import(target: str) -> object:
    module_name, attribute = target.split(":", 1)
    obj: object = importlib.import_module(module_name)
    for part in attribute.split("."):
        obj = getattr(obj, part)
    return obj


def _source(entry: object) -> str:
    """Where an entry comes from, without the word 'plug-in' that the messages put before it."""
    return entry.describe() if isinstance(entry, _EntryPoint) else _describe(entry)


def _describe(entry: object) -> str:
    if isinstance(entry, _EntryPoint):
        return f"plug-in {entry.describe()}"
    if isinstance(entry, str):
        return entry
    if isinstance(entry, _Loader):
        return entry.source
    return f"{getattr(entry, '__module__', '?')}:{getattr(entry, '__qualname__', type(entry).__name__)}"


Factory = Callable[..., T]
