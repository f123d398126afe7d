"""The reproduction study's committed records re-render to its committed tables, and its generated
specs are what kdbench.reproduce generates today (a study is results, not a test: nothing trains here)."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from kdbench.reproduce import PAPER_TABLES, SPEC_FOLDER, TABLE_ROWS, build_spec, records_folder, render, study_plan

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


@pytest.mark.parametrize("table", TABLES)
def test_each_planned_row_is_the_paper_row_its_committed_records_land_in(table):
    """A table marks a row's empty cells from the study's plan by the paper table's row key: a wrong
    key would leave a pending row printed as out of the study, so the keys must be the rows the
    committed records of each label are assigned to."""
    from kdbench.records import load_records
    from kdbench.tables import TableSpec, assign_rows, load_spec

    spec = load_spec(PAPER_TABLES[table])
    plan = study_plan(table)
    if not isinstance(spec, TableSpec):  # table 1: rows are keyed by label
        assert {row.key for row in plan.rows} == {row.label for row in TABLE_ROWS[table]()} | {"teacher"}
        return
    assert {row.key for row in plan.rows} <= {row.key for row in spec.rows}
    records = records_folder(table)
    frame = load_records(records, include_failed=False) if records.is_dir() else None
    if frame is None or frame.empty:
        return
    key_of_label = {row.label: row.paper_row or row.label for row in TABLE_ROWS[table]()}
    row_of_run = {i: key for key, indices in assign_rows(spec, frame)[0].items() for i in indices}
    labelled = [i for i in frame.index if frame.loc[i, "label"] in key_of_label]
    assert {i: row_of_run.get(i) for i in labelled} == {i: key_of_label[frame.loc[i, "label"]] for i in labelled}


def test_cells_of_one_row_share_its_label_and_have_distinct_names():
    spec = build_spec("cross-method")
    names = [cell["name"] for cell in spec["cells"]]
    assert len(names) == len(set(names))
    rte_rows = {cell["label"] for cell in spec["cells"] if cell["task"] == "rte"}
    assert {"finetune-3l", "kd-3l", "pkd-skip-3l", "pkd-last-3l", "distilbert-3l", "tinybert-td-3l",
            "finetune-3l-192", "kd-3l-192", "tinybert-td-3l-192", "tinybert-gd-td-3l-192", "tinybert4",
            "pkt"} == rte_rows
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


@pytest.mark.parametrize("table", ["pkd-skip-last", "tinybert-objectives", "tinybert-mappings", "tinybert-procedures",
                                   "mobilebert-strategies", "mobilebert-objectives"])
def test_rows_shared_with_table_one_are_its_very_cells(table):
    cross = {cell["name"]: cell for cell in build_spec("cross-method")["cells"]}
    shared = [cell for cell in build_spec(table)["cells"] if cell["name"] in cross]
    assert shared and all(cell == cross[cell["name"]] for cell in shared)


def test_no_two_tables_train_one_run_under_two_labels():
    """A label is part of a run's folder name: cells of two tables that differ only in their label
    would be trained twice (table 1's PKT row and Table 8's pkt, Table 9's PD + FMT + AT and Table 8's
    pkt, TinyBERT Table 2's w/o DA and table 1's GD + TD all did once)."""
    import json
    import re

    labels_of_run: dict[str, set[str]] = {}
    for table in TABLES:
        spec = build_spec(table)

        def resolve(value, stages=spec["stages"]):
            reference = re.fullmatch(r"\$\{(.+)\}", value) if isinstance(value, str) else None
            return {key: resolve(v) for key, v in stages[reference.group(1)].items()} if reference else value

        for cell in spec["cells"]:
            run = {key: resolve(value) for key, value in cell.items() if key not in ("name", "label")}
            labels_of_run.setdefault(json.dumps(run, sort_keys=True), set()).add(cell["label"])
    assert [labels for labels in labels_of_run.values() if len(labels) > 1] == []


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
    from kdbench.reproduce import MINI, Prerequisite, PrerequisiteKind, prerequisites

    monkeypatch.setenv("KDBENCH_DATA_DIR", str(shared_data))
    corpus = Prerequisite(PrerequisiteKind.GLUE_CORPUS, (str(tmp_path / "corpus.txt"),), "test")
    scale = type(MINI)(corpus_tasks=("rte",))
    assert corpus.ensure(scale) is True
    lines = (tmp_path / "corpus.txt").read_text().splitlines()
    assert len(lines) == len(set(lines)) > 2490  # RTE's 2,490 pairs give two sentences each, deduplicated
    stamp = (tmp_path / "corpus.txt").stat().st_mtime_ns
    assert corpus.ensure(scale) is False and (tmp_path / "corpus.txt").stat().st_mtime_ns == stamp
    assert [p.kind for p in prerequisites("mobilebert-strategies")] == [PrerequisiteKind.GLUE_CORPUS]
    assert not prerequisites("pkd-skip-last")


def test_tinybert_procedures_share_one_general_distillation_from_the_pretrained_teacher():
    spec = build_spec("tinybert-procedures")
    general = spec["stages"]["general-distillation"]  # GD distils the pre-trained teacher: no MLM head needed
    assert (general["method"], general["mode"], general["teacher"]) == ("tinybert", "general", "minilm-l6")
    by_name = {cell["name"]: cell for cell in spec["cells"]}
    assert by_name["tinybert-gd-td-3l-192-rte-s2"]["student"] == by_name["wo-td-rte-s2"]["student"] == "${general-distillation}"
    # w/o DA is table 1's GD + TD row: one label, so one run folder for both tables
    assert by_name["tinybert-gd-td-3l-192-rte-s2"] == {
        cell["name"]: cell for cell in build_spec("cross-method")["cells"]}["tinybert-gd-td-3l-192-rte-s2"]
    assert by_name["wo-td-rte-s2"]["mode"] == "prediction" and "intermediate_epochs" not in by_name["wo-td-rte-s2"]
    assert by_name["wo-gd-rte-s2"]["student_init"] == "random" and "mode" not in by_name["wo-gd-rte-s2"]


def test_table_one_corpus_rows_share_the_stages_of_the_tables_that_study_them():
    cross = build_spec("cross-method")["stages"]
    assert cross["general-distillation"] == build_spec("tinybert-procedures")["stages"]["general-distillation"]
    assert cross["pkt-pretrain"] == build_spec("mobilebert-strategies")["stages"]["pkt-pretrain"]
    assert cross["teacher-mlm"] == build_spec("mobilebert-strategies")["stages"]["teacher-mlm"]


def test_augmented_rows_read_the_whole_augmented_file_built_after_the_mlm_teacher():
    from kdbench.reproduce import MLM_TEACHER, augmented_path, prerequisites

    cells = {cell["name"]: cell for cell in build_spec("tinybert-procedures")["cells"]}
    da, no_da = cells["tinybert4-sst2-s2"], cells["tinybert-gd-td-3l-192-sst2-s2"]
    assert da["train_file"] == augmented_path("sst2") and "max_train_samples" not in da
    assert "train_file" not in no_da and no_da["max_train_samples"] == 16000
    assert cells["wo-gd-rte-s1"]["train_file"] == augmented_path("rte") and cells["wo-gd-rte-s1"]["student_init"] == "random"
    found = prerequisites("tinybert-procedures")
    assert found[0].task is None and found[0].after_stage is None  # the corpus, for GD, first
    assert [(p.task, p.after_stage) for p in found[1:]] == [(t, MLM_TEACHER) for t in ("cola", "sst2", "mrpc", "rte")]
    cross = {cell["name"]: cell for cell in build_spec("cross-method")["cells"]}
    assert cross["tinybert4-mrpc-s3"] == cells["tinybert4-mrpc-s3"]  # table 1's GD+TD+DA row = Table 2's first


def test_a_prerequisite_needing_a_stage_runs_that_stage_alone_first_then_only_once(tmp_path, monkeypatch):
    import kdbench.augment_cli
    import kdbench.cli
    from kdbench import reproduce
    from kdbench.sweep import expand

    monkeypatch.chdir(tmp_path)
    spec_path = reproduce.write_spec("tinybert-procedures", tmp_path)
    for prerequisite in reproduce.prerequisites("tinybert-procedures")[:1]:  # the corpus is another test's
        Path(prerequisite.paths[0]).parent.mkdir(parents=True, exist_ok=True)
        Path(prerequisite.paths[0]).write_text("a sentence\n")
    sweeps, augmented = [], []

    def fake_sweep(argv):  # stands in for `kdbench sweep`: the stage's run "completes"
        sweeps.append(yaml.safe_load(Path(argv[1]).read_text()))
        for run in expand(sweeps[-1], Path("runs/reproduction")).runs.values():
            (run.run_dir / "model").mkdir(parents=True)
        return 0

    def fake_augment(task, *, mlm_model, out, n_aug, max_samples):
        augmented.append((task, mlm_model, n_aug, max_samples))
        Path(out).parent.mkdir(parents=True, exist_ok=True)
        Path(out).write_text("sentence\tlabel\n")

    monkeypatch.setattr(kdbench.cli, "main", fake_sweep)
    monkeypatch.setattr(kdbench.augment_cli, "augment_task_file", fake_augment)
    options = ["--executor", "local", "--output", "runs/reproduction"]
    assert reproduce.build_prerequisites("tinybert-procedures", spec_path, Path("runs/reproduction"), options) == 0
    # one sweep, of the MLM teacher alone, for the four augmented task files
    assert len(sweeps) == 1 and [cell["name"] for cell in sweeps[0]["cells"]] == ["teacher-mlm"]
    stage_model = expand(sweeps[0], Path("runs/reproduction")).runs["teacher-mlm"].run_dir / "model"
    assert augmented == [(t, str(stage_model), 4, 16000 if t == "sst2" else None) for t in ("cola", "sst2", "mrpc", "rte")]
    sweeps.clear()
    assert reproduce.build_prerequisites("tinybert-procedures", spec_path, Path("runs/reproduction"), options) == 0
    assert not sweeps and len(augmented) == 4  # all present: nothing run, nothing rebuilt


def test_squad_is_a_column_of_table_one_trained_on_dev_articles_and_scored_on_the_held_out_ones():
    from kdbench.reproduce import MINI, PrerequisiteKind, prerequisites

    squad = MINI.task("squad")
    cells = {cell["name"]: cell for cell in build_spec("cross-method")["cells"]}
    td = cells["tinybert-td-3l-squad-s2"]
    assert (td["train_file"], td["dev_file"], td["max_seq_length"]) == (squad.train_file, squad.dev_file, 384)
    assert build_spec("cross-method")["stages"]["teacher-squad"]["train_file"] == squad.train_file
    # BERT-PKD's plug-in takes no span head and kdbench augment no SQuAD rows: those rows skip the column
    assert not [name for name in cells if name.endswith("-squad-s1") and name.startswith(("pkd-", "tinybert4-"))]
    assert {"finetune-3l-192-squad-s3", "kd-3l-squad-s1", "distilbert-3l-squad-s1", "pkt-squad-s1",
            "tinybert-gd-td-3l-192-squad-s1"} <= set(cells)
    assert "squad" not in {c["task"] for t in ("pkd-skip-last", "distilbert-ablation", "tinybert-objectives")
                           for c in build_spec(t)["cells"]}
    split = [p for p in prerequisites("cross-method") if p.kind is PrerequisiteKind.SQUAD_SPLIT]
    assert [p.paths for p in split] == [(squad.train_file, squad.dev_file)]


def test_squad_split_keeps_whole_articles_apart(tmp_path, shared_data, monkeypatch):
    import json

    from kdbench.reproduce import MINI, Prerequisite, PrerequisiteKind

    monkeypatch.setenv("KDBENCH_DATA_DIR", str(shared_data))
    split = Prerequisite(PrerequisiteKind.SQUAD_SPLIT, (str(tmp_path / "dev-v1.1.train.json"),
                                                        str(tmp_path / "dev-v1.1.heldout.json")), "test")
    assert split.ensure(MINI) is True and split.present
    parts = [json.loads(Path(path).read_text())["data"] for path in split.paths]
    questions = [sum(len(p["qas"]) for a in part for p in a["paragraphs"]) for part in parts]
    assert (len(parts[0]), len(parts[1]), questions) == (38, 10, [8582, 1988])  # dev-v1.1: 48 articles, 10,570 questions
    assert not {a["title"] for a in parts[0]} & {a["title"] for a in parts[1]}
    assert split.ensure(MINI) is False


def test_claims_leave_out_the_tasks_one_of_their_rows_does_not_run_on(tmp_path):
    from kdbench.reproduce import render_claims

    text = render_claims("cross-method", tmp_path / "no-records", tmp_path / "claims.md").read_text()
    assert "| KD beats fine-tuning without a teacher (wide student) | squad |" in text
    assert "| PKD-skip beats PKD-last (Table 2) | squad |" not in text
    assert "| PKD-skip beats PKD-last (Table 2) | rte |" in text


def test_claims_compare_the_metric_the_papers_table_prints():
    """TinyBERT's Tables 2-4 and MobileBERT's Tables 8-9 print MRPC's accuracy, BERT-PKD's Table 2 its
    F1 first; the cross-method table (our own layout) falls back to each task's main metric."""
    from kdbench.reproduce import paper_metrics

    assert [paper_metrics(t)["mrpc"] for t in ("tinybert-procedures", "tinybert-objectives", "tinybert-mappings",
                                               "mobilebert-strategies", "mobilebert-objectives")] == ["acc"] * 5
    assert (paper_metrics("pkd-skip-last")["mrpc"], paper_metrics("distilbert-ablation")["stsb"]) == ("f1", "spearman")
    assert paper_metrics("cross-method") == {}


