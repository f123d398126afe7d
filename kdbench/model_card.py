"""Model cards for run folders, and pushing a student to the Hugging Face Hub.

Every completed run writes ``RUN/model/README.md`` from its record: the Hub's YAML metadata header
(``base_model`` = where the teacher comes from on the Hub, ``datasets``, ``metrics`` and
``model-index`` with the dev scores, ``tags`` ``knowledge-distillation`` / ``kdbench`` / the method,
``library_name: transformers``, ``pipeline_tag``, and the teacher's ``license`` where its card names
one), then what was distilled from what, by which method, how, and how well.

``kdbench card RUN|DIR ...`` (re)writes the cards of existing runs; ``kdbench push RUN --repo-id
NAME/REPO`` writes the card and uploads ``model/`` through ``huggingface_hub`` (``create_repo``,
``upload_folder``).

A model named by a folder is followed back to the Hub where it can be: the packaged MiniLM's folder is
``sentence-transformers/all-MiniLM-L6-v2``; a kdbench run's ``model/`` folder comes from that run's
teacher (a distillation) or student (a fine-tuning), recursively; a Hub cache folder
(``models--ORG--NAME/snapshots/...``) is ``ORG/NAME``.
"""

from __future__ import annotations

import argparse
import re
import sys
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import yaml

from kdbench.config import ConfigError
from kdbench.records import RESULT_FILE, RecordError, find_records, read_record

CARD_FILE = "README.md"
MODEL_DIR = "model"
TAGS = ("kdbench", "knowledge-distillation")
NO_TEACHER_METHODS = ("finetune",)

# kdbench metric -> (model-index metric type, display name); types follow the Hub's metric ids.
METRIC_TYPES: dict[str, tuple[str, str]] = {
    "acc": ("accuracy", "Accuracy"),
    "acc_mm": ("accuracy", "Accuracy (mismatched)"),
    "f1": ("f1", "F1"),
    "mcc": ("matthews_correlation", "Matthews correlation"),
    "pearson": ("pearsonr", "Pearson correlation"),
    "spearman": ("spearmanr", "Spearman correlation"),
    "em": ("exact_match", "Exact match"),
    "best_em": ("exact_match", "Exact match (best no-answer threshold)"),
    "best_f1": ("f1", "F1 (best no-answer threshold)"),
}
# Dev splits by their Hub names (MNLI's mismatched metric comes from the mismatched split).
HUB_SPLITS = {"acc_mm": "validation_mismatched"}
PIPELINE_TAGS = {"classification": "text-classification", "regression": "text-classification",
                 "span": "question-answering", "masked-lm": "fill-mask"}
TASK_TYPES = {"text-classification": "Text Classification", "question-answering": "Question Answering",
              "fill-mask": "Fill-Mask"}
SQUAD_DATASETS = {"squad": ("rajpurkar/squad", None, "SQuAD v1.1"), "squad-v2": ("rajpurkar/squad_v2", None, "SQuAD v2.0")}
GLUE_HUB = "nyu-mll/glue"
HUB_CACHE_FOLDER = re.compile(r"models--([^/]+?)--([^/]+)$")


class CardError(ConfigError):
    """A run cannot get a card or be pushed (not completed, no model folder, Hub offline ...)."""


# ---------------------------------------------------------------------------------------------
# Where a model comes from
# ---------------------------------------------------------------------------------------------
def _front_matter(readme: Path) -> dict[str, Any]:
    """The YAML header of a model card, or {} (no file, no header, unreadable YAML)."""
    try:
        text = readme.read_text(encoding="utf-8")
    except OSError:
        return {}
    match = re.match(r"^---\s*\n(.*?)\n---\s*(\n|$)", text, re.DOTALL)
    if not match:
        return {}
    try:
        data = yaml.safe_load(match.group(1))
    except yaml.YAMLError:
        return {}
    return data if isinstance(data, dict) else {}


def _is_hub_id(name: str) -> bool:
    return bool(re.fullmatch(r"[A-Za-z0-9][\w.\-]*(/[\w.\-]+)?", name)) and not Path(name).exists()


