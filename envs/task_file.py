"""Tasks as JSONL, one task a line, and the splits coevolve cuts from them.

A line::

    {"id": "refund-03", "family": "refund",
     "state": {"orders": {"A-17": {"status": "delivered", "total": 30}}},
     "turns": [{"user": "Refund order A-17.",
                "calls": [{"name": "refund_order", "arguments": {"order_id": "A-17"}}]}],
     "answer": null}

- ``id`` (required, unique), ``family`` (optional: default the reference's tool sequence),
  ``split`` (optional: ``train``, ``validation`` or ``heldout``; a line without one goes
  where its id and ``env.seed`` put it, ``split_of``);
- ``state``: the initial state ``reset`` starts from (the state class's constructor
  arguments, or the tool functions' dict);
- ``turns``: the user messages, each with the reference calls that answer it (at least one
  call in the task: a task with none is refused, ``NO_CALLS``); a one-turn task may write
  ``"user"`` and ``"calls"`` at the top level instead;
- ``answer`` (optional): text the agent's final answer must contain.

Reading never stops at a bad line: every problem is collected with its line number and
task id (``TaskProblem``), and the other lines load. Of two lines with the same id the
first loads and the second is a problem.
"""

from __future__ import annotations

import difflib
import hashlib
import json
import re
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from ..common.files import jsonl_lines
from ..records import Task, ToolCall, Turn

SPLITS = ("train", "validation", "heldout")
# The share of a family's tasks each split gets when coevolve cuts them.
SPLIT_SHARES = {"validation": 0.25, "heldout": 0.25}

SplitName = Literal["train", "validation", "heldout"]


class TurnLine(BaseModel):
    model_config = ConfigDict(extra="forbid")

    user: str = Field(min_length=1, description="The user's message.")
    calls: list[ToolCall] = Field(default_factory=list, description="Its reference calls.")


class TaskLine(BaseModel):
    """One line of a task file."""

    model_config = ConfigDict(extra="forbid")

    id: str = Field(min_length=1)
    family: str | None = None
    split: SplitName | None = None
    state: dict[str, Any] = Field(default_factory=dict)
    turns: list[TurnLine] = Field(min_length=1)
    answer: str | None = None

    @model_validator(mode="before")
    @classmethod
    def _one_turn_shorthand(cls, data: Any) -> Any:
        if isinstance(data, dict) and "user" in data and "turns" not in data:
            data = dict(data)
            data["turns"] = [{"user": data.pop("user"), "calls": data.pop("calls", [])}]
        return data

    def task(self, env: str) -> Task:
        turns = [Turn(query=turn.user, reference_calls=turn.calls) for turn in self.turns]
        calls = [call.name for turn in self.turns for call in turn.calls]
        return Task(
            id=self.id,
            env=env,
            family=self.family or (">".join(calls) or "no_calls"),
            split=self.split or "train",
            turns=turns,
            reference_answer=self.answer,
            setup={"state": self.state},
        )


@dataclass(frozen=True)
class TaskProblem:
    """Why one line of a task file cannot be used."""

    path: Path
    line: int
    task_id: str | None
    message: str

    def __str__(self) -> str:
        task = f"task {self.task_id}" if self.task_id else "no task id"
        return f"{self.path.name} line {self.line} ({task}): {self.message}"


@dataclass
class TaskFile:
    """The tasks a file holds, the problems of its bad lines, and each task's line."""

    path: Path
    tasks: list[Task] = field(default_factory=list)
    problems: list[TaskProblem] = field(default_factory=list)
    lines: dict[str, int] = field(default_factory=dict)
    named_splits: set[str] = field(default_factory=set)  # ids whose line named its split

    def problem(self, task_id: str, message: str) -> TaskProblem:
        return TaskProblem(self.path, self.lines.get(task_id, 0), task_id, message)


# Why a task whose reference makes no call is refused: an agent that does nothing matches it.
NO_CALLS = (
    'its reference makes no call ("calls" is empty in every turn), so an agent that does '
    "nothing would score 1.00; give it the calls that answer the request (a question's "
    "answer comes from a call's result: add the lookup that shows it)"
)

_ID_IN_TEXT = re.compile(r'"id"\s*:\s*"([^"]+)"')


# The fields a line, a turn and a call may have, for naming an unknown one's likely spelling.
_LINE_FIELDS = ("id", "family", "split", "state", "turns", "user", "calls", "answer")
_FIELDS_AT = {"turns": ("user", "calls"), "calls": ("name", "arguments", "id")}


def _where(loc: Sequence[str | int], shorthand: bool) -> list[str]:
    """A location as the line wrote it: ``turns[0]`` is the top level of a line that wrote
    ``user`` and ``calls`` there."""
    parts = [str(part) for part in loc]
    if shorthand and parts[:2] == ["turns", "0"]:
        parts = parts[2:]
    return parts


