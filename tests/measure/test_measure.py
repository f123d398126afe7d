"""Model measurement from configs: the papers' size and FLOPs figures, analytic == torch's counter,
hand-computed counts on a tiny config, timing plumbing."""

from __future__ import annotations

import json

import pytest
from transformers import BertConfig, BertModel, DistilBertConfig, DistilBertModel

from kdbench import measure
from kdbench.measure import BERT_BASE, TINYBERT_4L_312, count_flops_torch, count_params, flops_per_example

TINY = dict(model_type="bert", vocab_size=100, hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
            intermediate_size=37, max_position_embeddings=64, type_vocab_size=2)


def test_papers_parameter_counts_within_one_percent():
    bert = count_params(BERT_BASE)
    assert bert.total / 1e6 == pytest.approx(109.0, rel=0.01)  # TinyBERT/MobileBERT/PKD: 109M
    tiny = count_params(TINYBERT_4L_312, teacher_hidden=768)
    assert tiny.with_projection / 1e6 == pytest.approx(14.5, rel=0.01)  # TinyBERT: 14.5M (incl. W_h)
    assert tiny.projection == 312 * 768 + 768
    # PKD Table 4 splits BERT12 into 23.8M embeddings + 85.1M Transformer (+ pooler)
    assert bert.embeddings / 1e6 == pytest.approx(23.8, abs=0.05)
    assert bert.non_embedding / 1e6 == pytest.approx(85.6, abs=0.05)
    # TinyBERT v5 Table 1: BERT_SMALL 4L-512 29.2M, TinyBERT6 67.0M (same rule: encoder + pooler + W_h)
    small = count_params(dict(TINYBERT_4L_312, hidden_size=512, intermediate_size=2048, num_attention_heads=8),
                         teacher_hidden=768)
    assert small.with_projection / 1e6 == pytest.approx(29.2, rel=0.01)
    six = count_params(dict(BERT_BASE, num_hidden_layers=6))
    assert six.total / 1e6 == pytest.approx(67.0, rel=0.01)


def test_papers_flops_within_five_percent_and_torch_agrees():
    assert flops_per_example(BERT_BASE, 128) / 1e9 == pytest.approx(22.5, rel=0.05)
    assert flops_per_example(TINYBERT_4L_312, 128) / 1e9 == pytest.approx(1.2, rel=0.05)
    assert count_flops_torch(BERT_BASE, 128) == flops_per_example(BERT_BASE, 128)
    assert count_flops_torch(TINYBERT_4L_312, 128) == flops_per_example(TINYBERT_4L_312, 128)


def test_tiny_config_hand_counts():
    # embeddings (100 + 64 + 2) * 32 + LN 64; per layer QKVO 4*(32*32+32), 2 LNs 128, FFN 32*37+37 + 37*32+32
    emb = 166 * 32 + 64
    layer = 4 * (1024 + 32) + 128 + (32 * 37 + 37) + (37 * 32 + 32)
    pooler = 32 * 32 + 32
    pc = count_params(TINY)
    assert (pc.embeddings, pc.total, pc.pooler) == (emb, emb + 2 * layer + pooler, pooler)
    real = BertModel(BertConfig(**{k: v for k, v in TINY.items() if k != "model_type"}))
    assert pc.total == sum(p.numel() for p in real.parameters())
    # FLOPs at n = 8: 2 * (L * (n * (4 d^2 + 2 d ff) + 2 n^2 d) + d^2)
    n, d, ff = 8, 32, 37
    assert flops_per_example(TINY, n) == 2 * (2 * (n * (4 * d * d + 2 * d * ff) + 2 * n * n * d) + d * d)
    assert count_flops_torch(TINY, n, batch_size=3) == flops_per_example(TINY, n)


def test_non_bert_counts_on_meta_device():
    cfg = DistilBertConfig(vocab_size=100, dim=32, hidden_dim=37, n_layers=2, n_heads=4, max_position_embeddings=64)
    pc = count_params(cfg)
    real = DistilBertModel(cfg)
    assert pc.total == sum(p.numel() for p in real.parameters())
    assert pc.embeddings == sum(p.numel() for p in real.embeddings.parameters()) > 0
    assert pc.non_embedding == pc.total - pc.embeddings


def test_latency_and_speedup_plumbing():
    small = dict(TINY, num_hidden_layers=1)
    lat = measure.measure_latency(small, seq_len=16, batch_size=4, warmup=1, repeats=3, threads=1)
    assert lat["median_ms"] > 0 and lat["throughput"] == pytest.approx(4 * 1000.0 / lat["median_ms"])
    assert lat["per_example_ms"] == pytest.approx(lat["median_ms"] / 4) and lat["threads"] == 1
    sp = measure.speedup(small, TINY, seq_len=16, batch_size=2, repeats=2, threads=1)
    assert sp["speedup_x"] == pytest.approx(sp["teacher_ms"] / sp["student_ms"])
    rec = measure.measure(small, teacher=TINY, seq_len=16, time_it=True, throughput_batch=2, repeats=2, warmup=1)
    assert {"latency_ms", "throughput", "speedup_x", "params_millions", "flops_billions"} <= set(rec)


def test_attach_measurements_reads_run_folders(tmp_path):
    import pandas as pd

    run = tmp_path / "run"
    (run / "model").mkdir(parents=True)
    BertConfig(**{k: v for k, v in TINY.items() if k != "model_type"}).to_json_file(run / "model" / "config.json")
    frame = pd.DataFrame([{"run_dir": str(run)}, {"run_dir": str(tmp_path / "missing")}])
    out = measure.attach_measurements(frame, seq_len=8)
    assert out.loc[0, "measure.params_millions"] == pytest.approx(count_params(TINY).total / 1e6)
    assert pd.isna(out.loc[1, "measure.params_millions"])


def test_cli_measure(capsys):
    from kdbench.cli import main

    assert main(["measure", "bert-base", "tinybert-4l-312", "--teacher", "bert-base"]) == 0
    lines = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    assert lines[0]["params_millions"] == pytest.approx(109.48, abs=0.01)
    assert lines[1]["params_millions"] == pytest.approx(14.59, abs=0.01)
    assert main(["measure", "no-such-model"]) == 2
    assert "'no-such-model'" in capsys.readouterr().err
