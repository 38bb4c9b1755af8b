"""What the cycle graph's nodes share: their runtime context and the run's seeding.

``CycleRuntime`` holds the heavy objects a node uses (policy, environment
factory, pool, history, pattern counts, task store, roles); it is injected as the
graph's runtime context (built by ``coevolve.graph.runtime_factory``).
``RunError`` is a run that cannot start or continue; ``seed_everything`` seeds
Python, NumPy and torch per (seed, cycle, stage).
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ..records import Task


class RunError(RuntimeError):
    """A run that cannot start or continue; the message says what to do."""


@dataclass
class CycleRuntime:
    """What the nodes use; built by coevolve.graph.runtime_factory from a CoevolveConfig."""

    config: Any  # CoevolveConfig
    run_dir: Path
    policy: Any  # Policy: LocalPolicy or EndpointPolicy
    make_env: Any  # Callable[[], Environment]
    pool: Any  # memory.pool.TaskPool
    history: Any  # memory.history.OutcomeHistory
    patterns: Any  # memory.patterns.PatternCounts
    store: Any  # memory.store.TaskStore
    roles: Any  # agents.roles.Roles
    eval_tasks: list[Task]
    model_dir: Path | None  # the local base model, for training
    console: Any = None  # rich Console, or None for silence
    progress: bool = True
    extra: dict[str, Any] = field(default_factory=dict)

    def say(self, text: str) -> None:
        if self.console is not None:
            self.console.print(text)

    def cycle_dir(self, cycle: int) -> Path:
        path = self.run_dir / "cycles" / f"{cycle:03d}"
        path.mkdir(parents=True, exist_ok=True)
        return path


def seed_everything(*parts: object) -> int:
    """Seed Python, NumPy and torch from the parts; returns the seed (so a rerun samples alike)."""
    import random

    digest = hashlib.sha256(":".join(map(str, parts)).encode()).digest()
    seed = int.from_bytes(digest[:4], "big")
    random.seed(seed)
    import numpy as np
    import torch

    np.random.seed(seed)

    torch.manual_seed(seed)
    return seed
