"""Paper tables: every named table renders from the published numbers alone, the printed averages
recompute from their rows, runs land on the right rows, cells aggregate seeds as documented."""

from __future__ import annotations

from pathlib import Path

import pandas as pd
import pytest

from kdbench import tables
from kdbench.plugins import TABLES
from kdbench.registry import UnknownNameError
from kdbench.tables import MISSING, TableError, build_table, load_spec, recompute_averages, render

SHARED_TABLES = Path(__file__).resolve().parents[3] / "shared" / "paper_tables"
NAMED = ["tinybert-v5-table1", "tinybert-v5-table2", "tinybert-v5-table3", "tinybert-v5-table4",
         "tinybert-v5-table6", "mobilebert-table4", "mobilebert-table5", "mobilebert-table8", "mobilebert-table9",
         "distilbert-table1", "distilbert-table1-early", "distilbert-table4", "pkd-table1", "pkd-table2"]


def test_registry_lists_every_spec():
    assert sorted(TABLES.names()) == sorted(tables.table_names()) == sorted(NAMED + ["cross-method"])
    assert TABLES.get("pkd-table2").description.startswith("BERT-PKD Table 2")


@pytest.mark.parametrize("name", NAMED)
def test_renders_from_published_alone(name):
    spec = load_spec(name)
    table = build_table(name, None)
    published = tables.load_published(spec.published)
    n_paper_rows = sum(1 for r in spec.rows if r.model is not None)
    paper_rows = [r for r in table.rows if r[1] == "paper"]
    ours_rows = [r for r in table.rows if r[1] == "ours"]
    assert len(paper_rows) == n_paper_rows and len(ours_rows) == len(spec.rows)
    blank = {MISSING} | ({"ref"} if spec.average and spec.average.relative_to else set())  # a delta's reference
    assert all(cell in blank for r in ours_rows for cell in r[2:])  # measured columns empty
    # every printed cell is the CSV's value as printed (with † when uncertain); nothing becomes 0
    for row_spec, row in zip([r for r in spec.rows if r.model is not None], paper_rows):
        for col, cell in zip(spec.columns, row[2:]):
            hit = published[(published.model == row_spec.model) & (published.task == col.task)
                            & (published.metric == col.metric)]
            if row_spec.setting:
                hit = hit[hit.setting == row_spec.setting]
            if hit.empty:
                assert cell == MISSING
            else:
                assert cell == hit.iloc[0]["printed"] + ("†" if hit.iloc[0]["uncertain"] else "")
    for fmt in tables.FORMATS:
        text = render(table, fmt)
        assert paper_rows[0][0].replace("_", "\\_" if fmt == "latex" else "_") in text


def test_tinybert_table1_known_cells():
    table = build_table("tinybert-v5-table1")
    row = next(r for r in table.rows if r[0] == "TinyBERT4" and r[1] == "paper")
    assert row[2:] == ["14.5", "1.2", "9.4", "82.5", "81.8", "71.3†", "87.7", "92.6", "44.1", "80.4†", "86.4†",
                       "66.6", "77.0"]
    pkd6 = next(r for r in table.rows if r[0] == "BERT6-PKD" and r[1] == "paper")
    assert pkd6[table.header.index("CoLA")] == MISSING and pkd6[table.header.index("Avg")] == MISSING


# (DistilBERT's Table 4 prints differences from a row whose task scores are not published: nothing to recompute)
AVERAGED = [n for n in NAMED if load_spec(n).average is not None and load_spec(n).average.recompute
            and load_spec(n).average.relative_to is None]


@pytest.mark.parametrize("name", AVERAGED)
def test_published_averages_recompute_from_rows(name):
    spec = load_spec(name)
    results = recompute_averages(spec)
    assert results, f"{name}: no printed average found"
    checked = [r for r in results if r["recomputed"] is not None]
    assert checked
    for r in checked:
        if r["model"] in spec.average.known_mismatches:
            assert r["agrees"] is False, f"{name}/{r['model']}: listed as a known mismatch but recomputes"
        else:
            assert r["agrees"], f"{name}/{r['model']}: printed {r['printed']} vs recomputed {r['recomputed']:.3f}"


