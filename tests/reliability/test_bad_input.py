"""Every bad input fails with a one-line error naming the bad value (and the fix where there is
one), with exit status 2, before any training step: no checkpoint, within seconds."""

from __future__ import annotations

import dataclasses
import json
import shutil

import pytest

from kdbench.config import ConfigError
from kdbench.constraints import constraint_of
from kdbench.plugins import METHODS, TABLES
from kdbench.registry import UnknownNameError

from .helpers import cli_error, copy_data


# -- names -------------------------------------------------------------------------------------
def test_unknown_method_suggests_the_close_name(tiny_world, tmp_path, capsys):
    argv = tiny_world.run_args("kd", tmp_path)
    argv[1] = "kdd"
    message = cli_error(argv, capsys, tmp_path)
    assert "unknown method 'kdd'" in message and "did you mean 'kd'" in message
    assert not any(tmp_path.iterdir()), "no run folder for a typo"


def test_unknown_task_suggests_the_close_name(tiny_world, tmp_path, capsys):
    argv = tiny_world.run_args("kd", tmp_path)
    argv[argv.index("--task") + 1] = "sst3"
    message = cli_error(argv, capsys, tmp_path)
    assert "unknown task 'sst3'" in message and "did you mean 'sst2'" in message
    assert not any(tmp_path.iterdir())


def test_unknown_student_preset_suggests_the_close_name(tiny_world, tmp_path, capsys):
    message = cli_error(tiny_world.run_args("kd", tmp_path, student="tinybert-4l-321"), capsys, tmp_path)
    assert "unknown student preset 'tinybert-4l-321'" in message and "'tinybert-4l-312'" in message
    assert not any(tmp_path.iterdir())


def test_unknown_table_suggests_the_close_name():
    known = TABLES.names()
    if not known:
        pytest.skip("no tables registered")
    typo = known[0][:-1] + ("x" if known[0][-1] != "x" else "y")
    with pytest.raises(UnknownNameError) as caught:
        TABLES.get(typo)
    print(f"\n[bad-input] {caught.value}")
    assert f"unknown table {typo!r}; did you mean {known[0]!r}" in str(caught.value)


# -- hyperparameters ---------------------------------------------------------------------------
def test_negative_temperature(tiny_world, tmp_path, capsys):
    message = cli_error(tiny_world.run_args("kd", tmp_path, "temperature=-2"), capsys, tmp_path)
    assert "temperature" in message and "-2" in message and "> 0" in message
    assert not any(tmp_path.iterdir())


def test_negative_loss_weight(tiny_world, tmp_path, capsys):
    message = cli_error(tiny_world.run_args("kd", tmp_path, "alpha=-0.5"), capsys, tmp_path)
    assert "alpha" in message and "-0.5" in message
    assert not any(tmp_path.iterdir())


_WEIGHT_LIKE = ("alpha", "beta", "gamma", "weight", "lambda")


def _weight_or_temperature_fields(method_cls) -> list[tuple[str, bool]]:
    """(field, is_temperature) for the built-in Params fields named like a temperature or a loss
    weight: a completeness check that every such field declares its constraint."""
    found = []
    for field in dataclasses.fields(method_cls.Params):
        name = field.name.lower()
        if "temperature" in name:
            found.append((field.name, True))
        elif any(part in name for part in _WEIGHT_LIKE) and field.name not in _NOT_WEIGHTS:
            found.append((field.name, False))
    return found


# Named like weights but not loss weights: mixing proportions with their own declared ranges.
_NOT_WEIGHTS = {"pd_alpha"}


def test_every_method_rejects_negative_weights_and_non_positive_temperatures():
    checked = []
    for name in METHODS.names():
        method_cls = METHODS.get(name)
        for field, is_temperature in _weight_or_temperature_fields(method_cls):
            declared = next(f for f in dataclasses.fields(method_cls.Params) if f.name == field)
            assert constraint_of(declared) is not None, f"{name}.{field} declares no constraint"
            for bad in (["-1", "0"] if is_temperature else ["-1"]):
                with pytest.raises(ConfigError) as caught:
                    method_cls.from_overrides({field: bad})
                assert field in str(caught.value) and "\n" not in str(caught.value), str(caught.value)
                checked.append(f"{name}.{field}={bad}")
    print(f"\n[bad-input] rejected: {', '.join(checked)}")
    assert any(c.startswith("kd.temperature") for c in checked) and any(c.startswith("kd.alpha") for c in checked)


