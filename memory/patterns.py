"""Cumulative action-pattern counts for the rare signal, and the pattern extractors."""

from __future__ import annotations

import json
from collections import Counter
from collections.abc import Iterable
from pathlib import Path
from typing import Literal

from ..records import Trajectory

PatternKind = Literal["tool_sequence", "tool_errors"]


def tool_sequence(trajectory: Trajectory) -> str:
    """The tools called, in order (unparsed actions as ``?``)."""
    names = [step.call.name if step.call else "?" for step in trajectory.steps]
    return ">".join(names) or "(no actions)"


def tool_errors(trajectory: Trajectory) -> str:
    """The set of (tool, error kind) events: which failures the episode ran into."""
    events = sorted(
        {
            f"{step.call.name if step.call else '?'}!{step.observation.error}"
            for step in trajectory.steps
            if step.observation.error
        }
    )
    return "|".join(events) or "(no errors)"


EXTRACTORS = {"tool_sequence": tool_sequence, "tool_errors": tool_errors}


class PatternCounts:
    """c_p for every pattern p and N, the number of patterns observed; persisted as JSON."""

    def __init__(self, path: str | Path | None = None):
        self.path = Path(path) if path is not None else None
        self.counts: Counter[str] = Counter()
        self.cycles_counted: set[int] = set()
        if self.path is not None and self.path.exists():
            data = json.loads(self.path.read_text(encoding="utf-8"))
            self.counts = Counter(data["counts"])
            self.cycles_counted = set(data["cycles_counted"])

    @property
    def total(self) -> int:
        return sum(self.counts.values())

    def update(self, cycle: int, patterns: Iterable[str]) -> bool:
        """Count a cycle's patterns once; a resumed run that repeats a cycle changes nothing."""
        if cycle in self.cycles_counted:
            return False
        self.counts.update(patterns)
        self.cycles_counted.add(cycle)
        if self.path is not None:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            tmp = self.path.with_suffix(".tmp")
            tmp.write_text(
                json.dumps({"counts": self.counts, "cycles_counted": sorted(self.cycles_counted)})
            )
            tmp.replace(self.path)  # atomic: a kill leaves the old or the new file, never half
        return True

    def frequency(self, pattern: str) -> float:
        total = self.total
        return self.counts[pattern] / total if total else 0.0
