"""Typed run configuration: YAML (safe loader) plus ``key=value`` overrides, validated up front.

A run is fully described by a :class:`RunConfig`. The standard override keys (``seed``, ``epochs``,
``max_steps``, ``batch_size``, ``lr``, ``max_seq_length``, ``max_train_samples``,
``max_eval_samples``, ...) address the ``train`` and ``data`` sections; dotted keys
(``train.warmup_ratio=0.06``) address any field; every other key is a parameter of the method
(``temperature``, ``alpha``, a loss weight) and is checked against the method's own typed
parameters before anything expensive starts.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
import types
import typing
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from kdbench.constraints import ConfigError, check_fields, constrained
from kdbench.optimization import OPTIMIZERS, RUN_FIELDS, SCHEDULES
from kdbench.fingerprint import HUB_SOURCE_PREFIX, canonical_path, is_path_like
from kdbench.pretrained import resolve_model_name


KEEP_CHECKPOINTS = ("last", "none", "all")
PRECISIONS = ("auto", "fp32", "bf16", "fp16")
BAD_ROW_POLICIES = ("error", "skip")
STUDENT_INITS = ("auto", "random", "teacher", "pretrained")
STUDENT_LAYER_CHOICES = ("auto", "bottom", "every-other")


@dataclass
class TrainConfig:
    # Optimisation fields left None take the stage's declaration (the method's official values),
    # else kdbench's generic default (kdbench.optimization.GENERIC: 3 epochs, AdamW lr 5e-5, linear
    # schedule, warm-up 0.1, weight decay 0.01, clipping 1.0); a value given here wins for every stage.
    epochs: float | None = constrained(None, gt=0)
    max_steps: int = constrained(-1, gt=0, allow=(-1,))
    batch_size: int = constrained(32, gt=0)
    eval_batch_size: int = constrained(64, gt=0)
    lr: float | None = constrained(None, gt=0)
    weight_decay: float | None = constrained(None, ge=0)
    warmup_ratio: float | None = constrained(None, ge=0, lt=1)
    optimizer: str | None = constrained(None, choices=OPTIMIZERS)
    lr_schedule: str | None = constrained(None, choices=SCHEDULES)
    adam_beta1: float | None = constrained(None, ge=0, lt=1)
    adam_beta2: float | None = constrained(None, ge=0, lt=1)
    adam_epsilon: float | None = constrained(None, gt=0)
    max_grad_norm: float | None = constrained(None, ge=0)  # 0: no clipping
    grad_accum: int = constrained(1, gt=0)
    max_seq_length: int = constrained(128, ge=8, le=8192)
    seed: int = 42
    eval_steps: int | None = constrained(None, gt=0)  # None: evaluate at the end of every epoch
    # The dev metric that picks a stage's best checkpoint; None: the task's main metric (TinyBERT's
    # task_distill.py picks MRPC and QQP on accuracy, where the main metric is F1: select_metric=acc).
    select_metric: str | None = constrained(None, non_empty=True)
    logging_steps: int = constrained(50, gt=0)
    precision: str = constrained("auto", choices=PRECISIONS)
    save_total_limit: int = constrained(2, ge=1)
    group_by_length: bool = True
    # Speed-only options, out of the run's identity hash. They change no result, except that layers read
    # from the teacher cache are rounded to teacher_cache_dtype (a live teacher's are not): see kdbench.cache.
    dataloader_workers: int = constrained(0, ge=0)  # processes that read and pad batches (0: the training one)
    compile: bool = False  # torch.compile the student and teacher (GPU)
    teacher_cache: bool = True  # read teacher outputs from the on-disk cache (kdbench.cache)
    # Disk allowed for the hidden states / attention maps of one stage's cache entry. 16 GiB holds TinyBERT's
    # intermediate stage from a BERT-base teacher (mapped layers, float16) on CoLA, MRPC, STS-B, RTE and WNLI.
    teacher_cache_budget_mb: float = constrained(16384.0, ge=0)
    # also save a checkpoint after this much training time (0: only at evaluations)
    checkpoint_minutes: float = constrained(10.0, ge=0)
    # after a stage ends: last | none | all of its checkpoints stay on disk
    keep_checkpoints: str = constrained("last", choices=KEEP_CHECKPOINTS)
    # Experiment trackers (kdbench.tracking): none | all | tensorboard,wandb,mlflow,...; changes no result either.
    report_to: str | list[str] = "none"
    # float16 | bfloat16 | float32: the precision of cached hidden states / attention maps on disk
    teacher_cache_dtype: str = constrained("float16", choices=("float16", "bfloat16", "float32"))

    def check_combination(self) -> None:
        from kdbench.tracking import report_targets

        report_targets(self.report_to)  # an unknown or uninstalled tracker is a one-line error


@dataclass
class DataConfig:
    data_dir: str | None = None  # None: $KDBENCH_DATA_DIR, then the Hugging Face Hub
    max_train_samples: int | None = constrained(None, gt=0)
    max_eval_samples: int | None = constrained(None, gt=0)
    on_bad_row: str = constrained("error", choices=BAD_ROW_POLICIES)  # skipped rows are counted in the record
    train_file: str | None = None  # explicit files override the data_dir layout
    dev_file: str | None = None
    corpus: str | None = None  # plain-text corpus for general (pre-training) distillation

    def resolved_data_dir(self) -> Path | None:
        chosen = self.data_dir or os.environ.get("KDBENCH_DATA_DIR")
        return Path(chosen).expanduser() if chosen else None


SPEED_ONLY_TRAIN_KEYS = ("compile", "teacher_cache", "teacher_cache_budget_mb", "teacher_cache_dtype", "checkpoint_minutes",
                         "keep_checkpoints",
                         "report_to")
# Speed-only options that were part of the identity when records were first written: the identity holds
# them at the value every such record has, so those records keep their names and any value names the
# same run.
IDENTITY_PINNED_TRAIN_VALUES: dict[str, Any] = {"dataloader_workers": 0}


@dataclass
class RunConfig:
    method: str = constrained(non_empty=True)
    task: str = constrained(non_empty=True)
    student: str = constrained(non_empty=True)
    teacher: str | None = None
    tokenizer: str | None = None  # default: the teacher's, else the student's
    # auto | random | teacher (copy teacher layers) | pretrained
    student_init: str = constrained("auto", choices=STUDENT_INITS)
    # auto | bottom | every-other | explicit 0-based list
    student_layers: str | list[int] = constrained(
        "auto", choices=STUDENT_LAYER_CHOICES, ge=0,
        rule="must be auto, bottom, every-other or a list of non-negative teacher layer indices")
    # Copy the student's layers from this model instead of the teacher (Hub id, folder or alias): BERT-PKD
    # and DistilBERT start their students from the pre-trained, not the fine-tuned, BERT.
    student_init_from: str | None = None
    method_params: dict[str, Any] = field(default_factory=dict)
    train: TrainConfig = field(default_factory=TrainConfig)
    data: DataConfig = field(default_factory=DataConfig)
    output: str = "runs"
    label: str | None = None  # free-form row label used by tables and sweeps
    trust_remote_code: bool = False

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    def identity(self) -> dict[str, Any]:
        """Everything that determines the result (the output location does not). Unset (``None``)
        values are left out, so adding an optional field does not change existing runs' identities."""
        data = self.to_dict()
        data.pop("output")
        for name in SPEED_ONLY_TRAIN_KEYS:
            data["train"].pop(name, None)
        data["train"].update(IDENTITY_PINNED_TRAIN_VALUES)
        return _without_none(data)

    def config_hash(self) -> str:
        """Hash of the config alone; a run's folder also covers its inputs' content
        (:attr:`kdbench.engine.RunPlan.identity`)."""
        canonical = json.dumps(self.identity(), sort_keys=True, default=str)
        return hashlib.sha256(canonical.encode()).hexdigest()[:12]


