"""Model measurement from a configuration alone: parameters, FLOPs, latency, throughput, speed-up.

Nothing here needs trained weights: counts are analytic (BERT family) or taken from a model built on
PyTorch's ``meta`` device (any architecture); timings use randomly initialised weights, which run
exactly as fast as trained ones.

Conventions (checked against the papers' numbers in ``tests/measure/test_measure.py``)
--------------------------------------------------------------------------------------
**Parameters.** ``ParamCount.total`` is every parameter of the bare encoder (``BertModel``):
embeddings (word + position + token type + LayerNorm), all Transformer layers and the pooler; no
task head. ``non_embedding`` leaves the embedding block out. BERT-base (12 x 768, FFN 3072, vocab
30522) gives 109.48M (papers: 109M). TinyBERT's own count (14.5M for 4 x 312) is the model object
it trains, which also holds ``fit_dense``, the projection W_h of the student's hidden states to the
teacher's width (312 -> 768: 240,384 parameters): ``ParamCount.with_projection`` = 14.59M (+0.6%).
Without the projection the bare 4L-312 encoder is 14.35M (-1.05%). The same rule (encoder + pooler
+ projection when the widths differ) reproduces TinyBERT v5 Table 1's 29.2M for 4L-512 (29.16M) and
67.0M for 6L-768 (66.96M); the 52.2M quoted for 4L-768 is the encoder without the pooler (52.19M).

**FLOPs.** One multiply-add counts as **2 FLOPs** (the convention of
``torch.utils.flop_counter.FlopCounterMode``). Counted: every matrix multiplication of the forward
pass -- the Q, K, V and output projections (4 d^2 per token), the two FFN matrices (2 d d_ff per
token), the two attention products Q K^T and A V (2 n d per token) and the pooler (d^2 per
example). Not counted: embedding look-ups, biases, LayerNorm, softmax, GELU, dropout (together
< 1%). Per example at sequence length n:

    FLOPs = 2 * ( L * (n * (4 d^2 + 2 d d_ff) + 2 n^2 d) + d^2 )

BERT-base at n = 128: 22.35 GFLOPs (papers: 22.5B, -0.7%); TinyBERT-4L-312: 1.25 GFLOPs (papers:
1.2B, +3.9%). Counting a multiply-add as one FLOP would give 11.2B and 0.62B -- the papers use 2.
``count_flops_torch`` runs the real model under ``FlopCounterMode`` on the meta device (eager
attention so the attention matmuls are visible); for BERT it agrees exactly with the formula.

**Latency / throughput.** ``measure_latency`` times ``model(**inputs)`` under
``torch.inference_mode`` in eval mode, after ``warmup`` untimed calls, over ``repeats`` timed calls
(CUDA synchronised), and reports the median. Latency is usually taken at batch 1, throughput at a
large batch (examples per second). ``speedup`` is teacher time / student time at the same batch and
sequence length on the current device.

Command line: ``kdbench measure bert-base tinybert-4l-312 --teacher bert-base [--latency]
[--check-torch]`` (also config.json files, model or run folders); ``python -m kdbench.measure``
prints the reference figures and the TinyBERT-4L-312 / BERT-base speed-up at batch 32 x 128.
"""

from __future__ import annotations

import json
import statistics
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any
from collections.abc import Mapping

if TYPE_CHECKING:  # torch is imported inside the functions: ``kdbench --help`` must not load it
    import torch

__all__ = [
    "BERT_BASE",
    "TINYBERT_4L_312",
    "ParamCount",
    "as_config",
    "attach_measurements",
    "bert_config",
    "count_flops_torch",
    "count_params",
    "count_params_meta",
    "flops_per_example",
    "measure",
    "measure_latency",
    "speedup",
]

#: transformers ``BertConfig`` defaults: 12 layers, hidden 768, FFN 3072, 12 heads, vocab 30522.
BERT_BASE: dict[str, Any] = dict(model_type="bert", num_hidden_layers=12, hidden_size=768,
                                 intermediate_size=3072, num_attention_heads=12, vocab_size=30522)
#: TinyBERT4 (Jiao et al.): 4 layers, hidden 312, FFN 1200, 12 heads, vocab 30522.
TINYBERT_4L_312: dict[str, Any] = dict(model_type="bert", num_hidden_layers=4, hidden_size=312,
                                       intermediate_size=1200, num_attention_heads=12, vocab_size=30522)


