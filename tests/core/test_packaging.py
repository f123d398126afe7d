"""The built wheel is kdbench, whole: what `pip install .` or an index installs, not the editable checkout.

The editable install that the README and CI use finds every module in the source tree, so a package
or data file that ``pyproject.toml`` forgets to ship goes unnoticed until a user installs the wheel
(it happened: ``kdbench.engine`` and ``kdbench.tables`` were missing from it, and every command failed
on import). These tests build the wheel from a copy of the checkout and use it with the editable
install hidden."""

from __future__ import annotations

import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest


# Where each source folder installs (the project's layout: methods/ is kdbench.methods, ...).
INSTALLED_AS = {"kdbench": "kdbench", "methods": "kdbench/methods", "tasks": "kdbench/tasks",
                "slurm": "kdbench/slurm", "results": "kdbench/results"}
REPO_ROOT = Path(__file__).resolve().parents[2]
NOT_SOURCE = (".git", ".venv", "build", "dist", "runs", "*.egg-info", "__pycache__", ".pytest_cache")


@pytest.fixture(scope="module")
def wheel(tmp_path_factory) -> Path:
    folder = tmp_path_factory.mktemp("wheel")
    source = folder / "source"  # a copy: an old build/ folder in the checkout would leak stale files into it
    shutil.copytree(REPO_ROOT, source, ignore=shutil.ignore_patterns(*NOT_SOURCE), symlinks=True)
    subprocess.run([sys.executable, "-m", "pip", "wheel", "--quiet", "--no-deps", "--no-build-isolation",
                    "--wheel-dir", str(folder / "dist"), str(source)], check=True)
    (built,) = (folder / "dist").glob("kdbench-*.whl")
    return built


def _package_modules(folder: Path) -> list[Path]:
    """The .py files of ``folder`` that belong to a package (every folder up to ``folder`` has an
    ``__init__.py``): a script such as results/reproduction/rebuild_teacher.py is not installed."""
    found = []
    for path in folder.rglob("*.py"):
        parents = path.relative_to(folder).parents
        if all((folder / parent / "__init__.py").is_file() for parent in parents):
            found.append(path)
    return found


@pytest.mark.slow
def test_the_wheel_holds_every_module_and_every_committed_study_record(wheel):
    shipped = set(zipfile.ZipFile(wheel).namelist())
    missing = []
    for folder, installed in INSTALLED_AS.items():
        for path in _package_modules(REPO_ROOT / folder):
            name = f"{installed}/{path.relative_to(REPO_ROOT / folder).as_posix()}"
            if name not in shipped:
                missing.append(name)
    assert not missing, f"modules not in the wheel: {missing}"
    records = [path for path in (REPO_ROOT / "results" / "reproduction").glob("*/records/**/*") if path.is_file()]
    assert any(path.name == "config.json" and path.parent.name == "model" for path in records)  # tables measure from it
    assert any(path.name == "stage_roles.json" for path in records)
    unshipped = [str(path.relative_to(REPO_ROOT)) for path in records
                 if f"kdbench/{path.relative_to(REPO_ROOT).as_posix()}" not in shipped]
    assert not unshipped, f"{len(unshipped)} committed record files not in the wheel, e.g. {unshipped[:3]}"


INSTALLED_ONLY = """
import sys
sys.meta_path[:] = [finder for finder in sys.meta_path if "editable" not in type(finder).__module__]
sys.path.insert(0, sys.argv[1])
import importlib, pkgutil
import kdbench
assert kdbench.__file__.startswith(sys.argv[1]), kdbench.__file__
for module in pkgutil.walk_packages(kdbench.__path__, "kdbench."):
    if not module.name.endswith(".__main__"):  # (importing it runs the command line)
        importlib.import_module(module.name)
from kdbench.cli import main
sys.exit(main(["reproduce", "pkd-skip-last", "--render-only", "--no-plots"]))
"""


@pytest.mark.slow
def test_the_installed_wheel_imports_whole_and_renders_a_study_table_from_its_records(wheel, tmp_path):
    site = tmp_path / "site"
    zipfile.ZipFile(wheel).extractall(site)
    done = subprocess.run([sys.executable, "-c", INSTALLED_ONLY, str(site)], capture_output=True, text=True,
                          cwd=tmp_path)
    assert done.returncode == 0, done.stderr[-3000:]
    table = (site / "kdbench/results/reproduction/pkd-skip-last/table.md").read_text()
    committed = (REPO_ROOT / "results/reproduction/pkd-skip-last/table.md").read_text()
    assert "| BERT6 (PKD-Skip) | ours" in table
    assert table == committed  # the installed records render the committed table, cell for cell
