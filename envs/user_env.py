"""Environments users bring, found without editing the package, and their derived spec.

A config's ``env.name`` names one of:

- an import path ``module:attribute`` (``mytools.env:make_env``): a callable that returns
  a fresh ``Environment`` each call, usually a ``FunctionEnvironment`` built with its task
  file (``FunctionEnvironment(Library, tasks="tasks.jsonl")``);
- a ``coevolve.environments`` entry point of an installed package, whose object is such a
  callable;
- a module of tool functions (``mytools.tools``: its public functions that take
  ``state`` first) together with ``env.tasks``, the task file.

``env.tasks`` also gives (or replaces) the task file of the first two. The module is
imported with the working directory on ``sys.path``, as ``uvicorn app:app`` does.

From the tools and the task file everything the registry's ``EnvironmentSpec`` holds is
derived (``UserEnvironment.spec``): the splits (``task_file.assign_splits``), the loaders,
the diagnosis and failure grade (a replay of the reference next to the episode's calls),
the inventory. Before a run loads its tasks every reference solution is replayed
(``refuse_if_broken``); problems of the task file or of the replay refuse the run, naming each
task's id and line, and so does a split with no task (``empty_splits``).
"""

from __future__ import annotations

import importlib
import importlib.metadata
import inspect
import shlex
import sys
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from functools import cached_property
from pathlib import Path
from typing import Any

from ..common.config_base import ConfigError
from ..records import Task, Trajectory, is_success
from .base import (
    TASK_ERRORS,
    Environment,
    ToolEnvironment,
    answer_in_observations,
    replay_reference,
    unsupported_answer,
)
from .function_tools import TOOL_FAILED, FunctionEnvironment
from .limits import bound_tool_calls
from .parsing import UNREADABLE_CALL, render_call
from .spec import EnvironmentSpec
from .task_file import SPLITS, TaskFile, TaskProblem, assign_splits, read_task_file
from .user_diagnosis import diagnose, failure_grade

ENTRY_POINT_GROUP = "coevolve.environments"

# Error kinds of a call the dispatcher refuses before any tool runs.
_REFUSED = frozenset({"parse_error", "bad_json", UNREADABLE_CALL, "unknown_tool", "bad_arguments"})


