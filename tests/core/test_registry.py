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


def _entry_points_returning(monkeypatch, *points: EntryPoint) -> None:
    monkeypatch.setattr(registry_module, "entry_points",
                        lambda group: [p for p in points if p.group == group])


def test_a_broken_plugin_is_skipped_with_a_warning_in_listings_and_named_when_used(tmp_path, monkeypatch, capsys):
    (tmp_path / "good_plugin.py").write_text("class Good:\n    name = 'good'\n    description = 'works'\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    _entry_points_returning(monkeypatch,
                            EntryPoint(name="good", value="good_plugin:Good", group="kdbench.methods"),
                            EntryPoint(name="broken", value="no_such_module_xyz:Method", group="kdbench.methods"))
    registry: Registry[object] = Registry("method", "kdbench.methods")
    registry.register_lazy("builtin", "good_plugin:Good")
    with pytest.warns(registry_module.PluginWarning, match="plug-in method 'broken' = 'no_such_module_xyz:Method'"):
        listed = [name for name, _ in registry.loadable_items()]
    assert listed == ["builtin", "good"]
    with pytest.raises(registry_module.PluginLoadError, match="ModuleNotFoundError.*no_such_module_xyz"):
        registry.get("broken")

    # The command line: the listing goes on, the broken plug-in is one warning line on stderr.
    import kdbench.plugins as plugins

    monkeypatch.setattr(plugins, "METHODS", registry)
    from kdbench.cli import main

    assert main(["list", "methods"]) == 0
    out, err = capsys.readouterr()
    assert [line.split("\t")[0] for line in out.splitlines()] == ["builtin", "good"]
    assert err.count("\n") == 1 and err.startswith("kdbench: warning: skipped: plug-in method 'broken'")


@pytest.mark.parametrize("name", ["kd", "hinton", "KD"])
def test_a_plugin_named_like_a_builtin_makes_that_name_unusable_and_nothing_else(name, monkeypatch):
    _entry_points_returning(monkeypatch, EntryPoint(name=name, value="my_kd:Mine", group="kdbench.methods"))
    registry: Registry[object] = Registry("method", "kdbench.methods")
    registry.register_lazy("kd", "kdbench.methods.kd:HintonKD", aliases=("hinton",))
    registry.register_lazy("pkd", "kdbench.methods.pkd:PatientKD")
    with pytest.raises(registry_module.PluginConflictError) as error:
        registry.get(name)
    message = str(error.value)
    assert "\n" not in message and f"plug-in method {name!r} = 'my_kd:Mine'" in message
    assert "the built-in method" in message and "kdbench.methods.kd:HintonKD" in message and "rename it" in message
    assert registry.get("pkd").__name__ == "PatientKD"  # one clashing package does not stop the others
    with pytest.warns(registry_module.PluginWarning, match=f"skipped: plug-in method {name!r} = 'my_kd:Mine'"):
        listed = [listed_name for listed_name, _ in registry.loadable_items()]
    assert "pkd" in listed and name.lower() not in listed
    if name == "hinton":  # the plug-in took an alias: the built-in's own name still works
        assert "kd" in listed and registry.get("kd").__name__ == "HintonKD"


def test_two_plugins_with_one_name_are_both_named_and_code_registering_a_taken_name_is_refused(monkeypatch):
    _entry_points_returning(monkeypatch, EntryPoint(name="mine", value="a:M", group="kdbench.methods"),
                            EntryPoint(name="mine", value="b:M", group="kdbench.methods"))
    with pytest.raises(registry_module.PluginConflictError,
                       match=r"plug-in method 'mine' = 'b:M' .* has the name of a plug-in method 'mine' = 'a:M'"):
        Registry("method", "kdbench.methods").get("mine")
    registry: Registry[object] = Registry("method")
    registry.register_lazy("kd", "kdbench.methods.kd:HintonKD")

    class Impostor:
        pass

    with pytest.raises(registry_module.PluginConflictError, match="'kd' is already registered"):
        registry.register("kd", Impostor)