def test_measurer_reads_architectures_from_exported_records_when_run_folders_are_gone(tmp_path):
    """A table re-rendered on another machine measures the student from its record's model/config.json
    and finds the teacher (for the W_h projection of a narrower student) in the teacher's record."""
    from transformers import BertConfig

    from kdbench.tables.building import Measurer

    records = tmp_path / "records"
    teacher_run, student_run = "finetune-sst2-0123456789ab", "kd-sst2-ba9876543210"
    BertConfig(hidden_size=128, num_hidden_layers=2, num_attention_heads=2, intermediate_size=256,
               vocab_size=100).to_json_file(_mkdirs(records / teacher_run / "model") / "config.json")
    BertConfig(hidden_size=64, num_hidden_layers=1, num_attention_heads=2, intermediate_size=128,
               vocab_size=100).to_json_file(_mkdirs(records / student_run / "model") / "config.json")
    gone = f"/nonexistent/machine/runs/{teacher_run}/model"  # where the teacher lived when it was trained
    run = {"run_dir": str(records / student_run), "model_dir": f"/nonexistent/{student_run}/model", "teacher": gone}

    stats = Measurer().of_run(run)
    alone = Measurer().of_run({**run, "teacher": None})
    assert stats["params_backbone_millions"] == alone["params_backbone_millions"] > 0
    assert round((stats["params_millions"] - alone["params_millions"]) * 1e6) == 64 * 128 + 128  # W_h and its bias: 64 -> 128
    (records / teacher_run / "model" / "config.json").unlink()
    assert Measurer().of_run(run)["params_millions"] == alone["params_millions"]