def test_average_conventions_pinned():
    by_model = {r["model"]: r for r in recompute_averages(load_spec("tinybert-v5-table1"))}
    # 9 columns, MNLI-m and -mm both: (83.9+83.4+71.1+90.9+93.4+52.8+85.2+87.5+67.0)/9
    assert by_model["BERT_BASE (Teacher)"]["recomputed"] == pytest.approx(715.2 / 9)
    assert "BERT6-PKD" not in by_model  # the paper prints no average (CoLA/STS-B missing)
    assert len(by_model) == 9 and all(r["agrees"] for r in by_model.values())
    abl = {r["model"]: r for r in recompute_averages(load_spec("tinybert-v5-table2"))}
    assert abl["TinyBERT4"]["recomputed"] == pytest.approx((82.8 + 82.9 + 85.8 + 50.8) / 4)  # 75.6 in v5
    early = {r["model"]: r for r in recompute_averages(load_spec("distilbert-table1-early"))}
    # macro-score: 9 columns incl. WNLI, MNLI matched only
    assert early["DistilBERT"]["recomputed"] == pytest.approx(691.2 / 9)
    later = {r["model"]: r for r in recompute_averages(load_spec("distilbert-table1"))}
    assert later["BERT-base"]["agrees"] is False and later["BERT-base"]["recomputed"] == pytest.approx(717.5 / 9)
    assert load_spec("mobilebert-table4").average.recompute is False  # leaderboard score, not a row mean


@pytest.mark.skipif(not SHARED_TABLES.is_dir(), reason="shared/paper_tables not present")
def test_published_copies_match_shared_sources():
    ours = sorted(p.name for p in tables.published_dir().glob("*.csv"))
    theirs = sorted(p.name for p in SHARED_TABLES.glob("*.csv"))
    assert ours == theirs
    for name in ours:
        assert (tables.published_dir() / name).read_bytes() == (SHARED_TABLES / name).read_bytes(), name
    frame = tables.load_published()
    assert {"source", "uncertain", "note"} <= set(frame.columns)
    assert frame["uncertain"].dtype == bool and frame["uncertain"].any()


# --- runs onto rows ---------------------------------------------------------------------------------


def _cell(table, row, header, source="ours"):
    r = next(r for r in table.rows if r[0] == row and r[1] == source)
    return r[table.header.index(header)]


def test_selectors_labels_specificity_and_seeds(run, runs_frame, recorded_run, tmp_path):
    full = dict(mapping="uniform", no_embd=False, no_attn=False, no_hidn=False, no_trm=False, no_pred=False)
    # the table reports MRPC's accuracy-best evaluation (TinyBERT's rule), read from the run's folder
    mrpc_run = recorded_run(tmp_path / "mrpc", "mrpc", [{"step": 10, "acc": 85.0, "f1": 89.0}])
    runs = runs_frame(
        run("tinybert", "mnli", {"acc": 80.0, "acc_mm": 81.0}, seed=1, method_params=full),
        run("tinybert", "mnli", {"acc": 82.0, "acc_mm": 83.0}, seed=2, method_params=full),
        # same seed twice (a sweep): the best dev score of seed 2 is kept
        run("tinybert", "mnli", {"acc": 70.0, "acc_mm": 70.0}, seed=2, method_params=full),
        run("tinybert", "mrpc", {"acc": 85.0, "f1": 89.0}, method_params=full, run_dir=str(mrpc_run)),
        run("tinybert", "cola", {"mcc": 40.0}, method_params=full),
        run("tinybert", "mnli", {"acc": 75.0, "acc_mm": 76.0}, method_params={**full, "no_attn": True}),
        run("kd", "mnli", {"acc": 60.0}, label="wo-hidn"),  # a label wins over everything
        run("tinybert", "cola", {"mcc": 99.0}, status="failed", method_params=full),
        run("pkd", "mnli", {"acc": 1.0}),  # matches no row
    )
    table = build_table("tinybert-v5-table3", runs)
    assert _cell(table, "TinyBERT4", "MNLI-m") == "81.0 ± 1.4"  # seeds 80 and 82: mean 81, sample std 1.41
    assert _cell(table, "TinyBERT4", "MNLI-mm") == "82.0 ± 1.4"
    assert _cell(table, "TinyBERT4", "MRPC") == "85.0"  # MRPC accuracy in the ablation tables
    assert _cell(table, "TinyBERT4", "CoLA") == "40.0"  # the failed 99.0 never enters
    assert _cell(table, "TinyBERT4", "Avg") == f"{(81 + 82 + 85 + 40) / 4:.1f}"
    assert _cell(table, "w/o Attn", "MNLI-m") == "75.0" and _cell(table, "w/o Attn", "Avg") == MISSING
    assert _cell(table, "w/o Hidn", "MNLI-m") == "60.0"
    assert _cell(table, "w/o Embd", "MNLI-m") == MISSING
    notes = " ".join(table.notes)
    assert "1 failed run(s)" in notes and "1 completed run(s) match no row" in notes and "pkd/mnli" in notes
    m = table.measured[("TinyBERT4", "MNLI-m")]
    assert (m.n, m.runs, m.mean) == (2, 3, 81.0) and m.std == pytest.approx(2 ** 0.5)
    assert "2 cell(s) keep the best dev score" in notes and "TinyBERT4: MNLI-m" in notes


