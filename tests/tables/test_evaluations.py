"""Which dev evaluation a table reports (kdbench.evaluations): the rules, the re-selection from a
run's recorded evaluations, and the invariant it rests on, checked on the study's committed records."""

from __future__ import annotations

import json
from pathlib import Path

import pandas as pd
import pytest

from kdbench.config import ConfigError
from kdbench.evaluations import EvaluationRule, reselect, select_evaluation
from kdbench.records import load_records
from kdbench.tables import TableError, build_table, load_spec
from kdbench.tables.specs import spec_from_mapping

REPO = Path(__file__).resolve().parents[2]
STUDY_RECORDS = REPO / "results" / "reproduction"

# MRPC: F1 is best at step 10 (the "always paraphrase" epoch), accuracy at step 20 and again at 30.
MRPC_EVALS = [{"step": 10, "acc": 68.38, "f1": 81.22}, {"step": 20, "acc": 71.0, "f1": 80.1},
              {"step": 30, "acc": 71.0, "f1": 79.5}]


def test_rules_parse_and_a_bad_rule_names_itself():
    assert EvaluationRule.parse("best:acc") == EvaluationRule("best", "acc")
    assert EvaluationRule.parse(" last ") == EvaluationRule("last")
    assert str(EvaluationRule.parse("best:f1")) == "best:f1"
    for bad in ("best:", "first", "acc"):
        with pytest.raises(ConfigError, match=repr(bad)):
            EvaluationRule.parse(bad)


def test_best_keeps_the_first_of_equal_scores_and_last_must_be_the_final_step():
    assert select_evaluation(MRPC_EVALS, EvaluationRule.parse("best:acc"), 30)["step"] == 20  # tie at 30 loses
    assert select_evaluation(MRPC_EVALS, EvaluationRule.parse("best:f1"), 30)["step"] == 10
    assert select_evaluation(MRPC_EVALS, EvaluationRule.parse("last"), 30)["step"] == 30
    with pytest.raises(ConfigError, match="step 30, not at the end of training \\(step 45\\)"):
        select_evaluation(MRPC_EVALS, EvaluationRule.parse("last"), 45)
    with pytest.raises(ConfigError, match="no 'mcc'"):
        select_evaluation(MRPC_EVALS, EvaluationRule.parse("best:mcc"), 30)


def test_reselect_replaces_every_metric_of_the_run_with_the_chosen_evaluation(tmp_path, recorded_run):
    recorded_run(tmp_path / "runs" / "mrpc-run", "mrpc", MRPC_EVALS)
    recorded_run(tmp_path / "runs" / "cola-run", "cola", [{"step": 30, "mcc": 12.0, "f1": 0.0}])
    frame = load_records(tmp_path / "runs")
    assert set(frame["metric.acc"].dropna()) == {68.38}  # the run kept its F1-best evaluation
    out = reselect(frame, {"mrpc": EvaluationRule.parse("best:acc"), "cola": EvaluationRule.parse("kept")})
    mrpc = out[out["task"] == "mrpc"].iloc[0]
    assert (mrpc["metric.acc"], mrpc["metric.f1"], mrpc["evaluation_step"]) == (71.0, 80.1, 20)
    assert out[out["task"] == "cola"].iloc[0]["metric.mcc"] == 12.0
    assert frame[frame["task"] == "mrpc"].iloc[0]["metric.f1"] == 81.22  # the input is left as it was
    last = reselect(frame, {"mrpc": EvaluationRule.parse("last")})
    assert last[last["task"] == "mrpc"].iloc[0]["metric.f1"] == 79.5


def test_reselect_names_a_run_without_recorded_evaluations(tmp_path, recorded_run):
    recorded_run(tmp_path / "runs" / "mrpc-run", "mrpc", MRPC_EVALS)
    (tmp_path / "runs" / "mrpc-run" / "loss_terms.jsonl").unlink()
    frame = load_records(tmp_path / "runs")
    with pytest.raises(ConfigError, match="mrpc-run.*recorded no dev evaluation"):
        reselect(frame, {"mrpc": EvaluationRule.parse("best:acc")})
    untouched = reselect(frame, {"mrpc": EvaluationRule.parse("best:acc")}, only=[])
    assert untouched.drop(columns="evaluation_step").equals(frame)


