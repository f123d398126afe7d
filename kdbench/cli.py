"""The ``kdbench`` command line (also ``python -m kdbench``).

Every command exits 0 on success and, on bad input, non-zero with one line naming the bad value.
``kdbench run`` prints the run folder as the last line of standard output.
"""

from __future__ import annotations

import argparse
import importlib
import json
import logging
import os
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

from kdbench import __version__
from kdbench.console import protect_console

EXIT_BAD_INPUT = 2
EXIT_FAILED = 1

# Commands that live beside their feature: each module defines ``add_command(subparsers)``, which
# adds one sub-parser with ``set_defaults(handler=...)``. Those modules must import nothing heavy at
# module level, so ``kdbench --help`` and ``kdbench list`` stay fast.
COMMAND_MODULES: tuple[str, ...] = (
    "kdbench.tables",
    "kdbench.compare",
    "kdbench.measure",
    "kdbench.plots",
    "kdbench.tasks.corpus",
    "kdbench.predict",
    "kdbench.augment_cli",
    "kdbench.sweep",
    "kdbench.tuning",
    "kdbench.bench",
    "kdbench.reproduce",
    "kdbench.quickstart",
    "kdbench.disk",
    "kdbench.cache_admin",
    "kdbench.migrate",
    "kdbench.model_card",
    "kdbench.report",
)


def _user_errors() -> tuple[type[BaseException], ...]:
    from kdbench.config import ConfigError
    from kdbench.errors import DataError, TrainingOutOfMemoryError
    from kdbench.records import RecordError
    from kdbench.registry import UnknownNameError

    errors: list[type[BaseException]] = [ConfigError, DataError, RecordError, UnknownNameError, FileNotFoundError,
                                         TrainingOutOfMemoryError]
    try:
        from kdbench.engine import CheckpointError, NonFiniteLossError

        errors += [CheckpointError, NonFiniteLossError]
    except ImportError:  # pragma: no cover - the engine imports torch; listing must not need it
        pass
    return tuple(errors)


# -- list -------------------------------------------------------------------------------------
def cmd_list(args: argparse.Namespace) -> int:
    import warnings

    from kdbench.plugins import METHODS, STUDENTS, TABLES, TASKS

    def also(registry: Any, name: str) -> str:  # the aliases errors may suggest, so users can find them here
        aliases = registry.aliases(name)
        return f"\t(also: {', '.join(aliases)})" if aliases else ""

    with warnings.catch_warnings(record=True) as skipped:
        warnings.simplefilter("always")
        if args.what == "methods":  # name, heads, what student_init=auto means, description
            for name, method in METHODS.loadable_items():
                heads = ",".join(h.value for h in getattr(method, "heads", ()))
                init = getattr(method, "default_student_init", "?")
                print(f"{name}\t{heads}\tdefault student_init={init}\t{getattr(method, 'description', '')}"
                      f"{also(METHODS, name)}")
        elif args.what == "tasks":
            for name, task in TASKS.loadable_items():
                print(f"{name}\t{task.spec.head.value}\t{task.spec.main_metric}{also(TASKS, name)}")
        elif args.what == "students":
            for name, preset in STUDENTS.loadable_items():
                print(f"{name}\t{preset.description}{also(STUDENTS, name)}")
        elif args.what == "tables":
            for name, spec in TABLES.loadable_items():
                print(f"{name}\t{getattr(spec, 'description', '')}{also(TABLES, name)}")
    for warning in skipped:
        print(f"kdbench: warning: {warning.message}", file=sys.stderr)
    return 0


# -- run --------------------------------------------------------------------------------------
def run_config_from_args(args: argparse.Namespace) -> Any:
    from kdbench.config import build_run_config, load_yaml, parse_overrides

    values: dict[str, Any] = load_yaml(args.config) if args.config else {}
    for key in ("method", "task", "teacher", "student", "data_dir", "output"):
        value = getattr(args, key, None)
        if value is not None:
            values[key] = value
    values.update(parse_overrides(args.overrides))
    if "output" not in values:
        values["output"] = "runs"
    return build_run_config(values)