@dataclass
class UserEnvironment:
    """An environment a user brought: its factory and task file, checked once."""

    name: str  # as the config names it; Task.env and Environment.name carry it
    make: Callable[[], Environment]  # the user's factory
    tasks_path: Path
    title: str
    description: str
    # The task file as the user named it (--tasks, env.tasks); None: the factory's own.
    tasks_option: str | None = None
    task_file: TaskFile = field(init=False)

    def __post_init__(self) -> None:
        self.task_file = read_task_file(self.tasks_path, self.name)

    def make_env(self) -> Environment:
        """A fresh environment, named as configs and tasks name it. One that is not a
        ``ToolEnvironment`` (whose step bounds every call itself) gets a step that does."""
        env = self.make()
        env.name = self.name
        if not isinstance(env, ToolEnvironment):
            bound_tool_calls(env)
        return env

    @property
    def check_command(self) -> str:
        """The ``coevolve env check`` command for this environment and task file, with the
        options the user gave, so that run as printed it checks the same file."""
        tasks = f" --tasks {shlex.quote(self.tasks_option)}" if self.tasks_option else ""
        return f"coevolve env check {shlex.quote(self.name)}{tasks}"

    @cached_property
    def problems(self) -> list[TaskProblem]:
        """The task file's bad lines and the tasks whose reference does not replay to
        success, each with its line and a reason, in the file's order."""
        problems = [*self.task_file.problems, *self._replay_problems()]
        return sorted(problems, key=lambda problem: problem.line)

    def _replay_problems(self) -> list[TaskProblem]:
        problems = []
        for task in self.task_file.tasks:
            reason = reference_problem(self.make_env, task)
            if reason is not None:
                problems.append(self.task_file.problem(task.id, reason))
        return problems

    @cached_property
    def good_tasks(self) -> list[Task]:
        # By line, not by id: of two lines with one id, the second is the problem.
        bad = {problem.line for problem in self.problems}
        return [task for task in self.task_file.tasks if self.task_file.lines[task.id] not in bad]

    def tasks(self, split: str, seed: int = 0) -> list[Task]:
        """The usable tasks of a split, the unnamed splits cut with ``seed``."""
        cut = assign_splits(self.good_tasks, self.task_file.named_splits, seed)
        return [task for task in cut if split == "all" or task.split == split]

    def task_set(self, split: str, seed: int = 0) -> list[Task]:
        """``tasks``, or a ConfigError when the split has none: nothing runs on zero tasks."""
        empty = self.empty_splits([split], seed)
        if empty is not None:
            raise ConfigError(empty)
        return self.tasks(split, seed)

    def empty_splits(self, splits: Sequence[str], seed: int = 0) -> str | None:
        """One line naming the file and those of ``splits`` that hold no usable task, and
        why (None when each holds one)."""
        cut = self.tasks("all", seed)
        sizes = {split: sum(task.split == split for task in cut) for split in SPLITS}
        empty = [split for split in splits if (len(cut) if split == "all" else sizes[split]) == 0]
        if not empty:
            return None
        which = f"split {empty[0]} has" if len(empty) == 1 else f"splits {', '.join(empty)} have"
        if not self.task_file.tasks and not self.task_file.problems:
            why = "the file holds no task (a task is one JSON object a line)"
        elif not cut:
            why = (
                f"none of its {len(self.problems)} task lines can be used "
                f"({self.check_command} says why)"
            )
        else:
            held = [f"{split} ({count})" for split, count in sizes.items() if count]
            where = f"all in {held[0]}" if len(held) == 1 else f"in {', '.join(held)}"
            why = (
                f"its {len(cut)} usable tasks are {where}. A line that names no split goes to "
                "heldout or validation with a chance of a quarter each, by its id and env.seed; "
                'name the split on a line ("split": "heldout")'
            )
        return f"environment {self.name}: {which} no task in {self.tasks_path}: {why}"

    def refuse_if_broken(self) -> None:
        """Raise a ConfigError naming every problem (what ``coevolve run`` stops on)."""
        if not self.problems:
            return
        shown = "; ".join(str(problem) for problem in self.problems[:5])
        more = f"; and {len(self.problems) - 5} more" if len(self.problems) > 5 else ""
        raise ConfigError(
            f"environment {self.name}: {len(self.problems)} of the tasks in {self.tasks_path} "
            f"cannot be used: {shown}{more} ({self.check_command} lists them all)"
        )

    @cached_property
    def spec(self) -> EnvironmentSpec:
        return EnvironmentSpec(
            name=self.name,
            title=self.title,
            description=self.description,
            environment=self.make_env,
            splits=(*SPLITS, "all"),
            split_note="as the task file names them, else drawn per task from its id and env.seed",
            evaluation_splits=SPLITS,
            task_sets=SPLITS,
            max_tool_calls=self._max_tool_calls(),
            load_tasks=self._load_tasks,
            load_task_set=self.task_set,
            seed_tasks=self._seed_tasks,
            diagnose=self._diagnose,
            failure_grade=self._failure_grade,
            inventory=self._inventory,
        )

    def _max_tool_calls(self) -> int:
        """Tool-calling replies per user turn in `coevolve eval`: room for twice the longest
        reference turn (an agent may look things up or recover from an error), at least 4."""
        longest = max(
            (len(turn.reference_calls) for task in self.task_file.tasks for turn in task.turns),
            default=0,
        )
        return max(4, 2 * longest)

    # ------------------------------------------------------------ the spec's callables

    def _load_tasks(self, split: str, category: str, seed: int) -> list[Task]:
        self.refuse_if_broken()  # a run never trains on an environment it cannot verify
        return self.task_set(split, seed)

    def _seed_tasks(self, ids: Iterable[str]) -> dict[str, Task]:
        wanted = set(ids)
        return {task.id: task for task in self.good_tasks if task.id in wanted}

    def _diagnose(self, task: Task, trajectory: Trajectory) -> tuple[list[str], float]:
        return diagnose(self.make_env, task, trajectory)

    def _failure_grade(self, task: Task, trajectory: Trajectory) -> float:
        return failure_grade(self.make_env, task, trajectory)

    def _inventory(self) -> dict[str, Any]:
        sizes = {split: len(self.tasks(split)) for split in SPLITS}
        probe = self.make_env()
        families = {task.family for task in self.good_tasks}
        status = f"{len(self.good_tasks)} tasks from {self.tasks_path}"
        if self.problems:
            status += f"; {len(self.problems)} problems: {self.check_command}"
        return {
            "task_sets": sizes,
            "tools": len(probe.tools()),
            "families": len(families),
            "status": status,
        }


