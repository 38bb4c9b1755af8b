"""The world's verifier and what it is built from, shared with the diagnosis.

Replaying calls on a copy of a state (``replay``), the parts of a state the
verifier compares, free text normalised (``comparable_view``), and the verifier
itself (``verify``). ``coevolve.envs.diagnosis`` grades progress and labels
steps with the same pieces. The text rules (``answer_matches``,
``normalize_text``) are in ``coevolve.envs.base``: the judge uses them too.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import orjson

from ...records import Task, ToolCall
from ..base import ToolError, answer_matches, normalize_text
from .app_state import State
from .apps import World


def clone(state: Any) -> Any:
    """A deep copy of JSON-able state, as a JSON round trip makes it (keys become strings,
    tuples lists). orjson's round trip is about 6x the standard library's, which is several
    times faster than copy.deepcopy: every episode, replay and grade copies states."""
    return orjson.loads(orjson.dumps(state, option=orjson.OPT_NON_STR_KEYS))


# How a recorded call fails when replayed without the dispatcher's schema check: a domain
# error (ToolError), arguments the method does not take (TypeError), a missing item.
REPLAY_ERRORS = (ToolError, TypeError, KeyError, ValueError)


def replay(state: State, calls: Sequence[ToolCall]) -> State:
    """Apply calls to a copy of ``state``; failing calls change nothing, as in an episode."""
    world = World(clone(state))
    for tool_call in calls:
        try:
            world.run(tool_call.name, dict(tool_call.arguments))
        except REPLAY_ERRORS:
            pass
    return world.state


def comparable_view(state: State, initial: State, check: Mapping[str, Any]) -> dict[str, Any]:
    """The parts of a state the verifier compares, with free text normalised."""
    ignore = set(check.get("ignore", ()))
    must_contain = [normalize_text(text) for text in check.get("message_must_contain", ())]
    view: dict[str, Any] = {}
    for key, value in state.items():
        if key in ignore or key == "next_id":
            continue
        value = clone(value)
        if key == "messages":
            for message_id, message in value.items():
                text = normalize_text(message["text"])
                is_new = message_id not in initial["messages"]
                if is_new and must_contain and all(part in text for part in must_contain):
                    text = "<contains required values>"
                message["text"] = text
        elif key in ("notes", "events", "reminders", "contacts"):
            for item in value.values():
                for field in ("title", "body", "text", "name"):
                    if field in item:
                        item[field] = normalize_text(item[field])
        view[key] = value
    return view


def verify(task: Task, final_state: State, answer: str | None) -> float:
    """Executable checker: the final state matches the reference's, and the answer is right.

    The expected state comes from replaying the reference solution on the task's
    initial state, so any task with a valid reference (seed or synthesized) can
    be checked; ``setup["check"]`` relaxes what the task leaves to the agent.
    """
    initial = task.setup["state"]
    check = task.setup.get("check", {})
    expected = replay(initial, task.reference_calls)
    if comparable_view(final_state, initial, check) != comparable_view(expected, initial, check):
        return 0.0
    if task.reference_answer is not None and not answer_matches(answer, task.reference_answer):
        return 0.0
    return 1.0
