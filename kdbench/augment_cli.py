"""``kdbench augment``: TinyBERT data augmentation of a GLUE task's training set, written as a file.

As in the official pipeline, augmentation is a separate step that writes a training file; a run then
uses it with ``train_file=FILE`` (the task and the method never know about augmentation):

    kdbench augment sst2 --mlm-model MLM_FOLDER --glove glove.txt --out sst2_aug.tsv [--max-samples N]
    kdbench run tinybert --task sst2 ... train_file=sst2_aug.tsv

The output is a TSV with a header naming the task's text columns (``sentence`` or ``sentence1`` /
``sentence2`` ...) and ``label`` (by name), which the GLUE adapter reads as a named-column file.
Real sizes: the training set is augmented in chunks of ``--chunk-size`` examples with a progress
bar, and each finished chunk is appended to a partial file in ``--cache-dir`` (with a small progress
record, both fsync'ed), so memory stays bounded by one chunk and a killed run resumes at its last
finished chunk. Every example is seeded by its index in the whole set, so the output does not depend
on chunking or on where a run was resumed. The finished set is cached under a key of every input
(examples, the MLM's and tokenizer's files, GloVe content, stopwords, p_t, N_a, K, seed), computed
from file digests: a repeated command finds it before importing torch or loading any model.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import shutil
import tempfile
from pathlib import Path
from typing import Any

from kdbench.cache_paths import AUGMENTED_SETS, cache_dir

DEFAULT_CACHE = cache_dir(AUGMENTED_SETS)


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
    parser.add_argument("--chunk-size", type=int, default=1000,
                        help="examples augmented and saved at a time (bounds memory; does not change the output)")
    parser.add_argument("--cache-dir", default=str(DEFAULT_CACHE), help="where augmented sets are cached (by input key)")
    parser.add_argument("--allow-untrained-head", action="store_true",
                        help="accept an MLM checkpoint whose prediction head is missing (randomly initialised)")
    parser.set_defaults(handler=_cmd_augment)


def _cmd_augment(args: argparse.Namespace) -> int:
    out = augment_task_file(
        args.task, mlm_model=args.mlm_model, out=args.out, tokenizer=args.tokenizer, glove=args.glove,
        data_dir=args.data_dir, train_file=args.train_file, max_samples=args.max_samples, p_t=args.p_t,
        n_aug=args.n_aug, top_k=args.top_k, seed=args.seed, batch_size=args.batch_size, cache_dir=args.cache_dir,
        allow_untrained_head=args.allow_untrained_head, chunk_size=args.chunk_size)
    print(out)
    return 0


CACHE_FORMAT = "tinybert-aug-tsv-v1"
MAX_GLOVE_WORDS = 100_000  # AugmentConfig.max_glove_words, kept here so a cache lookup needs no torch


def augment_task_file(task_name: str, *, mlm_model: str, out: str | Path, tokenizer: str | None = None,
                      glove: str | None = None, data_dir: str | None = None, train_file: str | None = None,
                      max_samples: int | None = None, p_t: float = 0.4, n_aug: int | None = None, top_k: int = 15,
                      seed: int = 42, batch_size: int = 64, cache_dir: str | Path | None = DEFAULT_CACHE,
                      allow_untrained_head: bool = False, chunk_size: int = 1000) -> Path:
    """Augment the training set of GLUE task ``task_name`` and write it to ``out`` (TSV, named columns).

    Bad values raise :class:`kdbench.config.ConfigError` / :class:`kdbench.errors.DataError` before
    the MLM model is loaded (the GloVe file is read and checked first). A finished set found in
    ``cache_dir`` is copied without importing torch; an unfinished one is resumed. Returns ``out``.
    """
    from kdbench.augment_defaults import OFFICIAL_N_AUG
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
    if batch_size < 1:
        raise ConfigError(f"augment: --batch-size must be >= 1, got {batch_size!r}")
    if chunk_size < 1:
        raise ConfigError(f"augment: --chunk-size must be >= 1, got {chunk_size!r}")
    if glove is not None and not Path(glove).is_file():
        raise ConfigError(f"augment: GloVe file {glove!r} does not exist")
    out = Path(out)
    if out.suffix.lower() != ".tsv":
        raise ConfigError(f"augment: --out must end in .tsv, got {str(out)!r}")
    if out.is_dir():
        raise ConfigError(f"augment: --out {str(out)!r} is a folder; give the .tsv file to write")

    run = build_run_config({"method": "finetune", "task": task_name, "student": "unused",
                            "data": {"data_dir": data_dir, "train_file": train_file}})
    rows = task.load_rows("train", run)
    count = len(rows.texts) if max_samples is None else min(max_samples, len(rows.texts))
    fields = tuple(glue.text_fields)
    examples = [{**dict(zip(fields, rows.texts[i])), "label": rows.labels[i]} for i in range(count)]

    settings = {"p_t": p_t, "n_aug": n_aug, "top_k": top_k, "seed": seed, "max_glove_words": MAX_GLOVE_WORDS}
    work = Path(cache_dir) if cache_dir is not None else out.parent / f".{out.name}.augment"
    entry = work / f"tinybert-aug-{_input_key(examples, fields, mlm_model, tokenizer, glove, settings)[:24]}"
    done = entry.with_suffix(".tsv")
    if done.is_file():  # the lookup needs file digests only: no torch, no model
        _copy_into_place(done, out)
        print(f"[kdbench] augmentation cache hit {done}", flush=True)
        return out

    from kdbench.augment import AugmentConfig, Augmenter, load_glove

    vectors = load_glove(glove, MAX_GLOVE_WORDS) if glove is not None else None  # checked before the model loads
    model, tok = _load_mlm(mlm_model, tokenizer, allow_untrained_head)
    config = AugmentConfig(p_t=p_t, n_aug=n_aug, top_k=top_k, seed=seed, batch_size=batch_size, glove_path=glove,
                           max_glove_words=MAX_GLOVE_WORDS)
    augmenter = Augmenter(model, tok, config, glove=vectors)
    written = _augment_in_chunks(augmenter, examples, fields, entry, chunk_size, task_name)
    _copy_into_place(done, out)
    if cache_dir is None:
        shutil.rmtree(work, ignore_errors=True)
    print(f"[kdbench] augmented {count} {task_name} examples into {written} rows "
          f"(p_t={p_t}, N_a={n_aug}, K={top_k}, seed={seed})", flush=True)
    return out


def _input_key(examples: list[dict[str, Any]], fields: tuple[str, ...], mlm_model: str, tokenizer: str | None,
               glove: str | None, settings: dict[str, Any]) -> str:
    """Everything the augmented set depends on, from file contents (no model is loaded)."""
    from kdbench.augment_defaults import STOPWORDS_PATH, glove_fingerprint
    from kdbench.fingerprint import file_digest

    payload = {
        "format": CACHE_FORMAT,
        "settings": settings,
        "fields": list(fields),
        "data": hashlib.sha256(json.dumps(examples, sort_keys=True, ensure_ascii=False, default=str).encode()).hexdigest(),
        "model": _model_files_fingerprint(mlm_model),
        "tokenizer": _model_files_fingerprint(tokenizer) if tokenizer else None,
        "glove": glove_fingerprint(glove, MAX_GLOVE_WORDS) if glove else None,
        "stopwords": file_digest(STOPWORDS_PATH).sha256,
    }
    return hashlib.sha256(json.dumps(payload, sort_keys=True).encode()).hexdigest()


def _model_files_fingerprint(name: str) -> Any:
    """A local folder's files by content; a Hub id by the files of its local snapshot (offline), else by name."""
    from kdbench.fingerprint import model_fingerprint

    if Path(name).expanduser().exists():
        return model_fingerprint(str(Path(name).expanduser().resolve()))
    try:
        from huggingface_hub import snapshot_download

        return model_fingerprint(snapshot_download(name, local_files_only=True))
    except Exception:
        return {"name": name}


