"""``kdbench augment`` on real sizes: chunked output equals the one-shot augmentation, a killed run
resumes at its last finished chunk with the same output, and a cache hit needs no torch."""

from __future__ import annotations

import os
import stat
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
from transformers import AutoTokenizer, BertConfig, BertForMaskedLM

from kdbench.augment import AugmentConfig, Augmenter, load_glove
from kdbench.augment_cli import _tsv_line, augment_task_file

MAX_SAMPLES = 24


@pytest.fixture(scope="module")
def mlm_dir(tmp_path_factory, minilm_path) -> Path:
    tokenizer = AutoTokenizer.from_pretrained(minilm_path)
    torch.manual_seed(0)
    folder = tmp_path_factory.mktemp("mlm")
    BertForMaskedLM(BertConfig(vocab_size=len(tokenizer), hidden_size=32, num_hidden_layers=1, num_attention_heads=4,
                               intermediate_size=37, max_position_embeddings=128)).save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    return folder


@pytest.fixture(scope="module")
def glove(tmp_path_factory, shared_data) -> Path:
    """GloVe-format vectors for the words of the first SST-2 sentences (random, 8 values each)."""
    lines = (shared_data / "glue_data" / "SST-2" / "train.tsv").read_text().splitlines()[1:MAX_SAMPLES + 1]
    words = sorted({w for line in lines for w in line.split("\t")[0].split()})
    rng = np.random.default_rng(0)
    path = tmp_path_factory.mktemp("glove") / "glove.txt"
    path.write_text("".join(f"{w} {' '.join(f'{x:.4f}' for x in rng.standard_normal(8))}\n" for w in words))
    return path


def _augment(mlm_dir, glove, shared_data, out, cache, **extra) -> Path:
    return augment_task_file("sst2", mlm_model=str(mlm_dir), out=out, glove=str(glove), data_dir=str(shared_data),
                             max_samples=MAX_SAMPLES, n_aug=4, top_k=3, cache_dir=cache, **extra)


def test_chunked_output_equals_the_one_shot_augmentation(mlm_dir, glove, shared_data, tmp_path):
    from kdbench.config import build_run_config
    from kdbench.plugins import TASKS

    out = _augment(mlm_dir, glove, shared_data, tmp_path / "aug.tsv", tmp_path / "cache", chunk_size=5)
    run = build_run_config({"method": "finetune", "task": "sst2", "student": "x", "data_dir": str(shared_data)})
    rows = TASKS.get("sst2").load_rows("train", run)
    examples = [{"sentence": rows.texts[i][0], "label": rows.labels[i]} for i in range(MAX_SAMPLES)]
    augmenter = Augmenter(BertForMaskedLM.from_pretrained(mlm_dir).eval(), AutoTokenizer.from_pretrained(mlm_dir),
                          AugmentConfig(n_aug=4, top_k=3), glove=load_glove(glove))
    one_shot = augmenter.augment_examples(examples, ("sentence",))
    expected = "sentence\tlabel\n" + "".join(_tsv_line(("sentence",), row) for row in one_shot)
    assert out.read_text() == expected
    assert len(one_shot) > MAX_SAMPLES  # something was augmented


def test_a_killed_augmentation_resumes_at_its_last_chunk(mlm_dir, glove, shared_data, tmp_path, monkeypatch, capsys):
    reference = _augment(mlm_dir, glove, shared_data, tmp_path / "ref.tsv", tmp_path / "ref-cache", chunk_size=5)
    calls: list[int] = []
    original = Augmenter.expand

    def dies_at_the_third_chunk(self, examples, text_fields=("sentence",), offset=0):
        calls.append(offset)
        if len(calls) == 3:
            raise KeyboardInterrupt  # stands for a kill: nothing after the second chunk was recorded
        return original(self, examples, text_fields, offset)

    monkeypatch.setattr(Augmenter, "expand", dies_at_the_third_chunk)
    cache = tmp_path / "cache"
    with pytest.raises(KeyboardInterrupt):
        _augment(mlm_dir, glove, shared_data, tmp_path / "aug.tsv", cache, chunk_size=5)
    (partial,) = cache.glob("*.partial.tsv")
    with open(partial, "a") as handle:  # half a chunk written when the process died
        handle.write("a torn line without its label")
    calls.clear()
    monkeypatch.setattr(Augmenter, "expand", lambda self, ex, tf=("sentence",), offset=0: (
        calls.append(offset), original(self, ex, tf, offset))[1])
    out = _augment(mlm_dir, glove, shared_data, tmp_path / "aug.tsv", cache, chunk_size=5)
    assert calls == [10, 15, 20]  # chunks 0-4 and 5-9 were not augmented again
    assert "resuming augmentation at example 10 of 24" in capsys.readouterr().out
    assert out.read_text() == reference.read_text()
    assert not list(cache.glob("*.partial.tsv")) and not list(cache.glob("*.progress.json"))


def test_cache_hit_imports_no_torch_and_respects_the_umask(mlm_dir, glove, shared_data, tmp_path):
    first = _augment(mlm_dir, glove, shared_data, tmp_path / "a.tsv", tmp_path / "cache")
    code = (f"import os, sys; os.umask(0o002)\n"
            f"from kdbench.augment_cli import augment_task_file\n"
            f"augment_task_file('sst2', mlm_model={str(mlm_dir)!r}, out={str(tmp_path / 'b.tsv')!r}, "
            f"glove={str(glove)!r}, data_dir={str(shared_data)!r}, max_samples={MAX_SAMPLES}, n_aug=4, top_k=3, "
            f"cache_dir={str(tmp_path / 'cache')!r})\n"
            "print('torch imported' if 'torch' in sys.modules else 'no torch')")
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=False,
                            env={**os.environ, "KDBENCH_DATA_DIR": str(shared_data)})
    assert result.returncode == 0, result.stderr[-2000:]
    assert "augmentation cache hit" in result.stdout and result.stdout.strip().endswith("no torch")
    assert (tmp_path / "b.tsv").read_text() == first.read_text()
    assert stat.S_IMODE((tmp_path / "b.tsv").stat().st_mode) == 0o664
