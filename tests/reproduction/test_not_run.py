"""A study's ``not-run.yaml`` turns a short cell's "the others are pending" into why its seeds were not
run, for exactly the seeds that have no completed record, and refuses entries it cannot place."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from kdbench.config import ConfigError
from kdbench.records import load_records
from kdbench.reproduce import records_folder, render
from kdbench.reproduce.not_run import NOT_RUN_FILE, read_seeds_not_run
from kdbench.tables.plan import SeedsNotRun


def _records_with(tmp_path: Path, label: str, task: str, seeds: tuple[int, ...]) -> Path:
    """A records folder holding copies of the committed cross-method records of ``label`` on ``task``."""
    frame = load_records(records_folder("cross-method"), include_failed=False)
    chosen = frame[(frame["label"] == label) & (frame["task"] == task) & frame["seed"].isin(seeds)]
    assert sorted(chosen["seed"]) == sorted(seeds)
    records = tmp_path / "cross-method" / "records"
    for folder in chosen["run_dir"]:
        shutil.copytree(folder, records / Path(folder).name)
    return records


def _write(records: Path, text: str) -> None:
    (records.parent / NOT_RUN_FILE).write_text(text)


def test_listed_seeds_without_a_record_are_named_with_their_reason(tmp_path, capsys):
    records = _records_with(tmp_path, "tinybert4", "stsb", (1, 2, 3))
    _write(records, "- cells: [tinybert4-stsb-s3, tinybert4-stsb-s4, tinybert4-stsb-s5]\n"
                    "  why: >-\n    they need\n    another machine\n")
    assert read_seeds_not_run("cross-method", records) == (
        SeedsNotRun(row="tinybert4", task="stsb", seeds=(4, 5), why="they need another machine"),)
    assert "cell tinybert4-stsb-s3 is listed as not run but has a completed record" in capsys.readouterr().err

    table = render("cross-method", records, tmp_path / "table.md").read_text()
    tinybert4 = next(line for line in table.splitlines() if line.startswith("| tinybert [tinybert4]"))
    assert "[3/5]" in tinybert4
    assert ("- ours: [n/N] = measured on n of the N seeds the study runs; tinybert4 on stsb: seeds 4, 5 not run: "
            "they need another machine\n") in table
    assert "the others are pending" not in table


def test_a_short_cell_not_listed_stays_pending_beside_a_listed_one(tmp_path):
    records = _records_with(tmp_path, "tinybert4", "stsb", (1, 2, 3))
    for folder in _records_with(tmp_path / "more", "finetune-3l", "rte", (1, 2)).iterdir():
        shutil.copytree(folder, records / folder.name)
    _write(records, "- cells: [tinybert4-stsb-s4]\n  why: one reason\n")
    table = render("cross-method", records, tmp_path / "table.md").read_text()
    note = next(line for line in table.splitlines() if line.startswith("- ours: [n/N]"))
    assert "(the others are pending)" in note and note.endswith("; tinybert4 on stsb: seed 4 not run: one reason")


@pytest.mark.parametrize(("text", "named"), [
    ("- cells: [tinybert4-stsb-s9]\n  why: x\n", "'tinybert4-stsb-s9', which table 'cross-method' does not plan"),
    ("- cells: [tinybert4-stsb-s4]\n  why: ''\n", "entry 1 must say why its cells were not run"),
    ("- cells: []\n  why: x\n", "entry 1's cells must be a non-empty list"),
    ("- cells: [tinybert4-stsb-s4]\n  reason: x\n", "entry 1 must have exactly the keys 'cells' and 'why'"),
    ("cells: [tinybert4-stsb-s4]\n", "expected a list"),
])
def test_an_entry_it_cannot_place_is_refused_by_name(tmp_path, text, named):
    records = tmp_path / "cross-method" / "records"
    records.mkdir(parents=True)
    _write(records, text)
    with pytest.raises(ConfigError, match=named.replace("(", r"\(").replace("[", r"\[")):
        read_seeds_not_run("cross-method", records)


def test_without_the_file_nothing_is_listed(tmp_path):
    assert read_seeds_not_run("cross-method", tmp_path / "records") == ()


def test_choosing_listed_cells_names_them_once_per_reason(tmp_path, capsys):
    from kdbench.reproduce.not_run import say_which_listed_cells_run

    records = tmp_path / "cross-method" / "records"
    records.mkdir(parents=True)
    _write(records, "- cells: [tinybert4-stsb-s4, tinybert4-stsb-s5]\n  why: another machine\n")
    say_which_listed_cells_run("cross-method", records, ["kd-3l-rte-s1", "tinybert4-stsb-s4", "tinybert4-stsb-s5"])
    out = capsys.readouterr().out
    assert out.count("\n") == 1
    assert "lists them as not run: tinybert4-stsb-s4, tinybert4-stsb-s5 (another machine)" in out
    assert "kd-3l-rte-s1" not in out