def reference_problem(make_env: Callable[[], Environment], task: Task) -> str | None:
    """Why a task's reference solution does not replay to success in a fresh environment
    (None when it does): a call the environment refuses, a tool that crashed, a state
    the environment cannot start from, or a verifier score below 1."""
    try:
        score, steps = replay_reference(make_env(), task)
    except TASK_ERRORS as err:
        return f"cannot run: {type(err).__name__}: {err}"
    # Every reference call must succeed: one that errors is a wrong id or argument far more
    # often than a failure the task plans for, and it would teach the agent to make it.
    for index, step in enumerate(steps, start=1):
        error = step.observation.error
        if step.call is not None and error is not None:
            what = {TOOL_FAILED: ""}.get(error, " is refused" if error in _REFUSED else " fails")
            return (
                f"reference call {index} {render_call(step.call)}{what}: "
                f"{step.observation.text.removeprefix('error: ')}"
            )
    if not is_success(score):
        return f"the reference does not replay to success (verifier score {score:.2f})"
    # The judge's rule for synthesized tasks: an answer no tool shows teaches making one up.
    if task.reference_answer is not None and not answer_in_observations(
        steps, task.reference_answer
    ):
        return unsupported_answer(task.reference_answer)
    # A reference of lookups alone, with no answer asked: doing nothing matches it too.
    nothing, _ = replay_reference(make_env(), task, calls=False)
    if is_success(nothing):
        return DOING_NOTHING_SCORES
    return None


DOING_NOTHING_SCORES = (
    "an agent that makes no call scores 1.00 on it: its reference changes nothing and it asks "
    'for no answer; give it the "answer" its lookups show, or the call that changes the state'
)


# --------------------------------------------------------------------------- finding


_FOUND: dict[str, UserEnvironment] = {}


def find_user_environment(name: str) -> UserEnvironment | None:
    """The user environment ``name`` names (loaded once), or None when it names none.

    Raises ValueError, on one line, when it looks like an import path or entry point but
    cannot be loaded."""
    if name in _FOUND:
        return _FOUND[name]
    if ":" in name:
        factory = _import_attribute(name)
    else:
        entry = _entry_point(name)
        if entry is None:
            return None
        factory = _load_entry_point(entry, name)
    return _remember(name, factory, tasks=None)


def register_user_environment(name: str, tasks: str | Path) -> UserEnvironment:
    """The environment of a config with ``env.tasks``: ``name`` is an import path, an entry
    point or a module of tool functions; ``tasks`` its task file (replacing any its
    factory names)."""
    if ":" in name:
        factory = _import_attribute(name)
    else:
        entry = _entry_point(name)
        factory = _load_entry_point(entry, name) if entry is not None else _module_of_tools(name)
    return _remember(name, factory, tasks=tasks)


def user_environment_names() -> list[str]:
    """The environments installed packages declare as ``coevolve.environments`` entry points."""
    return sorted(
        {entry.name for entry in importlib.metadata.entry_points(group=ENTRY_POINT_GROUP)}
    )


