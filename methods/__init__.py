"""Distillation methods shipped with kdbench (installed as ``kdbench.methods``)."""
