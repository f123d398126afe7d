"""`kdbench bench`: the TextBrewer job's losses and layer matches, summaries, report, bad input."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from kdbench import bench
from kdbench.cli import main
from kdbench.features import Features

REPO = Path(__file__).resolve().parents[2]


def _features(hidden: list[torch.Tensor], scores: list[torch.Tensor], logits: torch.Tensor) -> Features:
    return Features(logits=logits, hidden_states=tuple(hidden), attention_scores=tuple(scores))


def test_joint_stage_sums_tinybert_losses_over_uniformly_mapped_layers():
    torch.manual_seed(0)
    t_hidden = [torch.randn(2, 3, 4) for _ in range(5)]  # embeddings + 4 teacher layers
    t_scores = [torch.randn(2, 2, 3, 3) for _ in range(4)]
    s_hidden = [torch.randn(2, 3, 4) for _ in range(3)]  # embeddings + 2 student layers
    s_scores = [torch.randn(2, 2, 3, 3) for _ in range(2)]
    s_scores[0][0, 0, 0, 1] = -10000.0  # a padded key: zeroed on both sides before the MSE
    t_logits, s_logits = torch.tensor([[1.0, 0.0], [0.0, 2.0]]), torch.tensor([[0.5, 0.5], [1.0, -1.0]])
    stage = bench.tinybert_joint_stage(teacher_layers=4, student_layers=2)
    assert stage.teacher_features.hidden_states and stage.teacher_features.attention_scores
    terms = stage.loss({}, _features(s_hidden, s_scores, s_logits), _features(t_hidden, t_scores, t_logits))

    mse = lambda a, b: ((a - b) ** 2).mean()
    assert torch.allclose(terms["embd"], mse(s_hidden[0], t_hidden[0]))
    assert torch.allclose(terms["hidn"], mse(s_hidden[1], t_hidden[2]) + mse(s_hidden[2], t_hidden[4]))
    clean = s_scores[0].clone()
    clean[0, 0, 0, 1] = 0.0
    assert torch.allclose(terms["attn"], mse(clean, t_scores[1]) + mse(s_scores[1], t_scores[3]))
    soft = -(torch.softmax(t_logits, -1) * torch.log_softmax(s_logits, -1)).mean()
    assert torch.allclose(terms["pred"], soft)


def test_textbrewer_matches_mirror_the_joint_stage():
    from kdbench import textbrewer_job

    matches = textbrewer_job.intermediate_matches(teacher_layers=6, student_layers=3)
    hidden = [(m["layer_S"], m["layer_T"]) for m in matches if m["feature"] == "hidden"]
    attention = [(m["layer_S"], m["layer_T"]) for m in matches if m["feature"] == "attention"]
    assert hidden == [(0, 0), (1, 2), (2, 4), (3, 6)]  # hidden_states index: embeddings first
    assert attention == [(0, 1), (1, 3), (2, 5)]  # attentions index: layer i+1
    assert {m["loss"] for m in matches} == {"hidden_mse", "attention_mse"}
    assert bench.step_list(6, 3) == "2,4,6"


def test_summary_is_median_min_max():
    assert bench._summary([3.0, 1.0, 2.0, 10.0]) == {"median": 2.5, "min": 1.0, "max": 10.0,
                                                      "all": [3.0, 1.0, 2.0, 10.0]}


def _row(method: str, cached: bool) -> dict:
    row = {"method": method, "stage": method, "engine_examples_per_s": {"median": 100.0},
           "floor_examples_per_s": {"median": 105.0}, "engine_over_floor": {"median": 1.05},
           "peak_memory": {"engine": {"max_rss_mb": 900.0}}}
    if cached:
        row.update(cached_examples_per_s={"median": 160.0}, cache_speedup={"median": 1.6})
    return row


def test_markdown_report_has_one_row_per_stage_and_the_textbrewer_ratio():
    result = {
        "machine": {"cpu": "Test CPU", "cpu_cores_usable": 2, "gpu": None, "torch": "2.x", "transformers": "5.x",
                    "load_average_at_start": (8.0, 8.0, 8.0)},
        "precision": "fp32", "compile": False, "teacher_attention": "sdpa",
        "options": {"task": "sst2", "teacher": "/t/model", "student": "teacher-3l", "batch_size": 8,
                    "max_seq_length": 64, "steps": 4, "warmup": 1, "repeats": 3},
        "methods": [_row("finetune", False), _row("kd", True)],
        "skipped_methods": {"pkd": "ConfigError: bad"},
        "textbrewer": {"job": "TinyBERT-style", "kdbench_examples_per_s": {"median": 130.0},
                       "textbrewer_examples_per_s": {"median": 100.0}, "floor_examples_per_s": {"median": 140.0},
                       "kdbench_over_textbrewer_throughput": {"median": 1.3},
                       "cache": {"fields": ["logits", "hidden_states"], "bytes": 300 * 2**20, "precompute_seconds": 4.25,
                                 "kdbench_cached_examples_per_s": {"median": 190.0},
                                 "textbrewer_cached_examples_per_s": {"median": 180.0},
                                 "kdbench_cached_over_textbrewer_live_throughput": {"median": 1.9},
                                 "kdbench_cached_over_textbrewer_cached_throughput": {"median": 1.05}}},
        "augmentation": {"n_aug": 20, "top_k": 15, "mlm": "tiny", "sentences_per_s": {"median": 12.5}},
    }
    text = bench.render_markdown(result)
    assert "| finetune | finetune | 100.0 | 105.0 | 1.050x | — | — | 900 MB RSS |" in text
    assert "| kd | kd | 100.0 | 105.0 | 1.050x | 160.0 | 1.60x | 900 MB RSS |" in text
    assert "| pkd | skipped | ConfigError: bad |" in text
    assert "**1.30x** TextBrewer's throughput" in text and "12.5 sentences/s" in text
    assert ("kdbench reads its logits, hidden_states from its cache (300 MB on disk, one teacher pass of 4.2 s), "
            "190.0 ex/s; TextBrewer reads teacher outputs pre-computed per batch (its `teacher_cache`, in memory), "
            "180.0 ex/s: kdbench is **1.05x** TextBrewer's throughput (1.90x TextBrewer with its teacher live).") in text


@pytest.mark.parametrize("flag", ["--steps=0", "--repeats=0", "--warmup=0", "--methods=,", "--cache-budget-mb=-1"])
def test_bad_options_are_one_line_errors(flag, capsys):
    assert main(["bench", "--teacher", "x", flag]) == 2
    err = capsys.readouterr().err
    assert "kdbench: error:" in err and flag.split("=")[0] in err


def test_machine_description_records_the_installed_textbrewer_version():
    """Read from package metadata: importing TextBrewer 0.2.1 without TensorBoard fails, which used to record None."""
    import importlib.metadata

    try:
        expected = importlib.metadata.version("textbrewer")
    except importlib.metadata.PackageNotFoundError:
        expected = None
    assert bench.machine_description()["textbrewer"] == expected


@pytest.mark.integration
def test_bench_runs_kd_on_real_text(tmp_path, shared_data, tiny_teacher):
    """Two timed steps of kd on SST-2 with a tiny teacher: engine, floor and cached rows are filled."""
    teacher = tiny_teacher
    options = bench.BenchOptions(teacher=str(teacher), student=str(teacher), methods=("kd",), steps=2, warmup=1,
                                 repeats=1, batch_size=4, max_seq_length=32, data_dir=str(shared_data),
                                 textbrewer=False, augment=False)
    result = bench.run_bench(options)
    (row,) = result["methods"]
    assert row["method"] == "kd" and row["timed_examples"] == 8 and row["timed_tokens"] > 8
    assert row["engine_examples_per_s"]["median"] > 0 and row["floor_examples_per_s"]["median"] > 0
    assert row["cache"]["fields"] == ["logits"] and row["cache"]["rows"] == 12
    assert result["machine"]["torch"] == torch.__version__
    json_path, md_path = bench.write_results(result, tmp_path / "out")
    assert json.loads(json_path.read_text())["methods"][0]["stage"] == "kd"
    assert "| kd | kd |" in md_path.read_text()


@pytest.mark.integration
def test_bench_accepts_parameters_of_the_method_it_measures(shared_data, tiny_teacher):
    """A tinybert-only bench with tinybert's own `mapping=[...]`: it used to be validated against kd."""
    options = bench.BenchOptions(teacher=str(tiny_teacher), student="teacher-1l", methods=("tinybert",), steps=1,
                                 warmup=1, repeats=1, batch_size=4, max_seq_length=32, data_dir=str(shared_data),
                                 textbrewer=False, augment=False, overrides={"mapping": [2]})
    result = bench.run_bench(options)
    assert result["skipped_methods"] == {}
    assert [row["stage"] for row in result["methods"]] == ["intermediate", "prediction"]