def _mkdirs(path):
    path.mkdir(parents=True, exist_ok=True)
    return path


def test_only_keeps_the_matching_cells_and_runs_a_named_stage_alone():
    from kdbench.reproduce import select_runs

    spec = build_spec("cross-method")
    picked = select_runs(spec, ["kd-3l-mrpc-s*", "teacher-rte"])
    names = [cell["name"] for cell in picked["cells"]]
    assert names == ["teacher-rte", "kd-3l-mrpc-s1", "kd-3l-mrpc-s2", "kd-3l-mrpc-s3", "kd-3l-mrpc-s4",
                     "kd-3l-mrpc-s5"]
    assert picked["stages"] == spec["stages"]  # the MRPC cells still find ${teacher-mrpc}
    alone = picked["cells"][0]
    assert {k: v for k, v in alone.items() if k != "name"} == spec["stages"]["teacher-rte"]
    # a stage that a kept cell needs is not added a second time as a cell of its own
    assert [c["name"] for c in select_runs(spec, ["teacher-mrpc", "kd-3l-mrpc-s1"])["cells"]] == ["kd-3l-mrpc-s1"]


def test_only_names_a_pattern_that_matches_nothing():
    from kdbench.config import ConfigError
    from kdbench.reproduce import select_runs

    with pytest.raises(ConfigError, match=r"--only 'kd-3l-qnli-\*' matches no cell or stage of reproduction-cross-method"):
        select_runs(build_spec("cross-method"), ["kd-3l-mrpc-s1", "kd-3l-qnli-*"])


def test_only_builds_just_the_prerequisites_the_chosen_runs_read(tmp_path, monkeypatch, capsys):
    """Choosing MRPC cells builds neither the SQuAD split nor the GLUE corpus (no corpus stage is
    needed); choosing a SQuAD cell builds the split (and still not the corpus)."""
    from kdbench.reproduce import build_prerequisites, prerequisites, write_selection

    monkeypatch.chdir(tmp_path)
    spec_path = SPEC_FOLDER / "cross-method.yaml"
    built = []
    monkeypatch.setattr("kdbench.reproduce.Prerequisite.ensure",
                        lambda self, scale=None, stage_model=None: built.append(self.kind.value))
    output = tmp_path / "runs" / "reproduction"
    assert {p.kind.value for p in prerequisites("cross-method")} >= {"glue-corpus", "squad-split", "augmented"}
    assert build_prerequisites("cross-method", write_selection(spec_path, ["kd-3l-mrpc-*"], output), output, []) == 0
    assert built == []
    assert build_prerequisites("cross-method", write_selection(spec_path, ["kd-3l-squad-s1"], output), output, []) == 0
    assert built == ["squad-split"]


def test_a_cell_reading_an_augmented_set_alone_builds_the_corpus_its_mlm_teacher_trains_on(tmp_path, monkeypatch):
    """w/o GD reads the augmented set and no corpus stage; the MLM teacher that builds the set
    trains on the corpus, so on a fresh machine the corpus is built before that teacher's sweep."""
    import kdbench.augment_cli
    import kdbench.cli
    from kdbench.reproduce import CORPUS, build_prerequisites, write_selection
    from kdbench.sweep import expand

    monkeypatch.chdir(tmp_path)
    output = Path("runs/reproduction")
    events = []

    def fake_ensure(self, scale=None, stage_model=None):
        events.append(self.kind.value)
        Path(self.paths[0]).parent.mkdir(parents=True, exist_ok=True)
        Path(self.paths[0]).write_text("a sentence\n")
        return True

    def fake_sweep(argv):
        stage_spec = yaml.safe_load(Path(argv[1]).read_text())
        events.append([cell["name"] for cell in stage_spec["cells"]])
        for run in expand(stage_spec, output).runs.values():
            (run.run_dir / "model").mkdir(parents=True)
        return 0

    monkeypatch.setattr("kdbench.reproduce.Prerequisite.ensure", fake_ensure)
    monkeypatch.setattr(kdbench.cli, "main", fake_sweep)
    monkeypatch.setattr(kdbench.augment_cli, "augment_task_file", None)  # ensure is faked: never reached
    run_spec = write_selection(SPEC_FOLDER / "tinybert-procedures.yaml", ["wo-gd-rte-s1"], output)
    assert build_prerequisites("tinybert-procedures", run_spec, output, []) == 0
    assert events == ["glue-corpus", ["teacher-mlm"], "augmented"]
    assert Path(CORPUS).is_file()


