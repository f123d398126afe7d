"""The reproduction study's committed records re-render to its committed tables, and its generated
specs are what kdbench.reproduce generates today (a study is results, not a test: nothing trains here)."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from kdbench.reproduce import SPEC_FOLDER, TABLE_ROWS, build_spec, records_folder, render

TABLES = sorted(TABLE_ROWS)


@pytest.mark.parametrize("table", TABLES)
def test_committed_spec_is_the_generated_one(table):
    committed = yaml.safe_load((SPEC_FOLDER / f"{table}.yaml").read_text())
    assert committed == yaml.safe_load(yaml.safe_dump(build_spec(table)))


@pytest.mark.parametrize("table", TABLES)
def test_committed_records_rerender_to_the_committed_table(table, tmp_path):
    committed = records_folder(table)
    records = committed if committed.is_dir() else tmp_path / "no-records"  # git keeps no empty folder
    records.mkdir(exist_ok=True)
    out = render(table, records, tmp_path / "table.md")
    assert out.read_text() == (committed.parent / "table.md").read_text()
    assert (tmp_path / "claims.md").read_text() == (committed.parent / "claims.md").read_text()


def test_cells_of_one_row_share_its_label_and_have_distinct_names():
    spec = build_spec("cross-method")
    names = [cell["name"] for cell in spec["cells"]]
    assert len(names) == len(set(names))
    rte_rows = {cell["label"] for cell in spec["cells"] if cell["task"] == "rte"}
    assert {"finetune-3l", "kd-3l", "pkd-skip-3l", "pkd-last-3l", "distilbert-3l", "tinybert-td-3l",
            "finetune-3l-192", "kd-3l-192", "tinybert-td-3l-192", "tinybert-gd-td-3l-192", "mobilebert-pkt"} == rte_rows
    wide = next(cell for cell in spec["cells"] if cell["label"] == "kd-3l")
    # Students start from the pre-trained MiniLM, never from the fine-tuned teacher they are compared with.
    assert wide["student_init_from"] == "minilm-l6" and wide["teacher"] == f"${{teacher-{wide['task']}}}"
    assert Path(SPEC_FOLDER).name == "reproduction"


def test_quickstart_search_rerenders_from_its_committed_records():
    from kdbench.quickstart import render_search

    folder = SPEC_FOLDER / "quickstart"
    assert render_search(folder / "search") + "\n" == (folder / "search.md").read_text()


def test_quickstart_run_rerenders_from_its_committed_records():
    from kdbench.quickstart import compare_folder, format_comparison

    folder = SPEC_FOLDER / "quickstart" / "run"
    assert format_comparison(compare_folder(folder)) + "\n" == (folder / "comparison.md").read_text()


def test_pkd_table_runs_exactly_table_one_pkd_cells():
    """Table 3 shares table 1's PKD runs: identical cells, so identical run folders and one training."""
    cross = {cell["name"]: cell for cell in build_spec("cross-method")["cells"]}
    pkd = build_spec("pkd-skip-last")["cells"]
    assert {cell["label"] for cell in pkd} == {"pkd-skip-3l", "pkd-last-3l"}
    assert len(pkd) == 2 * 23 and all(cell == cross[cell["name"]] for cell in pkd)


@pytest.mark.parametrize("table", ["pkd-skip-last", "tinybert-objectives", "tinybert-mappings"])
def test_rows_shared_with_table_one_are_its_very_cells(table):
    cross = {cell["name"]: cell for cell in build_spec("cross-method")["cells"]}
    shared = [cell for cell in build_spec(table)["cells"] if cell["name"] in cross]
    assert shared and all(cell == cross[cell["name"]] for cell in shared)


def test_tinybert_ablations_switch_one_thing_off_on_four_tasks():
    cells = build_spec("tinybert-objectives")["cells"]
    assert {cell["task"] for cell in cells} == {"cola", "sst2", "mrpc", "rte"}
    wo_attn = next(cell for cell in cells if cell["label"] == "tinybert-td-3l-192-wo-attn")
    full = next(cell for cell in cells if cell["label"] == "tinybert-td-3l-192" and cell["task"] == wo_attn["task"]
                and cell["seed"] == wo_attn["seed"])
    assert {k: v for k, v in wo_attn.items() if k not in ("name", "label", "no_attn")} == \
        {k: v for k, v in full.items() if k not in ("name", "label")} and wo_attn["no_attn"] is True
    mappings = {cell.get("mapping") for cell in build_spec("tinybert-mappings")["cells"]}
    assert mappings == {None, "top", "bottom"}  # None: the method's default, uniform