def model_origin(name: str | None, _seen: frozenset[str] = frozenset()) -> dict[str, Any]:
    """``{"hub_id": ..., "license": ...}`` of a model given as a Hub id, alias or folder; keys are
    left out where unknown. Student presets (``teacher-3l``) are shapes, not models: ``{}``."""
    from kdbench.pretrained import PACKAGED_MODELS
    from kdbench.registry import UnknownNameError

    if not name or name in _seen:
        return {}
    seen = _seen | {name}
    for packaged in PACKAGED_MODELS.values():
        if name in (packaged.name, packaged.hub_id) or _same_path(name, packaged.resolve()):
            origin = {"hub_id": packaged.hub_id}
            card = _front_matter(Path(packaged.resolve()) / CARD_FILE)
            if card.get("license"):
                origin["license"] = card["license"]
            return origin
    path = Path(name)
    if path.is_dir():
        record_path = path.parent / RESULT_FILE
        if path.name == MODEL_DIR and record_path.is_file():
            try:
                record = read_record(record_path)
            except RecordError:
                record = {}
            source = record.get("student") if record.get("method") in NO_TEACHER_METHODS else record.get("teacher")
            origin = model_origin(source, seen)
            card = _front_matter(path / CARD_FILE)
            if "license" not in origin and card.get("license"):
                origin["license"] = card["license"]
            return origin
        cached = next((m for m in (HUB_CACHE_FOLDER.search(str(p)) for p in (path, *path.parents)) if m), None)
        card = _front_matter(path / CARD_FILE)
        origin = {"hub_id": f"{cached.group(1)}/{cached.group(2)}"} if cached else {}
        if isinstance(card.get("base_model"), str) and not cached:
            origin["hub_id"] = card["base_model"]
        if card.get("license"):
            origin["license"] = card["license"]
        return origin
    try:
        from kdbench.plugins import STUDENTS

        STUDENTS.get(name)
        return {}  # a preset shape
    except (UnknownNameError, KeyError):
        pass
    return {"hub_id": name} if _is_hub_id(name) else {}


def _same_path(a: str, b: str) -> bool:
    try:
        return Path(a).resolve() == Path(b).resolve()
    except OSError:
        return False


# ---------------------------------------------------------------------------------------------
# The card
# ---------------------------------------------------------------------------------------------
def task_dataset(task_name: str) -> tuple[str | None, str | None, str]:
    """(Hub dataset id, config, display name) of a kdbench task; (None, None, name) where unknown."""
    from kdbench.plugins import TASKS

    if task_name in SQUAD_DATASETS:
        return SQUAD_DATASETS[task_name]
    try:
        task = TASKS.get(task_name)
    except Exception:
        return None, None, task_name
    declared = getattr(task, "task_spec", None)  # tasks declared as data name their Hub dataset
    if declared is not None and getattr(declared, "hub_path", None):
        return declared.hub_path, getattr(declared, "hub_config", None), task_name
    glue = getattr(task, "glue", None)
    if glue is not None and getattr(glue, "hub_name", None):
        return GLUE_HUB, glue.hub_name, f"GLUE {getattr(glue, 'dir_name', task_name)}"
    return None, None, task_name


def _head(task_name: str) -> str | None:
    from kdbench.plugins import TASKS

    try:
        spec = TASKS.get(task_name).spec
    except Exception:
        return None
    head = spec.head.value if hasattr(spec.head, "value") else str(spec.head)
    if head == "classification" and spec.label_names is None:
        return "regression"
    return head


def _model_name(record: Mapping[str, Any]) -> str:
    run_dir = record.get("run_dir")
    return Path(run_dir).name if run_dir else f"{record.get('method')}-{record.get('task')}"


def card_metadata(record: Mapping[str, Any]) -> dict[str, Any]:
    """The Hub metadata (the card's YAML header) of a completed run's record."""
    from huggingface_hub import EvalResult, ModelCardData

    method, task = str(record["method"]), str(record["task"])
    distilled = record.get("teacher") and method not in NO_TEACHER_METHODS
    origin = model_origin(record.get("teacher") if distilled else record.get("student"))
    dataset, dataset_config, dataset_name = task_dataset(task)
    head = _head(task)
    pipeline_tag = PIPELINE_TAGS.get(head or "")
    metrics = {name: value for name, value in (record.get("metrics") or {}).items()
               if isinstance(value, int | float) and not isinstance(value, bool)}
    eval_results = []
    if dataset and pipeline_tag:
        for name, value in metrics.items():
            metric_type, metric_name = METRIC_TYPES.get(name, (name, name))
            eval_results.append(EvalResult(
                task_type=pipeline_tag, task_name=TASK_TYPES.get(pipeline_tag), dataset_type=dataset,
                dataset_name=dataset_name, dataset_config=dataset_config,
                dataset_split=HUB_SPLITS.get(name, "validation"), metric_type=metric_type,
                metric_name=f"{metric_name} (dev, 0-100)", metric_value=round(float(value), 4)))
    corpus = ((record.get("config") or {}).get("data") or {}).get("corpus")
    datasets = [dataset] if dataset else ([corpus[len("hub:"):].split(":")[0]]
                                          if isinstance(corpus, str) and corpus.startswith("hub:") else None)
    tags = [*TAGS, method, task] if distilled else ["kdbench", method, task]
    data = ModelCardData(
        base_model=origin.get("hub_id"), license=origin.get("license"), library_name="transformers",
        pipeline_tag=pipeline_tag, tags=tags, datasets=datasets,
        metrics=sorted({METRIC_TYPES.get(n, (n, n))[0] for n in metrics}) or None,
        model_name=_model_name(record), eval_results=eval_results or None)
    return data.to_dict()