def test_equal_specificity_is_an_error(run, runs_frame):
    runs = runs_frame(run("tinybert", "mnli", {"acc": 1.0}, method_params={"no_attn": True, "no_hidn": True}))
    with pytest.raises(TableError, match="matches rows .*wo-attn.*wo-hidn.*label"):
        build_table("tinybert-v5-table3", runs)


def test_a_leaderboard_score_gets_no_measured_mean(run, runs_frame):
    """MobileBERT Table 4's GLUE column is the leaderboard score (recompute: false): it is not a mean
    of the row, so a mean of our dev cells must not appear under its header."""
    tasks = {"cola": {"mcc": 50.0}, "sst2": {"acc": 90.0}, "mrpc": {"f1": 85.0}, "stsb": {"spearman": 80.0},
             "qqp": {"f1": 70.0}, "mnli": {"acc": 80.0, "acc_mm": 81.0}, "qnli": {"acc": 88.0}, "rte": {"acc": 65.0}}
    rows = [run("pkd", t, m, student="bert-6l-768") for t, m in tasks.items()]
    table = build_table("mobilebert-table4", runs_frame(*rows))
    assert _cell(table, "BERT_BASE-6L-PKD", "RTE") == "65.0"  # every averaged cell is measured ...
    assert _cell(table, "BERT_BASE-6L-PKD", "GLUE") == MISSING  # ... and still no "GLUE" of ours
    assert ("BERT_BASE-6L-PKD", "GLUE") not in table.measured


def test_teacher_role_students_list_and_distilbert_macro_score(run, runs_frame, tmp_path):
    teacher_dir = tmp_path / "finetune-teacher"
    (teacher_dir / "model").mkdir(parents=True)
    tasks = {"cola": {"mcc": 50.0}, "mnli": {"acc": 80.0, "acc_mm": 81.0}, "mrpc": {"f1": 88.0, "acc": 84.0},
             "qnli": {"acc": 90.0}, "qqp": {"acc": 89.0, "f1": 85.0}, "rte": {"acc": 65.0}, "sst2": {"acc": 92.0},
             "stsb": {"spearman": 86.0, "pearson": 87.0}}
    rows = [run("finetune", t, m, student="bert-base", run_dir=str(teacher_dir)) for t, m in tasks.items()]
    rows.append(run("distilbert", "sst2", {"acc": 90.0}, student="bert-6l-768", teacher=str(teacher_dir / "model")))
    table = build_table("distilbert-table1", runs_frame(*rows))
    assert _cell(table, "BERT-base", "SST-2") == "92.0"
    assert _cell(table, "BERT-base", "Score") == MISSING  # WNLI not run: the 9-task macro-score needs it
    rows.append(run("finetune", "wnli", {"acc": 56.0}, student="bert-base", run_dir=str(teacher_dir)))
    table = build_table("distilbert-table1", runs_frame(*rows))
    expected = (50 + 80 + 88 + 90 + 89 + 65 + 92 + 86 + 56) / 9  # MNLI matched only, QQP acc, MRPC F1
    assert _cell(table, "BERT-base", "Score") == f"{expected:.1f}"
    pkd = build_table("pkd-table1", runs_frame(run("pkd", "rte", {"acc": 60.0}, student="teacher-3l")))
    assert _cell(pkd, "BERT3-PKD", "RTE") == "60.0"


