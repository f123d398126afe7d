"""Claims against seed noise: paired per-seed differences, pinned on hand-computed values."""

from __future__ import annotations

import pandas as pd
import pytest

from kdbench.claims import (HOLDS, NO_SIGNAL, NOT_RUN, ONE_SEED, REVERSED, WITHIN_NOISE, Claim, PairedDifference,
                            claims_table)


def test_paired_difference_uses_only_seeds_run_by_both_rows():
    difference = PairedDifference.of({1: 80.0, 2: 81.0, 3: 79.0, 4: 90.0}, {1: 79.0, 2: 79.5, 3: 78.5})
    assert difference.differences == {1: 1.0, 2: 1.5, 3: 0.5}  # seed 4 has no partner
    assert (difference.n, difference.mean, difference.std) == (3, 1.0, 0.5)
    assert difference.stderr == pytest.approx(0.5 / 3 ** 0.5)
    assert difference.verdict == HOLDS  # 1.0 > 2 x 0.289, positive on every seed


@pytest.mark.parametrize("better, worse, verdict", [
    ({1: 1.0, 2: 1.0, 3: 1.1}, {1: 0.0, 2: 0.0, 3: 0.0}, HOLDS),
    ({1: 0.0, 2: 0.0, 3: 0.0}, {1: 1.0, 2: 1.0, 3: 1.1}, REVERSED),
    ({1: 3.0, 2: 3.0, 3: -0.1}, {1: 0.0, 2: 0.0, 3: 0.0}, WITHIN_NOISE),  # mean 1.97 but one seed negative
    ({1: 0.3, 2: 0.1, 3: 0.2, 4: 0.9}, {1: 0.0, 2: 0.0, 3: 0.0, 4: 0.0}, HOLDS),  # 0.375 > 2 x 0.180
    ({1: 0.1, 2: 0.1, 3: 0.1, 4: 2.0}, {1: 0.0, 2: 0.0, 3: 0.0, 4: 0.0}, WITHIN_NOISE),  # 0.575 < 2 x 0.475
    ({1: 52.71, 2: 52.71, 3: 52.71}, {1: 52.71, 2: 52.71, 3: 52.71}, NO_SIGNAL),  # both rows at one score
    ({1: 52.71, 2: 52.71, 3: 53.07}, {1: 52.71, 2: 52.71, 3: 52.71}, WITHIN_NOISE),  # one run moved off it
    ({1: 55.0, 2: 55.0}, {1: 52.71, 2: 52.71}, HOLDS),  # each row constant, but apart: a real difference
    ({1: 1.0}, {1: 0.0}, ONE_SEED),
    ({1: 1.0}, {2: 0.0}, NOT_RUN),
])
def test_verdicts(better, worse, verdict):
    assert PairedDifference.of(better, worse).verdict == verdict


def test_claims_table_reads_the_main_metric_of_completed_runs_by_row_label():
    rows = [("kd-3l", 1, 86.0), ("kd-3l", 2, 87.0), ("kd-3l", 3, 86.5), ("finetune-3l", 1, 85.0),
            ("finetune-3l", 2, 85.5), ("finetune-3l", 3, 85.5)]
    records = pd.DataFrame([{"label": label, "task": "mrpc", "seed": seed, "status": "completed",
                             "metric.f1": f1, "metric.acc": 0.0} for label, seed, f1 in rows]
                           + [{"label": "kd-3l", "task": "mrpc", "seed": 4, "status": "failed", "metric.f1": 99.0}])
    table = claims_table([Claim("Hinton", "KD beats fine-tuning", "kd-3l", "finetune-3l")], records, ["mrpc", "rte"])
    lines = table.splitlines()
    # f1 (MRPC's main metric), not acc; the failed seed-4 run is left out. Differences 1.0, 1.5, 1.0.
    assert lines[2] == ("| Hinton | KD beats fine-tuning | mrpc | f1 | kd-3l 86.50 ± 0.50 (3 seeds) | finetune-3l 85.33 ± 0.29 "
                        "(3 seeds) | +1.17 ± 0.29 (se 0.17) | holds |")
    assert lines[3] == ("| Hinton | KD beats fine-tuning | rte | acc | kd-3l (not run) | finetune-3l (not run) | – | not run |")