# Flat keys every run understands, and where they live.
STANDARD_KEYS: dict[str, str] = {
    "seed": "train.seed",
    "max_steps": "train.max_steps",
    "batch_size": "train.batch_size",
    "eval_batch_size": "train.eval_batch_size",
    "learning_rate": "train.lr",
    "grad_accum": "train.grad_accum",
    "max_seq_length": "train.max_seq_length",
    "eval_steps": "train.eval_steps",
    "select_metric": "train.select_metric",
    "logging_steps": "train.logging_steps",
    "precision": "train.precision",
    "checkpoint_minutes": "train.checkpoint_minutes",
    "keep_checkpoints": "train.keep_checkpoints",
    "report_to": "train.report_to",
    "max_train_samples": "data.max_train_samples",
    "max_eval_samples": "data.max_eval_samples",
    "data_dir": "data.data_dir",
    "on_bad_row": "data.on_bad_row",
    "train_file": "data.train_file",
    "dev_file": "data.dev_file",
    "corpus": "data.corpus",
    # every optimisation value a run may set (lr=, epochs=, optimizer=lamb, max_grad_norm=1.0, ...), so
    # none of them is taken for a method parameter
    **{name: f"train.{name}" for name in RUN_FIELDS},
}
SECTIONS = {"train": TrainConfig, "data": DataConfig}
TOP_LEVEL = {f.name for f in dataclasses.fields(RunConfig)} - {"train", "data", "method_params"}


