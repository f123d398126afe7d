"""Content-addressed on-disk cache of teacher outputs.

A teacher's outputs on a training set depend only on (teacher weights, tokenized dataset, maximum
length, augmentation, precision). Their hash names a folder under ``$KDBENCH_CACHE_DIR/teacher-outputs``
(default ``~/.cache/kdbench/teacher-outputs``); every run, stage, method and sweep cell that distils the same
teacher on the same data reads the same folder, and any change of an input gives a new folder (an
old one is never reused by mistake, and never rewritten in place).

Inside a folder, each field is one ``.npy`` array whose first axis is the example index (the
``kd_index`` column the engine adds to the training set), so rows line up with shuffled,
length-grouped batches:

- small fields, always cached, float32: ``logits`` (N, C) and span ``start_logits``/``end_logits``
  (N, L);
- large fields, one file per teacher layer, only the layers a stage reads (its request's
  ``hidden_layers`` / ``attention_layers``), cached when they fit ``budget_mb``:
  ``hidden_states.<i>`` (N, L, d) — [CLS] vectors are their first token — and pre-softmax
  ``attention_scores.<i>`` (N, heads, L, L), stored in ``storage`` precision (float16 by default;
  bfloat16 is kept as its raw 16 bits; float32 on request). A later stage that reads other layers
  adds their files to the same folder.

``L`` is the longest tokenised example of the training set (at most ``max_length``): batches are
padded to their longest row, so no batch is ever longer. Fields with a sequence axis are computed
on batches padded to ``L`` and sliced to a batch's padded length on lookup. Padded keys carry
-10000 (scores) or zero probability, so the value at a real position does not depend on how far a
batch is padded; positions past an example's end hold what the teacher computes there (the same as
a live forward, up to float rounding and the storage precision).
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import logging
import os
import time
import types
from collections.abc import Callable, Iterable, Mapping
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from kdbench.cache_paths import CACHE_ENV, TEACHER_OUTPUTS, cache_dir  # noqa: F401 (CACHE_ENV: re-exported)
from kdbench.config import ConfigError
from kdbench.console import RUN_LOGGER
from kdbench.disk import free_disk_bytes

log = logging.getLogger(f"{RUN_LOGGER}.cache")  # a child of the run logger: its lines go to the run's train.log
EXAMPLE_INDEX = "kd_index"  # training-set column: the row's position in the cached arrays
LENGTH_COLUMN = "length"  # training-set column read by Trainer's group_by_length sampler
MANIFEST = "manifest.json"
LAST_USED = ".last_used"  # touched when a stage reads the folder (``kdbench cache prune`` evicts the least recent)
TOUCH_EVERY_SECONDS = 600.0  # how often a stage reading the folder refreshes LAST_USED
FORMAT_VERSION = 2

SMALL_FIELDS = ("logits", "start_logits", "end_logits")
LARGE_FIELDS = ("hidden_states", "attention_scores")  # stored one file per layer: "<field>.<layer>"
SEQUENCE_FIELDS = ("start_logits", "end_logits")  # small fields with a sequence axis (axis 1)
MODEL_INPUT_COLUMNS = ("input_ids", "attention_mask", "token_type_ids")
STORAGE_DTYPES = ("float16", "bfloat16", "float32")  # precision of the large fields on disk
_STORAGE_BYTES = {"float16": 2, "bfloat16": 2, "float32": 4}


def layer_field(kind: str, layer: int) -> str:
    """The cache field of one layer of a large feature, e.g. ``attention_scores.3``."""
    return f"{kind}.{layer}"


def split_field(name: str) -> tuple[str, int | None]:
    """``"hidden_states.2"`` -> ``("hidden_states", 2)``; a small field -> ``(name, None)``."""
    kind, _, layer = name.partition(".")
    return (kind, int(layer)) if layer else (name, None)


def large_fields(request: Any, num_layers: int) -> tuple[str, ...]:
    """The per-layer fields a teacher request reads (attention probabilities come from the scores)."""
    return (*(layer_field("hidden_states", i) for i in request.hidden_indices(num_layers)),
            *(layer_field("attention_scores", i) for i in request.attention_indices(num_layers)))


def default_cache_root() -> Path:
    return cache_dir(TEACHER_OUTPUTS)


DISK_HEADROOM_BYTES = 2**30  # free space a cache fill never takes: the run's checkpoints need room too


# ---------------------------------------------------------------------------------------------
# Fingerprints
# ---------------------------------------------------------------------------------------------
def teacher_fingerprint(model: Any) -> str:
    """SHA-256 of the model class and every parameter and buffer (name, dtype, shape, bytes).

    The folder a model was loaded from does not enter: the same weights copied elsewhere hit the
    same cache, and a fine-tuned copy at the same path misses it.
    """
    import torch

    digest = hashlib.sha256(type(model).__name__.encode())
    with torch.no_grad():
        for name, tensor in sorted(model.state_dict().items()):
            value = tensor.detach().cpu().contiguous()
            digest.update(f"{name}|{value.dtype}|{tuple(value.shape)}".encode())
            digest.update(value.view(torch.uint8).numpy().tobytes() if value.numel() else b"")
    return digest.hexdigest()


def dataset_fingerprint(dataset: Any, columns: Iterable[str] = MODEL_INPUT_COLUMNS) -> str:
    """SHA-256 of the token columns of a ``datasets.Dataset`` in row order (ids, masks, types)."""
    import pyarrow.compute as pc

    if getattr(dataset, "_indices", None) is not None:
        dataset = dataset.flatten_indices()
    table = dataset.data.table if hasattr(dataset.data, "table") else dataset.data
    digest = hashlib.sha256(f"rows={dataset.num_rows}".encode())
    for name in columns:
        if name not in dataset.column_names:
            continue
        column = table.column(name).combine_chunks()
        lengths = pc.list_value_length(column).to_numpy(zero_copy_only=False).astype(np.int64)
        values = pc.list_flatten(column).to_numpy(zero_copy_only=False).astype(np.int64)
        digest.update(name.encode())
        digest.update(lengths.tobytes())
        digest.update(values.tobytes())
    return digest.hexdigest()


@dataclass(frozen=True)
class CacheKey:
    """Everything a cached teacher output depends on."""

    teacher: str  # teacher_fingerprint
    dataset: str  # dataset_fingerprint of the tokenized training set
    max_length: int
    augmentation: str = "none"  # e.g. the augmentation recipe and its seed; "none" for original data
    precision: str = "fp32"  # the teacher's compute precision (bf16 outputs differ from fp32)
    storage: str = "float16"  # precision of hidden states and attention scores on disk

    def digest(self) -> str:
        canonical = json.dumps({"format": FORMAT_VERSION, **asdict(self)}, sort_keys=True)
        return hashlib.sha256(canonical.encode()).hexdigest()[:24]


# ---------------------------------------------------------------------------------------------
# Store
# ---------------------------------------------------------------------------------------------
def mark_used(folder: Path) -> None:
    """Touch ``folder``'s LAST_USED marker (a folder removed meanwhile is left alone)."""
    with contextlib.suppress(OSError):
        (Path(folder) / LAST_USED).touch()