def test_the_mlm_teacher_that_builds_the_augmented_sets_is_estimated_and_exported_with_the_table(
        tmp_path, shared_data, monkeypatch, capsys):
    """No cell of TinyBERT's Table 2 reads the MLM-adapted teacher, yet its weights make the
    augmented sets the DA rows train on: a part of the table whose set is missing counts its
    training in the --missing estimate (from its record), and its record is exported with the
    table's, named by its role, once it has trained."""
    import json

    from kdbench.reproduce import CORPUS, write_selection
    from kdbench.reproduce.prerequisites import prerequisite_stages, prerequisite_stages_to_train
    from kdbench.reproduce.records import export_records
    from kdbench.sweep import load_spec
    from kdbench.tables.building import STAGE_ROLES_FILE

    monkeypatch.setenv("KDBENCH_DATA_DIR", str(shared_data))
    monkeypatch.chdir(tmp_path)
    Path(CORPUS).parent.mkdir(parents=True)
    Path(CORPUS).write_text("a sentence\n")
    output, records = Path("runs/reproduction"), tmp_path / "records"
    spec_path = SPEC_FOLDER / "tinybert-procedures.yaml"
    mlm = prerequisite_stages("tinybert-procedures", load_spec(spec_path), output)["teacher-mlm"]
    _write_record(records / mlm.run_dir.name, status="completed", task="corpus", train_seconds=1800.0)

    da_cell = write_selection(spec_path, ["wo-gd-rte-s1"], output)
    to_train = prerequisite_stages_to_train("tinybert-procedures", spec_path, da_cell, output)
    assert list(to_train) == ["teacher-mlm"] and to_train["teacher-mlm"].run_dir == mlm.run_dir
    capsys.readouterr()
    write_selection(spec_path, ["teacher-rte"], output, leave_out_recorded_in=records)
    assert "No record to judge the training time of the 1 runs to do from (teacher-rte)." in capsys.readouterr().out
    write_selection(spec_path, ["teacher-rte"], output, leave_out_recorded_in=records, also_to_train=to_train)
    assert ("Training time of the 1 runs to do that the records can judge (stages included): about 0.5 h on the "
            "machines that wrote them; no record to judge the other 1 from (teacher-rte).") in capsys.readouterr().out
    wo_td = write_selection(spec_path, ["wo-td-rte-s1"], output)  # reads the augmented set too
    assert list(prerequisite_stages_to_train("tinybert-procedures", spec_path, wo_td, output)) == ["teacher-mlm"]
    teacher_alone = write_selection(spec_path, ["teacher-rte"], output)
    assert prerequisite_stages_to_train("tinybert-procedures", spec_path, teacher_alone, output) == {}

    exported = tmp_path / "exported"
    _write_record(mlm.run_dir, status="completed", task="corpus", train_seconds=1700.0)
    assert prerequisite_stages_to_train("tinybert-procedures", spec_path, da_cell, output) == {}  # trained here
    write_selection(spec_path, ["teacher-rte"], output, leave_out_recorded_in=records, also_to_train=to_train)
    assert "No record to judge the training time of the 1 runs to do from (teacher-rte)." in capsys.readouterr().out
    copied = export_records(spec_path, output, exported,
                            prerequisite_stages=prerequisite_stages("tinybert-procedures", load_spec(spec_path), output))
    assert copied == [exported / mlm.run_dir.name]
    assert json.loads((exported / STAGE_ROLES_FILE).read_text()) == {mlm.run_dir.name: "teacher-mlm"}
    assert export_records(spec_path, output, tmp_path / "without") == []  # the spec's own runs have no record


def test_export_keeps_a_committed_record_of_another_training_unless_superseded(tmp_path, capsys):
    """A teacher retrained on a new machine has the same run folder as the committed one; its
    record must not silently replace the one the committed cells were trained against."""
    import json

    from kdbench.reproduce import export_records, write_selection
    from kdbench.sweep import expand, load_spec

    output = tmp_path / "runs"
    spec_path = write_selection(SPEC_FOLDER / "cross-method.yaml", ["teacher-rte"], output)
    run_dir = expand(load_spec(spec_path), output=output).runs["teacher-rte"].run_dir
    run_dir.mkdir(parents=True)
    fresh = {"status": "completed", "created_at": "2026-11-26T12:50:50+0000", "metrics": {"acc": 59.2}}
    (run_dir / "result.json").write_text(json.dumps(fresh))
    records = tmp_path / "records"
    committed = {"status": "completed", "created_at": "2026-11-23T21:04:46+0000", "metrics": {"acc": 57.4}}
    _mkdirs(records / run_dir.name)
    (records / run_dir.name / "result.json").write_text(json.dumps(committed))

    assert export_records(spec_path, output, records) == []
    assert json.loads((records / run_dir.name / "result.json").read_text())["metrics"] == {"acc": 57.4}
    assert f"not exported to {records / run_dir.name}: the record kept there is a completed run" in capsys.readouterr().err
    assert export_records(spec_path, output, records, supersede=True) == [records / run_dir.name]
    assert json.loads((records / run_dir.name / "result.json").read_text())["metrics"] == {"acc": 59.2}
    # a record already exported is not copied again: the run folder's other files need not be the
    # record's (a teacher rebuilt by rebuild_teacher.py gets the committed result.json installed)
    (run_dir / "model").mkdir()
    (run_dir / "model" / "config.json").write_text('{"architectures": ["BertForSequenceClassification"]}')
    assert export_records(spec_path, output, records) == []
    assert not (records / run_dir.name / "model").exists()
    # the same training finished again (resumed: same created_at, a new result.json) refreshes its files
    (run_dir / "result.json").write_text(json.dumps({**fresh, "train_seconds": 12.0}))
    assert export_records(spec_path, output, records) == [records / run_dir.name]
    assert (records / run_dir.name / "model" / "config.json").is_file()


