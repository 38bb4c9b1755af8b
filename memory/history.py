"""Outcome history per task and per family across cycles, for the forgetting window.

Stored as append-only JSON lines in the run directory (one line per scored
trajectory), so a killed run loses at most the line being written and a
resumed run can re-record a cycle without counting it twice.
"""

from __future__ import annotations

import json
from collections import defaultdict
from collections.abc import Iterable
from pathlib import Path

from ..common.files import read_jsonl
from ..records import Trajectory


class OutcomeHistory:
    """Scores by cycle, for tasks and for families."""

    def __init__(self, path: str | Path | None = None):
        self.path = Path(path) if path is not None else None
        self._seen: set[tuple[int, str]] = set()
        self._task: dict[str, dict[int, list[float]]] = defaultdict(lambda: defaultdict(list))
        self._family: dict[str, dict[int, list[float]]] = defaultdict(lambda: defaultdict(list))
        if self.path is not None and self.path.exists():
            for row in read_jsonl(self.path, skip_torn=True):  # a kill may cut the last line
                self._add(
                    row["cycle"], row["trajectory_id"], row["task_id"], row["family"], row["score"]
                )

    def _add(self, cycle: int, trajectory_id: str, task_id: str, family: str, score: float) -> bool:
        if (cycle, trajectory_id) in self._seen:
            return False
        self._seen.add((cycle, trajectory_id))
        self._task[task_id][cycle].append(score)
        self._family[family][cycle].append(score)
        return True

    def record(self, cycle: int, trajectories: Iterable[Trajectory]) -> int:
        """Add a cycle's scores; returns how many were new."""
        rows = []
        for t in trajectories:
            if self._add(cycle, t.id, t.task_id, t.family, t.score):
                rows.append(
                    {
                        "cycle": cycle,
                        "trajectory_id": t.id,
                        "task_id": t.task_id,
                        "family": t.family,
                        "score": t.score,
                    }
                )
        if rows and self.path is not None:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            with self.path.open("a", encoding="utf-8") as handle:
                handle.writelines(json.dumps(row) + "\n" for row in rows)
        return len(rows)

    def task_window(self, task_id: str, before_cycle: int, size: int) -> list[float]:
        """Mean score of the task in each of its last ``size`` cycles before ``before_cycle``."""
        return _window(self._task.get(task_id, {}), before_cycle, size)

    def family_window(self, family: str, before_cycle: int, size: int) -> list[float]:
        return _window(self._family.get(family, {}), before_cycle, size)


def _window(by_cycle: dict[int, list[float]], before_cycle: int, size: int) -> list[float]:
    cycles = sorted(c for c in by_cycle if c < before_cycle)[-size:]
    return [sum(by_cycle[c]) / len(by_cycle[c]) for c in cycles]