def test_measured_size_columns_from_run_model_config(run, runs_frame, tmp_path):
    from transformers import BertConfig

    run_dir = tmp_path / "tinybert-run"
    (run_dir / "model").mkdir(parents=True)
    BertConfig(num_hidden_layers=4, hidden_size=312, intermediate_size=1200, num_attention_heads=12).to_json_file(
        run_dir / "model" / "config.json")
    teacher = tmp_path / "teacher"
    teacher.mkdir()
    BertConfig().to_json_file(teacher / "config.json")
    runs = runs_frame(run("tinybert", "sst2", {"acc": 90.0}, run_dir=str(run_dir), teacher=str(teacher),
                          student="tinybert-4l-312"))
    table = build_table("tinybert-v5-table1", runs)
    assert _cell(table, "TinyBERT4", "#Params (M)") == "14.6"  # with TinyBERT's W_h projection 312 -> 768
    assert _cell(table, "TinyBERT4", "#FLOPs (B)") == "1.2"
    assert _cell(table, "TinyBERT4", "Speed-up") == MISSING  # timing only with --latency
    assert _cell(table, "TinyBERT4", "SST-2") == "90.0"


def test_cross_method_table(run, runs_frame):
    runs = runs_frame(
        run("tinybert", "mnli", {"acc": 80.0, "acc_mm": 82.0}, seed=1),
        run("tinybert", "mnli", {"acc": 82.0, "acc_mm": 84.0}, seed=2),
        run("tinybert", "rte", {"acc": 60.0}),
        run("kd", "rte", {"acc": 55.0}, student="teacher-3l"),
        run("finetune", "rte", {"acc": 1.0}, status="failed"),
    )
    table = build_table("cross-method", runs)
    assert table.header[:7] == ["Method", "Student", "Teacher", "MNLI-m", "MNLI-mm", "RTE", "Avg (ours)"]
    tiny = next(r for r in table.rows if r[0] == "tinybert")
    assert tiny[3:7] == ["81.0 ± 1.4", "83.0 ± 1.4", "60.0", f"{(81 + 83 + 60) / 3:.1f}"]
    assert tiny[7] == "77.0 (TinyBERT4, v5 T1, GLUE test)"
    kd = next(r for r in table.rows if r[0] == "kd")
    assert kd[3:7] == [MISSING, MISSING, "55.0", MISSING] and kd[7] == MISSING
    # the same student distilled from another teacher is another row
    runs2 = runs_frame(run("kd", "rte", {"acc": 55.0}, teacher="/x/teacher-a/model"),
                       run("kd", "rte", {"acc": 65.0}, teacher="/x/teacher-b/model"))
    assert [r[2] for r in build_table("cross-method", runs2).rows] == ["teacher-a", "teacher-b"]
    assert not any(r[0] == "finetune" for r in table.rows)
    assert "1 failed run(s) not shown" in " ".join(table.notes)


def test_renderers_escape_and_unknown_inputs(run, runs_frame):
    table = build_table("tinybert-v5-table4", None)
    latex = render(table, "latex")
    assert r"\begin{tabular}" in latex and r"g(m)=m+N-M" in latex and "--" in latex and "–" not in latex
    html = render(table, "html")
    assert html.count("<tr>") == len(table.rows) + 1 + len(table.notes)
    csv_text = render(table, "csv")
    assert pd.read_csv(__import__("io").StringIO(csv_text)).shape == (len(table.rows), len(table.header))
    md = render(table, "markdown")
    assert md.splitlines()[2].startswith("| Model") and "| paper  |" in md
    with pytest.raises(TableError, match="format 'rst'"):
        render(table, "rst")
    with pytest.raises(UnknownNameError, match="did you mean 'pkd-table1'"):
        load_spec("pkd-tabel1")


