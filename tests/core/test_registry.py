"""Registries: lazy entries, aliases, "did you mean", third-party entry points."""

from __future__ import annotations

import sys
from importlib.metadata import EntryPoint

import pytest

import kdbench.registry as registry_module
from kdbench.plugins import METHODS, STUDENTS
from kdbench.registry import Registry, UnknownNameError


def test_unknown_names_suggest_the_closest():
    with pytest.raises(UnknownNameError) as error:
        METHODS.get("finetuen")
    assert str(error.value).startswith("unknown method 'finetuen'; did you mean 'finetune'")
    with pytest.raises(UnknownNameError, match="did you mean 'tinybert-4l-312'"):
        STUDENTS.get("tinybert-4l-321")


def test_names_are_case_and_separator_insensitive_and_aliases_resolve():
    assert METHODS.canonical("FineTune") == "finetune"
    assert METHODS.canonical("vanilla_kd") == "kd"
    assert METHODS.get("hinton") is METHODS.get("kd")


def test_lazy_entries_import_on_first_use(tmp_path, monkeypatch):
    (tmp_path / "kdbench_lazy_probe.py").write_text("VALUE = object()\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    registry: Registry[object] = Registry("thing")
    registry.register_lazy("probe", "kdbench_lazy_probe:VALUE")
    assert "kdbench_lazy_probe" not in sys.modules
    value = registry.get("probe")
    assert value is sys.modules["kdbench_lazy_probe"].VALUE


def test_third_party_plugins_come_from_entry_points(tmp_path, monkeypatch):
    (tmp_path / "my_kd_plugin.py").write_text("class MyMethod:\n    name = 'mine'\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    point = EntryPoint(name="my-method", value="my_kd_plugin:MyMethod", group="kdbench.methods")

    def fake_entry_points(group):
        return [point] if group == "kdbench.methods" else []

    monkeypatch.setattr(registry_module, "entry_points", fake_entry_points)
    registry: Registry[object] = Registry("method", "kdbench.methods")
    assert registry.names() == ["my-method"]
    assert registry.get("my-method").name == "mine"
