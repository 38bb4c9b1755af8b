"""The diagnosis of a user's environment (SEAL-style labels, graded progress, a failure's
grade), derived from replaying each task's reference beside the episode."""

from __future__ import annotations

from collections.abc import Callable, Sequence

from ..records import Task, ToolCall, Trajectory, is_success
from .base import Environment
from .diagnosis import (
    PASS,
    STATE_MISMATCH,
    _changed,
    _common_calls,
    _flatten,
    _key,
    graded_progress,
    outcome_label,
    step_error_label,
)
from .function_tools import FunctionEnvironment
from .parsing import UNREADABLE_CALL

# Error kinds of a call that was never a valid attempt at a tool.
_INVALID = frozenset({"parse_error", "bad_json", UNREADABLE_CALL, "unknown_tool", "episode_over"})


def diagnose(
    make_env: Callable[[], Environment], task: Task, trajectory: Trajectory
) -> tuple[list[str], float]:
    """SEAL-style labels, one per step plus an outcome label, and graded progress, from a
    replay of the reference next to the episode: the world's rules (coevolve.envs.diagnosis)
    without its grouping of tools into apps. An environment that cannot report its state
    (not a FunctionEnvironment) gets labels from error kinds and its score only."""
    env = make_env()
    steps = trajectory.steps
    planned = {(call.name, _key(call.arguments)) for call in task.reference_calls}
    if not isinstance(env, FunctionEnvironment):
        labels = [
            step_error_label(step, steps[i + 1 :], planned, _INVALID) or PASS
            for i, step in enumerate(steps)
        ]
        solved = is_success(trajectory.score)
        outcome = outcome_label(task, steps, trajectory.final_answer, solved)
        return [*labels, outcome], 1.0 if solved else 0.0
    touched = _touched(env, task)
    expected = env.replay_state(task.setup.get("state", {}), task.reference_calls)
    env.reset(task)
    labels = []
    for index, step in enumerate(steps):
        label = step_error_label(step, steps[index + 1 :], planned, _INVALID)
        if label is None:  # a successful call: run it, and see what it changed
            assert step.call is not None
            before = _flatten(env.current_state())
            env.step(step.call)
            changed = _changed(before, _flatten(env.current_state()))
            label = STATE_MISMATCH if changed - touched else PASS
        labels.append(label)
    outcome = outcome_label(task, steps, trajectory.final_answer, env.current_state() == expected)
    return [*labels, outcome], _progress(env, task, trajectory, calls=None)


def _touched(env: FunctionEnvironment, task: Task) -> set[tuple[str, ...]]:
    """Every unit of state the reference changes on its way, intermediate changes included."""
    env.reset(task)
    touched: set[tuple[str, ...]] = set()
    before = _flatten(env.current_state())
    for call in task.reference_calls:
        env.step(call)
        after = _flatten(env.current_state())
        touched |= _changed(before, after)
        before = after
    return touched


def _progress(
    env: Environment, task: Task, trajectory: Trajectory, calls: Sequence[ToolCall] | None
) -> float:
    """The fraction of expected units achieved: each unit of state the reference changes,
    the answer when one is expected, and with ``calls`` each reference call made in order
    (as the world's ``world_progress``); 1.0 exactly when the outcome is right."""
    if not isinstance(env, FunctionEnvironment):  # no state: the score and the calls grade it
        if is_success(trajectory.score):
            return 1.0
        if calls is None or not task.reference_calls:
            return 0.0
        return _common_calls(task.reference_calls, calls) / (len(task.reference_calls) + 1)
    initial = task.setup.get("state", {})
    made = [s.call for s in trajectory.steps if s.call is not None and s.observation.error is None]
    start = _flatten(env.replay_state(initial, []))
    expected = _flatten(env.replay_state(initial, task.reference_calls))
    final = _flatten(env.replay_state(initial, made))
    return graded_progress(task, start, expected, final, trajectory.final_answer, calls)


def failure_grade(make_env: Callable[[], Environment], task: Task, trajectory: Trajectory) -> float:
    """How close an episode came: progress with the reference's calls made in order counted
    as units too, so "looked the order up, then refunded the wrong one" grades above
    "called nothing useful" (as the world grades failures)."""
    return _progress(make_env(), task, trajectory, calls=trajectory.calls)
