"""kdbench's GLUE and SQuAD metrics as ``evaluate`` metric modules.

Load them offline from kdbench's installed files (the Hub's ``glue``/``squad`` modules need the
network)::

    import evaluate
    from kdbench.metrics import module_path

    glue = evaluate.load(module_path("glue"), "mrpc")      # config: a kdbench GLUE task name
    glue.compute(predictions=[1, 0, 1], references=[1, 1, 1])   # {"acc": 66.66..., "f1": 80.0}
    squad = evaluate.load(module_path("squad"), "squad-v2")  # or "squad" (v1.1)

Results carry kdbench's names and its 0-100 scale (``acc``, ``f1``, ``mcc``, ``pearson``,
``spearman``, ``acc_mm``; SQuAD ``em``, ``f1`` and, for v2.0, the HasAns/NoAns splits and
``best_em``/``best_em_thresh``/``best_f1``/``best_f1_thresh``), the same numbers a kdbench run
records: ``_compute`` calls :func:`kdbench.metrics.glue_metrics` and
:func:`kdbench.metrics.squad_scores`, the functions kdbench's own evaluation uses.

GLUE inputs: class ids in the task's label order (the Hub ``glue`` dataset's order; for MNLI
entailment, neutral, contradiction) or STS-B scores. SQuAD inputs: the Hub ``squad``/``squad_v2``
metric format, predictions ``{"id", "prediction_text"}`` (v2.0 also ``"no_answer_probability"``)
and references ``{"id", "answers": {"text": [...], "answer_start": [...]}}``; ``compute`` takes
``no_answer_threshold`` (default 1.0) for v2.0.

This module imports ``evaluate`` (and through it ``datasets``); the scripts that ``evaluate.load``
reads (``kdbench/data/kdbench_glue.py``, ``kdbench/data/kdbench_squad.py``) only re-export the classes.
"""

from __future__ import annotations

import logging
from typing import Any

import datasets
import evaluate

from kdbench import metrics as M

logger = logging.getLogger(__name__)

_CITATION = """\
@inproceedings{wang2019glue,
  title={{GLUE}: A Multi-Task Benchmark and Analysis Platform for Natural Language Understanding},
  author={Wang, Alex and Singh, Amanpreet and Michael, Julian and Hill, Felix and Levy, Omer and Bowman, Samuel R.},
  booktitle={ICLR}, year={2019}}
@inproceedings{rajpurkar2018know,
  title={Know What You Don't Know: Unanswerable Questions for {SQuAD}},
  author={Rajpurkar, Pranav and Jia, Robin and Liang, Percy}, booktitle={ACL}, year={2018}}
"""

# evaluate's own GLUE config names that differ from kdbench's task names.
GLUE_CONFIG_ALIASES: dict[str, str] = {"mnli_matched": "mnli", "mnli_mismatched": "mnli-mm"}
SQUAD_CONFIGS: dict[str, str] = {"default": "1.1", "squad": "1.1", "squad-v2": "2.0", "squad_v2": "2.0"}


class KdbenchGlue(evaluate.Metric):
    """GLUE metrics of one task (the config name: ``cola``, ``sst2``, ``mrpc``, ``stsb``, ``qqp``,
    ``mnli``, ``mnli-mm``, ``qnli``, ``rte``, ``wnli``, ``ax``), 0-100."""

    def _task(self) -> str:
        task = GLUE_CONFIG_ALIASES.get(self.config_name, self.config_name)
        if task not in M.GLUE_TASK_METRICS:
            raise KeyError(f"kdbench_glue: unknown config {self.config_name!r}; use a GLUE task name: "
                           f"{', '.join(M.GLUE_TASK_METRICS)}")
        return task

    def _info(self) -> evaluate.MetricInfo:
        value = datasets.Value("float64" if self._task() == "stsb" else "int64")
        return evaluate.MetricInfo(
            description="kdbench's GLUE metrics (0-100): CoLA/AX Matthews correlation, accuracy, MRPC/QQP "
                        "accuracy and F1 of label 1, STS-B Pearson and Spearman.",
            citation=_CITATION,
            inputs_description="predictions: class ids in the task's (Hub) label order, or STS-B scores; "
                               "references: the same for the gold labels.",
            features=datasets.Features({"predictions": value, "references": value}),
        )

    def _compute(self, predictions: Any, references: Any) -> dict[str, float]:
        return M.glue_metrics(self._task(), predictions, references)


class KdbenchSquad(evaluate.Metric):
    """SQuAD v1.1 (config ``squad``) or v2.0 (config ``squad-v2``) as the official scripts score it."""

    def _version(self) -> str:
        if self.config_name not in SQUAD_CONFIGS:
            raise KeyError(f"kdbench_squad: unknown config {self.config_name!r}; use one of "
                           f"{', '.join(SQUAD_CONFIGS)}")
        return SQUAD_CONFIGS[self.config_name]

    def _info(self) -> evaluate.MetricInfo:
        prediction = {"id": datasets.Value("string"), "prediction_text": datasets.Value("string")}
        if self._version() == "2.0":
            prediction["no_answer_probability"] = datasets.Value("float64")
        reference = {"id": datasets.Value("string"),
                     "answers": datasets.Sequence({"text": datasets.Value("string"),
                                                   "answer_start": datasets.Value("int32")})}
        return evaluate.MetricInfo(
            description="kdbench's SQuAD metrics (0-100), as the official v1.1/v2.0 evaluation scripts.",
            citation=_CITATION,
            inputs_description="predictions: {'id', 'prediction_text'} (v2.0: also 'no_answer_probability'); "
                               "references: {'id', 'answers': {'text': [...], 'answer_start': [...]}}.",
            features=datasets.Features({"predictions": prediction, "references": reference}),
        )

    def _compute(self, predictions: Any, references: Any, no_answer_threshold: float = 1.0) -> dict[str, float]:
        version = self._version()
        golds = {ref["id"]: list(ref["answers"]["text"]) for ref in references}
        answers = {pred["id"]: pred["prediction_text"] for pred in predictions}
        missing = sum(1 for qid in golds if qid not in answers)
        unknown = sum(1 for qid in answers if qid not in golds)
        if unknown == len(answers):
            raise ValueError(f"kdbench_squad: none of the {len(answers)} prediction ids is among the references")
        if missing or unknown:
            logger.warning("kdbench_squad: %d of %d questions have no prediction (scored as wrong); %d prediction "
                           "ids are not among the references (ignored)", missing, len(golds), unknown)
        na_probs = {pred["id"]: pred["no_answer_probability"] for pred in predictions} if version == "2.0" else None
        return M.squad_scores(golds, answers, version, na_probs, no_answer_threshold)