def _format_count(count: Any) -> str:
    return f"{count / 1e6:.1f}M" if isinstance(count, int | float) else "–"


def _model_text(name: Any, origin: Mapping[str, Any]) -> str:
    if not name:
        return "–"
    hub = origin.get("hub_id")
    shown = f"`{name}`"
    if hub and hub != name:
        shown += f" (from [{hub}](https://huggingface.co/{hub}))"
    elif hub:
        shown = f"[{hub}](https://huggingface.co/{hub})"
    return shown


def render_card(record: Mapping[str, Any], repo_id: str | None = None) -> str:
    """The whole ``README.md``: YAML header, then the run in words, numbers and config."""
    if record.get("status") != "completed":
        raise CardError(f"run {_model_name(record)!r} is {record.get('status')!r}, not completed: no model card")
    metadata = card_metadata(record)
    config = record.get("config") or {}
    method, task = record["method"], record["task"]
    distilled = record.get("teacher") and method not in NO_TEACHER_METHODS
    teacher_origin = model_origin(record.get("teacher")) if record.get("teacher") else {}
    _, _, dataset_name = task_dataset(task)
    params, teacher_params = record.get("student_params"), record.get("teacher_params")
    ratio = (f" ({100 * params / teacher_params:.0f}% of the teacher's {_format_count(teacher_params)})"
             if isinstance(params, int | float) and isinstance(teacher_params, int | float) and teacher_params else "")
    lines = ["---", yaml.safe_dump(metadata, sort_keys=False, allow_unicode=True).rstrip(), "---", "",
             f"# {_model_name(record)}", ""]
    if distilled:
        lines.append(f"A student model distilled from {_model_text(record.get('teacher'), teacher_origin)} with "
                     f"kdbench's `{method}` method on {dataset_name}.")
    else:
        lines.append(f"`{record.get('student')}` fine-tuned on {dataset_name} with kdbench's `{method}` "
                     "(no teacher).")
    lines += ["", "| | |", "|---|---|",
              f"| method | `{method}` {_params_text(config.get('method_params') or {})} |",
              f"| task | `{task}` ({dataset_name}) |"]
    if distilled:
        lines.append(f"| teacher | {_model_text(record.get('teacher'), teacher_origin)}, "
                     f"{_format_count(teacher_params)} parameters |")
    init = record.get("student_init") or config.get("student_init")
    layers = config.get("student_layers")
    init_text = f"; init `{init}`" + (f", layers `{layers}`" if layers not in (None, "auto") else "") if init else ""
    if config.get("student_init_from"):
        init_text += f" from `{config['student_init_from']}`"
    lines.append(f"| student | `{record.get('student')}`, {_format_count(params)} parameters{ratio}{init_text} |")
    data = record.get("data") or {}
    if data:
        lines.append("| data | " + ", ".join(f"{key.replace('_', ' ')} {value}" for key, value in data.items()
                                                if value) + " |")
    for stage in record.get("stages") or []:
        optimisation = stage.get("optimization") or {}
        detail = ", ".join(f"{key} {optimisation[key]}" for key in ("optimizer", "lr", "schedule", "epochs")
                           if key in optimisation)
        lines.append(f"| stage `{stage.get('name')}` | {stage.get('steps')} steps, {stage.get('seconds')} s"
                     + (f"; {detail}" if detail else "") + " |")
    revision = record.get("kdbench_revision") or {}
    versions = record.get("versions") or {}
    if versions.get("kdbench") or revision:
        lines.append(f"| kdbench | {versions.get('kdbench', '')} {(revision.get('commit') or '')[:12]}".rstrip() + " |")
    lines += ["", "## Results (dev set, 0-100)", "", "| metric | value |", "|---|---:|"]
    for name, value in (record.get("metrics") or {}).items():
        if isinstance(value, int | float) and not isinstance(value, bool):
            lines.append(f"| {name} | {value:.2f} |")
    model_ref = repo_id or "path/to/model"
    pipeline = metadata.get("pipeline_tag")
    lines += ["", "## Use", "", "```python", "from transformers import pipeline", "",
              f"model = pipeline({pipeline!r}, model={model_ref!r})" if pipeline else
              f"from transformers import AutoModel\nmodel = AutoModel.from_pretrained({model_ref!r})", "```", "",
              "Labels travel by name (`config.id2label`)." if pipeline == "text-classification" else "",
              "", "## Reproduce", "",
              f"The run's resolved config; saved as `config.yaml`, `kdbench run {method} --config config.yaml --task {task} "
              f"--student {record.get('student')}"
              + (f" --teacher {record.get('teacher')}" if record.get("teacher") else "") + "` runs it again:", "",
              "```yaml", yaml.safe_dump(dict(config), sort_keys=False).rstrip(), "```", ""]
    return "\n".join(lines)