def test_an_unfinished_retraining_never_replaces_a_completed_record(tmp_path, capsys):
    """A stage retrained on a new machine and stopped half-way (its record 'interrupted') must not
    overwrite the committed completed record, even with --supersede-records, nor be exported where
    none is committed; a failed run is exported, but never over a completed record."""
    import json

    from kdbench.reproduce import export_records, write_selection
    from kdbench.sweep import expand, load_spec

    output = tmp_path / "runs"
    spec_path = write_selection(SPEC_FOLDER / "cross-method.yaml", ["teacher-rte"], output)
    run_dir = expand(load_spec(spec_path), output=output).runs["teacher-rte"].run_dir
    run_dir.mkdir(parents=True)
    (run_dir / "result.json").write_text(json.dumps({"status": "interrupted", "created_at": "2026-11-28T15:43:47+0000",
                                                     "metrics": {}}))
    records = tmp_path / "records"
    committed = {"status": "completed", "created_at": "2026-11-23T21:04:46+0000", "metrics": {"acc": 57.4}}
    _mkdirs(records / run_dir.name)
    (records / run_dir.name / "result.json").write_text(json.dumps(committed))

    for supersede in (False, True):
        assert export_records(spec_path, output, records, supersede=supersede) == []
        assert json.loads((records / run_dir.name / "result.json").read_text()) == committed
        assert f"{run_dir} not exported to {records / run_dir.name}: it was interrupted" in capsys.readouterr().err
    # nor is it exported where no record is committed: it would read as a result of the table until
    # someone removed it by hand; it resumes and is exported when it completes
    fresh_records = tmp_path / "fresh-records"
    assert export_records(spec_path, output, fresh_records) == []
    assert not (fresh_records / run_dir.name).exists()
    # a failed run is a result (its table notes the failure), but never replaces a completed record
    (run_dir / "result.json").write_text(json.dumps({"status": "failed", "created_at": "2026-11-28T15:43:47+0000",
                                                     "metrics": {}, "error": "ValueError: nan loss"}))
    assert export_records(spec_path, output, fresh_records) == [fresh_records / run_dir.name]
    assert export_records(spec_path, output, records, supersede=True) == []
    assert json.loads((records / run_dir.name / "result.json").read_text()) == committed
    assert "it is failed, not completed; the completed record stays" in capsys.readouterr().err


def test_supersede_with_only_replaces_the_records_the_chosen_cells_read(tmp_path, shared_data, monkeypatch, capsys):
    """``--only CELLS --supersede-records`` replaces the records of the chosen cells and of the
    stages they read (their teacher retrained on the machine they ran on), and keeps the record of a
    teacher retrained here for other cells: superseding it would leave its committed cells beside a
    teacher record they did not read."""
    import json

    from kdbench.cli import main
    from kdbench.reproduce import write_selection
    from kdbench.sweep import expand, load_spec

    monkeypatch.setenv("KDBENCH_DATA_DIR", str(shared_data))
    monkeypatch.chdir(tmp_path)
    output, records = tmp_path / "runs", tmp_path / "records"
    spec_path = SPEC_FOLDER / "cross-method.yaml"
    runs = expand(load_spec(write_selection(spec_path, ["kd-3l-mrpc-s1", "teacher-rte"], output)), output=output).runs
    cell, chosen_teacher, other_teacher = runs["kd-3l-mrpc-s1"], runs["teacher-mrpc"], runs["teacher-rte"]
    for run, task in ((cell, "mrpc"), (chosen_teacher, "mrpc"), (other_teacher, "rte")):
        _write_record(records / run.run_dir.name, status="completed", task=task, created_at="2026-11-23T21:04:46+0000",
                      metrics={"acc": 50.0})
    for run, task in ((chosen_teacher, "mrpc"), (other_teacher, "rte")):
        _write_record(run.run_dir, status="completed", task=task, created_at="2026-12-04T07:56:04+0000",
                      metrics={"acc": 60.0})

    assert main(["reproduce", "cross-method", "--only", "kd-3l-mrpc-s1", "--missing", "--supersede-records",
                 "--no-plots", "--records", str(records), "--output", str(output)]) == 0
    metrics = {name: json.loads((records / run.run_dir.name / "result.json").read_text())["metrics"]
               for name, run in (("teacher-mrpc", chosen_teacher), ("teacher-rte", other_teacher))}
    assert metrics == {"teacher-mrpc": {"acc": 60.0}, "teacher-rte": {"acc": 50.0}}
    said = capsys.readouterr().err
    assert f"{other_teacher.run_dir} not exported to {records / other_teacher.run_dir.name}" in said
    assert str(chosen_teacher.run_dir) + " not exported" not in said


def test_the_runs_a_da_cell_reads_include_the_mlm_teacher_that_built_its_augmented_set(tmp_path, shared_data,
                                                                                    monkeypatch):
    from kdbench.reproduce import CORPUS, write_selection
    from kdbench.reproduce.prerequisites import prerequisite_stages
    from kdbench.reproduce.selection import chosen_run_folders
    from kdbench.sweep import expand, load_spec

    monkeypatch.setenv("KDBENCH_DATA_DIR", str(shared_data))
    monkeypatch.chdir(tmp_path)
    Path(CORPUS).parent.mkdir(parents=True)
    Path(CORPUS).write_text("a sentence\n")
    output = Path("runs/reproduction")
    spec_path = SPEC_FOLDER / "tinybert-procedures.yaml"
    stages = expand(load_spec(spec_path), output=output).runs
    mlm = prerequisite_stages("tinybert-procedures", load_spec(spec_path), output)["teacher-mlm"]

    chosen = chosen_run_folders("tinybert-procedures", spec_path, write_selection(spec_path, ["wo-gd-rte-s1"], output),
                                output)
    assert {mlm.run_dir.name, stages["teacher-rte"].run_dir.name} <= chosen
    assert stages["teacher-cola"].run_dir.name not in chosen
    alone = chosen_run_folders("tinybert-procedures", spec_path, write_selection(spec_path, ["teacher-rte"], output),
                               output)
    assert alone == {stages["teacher-rte"].run_dir.name}


def test_export_says_a_retraining_with_the_same_weights_needs_no_rerun(tmp_path, capsys):
    """A deterministic retraining (same code, libraries, threads) writes bit-identical weights: the
    committed record stays, and the message says so instead of asking to rerun what read it. Weights
    that differ in one digest keep the warning."""
    import json

    from kdbench.reproduce import export_records, write_selection
    from kdbench.sweep import expand, load_spec

    output = tmp_path / "runs"
    spec_path = write_selection(SPEC_FOLDER / "cross-method.yaml", ["teacher-cola"], output)
    run_dir = expand(load_spec(spec_path), output=output).runs["teacher-cola"].run_dir
    run_dir.mkdir(parents=True)
    records = tmp_path / "records"
    _mkdirs(records / run_dir.name)
    committed = {"status": "completed", "created_at": "2026-11-26T22:14:37+0000", "metrics": {"mcc": 26.37},
                 "weights_sha256": {"model": "0acd2fc0" + "0" * 56}}
    (records / run_dir.name / "result.json").write_text(json.dumps(committed))

    retrained = {**committed, "created_at": "2026-11-27T15:09:00+0000"}
    (run_dir / "result.json").write_text(json.dumps(retrained))
    assert export_records(spec_path, output, records) == []
    message = capsys.readouterr().err
    assert "wrote the same weights (sha256 0acd2fc00000)" in message and "nothing to rerun" in message
    assert json.loads((records / run_dir.name / "result.json").read_text())["created_at"] == committed["created_at"]

    retrained["weights_sha256"] = {"model": "0acd2fc1" + "0" * 56}
    (run_dir / "result.json").write_text(json.dumps(retrained))
    assert export_records(spec_path, output, records) == []
    assert "rerun every record that read its model" in capsys.readouterr().err