def cmd_run(args: argparse.Namespace) -> int:
    from kdbench.engine import is_main_process, plan_run, run_experiment
    from kdbench.engine.preflight import preflight

    config = run_config_from_args(args)
    if args.dry_run:  # everything a run checks before loading weights: configs, heads, the method's stages
        plan = plan_run(config)
        built = preflight(plan)
        print(json.dumps(plan.config.to_dict(), indent=2, default=str))
        for line in built.describe():
            print(f"[kdbench] {line}", file=sys.stderr)
        print(plan.run_dir)
        return 0
    run_dir = run_experiment(config)
    if not is_main_process():  # other ranks of a multi-GPU job: rank 0 reports
        return 0
    record = json.loads((run_dir / "result.json").read_text())
    print(json.dumps({"metrics": record["metrics"], "train_seconds": record.get("train_seconds")}))
    print(run_dir)
    return 0


# -- results / evaluate ---------------------------------------------------------------------------
def cmd_results(args: argparse.Namespace) -> int:
    from kdbench.records import records_table

    print(records_table(args.runs, args.format, include_input_errors=args.all))
    return 0


def cmd_evaluate(args: argparse.Namespace) -> int:
    import inspect

    from kdbench.config import ConfigError, DataConfig
    from kdbench.plugins import TASKS

    task = TASKS.get(args.task)
    predictions = Path(args.predictions)
    if not predictions.is_file():
        raise FileNotFoundError(f"predictions file {str(predictions)!r} does not exist")
    data_dir = DataConfig(data_dir=args.data_dir).resolved_data_dir()
    accepted = inspect.signature(task.score_prediction_file).parameters
    extra: dict[str, Any] = {}
    if args.na_probs is not None:  # SQuAD v2.0: no-answer scores for the threshold and its search
        if "na_probs" not in accepted:
            raise ConfigError(f"--na-probs: task {args.task!r} takes no no-answer scores (SQuAD v2.0 does)")
        extra = {"na_probs": Path(args.na_probs), "na_prob_threshold": args.na_prob_thresh}
    if args.label_order is not None:
        if "label_order" not in accepted:
            raise ConfigError(f"--label-order: task {args.task!r} has no label ids to order")
        extra["label_order"] = args.label_order
    if "warn" in accepted:  # ignored ids and missing predictions: said on stderr, counted in the JSON
        extra["warn"] = lambda message: print(f"kdbench: warning: {message}", file=sys.stderr)
    metrics = task.score_prediction_file(predictions, data_dir, args.split, **extra)
    print(json.dumps(metrics))
    return 0


# -- parser -------------------------------------------------------------------------------------
def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="kdbench", description="Comparative knowledge-distillation benchmark")
    parser.add_argument("--version", action="version", version=f"kdbench {__version__}")
    parser.add_argument("-v", "--verbose", action="store_true", help="debug logging")
    commands = parser.add_subparsers(dest="command", required=True)

    listing = commands.add_parser("list", help="list registered methods, tasks, students or tables")
    listing.add_argument("what", choices=("methods", "tasks", "students", "tables"))
    listing.set_defaults(handler=cmd_list)

    run = commands.add_parser("run", help="run one distillation (or fine-tuning) experiment")
    run.add_argument("method", metavar="METHOD", nargs="?",
                     help="distillation method: kd, tinybert, mobilebert, distilbert, pkd, ... (kdbench list "
                          "methods); finetune trains --student on the task alone (also how a teacher is made). "
                          "METHOD, --task and --student may come from --config instead: a run folder's "
                          "config.yaml runs that run again")
    _add_run_arguments(run)
    run.add_argument("--dry-run", action="store_true", help="resolve and validate the config, print it, train nothing")
    run.set_defaults(handler=cmd_run)

    results = commands.add_parser("results", help="all result records under a folder, as a table")
    results.add_argument("runs")
    results.add_argument("--format", default="markdown", choices=("markdown", "csv", "json"))
    results.add_argument("--all", action="store_true",
                         help="also list runs that failed on bad input (bad data or config) before training")
    results.set_defaults(handler=cmd_results)

    evaluate = commands.add_parser("evaluate", help="score a prediction file with the task's official metric")
    evaluate.add_argument("task")
    evaluate.add_argument("--predictions", required=True)
    evaluate.add_argument("--data-dir")
    evaluate.add_argument("--split", default="dev")
    evaluate.add_argument("--na-probs", default=None, help="SQuAD v2.0: JSON {question_id: no-answer score}")
    evaluate.add_argument("--na-prob-thresh", type=float, default=1.0, help="SQuAD v2.0: no-answer threshold")
    evaluate.add_argument("--label-order", choices=("hub", "glue"), default=None,
                          help="how bare label ids in the file are ordered where conventions differ (MNLI): "
                               "hub = the Hub glue dataset, glue = BERT's GLUE processor")
    evaluate.set_defaults(handler=cmd_evaluate)

    for module_name in COMMAND_MODULES:
        importlib.import_module(module_name).add_command(commands)
    return parser


