"""Tuning pieces without training: search-space parsing, suggestions, storage, pruning, study
preparation, heartbeat retries, plots."""

from __future__ import annotations

import time
from types import SimpleNamespace

import optuna
import pytest
from optuna.trial import TrialState

from kdbench import tuning
from kdbench.config import ConfigError
from kdbench.search_space import Choice, FloatRange, IntRange

optuna.logging.set_verbosity(optuna.logging.WARNING)


@pytest.mark.parametrize("text, expected", [
    ("float:0.1:0.9", FloatRange(0.1, 0.9)),
    ("float:1e-5:1e-3:log", FloatRange(1e-5, 1e-3, True)),
    ("int:2:6", IntRange(2, 6)),
    ("int:2:8:2", IntRange(2, 8, 2)),
    ("choice:1,2.5,four", Choice((1, 2.5, "four"))),
    ("none", None),
])
def test_parse_dimension(text, expected):
    assert tuning.parse_dimension("x", text) == expected


@pytest.mark.parametrize("text, message", [
    ("float:0.9:0.1", "low must be < high"),
    ("float:0:1:log", "log range needs low > 0"),
    ("float:0.1:0.9:lin", "must be 'log'"),
    ("uniform:0:1", "expected float:LOW:HIGH"),
    ("int:1:5:0", "step must be > 0"),
])
def test_bad_dimensions_name_the_value(text, message):
    with pytest.raises(ConfigError, match="x=") as error:
        tuning.parse_dimension("x", text)
    assert message in str(error.value)


def test_space_overrides_yaml_then_cli():
    declared = {"alpha": FloatRange(0.1, 0.9), "temperature": Choice((1.0, 2.0)), "lr": FloatRange(1e-5, 1e-4, True)}
    yaml_space = {"alpha": {"low": 0.2, "high": 0.4}, "temperature": None, "layers": {"low": 2, "high": 4}}
    space = tuning.resolve_space(declared, yaml_space, ["lr=float:1e-4:1e-3:log", "beta=choice:10,100"])
    assert space == {"alpha": FloatRange(0.2, 0.4), "lr": FloatRange(1e-4, 1e-3, True),
                     "layers": IntRange(2, 4), "beta": Choice((10, 100))}
    with pytest.raises(ConfigError, match="search space is empty"):
        tuning.resolve_space({}, None, [])
    with pytest.raises(ConfigError, match="expected NAME=SPEC"):
        tuning.resolve_space(declared, None, ["alpha"])


def test_keys_the_user_fixed_are_not_searched_unless_asked():
    declared = {"alpha": FloatRange(0.1, 0.9), "lr": FloatRange(1e-5, 1e-4, True)}
    assert tuning.resolve_space(declared, None, [], fixed={"learning_rate", "epochs"}) == {"alpha": FloatRange(0.1, 0.9)}
    assert tuning.resolve_space(declared, None, ["lr=float:1e-4:1e-3"], fixed={"lr"})["lr"] == FloatRange(1e-4, 1e-3)


def test_yaml_round_trip_and_midpoint():
    space = {"a": FloatRange(1e-4, 1e-2, True), "b": IntRange(2, 6, 2), "c": Choice(("x", "y")), "d": FloatRange(0, 1)}
    back = {n: tuning.dimension_from_mapping(n, v) for n, v in tuning.space_to_yaml(space).items()}
    assert back == space
    mid = tuning.space_midpoint(space)
    assert mid["a"] == pytest.approx(1e-3) and mid["b"] == 2 and mid["c"] == "x" and mid["d"] == 0.5


def test_suggest_uses_optuna_distributions():
    space = {"a": FloatRange(1e-4, 1e-2, True), "b": IntRange(2, 6, 2), "c": Choice(("x", "y"))}
    study = optuna.create_study(sampler=optuna.samplers.RandomSampler(seed=0))
    trial = study.ask()
    values = tuning.suggest(trial, space)
    dists = trial.distributions
    assert isinstance(dists["a"], optuna.distributions.FloatDistribution) and dists["a"].log
    assert dists["b"].step == 2 and values["b"] in (2, 4, 6)
    assert dists["c"].choices == ("x", "y") and values["c"] in ("x", "y")


def test_kd_declares_its_search_space():
    from kdbench.plugins import METHODS

    space = METHODS.get("kd")().search_space()
    assert {"alpha", "temperature", "lr"} <= set(space)


def test_storages(tmp_path):
    from optuna.storages import JournalStorage, RDBStorage

    assert isinstance(tuning.make_storage(str(tmp_path / "s.journal")), JournalStorage)
    assert isinstance(tuning.make_storage(f"journal:{tmp_path / 'x'}"), JournalStorage)
    assert isinstance(tuning.make_storage(f"sqlite:///{tmp_path / 's.db'}"), RDBStorage)
    with pytest.raises(ConfigError, match="--storage 'study.txt'"):
        tuning.make_storage("study.txt")