@dataclass
class TeacherOutputCache:
    """One content-addressed folder of teacher outputs."""

    root: Path
    key: CacheKey

    @property
    def folder(self) -> Path:
        return Path(self.root) / self.key.digest()

    def manifest(self) -> dict[str, Any]:
        path = self.folder / MANIFEST
        if not path.is_file():
            return {"key": asdict(self.key), "fields": {}}
        return json.loads(path.read_text())

    def has(self, name: str) -> bool:
        entry = self.manifest()["fields"].get(name)
        return entry is not None and (self.folder / entry["file"]).is_file()

    def load(self, name: str, *, mmap: bool = False) -> np.ndarray:
        entry = self.manifest()["fields"].get(name)
        if entry is None:
            raise KeyError(f"teacher cache {self.folder} holds no field {name!r}")
        array = np.load(self.folder / entry["file"], mmap_mode="r" if mmap else None)
        if list(array.shape) != entry["shape"]:
            raise ValueError(f"teacher cache file {self.folder / entry['file']} has shape {list(array.shape)}, "
                             f"manifest says {entry['shape']} (truncated write?)")
        return array

    def mark_used(self) -> None:
        """Record that a stage reads this folder now (the time ``kdbench cache`` lists and prunes by)."""
        mark_used(self.folder)

    def allocate(self, name: str, shape: tuple[int, ...], dtype: Any) -> np.ndarray:
        """A zeroed array for field ``name``, memory-mapped to its temporary file in the folder: the
        teacher pass fills it in place, so a field of many GB never has to fit in memory (a Slurm
        job's memory limit, a laptop), and :meth:`write` renames the file into place."""
        self.folder.mkdir(parents=True, exist_ok=True)
        return np.lib.format.open_memmap(self._temporary(f"{name}.npy"), mode="w+", dtype=dtype, shape=shape)

    def discard(self, arrays: Iterable[np.ndarray]) -> None:
        """Remove the temporary files of arrays from :meth:`allocate` (a teacher pass that failed),
        and the folder if that leaves it empty."""
        for array in arrays:
            if isinstance(array, np.memmap) and array.filename:
                Path(array.filename).unlink(missing_ok=True)
        with contextlib.suppress(OSError):
            self.folder.rmdir()

    def write(self, arrays: Mapping[str, np.ndarray], seconds: float) -> None:
        """Add fields atomically: each array goes to a temporary file (already there for an array from
        :meth:`allocate`) renamed into place, then the manifest is rewritten the same way, so a reader
        sees a field complete or not at all."""
        self.folder.mkdir(parents=True, exist_ok=True)
        manifest = self.manifest()
        for name, array in arrays.items():
            file_name = f"{name}.npy"
            temporary = self._temporary(file_name)
            if isinstance(array, np.memmap) and os.fspath(array.filename) == os.path.abspath(temporary):
                array.flush()
            else:
                with temporary.open("wb") as handle:
                    np.save(handle, np.ascontiguousarray(array))
            os.replace(temporary, self.folder / file_name)
            dtype = self.key.storage if split_field(name)[1] is not None else str(array.dtype)
            manifest["fields"][name] = {"file": file_name, "shape": list(array.shape), "dtype": dtype,
                                        "bytes": int(array.nbytes), "seconds": round(seconds, 3)}
        temporary = self._temporary(MANIFEST)
        temporary.write_text(json.dumps(manifest, indent=1))
        os.replace(temporary, self.folder / MANIFEST)

    def _temporary(self, file_name: str) -> Path:
        return self.folder / f".{file_name}.{os.getpid()}.tmp"


