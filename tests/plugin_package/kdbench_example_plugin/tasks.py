"""Tasks of the example plug-in: data, not code (the spec is sst2_hub.yaml)."""

from __future__ import annotations

from pathlib import Path

from kdbench.api import ClassificationTask

SST2_HUB = ClassificationTask.from_yaml(Path(__file__).with_name("sst2_hub.yaml"))
