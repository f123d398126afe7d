"""``kdbench quickstart``: its spec, its verdict on hand-made scores, and a whole job on tiny models
and real SST-2 rows (the job's runs are ordinary resumable runs; a second call trains nothing)."""

from __future__ import annotations

import io
import json

import pytest

from kdbench.config import ConfigError
from kdbench.quickstart import Comparison, QuickStart, build_spec, format_comparison, run_quickstart
from kdbench.sweep import expand


def test_spec_pairs_each_seed_with_a_no_teacher_run_from_the_same_initialisation():
    spec = build_spec(QuickStart(seeds=(4, 7)), data_dir="/data")
    assert spec["defaults"]["data_dir"] == "/data" and spec["defaults"]["max_train_samples"] == 4000
    assert spec["stages"]["teacher"]["student"] == "minilm-l6"
    by_name = {cell["name"]: cell for cell in spec["cells"]}
    assert sorted(by_name) == ["distilled-s4", "distilled-s7", "no-teacher-s4", "no-teacher-s7"]
    distilled, baseline = by_name["distilled-s7"], by_name["no-teacher-s7"]
    assert distilled["method"] == "tinybert" and baseline["method"] == "finetune"
    shared = ("student", "student_init", "seed", "teacher")
    assert {k: distilled[k] for k in shared} == {k: baseline[k] for k in shared}
    # as many passes over the data: 5 intermediate + 3 prediction epochs against 8 of fine-tuning
    assert distilled["intermediate_epochs"] + distilled["prediction_epochs"] == baseline["epochs"] == 8
    assert "epochs" not in distilled  # the stages' own epochs, not a run-wide value


def test_students_may_start_from_the_pretrained_teacher_model():
    keys = {"student_init": "teacher", "student_init_from": "minilm-l6", "student_layers": "bottom"}
    spec = build_spec(QuickStart(student="teacher-3l", student_keys=keys, method="kd", method_keys={"alpha": 0.5},
                                 baseline_epochs=2))
    for cell in spec["cells"]:
        assert {k: cell[k] for k in keys} == keys and cell["student"] == "teacher-3l"


@pytest.mark.parametrize("bad, message", [({"seeds": ()}, "at least one"), ({"seeds": (1, 1)}, "each seed once"),
                                          ({"method": "finetune"}, "distillation method")])
def test_bad_settings_are_named(bad, message):
    with pytest.raises(ConfigError, match=message):
        QuickStart(**bad)


def comparison(distilled, no_teacher):
    return Comparison("sst2", "acc", "kd", 85.0, dict(enumerate(distilled, 1)), dict(enumerate(no_teacher, 1)))


def test_verdict_needs_a_gain_on_every_seed_beyond_twice_its_standard_error():
    # gains 1.0, 1.2, 0.8: mean 1.0, std 0.2, standard error 0.115
    helps = comparison([81.0, 81.2, 80.8], [80.0, 80.0, 80.0])
    assert helps.gains == pytest.approx({1: 1.0, 2: 1.2, 3: 0.8})
    assert helps.verdict() == "holds: positive on every seed, mean +1.00 ± 0.20 over 3 seeds, standard error 0.12"
    # gains +2, -1, +2: mean +1 but not on every seed
    assert comparison([82, 79, 82], [80, 80, 80]).verdict().startswith("within the seed noise: mean +1.00 ± 1.73")
    assert comparison([79, 78.5, 79.2], [80, 80, 80]).verdict().startswith("reversed: negative on every seed")
    assert comparison([81], [80]).verdict().startswith("one seed (+1.00)")


def test_table_shows_each_seed_and_the_mean_and_std():
    text = format_comparison(comparison([81.0, 81.2, 80.8], [80.0, 80.5, 79.5]))
    assert "| student, distilled (kd) | 81.00 | 81.20 | 80.80 | 81.00 ± 0.20 |" in text
    assert "| student, no teacher (finetune) | 80.00 | 80.50 | 79.50 | 80.00 ± 0.50 |" in text
    assert "| gain of distillation | +1.00 | +0.70 | +1.30 | 1.00 ± 0.30 |" in text
    assert "| teacher (fine-tuned) |  |  |  | 85.00 |" in text


def test_whole_job_on_tiny_models_runs_once_and_reports_its_records(tmp_path, shared_data, minilm_path):
    from tiny_models import make_tiny_bert

    pretrained = make_tiny_bert(tmp_path / "pretrained", minilm_path, layers=4)
    job = QuickStart(teacher_model=str(pretrained), student="teacher-2l",
                     student_keys={"student_init": "teacher", "student_init_from": str(pretrained)},
                     method_keys={"intermediate_epochs": 1, "prediction_epochs": 1}, baseline_epochs=2,
                     max_train_samples=32, max_seq_length=32, batch_size=16, seeds=(1, 2), teacher_epochs=1, lr=1e-3)
    printed = io.StringIO()
    result = run_quickstart(job, tmp_path / "runs", data_dir=str(shared_data), out=printed)

    sweep = expand(build_spec(job, str(shared_data)), tmp_path / "runs")
    records = {name: json.loads((run.run_dir / "result.json").read_text()) for name, run in sweep.runs.items()}
    assert result.teacher == records["teacher"]["metrics"]["acc"]
    assert result.distilled == {s: records[f"distilled-s{s}"]["metrics"]["acc"] for s in (1, 2)}
    assert result.no_teacher == {s: records[f"no-teacher-s{s}"]["metrics"]["acc"] for s in (1, 2)}
    assert records["distilled-s2"]["method"] == "tinybert" and records["distilled-s2"]["seed"] == 2
    assert [s["name"] for s in records["distilled-s1"]["stages"]] == ["intermediate", "prediction"]
    assert records["no-teacher-s1"]["student_init"]["source"] == str(pretrained.resolve())
    assert records["teacher"]["data"]["train_rows"] == 32
    table = (tmp_path / "runs" / "comparison.md").read_text()
    assert table.strip() in printed.getvalue() and "gain of distillation" in table
    # The written spec is the job: it expands to the same run folders.
    written = expand(__import__("yaml").safe_load((tmp_path / "runs" / "quickstart.yaml").read_text()))
    assert {n: r.run_dir for n, r in written.runs.items()} == {n: r.run_dir for n, r in sweep.runs.items()}

    stamps = {name: (run.run_dir / "result.json").stat().st_mtime_ns for name, run in sweep.runs.items()}
    again = run_quickstart(job, tmp_path / "runs", data_dir=str(shared_data), out=io.StringIO())
    assert again == result
    assert stamps == {name: (run.run_dir / "result.json").stat().st_mtime_ns for name, run in sweep.runs.items()}


def test_bad_data_dir_is_named_before_anything_is_written(tmp_path, minilm_path):
    from tiny_models import make_tiny_bert

    pretrained = make_tiny_bert(tmp_path / "pretrained", minilm_path, layers=4)
    job = QuickStart(teacher_model=str(pretrained), student="teacher-2l")
    with pytest.raises(Exception, match="no SST-2 data folder.*nowhere"):
        run_quickstart(job, tmp_path / "runs", data_dir=str(tmp_path / "nowhere"), out=io.StringIO())
    assert not (tmp_path / "runs").exists()