# ---------------------------------------------------------------------------------------------
# Planning: which fields a stage needs, and whether they may be cached
# ---------------------------------------------------------------------------------------------
@dataclass
class CachePlan:
    """What one stage reads from the cache (``fields``), or why it runs the teacher (``reason``)."""

    stage: str
    source: str  # "cache" or "live"
    fields: tuple[str, ...] = ()
    reason: str = ""
    hit: bool = False  # every field was already on disk before this stage
    hit_rate: float = 0.0  # share of the stage's cached bytes that were on disk before it started
    precompute_seconds: float = 0.0
    bytes: int = 0
    bytes_per_example: float = 0.0
    storage: str = ""  # precision of the large fields on disk ("" when the stage reads none)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def output_fields(head: str) -> tuple[str, ...]:
    """The small output fields of a task head; empty when the outputs are not small (masked LM)."""
    if head in ("classification", "regression"):
        return ("logits",)
    if head == "span":
        return ("start_logits", "end_logits")
    return ()


def estimate_large_bytes(request: Any, num_rows: int, length: int, teacher_config: Any,
                         storage: str = "float16") -> dict[str, int]:
    """Bytes on disk of each per-layer field ``request`` reads, for ``num_rows`` examples of ``length`` tokens."""
    width = _STORAGE_BYTES[storage]
    layers = int(teacher_config.num_hidden_layers)
    per_field = {"hidden_states": length * int(teacher_config.hidden_size),
                 "attention_scores": int(teacher_config.num_attention_heads) * length * length}
    return {name: num_rows * per_field[split_field(name)[0]] * width for name in large_fields(request, layers)}