def test_a_plugin_declares_its_constraints_and_from_overrides_enforces_them():
    from kdbench.constraints import constrained, loss_weight, softmax_temperature
    from kdbench.method import Method

    @dataclasses.dataclass
    class ProbeParams:
        temperature: float = softmax_temperature(1.0)
        hidden_weight: float = loss_weight(1.0)
        layer_weights: list[float] = loss_weight(default_factory=lambda: [1.0, 1.0])
        mode: str = constrained("fast", choices=("fast", "slow"))
        shift: float = 0.0  # nothing declared: may be negative, whatever its name would suggest
        lambda_unchecked: float = 0.5  # no name guessing: an undeclared field is not checked

        def check_combination(self) -> None:
            if self.mode == "slow" and self.hidden_weight == 0:
                raise ConfigError("mode=slow needs hidden_weight > 0")

    class Declared(Method):
        name = "declared-probe"
        Params = ProbeParams

    assert Declared.from_overrides({"shift": "-3", "lambda_unchecked": "-1"}).params.shift == -3.0
    for key, value, message in (
            ("temperature", "0", "method declared-probe: temperature: must be > 0, got 0.0 (it divides the logits)"),
            ("hidden_weight", "-0.1", "method declared-probe: hidden_weight: must be >= 0, got -0.1 (a loss weight)"),
            ("layer_weights", "[1, -1]", "layer_weights: must be >= 0, got -1.0 in [1.0, -1.0] (a loss weight)"),
            ("mode", "medium", "mode: must be one of fast, slow, got 'medium'")):
        with pytest.raises(ConfigError) as caught:
            Declared.from_overrides({key: value})
        assert message in str(caught.value)
    with pytest.raises(ConfigError, match="mode=slow needs hidden_weight > 0"):
        Declared.from_overrides({"mode": "slow", "hidden_weight": "0"})


# -- models ------------------------------------------------------------------------------------
def test_student_layers_outside_the_teacher(tiny_world, tmp_path, capsys):
    message = cli_error(tiny_world.run_args("kd", tmp_path, "student_init=teacher", "student_layers=[0,7]",
                                            student="teacher-2l"), capsys, tmp_path)
    assert "student_layers" in message and "7" in message and "0..1" in message


def test_uniform_mapping_with_indivisible_layer_counts(tiny_world, tmp_path, capsys):
    from kdbench.layer_maps import uniform_map

    with pytest.raises(ValueError, match="12.*5|5.*12"):
        uniform_map(12, 5)
    if "tinybert" not in METHODS:
        pytest.skip("tinybert is not registered")
    argv = tiny_world.run_args("tinybert", tmp_path, "mapping=uniform", student="teacher-2l")
    argv[argv.index("--teacher") + 1] = str(tiny_world.teacher_3_layers)
    message = cli_error(argv, capsys, tmp_path)
    assert "mapping" in message and "3" in message and "2" in message


def test_layer_mapping_outside_the_teacher(tiny_world, tmp_path, capsys):
    if "tinybert" not in METHODS:
        pytest.skip("tinybert is not registered")
    message = cli_error(tiny_world.run_args("tinybert", tmp_path, "mapping=[[1,9]]", student="teacher-2l"),
                        capsys, tmp_path)
    assert "mapping" in message and "9" in message


def _register_attention_probe():
    from kdbench.method import Method, require_same_attention_heads

    class AttentionProbe(Method):
        name = "attention-probe"
        description = "test-only: needs equal head counts"

        def validate(self, context):
            require_same_attention_heads(context, self.name)

        def stages(self, context):
            raise AssertionError("validate must have refused this pair before any stage is built")

    if "attention-probe" not in METHODS:
        METHODS.register("attention-probe", AttentionProbe)


@pytest.mark.parametrize("method", ["attention-probe", "tinybert", "mobilebert"])
def test_attention_losses_need_the_same_head_count(method, tiny_world, tmp_path, capsys):
    if method == "attention-probe":
        _register_attention_probe()
    elif method not in METHODS:
        pytest.skip(f"{method} is not registered")
    message = cli_error(tiny_world.run_args(method, tmp_path, student=tiny_world.student_2_heads), capsys, tmp_path)
    assert "head" in message and "4" in message and "2" in message


