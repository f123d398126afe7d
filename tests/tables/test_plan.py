"""A study's plan marks every empty measured cell with why it is empty: pending (planned, no completed
record), n/a (the row cannot run the task, with its reason) or – (not in the study, with why), and a
cell short of its planned seeds says how many it has."""

from __future__ import annotations

from kdbench.tables import MISSING, build_table
from kdbench.tables.plan import NOT_APPLICABLE, PENDING, PlannedRow, StudyPlan

PLAN = StudyPlan(
    rows=(PlannedRow("uniform", ("mrpc", "cola", "rte")), PlannedRow("top", ("mrpc", "cola", "rte")),
          PlannedRow("bottom", ("mrpc", "cola"), not_run_reason="no bottom layers on RTE in this test")),
    seeds={"mrpc": 3, "cola": 3, "rte": 3}, not_in_study="MNLI is too large here", pending_where="see the README")


def _cell(table, row: str, column: str) -> str:
    index = table.header.index(column)
    return next(r[index] for r in table.rows if r[0] == row and r[1] == "ours")


def test_paper_table_marks_each_empty_cell_with_its_reason(run, runs_frame):
    full = dict(mapping="uniform", no_embd=False, no_attn=False, no_hidn=False, no_trm=False, no_pred=False)
    runs = runs_frame(*[run("tinybert", "cola", {"mcc": value}, seed=seed, method_params=full)
                        for seed, value in ((1, 10.0), (2, 12.0), (3, 14.0))],
                      run("tinybert", "rte", {"acc": 55.0}, seed=1, method_params=full),
                      run("tinybert", "rte", {"acc": 57.0}, seed=2, method_params=full))
    table = build_table("tinybert-v5-table4", runs, plan=PLAN)
    assert _cell(table, "Uniform (g(m)=3m)", "CoLA") == "12.0 ± 2.0"  # all 3 planned seeds: no mark
    assert _cell(table, "Uniform (g(m)=3m)", "RTE") == "56.0 ± 1.4 [2/3]"
    assert _cell(table, "Uniform (g(m)=3m)", "MRPC") == PENDING
    assert _cell(table, "Top (g(m)=m+N-M)", "CoLA") == PENDING
    assert _cell(table, "Bottom (g(m)=m)", "RTE") == NOT_APPLICABLE
    assert _cell(table, "Bottom (g(m)=m)", "MNLI-m") == MISSING  # a task the study does not run
    notes = " ".join(table.notes)
    assert "pending = a cell the study runs that has no completed record yet (6 cell(s) in 3 row(s)); see the README" in notes
    assert "n/a = the row does not run on that task (bottom: no bottom layers on RTE in this test)" in notes
    assert "– = not in the study: MNLI is too large here" in notes
    assert "[n/N] = measured on n of the N seeds the study runs (the others are pending); see the README" in notes
    assert "Avg stays –: the paper averages MNLI-m, MNLI-mm too" in notes
    assert "not reported (paper)" in notes and "not reported / not run" not in notes


def test_without_a_plan_an_empty_cell_stays_a_dash(run, runs_frame):
    table = build_table("tinybert-v5-table4", runs_frame(run("tinybert", "rte", {"acc": 55.0}, seed=1)))
    assert _cell(table, "Uniform (g(m)=3m)", "MRPC") == MISSING
    assert "not reported / not run" in " ".join(table.notes)
    assert not any("pending" in cell for row in table.rows for cell in row)


def test_cross_method_table_shows_planned_rows_and_tasks_no_run_has_reached(run, runs_frame):
    plan = StudyPlan(rows=(PlannedRow("kd-3l", ("rte", "squad"), method="kd", student="teacher-3l", teacher="teacher"),
                           PlannedRow("pkd-skip-3l", ("rte",), method="pkd", student="teacher-3l", teacher="teacher",
                                      not_run_reason="a span head"),
                           PlannedRow("teacher", ("rte", "squad"), method="finetune", student="minilm-l6", seeds=1)),
                     seeds={"rte": 5, "squad": 3}, not_in_study="-")
    runs = runs_frame(*[run("kd", "rte", {"acc": 55.0 + seed}, student="teacher-3l", label="kd-3l", seed=seed)
                        for seed in range(1, 6)])
    table = build_table("cross-method", runs, plan=plan)
    assert table.header[3:5] == ["RTE", "SQuAD1.1 F1"]  # SQuAD: planned, though nothing ran on it yet
    rows = {row[0]: row for row in table.rows}
    assert rows["kd [kd-3l]"][3:5] == ["58.0 ± 1.6", PENDING]
    assert rows["pkd [pkd-skip-3l]"][1:5] == ["teacher-3l", "teacher", PENDING, NOT_APPLICABLE]
    assert rows["finetune [teacher]"][1:5] == ["minilm-l6", MISSING, PENDING, PENDING]
    notes = " ".join(table.notes)
    assert "(4 cell(s) in 3 row(s))" in notes and "pkd-skip-3l: a span head" in notes