def _augment_in_chunks(augmenter: Any, examples: list[dict[str, Any]], fields: tuple[str, ...], entry: Path,
                       chunk_size: int, task_name: str) -> int:
    """Augment ``examples`` chunk by chunk into ``entry``.partial.tsv, resuming after the last chunk
    recorded in ``entry``.progress.json; rename it to ``entry``.tsv when complete. Returns the row count."""
    from tqdm.auto import tqdm

    from kdbench.records import default_file_mode, write_json_atomic

    partial, progress_file, done = (entry.with_suffix(".partial.tsv"), entry.with_suffix(".progress.json"),
                                    entry.with_suffix(".tsv"))
    entry.parent.mkdir(parents=True, exist_ok=True)
    progress = {"examples": 0, "rows": 0, "bytes": 0}
    if partial.is_file() and progress_file.is_file():
        try:
            progress = json.loads(progress_file.read_text())
        except ValueError:  # torn progress record: start over
            progress = {"examples": 0, "rows": 0, "bytes": 0}
    if progress["examples"]:
        print(f"[kdbench] resuming augmentation at example {progress['examples']} of {len(examples)} "
              f"({progress['rows']} rows kept from {partial})", flush=True)
    flags = os.O_WRONLY | os.O_CREAT
    with os.fdopen(os.open(partial, flags, default_file_mode()), "w", encoding="utf-8") as handle:
        handle.truncate(progress["bytes"])  # drop a chunk that was being written when the run was killed
        handle.seek(progress["bytes"])
        if progress["bytes"] == 0:
            handle.write("\t".join((*fields, "label")) + "\n")
        bar = tqdm(total=len(examples), initial=progress["examples"], unit="ex", desc=f"augment {task_name}",
                   mininterval=2.0, dynamic_ncols=True)
        for start in range(progress["examples"], len(examples), chunk_size):
            chunk = examples[start:start + chunk_size]
            rows = augmenter.expand(chunk, fields, offset=start)
            handle.write("".join(_tsv_line(fields, row) for row in rows))
            handle.flush()
            os.fsync(handle.fileno())
            progress = {"examples": start + len(chunk), "rows": progress["rows"] + len(rows), "bytes": handle.tell()}
            write_json_atomic(progress_file, progress)
            bar.update(len(chunk))
            bar.set_postfix(rows=progress["rows"], refresh=False)
        bar.close()
    os.replace(partial, done)
    progress_file.unlink(missing_ok=True)
    return progress["rows"]


def _tsv_line(fields: tuple[str, ...], row: dict[str, Any]) -> str:
    """One named-column TSV line (GLUE adapters read it by header); tabs/newlines inside text become spaces."""
    cells = [" ".join(str(row[f]).split()) for f in fields] + [str(row["label"])]
    return "\t".join(cells) + "\n"


def _copy_into_place(source: Path, path: Path) -> None:
    """Copy ``source`` to ``path`` through a temporary file and a rename, with the umask's permissions."""
    from kdbench.records import default_file_mode

    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=".tmp-", suffix=".tsv")
    try:
        os.fchmod(fd, default_file_mode())
        with os.fdopen(fd, "wb") as handle, open(source, "rb") as reader:
            shutil.copyfileobj(reader, handle, 1 << 20)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


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
