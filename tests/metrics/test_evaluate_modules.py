"""kdbench's evaluate modules (``kdbench_glue``, ``kdbench_squad``): loaded offline from the package's
files, equal to kdbench's own evaluation on real dev data, equal to the official SQuAD scores, and
present in a built (non-editable) wheel."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import numpy as np
import pytest
from squad_fixtures import (DEV_V1, DEV_V2, KDBENCH_V2_NAMES, OFFICIAL_V1, OFFICIAL_V2, REFERENCE_V1,
                            squad_references, v2_leaderboard_style)

from kdbench import metrics as M
from kdbench.config import DataConfig, RunConfig
from kdbench.plugins import TASKS
from kdbench.tasks.squad import SQUAD_V1, SQUAD_V2

evaluate = pytest.importorskip("evaluate")
REPO_ROOT = Path(__file__).resolve().parents[2]
GLUE_WITH_REAL_DEV = ["cola", "sst2", "mrpc", "stsb", "qnli", "rte", "wnli"]


def _load(module: str, config: str):
    return evaluate.load(M.module_path(module), config, keep_in_memory=True)


def _gold(task_name: str, shared_data: Path):
    task = TASKS.get(task_name)
    run = RunConfig(method="finetune", task=task_name, student="x", data=DataConfig(data_dir=str(shared_data)))
    return task, task.load_rows("dev", run)


def _predictions(task, labels: list) -> tuple[np.ndarray, np.ndarray]:
    """(predictions, references) as ids / scores: the gold corrupted deterministically (every 3rd and
    7th id moved to the next class; STS-B scores shifted by a position-dependent amount)."""
    if task.glue.label_names is None:
        refs = np.array(labels, dtype=np.float64)
        return refs + np.array([((k * 37) % 11 - 5) / 4 for k in range(len(refs))]), refs
    names = task.glue.label_names
    refs = np.array([names.index(label) for label in labels])
    preds = np.array([(r + 1) % len(names) if k % 3 == 0 or k % 7 == 0 else r for k, r in enumerate(refs)])
    return preds, refs


@pytest.mark.parametrize("task_name", GLUE_WITH_REAL_DEV)
def test_glue_module_equals_kdbench_evaluation_on_real_dev_data(task_name: str, shared_data: Path,
                                                                tmp_path: Path) -> None:
    task, gold = _gold(task_name, shared_data)
    preds, refs = _predictions(task, gold.labels)
    module = _load("glue", task_name).compute(predictions=preds.tolist(), references=refs.tolist())
    # kdbench's own evaluation: a run's scoring and `kdbench evaluate` on a prediction file
    assert module == task.compute_metrics(preds, refs)
    names = task.glue.label_names
    path = tmp_path / "pred.tsv"
    path.write_text("index\tprediction\n" + "".join(
        f"{i}\t{names[int(p)] if names else repr(float(p))}\n" for i, p in zip(gold.indices, preds)))
    assert module == task.score_prediction_file(path, shared_data)
    # and an independent implementation
    from scipy.stats import pearsonr, spearmanr
    from sklearn.metrics import accuracy_score, f1_score, matthews_corrcoef

    independent = {"acc": lambda: accuracy_score(refs, preds), "f1": lambda: f1_score(refs, preds),
                   "mcc": lambda: matthews_corrcoef(refs, preds), "pearson": lambda: pearsonr(preds, refs)[0],
                   "spearman": lambda: spearmanr(preds, refs)[0]}
    assert set(module) == set(M.GLUE_TASK_METRICS[task_name])
    for name, value in module.items():
        assert value == pytest.approx(100 * independent[name](), abs=1e-9), name
    assert all(5.0 < value < 99.0 for value in module.values())  # a real, imperfect score


def test_glue_module_configs_and_mnli_mismatched() -> None:
    preds, refs = [0, 1, 2, 2], [0, 1, 2, 1]
    assert _load("glue", "mnli").compute(predictions=preds, references=refs) == {"acc": 75.0}
    assert _load("glue", "mnli-mm").compute(predictions=preds, references=refs) == {"acc_mm": 75.0}
    assert _load("glue", "mnli_mismatched").compute(predictions=preds, references=refs) == {"acc_mm": 75.0}
    with pytest.raises(KeyError, match="unknown config 'glue-x'"):
        _load("glue", "glue-x")


def test_squad_v1_module_gives_the_official_scores(shared_data: Path) -> None:
    answers = json.loads((shared_data / REFERENCE_V1).read_text())
    references = squad_references(shared_data, DEV_V1)
    predictions = [{"id": qid, "prediction_text": text} for qid, text in answers.items()]
    result = _load("squad", "squad").compute(predictions=predictions, references=references)
    assert (round(result["em"], 3), round(result["f1"], 3)) == (OFFICIAL_V1["exact_match"], OFFICIAL_V1["f1"])
    assert result == {k: v for k, v in SQUAD_V1.score_prediction_file(shared_data / REFERENCE_V1, shared_data).items()
                      if k in ("em", "f1")}


@pytest.mark.parametrize("threshold", [1.0, 0.5])
def test_squad_v2_module_gives_the_official_scores(threshold: float, shared_data: Path, tmp_path: Path) -> None:
    answers, na_probs = v2_leaderboard_style(shared_data)
    references = squad_references(shared_data, DEV_V2)
    predictions = [{"id": qid, "prediction_text": text, "no_answer_probability": na_probs[qid]}
                   for qid, text in answers.items()]
    result = _load("squad", "squad-v2").compute(predictions=predictions, references=references,
                                                no_answer_threshold=threshold)
    official = OFFICIAL_V2[threshold]
    for ours, theirs in KDBENCH_V2_NAMES.items():
        assert result[ours] == pytest.approx(official[theirs], abs=1e-9), ours
    preds, probs = tmp_path / "p.json", tmp_path / "na.json"
    preds.write_text(json.dumps(answers))
    probs.write_text(json.dumps(na_probs))
    from_file = SQUAD_V2.score_prediction_file(preds, shared_data, na_probs=probs, na_prob_threshold=threshold)
    assert result == {k: v for k, v in from_file.items() if k not in ("missing_predictions", "unknown_ids")}


def test_squad_module_refuses_predictions_for_other_questions() -> None:
    refs = [{"id": "a", "answers": {"text": ["Paris"], "answer_start": [0]}}]
    with pytest.raises(ValueError, match="none of the 1 prediction ids"):
        _load("squad", "squad").compute(predictions=[{"id": "b", "prediction_text": "Paris"}], references=refs)


@pytest.mark.slow
def test_modules_ship_in_the_wheel_and_load_from_an_installed_copy(tmp_path: Path) -> None:
    """Build the wheel as `pip install` does, unpack it elsewhere, and evaluate.load from there."""
    source = tmp_path / "src"
    shutil.copytree(REPO_ROOT, source, ignore=shutil.ignore_patterns(
        ".git", ".venv", "build", "*.egg-info", "runs", "__pycache__", ".ruff_cache", ".pytest_cache", "tests"))
    subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "-q", "-w", str(tmp_path / "dist"),
                    str(source)], check=True, capture_output=True, text=True)
    (wheel,) = (tmp_path / "dist").glob("kdbench-*.whl")
    names = zipfile.ZipFile(wheel).namelist()
    assert {"kdbench/data/kdbench_glue.py", "kdbench/data/kdbench_squad.py", "kdbench/metric_modules.py"} <= set(names)
    installed = tmp_path / "site"
    zipfile.ZipFile(wheel).extractall(installed)
    script = ("import json, evaluate, kdbench; from kdbench.metrics import module_path; "
              "path = module_path('glue'); "
              "m = evaluate.load(path, 'mrpc', keep_in_memory=True); "
              "print(json.dumps([kdbench.__file__, path, m.compute(predictions=[1, 0, 1, 1], references=[1, 1, 0, 1])]))")
    env = {**os.environ, "PYTHONPATH": str(installed), "HF_HUB_OFFLINE": "1", "HF_HOME": str(tmp_path / "hf")}
    out = subprocess.run([sys.executable, "-c", script], cwd=tmp_path, env=env, check=True, capture_output=True,
                         text=True)
    package, path, result = json.loads(out.stdout.strip().splitlines()[-1])
    assert Path(package).is_relative_to(installed) and Path(path).is_relative_to(installed)
    assert result == {"acc": 50.0, "f1": pytest.approx(200 / 3)}  # tp 2, fp 1, fn 1
