"""Sweep specs: grid expansion, shared stages, references, validation (no training, no models)."""

from __future__ import annotations

import argparse
from pathlib import Path

import pytest
import yaml

from kdbench.sweep import SweepError, cmd_sweep, expand

TEACHER0 = "/models/bert-base"  # a path-shaped name: plan_run accepts it without loading anything
STUDENT = "/models/student"


def spec(tmp_path: Path, **extra) -> dict:
    base = {
        "name": "t",
        "output": str(tmp_path / "out"),
        "defaults": {"student": STUDENT, "max_steps": 4},
        "stages": {"finetune-teacher": {"method": "finetune", "task": "${task}", "student": TEACHER0, "seed": 7}},
        "grid": {"methods": {"kd": {"teacher": "${finetune-teacher}", "alpha": 0.7}, "finetune": {}},
                 "tasks": ["sst2", "rte"], "seeds": [1, 2]},
    }
    base.update(extra)
    return base


def test_grid_with_one_shared_teacher_per_task(tmp_path):
    sweep = expand(spec(tmp_path))
    cells = [r for r in sweep.runs.values() if r.kind == "cell"]
    stages = [r for r in sweep.runs.values() if r.kind == "stage"]
    assert len(cells) == 2 * 2 * 2  # methods x tasks x seeds
    assert sorted(s.name for s in stages) == ["finetune-teacher-rte", "finetune-teacher-sst2"]
    teacher_sst2 = sweep.runs["finetune-teacher-sst2"]
    for seed in (1, 2):
        kd = sweep.runs[f"kd-sst2-s{seed}"]
        assert kd.depends_on == ("finetune-teacher-sst2",)
        assert kd.values["teacher"] == str(teacher_sst2.run_dir / "model")
        assert kd.values["alpha"] == 0.7 and kd.values["seed"] == seed
        assert kd.level == 1
        assert sweep.runs[f"finetune-sst2-s{seed}"].depends_on == ()
    assert teacher_sst2.values["seed"] == 7 and teacher_sst2.level == 0
    # run folders are the engine's: <method>-<task>-<hash>, under the sweep output, all distinct
    dirs = {r.run_dir for r in sweep.runs.values()}
    assert len(dirs) == len(sweep.runs)
    assert all(d.parent == tmp_path / "out" for d in dirs)
    assert [len(level) for level in sweep.levels()] == [4 + 2, 4]


def test_expansion_is_deterministic_so_reruns_find_the_same_folders(tmp_path):
    first = {n: r.run_dir for n, r in expand(spec(tmp_path)).runs.items()}
    second = {n: r.run_dir for n, r in expand(spec(tmp_path)).runs.items()}
    assert first == second


def test_override_variants_labels_and_precedence(tmp_path):
    s = spec(tmp_path)
    s["grid"]["tasks"] = ["sst2"]
    s["grid"]["seeds"] = [1]
    del s["grid"]["methods"]["finetune"]  # variants apply to every method: alpha is kd's
    s["grid"]["overrides"] = [{"label": "low", "lr": 1e-5}, {"label": "high", "lr": 1e-3, "alpha": 0.2}]
    sweep = expand(s)
    assert sweep.runs["kd-sst2-s1-low"].values["lr"] == 1e-5
    high = sweep.runs["kd-sst2-s1-high"].values
    assert high["lr"] == 1e-3 and high["alpha"] == 0.2 and high["label"] == "high"  # variant wins over method


