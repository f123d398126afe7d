"""Experiment trackers for a run: ``report_to=tensorboard`` (or ``wandb``, ``mlflow``, any
integration of ``transformers.Trainer``), default ``none``.

What a run reports, under names that do not change between runs or methods (Trainer's integrations
put the training logs under ``train/`` and the evaluations under ``eval/``):

- every logged step: ``loss`` (the stage's total), ``loss/<term>`` (each term the method's loss
  returns, averaged over the logging window), ``learning_rate``, ``lr/<group>`` (when a stage trains
  parameter groups at different rates), ``grad_norm``, ``epoch``;
- every evaluation: ``eval/<metric>`` (the task's dev metrics, 0-100);
- once per run: the resolved config as hyperparameters (flattened, ``train.lr``, ``method_params.alpha``,
  ...) and the result (``result/<metric>``, ``result/student_params``, ...) as the summary.

Each stage is its own Trainer, whose steps start at 0, so each stage reports as its own series:
TensorBoard event files go to ``RUN/tensorboard/<index>-<stage>/`` (the config and result to
``RUN/tensorboard/result/``), so ``tensorboard --logdir runs`` shows every run and stage; W&B gets
one run per kdbench run (the stages' Trainers log into it); MLflow one parent run per kdbench run
with one nested run per stage (a stage's Trainer logs its own arguments, which differ between stages).

Which trackers are known and installed is checked when the config is built, before anything loads.
This module imports neither torch nor transformers at module level (the config imports it).
"""

from __future__ import annotations

import contextlib
import importlib.util
import json
import logging
import os
import types
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import yaml

log = logging.getLogger("kdbench")

NONE = "none"
ALL = "all"
TENSORBOARD = "tensorboard"
WANDB = "wandb"
MLFLOW = "mlflow"
TENSORBOARD_DIR = "tensorboard"  # under the run folder
RESULT_SERIES = "result"  # RUN/tensorboard/result: the run's config and result
RESULT_PREFIX = "result/"

# transformers' INTEGRATION_TO_CALLBACK names (a test keeps the two equal) and the module each needs.
REPORT_TARGETS: dict[str, tuple[str, ...]] = {
    "azure_ml": ("azureml",),
    "clearml": ("clearml",),
    "codecarbon": ("codecarbon",),
    "comet_ml": ("comet_ml",),
    "dagshub": ("dagshub",),
    "dvclive": ("dvclive",),
    "flyte": ("flytekit",),
    "kubeflow": ("kubeflow",),
    "mlflow": ("mlflow",),
    "neptune": ("neptune",),
    "swanlab": ("swanlab",),
    "tensorboard": ("tensorboard", "tensorboardX"),
    "trackio": ("trackio",),
    "wandb": ("wandb",),
}


def _installed(target: str) -> bool:
    return any(importlib.util.find_spec(module) is not None for module in REPORT_TARGETS[target])


def report_targets(value: str | list[str] | None) -> list[str]:
    """The trackers ``value`` names: ``"none"`` -> ``[]``; ``"all"`` -> every installed one;
    ``"tensorboard,wandb"`` or ``["tensorboard", "wandb"]`` -> both. Raises ConfigError naming an
    unknown or uninstalled tracker."""
    from kdbench.config import ConfigError

    if value is None:
        return []
    names = value.split(",") if isinstance(value, str) else list(value)
    names = [str(name).strip() for name in names if str(name).strip()]
    if names in ([], [NONE]):
        return []
    if names == [ALL]:
        return [name for name in REPORT_TARGETS if _installed(name)]
    targets: list[str] = []
    for name in names:
        if name not in REPORT_TARGETS:
            import difflib

            close = difflib.get_close_matches(name, list(REPORT_TARGETS), n=1)
            hint = f"; did you mean {close[0]!r}?" if close else ""
            raise ConfigError(f"train.report_to: unknown tracker {name!r}{hint} "
                              f"(known: none, all, {', '.join(REPORT_TARGETS)})")
        if not _installed(name):
            raise ConfigError(f"train.report_to: tracker {name!r} is not installed "
                              f"(pip install {REPORT_TARGETS[name][0]})")
        if name not in targets:
            targets.append(name)
    return targets


def trainer_report_to(value: str | list[str] | None) -> list[str]:
    """What a stage's ``TrainingArguments.report_to`` gets: every tracker but TensorBoard, which
    :class:`RunTracking` attaches itself so that its files land in the run folder."""
    return [name for name in report_targets(value) if name != TENSORBOARD]


def flatten(mapping: Mapping[str, Any], prefix: str = "") -> dict[str, Any]:
    """``{"train": {"lr": 1e-4}}`` -> ``{"train.lr": 1e-4}``; lists and ``None`` become text, so
    every tracker takes the values as hyperparameters."""
    flat: dict[str, Any] = {}
    for key, value in mapping.items():
        name = f"{prefix}{key}"
        if isinstance(value, Mapping):
            flat.update(flatten(value, f"{name}."))
        elif isinstance(value, bool | int | float | str):
            flat[name] = value
        else:
            flat[name] = json.dumps(value, default=str)
    return flat


def result_summary(outcome: Mapping[str, Any]) -> dict[str, float]:
    """The numbers a finished run reports once: dev metrics and sizes, as ``result/<name>``."""
    summary = {f"{RESULT_PREFIX}{name}": float(value) for name, value in (outcome.get("metrics") or {}).items()
               if isinstance(value, int | float) and not isinstance(value, bool)}
    for key in ("student_params", "teacher_params", "train_seconds"):
        if isinstance(outcome.get(key), int | float):
            summary[f"{RESULT_PREFIX}{key}"] = float(outcome[key])
    return summary