def bert_config(layers: int, hidden: int, intermediate: int, heads: int = 12, vocab: int = 30522, **kw: Any):
    """A ``transformers.BertConfig`` of the given shape."""
    from transformers import BertConfig

    return BertConfig(num_hidden_layers=layers, hidden_size=hidden, intermediate_size=intermediate,
                      num_attention_heads=heads, vocab_size=vocab, **kw)


def as_config(config: Any):
    """Accept a ``PretrainedConfig``, a dict (``model_type`` defaults to bert), a ``config.json``
    file or a model folder (read locally, never from the Hub)."""
    from transformers import AutoConfig, PretrainedConfig

    if isinstance(config, PretrainedConfig):
        return config
    if isinstance(config, Mapping):
        values = dict(config)
        model_type = values.pop("model_type", "bert")
        return AutoConfig.for_model(model_type, **values)
    path = Path(config)
    if path.is_dir() and (path / "model").is_dir() and not (path / "config.json").exists():
        path = path / "model"  # a kdbench run folder
    if path.is_file():
        return as_config(json.loads(path.read_text()))
    if path.is_dir():
        return AutoConfig.from_pretrained(str(path), local_files_only=True)
    raise ValueError(f"config: cannot read a model configuration from {config!r}")


def _dims(cfg) -> tuple[int, int, int, int, int, int]:
    """(layers, hidden, ffn, vocab, positions, token types) of a BERT-style config."""
    get = lambda *names, default=None: next((getattr(cfg, n) for n in names if getattr(cfg, n, None) is not None), default)
    return (int(get("num_hidden_layers", "n_layers")), int(get("hidden_size", "dim")),
            int(get("intermediate_size", "hidden_dim")), int(get("vocab_size")),
            int(get("max_position_embeddings", default=512)), int(get("type_vocab_size", default=0)))


@dataclass(frozen=True)
class ParamCount:
    total: int  # embeddings + encoder layers + pooler (bare BertModel)
    embeddings: int
    non_embedding: int  # total - embeddings
    pooler: int
    projection: int  # student -> teacher hidden projection (TinyBERT's W_h / fit_dense), 0 if none
    with_projection: int  # total + projection: the size TinyBERT reports

    def millions(self) -> dict[str, float]:
        return {k: v / 1e6 for k, v in asdict(self).items()}


def count_params(config: Any, *, teacher_hidden: int | None = None, pooler: bool = True) -> ParamCount:
    """Analytic parameter count of a BERT-style encoder (see the module docstring for what counts).

    ``teacher_hidden``: the teacher's width; when it differs from the student's, the W_h projection
    (hidden x teacher_hidden + bias) is counted in ``projection`` / ``with_projection``.
    Non-BERT model types are counted on the meta device (``count_params_meta``)."""
    cfg = as_config(config)
    if getattr(cfg, "model_type", "bert") != "bert":
        total, embeddings = _count_meta(cfg)
        return ParamCount(total, embeddings, total - embeddings, 0, 0, total)
    layers, d, ff, vocab, positions, types = _dims(cfg)
    embeddings = (vocab + positions + types) * d + 2 * d
    per_layer = 4 * (d * d + d) + 2 * d + (d * ff + ff) + (ff * d + d) + 2 * d
    pool = (d * d + d) if pooler else 0
    total = embeddings + layers * per_layer + pool
    projection = (d * teacher_hidden + teacher_hidden) if teacher_hidden and teacher_hidden != d else 0
    return ParamCount(total, embeddings, total - embeddings, pool, projection, total + projection)


def _meta_model(cfg, attn: str | None = "eager"):
    import torch
    from transformers import AutoModel

    cfg = as_config(cfg)
    if attn is not None:
        cfg._attn_implementation = attn
    with torch.device("meta"):
        return AutoModel.from_config(cfg)


def _count_meta(config: Any) -> tuple[int, int]:
    """(all parameters, parameters of the ``embeddings`` block) of the model built on the meta device."""
    model = _meta_model(config, attn=None)
    total = sum(p.numel() for p in model.parameters())
    embeddings = getattr(model, "embeddings", None)
    return total, (sum(p.numel() for p in embeddings.parameters()) if embeddings is not None else 0)


