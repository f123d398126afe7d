"""kdbench cache list / prune: least recently used first, never a folder a stage read recently, and
a folder in use stays marked while its stage runs."""

from __future__ import annotations

import os
import time
from pathlib import Path

import numpy as np
import pytest
import torch

from kdbench import cache as C
from kdbench.cache_admin import DAY, HOUR, CacheFolder, cache_folders, choose_evictions
from kdbench.cli import main


def _folder(name: str, size_mb: float, days_idle: float, now: float) -> CacheFolder:
    return CacheFolder(Path(name), int(size_mb * 1e6), now - days_idle * DAY, {}, ())


def test_evictions_by_age_then_least_recently_used_down_to_the_size():
    now = 1e9
    folders = [_folder("a", 500, 40, now), _folder("b", 300, 10, now), _folder("c", 200, 3, now),
               _folder("fresh", 900, 0.5, now)]
    by_age = choose_evictions(folders, now=now, older_than_days=30)
    assert [f.path.name for f in by_age] == ["a"]
    # 1,900 MB in all; under 1,000 MB: drop a (1,400 left), then b (1,100), then c (900)
    by_size = choose_evictions(folders, now=now, max_bytes=int(1000e6))
    assert [f.path.name for f in by_size] == ["a", "b", "c"]
    # "fresh" was read 12 hours ago: kept even though the cache stays over a 500 MB cap
    assert "fresh" not in [f.path.name for f in choose_evictions(folders, now=now, max_bytes=int(500e6))]
    assert [f.path.name for f in choose_evictions(folders, now=now, max_bytes=int(500e6), min_idle_hours=1)] == [
        "a", "b", "c", "fresh"]
    # both criteria: the old one, then what the size still needs
    assert [f.path.name for f in choose_evictions(folders, now=now, older_than_days=30, max_bytes=int(1200e6))] == [
        "a", "b"]


def _write_cache(root: Path, teacher: str, rows: int, days_idle: float) -> C.TeacherOutputCache:
    cache = C.TeacherOutputCache(root, C.CacheKey(teacher=teacher, dataset="d", max_length=16))
    cache.write({"logits": np.zeros((rows, 2), dtype=np.float32)}, seconds=0.1)
    cache.mark_used()
    stamp = time.time() - days_idle * DAY
    os.utime(cache.folder / C.LAST_USED, (stamp, stamp))
    return cache


def test_prune_command_removes_the_least_recently_used_folders(tmp_path, capsys):
    old = _write_cache(tmp_path, "old", 50_000, days_idle=20)  # 400 kB of logits
    middle = _write_cache(tmp_path, "middle", 50_000, days_idle=5)
    recent = _write_cache(tmp_path, "recent", 50_000, days_idle=0.1)
    assert [f.path for f in cache_folders(tmp_path)] == [old.folder, middle.folder, recent.folder]

    assert main(["cache", "list", "--root", str(tmp_path)]) == 0
    listing = capsys.readouterr().out
    assert old.folder.name in listing and "3 folder(s)" in listing and "max_length 16" in listing

    assert main(["cache", "prune", "--root", str(tmp_path), "--max-size", "0.0005", "--dry-run"]) == 0
    assert old.folder.is_dir() and "would remove 2 folder(s)" in capsys.readouterr().out
    assert main(["cache", "prune", "--root", str(tmp_path), "--max-size", "0.0005"]) == 0
    out = capsys.readouterr().out
    assert not old.folder.exists() and not middle.folder.exists() and recent.folder.is_dir()
    assert "removed 2 folder(s)" in out
    assert not list(tmp_path.glob(".deleting-*"))
    # a removed folder is a miss: the next stage recomputes instead of reading half a folder
    assert not old.has("logits")


@pytest.mark.parametrize("argv, message", [
    (["cache", "prune"], "--older-than DAYS and/or --max-size GB"),
    (["cache", "prune", "--max-size", "-1"], "--max-size must be >= 0, got -1.0"),
])
def test_prune_without_a_criterion_or_with_a_negative_one_is_refused(tmp_path, capsys, argv, message):
    assert main([*argv, "--root", str(tmp_path)]) == 2
    assert message in capsys.readouterr().err


def test_a_stage_reading_the_cache_keeps_its_folder_marked(tmp_path, monkeypatch):
    cache = _write_cache(tmp_path, "t", 8, days_idle=3)
    marker = cache.folder / C.LAST_USED
    reader = C.CachedTeacher.open(cache, ("logits",), torch.device("cpu"))
    assert time.time() - marker.stat().st_mtime < HOUR  # opening marks it
    stamp = time.time() - 3 * DAY
    os.utime(marker, (stamp, stamp))
    reader.features(torch.tensor([0, 1]), torch.ones(2, 4, dtype=torch.long))
    assert marker.stat().st_mtime == pytest.approx(stamp)  # not again within TOUCH_EVERY_SECONDS
    monkeypatch.setattr(C, "TOUCH_EVERY_SECONDS", 0.0)
    reader.features(torch.tensor([0, 1]), torch.ones(2, 4, dtype=torch.long))
    assert time.time() - marker.stat().st_mtime < HOUR


def test_every_kdbench_cache_is_a_sub_folder_of_one_root(tmp_path, monkeypatch, capsys):
    from kdbench.augment_cli import DEFAULT_CACHE
    from kdbench.fingerprint import fingerprint_cache_dir

    monkeypatch.setenv("KDBENCH_CACHE_DIR", str(tmp_path))
    assert C.default_cache_root() == tmp_path / "teacher-outputs"
    assert fingerprint_cache_dir() == tmp_path / "fingerprints"
    assert DEFAULT_CACHE.name == "augment"  # read when the module loads: under the root of that moment
    (tmp_path / "fingerprints").mkdir()
    _write_cache(C.default_cache_root(), "t", 8, days_idle=40)
    assert main(["cache", "prune", "--older-than", "30"]) == 0  # the other caches are not its folders
    assert (tmp_path / "fingerprints").is_dir() and "removed 1 folder(s)" in capsys.readouterr().out


def test_a_stage_adding_fields_marks_the_folder_before_its_teacher_pass(tmp_path, monkeypatch):
    cache = _write_cache(tmp_path, "t", 8, days_idle=40)  # an old folder; a new stage needs another field
    marker = cache.folder / C.LAST_USED
    seen = []

    def teacher_pass(*args, **kwargs):  # what prune would see while the teacher runs
        seen.append(time.time() - marker.stat().st_mtime)
        return {"hidden_states.1": np.zeros((8, 4, 2), dtype=np.float16)}

    monkeypatch.setattr(C, "compute_teacher_outputs", teacher_pass)
    plan = C.CachePlan("intermediate", "cache", fields=("logits", "hidden_states.1"))
    teacher = type("T", (), {"config": type("Config", (), {"num_hidden_layers": 2})()})()
    C.prepare_cached_teacher(plan, cache, teacher, dataset=type("D", (), {"num_rows": 8})(), collate=None,
                             batch_size=4, max_length=4, device=torch.device("cpu"))
    assert seen and seen[0] < HOUR and not plan.hit
