"""The world's part of SEAL's diagnosis: its step and outcome labels (``diagnose_world``)
and its graded progress (``world_progress``), as ``coevolve.envs.diagnosis`` describes them.

Beside the world's verifier and apps, which it replays; the labels and the rules every
environment shares stay in ``envs/diagnosis.py``, which knows nothing of the world.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from ...records import Step, Task, ToolCall
from ..diagnosis import (
    INSTANCE_MISMATCH,
    PASS,
    STATE_MISMATCH,
    _changed,
    _flatten,
    _key,
    graded_progress,
    outcome_label,
    step_error_label,
)


def world_progress(
    task: Task,
    final_state: Mapping[str, Any],
    answer: str | None,
    calls: Sequence[ToolCall] | None = None,
) -> float:
    """The fraction of expected units the episode achieved: the reference's state changes
    and the asked-for answer, and with ``calls`` (the episode's tool calls, failed ones
    included: ``Trajectory.calls``) the reference's calls repeated in order too (module
    docstring)."""
    from .verifier import comparable_view, replay

    initial = task.setup["state"]
    check = task.setup.get("check", {})
    start = _flatten(comparable_view(initial, initial, check))
    expected = _flatten(comparable_view(replay(initial, task.reference_calls), initial, check))
    final = _flatten(comparable_view(dict(final_state), initial, check))
    return graded_progress(task, start, expected, final, answer, calls)


def world_final_state(task: Task, steps: Sequence[Step]) -> dict[str, Any]:
    """The state a trajectory's successful calls leave (the world is deterministic)."""
    from .verifier import replay

    calls = [
        step.call for step in steps if step.call is not None and step.observation.error is None
    ]
    return replay(task.setup["state"], calls)


def diagnose_world(task: Task, steps: Sequence[Step], answer: str | None) -> list[str]:
    """One label per step plus one outcome label (module docstring)."""
    from .apps import APPS, World
    from .verifier import REPLAY_ERRORS, clone, comparable_view, replay

    app_of = {tool: app for app, tools in APPS.items() for tool in tools}
    initial = task.setup["state"]
    check = task.setup.get("check", {})

    def units(state: Mapping[str, Any]) -> dict[tuple[str, ...], Any]:
        return _flatten(comparable_view(dict(state), initial, check))

    # Everything the reference touches on its way, intermediate changes included.
    reference_world = World(clone(initial))
    touched: set[tuple[str, ...]] = set()
    for call in task.reference_calls:
        before = units(reference_world.state)
        try:
            reference_world.run(call.name, dict(call.arguments))
        except REPLAY_ERRORS:  # a planned failure changes nothing, as in verifier.replay
            continue
        touched |= _changed(before, units(reference_world.state))
    reference_apps = {app_of.get(call.name) for call in task.reference_calls}
    reference_keys = {(call.name, _key(call.arguments)) for call in task.reference_calls}

    labels: list[str] = []
    world = World(clone(initial))
    for index, step in enumerate(steps):
        label = step_error_label(step, steps[index + 1 :], reference_keys)
        if label is None:  # a successful call: run it, and see what it changed
            assert step.call is not None
            before = units(world.state)
            _run_quietly(world, step)
            if app_of.get(step.call.name) not in reference_apps:
                label = INSTANCE_MISMATCH
            else:
                label = STATE_MISMATCH if _changed(before, units(world.state)) - touched else PASS
        labels.append(label)
    expected = replay(initial, task.reference_calls)
    state_right = comparable_view(world.state, initial, check) == comparable_view(
        expected, initial, check
    )
    return [*labels, outcome_label(task, steps, answer, state_right)]


def _run_quietly(world: Any, step: Step) -> None:
    from .verifier import REPLAY_ERRORS

    assert step.call is not None
    try:
        world.run(step.call.name, dict(step.call.arguments))
    except REPLAY_ERRORS:  # it succeeded in the episode; a replay difference changes nothing
        pass