def _spelled(parts: Sequence[str]) -> str:
    return "".join(f"[{part}]" if part.isdigit() else f".{part}" for part in parts).lstrip(".")


def _validation_message(err: ValidationError, shorthand: bool) -> str:
    """Every unknown field by name, with its likely spelling (``unknown field 'famliy'
    (did you mean 'family'?)``), then the first other error and how many more follow."""
    errors = err.errors()
    unknown: list[str] = []
    suggested: set[tuple[str, ...]] = set()
    for error in sorted(
        (e for e in errors if e["type"] == "extra_forbidden"), key=lambda e: len(e["loc"])
    ):
        *parents, key = _where(error["loc"], shorthand)
        names = [part for part in parents if not part.isdigit()]
        known = _FIELDS_AT.get(names[-1], ()) if names else _LINE_FIELDS
        hint = difflib.get_close_matches(key, known, n=1)
        suggested |= {(*parents, hint[0])} if hint else set()
        where = f" in {_spelled(parents)}" if parents else ""
        guess = f"did you mean {hint[0]!r}?" if hint else f"known: {', '.join(known)}"
        unknown.append(f"unknown field {key!r}{where} ({guess})")
    # A field reported missing because it was misspelt is already named above.
    others = [
        e
        for e in errors
        if e["type"] != "extra_forbidden"
        and not (e["type"] == "missing" and tuple(_where(e["loc"], shorthand)) in suggested)
    ]
    parts = list(unknown)
    if others:
        first = others[0]
        more = f" (and {len(others) - 1} more)" if len(others) > 1 else ""
        parts.append(
            f"{_spelled(_where(first['loc'], shorthand)) or 'the line'}: {first['msg']}{more}"
        )
    return "; ".join(parts)


def read_task_file(path: str | Path, env: str) -> TaskFile:
    """Every task of a JSONL file, its tasks' ``env`` set to ``env``; bad lines become
    problems and the rest load. A file that cannot be read at all raises OSError."""
    path = Path(path)
    result = TaskFile(path)
    text = path.read_text(encoding="utf-8")
    for number, line in enumerate(jsonl_lines(text), start=1):
        if not line.strip() or line.lstrip().startswith("//"):
            continue
        guessed = _ID_IN_TEXT.search(line)
        task_id = guessed.group(1) if guessed else None
        try:
            data = json.loads(line)
        except json.JSONDecodeError as err:
            message = f"not valid JSON: {err.msg} at column {err.colno}"
            result.problems.append(TaskProblem(path, number, task_id, message))
            continue
        if isinstance(data, dict) and isinstance(data.get("id"), str):
            task_id = data["id"]
        try:
            task_line = TaskLine.model_validate(data)
        except ValidationError as err:
            shorthand = isinstance(data, dict) and "turns" not in data
            message = _validation_message(err, shorthand)
            result.problems.append(TaskProblem(path, number, task_id, message))
            continue
        if not any(turn.calls for turn in task_line.turns):
            result.problems.append(TaskProblem(path, number, task_line.id, NO_CALLS))
            continue
        if task_line.id in result.lines:
            first = result.lines[task_line.id]
            message = (
                f"duplicate id: lines {first} and {number} both have it; line {first}'s task "
                "is used, give this one an id of its own"
            )
            result.problems.append(TaskProblem(path, number, task_line.id, message))
            continue
        result.lines[task_line.id] = number
        if task_line.split is not None:
            result.named_splits.add(task_line.id)
        result.tasks.append(task_line.task(env))
    return result


def split_of(task_id: str, seed: int) -> str:
    """The split coevolve gives a task whose line names none, from its id and ``seed`` alone:
    a hash of the two, read as a number in [0, 1), falls in heldout's quarter, validation's
    quarter or train's half (``SPLIT_SHARES``). Adding, removing or fixing another line
    never moves a task, so figures before and after an edit of the file compare."""
    digest = hashlib.sha256(f"{seed}:{task_id}".encode()).digest()
    share = int.from_bytes(digest[:8], "big") / 2**64
    heldout = SPLIT_SHARES["heldout"]
    if share < heldout:
        return "heldout"
    return "validation" if share < heldout + SPLIT_SHARES["validation"] else "train"


def assign_splits(tasks: Sequence[Task], named: set[str], seed: int) -> list[Task]:
    """The tasks with every split not named in the file (ids not in ``named``) cut by
    coevolve, each by its own id (``split_of``). A family is not sure to have a task in
    each split; ``families_missing`` names those that have none."""
    return [
        task if task.id in named else task.model_copy(update={"split": split_of(task.id, seed)})
        for task in tasks
    ]


def families_missing(tasks: Sequence[Task], split: str) -> list[str]:
    """The families of ``tasks`` with no task in ``split``, sorted."""
    return sorted({task.family for task in tasks} - {t.family for t in tasks if t.split == split})
