"""``kdbench augment``: TinyBERT data augmentation of a GLUE task's training set, written as a file.

As in the official pipeline, augmentation is a separate step that writes a training file; a run then
uses it with ``train_file=FILE`` (the task and the method never know about augmentation):

    kdbench augment sst2 --mlm-model MLM_FOLDER --glove glove.txt --out sst2_aug.tsv [--max-samples N]
    kdbench run tinybert --task sst2 ... train_file=sst2_aug.tsv

The output is a TSV with a header naming the task's text columns (``sentence`` or ``sentence1`` /
``sentence2`` ...) and ``label`` (by name), which the GLUE adapter reads as a named-column file.
The augmented rows are cached on disk under ``--cache-dir`` keyed by every input (examples, MLM
weights, tokenizer, GloVe content, stopwords, p_t, N_a, K, seed); running the command again with the
same inputs reuses them without loading the MLM forward passes.
"""

from __future__ import annotations

import argparse
import os
import tempfile
from pathlib import Path
from typing import Any

DEFAULT_CACHE = Path(os.environ.get("KDBENCH_CACHE_DIR", "~/.cache/kdbench")).expanduser() / "augment"


def add_command(subparsers: Any) -> None:
    parser = subparsers.add_parser("augment", help="TinyBERT data augmentation of a GLUE training set (writes a TSV)")
    parser.add_argument("task", help="GLUE task name, e.g. sst2, rte")
    parser.add_argument("--mlm-model", required=True, help="folder or Hub id of a BERT masked LM (with its MLM head)")
    parser.add_argument("--tokenizer", default=None, help="tokenizer (default: the MLM model's)")
    parser.add_argument("--glove", default=None, help="GloVe text file for multi-piece words (word v1 v2 ... per line)")
    parser.add_argument("--out", required=True, help="the TSV to write")
    parser.add_argument("--data-dir", default=None, help="folder with glue_data/ (default: $KDBENCH_DATA_DIR, then the Hub)")
    parser.add_argument("--train-file", default=None, help="explicit training file instead of the data-dir layout")
    parser.add_argument("--max-samples", type=int, default=None, help="augment only the first N training examples")
    parser.add_argument("--p-t", type=float, default=0.4, help="replacement probability p_t (paper: 0.4)")
    parser.add_argument("--n-aug", type=int, default=None,
                        help="N_a, variants per sentence (default: the official script's per-task value, else 20)")
    parser.add_argument("--top-k", type=int, default=15, help="K candidates per word (paper: 15)")
    parser.add_argument("--seed", type=int, default=42)
    parser.add_argument("--batch-size", type=int, default=64, help="MLM rows per forward (does not change the output)")
    parser.add_argument("--cache-dir", default=str(DEFAULT_CACHE), help="where augmented sets are cached (by input key)")
    parser.add_argument("--allow-untrained-head", action="store_true",
                        help="accept an MLM checkpoint whose prediction head is missing (randomly initialised)")
    parser.set_defaults(handler=_cmd_augment)


def _cmd_augment(args: argparse.Namespace) -> int:
    out = augment_task_file(
        args.task, mlm_model=args.mlm_model, out=args.out, tokenizer=args.tokenizer, glove=args.glove,
        data_dir=args.data_dir, train_file=args.train_file, max_samples=args.max_samples, p_t=args.p_t,
        n_aug=args.n_aug, top_k=args.top_k, seed=args.seed, batch_size=args.batch_size, cache_dir=args.cache_dir,
        allow_untrained_head=args.allow_untrained_head)
    print(out)
    return 0