def test_pruning_callback_reports_every_evaluation_and_prunes(tmp_path):
    study = optuna.create_study(direction="maximize", pruner=tuning.make_pruner("median"))
    for good in (80.0, 90.0):  # two finished trials with high intermediate values
        trial = study.ask()
        callback = tuning.pruning_callback(trial, "eval_acc")
        for step in (1, 2):
            callback.on_evaluate(None, SimpleNamespace(global_step=step), None, metrics={"eval_acc": good})
        study.tell(trial, good)
    trial = study.ask()
    callback = tuning.pruning_callback(trial, "eval_acc")
    callback.on_evaluate(None, None, None, metrics={"eval_loss": 1.0})  # not the watched metric: ignored
    callback.on_evaluate(None, None, None, metrics={"eval_acc": 10.0})  # evaluation 1: warm-up, kept
    assert callback.evaluations == 1
    with pytest.raises(optuna.TrialPruned, match="pruned at evaluation 2 \\(eval_acc=10\\)"):
        callback.on_evaluate(None, None, None, metrics={"eval_acc": 10.0})
    assert trial.storage.get_trial(trial._trial_id).intermediate_values == {1: 10.0, 2: 10.0}


def test_prepare_study_creates_once_and_fails_stale_running_trials(tmp_path):
    spec = tuning.TuneSpec("s", str(tmp_path / "s.journal"), {"method": "kd"}, {"alpha": {"low": 0.1, "high": 0.9}},
                           str(tmp_path), "acc")
    study = tuning.prepare_study(spec)
    study.tell(study.ask(), 1.0)
    study.ask()  # a worker that died mid-trial leaves it RUNNING
    again = tuning.prepare_study(spec)  # resuming: same study, stale trial failed
    states = [t.state for t in again.trials]
    assert states == [TrialState.COMPLETE, TrialState.FAIL]
    assert tuning.finished_trials(again) == 1
    assert again.user_attrs["base"] == {"method": "kd"}


@pytest.mark.filterwarnings("ignore:Heartbeat of storage is supposed to be used with Study.optimize")
def test_with_a_heartbeat_only_a_dead_workers_trial_is_failed_and_queued_again(tmp_path):
    """A database storage with a heartbeat (1 s, grace 2 s): a trial whose worker beats is left
    running by a re-run; once silent past the grace period it is failed and retried with the same
    parameters, and the retry knows the original trial's number (which picks the run folder)."""
    spec = tuning.TuneSpec("s", f"sqlite:///{tmp_path / 's.db'}", {"method": "kd"},
                           {"alpha": {"low": 0.1, "high": 0.9}}, str(tmp_path), "acc",
                           heartbeat=tuning.Heartbeat(interval_s=1, grace_s=2, max_retry=1))
    study = tuning.prepare_study(spec)
    trial = study.ask()
    alpha = trial.suggest_float("alpha", 0.1, 0.9)
    study._storage.record_heartbeat(trial._trial_id)  # what a live worker's heartbeat thread does
    again = tuning.prepare_study(spec)  # the driver re-run while the worker lives
    assert [t.state for t in again.trials] == [TrialState.RUNNING]
    time.sleep(3)  # the worker died: no beat for longer than the grace period
    again = tuning.prepare_study(spec)
    assert [t.state for t in again.trials] == [TrialState.FAIL, TrialState.WAITING]
    retry = again.ask()
    assert retry.params == {"alpha": alpha} and tuning.original_trial_number(retry) == trial.number == 0
    assert retry.number == 1


def test_plots_are_written(tmp_path):
    study = optuna.create_study(direction="maximize", sampler=optuna.samplers.RandomSampler(seed=1))
    study.optimize(lambda t: t.suggest_float("a", 0, 1) * 10 + t.suggest_float("b", 0, 1), n_trials=6)
    files = tuning.save_plots(study, tmp_path)
    for name in ("optimization_history", "param_importances"):
        data = (tmp_path / f"{name}.png").read_bytes()
        assert data[:8] == b"\x89PNG\r\n\x1a\n" and len(data) > 5000
        assert files[name] == str(tmp_path / f"{name}.png")


def test_worker_seeds_differ_across_workers_and_resumes():
    seeds = {tuning.worker_seed(0, worker, existing) for worker in (0, 1, 2) for existing in (0, 3, 8)}
    assert len(seeds) == 9
    assert tuning.worker_seed(None, 1, 5) is None


def test_local_tuning_workers_each_see_one_of_the_drivers_gpus(tmp_path, monkeypatch):
    """Real local worker jobs (their function swapped for one that reports the variable they started with)."""
    import os

    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "1,2")
    monkeypatch.setattr(tuning, "TuneWorker", lambda: os.getenv)
    jobs = tuning._submit_tuning_workers(SimpleNamespace(study_name="s"), ["CUDA_VISIBLE_DEVICES"] * 2, "local",
                                         tmp_path, "local")
    assert [job.result() for job in jobs] == ["1", "2"]