def parse_overrides(pairs: list[str]) -> dict[str, str]:
    """``["lr=1e-4", "alpha=0.5"]`` -> ``{"lr": "1e-4", "alpha": "0.5"}`` (values stay text)."""
    parsed: dict[str, str] = {}
    for pair in pairs:
        key, sep, value = pair.partition("=")
        if not sep or not key.strip():
            raise ConfigError(f"override {pair!r} is not of the form KEY=VALUE")
        parsed[key.strip()] = value.strip()
    return parsed


def load_yaml(path: str | Path) -> dict[str, Any]:
    path = Path(path)
    if not path.is_file():
        raise ConfigError(f"config file {str(path)!r} does not exist")
    try:
        with path.open(encoding="utf-8") as handle:
            data = yaml.safe_load(handle) or {}
    except yaml.YAMLError as error:  # also a tag such as !!python/object, which safe_load refuses
        mark = getattr(error, "problem_mark", None)
        where = f", line {mark.line + 1}" if mark is not None else ""
        problem = getattr(error, "problem", None) or str(error).splitlines()[0]
        raise ConfigError(f"config file {str(path)!r}{where}: not a plain YAML mapping ({problem})") from None
    except UnicodeDecodeError:
        raise ConfigError(f"config file {str(path)!r} is not UTF-8 text") from None
    if not isinstance(data, dict):
        raise ConfigError(f"config file {str(path)!r} must hold a mapping, got {type(data).__name__}")
    return data


def is_method_parameter(key: str) -> bool:
    """Whether :func:`build_run_config` files ``key`` under the method's parameters."""
    if key == "method_params" or key.startswith("method_params."):
        return True
    if key in SECTIONS or key in STANDARD_KEYS or key in TOP_LEVEL:
        return False
    return "." not in key


def build_run_config(values: dict[str, Any]) -> RunConfig:
    """Build a RunConfig from a mapping that may mix sections, flat standard keys and method keys.

    Values given as text (from the command line) are converted to the field's declared type.
    """
    top: dict[str, Any] = {}
    sections: dict[str, dict[str, Any]] = {name: {} for name in SECTIONS}
    method_params: dict[str, Any] = {}
    for key, value in values.items():
        if key == "method_params":
            if not isinstance(value, dict):
                raise ConfigError(f"method_params: must be a mapping, got {value!r}")
            method_params.update(value)
        elif is_method_parameter(key):
            method_params[key.removeprefix("method_params.")] = value
        elif key in SECTIONS:
            if not isinstance(value, dict):
                raise ConfigError(f"{key}: must be a mapping, got {value!r}")
            sections[key].update(value)
        elif key in STANDARD_KEYS:
            section, name = STANDARD_KEYS[key].split(".")
            sections[section][name] = value
        elif key in TOP_LEVEL:
            top[key] = value
        else:  # a dotted key that is not method_params.*
            section, name = key.split(".", 1)
            if section not in SECTIONS:
                raise ConfigError(f"unknown config section {section!r} in key {key!r}")
            sections[section][name] = value
    for required in ("method", "task", "student"):
        if not top.get(required):
            raise ConfigError(f"{required}: missing (give it on the command line or in the YAML file)")
    train = from_mapping(TrainConfig, sections["train"], where="train")
    data = canonical_data_paths(from_mapping(DataConfig, sections["data"], where="data"))
    for role in MODEL_KEYS:
        if isinstance(top.get(role), str):
            top[role] = resolve_model_name(top[role])
            if is_path_like(top[role]):
                top[role] = canonical_path(top[role])
    if isinstance(top.get("output"), str):
        top["output"] = canonical_path(top["output"])
    return from_mapping(RunConfig, {**top, "train": train, "data": data, "method_params": method_params}, where="")


def _without_none(value: Any) -> Any:
    if isinstance(value, dict):
        return {key: _without_none(item) for key, item in value.items() if item is not None}
    return value


MODEL_KEYS = ("teacher", "student", "tokenizer", "student_init_from")


def canonical_data_paths(data: DataConfig) -> DataConfig:
    """Every data path absolute and canonical, and the data directory resolved (``--data-dir``, else
    ``$KDBENCH_DATA_DIR``), so that a run's config names exactly what it reads, however it was spelled."""
    changes: dict[str, Any] = {}
    resolved = data.resolved_data_dir()
    if resolved is not None:
        changes["data_dir"] = canonical_path(str(resolved))
    for name in ("train_file", "dev_file", "corpus"):
        value = getattr(data, name)
        if value and not value.startswith(HUB_SOURCE_PREFIX):
            changes[name] = canonical_path(value)
    return dataclasses.replace(data, **changes)