def plan_stage(stage_name: str, request: Any, head: str, *, enabled: bool, transforms_batch: bool,
               num_rows: int, max_length: int, teacher_config: Any, budget_mb: float,
               storage: str = "float16") -> CachePlan:
    if not enabled:
        return CachePlan(stage_name, "live", reason="teacher_cache=false")
    if transforms_batch:
        return CachePlan(stage_name, "live", reason="the stage changes its batches (prepare_batch) before the teacher sees them")
    fields = output_fields(head)
    if not fields:
        return CachePlan(stage_name, "live", reason=f"head {head!r} has no small output to cache")
    if request.any:
        sizes = estimate_large_bytes(request, num_rows, max_length, teacher_config, storage)
        total = sum(sizes.values())
        if total > budget_mb * 2**20:
            return CachePlan(stage_name, "live", reason=f"intermediate features need {total / 2**20:.1f} MB "
                                                        f"({total / max(1, num_rows) / 2**20:.3f} MB per example in "
                                                        f"{storage}) > teacher_cache_budget_mb={budget_mb:g}; "
                                                        "recomputed")
        return CachePlan(stage_name, "cache", fields=(*fields, *sizes), storage=storage)
    return CachePlan(stage_name, "cache", fields=fields)


# ---------------------------------------------------------------------------------------------
# Filling the cache: one teacher pass over the training set
# ---------------------------------------------------------------------------------------------
def compute_teacher_outputs(teacher: Any, dataset: Any, collate: Any, fields: tuple[str, ...], *, batch_size: int,
                            max_length: int, device: Any, autocast_dtype: Any = None, storage: str = "float16",
                            allocate: Callable[[str, tuple[int, ...], Any], np.ndarray] | None = None,
                            progress: str | None = None) -> dict[str, np.ndarray]:
    """Run ``teacher`` (eval, no grad) over ``dataset`` and return the requested fields by row.

    Rows are visited sorted by length so batches carry little padding; fields with a sequence axis
    are computed on batches padded to the longest row (at most ``max_length``). Per-layer fields
    come back in ``storage`` precision (bfloat16 as its raw bits, dtype uint16). ``allocate(name,
    shape, dtype)`` gives each field's zeroed array (default: in memory; the cache passes
    :meth:`TeacherOutputCache.allocate`, arrays on disk). ``progress``: a progress bar of that name.
    """
    import torch

    from kdbench.capture import FeatureCapture
    from kdbench.features import FeatureRequest

    hidden = tuple(layer for kind, layer in map(split_field, fields) if kind == "hidden_states")
    attention = tuple(layer for kind, layer in map(split_field, fields) if kind == "attention_scores")
    want_sequences = bool(hidden or attention) or any(name in SEQUENCE_FIELDS for name in fields)
    request = FeatureRequest(hidden_states=bool(hidden), attention_scores=bool(attention),
                             hidden_layers=hidden or None, attention_layers=attention or None)
    columns = [c for c in MODEL_INPUT_COLUMNS if c in dataset.column_names]
    rows = dataset.select_columns(columns).to_list()  # one conversion, not one per row
    lengths = np.asarray([len(row["input_ids"]) for row in rows])
    pad_length = min(max_length, int(lengths.max()))
    order = np.argsort(-lengths, kind="stable")
    out: dict[str, np.ndarray] = {}
    was_training = teacher.training
    teacher.eval()
    capture = FeatureCapture(teacher, request)
    bar = None
    if progress:
        from tqdm.auto import tqdm

        bar = tqdm(total=len(order), desc=progress, unit="row", dynamic_ncols=True, mininterval=1.0)
    try:
        with torch.inference_mode():
            for start in range(0, len(order), batch_size):
                chosen = order[start:start + batch_size]
                batch = collate([rows[i] for i in chosen])
                if want_sequences:
                    batch = _pad_to(batch, pad_length)
                batch = {k: v.to(device) for k, v in batch.items()}
                context = torch.autocast(device.type, dtype=autocast_dtype) if autocast_dtype else _null()
                with context:
                    result = teacher(**batch)
                features = capture.collect(result)
                for name in fields:
                    array = _to_storage(_field_value(features, name), storage if "." in name else "float32")
                    if name not in out:
                        shape = (len(order), *array.shape[1:])
                        out[name] = allocate(name, shape, array.dtype) if allocate else np.zeros(shape, array.dtype)
                    out[name][chosen] = array
                if bar is not None:
                    bar.update(len(chosen))
    finally:
        if bar is not None:
            bar.close()
        capture.remove()
        teacher.train(was_training)
    return out


