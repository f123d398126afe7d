"""The engine end to end through the command line, on real SST-2 rows and tiny models."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from transformers import AutoModelForSequenceClassification

from kdbench.cli import main
from kdbench.records import load_records

SMALL = ["max_train_samples=48", "max_eval_samples=32", "max_seq_length=32", "batch_size=8",
         "eval_batch_size=16", "epochs=1", "logging_steps=2"]
RECORD_KEYS = {"schema_version", "method", "task", "teacher", "student", "config", "metrics", "student_params",
               "teacher_params", "train_seconds", "status", "seed", "versions"}


def run_cli(args: list[str], capsys) -> tuple[int, list[str]]:
    code = main(args)
    return code, capsys.readouterr().out.strip().splitlines()


def test_finetune_then_kd_write_complete_records_and_loadable_models(tiny_teacher, shared_data, tmp_path, capsys):
    runs = tmp_path / "runs"
    code, out = run_cli(["run", "finetune", "--task", "sst2", "--student", str(tiny_teacher), "--data-dir",
                         str(shared_data / "glue_data"), "--output", str(runs), *SMALL], capsys)
    assert code == 0
    teacher_dir = Path(out[-1])
    assert teacher_dir.parent == runs and (teacher_dir / "result.json").is_file()

    code, out = run_cli(["run", "kd", "--task", "sst2", "--teacher", str(teacher_dir / "model"), "--student",
                         "teacher-1l", "student_init=teacher", "student_layers=[1]", "--data-dir",
                         str(shared_data / "glue_data"), "--output", str(runs), "alpha=0.7", "temperature=3",
                         *SMALL], capsys)
    assert code == 0
    kd_dir = Path(out[-1])
    record = json.loads((kd_dir / "result.json").read_text())
    assert set(record) >= RECORD_KEYS
    assert record["status"] == "completed" and record["method"] == "kd" and record["task"] == "sst2"
    assert 0.0 <= record["metrics"]["acc"] <= 100.0
    assert record["config"]["method_params"] == {"alpha": 0.7, "temperature": 3.0, "kl_reduction": "batchmean"}
    assert record["student_params"] < record["teacher_params"]
    assert record["data"]["train_rows"] == 48 and record["data"]["dev_rows"] == 32
    assert (kd_dir / "config.yaml").is_file()
    student = AutoModelForSequenceClassification.from_pretrained(kd_dir / "model")
    assert student.config.num_hidden_layers == 1
    assert student.config.id2label == {0: "negative", 1: "positive"}

    frame = load_records(runs)
    assert sorted(frame["method"]) == ["finetune", "kd"]
    assert set(frame["status"]) == {"completed"}
    assert "metric.acc" in frame.columns


def test_a_stage_shorter_than_logging_steps_still_records_its_loss_terms(tiny_teacher, shared_data, tmp_path,
                                                                          capsys):
    code, out = run_cli(["run", "kd", "--task", "sst2", "--teacher", str(tiny_teacher), "--student", "teacher-1l",
                         "--data-dir", str(shared_data / "glue_data"), "--output", str(tmp_path / "runs"),
                         *SMALL, "logging_steps=100", "max_steps=3"], capsys)
    assert code == 0
    stage = json.loads((Path(out[-1]) / "result.json").read_text())["stages"][0]
    assert stage["steps"] == 3
    terms = stage["final_loss_terms"]
    assert set(terms) == {"ce", "kd"}, "the 3 steps after the last periodic log were never reported"
    assert all(0.0 < value < 50.0 for value in terms.values())
    # the stage's one logged window covers all 3 steps, so its last-epoch means are that window's
    assert stage["last_epoch_loss_steps"] == 3
    assert stage["last_epoch_loss_terms"] == pytest.approx(terms, rel=1e-5)


def test_repeating_a_finished_run_trains_nothing(tiny_teacher, shared_data, tmp_path, capsys):
    args = ["run", "finetune", "--task", "sst2", "--student", str(tiny_teacher), "--data-dir",
            str(shared_data / "glue_data"), "--output", str(tmp_path), *SMALL]
    assert run_cli(args, capsys)[0] == 0
    record_file = next(tmp_path.glob("*/result.json"))
    before = record_file.read_bytes(), record_file.stat().st_mtime_ns
    started = time.perf_counter()
    code, out = run_cli(args, capsys)
    assert code == 0 and Path(out[-1]) == record_file.parent
    assert (record_file.read_bytes(), record_file.stat().st_mtime_ns) == before
    assert time.perf_counter() - started < 5


def test_bad_input_fails_fast_with_one_line_naming_the_value(tiny_teacher, tmp_path, capsys):
    code = main(["run", "kd", "--task", "sst2", "--teacher", str(tiny_teacher), "--student", "teacher-1l",
                 "--output", str(tmp_path), "temperature=-2"])
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2 and len(err) == 1
    assert "temperature" in err[0] and "-2" in err[0]
    assert not any(tmp_path.iterdir())  # nothing was created before the error


def test_sigkill_mid_training_resumes_from_the_last_checkpoint(tiny_teacher, shared_data, tmp_path):
    args = [sys.executable, "-m", "kdbench", "run", "finetune", "--task", "sst2", "--student", str(tiny_teacher),
            "--data-dir", str(shared_data / "glue_data"), "--output", str(tmp_path), "max_train_samples=128",
            "max_eval_samples=16", "max_seq_length=32", "batch_size=4", "max_steps=60", "eval_steps=10",
            "train.save_total_limit=3"]
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "TQDM_DISABLE": "1"}
    log = (tmp_path / "first.log").open("w")
    first = subprocess.Popen(args, env=env, stdout=log, stderr=subprocess.STDOUT)
    deadline = time.time() + 600  # generous: the CPU may be shared
    while (time.time() < deadline and first.poll() is None
           and not list(tmp_path.glob("*/stages/0-finetune/checkpoint-*/trainer_state.json"))):
        time.sleep(0.05)
    assert first.poll() is None, (tmp_path / "first.log").read_text()[-2000:]
    time.sleep(0.3)  # let it train past the checkpoint before the kill
    first.send_signal(signal.SIGKILL)
    first.wait()
    checkpoints = sorted(tmp_path.glob("*/stages/0-finetune/checkpoint-*"))
    assert checkpoints, "no checkpoint was written before the kill"
    assert not list(tmp_path.glob("*/result.json")), "the run finished before it could be killed"

    second = subprocess.run(args, env=env, capture_output=True, text=True, timeout=900)
    assert second.returncode == 0, second.stdout[-2000:] + second.stderr[-2000:]
    resumed = [line for line in (second.stdout + second.stderr).splitlines() if "resuming from" in line]
    assert resumed, "the second run did not resume"
    resumed_step = int(resumed[0].rsplit("at step ", 1)[1])
    assert resumed_step >= 10
    record = json.loads(Path(second.stdout.strip().splitlines()[-1], "result.json").read_text())
    assert record["status"] == "completed"
    assert record["stages"][0]["steps"] == 60
    assert record["stages"][0]["resumed_from"].endswith(f"checkpoint-{resumed_step}")


def test_finetune_on_a_corpus_trains_a_masked_lm(tiny_teacher, tmp_path, capsys):
    from transformers import AutoModelForMaskedLM

    corpus = tmp_path / "corpus.txt"
    corpus.write_text("".join(f"line number {i} of a small plain text corpus\n" for i in range(40)))
    code, out = run_cli(["run", "finetune", "--task", "corpus", "--student", str(tiny_teacher), f"corpus={corpus}",
                         "--output", str(tmp_path / "runs"), "max_steps=4", "batch_size=8"], capsys)
    assert code == 0
    record = json.loads(Path(out[-1], "result.json").read_text())
    assert record["status"] == "completed" and record["metrics"] == {}
    assert record["stages"][0]["steps"] == 4
    assert AutoModelForMaskedLM.from_pretrained(Path(out[-1], "model")).config.architectures == ["BertForMaskedLM"]


def test_select_metric_keeps_the_checkpoint_best_on_that_metric(tiny_teacher, shared_data, tmp_path, capsys):
    # MRPC's main metric is F1; TinyBERT's script keeps the epoch with the best accuracy instead.
    code, out = run_cli(["run", "finetune", "--task", "mrpc", "--student", str(tiny_teacher), "--data-dir",
                         str(shared_data / "glue_data"), "--output", str(tmp_path), *SMALL, "epochs=3",
                         "select_metric=acc"], capsys)
    assert code == 0
    run_dir = Path(out[-1])
    record = json.loads((run_dir / "result.json").read_text())
    evals = [json.loads(line)["eval"] for line in (run_dir / "loss_terms.jsonl").read_text().splitlines()
             if '"eval"' in line]
    assert len(evals) == 3
    best = max(evals, key=lambda scores: scores["acc"])  # the first of equals, as the Trainer keeps it
    assert record["stages"][0]["metrics"] == {"eval_acc": best["acc"]}
    assert record["metrics"]["acc"] == best["acc"] and record["metrics"]["f1"] == best["f1"]
    assert record["config"]["train"]["select_metric"] == "acc"


def test_select_metric_must_be_a_dev_metric_of_the_task(tiny_teacher, tmp_path, capsys):
    code = main(["run", "finetune", "--task", "mrpc", "--student", str(tiny_teacher), "--output", str(tmp_path),
                 "select_metric=spearman"])
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2 and len(err) == 1
    assert "select_metric='spearman'" in err[0] and "mrpc" in err[0] and "f1, acc" in err[0]
    assert not any(tmp_path.iterdir())
