"""Typed run config: YAML plus KEY=VALUE overrides, validated with errors that name field and value."""

from __future__ import annotations

import pytest
import yaml

from kdbench.config import ConfigError, build_run_config, is_method_parameter, load_yaml, parse_overrides, save_config

BASE = {"method": "kd", "task": "sst2", "student": "teacher-3l", "teacher": "some/teacher"}


def test_standard_keys_land_in_their_sections_and_text_is_typed():
    config = build_run_config({**BASE, **parse_overrides(
        ["seed=7", "epochs=2", "max_steps=30", "batch_size=16", "lr=1e-4", "max_seq_length=64",
         "max_train_samples=100", "max_eval_samples=50", "temperature=4", "alpha=0.3"])})
    assert (config.train.seed, config.train.epochs, config.train.max_steps) == (7, 2.0, 30)
    assert (config.train.batch_size, config.train.lr, config.train.max_seq_length) == (16, 1e-4, 64)
    assert (config.data.max_train_samples, config.data.max_eval_samples) == (100, 50)
    # Every other key belongs to the method and stays text until the method types it.
    assert config.method_params == {"temperature": "4", "alpha": "0.3"}


def test_every_optimisation_value_is_a_flat_run_key_not_a_method_parameter():
    config = build_run_config({**BASE, **parse_overrides(
        ["optimizer=lamb", "lr_schedule=constant", "warmup_ratio=0.02", "adam_beta1=0.8", "adam_beta2=0.98",
         "adam_epsilon=1e-6", "weight_decay=0.01", "max_grad_norm=0.5"])})
    train = config.train
    assert (train.optimizer, train.lr_schedule, train.warmup_ratio) == ("lamb", "constant", 0.02)
    assert (train.adam_beta1, train.adam_beta2, train.adam_epsilon) == (0.8, 0.98, 1e-6)
    assert (train.weight_decay, train.max_grad_norm) == (0.01, 0.5)
    assert config.method_params == {}


def test_yaml_file_and_dotted_keys(tmp_path):
    path = tmp_path / "run.yaml"
    path.write_text(yaml.safe_dump({**BASE, "train": {"warmup_ratio": 0.06}, "alpha": 0.9}))
    values = load_yaml(path)
    values.update(parse_overrides(["train.grad_accum=4", "alpha=0.1"]))  # the command line wins
    config = build_run_config(values)
    assert config.train.warmup_ratio == 0.06 and config.train.grad_accum == 4
    assert config.method_params == {"alpha": "0.1"}


@pytest.mark.parametrize(("override", "message"), [
    ("lr=-1", "train.lr: must be > 0, got -1.0"),
    ("batch_size=zero", "train.batch_size: expected an integer, got 'zero'"),
    ("epochs=0", "train.epochs: must be > 0, got 0.0"),
    ("max_seq_length=4", "train.max_seq_length: must be in [8, 8192], got 4"),
    ("precision=fp8", "train.precision: must be one of auto, fp32, bf16, fp16, got 'fp8'"),
    ("on_bad_row=ignore", "data.on_bad_row: must be one of error, skip, got 'ignore'"),
    ("train.batchsize=3", "unknown key train.batchsize='3'; did you mean 'batch_size'?"),
    ("student_init=magic", "student_init: must be one of auto, random, teacher, pretrained, got 'magic'"),
])
def test_bad_values_are_named(override, message):
    with pytest.raises(ConfigError) as error:
        build_run_config({**BASE, **parse_overrides([override])})
    assert message in str(error.value)


def test_override_without_equals_and_missing_required_fields():
    with pytest.raises(ConfigError, match="'lr' is not of the form KEY=VALUE"):
        parse_overrides(["lr"])
    with pytest.raises(ConfigError, match="task: missing"):
        build_run_config({"method": "kd", "student": "x"})


def test_yaml_must_be_a_mapping_and_is_loaded_safely(tmp_path):
    path = tmp_path / "bad.yaml"
    path.write_text("- a\n- b\n")
    with pytest.raises(ConfigError, match="must hold a mapping, got list"):
        load_yaml(path)
    unsafe = tmp_path / "unsafe.yaml"
    unsafe.write_text("method: !!python/object/apply:os.system ['echo pwned']\n")
    with pytest.raises(ConfigError, match=r"unsafe.yaml', line 1: not a plain YAML mapping .*python/object/apply"):
        load_yaml(unsafe)  # refused by safe_load, reported in one line


def test_hash_ignores_output_location_and_round_trips(tmp_path):
    a = build_run_config({**BASE, "output": "runs-a", "lr": "1e-4"})
    b = build_run_config({**BASE, "output": "runs-b", "lr": "0.0001"})
    c = build_run_config({**BASE, "lr": "2e-4"})
    assert a.config_hash() == b.config_hash() != c.config_hash()
    save_config(a, tmp_path / "config.yaml")
    assert build_run_config(load_yaml(tmp_path / "config.yaml")).config_hash() == a.config_hash()


@pytest.mark.parametrize("key, expected", [
    ("mapping", True), ("method_params.alpha", True), ("method_params", True),
    ("lr", False), ("train.lr", False), ("data.max_train_samples", False), ("teacher", False), ("train", False),
])
def test_is_method_parameter_agrees_with_where_build_run_config_files_a_key(key, expected):
    assert is_method_parameter(key) is expected
    value = {"method_params": {"x": 1}, "train": {"lr": 1e-3}}.get(key, "1")
    if key == "teacher":
        value = "some/teacher"
    config = build_run_config({"method": "kd", "task": "sst2", "student": "s", key: value})
    assert bool(config.method_params) is expected
