"""Real SQuAD prediction files for the metric tests, and the official scripts' scores on them.

- ``bert_large_ensemble_google.dev-v1.1.predictions.json``: published BERT-large ensemble predictions
  on dev-v1.1; the official v1.1 script scores them EM 86.206, F1 92.196 (the data README).
- :func:`v2_leaderboard_style`: a complete SQuAD v2.0 prediction file built deterministically from the
  real dev-v2.0 questions: the ensemble's answer for every answerable question (SQuAD 2.0 kept the
  v1.1 ids of those), for the unanswerable ones the first three context words on every third
  question and "" otherwise; the no-answer scores are spread by position, lower for the answered
  ones. ``OFFICIAL_V2`` holds what the official ``evaluate-v2.0.py`` printed for it (run once
  outside the repository, on these exact files; the script is not part of kdbench).
"""

from __future__ import annotations

import json
from pathlib import Path

REFERENCE_V1 = "squad/reference_predictions/bert_large_ensemble_google.dev-v1.1.predictions.json"
DEV_V1 = "squad/dev-v1.1.json"
DEV_V2 = "squad/dev-v2.0.reconstructed.json"
OFFICIAL_V1 = {"exact_match": 86.206, "f1": 92.196}  # rounded to 3 places, as published

# evaluate-v2.0.py DEV_V2 preds.json --na-prob-file na.json [--na-prob-thresh 0.5]
OFFICIAL_V2 = {
    1.0: {"exact": 76.1475616946012, "f1": 79.39926894098569, "total": 11873,
          "HasAns_exact": 85.45883940620783, "HasAns_f1": 91.97157897036489, "HasAns_total": 5928,
          "NoAns_exact": 66.86291000841042, "NoAns_f1": 66.86291000841042, "NoAns_total": 5945,
          "best_exact": 80.91468036721974, "best_exact_thresh": 0.798,
          "best_f1": 84.16157477294493, "best_f1_thresh": 0.798},
    0.5: {"exact": 72.02055082961341, "f1": 74.10091204488229, "total": 11873,
          "HasAns_exact": 53.491902834008094, "HasAns_f1": 57.65859121270005, "HasAns_total": 5928,
          "NoAns_exact": 90.49621530698066, "NoAns_f1": 90.49621530698066, "NoAns_total": 5945,
          "best_exact": 80.91468036721974, "best_exact_thresh": 0.798,
          "best_f1": 84.16157477294493, "best_f1_thresh": 0.798},
}
# kdbench's name -> the official script's name
KDBENCH_V2_NAMES = {"em": "exact", "f1": "f1", "total": "total", "has_ans_em": "HasAns_exact",
                    "has_ans_f1": "HasAns_f1", "has_ans_total": "HasAns_total", "no_ans_em": "NoAns_exact",
                    "no_ans_f1": "NoAns_f1", "no_ans_total": "NoAns_total", "best_em": "best_exact",
                    "best_em_thresh": "best_exact_thresh", "best_f1": "best_f1", "best_f1_thresh": "best_f1_thresh"}


def v2_leaderboard_style(shared_data: Path) -> tuple[dict[str, str], dict[str, float]]:
    """``(predictions, no-answer scores)`` for every dev-v2.0 question (see the module docstring)."""
    data = json.loads((shared_data / DEV_V2).read_text())["data"]
    ensemble = json.loads((shared_data / REFERENCE_V1).read_text())
    predictions: dict[str, str] = {}
    na_probs: dict[str, float] = {}
    position = 0
    for article in data:
        for paragraph in article["paragraphs"]:
            for qa in paragraph["qas"]:
                qid = qa["id"]
                if qid in ensemble:
                    predictions[qid] = ensemble[qid]
                else:
                    predictions[qid] = " ".join(paragraph["context"].split()[:3]) if position % 3 == 0 else ""
                spread = (position * 7919) % 1000
                na_probs[qid] = round(spread / 1250 if qid in ensemble else 0.3 + spread / 1430, 3)
                position += 1
    return predictions, na_probs


def squad_references(shared_data: Path, dev_file: str) -> list[dict]:
    """The dev file's questions as the evaluate module's references (the Hub ``squad`` format)."""
    data = json.loads((shared_data / dev_file).read_text())["data"]
    return [{"id": qa["id"], "answers": {"text": [a["text"] for a in qa["answers"]],
                                         "answer_start": [a["answer_start"] for a in qa["answers"]]}}
            for article in data for paragraph in article["paragraphs"] for qa in paragraph["qas"]]
