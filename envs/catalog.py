"""Find seed tasks by id, so saved trajectories can be joined back to their tasks."""

from __future__ import annotations

import re
from collections.abc import Iterable

from ..records import Task

_WORLD_ID = re.compile(r"^world(?:-s(?P<seed>\d+))?-(?P<split>[a-z]+)-\d+$")


def seed_tasks_by_id(env: str, ids: Iterable[str]) -> dict[str, Task]:
    """The seed tasks with these ids; ids that name no seed task are left out."""
    wanted = set(ids)
    found: dict[str, Task] = {}
    if env == "world":
        from .world import SPLITS, load_split

        scopes = set()
        for task_id in wanted:
            match = _WORLD_ID.match(task_id)
            if match and match["split"] in SPLITS:
                scopes.add((match["split"], int(match["seed"] or 0)))
        for split, seed in sorted(scopes):
            found.update({t.id: t for t in load_split(split, seed=seed) if t.id in wanted})
    elif env == "bfcl":
        from .bfcl import CATEGORIES, load_tasks

        for category in CATEGORIES:
            if any(task_id.startswith(category + "_") for task_id in wanted):
                found.update({t.id: t for t in load_tasks(category) if t.id in wanted})
    else:
        raise ValueError(f"unknown environment {env!r}; allowed: world, bfcl")
    return found


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
    if env == "world":
        from .world import load_split

        return load_split(split, seed=seed)
    if env == "bfcl":
        from .bfcl import load_tasks as load_bfcl

        return load_bfcl(category, split=split)
    raise ValueError(f"unknown environment {env!r}; allowed: world, bfcl")