@pytest.mark.integration
def test_cache_budget_lets_intermediate_stages_read_cached_teacher_features(shared_data, tiny_teacher):
    """With a disk budget, TinyBERT's intermediate stage reads hidden states and attention scores from the
    cache (one teacher pass) instead of running the teacher; without one it is measured live only."""
    common = dict(teacher=str(tiny_teacher), student="teacher-1l", methods=("tinybert",), steps=2, warmup=1,
                  repeats=2, batch_size=4, max_seq_length=32, data_dir=str(shared_data), textbrewer=False,
                  augment=False, overrides={"mapping": [2]})
    without = bench.run_bench(bench.BenchOptions(**common))
    assert "cache_speedup" not in without["methods"][0]
    assert "teacher_cache_budget_mb=0" in without["methods"][0]["cache"]["reason"]
    found = bench.run_bench(bench.BenchOptions(**common, cache_budget_mb=64.0))
    intermediate = found["methods"][0]
    assert intermediate["stage"] == "intermediate"
    # mapping=[2]: only the teacher's layers the stage reads are cached (embedding, layer 2, its attention).
    assert intermediate["cache"]["fields"] == ["logits", "hidden_states.0", "hidden_states.2", "attention_scores.1"]
    assert intermediate["cache"]["bytes"] > 0 and intermediate["cache_speedup"]["median"] > 0


