"""The environments coevolve knows, one plain record each: ``get_environment(name)``.

Config validation, the CLI, task loading, the diagnosis and the runtimes ask the
registry instead of comparing environment names. A user's environment needs no entry
here: ``get_environment`` finds it by import path or entry point and derives its spec
from its tools and task file (``envs/user_env.py``, docs/environments.md). A built-in
one is written to ``envs/base.py``'s ``Environment`` protocol (and the optional
``Supports*`` protocols offline synthesis uses when an environment has them), with its
``EnvironmentSpec`` in ``ENVIRONMENTS`` below.

Importing this module imports both environments' modules but not ``bfcl_eval``
(BFCL imports it when a task is loaded or run); ``coevolve --help`` does not
import it at all (the commands import it inside themselves).
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any

from ..records import Task, Trajectory
from .bfcl import ALL_CATEGORIES as BFCL_ALL_CATEGORIES
from .bfcl import CATEGORIES as BFCL_CATEGORIES
from .bfcl import SPLITS as BFCL_SPLITS
from .bfcl import BfclEnvironment, require_bfcl
from .bfcl import load_tasks as load_bfcl_tasks
from .bfcl_checking import INSTALL_COMMAND
from .diagnosis import bfcl_model_turns, diagnose_bfcl
from .spec import EnvironmentSpec
from .world import DEFAULT_SIZES, FAMILIES, TOOL_NAMES, WorldEnvironment, load_split
from .world import SPLITS as WORLD_SPLITS
from .world.world_diagnosis import diagnose_world, world_final_state, world_progress


def _same_task(task: Task, trajectory: Trajectory) -> None:
    if trajectory.task_id != task.id:
        raise ValueError(
            f"trajectory {trajectory.id} is of task {trajectory.task_id}, not {task.id}"
        )


# --------------------------------------------------------------------------- the world

_WORLD_ID = re.compile(r"^world(?:-s(?P<seed>\d+))?-(?P<split>[a-z]+)-\d+$")


def _world_tasks(split: str, category: str, seed: int) -> list[Task]:
    return load_split(split, seed=seed)


def _world_seed_tasks(ids: Iterable[str]) -> dict[str, Task]:
    """Seed ids name their split and generator seed (``world-s3-train-0042``)."""
    wanted = set(ids)
    scopes = set()
    for task_id in wanted:
        match = _WORLD_ID.match(task_id)
        if match and match["split"] in WORLD_SPLITS:
            scopes.add((match["split"], int(match["seed"] or 0)))
    found: dict[str, Task] = {}
    for split, seed in sorted(scopes):
        found.update({t.id: t for t in load_split(split, seed=seed) if t.id in wanted})
    return found


def _world_diagnosis(task: Task, trajectory: Trajectory) -> tuple[list[str], float]:
    _same_task(task, trajectory)
    labels = diagnose_world(task, trajectory.steps, trajectory.final_answer)
    final = world_final_state(task, trajectory.steps)
    return labels, world_progress(task, final, trajectory.final_answer)


def _world_failure_grade(task: Task, trajectory: Trajectory) -> float:
    _same_task(task, trajectory)
    final = world_final_state(task, trajectory.steps)
    return world_progress(task, final, trajectory.final_answer, trajectory.calls)


def _world_inventory() -> dict[str, Any]:
    return {
        "task_sets": dict(DEFAULT_SIZES),
        "tools": len(TOOL_NAMES),
        "families": len(FAMILIES),
        "status": "built in",
    }


WORLD = EnvironmentSpec(
    name="world",
    title="world",
    description="built-in world: contacts, messages, calendar, notes, shop, wallet, reminders",
    environment=WorldEnvironment,
    splits=WORLD_SPLITS,
    evaluation_splits=WORLD_SPLITS,
    task_sets=WORLD_SPLITS,
    max_tool_calls=12,
    load_tasks=_world_tasks,
    load_task_set=load_split,
    seed_tasks=_world_seed_tasks,
    diagnose=_world_diagnosis,
    failure_grade=_world_failure_grade,
    inventory=_world_inventory,
)


# --------------------------------------------------------------------------- BFCL

BFCL_ENTRIES_PER_CATEGORY = 200


def _bfcl_tasks(split: str, category: str, seed: int) -> list[Task]:
    return load_bfcl_tasks(category, split=split)


def _bfcl_task_set(category: str) -> list[Task]:
    require_bfcl()  # says how to install it
    return load_bfcl_tasks(category)


def _bfcl_seed_tasks(ids: Iterable[str]) -> dict[str, Task]:
    """BFCL entry ids start with their category (``multi_turn_base_12``)."""
    wanted = set(ids)
    found: dict[str, Task] = {}
    for category in BFCL_CATEGORIES:
        if any(task_id.startswith(category + "_") for task_id in wanted):
            found.update({t.id: t for t in load_bfcl_tasks(category) if t.id in wanted})
    return found


def _bfcl_diagnosis(task: Task, trajectory: Trajectory) -> tuple[list[str], float]:
    _same_task(task, trajectory)
    result = diagnose_bfcl(task, bfcl_model_turns(task, trajectory.steps))
    return result.labels, result.progress


def _bfcl_failure_grade(task: Task, trajectory: Trajectory) -> float:
    return _bfcl_diagnosis(task, trajectory)[1]  # turn-level progress already grades


def _bfcl_inventory() -> dict[str, Any]:
    try:
        import bfcl_eval  # noqa: F401

        status = "installed"
    except ImportError:
        status = f"not installed: {INSTALL_COMMAND}"
    return {
        "task_sets": dict.fromkeys(BFCL_CATEGORIES, BFCL_ENTRIES_PER_CATEGORY),
        "status": status,
    }


BFCL = EnvironmentSpec(
    name="bfcl",
    title="BFCL",
    description="BFCL multi-turn (from the bfcl-eval package), scored by its official checker",
    environment=BfclEnvironment,
    splits=BFCL_SPLITS,
    split_note="half of the category each, or all of it",
    categories=(*BFCL_CATEGORIES, BFCL_ALL_CATEGORIES),
    evaluation_splits=("heldout",),
    evaluation_note="the half of env.category the loop never trains on",
    task_set_option="category",
    task_sets=BFCL_CATEGORIES,
    eval_task_sets=BFCL_CATEGORIES,
    family_label="category",
    max_tool_calls=20,  # as BFCL's own runs
    load_tasks=_bfcl_tasks,
    load_task_set=_bfcl_task_set,
    seed_tasks=_bfcl_seed_tasks,
    diagnose=_bfcl_diagnosis,
    failure_grade=_bfcl_failure_grade,
    inventory=_bfcl_inventory,
)


# --------------------------------------------------------------------------- lookup

ENVIRONMENTS: dict[str, EnvironmentSpec] = {spec.name: spec for spec in (WORLD, BFCL)}


def get_environment(name: str) -> EnvironmentSpec:
    """The spec of the environment called ``name``: a built-in one, or a user's found by
    import path (``module:make_env``) or ``coevolve.environments`` entry point; a ValueError
    naming the known ones if none is."""
    spec = ENVIRONMENTS.get(name)
    if spec is not None:
        return spec
    from .user_env import find_user_environment

    found = find_user_environment(name)
    if found is None:
        raise ValueError(
            f"unknown environment {name!r}; allowed: {', '.join(ENVIRONMENTS)}, an import path "
            "(module:make_env) or a coevolve.environments entry point"
        )
    return found.spec


def find_environment(name: str) -> EnvironmentSpec | None:
    """The spec of the environment called ``name``, or None when none is (``get_environment``
    says why)."""
    try:
        return get_environment(name)
    except ValueError:
        return None


def per_environment(values: Callable[[EnvironmentSpec], tuple[Sequence[str], str]]) -> str:
    """Help text: each environment's values and its note on them (``values(spec)`` gives
    both), e.g. ``world train, validation, heldout; BFCL heldout (the half ...)``."""
    parts = []
    for spec in ENVIRONMENTS.values():
        names, note = values(spec)
        if names:
            parts.append(f"{spec.title} {', '.join(names)}" + (f" ({note})" if note else ""))
    return "; ".join(parts)


def annotate(trajectories: Sequence[Trajectory], tasks: Mapping[str, Task]) -> list[Trajectory]:
    """Copies of the trajectories with ``diagnosis`` and ``progress`` filled in, each on its
    task's environment. Trajectories whose task is unknown, or of no known environment,
    are returned unchanged."""
    out = []
    for trajectory in trajectories:
        task = tasks.get(trajectory.task_id)
        spec = find_environment(task.env) if task is not None else None
        if task is None or spec is None:
            out.append(trajectory)
            continue
        labels, progress = spec.diagnose(task, trajectory)
        out.append(trajectory.model_copy(update={"diagnosis": labels, "progress": progress}))
    return out
