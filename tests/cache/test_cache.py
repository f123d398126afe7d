"""Teacher-output cache: keys change with every input, cached features equal live ones by index."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import datasets
import numpy as np
import pytest
import torch
from transformers import BertConfig, BertForSequenceClassification, DataCollatorWithPadding

from kdbench import cache as C
from kdbench.capture import FeatureCapture
from kdbench.features import HIDDEN, NO_FEATURES, FeatureRequest
from kdbench.method import Stage


def _tiny_teacher(seed: int = 0) -> BertForSequenceClassification:
    torch.manual_seed(seed)
    config = BertConfig(vocab_size=50, hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
                        intermediate_size=37, max_position_embeddings=64, num_labels=3)
    return BertForSequenceClassification(config).eval()


class _Tokenizer:
    """Just enough of a tokenizer for DataCollatorWithPadding (pad id 0, right padding)."""

    pad_token_id = 0
    padding_side = "right"
    model_input_names = ["input_ids", "token_type_ids", "attention_mask"]

    def pad(self, features, padding=True, max_length=None, pad_to_multiple_of=None, return_tensors="pt", **_):
        width = max(len(f["input_ids"]) for f in features)
        out: dict[str, list] = {}
        for f in features:
            for key, value in f.items():
                if isinstance(value, list):
                    value = value + [0] * (width - len(value))
                out.setdefault(key, []).append(value)
        return {k: torch.tensor(v) for k, v in out.items()}


def _dataset(lengths: list[int], seed: int = 0) -> datasets.Dataset:
    rng = np.random.default_rng(seed)
    ids = [[2, *rng.integers(5, 50, size=n - 2).tolist(), 3] for n in lengths]
    return datasets.Dataset.from_dict({
        "input_ids": ids,
        "attention_mask": [[1] * len(x) for x in ids],
        "token_type_ids": [[0] * len(x) for x in ids],
        "labels": [i % 3 for i in range(len(ids))],
    })


def _session(tmp_path: Path, teacher, dataset, **kwargs) -> C.TeacherCacheSession:
    values = dict(teacher=teacher, dataset=C.add_index_columns(dataset), collate=DataCollatorWithPadding(_Tokenizer()),
                  device=torch.device("cpu"), head="classification", max_length=24, batch_size=4, precision="fp32",
                  root=tmp_path)
    values.update(kwargs)
    return C.TeacherCacheSession(**values)


LENGTHS = [5, 12, 7, 24, 9, 3, 16, 11, 6, 20]


def test_index_and_length_columns():
    data = C.add_index_columns(_dataset(LENGTHS))
    assert data[C.EXAMPLE_INDEX] == list(range(len(LENGTHS)))
    assert data[C.LENGTH_COLUMN] == LENGTHS


def test_key_changes_with_every_input():
    base = C.CacheKey(teacher="t", dataset="d", max_length=64, augmentation="none", precision="fp32")
    digests = {base.digest()}
    for change in (dict(teacher="t2"), dict(dataset="d2"), dict(max_length=128), dict(augmentation="tinybert-20x"),
                   dict(precision="bf16"), dict(storage="float32")):
        digests.add(replace(base, **change).digest())
    assert len(digests) == 7
    assert replace(base).digest() == base.digest()


def test_fingerprints_follow_content_not_identity():
    teacher, same = _tiny_teacher(0), _tiny_teacher(0)
    assert C.teacher_fingerprint(teacher) == C.teacher_fingerprint(same)
    with torch.no_grad():
        same.classifier.bias[0] += 1e-3
    assert C.teacher_fingerprint(teacher) != C.teacher_fingerprint(same)

    data = _dataset(LENGTHS)
    assert C.dataset_fingerprint(data) == C.dataset_fingerprint(_dataset(LENGTHS))
    # extra columns (labels, index) do not matter; a token, a row or the row order does
    assert C.dataset_fingerprint(data) == C.dataset_fingerprint(C.add_index_columns(data))
    changed = data.map(lambda row, i: {"input_ids": [row["input_ids"][0] + (i == 4), *row["input_ids"][1:]]},
                       with_indices=True)
    assert C.dataset_fingerprint(changed) != C.dataset_fingerprint(data)
    assert C.dataset_fingerprint(data.select(range(9))) != C.dataset_fingerprint(data)
    assert C.dataset_fingerprint(data.select(list(range(10))[::-1])) != C.dataset_fingerprint(data)


def test_plan_small_fields_cached_large_ones_within_budget_only():
    config = BertConfig(hidden_size=32, num_hidden_layers=2, num_attention_heads=4)
    common = dict(enabled=True, transforms_batch=False, num_rows=100, max_length=16, teacher_config=config)
    assert C.plan_stage("kd", NO_FEATURES, "classification", budget_mb=0, **common).fields == ("logits",)
    assert C.plan_stage("qa", NO_FEATURES, "span", budget_mb=0, **common).fields == ("start_logits", "end_logits")
    layer_bytes = 100 * 16 * 32 * 2  # rows * length * width * float16, one file per layer
    assert C.estimate_large_bytes(HIDDEN, 100, 16, config) == {f"hidden_states.{i}": layer_bytes for i in range(3)}
    assert C.estimate_large_bytes(HIDDEN, 100, 16, config, "float32")["hidden_states.0"] == 2 * layer_bytes
    live = C.plan_stage("hidden", HIDDEN, "classification", budget_mb=0.25, **common)
    assert live.source == "live" and "0.3 MB" in live.reason and "float16" in live.reason
    cached = C.plan_stage("hidden", HIDDEN, "classification", budget_mb=0.5, **common)
    assert cached.source == "cache" and cached.fields == ("logits", "hidden_states.0", "hidden_states.1",
                                                          "hidden_states.2")
    # Only the layers a stage reads: embedding + last hidden state, the last layer's scores (4 heads x 16 x 16).
    mapped = FeatureRequest(hidden_states=True, attention_scores=True, hidden_layers=(0, 2), attention_layers=(1,))
    assert C.estimate_large_bytes(mapped, 100, 16, config) == {
        "hidden_states.0": layer_bytes, "hidden_states.2": layer_bytes, "attention_scores.1": 100 * 4 * 16 * 16 * 2}
    assert C.plan_stage("mlm", NO_FEATURES, "masked-lm", budget_mb=0, **common).source == "live"
    masked = C.plan_stage("kd", NO_FEATURES, "classification", budget_mb=0, **{**common, "transforms_batch": True})
    assert masked.source == "live" and "prepare_batch" in masked.reason
    assert C.plan_stage("kd", NO_FEATURES, "classification", budget_mb=0, **{**common, "enabled": False}).source == "live"


def _live(teacher, batch, request):
    capture = FeatureCapture(teacher, request)
    with torch.no_grad():
        features = capture.collect(teacher(**{k: batch[k] for k in ("input_ids", "attention_mask", "token_type_ids")}))
    capture.remove()
    return features


# Tolerances of the stored precision (the features are O(1); scores reach about 10).
STORAGE_TOLERANCE = {"float32": dict(atol=1e-4, rtol=1e-5), "float16": dict(atol=1e-2, rtol=1e-3),
                     "bfloat16": dict(atol=8e-2, rtol=8e-3)}


@pytest.mark.parametrize(("request_", "storage"), [
    (NO_FEATURES, "float16"),
    (FeatureRequest(hidden_states=True, attention_scores=True), "float32"),
    (FeatureRequest(hidden_states=True, attention_scores=True), "float16"),
    (FeatureRequest(hidden_states=True, attention_probs=True), "bfloat16"),
])
def test_cached_features_equal_live_ones_on_shuffled_batches(tmp_path, request_, storage):
    teacher = _tiny_teacher()
    session = _session(tmp_path, teacher, _dataset(LENGTHS), budget_mb=10, storage=storage)
    tolerance = STORAGE_TOLERANCE[storage]
    cached = session.for_stage(Stage("s", loss=None, teacher_features=request_))
    assert session.plans[0].source == "cache" and not session.plans[0].hit
    collate = DataCollatorWithPadding(_Tokenizer())
    for rows in ([3, 0, 7], [5, 8, 1, 2], [9]):  # a shuffled, dynamically padded batch
        batch = collate([session.dataset[i] for i in rows])
        got = cached.features(batch[C.EXAMPLE_INDEX], batch["attention_mask"])
        want = _live(teacher, batch, request_)
        torch.testing.assert_close(got.logits, want.logits, atol=1e-5, rtol=1e-5)
        if request_.any:
            mask = batch["attention_mask"].bool()
            for g, w in zip(got.hidden_states, want.hidden_states, strict=True):
                torch.testing.assert_close(g[mask], w[mask], **tolerance)
            scores = want.attention_scores or tuple(_live(teacher, batch, FeatureRequest(attention_scores=True))
                                                    .attention_scores)
            for g, w in zip(got.attention_scores, scores, strict=True):
                rows_real = mask[:, None, :, None] & torch.ones_like(g, dtype=torch.bool)
                torch.testing.assert_close(g[rows_real], w[rows_real], **tolerance)
            # Probabilities are derived only for a stage that asks for them (softmax over every layer costs).
            assert (got.attention_probs is not None) == request_.attention_probs
            if request_.attention_probs:
                for g, w in zip(got.attention_probs, want.attention_probs, strict=True):
                    rows_real = mask[:, None, :, None] & torch.ones_like(g, dtype=torch.bool)
                    torch.testing.assert_close(g[rows_real], w[rows_real], **tolerance)


def test_only_the_mapped_layers_are_cached_and_a_later_stage_adds_its_own(tmp_path):
    teacher = _tiny_teacher()
    mapped = FeatureRequest(hidden_states=True, attention_scores=True, hidden_layers=(0, 2), attention_layers=(1,))
    session = _session(tmp_path, teacher, _dataset(LENGTHS), budget_mb=10)
    cached = session.for_stage(Stage("intermediate", loss=None, teacher_features=mapped))
    plan = session.plans[0]
    files = sorted(p.name for p in Path(session.summary()["folder"]).glob("*.npy"))
    assert files == ["attention_scores.1.npy", "hidden_states.0.npy", "hidden_states.2.npy", "logits.npy"]
    # Sequence fields are padded to the longest row (24 here), in float16: 2 bytes per value.
    longest = max(LENGTHS)
    per_example = 3 * 4 + 2 * (2 * longest * 32 + 4 * longest * longest)
    assert plan.bytes_per_example == per_example and plan.hit_rate == 0.0 and plan.storage == "float16"
    collate = DataCollatorWithPadding(_Tokenizer())
    batch = collate([session.dataset[i] for i in (4, 1)])
    got = cached.features(batch[C.EXAMPLE_INDEX], batch["attention_mask"])
    assert [h is not None for h in got.hidden_states] == [True, False, True]
    assert [a is not None for a in got.attention_scores] == [False, True]
    want = _live(teacher, batch, mapped)
    torch.testing.assert_close(got.hidden_states[2], want.hidden_states[2], **STORAGE_TOLERANCE["float16"])

    # A stage that reads every layer finds the mapped layers on disk and adds the others.
    session.for_stage(Stage("all", loss=None, teacher_features=FeatureRequest(hidden_states=True, attention_scores=True)))
    full = session.plans[1]
    found = 3 * 4 + 2 * (2 * longest * 32 + 4 * longest * longest)
    assert full.hit_rate == pytest.approx(found / (3 * 4 + 2 * (3 * longest * 32 + 2 * 4 * longest * longest)),
                                          abs=1e-4)
    summary = session.summary()
    assert summary["storage"] == "float16" and summary["hit_rate"] == pytest.approx(
        full.hit_rate * full.bytes / (plan.bytes + full.bytes), abs=1e-3)


def test_reused_when_inputs_equal_recomputed_when_any_changes(tmp_path, monkeypatch):
    teacher, data = _tiny_teacher(), _dataset(LENGTHS)
    stage = Stage("kd", loss=None)
    first = _session(tmp_path, teacher, data)
    logits = first.for_stage(stage).tensors["logits"].clone()
    folder = first.summary()["folder"]
    manifest = json.loads((Path(folder) / C.MANIFEST).read_text())
    assert manifest["fields"]["logits"]["shape"] == [len(LENGTHS), 3]

    calls = []
    real = C.compute_teacher_outputs
    monkeypatch.setattr(C, "compute_teacher_outputs", lambda *a, **k: calls.append(1) or real(*a, **k))
    again = _session(tmp_path, _tiny_teacher(), _dataset(LENGTHS))  # equal content, other objects
    torch.testing.assert_close(again.for_stage(stage).tensors["logits"], logits)
    assert calls == [] and again.plans[0].hit and again.summary()["folder"] == folder

    other_teacher = _tiny_teacher(1)
    other_data = _dataset(LENGTHS, seed=1)
    for session in (_session(tmp_path, other_teacher, data), _session(tmp_path, teacher, other_data),
                    _session(tmp_path, teacher, data, max_length=32), _session(tmp_path, teacher, data, augmentation="x"),
                    _session(tmp_path, teacher, data, precision="bf16")):
        session.for_stage(stage)
        assert not session.plans[0].hit and session.summary()["folder"] != folder
    assert len(calls) == 5


def test_a_teacher_pass_fills_its_fields_on_disk_not_in_memory(tmp_path, monkeypatch, capsys):
    """The per-layer fields of a large training set pass a job's memory limit long before its disk
    budget (an 11 GB cache for TinyBERT's augmented CoLA): the pass writes each field into its file
    as it goes. The files equal what a pass in memory computes, bit for bit, and no temporary is left.
    The pass (minutes) is announced, with its progress, in the console and the run's log."""
    from kdbench.engine.run_log import run_log_file

    teacher, request = _tiny_teacher(), FeatureRequest(hidden_states=True, attention_scores=True)
    session = _session(tmp_path, teacher, _dataset(LENGTHS), budget_mb=10)
    filled = {}
    real = C.compute_teacher_outputs

    def spy(*args, **kwargs):
        filled.update(real(*args, **kwargs))
        return filled

    monkeypatch.setattr(C, "compute_teacher_outputs", spy)
    with run_log_file(tmp_path / "run") as log_path:
        session.for_stage(Stage("s", loss=None, teacher_features=request))
    folder = Path(session.summary()["folder"])
    said = capsys.readouterr()
    logged = log_path.read_text()
    for text in (said.out, logged):
        assert f"stage s: filling the teacher-output cache (6 field(s) of {len(LENGTHS)} rows, one teacher pass)" in text
        assert "stage s: teacher-output cache filled in " in text
    assert "s: teacher outputs: 100%|" in said.err and f"{len(LENGTHS)}/{len(LENGTHS)}" in said.err
    assert sorted(filled) == ["attention_scores.0", "attention_scores.1", "hidden_states.0", "hidden_states.1",
                              "hidden_states.2", "logits"]
    assert all(isinstance(array, np.memmap) and Path(array.filename).parent == folder for array in filled.values())
    in_memory = real(teacher, session.dataset, session.collate, tuple(filled), batch_size=4, max_length=24,
                     device=torch.device("cpu"))
    for name, array in in_memory.items():
        assert type(array) is np.ndarray
        np.testing.assert_array_equal(session.cache().load(name), array)
    assert sorted(path.name for path in folder.iterdir() if path.name.endswith(".tmp")) == []


def test_a_teacher_pass_that_fails_leaves_no_partial_field(tmp_path):
    teacher = _tiny_teacher()
    calls = []

    def fail_on_the_second_batch(module, args, output):
        calls.append(1)
        if len(calls) == 2:
            raise RuntimeError("out of memory")

    teacher.bert.encoder.register_forward_hook(fail_on_the_second_batch)
    session = _session(tmp_path, teacher, _dataset(LENGTHS), budget_mb=10)
    with pytest.raises(RuntimeError, match="out of memory"):
        session.for_stage(Stage("s", loss=None, teacher_features=FeatureRequest(hidden_states=True)))
    assert len(calls) == 2 and not session.cache().folder.exists()  # the first batch's temporary files are gone


def test_truncated_cache_file_is_an_error(tmp_path):
    session = _session(tmp_path, _tiny_teacher(), _dataset(LENGTHS))
    session.for_stage(Stage("kd", loss=None))
    path = Path(session.summary()["folder"]) / "logits.npy"
    np.save(path, np.zeros((3, 3), dtype=np.float32))
    with pytest.raises(ValueError, match="truncated"):
        session.cache().load("logits")


def _row_file(tmp_path: Path, array: np.ndarray) -> tuple[C.RowFile, object]:
    from concurrent.futures import ThreadPoolExecutor

    np.save(tmp_path / "field.npy", array)
    executor = ThreadPoolExecutor(2)
    return C.RowFile(np.load(tmp_path / "field.npy", mmap_mode="r"), executor), executor


def test_row_file_reads_the_rows_asked_for_in_their_order_by_positioned_reads(tmp_path):
    array = np.arange(7 * 3 * 5 * 5, dtype=np.float16).reshape(7, 3, 5, 5)  # (rows, heads, L, L)
    table, executor = _row_file(tmp_path, array)
    assert table._fd is not None  # this platform has os.preadv: no memory map is read
    for rows in ([6, 0, 3], [2, 2, 5, 1], [4], []):
        np.testing.assert_array_equal(table.take(np.array(rows, dtype=np.int64)), array[rows])
    table.close()
    executor.shutdown()
    assert table._fd is None


def test_row_file_names_the_file_for_a_row_past_its_end_or_a_truncated_file(tmp_path):
    table, executor = _row_file(tmp_path, np.ones((4, 6), dtype=np.float32))
    with pytest.raises(IndexError, match=r"field\.npy: row 4 of 4"):
        table.take(np.array([1, 4]))
    with (tmp_path / "field.npy").open("r+b") as handle:  # cut the last row short after the header was read
        handle.truncate(table._offset + 3 * 6 * 4 + 10)
    with pytest.raises(OSError, match=r"short read at row 3 \(10 of 24 bytes"):
        table.take(np.array([0, 3]))
    table.close()
    executor.shutdown()


def test_closing_the_cached_teacher_closes_its_files_and_threads(tmp_path):
    session = _session(tmp_path, _tiny_teacher(), _dataset(LENGTHS), budget_mb=10)
    cached = session.for_stage(Stage("s", loss=None, teacher_features=FeatureRequest(hidden_states=True)))
    assert cached.mapped and all(table._fd is not None for table in cached.mapped.values())
    cached.close()
    assert all(table._fd is None for table in cached.mapped.values()) and cached._executor is None
    with pytest.raises(ValueError, match=r"hidden_states\.0\.npy: read after close"):
        cached.mapped["hidden_states.0"].take(np.array([0]))


@pytest.mark.integration
def test_kd_run_records_and_reuses_the_cache(tmp_path, tiny_teacher, shared_data, monkeypatch):
    """A real kd run on SST-2 text: the record says what was cached; a second run (other seed) hits."""
    from kdbench.config import build_run_config
    from kdbench.engine import run_experiment

    monkeypatch.setenv(C.CACHE_ENV, str(tmp_path / "cache"))
    values = {"method": "kd", "task": "sst2", "teacher": str(tiny_teacher), "student": str(tiny_teacher),
              "data_dir": str(shared_data), "output": str(tmp_path / "runs"), "max_train_samples": "64",
              "max_eval_samples": "32", "epochs": "1", "max_seq_length": "32", "batch_size": "16"}
    records = []
    for seed in ("1", "2"):
        run_dir = run_experiment(build_run_config({**values, "seed": seed}))
        records.append(json.loads((run_dir / "result.json").read_text()))
    first, second = (r["teacher_cache"] for r in records)
    assert first["stages"][0]["source"] == "cache" and first["stages"][0]["fields"] == ["logits"]
    assert not first["stages"][0]["hit"] and second["stages"][0]["hit"]
    assert first["hit_rate"] == 0.0 and second["hit_rate"] == 1.0
    assert first["bytes_per_example"] == second["bytes_per_example"] == 2 * 4  # two float32 logits
    assert first["folder"] == second["folder"] and first["key"]["max_length"] == 32


def test_a_cache_fill_that_would_fill_the_disk_runs_the_teacher_instead(tmp_path, monkeypatch):
    teacher, request = _tiny_teacher(), FeatureRequest(hidden_states=True, hidden_layers=(0,))
    needed = len(LENGTHS) * max(LENGTHS) * 32 * 2  # rows x longest row x hidden size x float16
    session = _session(tmp_path, teacher, _dataset(LENGTHS), budget_mb=10)
    monkeypatch.setattr(C, "free_disk_bytes", lambda folder: C.DISK_HEADROOM_BYTES + needed - 1)
    assert session.for_stage(Stage("hidden", loss=None, teacher_features=request)) is None
    assert session.plans[0].source == "live" and f"need {needed / 2**20:.1f} MB" in session.plans[0].reason
    assert not list(tmp_path.rglob("hidden_states.0.npy"))
    monkeypatch.setattr(C, "free_disk_bytes", lambda folder: C.DISK_HEADROOM_BYTES + needed)
    assert session.for_stage(Stage("hidden", loss=None, teacher_features=request)) is not None
    assert session.plans[1].source == "cache" and list(tmp_path.rglob("hidden_states.0.npy"))
    # Once on disk, a full disk no longer matters: nothing is written.
    monkeypatch.setattr(C, "free_disk_bytes", lambda folder: 0)
    assert session.for_stage(Stage("hidden", loss=None, teacher_features=request)) is not None


def test_a_stage_over_the_budget_says_that_its_teacher_runs_live(tmp_path, capsys):
    """A live teacher can cost a long stage hours (TinyBERT's intermediate stage on augmented SST-2
    passed the 16 GB budget and ran live with no word in its log): the run's log and console say so
    when the stage starts, with the reason the record keeps. A cache the user switched off is not
    announced."""
    from kdbench.engine.run_log import run_log_file

    teacher, request = _tiny_teacher(), FeatureRequest(hidden_states=True, attention_scores=True)
    stage = Stage("intermediate", loss=None, teacher_features=request)
    over = _session(tmp_path, teacher, _dataset(LENGTHS), budget_mb=0.001)
    with run_log_file(tmp_path / "run") as log_path:
        assert over.for_stage(stage) is None
    reason = over.plans[0].reason
    assert "> teacher_cache_budget_mb=0.001" in reason
    said, logged = capsys.readouterr().out, log_path.read_text()
    for text in (said, logged):
        assert f"stage intermediate: the teacher runs live, not from the teacher-output cache: {reason}" in text
    off = _session(tmp_path, teacher, _dataset(LENGTHS), budget_mb=10, enabled=False)
    assert off.for_stage(stage) is None and off.plans[0].reason == "teacher_cache=false"
    assert "runs live" not in capsys.readouterr().out


def test_free_disk_bytes_reads_the_nearest_existing_folder(tmp_path):
    import shutil

    assert abs(C.free_disk_bytes(tmp_path / "not" / "made") - shutil.disk_usage(tmp_path).free) < 2**26


def test_short_stage_runs_the_teacher_unless_the_cache_is_already_filled(tmp_path):
    teacher, data = _tiny_teacher(), _dataset(LENGTHS)
    short = _session(tmp_path, teacher, data, max_steps=2, examples_per_step=4)  # 8 of 10 rows
    assert short.for_stage(Stage("kd", loss=None)) is None
    assert short.plans[0].source == "live" and "0.80 of the training set" in short.plans[0].reason
    _session(tmp_path, teacher, data).for_stage(Stage("kd", loss=None))  # a full-epoch run fills it
    again = _session(tmp_path, teacher, data, max_steps=2, examples_per_step=4)
    assert again.for_stage(Stage("kd", loss=None)) is not None and again.plans[0].hit
