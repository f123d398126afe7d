from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent.parent / "sweep"))
from _tiny import make_tiny_bert  # noqa: E402


@pytest.fixture(scope="session")
def tiny_models(tmp_path_factory, minilm_path, shared_data) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("tiny-models")
    return {"teacher": make_tiny_bert(root / "teacher", minilm_path, seed=1),
            "student": make_tiny_bert(root / "student", minilm_path, seed=2)}