def count_params_meta(config: Any) -> int:
    """Parameters of ``AutoModel.from_config(config)`` built on the meta device (no memory, no
    weights); works for every architecture transformers knows (DistilBERT, MobileBERT, ...)."""
    return _count_meta(config)[0]


def flops_per_example(config: Any, seq_len: int = 128, *, pooler: bool = True) -> int:
    """Analytic forward FLOPs (2 per multiply-add) of one example of length ``seq_len``:
    ``2 * (L * (n * (4 d^2 + 2 d d_ff) + 2 n^2 d) + d^2)``. Non-BERT types use ``count_flops_torch``."""
    cfg = as_config(config)
    if getattr(cfg, "model_type", "bert") != "bert":
        return count_flops_torch(cfg, seq_len)
    layers, d, ff, *_ = _dims(cfg)
    n = seq_len
    macs = layers * (n * (4 * d * d + 2 * d * ff) + 2 * n * n * d) + (d * d if pooler else 0)
    return 2 * macs


def count_flops_torch(config: Any, seq_len: int = 128, batch_size: int = 1) -> int:
    """FLOPs per example counted by ``torch.utils.flop_counter.FlopCounterMode`` while the real
    ``AutoModel`` runs on the meta device with eager attention."""
    import torch
    from torch.utils.flop_counter import FlopCounterMode

    model = _meta_model(config).eval()
    ids = torch.zeros(batch_size, seq_len, dtype=torch.long, device="meta")
    counter = FlopCounterMode(display=False)
    with counter, torch.no_grad():  # no attention mask: building one reads values, impossible on meta
        model(input_ids=ids)
    return counter.get_total_flops() // batch_size


def _real_model(config: Any, device: str | torch.device | None):
    from transformers import AutoModel

    cfg = as_config(config)
    model = AutoModel.from_config(cfg).eval()
    return model.to(device) if device is not None else model


def measure_latency(config: Any, *, seq_len: int = 128, batch_size: int = 1, warmup: int = 2,
                    repeats: int = 5, device: str | torch.device | None = None,
                    threads: int | None = None, model: torch.nn.Module | None = None) -> dict[str, float]:
    """Time the forward pass of a randomly initialised model built from ``config``.

    Returns ``median_ms`` / ``mean_ms`` / ``std_ms`` per batch, ``per_example_ms`` and
    ``throughput`` (examples per second, from the median), plus the settings used."""
    import torch

    device = torch.device(device) if device is not None else torch.device("cpu")
    old_threads = torch.get_num_threads()
    if threads:
        torch.set_num_threads(threads)
    try:
        model = model if model is not None else _real_model(config, device)
        vocab = int(getattr(model.config, "vocab_size", 30522))
        gen = torch.Generator().manual_seed(0)
        inputs = {"input_ids": torch.randint(0, vocab, (batch_size, seq_len), generator=gen).to(device),
                  "attention_mask": torch.ones(batch_size, seq_len, dtype=torch.long, device=device)}
        sync = torch.cuda.synchronize if device.type == "cuda" else (lambda: None)
        times: list[float] = []
        with torch.inference_mode():
            for i in range(warmup + repeats):
                sync()
                start = time.perf_counter()
                model(**inputs)
                sync()
                if i >= warmup:
                    times.append((time.perf_counter() - start) * 1000.0)
    finally:
        torch.set_num_threads(old_threads)
    median = statistics.median(times)
    return {"median_ms": median, "mean_ms": statistics.fmean(times),
            "std_ms": statistics.stdev(times) if len(times) > 1 else 0.0,
            "per_example_ms": median / batch_size, "throughput": batch_size * 1000.0 / median,
            "batch_size": batch_size, "seq_len": seq_len, "repeats": repeats, "warmup": warmup,
            "device": str(device), "threads": threads or torch.get_num_threads()}


