"""The study's overview (``results/reproduction/verdicts.md``): every table's claims on one page,
the verdicts counted per paper and the training behind them, pinned on hand-made records."""

from __future__ import annotations

import json

import pytest

from kdbench.claims import HOLDS, Claim, ClaimResult, PairedDifference
from kdbench.cli import EXIT_BAD_INPUT, main
from kdbench.reproduce import SPEC_FOLDER, TABLE_ROWS
from kdbench.reproduce.overview import OVERVIEW_FILE, overview_markdown, overview_text, training_summary

SKIP_LAST = Claim("BERT-PKD", "PKD-skip beats PKD-last", "pkd-skip-3l", "pkd-last-3l")
DA = Claim("TinyBERT", "data augmentation helps", "tinybert4", "gd-td")


def _result(claim: Claim, task: str, metric: str, better: dict[int, float], worse: dict[int, float]) -> ClaimResult:
    difference = PairedDifference.of(better, worse)
    return ClaimResult(claim, task, metric, better, worse, difference, difference.verdict)


def test_committed_records_rerender_to_the_committed_overview():
    assert overview_text(SPEC_FOLDER) == (SPEC_FOLDER / OVERVIEW_FILE).read_text()


def test_each_cell_gives_the_verdict_and_the_mean_difference_and_says_when_seeds_are_missing():
    results = {"cross-method": [
        # differences 1.0, 1.5, 1.0, 1.0, 1.0: mean 1.10, std 0.22, se 0.10
        _result(SKIP_LAST, "mrpc", "f1", {1: 82.0, 2: 83.0, 3: 82.5, 4: 82.0, 5: 83.0},
                {1: 81.0, 2: 81.5, 3: 81.5, 4: 81.0, 5: 82.0}),
        _result(DA, "stsb", "spearman", {1: 37.74, 2: 40.87, 3: 38.38}, {1: 21.77, 2: 19.22, 3: 19.91, 4: 20.0}),
        _result(DA, "rte", "acc", {1: 52.71, 2: 52.71}, {1: 52.71, 2: 52.71}),
    ]}
    lines = overview_markdown(results).splitlines()
    header = next(line for line in lines if line.startswith("| paper | claim | table |"))
    assert header == "| paper | claim | table | SST-2 | CoLA | STS-B | MRPC | RTE | SQuAD1.1 F1 |"
    assert "| BERT-PKD | PKD-skip beats PKD-last | [cross-method](cross-method/claims.md) | n/a | n/a | n/a | **holds** +1.10 | n/a | n/a |" in lines
    # STS-B: differences 15.97, 21.65, 18.47 on the 3 seeds both rows have, of the study's 5; RTE: both at one score.
    assert ("| TinyBERT | data augmentation helps | [cross-method](cross-method/claims.md) | n/a | n/a | **holds** +18.70 [3/5] | n/a "
            "| no signal [2/5] | n/a |") in lines


def test_a_test_two_tables_print_on_one_metric_is_counted_once_and_on_two_metrics_twice():
    same_runs = {1: 82.0, 2: 83.0, 3: 82.5}, {1: 81.0, 2: 81.5, 3: 81.5}
    results = {"cross-method": [_result(SKIP_LAST, "mrpc", "f1", *same_runs), _result(SKIP_LAST, "rte", "acc", *same_runs)],
               "pkd-skip-last": [_result(SKIP_LAST, "mrpc", "acc", *same_runs), _result(SKIP_LAST, "rte", "acc", *same_runs)]}
    tally = overview_markdown(results).split("**Verdicts per paper**")[1].splitlines()
    # mrpc/f1, mrpc/acc and rte/acc: three tests, all holding.
    assert "| BERT-PKD | 3 | 3 | 0 | 0 | 0 | 0 | 0 | 0 |" in tally
    assert "| all | 3 | 3 | 0 | 0 | 0 | 0 | 0 | 0 |" in tally
    assert all(r.verdict == HOLDS for rs in results.values() for r in rs)