def test_pretraining_tables_chain_corpus_stages_from_the_mlm_teacher():
    from kdbench.reproduce import CORPUS, MLM_TEACHER

    spec = build_spec("distilbert-ablation")
    assert not [name for name in spec["stages"] if name.startswith("teacher-") and name != MLM_TEACHER]
    mlm = spec["stages"][MLM_TEACHER]
    assert (mlm["method"], mlm["task"], mlm["corpus"], mlm["student"]) == ("finetune", "corpus", CORPUS, "minilm-l6")
    wo_cos = spec["stages"]["wo-cos-pretrain"]
    assert (wo_cos["method"], wo_cos["teacher"], wo_cos["alpha_cos"], wo_cos["lr"]) == \
        ("distilbert-pretrain", f"${{{MLM_TEACHER}}}", 0.0, 5e-4)
    assert "student_layers" not in spec["stages"]["random-init-pretrain"]
    cell = next(c for c in spec["cells"] if c["name"] == "wo-cos-mrpc-s3")
    assert (cell["method"], cell["student"], cell["student_init"]) == ("finetune", "${wo-cos-pretrain}", "pretrained")
    strategies = build_spec("mobilebert-strategies")["stages"]
    assert [strategies[f"{k}-pretrain"]["strategy"] for k in ("akt", "jkt", "pkt")] == ["auxiliary", "joint", "progressive"]
    assert {c["task"] for c in build_spec("mobilebert-objectives")["cells"]} == {"sst2", "mrpc"}


def test_corpus_prerequisite_is_built_once_from_the_glue_training_sentences(tmp_path, shared_data, monkeypatch):
    from kdbench.reproduce import MINI, Prerequisite, prerequisites

    monkeypatch.setenv("KDBENCH_DATA_DIR", str(shared_data))
    corpus = Prerequisite(str(tmp_path / "corpus.txt"), "test")
    scale = type(MINI)(corpus_tasks=("rte",))
    assert corpus.ensure(scale) is True
    lines = (tmp_path / "corpus.txt").read_text().splitlines()
    assert len(lines) == len(set(lines)) > 2490  # RTE's 2,490 pairs give two sentences each, deduplicated
    stamp = (tmp_path / "corpus.txt").stat().st_mtime_ns
    assert corpus.ensure(scale) is False and (tmp_path / "corpus.txt").stat().st_mtime_ns == stamp
    assert [p.path for p in prerequisites("mobilebert-strategies")] and not prerequisites("pkd-skip-last")


def test_tinybert_procedures_share_one_general_distillation_from_the_pretrained_teacher():
    spec = build_spec("tinybert-procedures")
    assert "teacher-mlm" not in spec["stages"]  # GD distils the pre-trained teacher's layers: no MLM head needed
    general = spec["stages"]["general-distillation"]
    assert (general["method"], general["mode"], general["teacher"]) == ("tinybert", "general", "minilm-l6")
    by_name = {cell["name"]: cell for cell in spec["cells"]}
    assert by_name["wo-da-rte-s2"]["student"] == by_name["wo-td-rte-s2"]["student"] == "${general-distillation}"
    assert by_name["wo-td-rte-s2"]["mode"] == "prediction" and "intermediate_epochs" not in by_name["wo-td-rte-s2"]
    assert by_name["wo-gd-rte-s2"]["student_init"] == "random" and "mode" not in by_name["wo-gd-rte-s2"]


def test_table_one_corpus_rows_share_the_stages_of_the_tables_that_study_them():
    cross = build_spec("cross-method")["stages"]
    assert cross["general-distillation"] == build_spec("tinybert-procedures")["stages"]["general-distillation"]
    assert cross["pkt-pretrain"] == build_spec("mobilebert-strategies")["stages"]["pkt-pretrain"]
    assert cross["teacher-mlm"] == build_spec("mobilebert-strategies")["stages"]["teacher-mlm"]
