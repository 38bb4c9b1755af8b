"""``EnvironmentSpec``: what the rest of coevolve needs to know about one environment.

A plain record, in a module of its own so that both the registry of the built-in
environments (``envs/registry.py``) and the specs derived for a user's environment
(``envs/user_env.py``) build it without importing each other.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any, Literal

from ..records import Task, Trajectory
from .base import Environment


@dataclass(frozen=True, kw_only=True)
class EnvironmentSpec:
    """What the rest of coevolve needs to know about one environment."""

    name: str  # what config (env.name), tasks (Task.env) and the CLI call it
    title: str  # how messages name it: "world", "BFCL"
    description: str  # one line for `coevolve env list`
    environment: Callable[[], Environment]  # calling it makes a fresh environment (make_env)
    splits: tuple[str, ...]  # env.split values
    split_note: str = ""  # what the splits are where the names do not say ("" where they do)
    categories: tuple[str, ...] = ()  # env.category values; empty when it has none
    evaluation_splits: tuple[str, ...]  # evaluation.split values
    evaluation_note: str = ""  # what is evaluated where the names do not say ("" where they do)
    # The CLI names a task set with --split or --category, one of ``task_sets``.
    task_set_option: Literal["split", "category"] = "split"
    task_sets: tuple[str, ...]
    # What `coevolve eval` scores when the option is left out.
    eval_task_sets: tuple[str, ...] = ("heldout",)
    family_label: str = "family"  # what a task's family is called in reports, or "category"
    max_tool_calls: int  # tool-calling replies per user turn in `coevolve eval`
    # (split, category, seed) -> the tasks the loop trains or evaluates on.
    load_tasks: Callable[[str, str, int], list[Task]]
    load_task_set: Callable[[str], list[Task]]  # one of ``task_sets``, as the CLI reads it
    seed_tasks: Callable[[Iterable[str]], dict[str, Task]]  # the seed tasks with these ids
    # (task, a stored trajectory of it) -> (SEAL's labels, graded progress): envs/diagnosis.py.
    diagnose: Callable[[Task, Trajectory], tuple[list[str], float]]
    # (task, a stored trajectory of it) -> how close it came to success, for ranking failures
    # against each other (Trajectory.failure_grade): envs/diagnosis.py.
    failure_grade: Callable[[Task, Trajectory], float]
    inventory: Callable[[], dict[str, Any]]  # task-set sizes and status for `coevolve env list`

    @property
    def seed_task_set(self) -> str:
        """The task set the roles and variations take seed tasks from: train, or the first
        where there is none (BFCL's first category)."""
        return "train" if "train" in self.task_sets else self.task_sets[0]