def test_bad_spec_errors_name_the_problem(tmp_path):
    bad = tmp_path / "bad.yaml"
    bad.write_text("name: bad\npublished: pkd_table2_last_vs_skip.csv\ncolumns:\n  - {header: X, task: RTE, "
                   "metric: acc, run: rte}\nrows: []\n")
    with pytest.raises(TableError, match="run 'rte' must look like 'task/metric'"):
        load_spec(str(bad))
    bad.write_text("name: bad\npublished: pkd_table2_last_vs_skip.csv\ncolums: []\n")
    with pytest.raises(TableError, match="unknown key colums=.*did you mean 'columns'"):
        load_spec(str(bad))
    # Specs are built like run configs: declared field constraints and typed values, one line each.
    bad.write_text("name: bad\npublished: pkd_table2_last_vs_skip.csv\ncolumns:\n  - {header: X, decimals: -1}\n")
    with pytest.raises(TableError, match=r"bad.yaml: columns\[0\].decimals: must be >= 0, got -1"):
        load_spec(str(bad))
    bad.write_text("name: bad\nkind: cross-method\ntasks: [sst2, imdb]\n")
    with pytest.raises(TableError, match="tasks: must be one of .*, got 'imdb' in"):
        load_spec(str(bad))
    bad.write_text("name: bad\ncolumns: []\n")
    with pytest.raises(TableError, match="bad.yaml: published: missing"):
        load_spec(str(bad))
    bad.write_text("name: bad\npublished: pkd_table2_last_vs_skip.csv\ncolumns:\n  - {header: RTE, task: RTE, "
                   "metric: acc}\nrows:\n  - {key: x, model: No Such Model}\n")
    with pytest.raises(TableError, match="'No Such Model'"):
        build_table(str(bad))


def test_cli_table_and_list(capsys, tmp_path):
    from kdbench.cli import main

    assert main(["list", "tables"]) == 0
    assert "tinybert-v5-table1\t" in capsys.readouterr().out
    out_file = tmp_path / "t.tex"
    assert main(["table", "pkd-table2", "--format", "latex", "--output", str(out_file)]) == 0
    assert "BERT6 (PKD-Skip)" in capsys.readouterr().out and out_file.read_text().startswith(r"\begin{table}")
    assert main(["table", "no-such-table"]) == 2
    assert "unknown table 'no-such-table'" in capsys.readouterr().err


def test_cli_table_with_record_files(tmp_path, capsys):
    from kdbench.cli import main
    from kdbench.records import SCHEMA_VERSION, write_json_atomic

    for seed, acc in ((1, 70.0), (2, 72.0)):
        write_json_atomic(tmp_path / f"pkd-{seed}" / "result.json", {
            "schema_version": SCHEMA_VERSION, "method": "pkd", "task": "rte", "student": "teacher-3l",
            "label": "pkd-skip", "seed": seed, "status": "completed", "metrics": {"acc": acc},
            "config": {"method_params": {"strategy": "skip"}}})
    assert main(["table", "pkd-table2", "--runs", str(tmp_path), "--format", "csv"]) == 0
    frame = pd.read_csv(__import__("io").StringIO(capsys.readouterr().out))
    ours = frame[(frame.Model == "BERT6 (PKD-Skip)") & (frame.Source == "ours")].iloc[0]
    assert ours["RTE"] == "71.0 ± 1.4" and ours["SST-2"] == MISSING


def test_upstream_selector_and_alternatives(run, runs_frame, recorded_run, tmp_path):
    kt = dict(use_fmt=True, use_at=True, use_pd=False, progressive_schedule="code")
    # MobileBERT's tables report each run's evaluation at the end of training, read from its folder
    folders = {score: str(recorded_run(tmp_path / str(score), "sst2", [{"step": 30, "acc": score}]))
               for score in (79.1, 80.0, 73.3)}
    runs = runs_frame(
        # a knowledge-transfer run on the corpus, later moved: its finetune names the old path
        run("mobilebert", "corpus", {}, student="mobilebert-6l-384", run_dir="/new/kt-joint/mobilebert-corpus-c6b8",
            method_params={"strategy": "joint", **kt}),
        run("finetune", "sst2", {"acc": 79.1}, student="/old/kt-joint/mobilebert-corpus-c6b8/model",
            run_dir=folders[79.1]),
        run("mobilebert", "sst2", {"acc": 80.0}, student="mobilebert-6l-384", run_dir=folders[80.0],
            method_params={"strategy": "auxiliary", **kt}),  # directly on the task: the first alternative
        run("finetune", "sst2", {"acc": 73.3}, student="mobilebert-6l-384", run_dir=folders[73.3]),
    )
    table = build_table("mobilebert-table8", runs)
    assert _cell(table, "JKT (joint knowledge transfer)", "SST-2") == "79.1"
    assert _cell(table, "AKT (auxiliary knowledge transfer)", "SST-2") == "80.0"
    notes = " ".join(table.notes)
    # the bare finetune matches no row and is named; the corpus run is an upstream stage, not "unmatched"
    assert "1 completed run(s) match no row" in notes and "finetune/sst2/mobilebert-6l-384" in notes
    bare = build_table("mobilebert-table9", runs)
    assert _cell(bare, "MobileBERT (bare)", "SST-2") == "73.3"