def test_tinybert_tables_report_the_accuracy_best_mrpc_evaluation(tmp_path, recorded_run):
    """TinyBERT's task_distill.py keeps MRPC's accuracy-best evaluation; a run kept the F1-best one."""
    assert load_spec("tinybert-v5-table3").evaluation_rules()["mrpc"] == EvaluationRule("best", "acc")
    for seed, shift in ((1, 0.0), (2, 2.0)):
        evaluations = [{**e, "acc": e["acc"] + shift} for e in MRPC_EVALS]
        recorded_run(tmp_path / "runs" / f"mrpc-{seed}", "mrpc", evaluations, seed=seed)
    table = build_table("tinybert-v5-table3", tmp_path / "runs")
    measured = table.measured[("TinyBERT4", "MRPC")]
    assert measured.mean == pytest.approx(72.0) and measured.n == 2  # (71 + 73) / 2, not the kept 68.38 / 70.38
    assert any("mrpc: the evaluation with the best acc" in note for note in table.notes)


def test_mobilebert_tables_report_the_end_of_training():
    rules = load_spec("mobilebert-table8").evaluation_rules()
    assert {task: str(rule) for task, rule in rules.items()} == dict.fromkeys(("mnli", "qnli", "mrpc", "sst2", "squad"), "last")


def test_pkd_table_reports_the_accuracy_best_mrpc_evaluation(tmp_path, recorded_run, run, runs_frame):
    """BERT-PKD's NLI_KD_training.py logs dev accuracy each epoch and its result summaries keep the
    accuracy-best epoch; a run kept the F1-best one (MRPC_EVALS: F1 best at step 10, accuracy at 20)."""
    folder = recorded_run(tmp_path / "pkd-mrpc", "mrpc", MRPC_EVALS)
    kept = max(MRPC_EVALS, key=lambda e: e["f1"])
    frame = runs_frame(run("pkd", "mrpc", {"f1": kept["f1"], "acc": kept["acc"]}, seed=1, label="pkd-skip",
                           run_dir=str(folder)))
    table = build_table("pkd-table2", frame)
    assert table.measured[("BERT6 (PKD-Skip)", "MRPC acc")].mean == pytest.approx(71.0)
    assert table.measured[("BERT6 (PKD-Skip)", "MRPC F1")].mean == pytest.approx(80.1)


def test_a_bad_rule_in_a_spec_is_an_error_naming_the_task():
    spec = {"name": "t", "published": "x.csv", "columns": [{"header": "MRPC", "run": "mrpc/acc"}],
            "rows": [{"key": "a"}], "evaluation": {"mrpc": "best"}}
    with pytest.raises(TableError, match="evaluation.mrpc.*'best'"):
        spec_from_mapping(spec, "t.yaml")


def test_committed_records_reselected_on_their_own_metric_equal_what_the_runs_kept():
    """The invariant re-selection rests on: a run's kept metrics are its recorded evaluation that is
    best on its selection metric (the first of equal ones). Checked on every committed study record
    of a task that evaluated (the early MRPC teacher recorded no evaluations; corpus stages have none)."""
    checked = 0
    frame = pd.concat([load_records(folder) for folder in sorted(STUDY_RECORDS.glob("*/records"))],
                      ignore_index=True)
    for index, run in frame.iterrows():
        record = json.loads((Path(run["run_dir"]) / "result.json").read_text())
        kept = (record["stages"][-1].get("metrics") or {}) if record.get("stages") else {}
        if run["status"] != "completed" or len(kept) != 1 or not (Path(run["run_dir"]) / "loss_terms.jsonl").is_file():
            continue
        metric = next(iter(kept)).removeprefix("eval_")
        out = reselect(frame, {run["task"]: EvaluationRule("best", metric)}, only=[index]).loc[index]
        assert {k: out[f"metric.{k}"] for k in record["metrics"]} == record["metrics"], run["run_dir"]
        checked += 1
    assert checked >= 390  # 397 at the commit that added this test
