"""The loss a stage ended at: per-term means over its last epoch, weighted by the steps each logged
line averages, so a short tail line (the shortest rows of a length-grouped megabatch) cannot pass
for where training settled; and the one reader of the log's lines, which a kill may have cut short."""

from __future__ import annotations

import json

import pytest

from kdbench.loss_log import last_epoch_loss_terms, read_loss_lines


def _line(step: int, epoch: float, window: int | None, **terms: float) -> dict:
    line = {"stage": "intermediate", "step": step, "epoch": epoch, "lr": 1e-4, "loss": sum(terms.values()), **terms}
    if window is not None:
        line["window_steps"] = window
    return line


def test_the_last_epoch_weights_each_line_by_its_window_and_a_short_tail_barely_counts():
    # 3 epochs of 10 steps, logged every 4 steps; the last line averages the 2 steps after step 28.
    lines = [_line(step, step / 10, 4, attn=10.0 - step / 4, hidn=1.0) for step in range(4, 29, 4)]
    lines.append(_line(30, 3.0, 2, attn=1.0, hidn=0.5))
    terms, steps = last_epoch_loss_terms(lines)
    # epoch 3 is steps 21-30: the lines at 24 (attn 4), 28 (attn 3) and the tail at 30 (attn 1)
    assert steps == 10
    assert terms["attn"] == pytest.approx((4 * 4.0 + 4 * 3.0 + 2 * 1.0) / 10)  # 3.0, where the tail alone says 1.0
    assert terms["hidn"] == pytest.approx((4 * 1.0 + 4 * 1.0 + 2 * 0.5) / 10)
    assert set(terms) == {"attn", "hidn"}  # the total and the line's bookkeeping are not terms


def test_lines_without_window_steps_are_weighted_by_the_steps_since_the_previous_line():
    lines = [_line(50, 1.0, None, pred=0.4), _line(100, 2.0, None, pred=0.2), _line(110, 2.2, None, pred=0.1)]
    terms, steps = last_epoch_loss_terms(lines)
    assert steps == 60  # the lines ending after epoch 1.2: 100 (50 steps) and 110 (10 steps)
    assert terms["pred"] == pytest.approx((50 * 0.2 + 10 * 0.1) / 60)


def test_a_stage_under_two_epochs_is_judged_by_its_second_half():
    lines = [_line(step, step / 40, 5, task=1.0 if step <= 15 else 0.5) for step in range(5, 31, 5)]
    terms, steps = last_epoch_loss_terms(lines)  # 0.75 epochs: the half after epoch 0.375 (step 15)
    assert steps == 15 and terms == {"task": pytest.approx(0.5)}


def test_no_logged_lines_give_no_terms():
    assert last_epoch_loss_terms([]) == ({}, 0)
    assert last_epoch_loss_terms([{"stage": "kd", "step": 20, "eval": {"acc": 70.0}}]) == ({}, 0)


def test_the_one_reader_of_the_log_keeps_whole_lines_as_written_and_leaves_out_a_line_cut_by_a_kill(tmp_path):
    logged = json.dumps(_line(4, 0.4, 4, attn=2.0))
    evaluation = json.dumps({"stage": "intermediate", "step": 4, "eval": {"acc": 71.5}})
    path = tmp_path / "loss_terms.jsonl"
    path.write_text(f"{logged}\n{evaluation}\n[1, 2]\n{logged[:17]}", encoding="utf-8")
    read = list(read_loss_lines(path))
    assert [line for line, _ in read] == [logged, evaluation]  # not the non-object line, not the cut one
    assert read[1][1]["eval"] == {"acc": 71.5}
    assert list(read_loss_lines(tmp_path / "absent.jsonl")) == []