def _params_text(params: Mapping[str, Any]) -> str:
    return "(" + ", ".join(f"{key} {value}" for key, value in params.items()) + ")" if params else ""


def write_model_card(model_dir: Path, record: Mapping[str, Any], repo_id: str | None = None) -> Path:
    """Write ``model_dir/README.md`` from a completed run's record; returns its path."""
    model_dir = Path(model_dir)
    if not model_dir.is_dir():
        raise CardError(f"run {_model_name(record)!r} has no model folder {str(model_dir)!r}")
    path = model_dir / CARD_FILE
    tmp = path.with_name(f".{CARD_FILE}.tmp")
    tmp.write_text(render_card(record, repo_id), encoding="utf-8")
    tmp.replace(path)
    return path


def run_record(run_dir: Path) -> dict[str, Any]:
    path = Path(run_dir) / RESULT_FILE
    if not path.is_file():
        raise CardError(f"{str(run_dir)!r} is not a run folder (no {RESULT_FILE})")
    return read_record(path)


# ---------------------------------------------------------------------------------------------
# Command line
# ---------------------------------------------------------------------------------------------
def cmd_card(args: argparse.Namespace) -> int:
    written = 0
    for folder in args.runs:
        folder = Path(folder)
        if not folder.exists():
            raise FileNotFoundError(f"{str(folder)!r} does not exist")
        records = [folder / RESULT_FILE] if (folder / RESULT_FILE).is_file() else find_records(folder)
        if not records:
            raise CardError(f"no {RESULT_FILE} under {str(folder)!r}")
        for path in records:
            record = read_record(path)
            if record.get("status") != "completed":
                print(f"kdbench: skipped {path.parent} ({record.get('status')}: {record.get('error')})", file=sys.stderr)
                continue
            print(write_model_card(path.parent / MODEL_DIR, record))
            written += 1
    if not written:
        raise CardError("no completed run among " + ", ".join(map(str, args.runs)))
    return 0


def push_run(run_dir: Path, repo_id: str, *, private: bool = False, revision: str | None = None,
             commit_message: str | None = None, token: str | None = None) -> str:
    """Write the run's card and upload ``RUN/model`` to the Hub repo ``repo_id``; returns the commit URL."""
    from huggingface_hub import constants, create_repo, upload_folder

    record = run_record(run_dir)
    if not re.fullmatch(r"[\w.\-]+/[\w.\-]+", repo_id):
        raise CardError(f"--repo-id {repo_id!r}: expected NAMESPACE/NAME")
    model_dir = Path(run_dir) / MODEL_DIR
    write_model_card(model_dir, record, repo_id)
    if constants.HF_HUB_OFFLINE:
        raise CardError(f"cannot push to {repo_id!r}: the Hub is switched off (HF_HUB_OFFLINE=1); "
                        f"the card is written in {model_dir}")
    create_repo(repo_id, repo_type="model", private=private or None, exist_ok=True, token=token)
    commit = upload_folder(repo_id=repo_id, repo_type="model", folder_path=str(model_dir), revision=revision,
                           token=token, commit_message=commit_message or
                           f"kdbench {record['method']} student for {record['task']} ({_model_name(record)})")
    return str(getattr(commit, "commit_url", commit))


def cmd_push(args: argparse.Namespace) -> int:
    print(push_run(Path(args.run), args.repo_id, private=args.private, revision=args.revision,
                   commit_message=args.message, token=args.token))
    return 0


def add_command(subparsers: Any) -> None:
    card = subparsers.add_parser("card", help="(re)write the model card (model/README.md) of finished runs")
    card.add_argument("runs", nargs="+", help="run folders, or folders holding runs")
    card.set_defaults(handler=cmd_card)

    push = subparsers.add_parser("push", help="upload a run's model/ (with its card) to the Hugging Face Hub")
    push.add_argument("run", help="run folder (holds result.json and model/)")
    push.add_argument("--repo-id", required=True, help="NAMESPACE/NAME of the model repo (created if missing)")
    push.add_argument("--private", action="store_true", help="create the repo private")
    push.add_argument("--revision", help="branch to commit to (default: main)")
    push.add_argument("--message", help="commit message")
    push.add_argument("--token", help="Hub token (default: the one `hf auth login` stored, or $HF_TOKEN)")
    push.set_defaults(handler=cmd_push)
