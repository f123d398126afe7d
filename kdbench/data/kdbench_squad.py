"""kdbench's SQuAD metrics as an ``evaluate`` module, loaded from kdbench's installed files:
``evaluate.load(kdbench.metrics.module_path("squad"), "squad-v2")`` (config ``squad`` = v1.1).
The metric class and its documentation live in :mod:`kdbench.metric_modules`."""

from kdbench.metric_modules import KdbenchSquad

__all__ = ["KdbenchSquad"]