def _field_value(features: Any, name: str) -> Any:
    kind, layer = split_field(name)
    if layer is not None:
        return getattr(features, kind)[layer]
    value = getattr(features, name)
    if value is None:
        raise ValueError(f"the teacher's outputs have no {name!r}")
    return value


def _to_storage(value: Any, storage: str) -> np.ndarray:
    """A tensor as a numpy array in ``storage`` precision; numpy has no bfloat16, so its 16 bits go as uint16."""
    import torch

    if storage == "bfloat16":
        return value.to(torch.bfloat16).cpu().view(torch.int16).numpy().view(np.uint16)
    return value.to(getattr(torch, storage)).cpu().numpy()


def _from_storage(array: np.ndarray, storage: str, device: Any) -> Any:
    """The inverse of :func:`_to_storage`, as a float32 tensor on ``device``."""
    import torch

    tensor = torch.from_numpy(array)
    if storage == "bfloat16":
        tensor = tensor.view(torch.bfloat16)
    return tensor.to(device).float()


def _pad_to(batch: dict[str, Any], length: int) -> dict[str, Any]:
    import torch

    padded = {}
    for key, value in batch.items():
        if value.dim() == 2 and value.shape[1] < length:
            value = torch.nn.functional.pad(value, (0, length - value.shape[1]), value=0)
        padded[key] = value
    return padded


class _null:
    def __enter__(self) -> None:
        return None

    def __exit__(self, *exc: object) -> None:
        return None


# ---------------------------------------------------------------------------------------------
# Reading: teacher features of a batch by example index
# ---------------------------------------------------------------------------------------------
READ_THREADS = 8  # concurrent row reads per lookup: a disk's queue, not the CPU, bounds them


class RowFile:
    """Rows of one large cached field (a ``.npy`` file), read by explicit positioned reads.

    A memory map would serve them too, but a cache bigger than memory is read at random rows, and
    each page fault makes the kernel read ahead around it (8 MB on some cloud disks) for rows the
    batch does not need: a 35 GB MRPC cache read ~10x the bytes it used and spent more time
    waiting on the disk than training. Here each row is one read of exactly its bytes, the kernel
    is told the access is random, and a batch's rows are read concurrently. Where the platform has
    no positioned reads (``os.preadv``), rows come from a memory map.
    """

    def __init__(self, mapped: np.memmap, executor: ThreadPoolExecutor) -> None:
        """``mapped``: the field as :meth:`TeacherOutputCache.load` maps it (its shape checked)."""
        self.path, self.shape, self.dtype = Path(mapped.filename), tuple(mapped.shape), mapped.dtype
        self._row_bytes = int(np.prod(self.shape[1:], dtype=np.int64)) * self.dtype.itemsize
        self._offset, self._executor = int(mapped.offset), executor
        if hasattr(os, "preadv"):
            self._mapped, self._fd = None, os.open(self.path, os.O_RDONLY)
            if hasattr(os, "posix_fadvise"):
                os.posix_fadvise(self._fd, 0, 0, os.POSIX_FADV_RANDOM)
        else:
            self._mapped, self._fd = mapped, None

    def take(self, rows: np.ndarray) -> np.ndarray:
        """The rows at ``rows`` (example indices), whole, in that order: ``(len(rows), *shape[1:])``."""
        if self._fd is None:
            if self._mapped is None:
                raise ValueError(f"teacher cache {self.path}: read after close()")
            return np.asarray(self._mapped[rows])
        out = np.empty((len(rows), *self.shape[1:]), dtype=self.dtype)
        if not len(rows):
            return out
        buffers = out.reshape(len(rows), -1).view(np.uint8)

        def read(position: int) -> None:
            row = int(rows[position])
            if not 0 <= row < self.shape[0]:
                raise IndexError(f"teacher cache {self.path}: row {row} of {self.shape[0]}")
            got = os.preadv(self._fd, [buffers[position]], self._offset + row * self._row_bytes)
            if got != self._row_bytes:
                raise OSError(f"teacher cache {self.path}: short read at row {row} ({got} of {self._row_bytes} "
                              "bytes; truncated file?)")

        list(self._executor.map(read, range(len(rows))))
        return out

    def close(self) -> None:
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None
        self._mapped = None


