"""``kdbench predict``: run a trained model over a task's test (or dev) split and write prediction files.

- GLUE test splits: the leaderboard's submission TSVs (``index<TAB>prediction`` with a header),
  one per test split, named as the leaderboard expects (``CoLA.tsv``, ``SST-2.tsv``, ``MRPC.tsv``,
  ``STS-B.tsv``, ``QQP.tsv``, ``MNLI-m.tsv``, ``MNLI-mm.tsv``, ``QNLI.tsv``, ``RTE.tsv``,
  ``WNLI.tsv``, ``AX.tsv``; ``ax`` is predicted with an MNLI model).
- GLUE dev splits (``--split dev``): ``<task>-<split>.tsv`` in the same format, which
  ``kdbench evaluate`` scores; the metrics are printed as one JSON object. Labels are written as
  names (never ambiguous ids); STS-B dev scores unclipped, so the file scores as the run did.
- STS-B test submissions are clipped to the label range [0, 5]; a NaN or infinite predicted score
  is an error naming the example index, and nothing is written.
- SQuAD (dev): ``predictions.json`` (``{id: answer}``), ``nbest_predictions.json`` and, for v2.0,
  ``null_odds.json`` (the no-answer scores for ``kdbench evaluate squad-v2 --na-probs``); metrics printed.

The model's logits are put into the task's label order by label NAME (the model's ``id2label``),
so a model trained with another label order (e.g. MNLI from the original TSV code) predicts right.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

from kdbench.errors import DataError


def add_command(subparsers: Any) -> None:
    parser = subparsers.add_parser("predict", help="write test-set predictions (GLUE leaderboard TSVs, SQuAD JSON)")
    parser.add_argument("task")
    parser.add_argument("--model", required=True, help="a trained model folder (a run's model/ folder)")
    parser.add_argument("--out", required=True, help="folder for the prediction files")
    parser.add_argument("--split", default=None, help="test (GLUE default) or dev (SQuAD default; also scores)")
    parser.add_argument("--data-dir", default=None)
    parser.add_argument("--dev-file", default=None, help="explicit dev file (overrides --data-dir)")
    parser.add_argument("--max-seq-length", type=int, default=128, help="SQuAD papers use 384")
    parser.add_argument("--max-eval-samples", type=int, default=None)
    parser.add_argument("--batch-size", type=int, default=64)
    parser.add_argument("--on-bad-row", default="error", choices=("error", "skip"))
    parser.set_defaults(handler=cmd_predict)


def cmd_predict(args: argparse.Namespace) -> int:
    from kdbench.config import DataConfig, RunConfig, TrainConfig
    from kdbench.plugins import TASKS

    task = TASKS.get(args.task)
    run = RunConfig(method="finetune", task=task.spec.name, student=args.model,
                    train=TrainConfig(max_seq_length=args.max_seq_length, eval_batch_size=args.batch_size),
                    data=DataConfig(data_dir=args.data_dir, dev_file=args.dev_file, on_bad_row=args.on_bad_row,
                                    max_eval_samples=args.max_eval_samples))
    result = predict_task(task, args.model, run, Path(args.out), args.split)
    for path in result["files"]:
        print(f"wrote {path}")
    if result["metrics"]:
        print(json.dumps(result["metrics"]))
    return 0


def predict_task(task: Any, model_dir: str | Path, run: Any, out: Path, split: str | None = None) -> dict[str, Any]:
    """Predict ``split`` (``test`` or ``dev``) of ``task`` with the model in ``model_dir``; write the
    files into ``out``. Returns ``{"files": [...], "metrics": {...}}`` (metrics for dev only)."""
    from kdbench.config import ConfigError
    from kdbench.task import HeadType

    if task.spec.head is HeadType.MASKED_LM:
        raise ConfigError(f"task {task.spec.name!r} has nothing to predict")
    split = split or ("dev" if task.spec.head is HeadType.SPAN else "test")
    if split not in ("dev", "test"):
        raise ConfigError(f"--split must be dev or test, got {split!r}")
    model, tokenizer = _load(model_dir, task, run)
    out.mkdir(parents=True, exist_ok=True)
    if task.spec.head is HeadType.SPAN:
        if split != "dev":
            raise ConfigError("SQuAD test answers are not public: predict --split dev")
        return _predict_squad(task, model, tokenizer, run, out)
    return _predict_glue(task, model, tokenizer, run, out, split)


def _load(model_dir: str | Path, task: Any, run: Any) -> tuple[Any, Any]:
    import torch
    from transformers import AutoTokenizer

    from kdbench.engine import load_model

    model = load_model(str(model_dir), task.spec.head, task.spec, trust_remote_code=run.trust_remote_code,
                       role="model")
    model.to(torch.device("cuda" if torch.cuda.is_available() else "cpu")).eval()
    tokenizer = AutoTokenizer.from_pretrained(str(model_dir), trust_remote_code=run.trust_remote_code)
    return model, tokenizer


def logits_in_task_order(model: Any, task: Any, logits: Any) -> Any:
    """Columns of ``logits`` reordered from the model's ``id2label`` to the task's label order."""
    from kdbench.engine import teacher_label_order

    order = teacher_label_order(model, task.spec)
    return logits if order is None else logits[:, order]


def _predict_glue(task: Any, model: Any, tokenizer: Any, run: Any, out: Path, split: str) -> dict[str, Any]:
    from kdbench.engine import predict
    from kdbench.tasks.glue import write_glue_predictions

    splits = task.encode_test(tokenizer, run) if split == "test" else task.encode_eval(tokenizer, run)
    files: list[Path] = []
    metrics: dict[str, float] = {}
    for encoded in splits:
        logits = logits_in_task_order(model, task, predict(model, encoded, tokenizer, run.train.eval_batch_size)["logits"])
        if split == "test":
            files += write_glue_predictions(task, {encoded.name: (encoded.features["idx"], logits)}, out)
            continue
        values = task.predictions_from_logits(logits)
        _check_finite_scores(values, encoded.features["idx"], f"{task.spec.name} {encoded.name}")
        metrics.update(task.score(encoded, {"logits": logits}))
        path = out / f"{task.spec.name}-{encoded.name}.tsv"
        names = task.spec.label_names
        lines = ["index\tprediction"] + [
            f"{int(i)}\t{names[int(v)] if names else format(float(v), '.6g')}"
            for i, v in zip(encoded.features["idx"], values)]
        path.write_text("\n".join(lines) + "\n")
        files.append(path)
    return {"files": files, "metrics": metrics}


def _check_finite_scores(values: Any, indices: Any, where: str) -> None:
    """A DataError naming the first example whose predicted score is NaN or infinite (regression)."""
    import numpy as np

    array = np.asarray(values)
    if array.dtype.kind != "f":
        return
    bad = np.flatnonzero(~np.isfinite(array))
    if bad.size:
        raise DataError(f"{where}: the model predicted {array[bad[0]]} for index {int(indices[int(bad[0])])} "
                        f"({bad.size} non-finite scores); nothing written")


def _predict_squad(task: Any, model: Any, tokenizer: Any, run: Any, out: Path) -> dict[str, Any]:
    from kdbench.engine import predict

    (encoded,) = task.encode_eval(tokenizer, run)
    outputs = predict(model, encoded, tokenizer, run.train.eval_batch_size)
    predicted = task.predictions(encoded, outputs)
    metrics = task.score_answers(encoded.examples, predicted.answers,
                                 predicted.null_odds if task.squad.v2 else None)
    files = [out / "predictions.json", out / "nbest_predictions.json"]
    files[0].write_text(json.dumps(predicted.answers, indent=1))
    files[1].write_text(json.dumps({qid: [{"text": t, "score": s} for t, s in items]
                                    for qid, items in predicted.nbest.items()}, indent=1))
    if task.squad.v2:
        files.append(out / "null_odds.json")
        files[-1].write_text(json.dumps(predicted.null_odds, indent=1))
    return {"files": files, "metrics": metrics}
