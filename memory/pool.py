"""The training pool: seed tasks plus accepted synthesized tasks, and how a cycle samples it.

The pool is what the loop rolls the policy out on. Seed tasks come from the
environment's training split; synthesized tasks are appended as the synthesis
pass accepts them, with their provenance (parent task, signal, cycle), to a
JSON-lines file in the run directory. Appending is idempotent by task id, so a
resumed cycle that re-adds its tasks changes nothing.

Each cycle samples ``rollout_tasks`` tasks without replacement, with weights:
- a synthesized task weighs ``synthesized_weight`` times a seed task: new
  targeted data is what the cycle exists for, and there are far fewer of them;
- a *mastered* task (every rollout of its last cycle succeeded) is multiplied
  by ``replay_mastered``: it teaches little, but replaying some of it is how the
  forgetting detector gets to see a skill slip.
The sample is a pure function of (pool, history, seed, cycle), so a resumed
run draws the same tasks.
"""

from __future__ import annotations

import random
from collections import Counter
from collections.abc import Iterable, Sequence
from pathlib import Path

from pydantic import BaseModel, ConfigDict, Field

from ..common.files import read_jsonl
from ..records import Task
from .history import OutcomeHistory


class PoolConfig(BaseModel):
    """Which pool tasks each cycle rolls out, and how synthesized tasks feed training."""

    model_config = ConfigDict(extra="forbid", validate_assignment=True)

    rollout_tasks: int | None = Field(
        default=128,
        gt=0,
        description="Tasks sampled from the pool for each cycle's rollouts (None: all of them).",
    )
    synthesized_weight: float = Field(
        default=3.0,
        ge=0.0,
        description="Sampling weight of a synthesized task relative to a seed task (1: equal).",
    )
    replay_mastered: float = Field(
        default=0.25,
        ge=0.0,
        le=1.0,
        description="Weight factor of tasks whose last rollouts all succeeded (0: never "
        "replayed, 1: not down-weighted).",
    )
    mastered_threshold: float = Field(
        default=1.0,
        gt=0.0,
        le=1.0,
        description="Mean score of a task's last cycle at or above which it counts as mastered.",
    )
    replay_demonstrations: int = Field(
        default=64,
        ge=0,
        description="Reference demonstrations of earlier pool tasks (seed and synthesized) mixed "
        "into each cycle's SFT data besides the new tasks', against forgetting.",
    )
    seed: int = Field(default=0, description="Seed of the per-cycle sampling.")
    seed_tasks: int | None = Field(
        default=None,
        gt=0,
        description="Start the pool from the first N tasks of the training split (None: all).",
    )


class TaskPool:
    """Seed tasks plus synthesized tasks, the latter persisted as JSON lines."""

    def __init__(self, seed_tasks: Sequence[Task], path: str | Path | None = None):
        self.path = Path(path) if path is not None else None
        self._tasks: dict[str, Task] = {task.id: task for task in seed_tasks}
        self.seed_count = len(self._tasks)
        if self.path is not None and self.path.exists():
            # A line cut short by a kill is skipped; its cycle re-adds the task.
            for row in read_jsonl(self.path, skip_torn=True):
                task = Task.model_validate(row)
                self._tasks.setdefault(task.id, task)

    def __len__(self) -> int:
        return len(self._tasks)

    def __contains__(self, task_id: object) -> bool:
        return task_id in self._tasks

    @property
    def tasks(self) -> list[Task]:
        return list(self._tasks.values())

    def get(self, task_id: str) -> Task | None:
        return self._tasks.get(task_id)

    def synthesized(self, cycle: int | None = None) -> list[Task]:
        """Synthesized tasks (of one cycle, or all), in the order they were added."""
        return [
            task
            for task in self._tasks.values()
            if task.source == "synthesized" and (cycle is None or task.cycle == cycle)
        ]

    def add(self, tasks: Iterable[Task]) -> int:
        """Add tasks not yet in the pool (by id); returns how many were new."""
        new = [task for task in tasks if task.id not in self._tasks]
        for task in new:
            self._tasks[task.id] = task
        if new and self.path is not None:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            with self.path.open("a", encoding="utf-8") as handle:
                handle.writelines(task.model_dump_json() + "\n" for task in new)
        return len(new)

    def counts(self) -> dict[str, int]:
        """Tasks by source (seed / synthesized) and, for synthesized ones, by signal."""
        counts: Counter[str] = Counter()
        for task in self._tasks.values():
            counts[task.source] += 1
            if task.source == "synthesized":
                counts[f"signal:{task.signal or 'none'}"] += 1
        return dict(counts)

    def weight(self, task: Task, history: OutcomeHistory, cycle: int, config: PoolConfig) -> float:
        weight = config.synthesized_weight if task.source == "synthesized" else 1.0
        last = history.task_window(task.id, before_cycle=cycle, size=1)
        if last and last[0] >= config.mastered_threshold:
            weight *= config.replay_mastered
        return weight

    def sample(self, cycle: int, history: OutcomeHistory, config: PoolConfig) -> list[Task]:
        """The tasks this cycle rolls out: weighted, without replacement, reproducible."""
        tasks = self.tasks
        if config.rollout_tasks is None or config.rollout_tasks >= len(tasks):
            chosen = [t for t in tasks if self.weight(t, history, cycle, config) > 0]
            return chosen or tasks
        rng = random.Random(f"pool:{config.seed}:{cycle}")
        # Weighted sampling without replacement (Efraimidis-Spirakis): key u^(1/w).
        keyed = []
        for task in tasks:
            weight = self.weight(task, history, cycle, config)
            if weight > 0:
                keyed.append((rng.random() ** (1.0 / weight), task.id))
            else:
                rng.random()  # keep the stream aligned whatever the weights
        keyed.sort(reverse=True)
        return [self._tasks[task_id] for _, task_id in keyed[: config.rollout_tasks]]

    def replay_sample(self, cycle: int, count: int, exclude: set[str], seed: int) -> list[Task]:
        """``count`` earlier pool tasks for replayed demonstrations, reproducible per cycle."""
        candidates = [
            task
            for task in self._tasks.values()
            if task.id not in exclude and (task.cycle is None or task.cycle < cycle)
        ]
        rng = random.Random(f"replay:{seed}:{cycle}")
        return rng.sample(candidates, min(count, len(candidates)))