@dataclass
class CachedTeacher:
    """Teacher features looked up by example index instead of computed.

    Small fields live as tensors on the training device (lookups stay on the device: no host sync
    per step); large fields stay on disk and each batch reads its rows (:class:`RowFile`), keeping only
    the batch's padded length. Attention probabilities are derived from the cached scores only when
    ``probs_wanted`` (the stage's request asks for them).
    """

    tensors: dict[str, Any]
    mapped: dict[str, RowFile] = field(default_factory=dict)
    probs_wanted: bool = True
    num_layers: int = 0  # the teacher's: feature tuples keep its full indexing, None where not cached
    storage: str = "float16"
    folder: Path | None = None  # the cache folder read, marked as used every TOUCH_EVERY_SECONDS
    _touched: float = field(default_factory=time.monotonic)
    _executor: ThreadPoolExecutor | None = None  # the row reads' thread pool, shut down by close()

    @classmethod
    def open(cls, cache: TeacherOutputCache, fields: tuple[str, ...], device: Any, probs_wanted: bool = True,
             num_layers: int = 0) -> CachedTeacher:
        import torch

        tensors, mapped = {}, {}
        executor = ThreadPoolExecutor(READ_THREADS, thread_name_prefix="kdbench-cache")
        for name in fields:
            if split_field(name)[1] is not None:
                mapped[name] = RowFile(cache.load(name, mmap=True), executor)
            else:
                tensors[name] = torch.from_numpy(cache.load(name)).to(device)
        cache.mark_used()
        return cls(tensors, mapped, probs_wanted, num_layers, cache.key.storage, cache.folder, _executor=executor)

    def close(self) -> None:
        """Close the large fields' files and the read threads (whoever opened it does, when done with it)."""
        for table in self.mapped.values():
            table.close()
        if self._executor is not None:
            self._executor.shutdown(wait=True)
            self._executor = None

    def features(self, index: Any, attention_mask: Any) -> Any:
        import torch

        from kdbench.features import Features

        if self.folder is not None and time.monotonic() - self._touched > TOUCH_EVERY_SECONDS:
            mark_used(self.folder)  # a stage of many hours stays "in use" for kdbench cache prune
            self._touched = time.monotonic()
        length = attention_mask.shape[1]
        found: dict[str, Any] = {}
        for name, table in self.tensors.items():
            value = table.index_select(0, index.to(table.device))
            found[name] = value[:, :length] if name in SEQUENCE_FIELDS else value
        layers: dict[str, dict[int, Any]] = {"hidden_states": {}, "attention_scores": {}}
        if self.mapped:
            rows = index.cpu().numpy()
            for name, table in self.mapped.items():
                kind, layer = split_field(name)
                whole = table.take(rows)  # keep only the batch's length, not the length the cache was padded to
                value = whole[:, :length] if kind == "hidden_states" else whole[:, :, :length, :length]
                layers[kind][layer] = _from_storage(np.ascontiguousarray(value), self.storage, attention_mask.device)
        features = Features(logits=found.get("logits"), start_logits=found.get("start_logits"),
                            end_logits=found.get("end_logits"), attention_mask=attention_mask)
        if layers["hidden_states"]:
            features.hidden_states = tuple(layers["hidden_states"].get(i) for i in range(self.num_layers + 1))
        if layers["attention_scores"]:
            features.attention_scores = tuple(layers["attention_scores"].get(i) for i in range(self.num_layers))
            if self.probs_wanted:
                features.attention_probs = tuple(None if s is None else torch.softmax(s, dim=-1)
                                                 for s in features.attention_scores)
        return features