def test_a_teacher_stage_plays_one_role_across_tasks():
    from kdbench.reproduce import stage_role_name

    assert stage_role_name("teacher-mrpc", "mrpc") == stage_role_name("teacher-squad", "squad") == "teacher"
    assert stage_role_name("teacher-mlm", "corpus") == "teacher-mlm"
    assert stage_role_name("rte", "rte") == "rte"  # never an empty role


def test_exported_records_name_their_teachers_role_without_the_run_folders(tmp_path):
    """Cells of two tasks, with teachers that are two different runs, land in one table row when the
    records say both teachers are the task's fine-tuned 'teacher'; without the file they are two rows."""
    import json

    from kdbench.tables.building import STAGE_ROLES_FILE, _teacher_role

    records = _mkdirs(tmp_path / "records")
    cells = [{"run_dir": str(records / f"kd-{task}-0123456789a{i}"),
              "teacher": f"/gone/runs/finetune-{task}-{i}bcdef012345/model"} for i, task in enumerate(("mrpc", "rte"))]
    assert {_teacher_role(cell) for cell in cells} == {"finetune-mrpc-0bcdef012345", "finetune-rte-1bcdef012345"}
    (records / STAGE_ROLES_FILE).write_text(json.dumps({"finetune-mrpc-0bcdef012345": "teacher",
                                                        "finetune-rte-1bcdef012345": "teacher"}))
    from kdbench.tables.building import _exported_roles
    _exported_roles.cache_clear()
    assert {_teacher_role(cell) for cell in cells} == {"teacher"}


def _write_record(folder, **record):
    import json

    from kdbench.records import SCHEMA_VERSION

    _mkdirs(folder)
    minimal = {"schema_version": SCHEMA_VERSION, "method": "kd", "task": "mrpc", "student": "teacher-3l", "config": {},
               "metrics": {}}
    (folder / "result.json").write_text(json.dumps({**minimal, **record}))


def test_missing_leaves_out_the_cells_with_a_completed_record(tmp_path, shared_data, monkeypatch, capsys):
    """``--missing``: a cell whose record folder (named by content, like its run folder) holds a
    completed result is left out; a failed record does not count; the other cells and the stages
    they need stay."""
    from kdbench.reproduce import write_selection
    from kdbench.sweep import expand, load_spec

    monkeypatch.setenv("KDBENCH_DATA_DIR", str(shared_data))
    output, records = tmp_path / "runs", tmp_path / "records"
    spec_path = SPEC_FOLDER / "cross-method.yaml"
    runs = expand(load_spec(write_selection(spec_path, ["kd-3l-mrpc-s*"], output)), output=output).runs
    _write_record(records / runs["kd-3l-mrpc-s1"].run_dir.name, status="completed")
    _write_record(records / runs["kd-3l-mrpc-s2"].run_dir.name, status="failed")

    selected = load_spec(write_selection(spec_path, ["kd-3l-mrpc-s*"], output, leave_out_recorded_in=records))
    assert [cell["name"] for cell in selected["cells"]] == [f"kd-3l-mrpc-s{seed}" for seed in (2, 3, 4, 5)]
    assert "teacher-mrpc" in selected["stages"]
    assert f"1 of 5 chosen cells have a completed record in {records} and are left out; 4 to run" in \
        capsys.readouterr().out


def test_without_missing_the_recorded_cells_that_will_train_again_are_named(tmp_path, shared_data, monkeypatch,
                                                                            capsys):
    """A cell recorded (e.g. committed) but not completed in this runs folder trains again without
    ``--missing``; the command says which, before any training, so that hours are not spent by mistake."""
    from kdbench.cli import main
    from kdbench.reproduce import recorded_cells_to_retrain, write_selection
    from kdbench.sweep import expand, load_spec

    monkeypatch.setenv("KDBENCH_DATA_DIR", str(shared_data))
    output, records = tmp_path / "runs", tmp_path / "records"
    spec_path = SPEC_FOLDER / "cross-method.yaml"
    runs = expand(load_spec(write_selection(spec_path, ["kd-3l-mrpc-s*"], output)), output=output).runs
    for seed in (1, 2):
        _write_record(records / runs[f"kd-3l-mrpc-s{seed}"].run_dir.name, status="completed")
    _write_record(runs["kd-3l-mrpc-s2"].run_dir, status="completed")  # trained here too: the sweep skips it
    _write_record(records / runs["kd-3l-mrpc-s3"].run_dir.name, status="failed")
    assert recorded_cells_to_retrain(runs, records) == ["kd-3l-mrpc-s1"]

    assert main(["reproduce", "cross-method", "--only", "kd-3l-mrpc-s*", "--dry-run", "--records", str(records),
                 "--output", str(output)]) == 0
    said = capsys.readouterr().out
    assert (f"1 chosen cell(s) have a completed record in {records} but no completed run folder in {output}, "
            "so they train again (kd-3l-mrpc-s1); --missing leaves them out") in said