def test_one_metric_on_other_evaluations_is_two_tests():
    """Table 1 keeps MRPC's F1-best evaluation and BERT-PKD's Table 2 its accuracy-best one: the same
    claim, task and metric, other scores per seed, so a verdict of one table must not hide the other's."""
    f1_best = {1: 82.0, 2: 83.0, 3: 82.5}, {1: 81.0, 2: 81.5, 3: 81.5}  # holds
    acc_best = {1: 82.0, 2: 81.0, 3: 82.5}, {1: 81.0, 2: 81.5, 3: 81.5}  # within noise (seed 2 negative)
    results = {"cross-method": [_result(SKIP_LAST, "mrpc", "f1", *f1_best)],
               "pkd-skip-last": [_result(SKIP_LAST, "mrpc", "f1", *acc_best)]}
    tally = overview_markdown(results).split("**Verdicts per paper**")[1].splitlines()
    assert "| BERT-PKD | 2 | 1 | 0 | 1 | 0 | 0 | 0 | 0 |" in tally


def _record(folder, name, created_at, seconds, status="completed"):
    (folder / name).mkdir(parents=True)
    (folder / name / "result.json").write_text(json.dumps({
        "schema_version": 1, "method": "finetune", "task": "mrpc", "student": "teacher-3l", "config": {},
        "metrics": {}, "status": status, "created_at": created_at, "train_seconds": seconds}))


def test_training_is_counted_once_per_training_however_many_tables_keep_its_record(tmp_path):
    table_1, table_2 = tmp_path / "t1" / "records", tmp_path / "t2" / "records"
    _record(table_1, "teacher-mrpc-aaa", "2026-11-26T10:00:00", 1800.0)
    _record(table_2, "teacher-mrpc-aaa", "2026-11-26T10:00:00", 1800.0)  # the same training, shared
    _record(table_1, "teacher-mlm-bbb", "2026-11-27T02:42:29", 900.0)
    _record(table_2, "teacher-mlm-bbb", "2026-12-01T21:20:41", 720.0)  # another training of that run
    _record(table_2, "kd-3l-ccc", "2026-11-28T00:00:00", 5400.0, status="interrupted")
    from kdbench.records import load_records

    summary = training_summary([load_records(table_1), load_records(table_2), None])  # None: a table with no records
    # 1800 + 900 + 720 s = 0.95 h; the interrupted run is not a completed training.
    assert summary.startswith("Compute: 3 completed trainings of 2 runs (1 of them a second training")
    assert "0.95 hours of training" in summary


def test_all_renders_every_table_then_the_overview(tmp_path, capsys):
    assert main(["reproduce", "all", "--render-only", "--no-plots", "--spec-dir", str(tmp_path)]) == 0
    assert sorted(p.parent.name for p in tmp_path.glob("*/table.md")) == sorted(TABLE_ROWS)
    overview = (tmp_path / OVERVIEW_FILE).read_text()
    assert overview in capsys.readouterr().out
    assert "| all | 123 | 0 | 0 | 0 | 0 | 0 | 0 | 123 |" in overview  # no records: every test not run
    assert "Compute: 0 completed trainings of 0 runs, 0.00 hours" in overview


@pytest.mark.parametrize("argv, named", [
    (["reproduce", "all", "--records", "/tmp/one-folder"], "--records '/tmp/one-folder'"),
    (["reproduce", "all", "--only", "kd-3l-*"], "--only 'kd-3l-*'"),
    (["reproduce", "cross-methods", "--render-only"], "unknown reproduction table 'cross-methods'"),
])
def test_bad_arguments_are_named_before_anything_runs(argv, named, tmp_path, capsys):
    assert main([*argv, "--spec-dir", str(tmp_path)]) == EXIT_BAD_INPUT
    assert named in capsys.readouterr().err
    assert list(tmp_path.iterdir()) == []
