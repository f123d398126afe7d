"""Task adapters shipped with kdbench (installed as ``kdbench.tasks``)."""