def test_recorded_stages_that_train_again_on_other_hardware_are_named_first(tmp_path, shared_data, monkeypatch,
                                                                             capsys):
    """A stage recorded on another processor (or thread count, or torch/transformers version) writes
    other weights when it trains again here, so the cells run now read another teacher than the
    recorded cells did: the command says so before training. A stage recorded on this very machine,
    or already trained in this runs folder, is not named; one whose record names no machine is."""
    from kdbench.cli import main
    from kdbench.records import compute_environment, library_versions
    from kdbench.reproduce import build_prerequisites, stages_retrained_elsewhere, write_selection
    from kdbench.reproduce.prerequisites import stage_alone
    from kdbench.sweep import expand, load_spec

    monkeypatch.setenv("KDBENCH_DATA_DIR", str(shared_data))
    monkeypatch.chdir(tmp_path)  # the augmented set (a prerequisite read by the cell) is not built here
    output, records = tmp_path / "runs", tmp_path / "records"
    spec_path = SPEC_FOLDER / "tinybert-procedures.yaml"
    run_spec = write_selection(spec_path, ["wo-td-rte-s1"], output)
    assert build_prerequisites("tinybert-procedures", run_spec, output, [], dry_run=True) == 0  # the corpus GD reads
    stages = expand(load_spec(spec_path), output=output).runs
    stages["teacher-mlm"] = expand(stage_alone(load_spec(spec_path), "teacher-mlm"), output=output).runs["teacher-mlm"]
    here, versions = compute_environment(), library_versions()
    elsewhere = {**here, "cpu": "Another CPU"}
    _write_record(records / stages["teacher-rte"].run_dir.name, status="completed", machine=elsewhere, versions=versions)
    _write_record(records / stages["general-distillation"].run_dir.name, status="completed", machine=here,
                  versions=versions)
    _write_record(records / stages["teacher-mlm"].run_dir.name, status="completed")  # names no machine

    found = stages_retrained_elsewhere("tinybert-procedures", spec_path, run_spec, output, records)
    assert sorted(found) == ["teacher-mlm", "teacher-rte"]
    assert found["teacher-rte"].startswith("recorded on Another CPU, ") and "here " + here["cpu"] in found["teacher-rte"]
    assert found["teacher-mlm"].startswith("its record predates the machine field; here ")

    older_torch = {**versions, "torch": "2.0.0"}
    _write_record(records / stages["general-distillation"].run_dir.name, status="completed", machine=here,
                  versions=older_torch)
    _write_record(stages["teacher-rte"].run_dir, status="completed")  # trained in this runs folder already
    found = stages_retrained_elsewhere("tinybert-procedures", spec_path, run_spec, output, records)
    assert sorted(found) == ["general-distillation", "teacher-mlm"]
    assert found["general-distillation"] == f"torch 2.0.0 recorded, {versions['torch']} here"

    assert main(["reproduce", "tinybert-procedures", "--only", "wo-td-rte-s1", "--dry-run", "--records", str(records),
                 "--output", str(output)]) == 0
    said = capsys.readouterr().out
    assert "2 recorded stage(s) train again on other hardware or libraries" in said
    assert "general-distillation (torch 2.0.0 recorded" in said and "teachers differ" in said


def test_missing_estimates_the_training_left_from_the_records(tmp_path, shared_data, monkeypatch):
    """A stage to redo counts its own recorded training, a cell the median of its row's recorded runs
    on that task; a row never recorded on the task is named, not guessed."""
    from kdbench.reproduce import TrainingEstimate, recorded_cells, select_runs
    from kdbench.reproduce.selection import _runs_to_do
    from kdbench.sweep import expand, load_spec

    monkeypatch.setenv("KDBENCH_DATA_DIR", str(shared_data))
    output, records = tmp_path / "runs", tmp_path / "records"
    spec = select_runs(load_spec(SPEC_FOLDER / "cross-method.yaml"), ["kd-3l-mrpc-s*", "tinybert-td-3l-mrpc-s1"])
    runs = expand(spec, output=output).runs
    for cell, status, seconds in (("kd-3l-mrpc-s1", "completed", 100.0), ("kd-3l-mrpc-s2", "completed", 400.0),
                                  ("kd-3l-mrpc-s3", "failed", 9000.0)):
        _write_record(records / runs[cell].run_dir.name, status=status, label="kd-3l", task="mrpc",
                      train_seconds=seconds)
    _write_record(records / runs["teacher-mrpc"].run_dir.name, status="completed", task="mrpc", train_seconds=1000.0)

    recorded = recorded_cells(runs, records)
    assert recorded == {"kd-3l-mrpc-s1", "kd-3l-mrpc-s2"}
    to_do = _runs_to_do(runs, {name for name, run in runs.items() if run.kind == "cell"} - recorded)
    assert sorted(to_do) == ["kd-3l-mrpc-s3", "kd-3l-mrpc-s4", "kd-3l-mrpc-s5", "teacher-mrpc", "tinybert-td-3l-mrpc-s1"]
    estimate = TrainingEstimate.of(to_do, records)
    assert (estimate.seconds, estimate.estimated, estimate.unestimated) == \
        (1000.0 + 3 * 250.0, 4, ("tinybert-td-3l-mrpc-s1",))
    assert "about 0.5 h" in str(estimate) and "no record to judge the other 1 from (tinybert-td-3l-mrpc-s1)" in str(estimate)

    # once the teacher has trained in this runs folder, it is not counted again
    _write_record(runs["teacher-mrpc"].run_dir, status="completed")
    assert "teacher-mrpc" not in _runs_to_do(runs, {"kd-3l-mrpc-s4"})


def test_a_row_never_recorded_on_a_task_is_judged_by_another_row_of_its_method_and_student(
        tmp_path, shared_data, monkeypatch):
    """An ablation row (TinyBERT's top mapping) new to a task trains about as long as the full row of
    the same method and student there: its cells are judged by that row's median, and said to be; the
    same model on another task, another student on the task, or a row of the same model that trains
    another number of steps (other epochs, another training file) does not count."""
    from kdbench.reproduce import TrainingEstimate, select_runs
    from kdbench.reproduce.selection import _resolved_config
    from kdbench.sweep import expand, load_spec

    monkeypatch.setenv("KDBENCH_DATA_DIR", str(shared_data))
    output, records = tmp_path / "runs", tmp_path / "records"
    runs = expand(select_runs(load_spec(SPEC_FOLDER / "tinybert-mappings.yaml"),
                              ["tinybert-td-3l-192-rte-s*", "tinybert-td-3l-192-top-rte-s*"]), output=output).runs
    full_row = _resolved_config(runs["tinybert-td-3l-192-rte-s1"].values)  # as a record stores it
    assert full_row["method_params"]["intermediate_epochs"] == 10
    model = {"method": "tinybert", "student": "teacher-3l-192"}
    for seed, seconds in ((1, 300.0), (2, 500.0), (3, 350.0)):
        _write_record(records / runs[f"tinybert-td-3l-192-rte-s{seed}"].run_dir.name, status="completed",
                      label="tinybert-td-3l-192", **model, task="rte", train_seconds=seconds, config=full_row)
    _write_record(records / "elsewhere-1", status="completed", label="tinybert-td-3l-192", **model, task="cola",
                  train_seconds=9000.0, config=full_row)
    _write_record(records / "elsewhere-2", status="completed", label="tinybert-td-3l", method="tinybert",
                  student="teacher-3l", task="rte", train_seconds=9000.0, config=full_row)
    longer = {**full_row, "method_params": {**full_row["method_params"], "intermediate_epochs": 20}}
    augmented = {**full_row, "data": {**full_row["data"], "train_file": "augmented/rte-x4.tsv"}}
    for name, config in (("more-epochs", longer), ("augmented", augmented)):
        for seed in (1, 2, 3):
            _write_record(records / f"{name}-{seed}", status="completed", label=name, **model, task="rte",
                          train_seconds=9000.0, config=config)

    top = {name: run for name, run in runs.items() if name.startswith("tinybert-td-3l-192-top-rte-s")}
    estimate = TrainingEstimate.of(top, records)
    assert (estimate.seconds, estimate.estimated, estimate.by_another_row, estimate.unestimated) == \
        (5 * 350.0, 5, 5, ())
    assert str(estimate) == ("Training time of the 5 runs to do that the records can judge (stages included): about "
                             "0.5 h on the machines that wrote them (5 of them judged by another row of the same "
                             "method and student on their task).")

    nothing = TrainingEstimate.of(top, tmp_path / "no-records")
    assert str(nothing).startswith("No record to judge the training time of the 5 runs to do from "
                                   "(tinybert-td-3l-192-top-rte-s1, ")
    assert str(TrainingEstimate.of({}, records)) == "Nothing left to train."


