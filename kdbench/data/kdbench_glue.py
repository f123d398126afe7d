"""kdbench's GLUE metrics as an ``evaluate`` module, loaded from kdbench's installed files:
``evaluate.load(kdbench.metrics.module_path("glue"), "mrpc")`` (config: a GLUE task name).
The metric class and its documentation live in :mod:`kdbench.metric_modules`."""

from kdbench.metric_modules import KdbenchGlue

__all__ = ["KdbenchGlue"]
