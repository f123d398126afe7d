"""SQuAD v1.1 / v2.0 task adapters (work in progress: spec only)."""

from __future__ import annotations

from kdbench.task import HeadType, Task, TaskSpec


class SquadTask(Task):
    def __init__(self, version: str) -> None:
        self.version = version
        name = "squad" if version == "1.1" else "squad-v2"
        self.spec = TaskSpec(name=name, head=HeadType.SPAN, main_metric="f1")


SQUAD_V1 = SquadTask("1.1")
SQUAD_V2 = SquadTask("2.0")