def numeric_logs(logs: Mapping[str, Any] | None) -> dict[str, float]:
    return {key: value for key, value in (logs or {}).items()
            if isinstance(value, int | float) and not isinstance(value, bool)}


def _tensorboard_callback(folder: Path) -> Any:
    from torch.utils.tensorboard import SummaryWriter
    from transformers.integrations import TensorBoardCallback

    class StageTensorBoardCallback(TensorBoardCallback):
        """Trainer's TensorBoard callback writing into ``folder``, given only the numbers (the stage's
        name, which Trainer's logs carry as text on every step, is already the folder's name)."""

        def on_train_begin(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
            if state.is_world_process_zero and self.tb_writer is None:
                # A resumed stage logs again the steps after its checkpoint: purge_step hides the
                # copies an earlier attempt wrote past it.
                self.tb_writer = SummaryWriter(log_dir=str(folder), purge_step=state.global_step or None)
            super().on_train_begin(args, state, control, **kwargs)

        def on_log(self, args: Any, state: Any, control: Any, logs: dict[str, Any] | None = None,
                   **kwargs: Any) -> None:
            super().on_log(args, state, control, logs=numeric_logs(logs), **kwargs)

    return StageTensorBoardCallback()


class RunTracking(contextlib.AbstractContextManager):
    """The trackers of one run: opened before the first stage, given the result at the end.

    ``stage_callbacks`` gives the callbacks kdbench adds to a stage's Trainer (TensorBoard, writing
    into the run folder); the other trackers come from ``TrainingArguments.report_to``.
    """

    def __init__(self, config: Any, run_dir: Path, *, writer: bool = True):
        self.config = config
        self.run_dir = Path(run_dir)
        self.writer = writer  # only the main process of a multi-process job reports
        self.targets = report_targets(config.train.report_to) if writer else []
        self._mlflow_env: str | None = None
        self._mlflow_run: str | None = None
        self._opened: list[str] = []

    # -- stages ------------------------------------------------------------------------------
    def stage_callbacks(self, index: int, stage_name: str) -> list[Any]:
        if TENSORBOARD not in self.targets:
            return []
        return [_tensorboard_callback(self.run_dir / TENSORBOARD_DIR / f"{index}-{stage_name}")]

    # -- run -----------------------------------------------------------------------------------
    def __enter__(self) -> RunTracking:
        hparams = flatten(self.config.to_dict())
        if WANDB in self.targets:
            import wandb

            if wandb.run is None:
                wandb.init(name=self.run_dir.name, dir=str(self.run_dir), config=hparams,
                           job_type=self.config.method, group=self.config.label or None,
                           tags=[self.config.method, self.config.task])
                self._opened.append(WANDB)
        if MLFLOW in self.targets:
            import mlflow

            run = mlflow.start_run(run_name=self.run_dir.name, nested=mlflow.active_run() is not None)
            self._mlflow_run = run.info.run_id
            mlflow.log_params({key: str(value)[:500] for key, value in hparams.items()})
            # The stages' Trainers log their own arguments, which differ between stages, and MLflow
            # never changes a logged parameter: each stage gets a run nested under this one.
            self._mlflow_env = os.environ.get("MLFLOW_NESTED_RUN")
            os.environ["MLFLOW_NESTED_RUN"] = "TRUE"
            self._opened.append(MLFLOW)
        return self

    def log_result(self, outcome: Mapping[str, Any]) -> None:
        """Record the run's config and result: TensorBoard hyperparameters (and the config and
        result as text), the W&B summary, the MLflow parent run's metrics."""
        summary = result_summary(outcome)
        if TENSORBOARD in self.targets:
            from torch.utils.tensorboard import SummaryWriter

            hparams = flatten(self.config.to_dict())
            with SummaryWriter(log_dir=str(self.run_dir / TENSORBOARD_DIR / RESULT_SERIES)) as writer:
                writer.add_hparams(hparams, summary, run_name=".")
                writer.add_text("config", "```\n" + yaml.safe_dump(self.config.to_dict(), sort_keys=False) + "```")
                writer.add_text("result", "```\n" + json.dumps(dict(outcome.get("metrics") or {}), indent=2) + "\n```")
        if WANDB in self.targets:
            import wandb

            if wandb.run is not None:
                wandb.run.summary.update(summary)
        if MLFLOW in self.targets:
            import mlflow

            if self._mlflow_run is not None:
                mlflow.log_metrics({key.replace(RESULT_PREFIX, "result."): value for key, value in summary.items()},
                                   run_id=self._mlflow_run)

    def __exit__(self, kind: type[BaseException] | None, error: BaseException | None,
                 trace: types.TracebackType | None) -> None:
        failed = kind is not None
        if MLFLOW in self._opened:
            import mlflow

            if self._mlflow_env is None:
                os.environ.pop("MLFLOW_NESTED_RUN", None)
            else:
                os.environ["MLFLOW_NESTED_RUN"] = self._mlflow_env
            while (active := mlflow.active_run()) is not None:  # a stage's run left open by a failure, then ours
                mlflow.end_run(status="FAILED" if failed else "FINISHED")
                if active.info.run_id == self._mlflow_run:
                    break
        if WANDB in self._opened:
            import wandb

            wandb.finish(exit_code=1 if failed else 0)
        self._opened.clear()
