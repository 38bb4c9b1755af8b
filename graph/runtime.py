"""What the graphs' nodes share: their runtime contexts and the run's seeding.

``CycleRuntime`` holds the heavy objects a node uses (policy, environment
factory, pool, history, pattern counts, task store, roles); it is injected as the
cycle graph's runtime context (built by ``coevolve.graph.runtime_factory``).
``SynthesisRuntime`` is what the synthesis graph's nodes use; a ``CycleRuntime``
provides one to the synthesis subgraph (``synthesis_runtime``).
``RunError`` is a run that cannot start or continue; ``seed_everything`` seeds
Python, NumPy and torch per (seed, cycle, stage).
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ..records import Task

if TYPE_CHECKING:  # pragma: no cover
    from ..agents.roles import Roles


class RunError(RuntimeError):
    """A run that cannot start or continue; the message says what to do."""


@dataclass
class SynthesisRuntime:
    """What the synthesis graph's nodes use: injected by the caller, provided by the
    cycle's ``CycleRuntime``, or built from a spec for Studio."""

    roles: Roles
    make_env: Any  # Callable[[], Environment]
    store: Any  # memory.store.TaskStore
    neighbours: int = 5
    max_accepted: int | None = None  # most tasks a pass stores (None: all novel ones)
    judge_veto: bool = True  # accept only verified replays the judge agrees with
    dedup_where: dict[str, Any] | None = None  # which stored tasks dedup compares with
    # Inside a checkpointed run (the cycle graph) a pass may run again after a kill,
    # whole or from dedup on: it then first takes the synthesized tasks of its cycle
    # out of the store (before prepare reads the store and before dedup writes it), so
    # it runs against the store as it was and stores the same tasks once.
    replace_cycle: bool = False
    # Called with the cycle as a pass starts (prepare), after the store is cleaned:
    # the cycle graph seeds the random generators, so a rerun samples alike.
    on_start: Callable[[int], object] | None = None
    extra: dict[str, Any] = field(default_factory=dict)


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
    # Where runs that start from the same local agent share their cycle-0 evaluation (the
    # bench's arms of one seed: the same model, tasks, seed and sampling); None: evaluate.
    baseline_cache: Path | None = None
    extra: dict[str, Any] = field(default_factory=dict)

    def say(self, text: str) -> None:
        if self.console is not None:
            self.console.print(text)

    def synthesis_runtime(self) -> SynthesisRuntime:
        """What the synthesis subgraph's nodes use (``graph.synthesis.SynthesisHost``).

        A pass of the cycle may run again after a kill, so it replaces its cycle's
        stored tasks and seeds the random generators per (seed, cycle) as it starts."""
        settings = self.config.synthesis
        seed = self.config.seed
        return SynthesisRuntime(
            roles=self.roles,
            make_env=self.make_env,
            store=self.store,
            neighbours=settings.neighbours,
            max_accepted=settings.max_accepted,
            judge_veto=settings.judge_veto,
            dedup_where=(
                {"source": "synthesized"} if settings.dedup_against == "synthesized" else None
            ),
            replace_cycle=True,
            on_start=lambda cycle: seed_everything(seed, cycle, "synthesize"),
        )

    def cycle_dir(self, cycle: int) -> Path:
        path = self.run_dir / "cycles" / f"{cycle:03d}"
        path.mkdir(parents=True, exist_ok=True)
        return path


def seed_everything(*parts: object) -> int:
    """Seed Python, NumPy and torch from the parts; returns the seed (so a rerun samples alike)."""
    from ..training.trainer_common import seed_all

    digest = hashlib.sha256(":".join(map(str, parts)).encode()).digest()
    seed = int.from_bytes(digest[:4], "big")
    seed_all(seed)
    return seed