def test_paired_difference_by_hand():
    from kdbench.tables.building import paired_difference

    row = {"A": {1: 10.0, 2: 14.0}, "B": {1: 50.0, 2: 52.0, 3: 99.0}, "C": {1: 7.0}}
    reference = {"A": {1: 8.0, 2: 10.0}, "B": {1: 50.0, 2: 50.0, 3: 70.0}, "D": {1: 1.0}}
    delta, columns = paired_difference(row, reference, ["A", "B", "C", "D"])
    # only A and B were run by both; seed 3 lacks A: seed 1 -> (2 + 0) / 2 = 1, seed 2 -> (4 + 2) / 2 = 3
    assert columns == ["A", "B"]
    assert (delta.mean, delta.n) == (2.0, 2) and delta.std == pytest.approx(2 ** 0.5)
    assert delta.format(2, signed=True) == "+2.00 ± 1.41"
    # a column run on one seed so far is left out rather than cutting A and B down to that seed:
    # {A, B} pair 2 x 2 = 4 runs, {A, B, E} only 3 x 1
    row["E"], reference["E"] = {1: 30.0}, {1: 0.0}
    delta, columns = paired_difference(row, reference, ["A", "B", "E"])
    assert columns == ["A", "B"] and (delta.mean, delta.n) == (2.0, 2)
    # once E has both seeds, all three columns pair 3 x 2 = 6 runs: seed 1 -> (2 + 0 + 30) / 3, seed 2 -> (4 + 2 + 0) / 3
    row["E"][2], reference["E"][2] = 5.0, 5.0
    delta, columns = paired_difference(row, reference, ["A", "B", "E"])
    assert columns == ["A", "B", "E"] and delta.mean == pytest.approx((32 / 3 + 6 / 3) / 2)
    assert paired_difference(row, {"A": {"?": 1.0}}, ["A"]) == (None, ["A"])  # unknown seeds never pair
    assert paired_difference(row, {}, ["A"]) == (None, [])


def test_distilbert_table4_prints_deltas_from_the_triple_loss(run, runs_frame, recorded_run, tmp_path):
    """Each cell is the fine-tuning's evaluation at the end of training (the spec's `last`): every run
    below scored 5 points more at an earlier epoch and kept that one, which the table must not show."""
    scores = {"triple-loss": {1: (12.0, 55.0), 2: (14.0, 56.0)}, "wo-cos": {1: (9.0, 55.0), 2: (10.0, 53.0)}}
    rows = []
    for label, by_seed in scores.items():
        for seed, values in by_seed.items():
            for (task, metric), last in zip((("cola", "mcc"), ("rte", "acc")), values):
                folder = recorded_run(tmp_path / f"{label}-{task}-{seed}", task,
                                      [{"step": 10, metric: last + 5.0}, {"step": 30, metric: last}])
                rows.append(run("finetune", task, {metric: last + 5.0}, seed=seed, label=label,
                                student="/runs/x/model", run_dir=str(folder)))
    table = build_table("distilbert-table4", runs_frame(*rows))
    assert _cell(table, "triple loss + teacher init", "CoLA") == "13.0 ± 1.4"
    assert _cell(table, "triple loss + teacher init", "Δ macro-score") == "ref"
    # seed 1: (9 - 12 + 55 - 55) / 2 = -1.5; seed 2: (10 - 14 + 53 - 56) / 2 = -3.5
    assert _cell(table, "w/o L_cos", "Δ macro-score") == "-2.5 ± 1.4"
    assert _cell(table, "w/o L_cos", "Δ macro-score", source="paper") == "-1.46†"
    assert _cell(table, "w/o L_mlm", "Δ macro-score") == MISSING
    assert "w/o L_cos: CoLA, RTE" in " ".join(table.notes)  # ours covers 2 of the paper's 9 tasks