def test_teacher_and_student_tokenizers_differ(tiny_world, tmp_path, capsys):
    message = cli_error(tiny_world.run_args("kd", tmp_path, student=tiny_world.student_other_vocab), capsys, tmp_path)
    assert "different tokenizer" in message and str(tiny_world.student_other_vocab) in message


def test_teacher_and_student_vocabulary_sizes_differ(tiny_world, tmp_path, capsys):
    from transformers import AutoConfig, AutoModelForSequenceClassification

    config = AutoConfig.from_pretrained(tiny_world.student)
    config.vocab_size += 7
    student = tmp_path / "student-bigger-vocab"
    AutoModelForSequenceClassification.from_config(config).save_pretrained(student)
    output = tmp_path / "runs"
    message = cli_error(tiny_world.run_args("kd", output, student=student), capsys, output)
    assert "vocabularies differ" in message and str(config.vocab_size) in message


# -- data --------------------------------------------------------------------------------------
def test_missing_data_folder(tiny_world, tmp_path, capsys):
    missing = tmp_path / "no-such-data"
    output = tmp_path / "runs"
    message = cli_error(tiny_world.run_args("kd", output, data_dir=missing), capsys, output)
    assert str(missing) in message and "SST-2" in message


def test_missing_data_file(tiny_world, tmp_path, capsys):
    data = copy_data(tiny_world, tmp_path)
    (data / "glue_data" / "SST-2" / "dev.tsv").unlink()
    output = tmp_path / "runs"
    message = cli_error(tiny_world.run_args("kd", output, data_dir=data), capsys, output)
    assert "dev.tsv" in message and "does not exist" in message


def test_empty_dataset(tiny_world, tmp_path, capsys):
    data = copy_data(tiny_world, tmp_path)
    (data / "glue_data" / "SST-2" / "train.tsv").write_text("sentence\tlabel\n")
    output = tmp_path / "runs"
    message = cli_error(tiny_world.run_args("kd", output, data_dir=data), capsys, output)
    assert "train.tsv" in message and "no usable rows" in message


@pytest.mark.parametrize("row, problem", [
    ("the movie was good\tmaybe", "unknown label 'maybe'"),
    ("the movie was good\t1\textra", "expected 2 tab-separated columns, found 3"),
    ("   \t1", "empty text"),
])
def test_malformed_row_names_the_line(row, problem, tiny_world, tmp_path, capsys):
    data = copy_data(tiny_world, tmp_path)
    train = data / "glue_data" / "SST-2" / "train.tsv"
    lines = train.read_text().splitlines()
    lines.insert(5, row)  # line 6 of the file
    train.write_text("\n".join(lines) + "\n")
    output = tmp_path / "runs"
    message = cli_error(tiny_world.run_args("kd", output, data_dir=data), capsys, output)
    assert f"{train}, line 6" in message and problem in message and "on_bad_row=skip" in message


