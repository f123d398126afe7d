"""An outside package (tests/plugin_package, installed with pip as a user would) registers a method
and a Hub-style task through entry points; both run in a sweep with submitit's debug executor.

The Hub is unreachable here, so the task's Hub dataset (stanfordnlp/sst2) comes through a patched
``datasets.load_dataset``: it returns a real ``datasets.Dataset`` with the Hub's columns and
ClassLabel names, holding the real SST-2 rows of the GLUE files under $KDBENCH_DATA_DIR.
"""

from __future__ import annotations

import json
from importlib.metadata import entry_points

import datasets
import pytest
from safetensors.torch import load_file

from tiny_models import TINY_RUN

pytest.importorskip("kdbench_example_plugin", reason="install the plug-in: pip install ./tests/plugin_package")

HUB_PATH = "stanfordnlp/sst2"


@pytest.fixture
def hub_sst2(shared_data, monkeypatch):
    """``datasets.load_dataset`` for stanfordnlp/sst2, serving the real SST-2 rows; records each call."""
    features = datasets.Features({"idx": datasets.Value("int32"), "sentence": datasets.Value("string"),
                                  "label": datasets.ClassLabel(names=["negative", "positive"])})
    files = {"train": "train.tsv", "validation": "dev.tsv"}
    calls = []

    def load_dataset(path, name=None, split=None, **kwargs):
        calls.append((path, name, split))
        if path != HUB_PATH or split not in files:
            raise FileNotFoundError(f"not served offline: {path} {split}")
        lines = (shared_data / "glue_data" / "SST-2" / files[split]).read_text().splitlines()[1:65]
        rows = [line.split("\t") for line in lines]
        return datasets.Dataset.from_dict({"idx": list(range(len(rows))), "sentence": [r[0] for r in rows],
                                           "label": [int(r[1]) for r in rows]}, features=features)

    monkeypatch.setattr(datasets, "load_dataset", load_dataset)
    return calls


def test_the_package_registers_through_entry_points(capsys):
    from kdbench.cli import main

    methods = {ep.name: ep.value for ep in entry_points(group="kdbench.methods")}
    tasks = {ep.name: ep.value for ep in entry_points(group="kdbench.tasks")}
    assert methods["cosine-cls"] == "kdbench_example_plugin.method:CosineCLS"
    assert tasks["sst2-hub"] == "kdbench_example_plugin.tasks:SST2_HUB"
    assert main(["list", "methods"]) == 0 and main(["list", "tasks"]) == 0
    out = capsys.readouterr().out
    assert "cosine-cls\tclassification,regression\tdefault student_init=teacher\t" in out
    assert "sst2-hub\tclassification\tacc" in out


@pytest.mark.integration
def test_plugin_method_and_hub_task_run_in_a_sweep(tmp_path, tiny_models, hub_sst2):
    from kdbench.sweep import expand, run_sweep

    spec = {"name": "plugins", "output": str(tmp_path / "sw"), "defaults": {**TINY_RUN, "student": "teacher-1l"},
            "stages": {"teacher": {"method": "finetune", "task": "sst2-hub", "student": str(tiny_models["teacher"])}},
            "grid": {"methods": {"cosine-cls": {"teacher": "${teacher}", "weight": 2.0},
                                 "kd": {"teacher": "${teacher}"}},
                     "tasks": ["sst2-hub"], "seeds": [3]}}
    sweep = expand(spec)
    assert run_sweep(sweep, "debug") == {"teacher": "done", "cosine-cls-sst2-hub-s3": "done", "kd-sst2-hub-s3": "done"}
    assert {call[2] for call in hub_sst2} == {"train", "validation"} and {c[0] for c in hub_sst2} == {HUB_PATH}

    run = sweep.runs["cosine-cls-sst2-hub-s3"]
    record = json.loads((run.run_dir / "result.json").read_text())
    print(f"\n[plugin sweep] cosine-cls on sst2-hub: {record['metrics']}, init {record['student_init']}, "
          f"last loss terms {record['stages'][0]['final_loss_terms']}")
    assert record["status"] == "completed" and record["task"] == "sst2-hub" and "acc" in record["metrics"]
    assert record["config"]["method_params"] == {"weight": 2.0, "layer": -1}
    assert record["student_init"] == {"kind": "teacher", "chosen_by": "method default",
                                      "source": str(sweep.runs["teacher"].run_dir / "model"), "layers": [0]}
    assert set(record["stages"][0]["final_loss_terms"]) == {"task", "cls"}
    assert record["data"]["train_rows"] == 32 and record["data"]["dev_rows"] == 32
    assert [d["source"] for d in record["inputs"]["data"]] == [f"hub:{HUB_PATH}//train", f"hub:{HUB_PATH}//validation"]
    # The projection the loss received is the module the engine trained and checkpointed.
    extras = load_file(str(run.run_dir / "stages" / "0-distil" / "final" / "extras.safetensors"))
    assert set(extras) == {"cls_projection.weight", "cls_projection.bias"}
    kd = json.loads((sweep.runs["kd-sst2-hub-s3"].run_dir / "result.json").read_text())
    assert kd["status"] == "completed" and kd["student_init"]["kind"] == "random"  # kd's default, stated