def test_stage_chain_seed_reference_and_run_dir_reference(tmp_path):
    s = spec(tmp_path)
    s["stages"]["general"] = {"method": "finetune", "task": "sst2", "student": "${finetune-teacher.run_dir}",
                              "seed": "${seed}"}
    s["stages"]["finetune-teacher"]["task"] = "sst2"
    s["grid"] = {"methods": {"kd": {"student": "${general}", "teacher": "${finetune-teacher}"}},
                 "tasks": ["sst2"], "seeds": [3, 4]}
    sweep = expand(s)
    teacher = sweep.runs["finetune-teacher"]  # no ${task}/${seed}: one run for everything
    for seed in (3, 4):
        general = sweep.runs[f"general-s{seed}"]
        assert general.values["seed"] == seed  # a whole-string ${seed} keeps its integer type
        assert general.values["student"] == str(teacher.run_dir)
        assert general.level == 1
        assert sweep.runs[f"kd-sst2-s{seed}"].level == 2
        assert set(sweep.runs[f"kd-sst2-s{seed}"].depends_on) == {f"general-s{seed}", "finetune-teacher"}


@pytest.mark.parametrize("mutate, message", [
    (lambda s: s.update(bogus=1), "sweep spec: unknown key bogus=1"),
    (lambda s: s.update(grid=[1]), "sweep spec: grid: expected a mapping, got [1]"),
    (lambda s: s["grid"]["methods"]["kd"].update(teacher="${no-such-stage}"), "unknown reference ${no-such-stage}"),
    (lambda s: s["stages"].update(a={"method": "finetune", "task": "sst2", "student": "${b}"},
                                  b={"method": "finetune", "task": "sst2", "student": "${a}"})
     or s["grid"]["methods"]["finetune"].update(student="${a}"), "dependency cycle"),
    (lambda s: s["grid"].update(tasks=[]), "grid.tasks"),
    (lambda s: s["grid"]["methods"]["kd"].update(alpha=7), "alpha"),  # the method's own validation
    (lambda s: s["stages"]["finetune-teacher"].pop("method"), "missing 'method'"),
])
def test_bad_specs_name_the_bad_value(tmp_path, mutate, message):
    s = spec(tmp_path)
    mutate(s)
    with pytest.raises(SweepError, match=None) as error:
        expand(s)
    assert message in str(error.value)


def test_task_reference_in_a_run_once_stage_is_an_error(tmp_path):
    s = spec(tmp_path)
    s["stages"]["general"] = {"method": "finetune", "task": "sst2", "student": STUDENT, "label": "${task}-x",
                              "depends_on": []}
    s["cells"] = [{"method": "finetune", "task": "sst2", "label": "c", "student": "${general}"}]
    # ${task} makes `general` per-task, and the explicit cell gives it one: valid
    assert "general-sst2" in expand(s).runs
    s["stages"]["other"] = {"method": "finetune", "task": "sst2", "student": "${general}"}
    s["cells"] = [{"method": "finetune", "task": "sst2", "label": "d", "student": "${other}"}]
    with pytest.raises(SweepError, match=r"\$\{task\} is used where no task is known"):
        expand(s)


def test_dry_run_lists_every_run_and_submits_nothing(tmp_path, capsys):
    path = tmp_path / "spec.yaml"
    path.write_text(yaml.safe_dump(spec(tmp_path)))
    code = cmd_sweep(argparse.Namespace(spec=str(path), output=None, dry_run=True, executor="slurm", profile=None))
    out = capsys.readouterr().out
    assert code == 0
    assert out.count("todo") == 10 and "kd-sst2-s2 <- finetune-teacher-sst2" in out
    assert not (tmp_path / "out" / "sweep.json").exists()


def test_named_cells_sharing_a_row_label_keep_the_sweep_name():
    """Cells may carry a `name` distinct from their table-row `label` (tasks x seeds of one row);
    naming a cell must not rename the sweep."""
    from kdbench.sweep import expand

    sweep = expand({"name": "study", "output": "/tmp/unused",
                    "cells": [{"name": f"kd-s{seed}", "label": "kd", "method": "finetune", "task": "sst2",
                               "student": "bert-base-uncased", "seed": seed} for seed in (1, 2)]})
    assert sweep.name == "study"
    assert list(sweep.runs) == ["kd-s1", "kd-s2"]
    assert {run.values["label"] for run in sweep.runs.values()} == {"kd"}