def test_difference_column_must_name_a_row():
    from kdbench.tables.specs import spec_from_mapping

    spec = {"name": "t", "published": "distilbert_table4_ablation.csv", "columns": [{"header": "RTE", "run": "rte/acc"}],
            "average": {"header": "Δ", "task": "GLUE", "metric": "delta_macro_score", "over": ["RTE"],
                        "relative_to": "baseline"},
            "rows": [{"key": "wo-cos"}]}
    with pytest.raises(TableError, match="relative_to 'baseline' is not a row key"):
        spec_from_mapping(spec, "t.yaml")


def test_cross_method_rows_group_by_the_teachers_sweep_role_not_its_folder(tmp_path, run, runs_frame):
    """A `${finetune-teacher}` sweep over two tasks: each task has its own teacher folder, all made
    by one stage, so each method is one row and its average is filled."""
    from kdbench.sweep import expand, write_manifest

    spec = {"name": "roles", "output": str(tmp_path / "sweep"),
            "stages": {"finetune-teacher": {"method": "finetune", "task": "${task}", "student": "bert-base-uncased"}},
            "grid": {"methods": {"kd": {"teacher": "${finetune-teacher}"}, "pkd": {"teacher": "${finetune-teacher}"}},
                     "tasks": ["sst2", "rte"], "seeds": [1], "student": "tinybert-4l-312"}}
    sweep = expand(spec)
    write_manifest(sweep, "slurm", None)
    teachers = {sweep.runs[f"finetune-teacher-{t}"].values["task"]: str(sweep.runs[f"finetune-teacher-{t}"].run_dir)
                for t in ("sst2", "rte")}
    assert len(set(teachers.values())) == 2  # one fine-tuned teacher per task
    scores = {("kd", "sst2"): 90.0, ("kd", "rte"): 60.0, ("pkd", "sst2"): 88.0, ("pkd", "rte"): 64.0}
    runs = runs_frame(*[run(method, task, {"acc": score}, seed=1, teacher=sweep.runs[f"{method}-{task}-s1"].values["teacher"],
                            run_dir=str(sweep.runs[f"{method}-{task}-s1"].run_dir))
                        for (method, task), score in scores.items()])
    table = build_table("cross-method", runs)
    assert table.header[3:6] == ["SST-2", "RTE", "Avg (ours)"]
    assert [r[:6] for r in table.rows] == [["kd", "tinybert-4l-312", "finetune-teacher", "90.0", "60.0", "75.0"],
                                           ["pkd", "tinybert-4l-312", "finetune-teacher", "88.0", "64.0", "76.0"]]


def test_cross_method_names_a_student_made_by_a_stage_and_gives_the_corpus_stage_no_row(tmp_path, run, runs_frame):
    """TinyBERT GD + TD from exported records: the GD stage trained on a corpus (no dev score, no
    column) is named in a note instead of an empty row, and the cells that start from its model show
    the stage's role as their student, not its hashed folder."""
    import json

    from kdbench.tables.building import STAGE_ROLES_FILE, _exported_roles

    records = tmp_path / "records"
    records.mkdir()
    stage, teacher = "tinybert-corpus-344a670b2c54", "finetune-rte-0c0dc24bac9b"
    (records / STAGE_ROLES_FILE).write_text(json.dumps({stage: "general-distillation", teacher: "teacher"}))
    _exported_roles.cache_clear()
    runs = runs_frame(
        run("tinybert", "corpus", {}, student="teacher-3l-192", run_dir=str(records / stage), teacher="minilm-l6"),
        *[run("tinybert", "rte", {"acc": score}, seed=seed, label="gd-td", student=f"/gone/{stage}/model",
              teacher=f"/gone/{teacher}/model", run_dir=str(records / f"tinybert-rte-00000000000{seed}"))
          for seed, score in ((1, 54.0), (2, 56.0))])
    table = build_table("cross-method", runs)
    assert [row[:4] for row in table.rows] == [["tinybert [gd-td]", "general-distillation", "teacher", "55.0 ± 1.4"]]
    assert "1 completed run(s) on a task with no column here, so in no row: tinybert/corpus/teacher-3l-192" in table.notes


