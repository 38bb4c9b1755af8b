"""The cycle graph's state: small and JSON-friendly (figures and file paths); a cycle's
trajectories, flagged items and tasks live in its files (graph.py's docstring)."""

from __future__ import annotations

import operator
from typing import Annotated, TypedDict

from pydantic import JsonValue

from ...records import Task
from ..synthesis.state import Rejection


class CycleState(TypedDict, total=False):
    cycle: int  # the cycle in progress (1-based); 0 during the baseline
    cycles: int  # how many cycles the run makes
    adapter: str | None  # the adapter the policy serves now (None: the base model)
    # The figures of the cycle in progress: "cycle", then each stage's figures model
    # (coevolve.outputs.summary) dumped under the stage's name.
    current: dict[str, JsonValue]
    # One CycleSummary per finished cycle, dumped (read them with CycleSummary.model_validate).
    finished: Annotated[list[dict[str, JsonValue]], operator.add]
    # The synthesis subgraph reads and writes these keys (those of its input and output
    # schemas); they hold a pass's items only while the stage runs (record_synthesis
    # empties them).
    flagged: list[dict[str, JsonValue]]  # the cycle's kept flagged items, as JSON
    parents: list[dict[str, JsonValue]]  # their parent tasks, as JSON
    accepted: list[Task]
    counts: dict[str, int]
    rejections: list[Rejection]
    roles: dict[str, str]
    synthesis_started: float  # wall-clock time the stage started


SYNTHESIS_CLEARED: CycleState = {
    "flagged": [],
    "parents": [],
    "accepted": [],
    "counts": {},
    "rejections": [],
    "roles": {},
}
