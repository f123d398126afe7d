"""TinyBERT data augmentation: batched implementation vs the one-forward-per-word reference,
determinism, sentence pairs, the on-disk cache, the stopword list and the ``kdbench augment`` file."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
from transformers import AutoTokenizer, BertConfig, BertForMaskedLM

from kdbench.augment import AugmentConfig, Augmenter, load_glove, load_stopwords

REPO = Path(__file__).resolve().parents[2]

SENTENCES = [
    "the movie is a wonderful and charming experience",
    "an unremarkable , overlong melodrama with flat performances",
    "Christopher Nolan directs this breathtaking spectacle",
    "it 's not a bad film , but not a good one either",
    "unbelievably dull",
]


def _reference_module():
    spec = importlib.util.spec_from_file_location("augment_reference", REPO / "benchmarks" / "augment_reference.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules["augment_reference"] = module
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="module")
def tokenizer(minilm_path):
    return AutoTokenizer.from_pretrained(minilm_path)


@pytest.fixture(scope="module")
def mlm(tokenizer):
    torch.manual_seed(0)
    config = BertConfig(vocab_size=len(tokenizer), hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
                        intermediate_size=37, max_position_embeddings=128)
    return BertForMaskedLM(config).eval()


@pytest.fixture(scope="module")
def glove_file(tmp_path_factory, tokenizer):
    """A small GloVe text file: every word of the test sentences plus some vocabulary words."""
    words = []
    for sentence in SENTENCES:
        for w in tokenizer.basic_tokenizer.tokenize(sentence) if hasattr(tokenizer, "basic_tokenizer") else sentence.lower().split():
            if w not in words:
                words.append(w)
    words += ["nolan", "spectacular", "marvellous", "tedious", "boring", "melodramatic", "<unk>"]
    rng = np.random.default_rng(0)
    path = tmp_path_factory.mktemp("glove") / "glove.txt"
    with open(path, "w", encoding="utf-8") as handle:
        for w in words:
            handle.write(w + " " + " ".join(f"{x:.4f}" for x in rng.standard_normal(10)) + "\n")
    return path


def test_batched_equals_one_forward_per_word_reference(mlm, tokenizer, glove_file):
    ref_module = _reference_module()
    config = AugmentConfig(n_aug=8, top_k=5, batch_size=3)
    glove = load_glove(glove_file)
    fast = Augmenter(mlm, tokenizer, config, glove=glove)
    ref = ref_module.ReferenceAugmenter(mlm, tokenizer, config, glove)
    fast_candidates = fast.candidates(SENTENCES)
    ref_candidates = [ref.candidates(s) for s in SENTENCES]
    assert fast_candidates == ref_candidates
    # both kinds of candidates occur: MLM (one piece) and GloVe (several pieces)
    pieces = [len(fast._pieces.ids(fast.words(s)[i])) for s, cands in zip(SENTENCES, fast_candidates) for i, _ in cands]
    assert min(pieces) == 1 and max(pieces) > 1
    assert fast.augment(SENTENCES) == [ref.augment(s, (i,)) for i, s in enumerate(SENTENCES)]


def test_candidates_follow_the_official_rules(mlm, tokenizer, glove_file):
    config = AugmentConfig(n_aug=4, top_k=5)
    aug = Augmenter(mlm, tokenizer, config, glove=load_glove(glove_file))
    (cands,) = aug.candidates(["the film , wonderful !"])
    words = aug.words("the film , wonderful !")
    positions = [i for i, _ in cands]
    assert [words[i] for i in positions] == ["film", "wonderful"]  # stopword and punctuation skipped
    for _, c in cands:
        assert 1 <= len(c) <= 5 and not any(w.startswith("##") for w in c)


def test_deterministic_for_a_seed_and_seed_sensitive(mlm, tokenizer, glove_file):
    glove = load_glove(glove_file)
    a = Augmenter(mlm, tokenizer, AugmentConfig(n_aug=6, top_k=5, seed=1), glove=glove).augment(SENTENCES)
    b = Augmenter(mlm, tokenizer, AugmentConfig(n_aug=6, top_k=5, seed=1, batch_size=1), glove=glove).augment(SENTENCES)
    c = Augmenter(mlm, tokenizer, AugmentConfig(n_aug=6, top_k=5, seed=2), glove=glove).augment(SENTENCES)
    assert a == b  # batch size never changes the output
    assert a != c
    for original, variants in zip(SENTENCES, a):
        assert variants[0] == original and len(set(variants)) == len(variants)


def test_sentence_pairs_pair_each_variant_with_the_real_partner(mlm, tokenizer, glove_file):
    aug = Augmenter(mlm, tokenizer, AugmentConfig(n_aug=5, top_k=5, p_t=0.6), glove=load_glove(glove_file))
    examples = [{"sentence1": SENTENCES[0], "sentence2": SENTENCES[1], "label": "entailment"}]
    rows = aug.augment_examples(examples, ("sentence1", "sentence2"))
    assert rows[0]["sentence1"] == SENTENCES[0] and rows[0]["sentence2"] == SENTENCES[1]
    changed_first = [r for r in rows[1:] if r["sentence1"] != SENTENCES[0]]
    changed_second = [r for r in rows[1:] if r["sentence2"] != SENTENCES[1]]
    assert changed_first and changed_second
    for r in rows[1:]:  # exactly one side is a variant, the other is the original (official bug not copied)
        assert (r["sentence1"] == SENTENCES[0]) != (r["sentence2"] == SENTENCES[1])
        assert r["label"] == "entailment"


def test_cache_is_reused_and_keyed_by_inputs(mlm, tokenizer, glove_file, tmp_path, monkeypatch):
    glove = load_glove(glove_file)
    examples = [{"sentence": s, "label": "positive"} for s in SENTENCES[:3]]
    first = Augmenter(mlm, tokenizer, AugmentConfig(n_aug=4, top_k=5), glove=glove).augment_examples(
        examples, cache_dir=tmp_path)
    assert len(list(tmp_path.glob("tinybert-aug-*.jsonl"))) == 1

    def no_model(self, rows):
        raise AssertionError("the cached set should have been reused")

    monkeypatch.setattr(Augmenter, "_run_mlm", no_model)
    again = Augmenter(mlm, tokenizer, AugmentConfig(n_aug=4, top_k=5, batch_size=2), glove=glove).augment_examples(
        examples, cache_dir=tmp_path)
    assert again == first
    with pytest.raises(AssertionError, match="reused"):  # another p_t is another key: recomputed
        Augmenter(mlm, tokenizer, AugmentConfig(n_aug=4, top_k=5, p_t=0.5), glove=glove).augment_examples(
            examples, cache_dir=tmp_path)


def test_packaged_stopwords_are_the_official_list():
    words = load_stopwords()
    assert {"the", "a", "is", "not", "'s", "'re"} <= words
    assert not {"what", "which", "who", "whom", "when", "where", "why", "how"} & words
    assert 170 <= len(words) <= 190


def test_augment_command_writes_a_train_file_the_glue_task_reads(mlm, tokenizer, glove_file, tmp_path, shared_data):
    from kdbench.augment_cli import augment_task_file
    from kdbench.config import build_run_config
    from kdbench.plugins import TASKS

    model_dir = tmp_path / "mlm"
    mlm.save_pretrained(model_dir)
    tokenizer.save_pretrained(model_dir)
    out = augment_task_file("rte", mlm_model=str(model_dir), out=tmp_path / "rte_aug.tsv", glove=str(glove_file),
                            data_dir=str(shared_data), max_samples=2, n_aug=2, top_k=3, cache_dir=tmp_path / "cache")
    header = out.read_text().splitlines()[0]
    assert header == "sentence1\tsentence2\tlabel"
    run = build_run_config({"method": "finetune", "task": "rte", "student": "x", "train_file": str(out)})
    rows = TASKS.get("rte").load_rows("train", run)
    assert 2 < len(rows.texts) <= 2 * (1 + 2 + 2)
    assert set(rows.labels) <= {"entailment", "not_entailment"}


def test_augment_command_rejects_bad_values_and_headless_checkpoints(tmp_path, minilm_path):
    from kdbench.augment_cli import augment_task_file
    from kdbench.config import ConfigError

    with pytest.raises(ConfigError, match="p-t"):
        augment_task_file("sst2", mlm_model="x", out=tmp_path / "a.tsv", p_t=1.5)
    with pytest.raises(ConfigError, match="not a GLUE task"):
        augment_task_file("corpus", mlm_model="x", out=tmp_path / "a.tsv")
    with pytest.raises(ConfigError, match=".tsv"):
        augment_task_file("sst2", mlm_model="x", out=tmp_path / "a.csv")
    from kdbench.augment_cli import _load_mlm

    with pytest.raises(ConfigError, match="no masked-LM head"):
        _load_mlm(str(minilm_path), None, allow_untrained_head=False)