def test_a_teacher_record_is_named_as_the_stage_it_is_not_as_a_stray_run(tmp_path, run, runs_frame):
    """A paper table's exported records include the teachers its cells read. They are inputs, not
    runs that failed to find their row: the note says which stage each is, and still names a run
    that really matches no row."""
    import json

    from kdbench.tables.building import STAGE_ROLES_FILE, _exported_roles

    records = tmp_path / "records"
    records.mkdir()
    teacher = "finetune-rte-0c0dc24bac9b"
    (records / STAGE_ROLES_FILE).write_text(json.dumps({teacher: "teacher"}))
    _exported_roles.cache_clear()
    runs = runs_frame(
        run("finetune", "rte", {"acc": 59.2}, student="minilm-l6", run_dir=str(records / teacher)),
        run("pkd", "rte", {"acc": 55.0}, student="teacher-3l", label="pkd-skip", teacher=f"/gone/{teacher}/model",
            run_dir=str(records / "pkd-rte-000000000001"), method_params={"strategy": "skip"}),
        run("kd", "sst2", {"acc": 80.0}, student="teacher-3l", run_dir=str(records / "kd-sst2-000000000002")),
    )
    notes = build_table("pkd-table2", runs).notes
    assert "1 stage run(s) that this table's cells read, not rows of it: teacher: finetune/rte/minilm-l6" in notes
    assert "1 completed run(s) match no row of this table: kd/sst2/teacher-3l" in notes


def test_a_cell_whose_seeds_read_different_teacher_weights_is_marked_and_named(run, runs_frame):
    """A teacher retrained on another processor writes other weights (the study's STS-B teacher: three
    kinds, three digests); a cell averaging seeds that read two of them mixes two setups, so it is
    marked and the footnote names the cell and both digests. Seeds reading one teacher, or records
    without weights_sha256, are not marked; the mean is the same either way."""
    def seeds(teachers: list[str | None], **fields) -> list[dict]:
        rows = []
        for seed, teacher in enumerate(teachers, start=1):
            row = run("tinybert", "stsb", {"spearman": 38.0 + seed}, seed=seed, label="tinybert4", **fields)
            row["weights_sha256"] = {"teacher": teacher, "model": f"{seed:064x}"} if teacher else None
            rows.append(row)
        return rows

    intel, amd = "a974c46ad30f" + "0" * 52, "43607bbbe6f5" + "1" * 52
    mixed = build_table("cross-method", runs_frame(*seeds([amd, amd, intel])))
    cell = next(r for r in mixed.rows if r[0] == "tinybert [tinybert4]")[3]
    assert cell == "40.0 ± 1.0 ‡"
    note = next(n for n in mixed.notes if n.startswith("‡"))
    assert "tinybert [tinybert4] / STS-B: 2 teacher weights (43607bbbe6f5…, a974c46ad30f…)" in note

    for teachers in ([amd, amd, amd], [None, None, None]):
        same = build_table("cross-method", runs_frame(*seeds(teachers)))
        assert next(r for r in same.rows if r[0] == "tinybert [tinybert4]")[3] == "40.0 ± 1.0"
        assert not any(n.startswith("‡") for n in same.notes)

    full = dict(mapping="uniform", no_embd=False, no_attn=False, no_hidn=False, no_trm=False, no_pred=False)
    paper = runs_frame(*[{**row, "task": "cola", "metric.mcc": row["metric.spearman"], "label": None,
                          "config": {**row["config"], "task": "cola", "method_params": full}}
                         for row in seeds([amd, intel, intel])])
    table = build_table("tinybert-v5-table3", paper)
    assert _cell(table, "TinyBERT4", "CoLA") == "40.0 ± 1.0 ‡"
    assert any("TinyBERT4 / CoLA: 2 teacher weights" in n for n in table.notes)
