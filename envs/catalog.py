"""Task sets by environment name, and seed tasks by id, so saved trajectories can be
joined back to their tasks. Each environment's own loaders are in its registry spec
(``coevolve.envs.registry``)."""

from __future__ import annotations

from collections.abc import Iterable

from ..records import Task
from .registry import get_environment


def seed_tasks_by_id(env: str, ids: Iterable[str]) -> dict[str, Task]:
    """The seed tasks with these ids; ids that name no seed task are left out."""
    return get_environment(env).seed_tasks(ids)


def first_per_family(tasks: Iterable[Task], per_family: int | None) -> list[Task]:
    """The first ``per_family`` tasks of every family, in order (None: all of them)."""
    if per_family is None:
        return list(tasks)
    kept: dict[str, int] = {}
    chosen = []
    for task in tasks:
        if kept.get(task.family, 0) < per_family:
            kept[task.family] = kept.get(task.family, 0) + 1
            chosen.append(task)
    return chosen


def load_tasks(
    env: str, split: str = "train", category: str = "multi_turn_base", seed: int = 0
) -> list[Task]:
    """A task set: a world split, or a BFCL category's split (train, heldout or all)."""
    return get_environment(env).load_tasks(split, category, seed)