def test_textbrewer_job_config_drops_the_measured_methods_parameters():
    """The TextBrewer job is built on kd; a tinybert-only bench's `mapping=[...]` is not a kd parameter."""
    options = bench.BenchOptions(teacher="t", methods=("tinybert",), overrides={"mapping": [2, 4, 6], "lr": "3e-4"})
    from kdbench.config import ConfigError
    from kdbench.engine import plan_run

    with pytest.raises(ConfigError, match="mapping"):
        plan_run(bench._run_config(options, "kd"))
    config = bench._run_config(options, "kd", method_overrides=False)
    assert config.method_params == {} and config.train.lr == 3e-4
    plan_run(config)


def test_textbrewer_trains_the_same_student_from_precomputed_teacher_outputs(tmp_path):
    """TextBrewer's `teacher_cache` path must be the same job as its live-teacher path: from the same
    seed, two steps either way give the same student weights (needs `pip install 'kdbench[bench]'`)."""
    from transformers import BertConfig, BertForSequenceClassification

    from kdbench import textbrewer_job

    if not textbrewer_job.available():
        pytest.skip("textbrewer is not installed")
    config = BertConfig(vocab_size=50, hidden_size=16, num_hidden_layers=2, num_attention_heads=2,
                        intermediate_size=32, num_labels=2)
    torch.manual_seed(0)
    teacher = textbrewer_job.eager_copy(BertForSequenceClassification(config))
    student_config = BertConfig(**{**config.to_dict(), "num_hidden_layers": 1})
    student = textbrewer_job.eager_copy(BertForSequenceClassification(student_config))
    mask = torch.tensor([[1, 1, 1, 1, 0], [1, 1, 1, 0, 0]])
    batches = [{"input_ids": torch.randint(5, 50, (2, 5)) * mask, "attention_mask": mask,
                "token_type_ids": torch.zeros(2, 5, dtype=torch.long)} for _ in range(3)]
    trained = []
    for outputs in (None, textbrewer_job.precompute_teacher_outputs(teacher, batches)):
        copy_ = textbrewer_job.eager_copy(student)
        torch.manual_seed(1)
        textbrewer_job.run(teacher, copy_, batches, warmup=1, teacher_layers=2, student_layers=1, lr=1e-2,
                           device=torch.device("cpu"), bf16=False, workdir=tmp_path / "tb", teacher_outputs=outputs)
        trained.append(copy_.state_dict())
    moved = [name for name in trained[0] if not torch.equal(trained[0][name], student.state_dict()[name])]
    assert moved, "the student did not train"
    for name in trained[0]:
        torch.testing.assert_close(trained[0][name], trained[1][name])


# --------------------------------------------------------------------------- workflow (--workflow)