def from_mapping(cls: type, values: dict[str, Any], *, where: str) -> Any:
    """Instantiate dataclass ``cls`` from ``values``, converting text to each field's type, and
    enforce the fields' declared constraints (:mod:`kdbench.constraints`).

    Unknown keys, missing required fields and violated constraints are errors that name the key and
    the value (for an unknown key, also the closest valid field).
    """
    import difflib

    fields = {f.name: f for f in dataclasses.fields(cls)}
    hints = typing.get_type_hints(cls)
    kwargs: dict[str, Any] = {}
    prefix = f"{where}." if where else ""
    for key, value in values.items():
        if key not in fields:
            close = difflib.get_close_matches(key, list(fields), n=1)
            hint = f"; did you mean {close[0]!r}?" if close else ""
            valid = ", ".join(sorted(fields))
            raise ConfigError(f"unknown key {prefix}{key}={value!r}{hint} (valid: {valid})")
        kwargs[key] = coerce(value, hints[key], f"{prefix}{key}")
    missing = [name for name, f in fields.items() if f.init and name not in kwargs
               and f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING]
    if missing:
        raise ConfigError(f"{prefix}{missing[0]}: missing")
    try:
        instance = cls(**kwargs)
    except TypeError as error:
        raise ConfigError(f"{where or 'config'}: {error}") from None
    check_fields(instance, where)
    return instance


def coerce(value: Any, hint: Any, name: str) -> Any:
    """Convert ``value`` (often text) to the type ``hint``; raise ConfigError naming ``name``."""
    origin = typing.get_origin(hint)
    if origin in (typing.Union, types.UnionType):
        options = typing.get_args(hint)
        if (value is None or (isinstance(value, str) and value.lower() in ("none", "null"))) \
                and type(None) in options:
            return None
        errors = []
        for option in sorted((o for o in options if o is not type(None)), key=_coerce_order):
            try:
                return coerce(value, option, name)
            except ConfigError as error:
                errors.append(str(error))
        raise ConfigError(f"{name}: cannot use {value!r} ({'; '.join(errors)})")
    if hint is Any:
        return _parse_text(value) if isinstance(value, str) else value
    if origin in (list, tuple):
        items = _parse_text(value) if isinstance(value, str) else value
        if not isinstance(items, (list, tuple)):
            raise ConfigError(f"{name}: expected a list, got {value!r}")
        (item_hint, *_) = typing.get_args(hint) or (Any,)
        converted = [coerce(item, item_hint, name) for item in items]
        return tuple(converted) if origin is tuple else converted
    if origin is dict:
        mapping = _parse_text(value) if isinstance(value, str) else value
        if not isinstance(mapping, dict):
            raise ConfigError(f"{name}: expected a mapping, got {value!r}")
        return dict(mapping)
    if hint is bool:
        if isinstance(value, bool):
            return value
        if isinstance(value, str) and value.lower() in ("true", "yes", "1", "on"):
            return True
        if isinstance(value, str) and value.lower() in ("false", "no", "0", "off"):
            return False
        raise ConfigError(f"{name}: expected true or false, got {value!r}")
    if hint is int:
        if isinstance(value, bool):
            raise ConfigError(f"{name}: expected an integer, got {value!r}")
        try:
            number = float(value)
        except (TypeError, ValueError):
            raise ConfigError(f"{name}: expected an integer, got {value!r}") from None
        if not number.is_integer():
            raise ConfigError(f"{name}: expected an integer, got {value!r}")
        return int(number)
    if hint is float:
        if isinstance(value, bool):
            raise ConfigError(f"{name}: expected a number, got {value!r}")
        try:
            number = float(value)
        except (TypeError, ValueError):
            raise ConfigError(f"{name}: expected a number, got {value!r}") from None
        if number != number or number in (float("inf"), float("-inf")):
            raise ConfigError(f"{name}: expected a finite number, got {value!r}")
        return number
    if hint is str:
        if isinstance(value, (dict, list)):
            raise ConfigError(f"{name}: expected text, got {value!r}")
        return str(value)
    return value


def _coerce_order(option: Any) -> int:
    # Try the most specific interpretation first: a list before text, a number before text.
    order = {list: 0, int: 1, float: 2, bool: 3, str: 9}
    return order.get(typing.get_origin(option) or option, 5)


def _parse_text(text: str) -> Any:
    try:
        return yaml.safe_load(text)
    except yaml.YAMLError:
        return text


def save_config(config: RunConfig, path: Path) -> None:
    path.write_text(yaml.safe_dump(config.to_dict(), sort_keys=False))