def augment_task_file(task_name: str, *, mlm_model: str, out: str | Path, tokenizer: str | None = None,
                      glove: str | None = None, data_dir: str | None = None, train_file: str | None = None,
                      max_samples: int | None = None, p_t: float = 0.4, n_aug: int | None = None, top_k: int = 15,
                      seed: int = 42, batch_size: int = 64, cache_dir: str | Path | None = DEFAULT_CACHE,
                      allow_untrained_head: bool = False) -> Path:
    """Augment the training set of GLUE task ``task_name`` and write it to ``out`` (TSV, named columns).

    Bad values raise :class:`kdbench.config.ConfigError` / :class:`kdbench.errors.DataError` before
    the MLM model is loaded. Returns the written path.
    """
    from kdbench.augment import OFFICIAL_N_AUG, AugmentConfig
    from kdbench.config import ConfigError, build_run_config
    from kdbench.plugins import TASKS

    task = TASKS.get(task_name)
    glue = getattr(task, "glue", None)
    if glue is None or not hasattr(task, "load_rows"):
        raise ConfigError(f"augment: task {task_name!r} is not a GLUE task (augmentation reads GLUE training sets)")
    if not 0.0 <= p_t <= 1.0:
        raise ConfigError(f"augment: --p-t must be in [0, 1], got {p_t!r}")
    if top_k < 1:
        raise ConfigError(f"augment: --top-k must be >= 1, got {top_k!r}")
    if n_aug is None:
        n_aug = OFFICIAL_N_AUG.get(glue.dir_name, 20)
    if n_aug < 1:
        raise ConfigError(f"augment: --n-aug must be >= 1, got {n_aug!r}")
    if max_samples is not None and max_samples < 1:
        raise ConfigError(f"augment: --max-samples must be >= 1, got {max_samples!r}")
    if glove is not None and not Path(glove).is_file():
        raise ConfigError(f"augment: GloVe file {glove!r} does not exist")
    out = Path(out)
    if out.suffix.lower() != ".tsv":
        raise ConfigError(f"augment: --out must end in .tsv, got {str(out)!r}")

    run = build_run_config({"method": "finetune", "task": task_name, "student": "unused",
                            "data": {"data_dir": data_dir, "train_file": train_file}})
    rows = task.load_rows("train", run)
    count = len(rows.texts) if max_samples is None else min(max_samples, len(rows.texts))
    fields = tuple(glue.text_fields)
    examples = [{**dict(zip(fields, rows.texts[i])), "label": rows.labels[i]} for i in range(count)]

    model, tok = _load_mlm(mlm_model, tokenizer, allow_untrained_head)
    config = AugmentConfig(p_t=p_t, n_aug=n_aug, top_k=top_k, seed=seed, batch_size=batch_size, glove_path=glove)
    from kdbench.augment import Augmenter

    augmented = Augmenter(model, tok, config).augment_examples(examples, fields, cache_dir=cache_dir)
    _write_tsv(out, fields, augmented)
    print(f"[kdbench] augmented {count} {task_name} examples into {len(augmented)} rows "
          f"(p_t={p_t}, N_a={n_aug}, K={top_k}, seed={seed})", flush=True)
    return out


def _load_mlm(name: str, tokenizer: str | None, allow_untrained_head: bool) -> tuple[Any, Any]:
    from transformers import AutoModelForMaskedLM, AutoTokenizer

    from kdbench.config import ConfigError

    try:
        model, info = AutoModelForMaskedLM.from_pretrained(name, output_loading_info=True)
        tok = AutoTokenizer.from_pretrained(tokenizer or name)
    except OSError as error:
        raise ConfigError(f"augment: MLM model {name!r} cannot be loaded: {str(error).splitlines()[0]}") from None
    missing = [k for k in info.get("missing_keys", []) if "predictions" in k or k.startswith("cls.")]
    if missing and not allow_untrained_head:
        raise ConfigError(f"augment: {name!r} has no masked-LM head ({len(missing)} head weights missing, e.g. "
                          f"{sorted(missing)[0]!r}); its candidates would be random. Give a BERT MLM checkpoint "
                          "or pass --allow-untrained-head")
    return model.eval(), tok


def _write_tsv(path: Path, fields: tuple[str, ...], rows: list[dict[str, Any]]) -> None:
    """Named-column TSV (GLUE adapters read it by header); tabs/newlines inside text become spaces."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=".tmp-", suffix=".tsv")
    with os.fdopen(fd, "w", encoding="utf-8") as handle:
        handle.write("\t".join((*fields, "label")) + "\n")
        for row in rows:
            cells = [" ".join(str(row[f]).split()) for f in fields] + [str(row["label"])]
            handle.write("\t".join(cells) + "\n")
    os.replace(tmp, path)
