"""A user's first hour: every bad input of issue 18 fails with exit status 2 and ONE line naming
the file or value, before any model weights load, and leaves no run folder behind; plan-time checks
(teacher head, label count, sequence length, the method's own validation and stage declarations)
run in ``--dry-run`` as in a real run."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from kdbench.features import FeatureRequest
from kdbench.method import Method, Stage, require_same_attention_heads
from kdbench.plugins import METHODS

from .helpers import cli_error, copy_data


def _no_run_folder(output: Path) -> None:
    assert not output.exists() or not any(output.iterdir()), sorted(output.rglob("*"))


def _set_teacher(argv: list[str], teacher: Path | str) -> list[str]:
    argv[argv.index("--teacher") + 1] = str(teacher)
    return argv


# -- data files that are not UTF-8 text ----------------------------------------------------------
@pytest.mark.parametrize("damage, expected", [
    ("utf-16", "the file is UTF-16 text; save it as UTF-8"),
    ("binary", "not a text file (it holds NUL bytes"),
    ("latin-1", "line 4: not UTF-8 text (byte b'\\xe9')"),
])
def test_train_file_that_is_not_utf8_is_named(damage, expected, tiny_world, tmp_path, capsys):
    data = copy_data(tiny_world, tmp_path)
    train = data / "glue_data" / "SST-2" / "train.tsv"
    text = train.read_text()
    if damage == "utf-16":
        train.write_bytes(text.encode("utf-16"))
    elif damage == "binary":
        train.write_bytes(bytes(range(256)) * 8)
    else:
        lines = text.splitlines()
        lines[3] = "the film was caf\u00e9 good\t1"
        train.write_bytes("\n".join(lines).encode("latin-1"))
    output = tmp_path / "runs"
    message = cli_error(tiny_world.run_args("kd", output, data_dir=data), capsys, output)
    assert f"{train}" in message and expected in message
    _no_run_folder(output)


# -- models --------------------------------------------------------------------------------------
def test_truncated_config_json_in_the_teacher_folder(tiny_world, tmp_path, capsys):
    teacher = tmp_path / "teacher"
    shutil.copytree(tiny_world.teacher, teacher)
    config = teacher / "config.json"
    config.write_text(config.read_text()[:100])
    output = tmp_path / "runs"
    message = cli_error(_set_teacher(tiny_world.run_args("kd", output), teacher), capsys, output)
    assert f"teacher {str(teacher)!r} cannot be loaded" in message and "not a valid JSON" in message
    _no_run_folder(output)


def test_relative_teacher_path_that_does_not_exist(tiny_world, tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(tmp_path)
    output = tmp_path / "runs"
    message = cli_error(_set_teacher(tiny_world.run_args("kd", output), "runs/gone/model"), capsys, output)
    assert "teacher folder 'runs/gone/model' does not exist" in message and str(tmp_path) in message
    _no_run_folder(output)


def _teacher_with(tmp_path: Path, tiny_world, **changes) -> Path:
    teacher = tmp_path / "teacher-changed"
    shutil.copytree(tiny_world.teacher, teacher)
    config = json.loads((teacher / "config.json").read_text())
    config.update(changes)
    (teacher / "config.json").write_text(json.dumps(config))
    return teacher


def test_teacher_with_another_label_count(tiny_world, tmp_path, capsys):
    teacher = _teacher_with(tmp_path, tiny_world, id2label={"0": "a", "1": "b", "2": "c"},
                            label2id={"a": 0, "b": 1, "c": 2})
    output = tmp_path / "runs"
    message = cli_error(_set_teacher(tiny_world.run_args("kd", output), teacher), capsys, output)
    assert f"teacher {str(teacher)!r} is a classifier with 3 labels; task 'sst2' has 2 labels" in message
    _no_run_folder(output)


def test_question_answering_teacher_on_a_classification_task(tiny_world, tmp_path, capsys):
    teacher = _teacher_with(tmp_path, tiny_world, architectures=["BertForQuestionAnswering"])
    output = tmp_path / "runs"
    message = cli_error(_set_teacher(tiny_world.run_args("kd", output), teacher), capsys, output)
    assert "BertForQuestionAnswering without a classification head for task 'sst2'" in message


def test_classification_teacher_on_a_regression_task(tiny_world, tmp_path, capsys, shared_data):
    output = tmp_path / "runs"
    argv = tiny_world.run_args("kd", output, data_dir=shared_data)
    argv[argv.index("--task") + 1] = "stsb"
    message = cli_error(argv, capsys, output)
    assert (f"teacher {str(tiny_world.teacher)!r} is a classification model with 2 labels; task 'stsb' is a "
            "regression (num_labels=1)") in message
    _no_run_folder(output)


def test_max_seq_length_beyond_the_position_embeddings(tiny_world, tmp_path, capsys):
    output = tmp_path / "runs"
    message = cli_error(tiny_world.run_args("kd", output, "max_seq_length=1024"), capsys, output)
    assert "max_seq_length=1024 is longer than the teacher" in message and "max_position_embeddings 64" in message
    _no_run_folder(output)


# -- options -------------------------------------------------------------------------------------
def test_config_yaml_with_a_python_tag(tiny_world, tmp_path, capsys):
    config = tmp_path / "evil.yaml"
    config.write_text("epochs: !!python/object/apply:os.system ['echo owned']\n")
    output = tmp_path / "runs"
    message = cli_error(tiny_world.run_args("kd", output, "--config", config), capsys, output)
    assert f"config file {str(config)!r}, line 1: not a plain YAML mapping" in message
    assert "python/object/apply:os.system" in message
    _no_run_folder(output)


def test_output_that_is_a_file(tiny_world, tmp_path, capsys):
    output = tmp_path / "runs.txt"
    output.write_text("not a folder")
    message = cli_error(tiny_world.run_args("kd", output), capsys)
    assert f"--output {str(output)!r}" in message and "is a file, not a folder" in message
    assert output.read_text() == "not a folder"


# -- the method, built at plan time (and in --dry-run) ----------------------------------------------
class _LogitsFeaturePlugin(Method):
    """A plug-in that asks for a feature FeatureRequest does not take (as the README once listed)."""

    name = "logits-feature-probe"
    requires_teacher = True

    def stages(self, context):
        request = FeatureRequest(logits=True)  # TypeError: logits are always captured, not requested
        return [Stage("distil", lambda batch, student, teacher: {}, student_features=request)]


class _HeadsProbe(Method):
    name = "heads-probe"

    def validate(self, context):
        require_same_attention_heads(context, self.name)

    def stages(self, context):
        raise AssertionError("validate must refuse the pair first")


def _register(cls: type[Method]) -> str:
    if cls.name not in METHODS:
        METHODS.register(cls.name, cls)
    return cls.name


@pytest.mark.parametrize("dry_run", [True, False])
def test_a_plugin_stage_error_shows_at_plan_time(dry_run, tiny_world, tmp_path, capsys):
    output = tmp_path / "runs"
    argv = tiny_world.run_args(_register(_LogitsFeaturePlugin), output, *(["--dry-run"] if dry_run else []))
    message = cli_error(argv, capsys, output)
    assert "method logits-feature-probe: its stages cannot be built: TypeError" in message and "logits" in message
    _no_run_folder(output)


def test_dry_run_runs_the_methods_validate(tiny_world, tmp_path, capsys):
    output = tmp_path / "runs"
    argv = tiny_world.run_args(_register(_HeadsProbe), output, "--dry-run", student=tiny_world.student_2_heads)
    message = cli_error(argv, capsys, output)
    assert "the teacher has 4 attention heads and the student 2" in message


def test_dry_run_builds_both_configs_and_the_stages(tiny_world, tmp_path, capsys):
    from kdbench.cli import main

    output = tmp_path / "runs"
    assert main(tiny_world.run_args("tinybert", output, "--dry-run", student="teacher-1l")) == 0
    captured = capsys.readouterr()
    assert "[kdbench] teacher: bert, 2 layers, hidden 32, 4 heads, 64 positions" in captured.err
    assert "[kdbench] student: bert, 1 layers, hidden 32, 4 heads, 64 positions" in captured.err
    assert "stage intermediate:" in captured.err and "stage prediction:" in captured.err
    assert captured.out.strip().splitlines()[-1].startswith(str(output))
    _no_run_folder(output)


def test_a_run_folders_config_yaml_runs_that_run_again(tiny_world, tmp_path, capsys):
    """``kdbench run --config RUN/config.yaml`` needs no METHOD, --task or --student: the recorded
    config names them, and it resolves to the same run folder (the same content hash)."""
    from kdbench.cli import main

    output = tmp_path / "runs"
    assert main(tiny_world.run_args("kd", output, "seed=3")) == 0
    run_dir = Path(capsys.readouterr().out.strip().splitlines()[-1])
    assert (run_dir / "result.json").is_file()
    assert main(["run", "--config", str(run_dir / "config.yaml"), "--dry-run"]) == 0
    captured = capsys.readouterr()
    assert captured.out.strip().splitlines()[-1] == str(run_dir)
    assert json.loads(captured.out[:captured.out.rindex("}") + 1])["method"] == "kd"
    # The command line still wins over the file: another seed is another run.
    assert main(["run", "--config", str(run_dir / "config.yaml"), "--dry-run", "seed=4"]) == 0
    assert capsys.readouterr().out.strip().splitlines()[-1] != str(run_dir)


@pytest.mark.parametrize("missing", ["method", "task", "student"])
def test_run_without_method_task_or_student_anywhere_names_the_missing_one(missing, tiny_world, tmp_path, capsys):
    values = {"method": "kd", "task": "sst2", "student": str(tiny_world.student),
              "teacher": str(tiny_world.teacher), "data_dir": str(tiny_world.data_dir)}
    del values[missing]
    config = tmp_path / "partial.yaml"
    config.write_text("".join(f"{key}: {value}\n" for key, value in values.items()))
    message = cli_error(["run", "--config", config, "--output", tmp_path / "runs"], capsys, tmp_path / "runs")
    assert message == f"{missing}: missing (give it on the command line or in the YAML file)"
    _no_run_folder(tmp_path / "runs")


# -- kdbench augment -------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def mlm_folder(tmp_path_factory, tiny_world) -> Path:
    """A 1-layer BertForMaskedLM with the tiny world's vocabulary, saved with its tokenizer."""
    import torch
    from transformers import AutoTokenizer, BertConfig, BertForMaskedLM

    folder = tmp_path_factory.mktemp("mlm")
    tokenizer = AutoTokenizer.from_pretrained(tiny_world.teacher)
    torch.manual_seed(0)
    BertForMaskedLM(BertConfig(vocab_size=len(tokenizer), hidden_size=32, num_hidden_layers=1, num_attention_heads=4,
                               intermediate_size=37, max_position_embeddings=64)).save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    return folder