# -- checkpoints -------------------------------------------------------------------------------
@pytest.mark.parametrize("damage", ["truncated", "garbage"])
def test_corrupted_student_checkpoint(damage, tiny_world, tmp_path, capsys):
    student = tmp_path / "student"
    shutil.copytree(tiny_world.student, student)
    weights = student / "model.safetensors"
    data = weights.read_bytes()
    weights.write_bytes(data[: len(data) // 2] if damage == "truncated" else b"\x00garbage" * 100)
    output = tmp_path / "runs"
    message = cli_error(tiny_world.run_args("kd", output, student=student), capsys, output)
    assert str(student) in message and ("corrupt" in message or "truncat" in message or "safetensors" in message)


def test_corrupted_teacher_checkpoint(tiny_world, tmp_path, capsys):
    teacher = tmp_path / "teacher"
    shutil.copytree(tiny_world.teacher, teacher)
    weights = teacher / "model.safetensors"
    weights.write_bytes(weights.read_bytes()[:1000])
    output = tmp_path / "runs"
    argv = tiny_world.run_args("kd", output)
    argv[argv.index("--teacher") + 1] = str(teacher)
    message = cli_error(argv, capsys, output)
    assert "teacher" in message and str(teacher) in message


def test_model_folder_without_config(tiny_world, tmp_path, capsys):
    teacher = tmp_path / "not-a-model"
    teacher.mkdir()
    argv = tiny_world.run_args("kd", tmp_path / "runs")
    argv[argv.index("--teacher") + 1] = str(teacher)
    message = cli_error(argv, capsys, tmp_path / "runs")
    assert "config.json" in message and str(teacher) in message


@pytest.mark.parametrize("role", ["student", "teacher"])
def test_a_model_path_that_does_not_exist_is_named_before_any_run_folder(role, tiny_world, tmp_path, capsys):
    missing = str(tmp_path / "runs" / "gone" / "model")
    argv = tiny_world.run_args("kd", tmp_path / "out")
    argv[argv.index(f"--{role}") + 1] = missing
    message = cli_error(argv, capsys, tmp_path / "out")
    assert f"{role} folder {missing!r} does not exist" in message
    assert not (tmp_path / "out").exists() or not any((tmp_path / "out").iterdir())


# -- records -----------------------------------------------------------------------------------
def _record(**changes) -> dict:
    record = {"schema_version": 1, "method": "kd", "task": "sst2", "student": "s", "config": {}, "metrics": {},
              "status": "completed"}
    record.update(changes)
    return {k: v for k, v in record.items() if v is not None}


@pytest.mark.parametrize("record, expected", [
    (_record(schema_version=0), "schema_version 0 is older than the oldest this kdbench reads (1)"),
    (_record(schema_version=None), "not a kdbench result record (no schema_version)"),
    (_record(schema_version=7), "schema_version 7 is newer than this kdbench understands (1); upgrade kdbench"),
    (_record(metrics=None), "result record lacks metrics"),
])
def test_result_record_from_another_schema_is_refused_clearly(record, expected, tmp_path, capsys):
    path = tmp_path / "runs" / "some-run" / "result.json"
    path.parent.mkdir(parents=True)
    path.write_text(json.dumps(record))
    message = cli_error(["results", tmp_path / "runs"], capsys)
    assert str(path) in message and expected in message


def test_truncated_result_record_is_refused_clearly(tmp_path, capsys):
    path = tmp_path / "runs" / "some-run" / "result.json"
    path.parent.mkdir(parents=True)
    path.write_text(json.dumps(_record())[:40])
    message = cli_error(["results", tmp_path / "runs"], capsys)
    assert str(path) in message and "not valid JSON" in message


def test_old_record_in_a_run_folder_stops_the_run_before_training(tiny_world, tmp_path, capsys):
    from kdbench.cli import run_config_from_args  # noqa: F401
    from kdbench.config import build_run_config
    from kdbench.engine import plan_run

    argv = tiny_world.run_args("kd", tmp_path)
    values = {"method": "kd", "task": "sst2", "teacher": str(tiny_world.teacher), "student": str(tiny_world.student),
              "data_dir": str(tiny_world.data_dir), "output": str(tmp_path)}
    values.update(dict(a.split("=", 1) for a in argv if "=" in a))
    run_dir = plan_run(build_run_config(values)).run_dir
    run_dir.mkdir(parents=True)
    (run_dir / "result.json").write_text(json.dumps(_record(schema_version=0)))
    message = cli_error(argv, capsys, tmp_path)
    assert "schema_version 0" in message and "re-run the cell" in message


def test_migration_chain_upgrades_an_old_record(monkeypatch):
    from kdbench import records

    def zero_to_one(record):
        return {**record, "schema_version": 1, "metrics": record.pop("scores")}

    monkeypatch.setitem(records.MIGRATIONS, 0, zero_to_one)
    old = _record(schema_version=0, metrics=None)
    old["scores"] = {"acc": 91.0}
    migrated = records.migrate(old, "old.json")
    assert migrated["schema_version"] == 1 and migrated["metrics"] == {"acc": 91.0}


def test_a_second_writer_of_the_same_run_folder_is_refused(tiny_world, tmp_path, capsys):
    from kdbench.config import build_run_config
    from kdbench.engine import plan_run
    from kdbench.records import run_lock

    argv = tiny_world.run_args("kd", tmp_path)
    values = {"method": "kd", "task": "sst2", "teacher": str(tiny_world.teacher), "student": str(tiny_world.student),
              "data_dir": str(tiny_world.data_dir), "output": str(tmp_path)}
    values.update(dict(a.split("=", 1) for a in argv if "=" in a))
    run_dir = plan_run(build_run_config(values)).run_dir
    with run_lock(run_dir):  # another (live) process would hold this
        message = cli_error(argv, capsys, tmp_path)
    assert str(run_dir) in message and "in use by another process" in message