def test_a_claim_is_tested_on_the_metric_the_papers_table_prints():
    """TinyBERT's and MobileBERT's ablation tables print MRPC's accuracy: the verdict follows it, and
    here F1 and accuracy disagree on the direction."""
    f1 = {("td", 1): 77.0, ("td", 2): 78.0, ("td", 3): 76.0, ("kd", 1): 81.2, ("kd", 2): 81.2, ("kd", 3): 81.2}
    acc = {("td", 1): 70.0, ("td", 2): 71.0, ("td", 3): 70.5, ("kd", 1): 68.4, ("kd", 2): 68.4, ("kd", 3): 68.4}
    records = pd.DataFrame([{"label": label, "task": "mrpc", "seed": seed, "status": "completed",
                             "metric.f1": f1[label, seed], "metric.acc": acc[label, seed]} for label, seed in f1])
    claim = [Claim("TinyBERT", "TD beats KD", "td", "kd")]
    on_f1 = claims_table(claim, records, ["mrpc"]).splitlines()[2]
    on_acc = claims_table(claim, records, ["mrpc"], metrics={"mrpc": "acc"}).splitlines()[2]
    assert on_f1.endswith("| mrpc | f1 | td 77.00 ± 1.00 (3 seeds) | kd 81.20 ± 0.00 (3 seeds) | -4.20 ± 1.00 (se 0.58) "
                          "| reversed |")
    assert on_acc.endswith("| mrpc | acc | td 70.50 ± 0.50 (3 seeds) | kd 68.40 ± 0.00 (3 seeds) | +2.10 ± 0.50 (se 0.29) "
                           "| holds |")


def test_a_claim_over_runs_that_read_different_teacher_weights_gets_no_verdict():
    """Same teacher run name, different weights (retrained elsewhere): the difference is shown, not judged.
    Records written before weights_sha256 existed (NaN) do not count as a second teacher."""
    def run(label, seed, f1, teacher):
        digests = {"teacher": teacher, "model": f"m{label}{seed}"} if teacher else float("nan")
        return {"label": label, "task": "mrpc", "seed": seed, "status": "completed", "metric.f1": f1,
                "weights_sha256": digests}

    claim = [Claim("Hinton", "KD beats fine-tuning", "kd-3l", "finetune-3l")]
    same = [run("kd-3l", s, 86.0 + s, "aaa") for s in (1, 2, 3)] + [run("finetune-3l", s, 85.0, "aaa") for s in (1, 2, 3)]
    assert claims_table(claim, pd.DataFrame(same), ["mrpc"]).splitlines()[2].endswith("| holds |")
    mixed = same[:3] + [run("finetune-3l", s, 85.0, "bbb") for s in (1, 2, 3)]
    assert claims_table(claim, pd.DataFrame(mixed), ["mrpc"]).splitlines()[2].endswith(
        "| +3.00 ± 1.00 (se 0.58) | teachers differ |")
    unknown = same[:3] + [run("finetune-3l", s, 85.0, None) for s in (1, 2, 3)]
    assert claims_table(claim, pd.DataFrame(unknown), ["mrpc"]).splitlines()[2].endswith("| holds |")


def test_no_signal_names_the_score_both_rows_stay_at():
    difference = PairedDifference.of({1: 52.71, 2: 52.71, 4: 60.0}, {1: 52.71, 2: 52.71})
    assert (difference.verdict, difference.constant, difference.mean) == (NO_SIGNAL, 52.71, 0.0)
    assert difference.describe() == ("no signal: both rows score 52.71 on all 2 seeds (a constant prediction, such as "
                                     "the majority class), so the claim is not tested")