def _augment(tiny_world, tmp_path, mlm: Path | str, *extra) -> list[str]:
    return ["augment", "sst2", "--mlm-model", str(mlm), "--data-dir", str(tiny_world.data_dir),
            "--out", str(tmp_path / "out" / "aug.tsv"), "--cache-dir", str(tmp_path / "cache"), *[str(e) for e in extra]]


@pytest.mark.parametrize("content, expected", [
    ("400000 5\nfilm 0.1 0.2 0.3 0.4 0.5\n", "line 1: '400000 5' looks like a word2vec header"),
    ("film 0.1 0.2 0.3 0.4 0.5\nmovie 0.1 0.2 0.3\n", "line 2: word 'movie' has 3 values, the first line 5"),
    ("film 0.1 0.2 0.3\n\nmovie 0.1 abc 0.3\n", "line 3: value 'abc' of word 'movie' is not a number"),
])
def test_malformed_glove_is_named_before_the_model_loads(content, expected, tiny_world, tmp_path, capsys):
    glove = tmp_path / "glove.txt"
    glove.write_text(content)
    # The MLM folder does not exist: the GloVe error must come first (no model is loaded before it).
    message = cli_error(_augment(tiny_world, tmp_path, tmp_path / "no-such-mlm", "--glove", glove), capsys)
    assert f"GloVe file {str(glove)!r}, {expected}" in message
    assert not (tmp_path / "out").exists()


def test_named_augment_input_without_a_sentence_column(tiny_world, tmp_path, capsys, mlm_folder):
    train = tmp_path / "named.tsv"
    train.write_text("label\ttext\n1\tthe film was good\n0\tthe plot was dull\n")
    message = cli_error(_augment(tiny_world, tmp_path, mlm_folder, "--train-file", train), capsys)
    assert f"{train}: no column 'sentence' for task sst2 (columns: label, text)" in message


@pytest.mark.parametrize("option", ["--batch-size", "--chunk-size"])
def test_augment_sizes_must_be_positive(option, tiny_world, tmp_path, capsys, mlm_folder):
    message = cli_error(_augment(tiny_world, tmp_path, mlm_folder, option, "0"), capsys)
    assert f"augment: {option} must be >= 1, got 0" in message