def prepare_cached_teacher(plan: CachePlan, cache: TeacherOutputCache, teacher: Any, dataset: Any, collate: Any, *,
                           batch_size: int, max_length: int, device: Any, autocast_dtype: Any = None,
                           probs_wanted: bool = True) -> CachedTeacher:
    """Fill the missing fields of ``plan`` (one teacher pass), then open them for lookup."""
    if plan.source != "cache":
        raise ConfigError(f"stage {plan.stage!r} does not read the teacher cache ({plan.reason})")
    cache.mark_used()  # before a teacher pass of many minutes: prune must not take the folder meanwhile
    missing = tuple(name for name in plan.fields if not cache.has(name))
    plan.hit = not missing
    if missing:
        _say(f"stage {plan.stage}: filling the teacher-output cache ({len(missing)} field(s) of {dataset.num_rows} rows, "
             f"one teacher pass) in {cache.folder}")
        started = time.perf_counter()
        allocated: list[np.ndarray] = []

        def allocate(name: str, shape: tuple[int, ...], dtype: Any) -> np.ndarray:
            allocated.append(cache.allocate(name, shape, dtype))
            return allocated[-1]

        try:
            arrays = compute_teacher_outputs(teacher, dataset, collate, missing, batch_size=batch_size,
                                             max_length=max_length, device=device, autocast_dtype=autocast_dtype,
                                             storage=cache.key.storage, allocate=allocate,
                                             progress=f"{plan.stage}: teacher outputs")
        except BaseException:
            cache.discard(allocated)
            raise
        plan.precompute_seconds = round(time.perf_counter() - started, 3)
        cache.write(arrays, plan.precompute_seconds)
        _say(f"stage {plan.stage}: teacher-output cache filled in {plan.precompute_seconds:.0f} s "
             f"({sum(array.nbytes for array in arrays.values()) / 2**20:.1f} MB)")
    manifest = cache.manifest()["fields"]
    sizes = {name: int(manifest[name]["bytes"]) for name in plan.fields}
    plan.bytes = sum(sizes.values())
    plan.hit_rate = round(sum(size for name, size in sizes.items() if name not in missing) / max(1, plan.bytes), 4)
    plan.bytes_per_example = round(plan.bytes / max(1, dataset.num_rows), 1)
    return CachedTeacher.open(cache, plan.fields, device, probs_wanted,
                              num_layers=int(teacher.config.num_hidden_layers))


def _say(message: str) -> None:
    """To the run's log and the console, as the engine reports a stage's start."""
    log.info(message)
    print(f"[kdbench] {message}", flush=True)


# ---------------------------------------------------------------------------------------------
# The engine's view: one session per run, one plan per stage
# ---------------------------------------------------------------------------------------------
def add_index_columns(dataset: Any) -> Any:
    """Add ``kd_index`` (row position: the row of the cached arrays) and ``length`` (token count, read
    by Trainer's ``group_by_length`` sampler instead of a pass over every row) to a training set."""
    import pyarrow.compute as pc

    if getattr(dataset, "_indices", None) is not None:
        dataset = dataset.flatten_indices()
    table = dataset.data.table if hasattr(dataset.data, "table") else dataset.data
    if EXAMPLE_INDEX not in dataset.column_names:
        dataset = dataset.add_column(EXAMPLE_INDEX, list(range(dataset.num_rows)))
    if LENGTH_COLUMN not in dataset.column_names:
        lengths = pc.list_value_length(table.column("input_ids")).to_pylist()
        dataset = dataset.add_column(LENGTH_COLUMN, lengths)
    return dataset