def _remember(name: str, factory: Any, tasks: str | Path | None) -> UserEnvironment:
    if not callable(factory):
        raise ValueError(
            f"environment {name!r} is a {type(factory).__name__}, not a callable that makes "
            "an environment (e.g. def make_env() -> FunctionEnvironment)"
        )
    try:
        probe = factory()
    except Exception as err:  # boundary: the user's factory
        raise ValueError(
            f"environment {name!r}: making it raised {type(err).__name__}: {err}"
        ) from None
    missing = [
        method
        for method in ("tools", "reset", "step", "end_turn", "score", "action_pattern")
        if not callable(getattr(probe, method, None))
    ]
    if missing:
        raise ValueError(
            f"environment {name!r} made a {type(probe).__name__}, which lacks "
            f"{', '.join(missing)} of the Environment protocol (coevolve.envs.base)"
        )
    path = Path(tasks) if tasks is not None else getattr(probe, "tasks_path", None)
    if path is None:
        raise ValueError(
            f"environment {name!r} names no task file: set env.tasks, or build it with "
            "FunctionEnvironment(..., tasks='tasks.jsonl')"
        )
    if not Path(path).is_file():
        raise ValueError(f"environment {name!r}: task file {path} does not exist")
    title = str(getattr(probe, "name", "") or name)
    description = str(getattr(probe, "description", "") or (inspect.getdoc(probe) or name))
    found = UserEnvironment(
        name=name,
        make=factory,
        tasks_path=Path(path),
        title=title,
        description=description.splitlines()[0],
        tasks_option=str(tasks) if tasks is not None else None,
    )
    _FOUND[name] = found
    return found


def _import_module(module_name: str, name: str) -> Any:
    cwd = str(Path.cwd())
    if cwd not in sys.path:  # a user's module beside their config, as uvicorn finds app:app
        sys.path.insert(0, cwd)
    try:
        return importlib.import_module(module_name)
    except ImportError as err:
        raise ValueError(
            f"environment {name!r}: cannot import module {module_name!r} ({err}); run from "
            "the directory that holds it or install it"
        ) from None
    except Exception as err:  # boundary: the user's module failed while importing
        raise ValueError(
            f"environment {name!r}: importing module {module_name!r} raised "
            f"{type(err).__name__}: {err}"
        ) from None


def _import_attribute(name: str) -> Any:
    module_name, _, attribute = name.partition(":")
    if not module_name or not attribute:
        raise ValueError(f"environment {name!r}: an import path is module:attribute")
    module = _import_module(module_name, name)
    target: Any = module
    for part in attribute.split("."):
        if not hasattr(target, part):
            raise ValueError(f"environment {name!r}: module {module_name!r} has no {attribute!r}")
        target = getattr(target, part)
    return target


def _load_entry_point(entry: importlib.metadata.EntryPoint, name: str) -> Any:
    try:
        return entry.load()
    except Exception as err:  # boundary: a third-party package's import
        raise ValueError(
            f"environment {name!r}: entry point {entry.value} of {ENTRY_POINT_GROUP} "
            f"cannot be loaded ({type(err).__name__}: {err})"
        ) from None


def _entry_point(name: str) -> importlib.metadata.EntryPoint | None:
    entries = importlib.metadata.entry_points(group=ENTRY_POINT_GROUP)
    return next((entry for entry in entries if entry.name == name), None)


def _module_of_tools(name: str) -> Callable[[], FunctionEnvironment]:
    module = _import_module(name, name)
    functions = [
        value
        for attribute, value in vars(module).items()
        if not attribute.startswith("_")
        and inspect.isfunction(value)
        and value.__module__ == module.__name__
        and list(inspect.signature(value).parameters)[:1] == ["state"]
    ]
    if not functions:
        raise ValueError(
            f"environment {name!r}: module {name!r} has no tool functions (public functions "
            "whose first parameter is `state`)"
        )
    title = name.rsplit(".", 1)[-1]
    description = (inspect.getdoc(module) or title).splitlines()[0]

    def make_env() -> FunctionEnvironment:
        return FunctionEnvironment(functions, name=title, description=description)

    return make_env
