"""Where kdbench keeps what it can recompute: ``$KDBENCH_CACHE_DIR`` (default ``~/.cache/kdbench``),
one sub-folder per cache, so ``kdbench cache`` sees only its own folders."""

from __future__ import annotations

import os
from pathlib import Path

CACHE_ENV = "KDBENCH_CACHE_DIR"
TEACHER_OUTPUTS = "teacher-outputs"  # kdbench.cache
FINGERPRINTS = "fingerprints"  # kdbench.fingerprint: file digests by (path, size, mtime)
AUGMENTED_SETS = "augment"  # kdbench augment


def cache_dir(kind: str) -> Path:
    """The folder of one cache, read from the environment at call time."""
    root = os.environ.get(CACHE_ENV)
    return (Path(root).expanduser() if root else Path("~/.cache/kdbench").expanduser()) / kind