@dataclass
class TeacherCacheSession:
    """Decides, per stage, whether teacher features come from the cache, and fills it when needed.

    The teacher and dataset fingerprints are computed once per run, on the first stage that can use
    the cache; ``summary()`` is what the run record stores under ``teacher_cache``.
    """

    teacher: Any
    dataset: Any
    collate: Any
    device: Any
    head: str
    max_length: int
    batch_size: int
    precision: str  # resolved: fp32, bf16 or fp16
    enabled: bool = True
    budget_mb: float = 0.0
    storage: str = "float16"
    augmentation: str = "none"
    epochs: float = 1.0  # the run's epochs (a stage may override them)
    max_steps: int = -1
    examples_per_step: int = 0  # batch size x gradient accumulation; used with max_steps
    root: Path = field(default_factory=default_cache_root)
    plans: list[CachePlan] = field(default_factory=list)
    _cache: TeacherOutputCache | None = None

    @classmethod
    def from_run(cls, run: Any, teacher: Any, dataset: Any, collate: Any, device: Any, head: str,
                 precision: str) -> TeacherCacheSession:
        return cls(teacher=teacher, dataset=dataset, collate=collate, device=device, head=head,
                   max_length=run.train.max_seq_length, batch_size=run.train.eval_batch_size, precision=precision,
                   enabled=run.train.teacher_cache, budget_mb=run.train.teacher_cache_budget_mb,
                   storage=run.train.teacher_cache_dtype,
                   epochs=run.train.epochs, max_steps=run.train.max_steps,
                   examples_per_step=run.train.batch_size * run.train.grad_accum)

    def cache(self) -> TeacherOutputCache:
        if self._cache is None:
            key = CacheKey(teacher=teacher_fingerprint(self.teacher), dataset=dataset_fingerprint(self.dataset),
                           max_length=self.max_length, augmentation=self.augmentation, precision=self.precision,
                           storage=self.storage)
            self._cache = TeacherOutputCache(self.root, key)
        return self._cache

    def for_stage(self, stage: Any) -> CachedTeacher | None:
        """Cached features for ``stage``, or None when it must run the teacher."""
        import torch

        longest = self.longest()
        plan = plan_stage(stage.name, stage.teacher_features, self.head, enabled=self.enabled,
                          transforms_batch=stage.prepare_batch is not None, num_rows=self.dataset.num_rows,
                          max_length=longest, teacher_config=self.teacher.config, budget_mb=self.budget_mb,
                          storage=self.storage)
        self.plans.append(plan)
        missing = [name for name in plan.fields if not self.cache().has(name)] if plan.source == "cache" else []
        if missing and self.passes(stage) < 1:
            # Filling the cache costs one teacher pass over the whole set: more than a short stage needs.
            plan.source, plan.reason = "live", (f"stage reads {self.passes(stage):.2f} of the training set and "
                                                "the cache is empty: a full teacher pass would cost more")
        elif missing:
            sizes = estimate_large_bytes(stage.teacher_features, self.dataset.num_rows, longest, self.teacher.config,
                                         self.storage)
            needed, free = sum(sizes.get(name, 0) for name in missing), free_disk_bytes(self.root)
            if needed and needed > free - DISK_HEADROOM_BYTES:
                # A cache that fills its disk fails the run after the teacher pass; the teacher live only costs time.
                plan.source, plan.reason = "live", (
                    f"intermediate features need {needed / 2**20:.1f} MB and the cache's disk ({self.root}) has "
                    f"{free / 2**20:.1f} MB free, {DISK_HEADROOM_BYTES // 2**20} MB of which are left alone; "
                    "recomputed")
        if plan.source != "cache":
            if self.enabled:
                # A live teacher can cost a stage several times its cached time: say so when it starts.
                _say(f"stage {plan.stage}: the teacher runs live, not from the teacher-output cache: {plan.reason}")
            return None
        autocast = {"bf16": torch.bfloat16, "fp16": torch.float16}.get(self.precision)
        return prepare_cached_teacher(plan, self.cache(), self.teacher, self.dataset, self.collate,
                                      batch_size=self.batch_size, max_length=self.max_length, device=self.device,
                                      autocast_dtype=autocast, probs_wanted=stage.teacher_features.attention_probs)

    def longest(self) -> int:
        """The padded length of the cached sequence fields: the longest training row, at most max_length."""
        if LENGTH_COLUMN in self.dataset.column_names and self.dataset.num_rows:
            return min(self.max_length, int(np.max(self.dataset.with_format("numpy")[LENGTH_COLUMN])))
        return self.max_length

    def passes(self, stage: Any) -> float:
        """How many times the stage reads the training set."""
        if self.max_steps > 0:
            return self.max_steps * self.examples_per_step / max(1, self.dataset.num_rows)
        from kdbench.optimization import resolve_stage

        return float(resolve_stage(stage, types.SimpleNamespace(epochs=self.epochs)).epochs)

    def summary(self) -> dict[str, Any]:
        used = any(plan.source == "cache" for plan in self.plans)
        cached_bytes = sum(plan.bytes for plan in self.plans if plan.source == "cache")
        return {
            "enabled": self.enabled,
            "budget_mb": self.budget_mb,
            "storage": self.storage,
            # Over every stage that reads the cache: bytes per training example, and the share of them
            # that was already on disk when the stage started (1.0: no teacher pass was needed).
            "bytes_per_example": round(cached_bytes / max(1, self.dataset.num_rows), 1) if used else None,
            "hit_rate": round(sum(plan.bytes * plan.hit_rate for plan in self.plans if plan.source == "cache")
                              / max(1, cached_bytes), 4) if used else None,
            "folder": str(self._cache.folder) if used and self._cache else None,
            "key": asdict(self._cache.key) if used and self._cache else None,
            "stages": [plan.to_dict() for plan in self.plans],
        }
