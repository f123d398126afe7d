"""`kdbench tune` end to end in this process (tiny models, 32 real SST-2 rows): a study, resumed."""

from __future__ import annotations

import json
from pathlib import Path

import optuna
import pytest
import yaml

from tiny_models import TINY_RUN


@pytest.mark.integration
def test_tune_inline_then_resume_adds_only_the_missing_trials(tmp_path, tiny_models, capsys):
    from kdbench.tuning import add_command, make_storage
    import argparse

    parser = argparse.ArgumentParser()
    add_command(parser.add_subparsers())
    out = tmp_path / "tune"
    # a narrower space from the command line; lr stays fixed (removed from the space)
    argv = ["tune", "kd", "--task", "sst2", "--teacher", str(tiny_models["teacher"]), "--student",
            str(tiny_models["student"]), "--output", str(out), "--sampler-seed", "3", "--space", "lr=none",
            "--space", "alpha=float:0.2:0.4"]
    tiny = [f"{k}={v}" for k, v in TINY_RUN.items()]
    args, extra = parser.parse_known_args(argv + ["--trials", "2"] + tiny)
    args.overrides = extra
    assert args.handler(args) == 0
    study = optuna.load_study(study_name="kd-sst2", storage=make_storage(f"sqlite:///{out / 'study.db'}"))
    assert [t.state.name for t in study.trials] == ["COMPLETE", "COMPLETE"]
    assert all(0.2 <= t.params["alpha"] <= 0.4 and "lr" not in t.params for t in study.trials)
    for trial in study.trials:  # the objective is the main dev metric of the trial's result.json
        record = json.loads((Path(trial.user_attrs["run_dir"]) / "result.json").read_text())
        assert record["metrics"]["acc"] == trial.value and record["label"] == f"kd-sst2-t{trial.number}"

    args, extra = parser.parse_known_args(argv + ["--trials", "3"] + tiny)
    args.overrides = extra
    assert args.handler(args) == 0
    study = optuna.load_study(study_name="kd-sst2", storage=make_storage(f"sqlite:///{out / 'study.db'}"))
    assert len(study.trials) == 3  # resumed: one more trial, not three
    best = yaml.safe_load((out / "best_config.yaml").read_text())
    assert best["method"] == "kd" and best["method_params"]["alpha"] == study.best_params["alpha"]
    assert best["train"]["lr"] == TINY_RUN["lr"] and "output" not in best and "label" not in best
    assert (out / "optimization_history.png").stat().st_size > 1000


def test_tune_exits_1_and_says_so_when_fewer_trials_than_asked_finished(tmp_path, tiny_models, capsys):
    """Every trial fails at run time (its training file is missing): the study ends with no finished
    trial, `kdbench tune` exits 1 naming the counts, and each failed trial names its own run folder."""
    from kdbench.cli import main

    out = tmp_path / "tune"
    tiny = [f"{k}={v}" for k, v in TINY_RUN.items()]
    code = main(["tune", "kd", "--task", "sst2", "--teacher", str(tiny_models["teacher"]), "--student",
                 str(tiny_models["student"]), "--output", str(out), "--trials", "2", "--sampler-seed", "0",
                 "--space", "lr=none", *tiny, f"train_file={tmp_path / 'missing.tsv'}"])
    assert code == 1
    err = capsys.readouterr().err
    assert "kdbench tune: study 'kd-sst2': no trial completed of 2 asked" in err and "'FAIL': 2" in err
    study = optuna.load_study(study_name="kd-sst2", storage=f"sqlite:///{out / 'study.db'}")
    run_dirs = {t.user_attrs["run_dir"] for t in study.trials}
    assert len(run_dirs) == 2  # one folder per trial, not the trials/ parent
    assert [trial.state.name for trial in study.trials] == ["FAIL", "FAIL"]
    for run_dir in run_dirs:
        # A missing data file is the user's input error: the run leaves no folder behind (issue 18).
        assert not Path(run_dir).exists()