def test_committed_records_are_found_under_the_names_the_spec_gives_today(tmp_path, shared_data, monkeypatch):
    """The study continues on another machine with ``--missing`` only while the committed records keep
    the folder names today's spec plans (on the same data): e.g. table 1's first three KD seeds on MRPC."""
    from kdbench.reproduce import recorded_cells, select_runs
    from kdbench.sweep import expand, load_spec

    monkeypatch.setenv("KDBENCH_DATA_DIR", str(shared_data))
    spec = select_runs(load_spec(SPEC_FOLDER / "cross-method.yaml"), ["kd-3l-mrpc-s[123]", "kd-3l-rte-s*"])
    assert recorded_cells(expand(spec, output=tmp_path / "runs").runs, records_folder("cross-method")) == \
        {"kd-3l-mrpc-s1", "kd-3l-mrpc-s2", "kd-3l-mrpc-s3", *(f"kd-3l-rte-s{seed}" for seed in range(1, 6))}


def test_mobilebert_bare_student_is_trained_as_the_pd_student_is_but_for_the_objective():
    """Table 9's bare row against + PD: the same optimiser, rate, warm-up and decay (MobileBERT's LAMB
    recipe), or the table would compare optimisers as well as objectives."""
    import dataclasses

    from kdbench.config import build_run_config
    from kdbench.methods.mobilebert import PD_OPTIMIZATION
    from kdbench.optimization import resolve

    stages = build_spec("mobilebert-objectives")["stages"]
    bare, pd = ({**stages[name], "teacher": "teacher-path", "output": "runs"} for name in ("bare-pretrain", "pd-pretrain"))
    bare_optimization = resolve(None, build_run_config(bare).train)  # finetune declares no optimisation
    pd_optimization = resolve(PD_OPTIMIZATION, build_run_config(pd).train)
    assert bare_optimization.optimizer == "lamb"
    assert dataclasses.replace(bare_optimization, sources={}) == dataclasses.replace(pd_optimization, sources={})


def test_mrpc_da_cells_cache_the_teacher_layers_without_changing_their_identity():
    from kdbench.config import build_run_config

    cells = {cell["name"]: cell for cell in build_spec("tinybert-procedures")["cells"]}
    mrpc = cells["wo-gd-mrpc-s2"]
    assert mrpc["train.teacher_cache_budget_mb"] == 40960  # ~35 GB of float16 layers for 32,511 rows
    assert "train.teacher_cache_budget_mb" not in cells["wo-gd-rte-s2"]  # RTE's DA rows ran the teacher live
    assert "train.teacher_cache_budget_mb" not in cells["tinybert-gd-td-3l-192-mrpc-s2"]  # no DA: fits 16 GiB
    keys = {"method": "tinybert", "task": "mrpc", "student": "teacher-3l-192", "teacher": "minilm-l6", "seed": 2}
    with_budget = build_run_config({**keys, "train.teacher_cache_budget_mb": mrpc["train.teacher_cache_budget_mb"]})
    assert with_budget.train.teacher_cache_budget_mb == 40960
    assert with_budget.config_hash() == build_run_config(keys).config_hash()


def test_da_cells_find_their_records_by_the_digest_of_an_augmented_set_not_built_yet(tmp_path, shared_data,
                                                                                    monkeypatch, capsys):
    """On a fresh machine a DA cell's augmented set is built only after the MLM teacher trains, and
    the cell's folder hashes the set: until then ``--missing`` (and its dry run) matches the cell to its
    committed record by the digest that record read, seed for seed (table 1's TinyBERT4 on STS-B, seeds
    1-3 recorded), instead of planning every seed again. A set built with other bits matches nothing."""
    from kdbench.reproduce import build_prerequisites, cells_awaiting_their_files, recorded_cells, write_selection
    from kdbench.sweep import expand, load_spec

    monkeypatch.setenv("KDBENCH_DATA_DIR", str(shared_data))
    monkeypatch.chdir(tmp_path)
    output, records = Path("runs/reproduction"), records_folder("cross-method")
    spec_path = SPEC_FOLDER / "cross-method.yaml"
    run_spec = write_selection(spec_path, ["tinybert4-stsb-s*"], output)
    assert build_prerequisites("cross-method", run_spec, output, [], dry_run=True) == 0  # the corpus, not the set
    runs = expand(load_spec(run_spec), output=output).runs
    assert recorded_cells(runs, records) == set()

    awaiting = cells_awaiting_their_files(runs, records)
    assert sorted(awaiting) == ["tinybert4-stsb-s1", "tinybert4-stsb-s2", "tinybert4-stsb-s3"]
    assert awaiting["tinybert4-stsb-s2"].record == "tinybert-stsb-894ff519659f"
    assert {match.digests for match in awaiting.values()} == \
        {(("stsb-x4.tsv", "96897d6da16648f852fd2812413ae85a54914d1078c4c2253612da75e1a641ea"),)}
    capsys.readouterr()
    selected = load_spec(write_selection(spec_path, ["tinybert4-stsb-s*"], output, leave_out_recorded_in=records))
    assert [cell["name"] for cell in selected["cells"]] == ["tinybert4-stsb-s4", "tinybert4-stsb-s5"]
    said = capsys.readouterr().out
    assert "3 of 5 chosen cells have a completed record" in said and "stsb-x4.tsv sha256 96897d6da166…" in said

    augmented = Path(runs["tinybert4-stsb-s1"].values["train_file"])
    augmented.parent.mkdir(parents=True, exist_ok=True)
    augmented.write_text("sentence1\tsentence2\tscore\nanother machine\tother bits\t2.5\n")
    rebuilt = expand(load_spec(run_spec), output=output).runs
    assert recorded_cells(rebuilt, records) == set() and cells_awaiting_their_files(rebuilt, records) == {}
