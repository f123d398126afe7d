from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent))
from _tiny import make_tiny_bert  # noqa: E402


@pytest.fixture(scope="session")
def tiny_models(tmp_path_factory, minilm_path, shared_data) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("tiny-models")
    return {"teacher": make_tiny_bert(root / "teacher", minilm_path, seed=1),
            "student": make_tiny_bert(root / "student", minilm_path, seed=2)}


@pytest.fixture(autouse=True)
def _one_torch_thread(request):
    """Tiny models train several times faster with one intra-op thread on a shared 2-core machine."""
    if request.node.get_closest_marker("integration") is None:
        yield
        return
    import torch

    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)