def speedup(student: Any, teacher: Any = BERT_BASE, *, seq_len: int = 128, batch_size: int = 32,
            warmup: int = 1, repeats: int = 3, device: str | torch.device | None = None,
            threads: int | None = None) -> dict[str, Any]:
    """Measured speed-up of ``student`` over ``teacher`` (teacher time / student time, medians) at
    ``batch_size`` x ``seq_len`` on the current device."""
    t = measure_latency(teacher, seq_len=seq_len, batch_size=batch_size, warmup=warmup, repeats=repeats,
                        device=device, threads=threads)
    s = measure_latency(student, seq_len=seq_len, batch_size=batch_size, warmup=warmup, repeats=repeats,
                        device=device, threads=threads)
    return {"speedup_x": t["median_ms"] / s["median_ms"], "teacher_ms": t["median_ms"],
            "student_ms": s["median_ms"], "teacher": t, "student": s}


def measure(config: Any, *, teacher: Any | None = None, seq_len: int = 128, time_it: bool = False,
            latency_batch: int = 1, throughput_batch: int = 32, repeats: int = 5, warmup: int = 2,
            device: str | torch.device | None = None) -> dict[str, float]:
    """One flat record for a model configuration: ``params_millions`` (with the W_h projection when
    a teacher of another width is given), ``params_non_embedding_millions``, ``flops_billions``
    (at ``seq_len``), and with ``time_it``: ``latency_ms`` (batch ``latency_batch``),
    ``throughput`` (examples/s at ``throughput_batch``) and, with a teacher, ``speedup_x``
    (throughput ratio at ``throughput_batch``)."""
    cfg = as_config(config)
    teacher_cfg = as_config(teacher) if teacher is not None else None
    teacher_hidden = getattr(teacher_cfg, "hidden_size", None) if teacher_cfg is not None else None
    pc = count_params(cfg, teacher_hidden=teacher_hidden)
    out: dict[str, float] = {
        "params_millions": pc.with_projection / 1e6,
        "params_backbone_millions": pc.total / 1e6,
        "params_non_embedding_millions": pc.non_embedding / 1e6,
        "flops_billions": flops_per_example(cfg, seq_len) / 1e9,
        "seq_len": seq_len,
    }
    if time_it:
        lat = measure_latency(cfg, seq_len=seq_len, batch_size=latency_batch, warmup=warmup, repeats=repeats, device=device)
        thr = measure_latency(cfg, seq_len=seq_len, batch_size=throughput_batch, warmup=warmup, repeats=repeats, device=device)
        out["latency_ms"] = lat["median_ms"]
        out["throughput"] = thr["throughput"]
        if teacher_cfg is not None:
            tthr = measure_latency(teacher_cfg, seq_len=seq_len, batch_size=throughput_batch, warmup=warmup,
                                   repeats=repeats, device=device)
            out["speedup_x"] = thr["throughput"] / tthr["throughput"]
    return out


def _run_model_config(row: Mapping[str, Any]) -> Any | None:
    run_dir = row.get("run_dir")
    if isinstance(run_dir, str) and run_dir:
        cfg = Path(run_dir) / "model" / "config.json"
        if cfg.is_file():
            return cfg
    return None


def attach_measurements(runs, *, seq_len: int = 128, teacher: Any | None = None, time_it: bool = False,
                        config_of=None, **measure_kw: Any):
    """Return a copy of a runs DataFrame with ``measure.<key>`` columns (the keys of ``measure``).

    Each run's architecture is read from ``<run_dir>/model/config.json`` (or ``config_of(row)``,
    which may return any config ``as_config`` accepts, or None). Identical configurations are
    measured once. Rows whose configuration cannot be read keep NaN."""
    import pandas as pd

    df = runs.copy()
    cache: dict[str, dict[str, float]] = {}
    results: list[dict[str, float]] = []
    for _, row in df.iterrows():
        src = config_of(row) if config_of is not None else _run_model_config(row)
        if src is None:
            results.append({})
            continue
        try:
            cfg = as_config(src)
        except (OSError, ValueError):
            results.append({})
            continue
        key = cfg.to_json_string(use_diff=False)
        if key not in cache:
            cache[key] = measure(cfg, teacher=teacher, seq_len=seq_len, time_it=time_it, **measure_kw)
        results.append(cache[key])
    meas = pd.DataFrame(results, index=df.index)
    for col in meas.columns:
        df[f"measure.{col}"] = meas[col]
    return df


