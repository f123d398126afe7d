"""The study's rebuild script installs old-commit weights only when they reproduce the record."""
import importlib.util
from pathlib import Path

import pytest

SCRIPT = Path(__file__).resolve().parents[2] / "results" / "reproduction" / "rebuild_teacher.py"


@pytest.fixture(scope="module")
def rebuild():
    spec = importlib.util.spec_from_file_location("rebuild_teacher", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


RECORD = {"metrics": {"acc": 80.14705882352942, "f1": 86.05851979345955},
          "stages": [{"name": "finetune", "final_loss_terms": {"task": 0.329027}}]}


def test_a_bit_identical_retraining_reproduces_the_record(rebuild):
    rebuilt = {**RECORD, "weights_sha256": {"model": "134e1da5"}}  # the old record names no digest
    assert rebuild.differences(RECORD, rebuilt) == []


def test_any_difference_is_named(rebuild):
    drifted = {"metrics": {"acc": 80.14705882352942, "f1": 86.0},
               "stages": [{"name": "finetune", "final_loss_terms": {"task": 0.329028}}]}
    found = rebuild.differences(RECORD, drifted)
    assert len(found) == 2
    assert "'f1': 86.0" in found[0] and "stage finetune" in found[1] and "0.329028" in found[1]
    with_digests = {**RECORD, "weights_sha256": {"model": "aa"}}
    assert rebuild.differences(with_digests, {**RECORD, "weights_sha256": {"model": "ab"}}) == [
        "weights sha256 ab != aa"]


def test_a_record_that_reads_another_run_is_refused_before_any_work(rebuild, tmp_path):
    import json

    import yaml

    (tmp_path / "result.json").write_text(json.dumps({"status": "completed"}))
    (tmp_path / "config.yaml").write_text(yaml.safe_dump({"teacher": "runs/finetune-mrpc-1", "student": "x"}))
    with pytest.raises(SystemExit):
        rebuild.main([str(tmp_path), "--data-dir", str(tmp_path), "--work", str(tmp_path / "work")])
    assert not (tmp_path / "work").exists()
