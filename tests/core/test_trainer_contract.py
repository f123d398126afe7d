"""The contract between kdbench and ``transformers.Trainer``'s private checkpoint methods.

``DistillationTrainer`` overrides ``_save_checkpoint``, ``_save``, ``_load_from_checkpoint`` and
``_load_best_model``: the trained module is the student plus the method's extra modules, saved as
``student/`` + ``extras.safetensors``, which Trainer's own save/load cannot express through its
documented hooks. These names are private, so a transformers release may rename them or stop
calling them; if it does, checkpoints silently lose the extra modules, resume restarts from
scratch, or the best model is never loaded. This test runs save, resume and best-model load
through a real ``Trainer`` and checks that each override was called and did its job. It is the
reason for the upper bound on transformers in ``pyproject.toml``: re-run it before raising it.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import torch
from safetensors.torch import load_file

from kdbench.config import build_run_config
from kdbench.engine import DistillationTrainer, run_experiment
from tiny_models import TINY_RUN


def _spy(monkeypatch, name: str) -> list[tuple]:
    calls: list[tuple] = []
    original = getattr(DistillationTrainer, name)

    def wrapper(self, *args, **kwargs):
        calls.append(args)
        return original(self, *args, **kwargs)

    monkeypatch.setattr(DistillationTrainer, name, wrapper)
    return calls


def _student_weights(folder: Path) -> dict[str, torch.Tensor]:
    return load_file(str(folder / "student" / "model.safetensors"))


def test_trainer_calls_the_checkpoint_overrides_for_save_resume_and_best_model(tiny_teacher, shared_data,
                                                                                tmp_path, monkeypatch):
    calls = {name: _spy(monkeypatch, name)
             for name in ("_save_checkpoint", "_save", "_load_from_checkpoint", "_load_best_model")}
    # tinybert's intermediate stage trains an extra module (its projection W): checkpoints must carry
    # it; its prediction stage selects the best checkpoint on dev.
    config = build_run_config({"method": "tinybert", "task": "sst2", "teacher": str(tiny_teacher),
                               "student": "teacher-1l", "mode": "task", "data_dir": str(shared_data / "glue_data"),
                               "output": str(tmp_path), **TINY_RUN, "train.save_total_limit": 10,
                               "keep_checkpoints": "all"})  # the default keeps only the last once a stage ends
    run_dir = run_experiment(config)
    intermediate_dir, stage_dir = run_dir / "stages" / "0-intermediate", run_dir / "stages" / "1-prediction"

    # save: the prediction stage (it selects on dev) saved at its evaluations, steps 2 and 4, through
    # _save_checkpoint/_save in kdbench's layout (student/ + extras.safetensors). The intermediate
    # stage selects nothing, so it saves only on the clock (test below), not after every epoch.
    assert len(calls["_save_checkpoint"]) == 2 and len(calls["_save"]) >= 2
    assert not list(intermediate_dir.glob("checkpoint-*"))
    checkpoints = sorted(stage_dir.glob("checkpoint-*"), key=lambda p: int(p.name.split("-")[1]))
    assert [p.name for p in checkpoints] == ["checkpoint-2", "checkpoint-4"]
    for checkpoint in checkpoints:
        assert (checkpoint / "student" / "model.safetensors").is_file()
        assert (checkpoint / "trainer_state.json").is_file()

    # best model: a stage that selects on dev loads the best checkpoint through _load_best_model,
    # and that is what the stage keeps as its final weights.
    best = json.loads((checkpoints[-1] / "trainer_state.json").read_text())["best_model_checkpoint"]
    assert best is not None and calls["_load_best_model"], "Trainer no longer calls _load_best_model"
    final, expected = _student_weights(stage_dir / "final"), _student_weights(Path(best))
    assert final.keys() == expected.keys() and all(torch.equal(final[key], expected[key]) for key in expected)

    # resume: an interrupted stage (no stage_done.json, no record, its last checkpoint lost) resumes
    # from checkpoint-2 through _load_from_checkpoint and saves only the steps after it.
    for path in (stage_dir / "stage_done.json", run_dir / "result.json"):
        path.unlink()
    shutil.rmtree(checkpoints[-1])
    saves_before = len(calls["_save_checkpoint"])
    assert run_experiment(config) == run_dir
    assert [Path(args[0]).name for args in calls["_load_from_checkpoint"]] == ["checkpoint-2"], \
        "Trainer no longer calls _load_from_checkpoint on resume"
    assert len(calls["_save_checkpoint"]) - saves_before == 1  # step 4 only: training went on from step 2
    assert json.loads((run_dir / "result.json").read_text())["status"] == "completed"


def test_a_stage_without_model_selection_checkpoints_on_the_clock_with_its_extras(tiny_teacher, shared_data,
                                                                                   tmp_path):
    # checkpoint_minutes so small that every step is "due": the intermediate stage saves each step, and
    # its checkpoints carry the projection W it trains besides the student.
    config = build_run_config({"method": "tinybert", "task": "sst2", "teacher": str(tiny_teacher),
                               "student": "teacher-1l", "mode": "task", "data_dir": str(shared_data / "glue_data"),
                               "output": str(tmp_path), **TINY_RUN, "train.save_total_limit": 10,
                               "keep_checkpoints": "all", "checkpoint_minutes": 1e-9})
    intermediate_dir = run_experiment(config) / "stages" / "0-intermediate"
    checkpoints = sorted(intermediate_dir.glob("checkpoint-*"), key=lambda p: int(p.name.split("-")[1]))
    assert [p.name for p in checkpoints] == ["checkpoint-1", "checkpoint-2", "checkpoint-3", "checkpoint-4"]
    for checkpoint in checkpoints:
        assert any(key.startswith("fit_dense.") for key in load_file(str(checkpoint / "extras.safetensors")))