def add_command(subparsers) -> None:
    parser = subparsers.add_parser("measure", help="parameters, FLOPs, latency/throughput and speed-up of "
                                                   "model configs (no weights needed)")
    parser.add_argument("models", nargs="+", help=f"{' | '.join(NAMED_CONFIGS)} | config.json | model or run folder")
    parser.add_argument("--teacher", help="teacher for the speed-up and the W_h projection (same forms)")
    parser.add_argument("--seq-len", type=int, default=128)
    parser.add_argument("--latency", action="store_true", help="also time the models on this machine")
    parser.add_argument("--batch-size", type=int, default=1, help="latency batch (default 1)")
    parser.add_argument("--large-batch", type=int, default=32, help="throughput / speed-up batch (default 32)")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--device", default=None, help="cpu (default), cuda, cuda:1, ...")
    parser.add_argument("--check-torch", action="store_true",
                        help="also count FLOPs with torch.utils.flop_counter and print both")
    parser.set_defaults(handler=cmd_measure)


#: Names ``kdbench measure`` accepts besides files and folders.
NAMED_CONFIGS: dict[str, dict[str, Any]] = {"bert-base": BERT_BASE, "tinybert-4l-312": TINYBERT_4L_312}


def _resolve(name: str) -> Any:
    if name.lower() in NAMED_CONFIGS:
        return NAMED_CONFIGS[name.lower()]
    if not Path(name).exists():
        from kdbench.config import ConfigError

        raise ConfigError(f"model {name!r}: not a known name ({', '.join(NAMED_CONFIGS)}) nor an existing "
                          "config.json / model folder")
    return name


def cmd_measure(args) -> int:
    teacher = _resolve(args.teacher) if args.teacher else None
    for name in args.models:
        result = measure(_resolve(name), teacher=teacher, seq_len=args.seq_len, time_it=args.latency,
                         latency_batch=args.batch_size, throughput_batch=args.large_batch, repeats=args.repeats,
                         warmup=1, device=args.device)
        if args.check_torch:
            result["flops_billions_torch"] = count_flops_torch(_resolve(name), args.seq_len) / 1e9
        print(json.dumps({"model": name, **{k: (round(v, 4) if isinstance(v, float) else v)
                                             for k, v in result.items()}}))
    return 0


def _main() -> None:  # python -m kdbench.measure  (prints the reference figures)
    import argparse


    p = argparse.ArgumentParser(description="Parameters, FLOPs and CPU speed-up of TinyBERT-4L-312 vs BERT-base")
    p.add_argument("--seq-len", type=int, default=128)
    p.add_argument("--batch-size", type=int, default=32)
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--no-timing", action="store_true")
    p.add_argument("--device", default=None, help="cpu (default) or cuda")
    p.add_argument("--threads", type=int, default=None, help="torch CPU threads (default: torch's choice)")
    a = p.parse_args()
    for name, cfg, th in (("BERT-base", BERT_BASE, None), ("TinyBERT-4L-312", TINYBERT_4L_312, 768)):
        pc = count_params(cfg, teacher_hidden=th)
        print(f"{name}: params {pc.total / 1e6:.2f}M (with W_h projection {pc.with_projection / 1e6:.2f}M, "
              f"non-embedding {pc.non_embedding / 1e6:.2f}M); FLOPs@{a.seq_len} "
              f"{flops_per_example(cfg, a.seq_len) / 1e9:.2f}G")
    if not a.no_timing:
        r = speedup(TINYBERT_4L_312, BERT_BASE, seq_len=a.seq_len, batch_size=a.batch_size, repeats=a.repeats,
                    device=a.device, threads=a.threads)
        print(f"speed-up at batch {a.batch_size} x {a.seq_len} on {r['student']['device']} "
              f"({r['student']['threads']} threads): {r['speedup_x']:.2f}x "
              f"(BERT-base {r['teacher_ms']:.0f} ms, TinyBERT {r['student_ms']:.0f} ms per batch; throughput "
              f"{r['teacher']['throughput']:.1f} vs {r['student']['throughput']:.1f} examples/s)")
        one = speedup(TINYBERT_4L_312, BERT_BASE, seq_len=a.seq_len, batch_size=1, repeats=max(a.repeats, 5),
                      device=a.device, threads=a.threads)
        print(f"latency at batch 1 x {a.seq_len}: BERT-base {one['teacher_ms']:.1f} ms, TinyBERT "
              f"{one['student_ms']:.1f} ms (speed-up {one['speedup_x']:.2f}x)")


if __name__ == "__main__":
    _main()
