"""The synthesis graph's runtime context, given by its caller, never built inside a node."""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # pragma: no cover
    from chromadb.api.types import Where

    from ...agents.roles.role_interfaces import EnvFactory, Roles
    from ...memory.store import TaskStore
    from ...records import Task

# The share of its episodes the current policy solves, for each task in order.
StudentSuccess = Callable[["Sequence[Task]"], Awaitable[list[float]]]


@dataclass
class SynthesisRuntime:
    """What the synthesis graph's nodes use: the graph's ``context_schema``, given by
    the caller (the cycle's ``CycleRuntime.synthesis_runtime``, ``coevolve synthesize``,
    Studio's factory)."""

    roles: Roles
    make_env: EnvFactory
    store: TaskStore
    neighbours: int = 5
    max_accepted: int | None = None  # most tasks a pass stores (None: all novel ones)
    judge_veto: bool = True  # accept only verified replays the judge agrees with
    # Which stored tasks dedup compares with: a Chroma where-filter (JSON), None for all.
    dedup_where: Where | None = None  # a Chroma metadata filter
    # Inside a checkpointed run (the cycle graph) a pass may run again after a kill,
    # whole or from dedup on: it then first takes the synthesized tasks of its cycle
    # out of the store (before prepare reads the store and before dedup writes it), so
    # it runs against the store as it was and stores the same tasks once.
    replace_cycle: bool = False
    # Called with the cycle as a pass starts (prepare), after the store is cleaned:
    # the cycle graph seeds the random generators, so a rerun samples alike.
    on_start: Callable[[int], object] | None = None
    # The frontier check (synthesis.frontier_samples): the current policy's success share on
    # each accepted candidate; one above frontier_max_solved rejects it. None: no check.
    student_success: StudentSuccess | None = None
    frontier_max_solved: float = 0.5