def _add_run_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--task",
                        help="GLUE task (sst2, mnli, ...), squad / squad-v2, or corpus (kdbench list tasks)")
    parser.add_argument("--teacher", help="Hub id or local folder of the (fine-tuned) teacher")
    parser.add_argument("--student", help="preset name (kdbench list students), Hub id or folder")
    parser.add_argument("--data-dir", dest="data_dir", help="data root (default: $KDBENCH_DATA_DIR, then the Hub)")
    parser.add_argument("--output", help="parent folder of run folders (default: runs)")
    parser.add_argument("--config", help="YAML config file; command-line values win")
    parser.add_argument("overrides", nargs="*", metavar="KEY=VALUE", help="e.g. epochs=3 lr=1e-4 alpha=0.5")


def main(argv: list[str] | None = None) -> int:
    protect_console()  # a reader that goes away (`| head`, a killed `tee`) never fails the command
    parser = build_parser()
    # KEY=VALUE overrides may stand anywhere after the command (argparse alone would only take them
    # before the first option), so unknown tokens shaped like overrides are collected here.
    args, extra = parser.parse_known_args(argv)
    stray = [token for token in extra if "=" not in token or token.startswith("-")]
    if stray or (extra and not hasattr(args, "overrides")):
        parser.error(f"unrecognized arguments: {' '.join(stray or extra)}")
    if extra:
        args.overrides = list(args.overrides) + extra
    if args.command == "run" and args.method and "=" in args.method:  # METHOD left to --config: argparse took an override
        args.overrides = [args.method, *args.overrides]
        args.method = None
    if not args.verbose:
        quiet_libraries()
    logging.basicConfig(level=logging.DEBUG if args.verbose else logging.INFO,
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    handler: Callable[[argparse.Namespace], int] = args.handler
    try:
        return handler(args)
    except _user_errors() as error:
        message = str(error).strip().splitlines()[0] if str(error).strip() else type(error).__name__
        # Start on a fresh line: the error may interrupt a progress bar.
        print(f"\nkdbench: error: {message}" if _mid_line() else f"kdbench: error: {message}", file=sys.stderr)
        return EXIT_BAD_INPUT
    except KeyboardInterrupt:
        print("kdbench: interrupted", file=sys.stderr)
        return 130


def quiet_libraries() -> None:
    """Keep the libraries' load reports, advisory warnings and per-file progress bars off the
    console (``-v`` shows them): a run's own progress bar and log lines are what matter. Set
    through the environment, so nothing heavy is imported here; values the user set win."""
    for name, value in (("TRANSFORMERS_VERBOSITY", "error"), ("TRANSFORMERS_NO_ADVISORY_WARNINGS", "1"),
                        ("HF_DATASETS_DISABLE_PROGRESS_BARS", "1"), ("HF_HUB_DISABLE_PROGRESS_BARS", "1"),
                        ("DATASETS_VERBOSITY", "error"), ("TOKENIZERS_PARALLELISM", "false")):
        os.environ.setdefault(name, value)
    import warnings

    for module in ("transformers", "torch", "datasets", "accelerate"):
        warnings.filterwarnings("ignore", category=FutureWarning, module=module)
        warnings.filterwarnings("ignore", category=UserWarning, module=module)


def _mid_line() -> bool:
    """Whether a progress bar may have left standard error mid-line (only on a terminal)."""
    return sys.stderr.isatty()


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
