"""``kdbench compare``: one row of runs against another, paired by seed, on records written to disk;
verdicts pinned on hand-computed differences."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from kdbench.cli import EXIT_BAD_INPUT, main
from kdbench.compare import compare_rows
from kdbench.config import ConfigError


def _record(folder: Path, name: str, *, method: str, task: str, seed: int, evaluations: list[dict],
            label: str | None = None, created_at: str = "2026-12-06T10:00:00", teacher_sha: str | None = None) -> Path:
    """A completed run whose last stage evaluated ``evaluations`` (``{"step", metric: value}``) and kept
    the last one."""
    run_dir = folder / name
    run_dir.mkdir(parents=True)
    kept = {k: v for k, v in evaluations[-1].items() if k != "step"}
    record = {"schema_version": 1, "status": "completed", "method": method, "task": task, "label": label,
              "seed": seed, "student": "teacher-3l", "metrics": kept, "created_at": created_at,
              "config": {"method": method, "task": task, "method_params": {}},
              "stages": [{"name": "distil", "steps": evaluations[-1]["step"], "metrics": {}}]}
    if teacher_sha:
        record["weights_sha256"] = {"teacher": teacher_sha}
    (run_dir / "result.json").write_text(json.dumps(record))
    (run_dir / "loss_terms.jsonl").write_text("".join(
        json.dumps({"stage": "distil", "step": e["step"], "eval": {k: v for k, v in e.items() if k != "step"}}) + "\n"
        for e in evaluations))
    return run_dir


@pytest.fixture
def two_rows(tmp_path):
    """An unlabelled new method (named by its method) and a labelled KD row on RTE, seeds 1-3, in two
    folders; the KD runs are also exported to a second folder, as tables that share runs hold them."""
    mine, baselines, copies = tmp_path / "mine", tmp_path / "baselines", tmp_path / "copies"
    for seed, (acc, kd_acc) in enumerate([(60.0, 58.0), (61.0, 58.5), (62.0, 60.0)], start=1):
        _record(mine, f"cosine-cls-rte-s{seed}", method="cosine-cls", task="rte", seed=seed,
                evaluations=[{"step": 10, "acc": acc - 5}, {"step": 20, "acc": acc}])
        for folder in (baselines, copies):
            _record(folder, f"kd-rte-s{seed}", method="kd", task="rte", seed=seed, label="kd-3l",
                    evaluations=[{"step": 10, "acc": kd_acc + 1}, {"step": 20, "acc": kd_acc}])
    return tmp_path


def test_a_new_method_is_compared_with_a_baseline_seed_by_seed(two_rows, capsys):
    folders = [str(two_rows / "mine"), str(two_rows / "baselines"), str(two_rows / "copies")]
    assert main(["compare", "cosine-cls", "kd-3l", *[f"--runs={folder}" for folder in folders]]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[0] == "| task | metric | cosine-cls | kd-3l | difference (paired) | verdict |"
    # Differences 2.0, 2.5, 2.0: mean 2.17, std 0.29, se 0.17; kd-3l's copies count once (3 seeds, not 6).
    assert lines[2] == ("| rte | acc | 61.00 ± 1.00 (3 seeds) | 58.83 ± 1.04 (3 seeds) | +2.17 ± 0.29 (se 0.17) "
                        "| holds |")


def test_another_recorded_evaluation_can_be_compared(two_rows):
    # best:acc picks each run's first evaluation for kd-3l (59.0, 59.5, 61.0) and the last for cosine-cls:
    # differences 1.0, 1.5, 1.0 -> mean 1.17, still positive on every seed.
    [result] = compare_rows("cosine-cls", "kd-3l", [str(two_rows / "mine"), str(two_rows / "baselines")],
                            evaluations={"rte": "best:acc"})
    assert result.worse == {1: 59.0, 2: 59.5, 3: 61.0}
    assert result.difference.mean == pytest.approx(7 / 6) and result.verdict == "holds"


def test_rows_that_read_different_teachers_get_no_verdict(tmp_path):
    for seed in (1, 2):
        _record(tmp_path, f"a-{seed}", method="kd", task="rte", seed=seed, label="a", teacher_sha="aaa",
                evaluations=[{"step": 1, "acc": 60.0 + seed}])
        _record(tmp_path, f"b-{seed}", method="kd", task="rte", seed=seed, label="b", teacher_sha="bbb",
                evaluations=[{"step": 1, "acc": 50.0}])
    [result] = compare_rows("a", "b", [str(tmp_path)])
    assert result.difference.mean == pytest.approx(11.5) and result.verdict == "teachers differ"


def test_two_trainings_of_one_seed_are_named_instead_of_one_being_picked(two_rows):
    _record(two_rows / "baselines", "kd-rte-s1-again", method="kd", task="rte", seed=1, label="kd-3l",
            created_at="2026-12-07T10:00:00", evaluations=[{"step": 20, "acc": 70.0}])
    with pytest.raises(ConfigError, match=r"row 'kd-3l' has 2 completed runs of rte seed 1 \(.*kd-rte-s1, "
                                          r".*kd-rte-s1-again\)"):
        compare_rows("cosine-cls", "kd-3l", [str(two_rows / "mine"), str(two_rows / "baselines")])


@pytest.mark.parametrize("argv, named", [
    (["cosine-cls", "pkd"], "row 'pkd' has no completed run under"),
    (["cosine-cls", "kd-3l", "--task", "mrpc"], "--task 'mrpc': row 'cosine-cls' has no completed run on it"),
    (["cosine-cls", "kd-3l", "--metric", "rte=f1"], "--metric rte=f1: row 'cosine-cls' recorded no 'f1' on 'rte'"),
    (["cosine-cls", "kd-3l", "--evaluation", "rtee=best:acc"], "--evaluation rtee=best:acc: 'rtee' is not a compared task"),
    (["kd-3l", "kd-3l"], "compare a row with another one: both are 'kd-3l'"),
    (["cosine-cls", "kd-3l", "--metric", "rte"], "--metric 'rte': expected TASK=VALUE"),
    (["cosine-cls", "kd-3l", "--evaluation", "rte=best-acc"], "evaluation.rte:"),
])
def test_bad_input_is_named(two_rows, argv, named, capsys):
    runs = ["--runs", str(two_rows / "mine"), "--runs", str(two_rows / "baselines")]
    assert main(["compare", *argv, *runs]) == EXIT_BAD_INPUT
    assert named in capsys.readouterr().err


def test_a_row_of_several_students_is_refused(two_rows):
    """An unlabelled sweep's teacher stage and its student cells share a method; as one row they
    would pair a teacher with students."""
    _record(two_rows / "mine", "cosine-cls-teacher", method="cosine-cls", task="rte", seed=42,
            evaluations=[{"step": 20, "acc": 66.0}])
    record = two_rows / "mine" / "cosine-cls-teacher" / "result.json"
    record.write_text(record.read_text().replace('"student": "teacher-3l"', '"student": "minilm-l6"'))
    with pytest.raises(ConfigError, match=r"row 'cosine-cls' holds runs of 2 students \(minilm-l6, teacher-3l\)"):
        compare_rows("cosine-cls", "kd-3l", [str(two_rows / "mine"), str(two_rows / "baselines")])


def test_one_stage_read_from_two_checkouts_is_one_student(two_rows):
    """The study's TinyBERT4 cells name their GD stage's model by absolute path, which differs between
    the checkouts that trained them: a folder is the student its run names, not its location."""
    for seed, checkout in ((1, "/work/a"), (2, "/work/b"), (3, "/scratch/c")):
        record = two_rows / "mine" / f"cosine-cls-rte-s{seed}" / "result.json"
        record.write_text(record.read_text().replace('"student": "teacher-3l"',
                                                     f'"student": "{checkout}/runs/tinybert-corpus-344a670b2c54/model"'))
    [result] = compare_rows("cosine-cls", "kd-3l", [str(two_rows / "mine"), str(two_rows / "baselines")])
    assert result.difference.n == 3


def test_rows_without_a_common_seed_or_with_a_seed_written_two_ways_are_named(two_rows):
    _record(two_rows / "mine", "other-s7", method="other", task="rte", seed=7, evaluations=[{"step": 1, "acc": 1.0}])
    with pytest.raises(ConfigError, match=r"rows 'other' and 'kd-3l' share no seed on rte \(seeds \[7\] and \[1, 2, 3\]\)"):
        compare_rows("other", "kd-3l", [str(two_rows / "mine"), str(two_rows / "baselines")])
    # a hand-written record with seed "1" is seed 1: a second training of it, not a seed of its own
    record = _record(two_rows / "mine", "cosine-cls-rte-s1-by-hand", method="cosine-cls", task="rte", seed=1,
                     evaluations=[{"step": 20, "acc": 90.0}]) / "result.json"
    record.write_text(record.read_text().replace('"seed": 1', '"seed": "1"'))
    with pytest.raises(ConfigError, match="row 'cosine-cls' has 2 completed runs of rte seed 1"):
        compare_rows("cosine-cls", "kd-3l", [str(two_rows / "mine"), str(two_rows / "baselines")])


def test_a_metric_only_one_row_recorded_is_named_with_that_row(two_rows):
    record = two_rows / "baselines" / "kd-rte-s1" / "result.json"
    for folder in ("baselines",):
        for seed in (1, 2, 3):
            path = two_rows / folder / f"kd-rte-s{seed}" / "result.json"
            path.write_text(path.read_text().replace('"metrics": {"acc"', '"metrics": {"f1": 40.0, "acc"'))
    assert '"f1": 40.0' in record.read_text()
    with pytest.raises(ConfigError, match="row 'cosine-cls' recorded no 'f1' on 'rte'"):
        compare_rows("cosine-cls", "kd-3l", [str(two_rows / "mine"), str(two_rows / "baselines")], metrics={"rte": "f1"})


def test_a_run_without_a_score_is_named_instead_of_leaving_its_seed_out(two_rows):
    path = two_rows / "mine" / "cosine-cls-rte-s2" / "result.json"
    path.write_text(path.read_text().replace('"metrics": {"acc": 61.0}', '"metrics": {"acc": NaN}'))
    with pytest.raises(ConfigError, match=r"1 run\(s\) have no 'acc' on rte to compare \(.*cosine-cls-rte-s2\)"):
        compare_rows("cosine-cls", "kd-3l", [str(two_rows / "mine"), str(two_rows / "baselines")])
