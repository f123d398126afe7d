"""TinyBERT data augmentation (Jiao et al., 2020), batched.

Semantics follow the official ``TinyBERT/data_augmentation.py`` (huawei-noah/Pretrained-Language-Model):

* **Words.** A sentence is split into words by BERT's *basic* tokenisation (clean-up, lower-casing and
  accent stripping for an uncased vocabulary, split on whitespace and punctuation; the official
  ``tokenizer.basic_tokenizer.tokenize``). With a fast tokenizer the same is done by its backend
  normaliser + pre-tokeniser. Augmented sentences are these words joined by single spaces (as in the
  official script); the original sentence is kept verbatim as the first entry.
* **Candidates.** A word is a candidate position when it is alphabetic (``[a-z]+`` after lower-casing)
  and its lower-cased form is not a stopword (``kdbench/data/stopwords.txt``: the list hard-coded in the
  official script, i.e. NLTK's English list without the eight wh-words what/which/who/whom/when/where/
  why/how, plus ``'s`` and ``'re``).

  - A word that is ONE word-piece is replaced by ``[MASK]`` and fed to a BERT masked LM as
    ``[CLS] masked-sentence [SEP] original-sentence [SEP]`` (token types 0 for ``[CLS] A [SEP]``,
    1 for ``B [SEP]``; cut to 512 tokens, or the model's position limit if smaller; a mask beyond the
    limit gives no prediction). The top-K vocabulary entries at the mask (descending logit) are taken and
    THEN entries starting with ``##`` are dropped, so a position has at most K MLM candidates. Nothing
    else is filtered (special/unused tokens and the word itself may appear, as in the official code).
  - A word of SEVERAL word-pieces gets its K nearest GloVe neighbours by cosine similarity (the word
    itself excluded; only the first ``max_glove_words`` = 100k lines of the GloVe file; ``<unk>`` and
    earlier duplicates of a word never returned; title-cased words get title-cased neighbours). A word
    missing from GloVe has no neighbours.
  - A position whose candidate list ends up empty gets ``[word]`` (it stays unchanged), as in the
    official code.
* **Sampling.** ``n_aug`` times: every candidate position (ascending order) picks a uniformly random
  candidate and is replaced with probability ``p_t``; the variant is kept unless it duplicates an
  earlier one. Random numbers come from ``numpy.random.default_rng([seed, *key])`` where ``key`` is the
  sentence's index (``augment``) or ``(example index, field index)`` (``augment_examples``), so the
  output does not depend on batching or on the other sentences. Per sentence one array
  ``u = rng.random((n_aug, n_positions, 2))`` is drawn; ``u[t, j, 0]`` picks candidate
  ``floor(u * len(cands))`` of position j in round t, and ``u[t, j, 1] < p_t`` decides the replacement.
  Difference from the official script (which uses Python's global ``random``): duplicates are checked
  on the word sequence, so a round that replaced nothing never adds the re-tokenised original as a
  "new" sentence (the official string comparison against the raw sentence lets e.g. SST-2's trailing
  space produce such a copy).
* **Ties.** Top-K selection breaks exact ties by the lower index (vocabulary id / GloVe row); the
  official ``argsort`` leaves tie order unspecified.
* **Sentence pairs** (``augment_examples`` with two text fields): the official script writes every
  variant of the second sentence next to the LAST variant of the first (it mutates the row in place) —
  a bug not copied here. Output per example: the original example, then each variant of field 1 with
  the original field 2, then each variant of field 2 with the original field 1 (other fields, e.g. the
  label, carried unchanged; duplicate pairs dropped). This is the official ``n_aug`` per field, with
  every pair formed from a real sentence and an augmentation of its real partner.

Speed: the official script makes one MLM forward per candidate word. Here all one-piece candidate
positions of all (distinct) sentences become rows of padded MLM batches (``batch_size`` rows, rows
sorted by length), and for ``BertForMaskedLM`` the vocabulary head runs only on the masked position of
each row. Candidate sets equal those of the one-forward-per-word reference
(``benchmarks/augment_reference.py``) up to float rounding between batched and unbatched kernels (which
can only matter for logits tied to ~1e-6 at the K-th place).

Per-task ``n_aug`` used by the official script: :data:`OFFICIAL_N_AUG`.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import re
import tempfile
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any
from collections.abc import Iterable, Sequence

import numpy as np
import torch

from kdbench.augment_defaults import OFFICIAL_N_AUG, STOPWORDS_PATH, glove_fingerprint
from kdbench.records import default_file_mode

__all__ = [
    "OFFICIAL_N_AUG",
    "AugmentConfig",
    "Augmenter",
    "Glove",
    "augment_examples",
    "basic_tokenize",
    "is_valid_word",
    "load_glove",
    "load_stopwords",
    "model_fingerprint",
]

logger = logging.getLogger(__name__)

ALGORITHM_VERSION = "tinybert-da-v1"

_NON_ALPHA = re.compile("[^a-z]")


# --------------------------------------------------------------------------------------------------
# Configuration and small helpers
# --------------------------------------------------------------------------------------------------
@dataclass
class AugmentConfig:
    """Hyper-parameters (paper defaults: p_t = 0.4, N_a = 20, K = 15).

    ``batch_size`` (MLM rows per forward) does not change the output and is not part of the cache key.
    ``stopwords_path`` None means the packaged list (``kdbench/data/stopwords.txt``).
    """

    p_t: float = 0.4
    n_aug: int = 20
    top_k: int = 15
    seed: int = 42
    batch_size: int = 64
    glove_path: str | None = None
    max_glove_words: int = 100_000
    stopwords_path: str | None = None
    max_seq_len: int = 512


def load_stopwords(path: str | os.PathLike | None = None) -> frozenset[str]:
    """Stopwords, one per line (blank lines ignored), lower-cased."""
    text = Path(path or STOPWORDS_PATH).read_text(encoding="utf-8")
    return frozenset(w.strip().lower() for w in text.splitlines() if w.strip())


def is_valid_word(word: str) -> bool:
    """The official ``_is_valid``: only the letters a-z after lower-casing."""
    return not _NON_ALPHA.search(word.lower())


def basic_tokenize(tokenizer, text: str) -> list[str]:
    """BERT basic tokenisation of ``text`` (what the official script calls ``basic_tokenizer.tokenize``)."""
    basic = getattr(tokenizer, "basic_tokenizer", None)
    if basic is not None:
        return basic.tokenize(text)
    backend = getattr(tokenizer, "backend_tokenizer", None)
    if backend is None:
        raise TypeError(f"cannot basic-tokenise with {type(tokenizer).__name__}")
    if backend.normalizer is not None:
        text = backend.normalizer.normalize_str(text)
    if backend.pre_tokenizer is None:
        return text.split()
    return [w for w, _ in backend.pre_tokenizer.pre_tokenize_str(text)]


class _PieceTokenizer:
    """Word -> word-piece ids for already basic-tokenised words (cached)."""

    def __init__(self, tokenizer):
        self.tok = tokenizer
        self._cache: dict[str, list[int]] = {}
        backend = getattr(tokenizer, "backend_tokenizer", None)
        self._model = backend.model if backend is not None and getattr(tokenizer, "basic_tokenizer", None) is None else None

    def ids(self, word: str) -> list[int]:
        got = self._cache.get(word)
        if got is None:
            if self._model is not None:
                got = [t.id for t in self._model.tokenize(word)]
            else:  # slow tokenizer: its word-piece model on one basic token
                got = self.tok.convert_tokens_to_ids(self.tok.wordpiece_tokenizer.tokenize(word))
            self._cache[word] = got
        return got


# --------------------------------------------------------------------------------------------------
# GloVe
# --------------------------------------------------------------------------------------------------
class Glove:
    """Unit-normalised GloVe vectors with the official retrieval rules.

    ``rows`` (float64, one per line read) are unit vectors; rows that can never be returned
    (``<unk>``, zero vectors, earlier occurrences of a duplicated word) are NaN, like the official
    script's zero rows after normalisation. ``index`` maps a word to its (last) row.
    """

    def __init__(self, words: list[str], rows: np.ndarray, fingerprint: str = ""):
        self.words = words
        self.rows = rows
        self.index = {w: i for i, w in enumerate(words)}
        self.valid = ~np.isnan(rows).any(axis=1)
        self._filled = np.where(self.valid[:, None], rows, 0.0)
        self.fingerprint = fingerprint

    def neighbours(self, words: Sequence[str], k: int, chunk: int = 256) -> list[list[str]]:
        """Top-``k`` cosine neighbours of each word (the word itself excluded); [] when not in GloVe."""
        out: list[list[str]] = [[] for _ in words]
        known = [(i, self.index[w]) for i, w in enumerate(words) if w in self.index]
        for start in range(0, len(known), chunk):
            part = known[start : start + chunk]
            rows = np.array([r for _, r in part])
            sims = self._filled @ self._filled[rows].T  # (V, n)
            sims[~self.valid, :] = -np.inf
            for col, (i, r) in enumerate(part):
                s = sims[:, col]
                s[r] = -np.inf
                ids = _top_k_desc(s, k)
                cands = [self.words[j] for j in ids]
                if words[i].istitle():
                    cands = [c.title() for c in cands]
                out[i] = cands
        return out


def _top_k_desc(values: np.ndarray, k: int) -> np.ndarray:
    """Indices of the ``k`` largest values, descending, exact ties broken by the lower index."""
    n = values.shape[0]
    if k >= n:
        return np.argsort(-values, kind="stable")[:k]
    kth = np.partition(values, n - k)[n - k]  # k-th largest
    sel = np.flatnonzero(values >= kth)
    order = np.lexsort((sel, -values[sel]))
    return sel[order][:k]


def read_glove_vectors(path: str | os.PathLike, max_words: int = 100_000) -> tuple[list[str], dict[str, list[float]]]:
    """Words (in file order) and vectors of the first ``max_words`` non-blank lines of a GloVe text
    file, validated: a word2vec-style header line, a non-numeric value, a line whose dimension differs
    from the first line's, a file that is not UTF-8 or holds no vector are DataErrors naming the file
    and the line. Needs no torch, so ``kdbench augment`` checks the file before loading any model."""
    from kdbench.errors import DataError

    words: list[str] = []
    vecs: dict[str, list[float]] = {}
    dim: int | None = None
    with open(path, encoding="utf-8", errors="strict") as f:
        number = 0
        while len(words) < max_words:
            try:
                line = f.readline()
            except UnicodeDecodeError:
                raise DataError(f"GloVe file {str(path)!r}, line {number + 1}: not UTF-8 text") from None
            if not line:
                break
            number += 1
            items = line.strip().split()
            if not items:
                continue
            where = f"GloVe file {str(path)!r}, line {number}"
            if number == 1 and len(items) == 2 and all(x.isdigit() for x in items):
                raise DataError(f"{where}: {line.strip()!r} looks like a word2vec header (count, dimension); "
                                "GloVe text files have none: delete that line")
            if len(items) < 2:
                raise DataError(f"{where}: word {items[0]!r} has no vector")
            try:
                vector = [float(x) for x in items[1:]]
            except ValueError:
                bad = next(x for x in items[1:] if not _is_float(x))
                raise DataError(f"{where}: value {bad!r} of word {items[0]!r} is not a number "
                                "(a word with spaces, or not a GloVe text file?)") from None
            if dim is None:
                dim = len(vector)
            elif len(vector) != dim:
                raise DataError(f"{where}: word {items[0]!r} has {len(vector)} values, the first line {dim}")
            words.append(items[0])
            vecs[items[0]] = vector
    if not words:
        raise DataError(f"GloVe file {str(path)!r} holds no vectors")
    return words, vecs


def _is_float(text: str) -> bool:
    try:
        float(text)
    except ValueError:
        return False
    return True


def load_glove(path: str | os.PathLike, max_words: int = 100_000) -> Glove:
    """Read a GloVe text file (``word v1 v2 ...`` per line), only its first ``max_words`` lines."""
    words, vecs = read_glove_vectors(path, max_words)
    dim = len(vecs[words[0]])
    mat = np.zeros((len(words), dim), dtype=np.float64)
    last = {w: i for i, w in enumerate(words)}
    for w, v in vecs.items():
        if w == "<unk>":
            continue
        mat[last[w]] = v
    with np.errstate(invalid="ignore", divide="ignore"):
        norm = (mat.T / np.sqrt((mat**2).sum(1))).T
    return Glove(words, norm, fingerprint=glove_fingerprint(path, max_words))


# --------------------------------------------------------------------------------------------------
# MLM helpers
# --------------------------------------------------------------------------------------------------
def _model_device(model) -> torch.device:
    try:
        return next(model.parameters()).device
    except StopIteration:
        return torch.device("cpu")


def model_fingerprint(model) -> str:
    """sha256 over the model class, config and every state-dict tensor (names, dtypes, shapes, bytes)."""
    h = hashlib.sha256()
    h.update(type(model).__name__.encode())
    cfg = getattr(model, "config", None)
    if cfg is not None:
        h.update(cfg.to_json_string(use_diff=False).encode())
    for name, t in model.state_dict().items():
        t = t.detach().to("cpu").contiguous()
        h.update(f"{name}|{t.dtype}|{tuple(t.shape)}".encode())
        if t.dtype == torch.bfloat16:
            t = t.view(torch.int16)
        h.update(t.numpy().tobytes())
    return h.hexdigest()


def _tokenizer_fingerprint(tokenizer) -> str:
    h = hashlib.sha256()
    h.update(type(tokenizer).__name__.encode())
    h.update(json.dumps(sorted(tokenizer.get_vocab().items())).encode())
    backend = getattr(tokenizer, "backend_tokenizer", None)
    if backend is not None and backend.normalizer is not None:
        h.update(repr(backend.normalizer).encode())
    basic = getattr(tokenizer, "basic_tokenizer", None)
    if basic is not None:
        h.update(repr((basic.do_lower_case, getattr(basic, "strip_accents", None))).encode())
    return h.hexdigest()


def _top_k_rows(logits: torch.Tensor, k: int) -> list[list[int]]:
    """Per row: ids of the ``k`` largest logits, descending, exact ties broken by the lower id."""
    n, v = logits.shape
    k = min(k, v)
    if k == v:
        return torch.sort(logits, dim=-1, descending=True, stable=True).indices.tolist()
    vals, idx = torch.topk(logits, k + 1, dim=-1)
    vals_np, idx_np = vals.cpu().numpy(), idx.cpu().numpy()
    out: list[list[int]] = []
    for r in range(n):
        if vals_np[r, k - 1] == vals_np[r, k]:  # tie at the boundary: exact stable sort of the row
            out.append(torch.sort(logits[r], descending=True, stable=True).indices[:k].tolist())
        else:
            order = np.lexsort((idx_np[r, :k], -vals_np[r, :k]))
            out.append(idx_np[r, :k][order].tolist())
    return out


# --------------------------------------------------------------------------------------------------
# Augmenter
# --------------------------------------------------------------------------------------------------
Candidates = list[tuple[int, list[str]]]


class Augmenter:
    """Batched TinyBERT data augmentation (see the module docstring for the exact semantics).

    ``mlm_model``: a masked LM (``BertForMaskedLM``-like, called with ``input_ids``,
    ``attention_mask``, ``token_type_ids``); runs on its own device, in eval mode, without gradients.
    ``glove``: a :class:`Glove`, or None to load ``config.glove_path`` (None too: multi-piece words get
    no neighbours and stay unchanged — the official script always has GloVe).
    """

    def __init__(self, mlm_model, tokenizer, config: AugmentConfig | None = None, glove: Glove | None = None):
        self.model = mlm_model
        self.tokenizer = tokenizer
        self.config = config or AugmentConfig()
        if glove is None and self.config.glove_path:
            glove = load_glove(self.config.glove_path, self.config.max_glove_words)
        if glove is None:
            logger.warning("TinyBERT augmentation without GloVe: multi-piece words will not be replaced")
        self.glove = glove
        self.stopwords = load_stopwords(self.config.stopwords_path)
        self._pieces = _PieceTokenizer(tokenizer)
        self._model_fp: str | None = None

    # ---------------------------------------------------------------- candidates
    def words(self, sentence: str) -> list[str]:
        return basic_tokenize(self.tokenizer, sentence)

    def candidates(self, sentences: Sequence[str]) -> list[Candidates]:
        """For each sentence, ``[(word index, candidate words), ...]`` over its candidate positions."""
        unique: dict[str, int] = {}
        for s in sentences:
            unique.setdefault(s, len(unique))
        uniq = list(unique)
        plans = [self._plan(s) for s in uniq]

        # one-piece words -> MLM rows; several pieces -> GloVe
        rows: list[tuple[int, int, list[int], int, int]] = []  # (sent, slot, ids, mask_pos, n_seg_a)
        glove_words: dict[str, None] = {}
        for si, plan in enumerate(plans):
            for slot, (_, word, kind, payload) in enumerate(plan["positions"]):
                if kind == "mlm":
                    rows.append((si, slot, *payload))
                elif kind == "glove":
                    glove_words.setdefault(word, None)
        mlm_out = self._run_mlm(rows)
        neigh: dict[str, list[str]] = {}
        if self.glove is not None and glove_words:
            gw = list(glove_words)
            neigh = dict(zip(gw, self.glove.neighbours(gw, self.config.top_k)))

        results: list[Candidates] = []
        for si, plan in enumerate(plans):
            cands: Candidates = []
            for slot, (widx, word, kind, _) in enumerate(plan["positions"]):
                if kind == "mlm":
                    c = list(mlm_out.get((si, slot), []))
                elif kind == "glove":
                    c = list(neigh.get(word, []))
                else:
                    c = []
                if not c:
                    c = [word]
                cands.append((widx, c))
            results.append(cands)
        return [results[unique[s]] for s in sentences]

    def _plan(self, sentence: str) -> dict[str, Any]:
        words = self.words(sentence)
        piece_ids = [self._pieces.ids(w) for w in words]
        flat: list[int] = [i for p in piece_ids for i in p]
        positions = []
        offset = 1  # [CLS]
        max_len = self._max_len()
        tok = self.tokenizer
        for widx, (w, p) in enumerate(zip(words, piece_ids)):
            if is_valid_word(w) and w.lower() not in self.stopwords:
                if len(p) == 1:
                    mask_pos = offset
                    if mask_pos >= max_len:
                        positions.append((widx, w, "none", None))
                    else:
                        ids = [tok.cls_token_id] + flat + [tok.sep_token_id] + flat + [tok.sep_token_id]
                        ids[mask_pos] = tok.mask_token_id
                        n_a = len(flat) + 2  # [CLS] A [SEP]
                        if len(ids) > max_len:
                            ids = ids[:max_len]
                            n_a = min(n_a, max_len)
                        positions.append((widx, w, "mlm", (ids, mask_pos, n_a)))
                elif len(p) > 1:
                    positions.append((widx, w, "glove", None))
                else:
                    positions.append((widx, w, "none", None))
            offset += len(p)
        return {"words": words, "positions": positions}

    def _max_len(self) -> int:
        limit = getattr(getattr(self.model, "config", None), "max_position_embeddings", None)
        return min(self.config.max_seq_len, limit) if limit else self.config.max_seq_len

    @torch.no_grad()
    def _run_mlm(self, rows) -> dict[tuple[int, int], list[str]]:
        if not rows:
            return {}
        model = self.model
        model.eval()
        device = _model_device(model)
        pad_id = self.tokenizer.pad_token_id or 0
        order = sorted(range(len(rows)), key=lambda r: -len(rows[r][2]))
        gather_head = hasattr(model, "bert") and hasattr(model, "cls")
        out: dict[tuple[int, int], list[str]] = {}
        bs = max(1, int(self.config.batch_size))
        for start in range(0, len(order), bs):
            chunk = [rows[r] for r in order[start : start + bs]]
            width = max(len(r[2]) for r in chunk)
            n = len(chunk)
            ids = torch.full((n, width), pad_id, dtype=torch.long)
            att = torch.zeros((n, width), dtype=torch.long)
            typ = torch.zeros((n, width), dtype=torch.long)
            for b, (_, _, tid, _, n_a) in enumerate(chunk):
                ids[b, : len(tid)] = torch.tensor(tid)
                att[b, : len(tid)] = 1
                typ[b, n_a : len(tid)] = 1
            mask_pos = torch.tensor([r[3] for r in chunk])
            ids, att, typ, mask_pos = ids.to(device), att.to(device), typ.to(device), mask_pos.to(device)
            ar = torch.arange(n, device=device)
            if gather_head:
                hidden = model.bert(input_ids=ids, attention_mask=att, token_type_ids=typ).last_hidden_state
                logits = model.cls(hidden[ar, mask_pos])
            else:
                logits = model(input_ids=ids, attention_mask=att, token_type_ids=typ).logits[ar, mask_pos]
            top = _top_k_rows(logits.float(), self.config.top_k)
            for (si, slot, *_), tids in zip(chunk, top):
                toks = self.tokenizer.convert_ids_to_tokens(tids)
                out[(si, slot)] = [t for t in toks if not t.startswith("##")]
        return out

    # ---------------------------------------------------------------- sampling
    def sample(self, sentence: str, cands: Candidates, key: Iterable[int]) -> list[str]:
        """The original sentence followed by the distinct variants (see module docstring for the RNG)."""
        cfg = self.config
        words = self.words(sentence)
        out = [sentence]
        seen = {sentence, " ".join(words)}
        if not cands:
            return out
        rng = np.random.default_rng([int(cfg.seed), *[int(k) for k in key]])
        u = rng.random((int(cfg.n_aug), len(cands), 2))
        sizes = np.array([len(c) for _, c in cands])
        choice = np.minimum((u[..., 0] * sizes).astype(np.int64), sizes - 1)
        replace = u[..., 1] < cfg.p_t
        for t in range(int(cfg.n_aug)):
            new = list(words)
            for j in np.flatnonzero(replace[t]):
                widx, c = cands[j]
                new[widx] = c[choice[t, j]]
            s = " ".join(new)
            if s not in seen:
                seen.add(s)
                out.append(s)
        return out

    def augment(self, sentences: Sequence[str], keys: Sequence[Sequence[int]] | None = None) -> list[list[str]]:
        """For each sentence: ``[original, variant1, ...]``. ``keys[i]`` seeds sentence i (default ``(i,)``)."""
        cands = self.candidates(sentences)
        if keys is None:
            keys = [(i,) for i in range(len(sentences))]
        return [self.sample(s, c, k) for s, c, k in zip(sentences, cands, keys)]

    # ---------------------------------------------------------------- cache identity
    def cache_key(self, examples: Sequence[dict], text_fields: Sequence[str]) -> str:
        if self._model_fp is None:
            self._model_fp = model_fingerprint(self.model)
        cfg = asdict(self.config)
        cfg.pop("batch_size")
        cfg.pop("glove_path")  # identified by content below
        cfg.pop("stopwords_path")
        payload = {
            "algorithm": ALGORITHM_VERSION,
            "config": cfg,
            "text_fields": list(text_fields),
            "data": hashlib.sha256(json.dumps(list(examples), sort_keys=True, ensure_ascii=False, default=str).encode()).hexdigest(),
            "model": self._model_fp,
            "tokenizer": _tokenizer_fingerprint(self.tokenizer),
            "glove": self.glove.fingerprint if self.glove is not None else None,
            "stopwords": sorted(self.stopwords),
            "max_len": self._max_len(),
        }
        return hashlib.sha256(json.dumps(payload, sort_keys=True).encode()).hexdigest()

    # ---------------------------------------------------------------- examples (with cache)
    def augment_examples(
        self,
        examples: Sequence[dict],
        text_fields: Sequence[str] = ("sentence",),
        cache_dir: str | os.PathLike | None = None,
    ) -> list[dict]:
        """Augment a list of examples (dicts); see :func:`augment_examples`."""
        text_fields = tuple(text_fields)
        if not 1 <= len(text_fields) <= 2:
            raise ValueError("text_fields must name one field or a sentence pair")
        path = None
        if cache_dir is not None:
            key = self.cache_key(examples, text_fields)
            path = Path(cache_dir) / f"tinybert-aug-{key[:24]}.jsonl"
            if path.exists():
                logger.info("TinyBERT augmentation: cache hit %s", path)
                with open(path, encoding="utf-8") as f:
                    return [json.loads(line) for line in f if line.strip()]

        out = self.expand(examples, text_fields)
        if path is not None:
            path.parent.mkdir(parents=True, exist_ok=True)
            fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=".tmp-", suffix=".jsonl")
            os.fchmod(fd, default_file_mode())
            with os.fdopen(fd, "w", encoding="utf-8") as f:
                for r in out:
                    f.write(json.dumps(r, ensure_ascii=False) + "\n")
            os.replace(tmp, path)
        return out

    def expand(self, examples: Sequence[dict], text_fields: Sequence[str] = ("sentence",), offset: int = 0) -> list[dict]:
        """The augmented rows of ``examples``, which are examples ``offset``, ``offset + 1``, ... of the
        whole set: example ``offset + i`` is seeded by its index in the whole set, so augmenting a set
        in chunks gives exactly the rows of augmenting it at once (``aug_source`` is that index)."""
        text_fields = tuple(text_fields)
        sents, keys = [], []
        for i, ex in enumerate(examples):
            for f, name in enumerate(text_fields):
                sents.append(str(ex[name]))
                keys.append((offset + i, f))
        variants = self.augment(sents, keys)
        out: list[dict] = []
        k = 0
        for i, ex in enumerate(examples):
            per_field = variants[k : k + len(text_fields)]
            k += len(text_fields)
            seen: set[tuple[str, ...]] = set()
            orig = tuple(str(ex[n]) for n in text_fields)
            rows = [orig]
            for f in range(len(text_fields)):
                for v in per_field[f][1:]:
                    t = list(orig)
                    t[f] = v
                    rows.append(tuple(t))
            n_var = 0
            for r in rows:
                if r in seen:
                    continue
                seen.add(r)
                new = dict(ex)
                new.update(zip(text_fields, r))
                new["aug_source"] = offset + i
                new["aug_variant"] = n_var
                n_var += 1
                out.append(new)
        return out


def augment_examples(
    examples: Sequence[dict],
    mlm_model,
    tokenizer,
    config: AugmentConfig | None = None,
    text_fields: Sequence[str] = ("sentence",),
    cache_dir: str | os.PathLike | None = None,
    glove: Glove | None = None,
) -> list[dict]:
    """Augment ``examples`` (list of dicts, e.g. ``{"sentence": ..., "label": ...}``).

    Returns, per input example in order, the original example (``aug_variant`` 0) and then its
    variants, every dict a copy of the example with its text field(s) replaced and two keys added:
    ``aug_source`` (index of the input example) and ``aug_variant`` (0, 1, ...). Pairs: variants of
    field 1 with the original field 2, then variants of field 2 with the original field 1.
    With ``cache_dir`` the result is stored as JSONL under a key hashing the examples, text fields,
    model weights/config, tokenizer vocabulary, GloVe content (first ``max_glove_words`` lines),
    stopwords, p_t, n_aug, top_k, seed and max length; the same inputs load it without running the model.
    """
    return Augmenter(mlm_model, tokenizer, config, glove=glove).augment_examples(examples, text_fields, cache_dir)