def test_workflow_needs_one_existing_teacher_per_task(tmp_path, capsys):
    from kdbench.bench_workflow import parse_teachers
    from kdbench.config import ConfigError

    assert parse_teachers("rte=/a,mrpc=/b", ["rte", "mrpc"]) == {"rte": "/a", "mrpc": "/b"}
    assert parse_teachers("/a", ["rte"]) == {"rte": "/a"}
    with pytest.raises(ConfigError, match="one fine-tuned teacher per task"):
        parse_teachers("/a", ["rte", "mrpc"])
    with pytest.raises(ConfigError, match="no teacher for task.*mrpc"):
        parse_teachers("rte=/a", ["rte", "mrpc"])
    assert main(["bench", "--workflow", "--tasks", "rte", "--teacher", f"rte={tmp_path / 'missing'}"]) == 2
    assert "the rte teacher" in capsys.readouterr().err
    assert main(["bench", "--workflow", "--tasks", "rte", "--teacher", str(tmp_path), "--workflow-jobs", "deepspeed"]) == 2
    assert "--workflow-jobs 'deepspeed'" in capsys.readouterr().err


def test_workflow_commands_run_the_same_job_in_both_frameworks(tmp_path):
    from kdbench.bench_workflow import WorkflowOptions, job_command

    options = WorkflowOptions(teachers={"rte": "/t"}, intermediate_epochs=20, prediction_epochs=3,
                              max_train_samples=128, max_seq_length=128, batch_size=32)
    ours = job_command(options, "kdbench", "rte", tmp_path / "student", tmp_path / "out")
    theirs = job_command(options, "textbrewer-cache", "rte", tmp_path / "student", tmp_path / "out")
    assert ours[1:5] == ["-m", "kdbench", "run", "tinybert"]
    for setting in ("intermediate_epochs=20", "prediction_epochs=3", "max_train_samples=128", "batch_size=32",
                    "max_seq_length=128", "student_init=pretrained"):
        assert setting in ours
    assert theirs[1:3] == ["-m", "kdbench.textbrewer_workflow"]
    flags = dict(zip(theirs[3::2], theirs[4::2], strict=False))
    assert (flags["--intermediate-epochs"], flags["--prediction-epochs"], flags["--max-train-samples"],
            flags["--batch-size"], flags["--max-seq-length"]) == ("20", "3", "128", "32", "128")
    assert flags["--student"] == str(tmp_path / "student") and ours[ours.index("--student") + 1] == flags["--student"]
    assert "--teacher-cache" in theirs and "--length-grouped" in theirs


@pytest.mark.integration
def test_workflow_times_kdbench_and_textbrewer_end_to_end(tmp_path, shared_data, minilm_path):
    """A tiny real workflow: every job trains, kdbench's intermediate stage reads its (cold) cache."""
    from kdbench import textbrewer_job

    if not textbrewer_job.available():
        pytest.skip("textbrewer is not installed")
    from tiny_models import make_tiny_bert

    from kdbench.bench_workflow import WorkflowOptions, run_workflow

    teacher = make_tiny_bert(tmp_path / "rte-teacher", minilm_path, task="rte", layers=2)
    options = WorkflowOptions(teachers={"rte": str(teacher)}, student="teacher-1l", intermediate_epochs=1,
                              prediction_epochs=1, max_train_samples=8, max_eval_samples=8, max_seq_length=32,
                              batch_size=4, data_dir=str(shared_data))
    result = run_workflow(options)
    runs = {r["job"]: r for r in result["runs"]}
    assert set(runs) == {"kdbench", "textbrewer", "textbrewer-cache"}
    stages = runs["kdbench"]["teacher_cache"]["stages"]
    assert [s["source"] for s in stages] == ["cache", "cache"] and stages[0]["hit_rate"] == 0.0
    assert stages[1]["hit_rate"] == 1.0  # the prediction stage reads the logits the first pass stored
    assert runs["kdbench"]["teacher_cache"]["bytes_per_example"] > 0
    assert len(runs["textbrewer"]["dev_accuracy_per_epoch"]) == 1 and runs["textbrewer-cache"]["teacher_cache"]
    # TextBrewer trains each stage as kdbench resolves it (TinyBERT's intermediate stage: constant rate).
    assert runs["textbrewer"]["phases"]["intermediate_optimization"]["schedule"] == "constant"
    assert runs["textbrewer"]["phases"]["prediction_optimization"]["epochs"] == 1
    assert result["summary"]["rte"]["speedup_vs_textbrewer"]["median"] > 0
    # Both frameworks train with dropout: TextBrewer's student is in training mode at every training
    # step of both stages (a from_pretrained model starts in eval mode; `with distiller:` switches it).
    for job in ("textbrewer", "textbrewer-cache"):
        assert runs[job]["student_modes"] == {"intermediate": ["train"], "prediction": ["train"]}
