"""What a tool call may cost: a time limit on each call, and how much of its observation the
agent sees.

Both are settings of the environment section (``env.tool_timeout_s``,
``env.max_observation_chars``, envs/config.py); loading a config makes them this
process's limits (``set_tool_limits``), and every path that runs a tool reads them at the
call: ``ToolEnvironment.step`` (rollouts, evaluation, ``env check``, the judge's and the
verifier's replays, diagnosis) and the rollout's tool messages (agents/policy/rollout.py).

A call runs in a daemon worker thread and is waited for ``timeout_s``
(``call_with_time_limit``; idle workers wait for the next call, so a call costs a hand-over,
not a thread's start): Python cannot stop a thread, so a call past the limit keeps running
out of sight, its worker with it, and its result, when it comes, is dropped. What the late call may still change is the
environment's to discard (``ToolEnvironment._recover_after_timeout``): a
``FunctionEnvironment`` rebuilds its state from the task's initial state and the episode's
earlier calls, so the late call mutates an object no one reads any more.

Why a thread and not a worker process: a tool's state lives in the process (a state
class instance the verifier, the diagnosis and offline synthesis read directly), and a
worker would have to own it and ship it back at every read; a thread costs a few tens of
microseconds a call (bench/tool_call_overhead.py) and needs nothing of the tool.
"""

from __future__ import annotations

import os
import queue
import threading
from collections.abc import Callable
from contextlib import contextmanager
from dataclasses import dataclass, replace
from typing import Any, TypeVar

_T = TypeVar("_T")

# A tool that calls a service may take a few seconds; one that takes ten has hung or is
# too slow to train on (each episode waits for it).
DEFAULT_TOOL_TIMEOUT_S = 10.0
# About a thousand tokens: a list of a few dozen rows, never a page of a database.
DEFAULT_MAX_OBSERVATION_CHARS = 4000

# The error kind of a call past the time limit (Observation.error).
TIMEOUT = "timeout"


@dataclass(frozen=True)
class ToolLimits:
    """The limits every tool call runs under."""

    timeout_s: float = DEFAULT_TOOL_TIMEOUT_S
    max_observation_chars: int = DEFAULT_MAX_OBSERVATION_CHARS


_limits = ToolLimits()


def tool_limits() -> ToolLimits:
    """This process's limits (the last loaded config's, else the defaults)."""
    return _limits


def set_tool_limits(limits: ToolLimits) -> ToolLimits:
    """Make ``limits`` this process's; returns the ones they replace."""
    global _limits
    previous, _limits = _limits, limits
    return previous


@contextmanager
def limits_set(**changes: Any):
    """This process's limits with ``changes`` for the ``with`` block (tests, benches)."""
    previous = set_tool_limits(replace(_limits, **changes))
    try:
        yield tool_limits()
    finally:
        set_tool_limits(previous)


class ToolTimeout(Exception):
    """A call that did not return within the limit; it may still be running."""

    def __init__(self, tool: str, timeout_s: float):
        super().__init__(
            f"{tool} did not return within the {timeout_s:g} s limit on a tool call "
            "(env.tool_timeout_s); its result is discarded"
        )
        self.tool = tool
        self.timeout_s = timeout_s


class _Job:
    """One call handed to a worker: what to run, its outcome, and the signal that it ended."""

    def __init__(self, call: Callable[[], Any]):
        self.call = call
        self.outcome: list[Any] = []  # [result] or [exception, None]
        self.done = threading.Event()

    def run(self) -> None:
        try:
            self.outcome.append(self.call())
        except BaseException as err:  # handed to the caller's thread, raised there
            self.outcome.extend((err, None))


class _Worker:
    """A daemon thread that runs tool calls one at a time. It is idle between calls (in
    ``_IDLE``); a call past the limit keeps it busy, out of the pool, until the call ends."""

    def __init__(self) -> None:
        self.inbox: queue.SimpleQueue[_Job] = queue.SimpleQueue()
        threading.Thread(target=self._serve, name="coevolve tool call", daemon=True).start()

    def _serve(self) -> None:
        while True:
            job = self.inbox.get()
            job.run()
            _IDLE.append(self)  # before done: the caller's next call finds it idle
            job.done.set()


# Idle workers (list.append and list.pop are atomic): starting a thread per call costs
# several times the handing over of a call to a waiting one.
_IDLE: list[_Worker] = []
# A forked child has none of its parent's threads: a worker it inherited would never answer.
os.register_at_fork(after_in_child=_IDLE.clear)


def call_with_time_limit(tool: str, call: Callable[[], _T], timeout_s: float) -> _T:
    """``call()``'s result or exception, or ToolTimeout when it has not returned after
    ``timeout_s`` seconds (the call then runs on in its daemon thread, which the process
    does not wait for at exit, and its result is dropped)."""
    try:
        worker = _IDLE.pop()
    except IndexError:
        worker = _Worker()
    job = _Job(call)
    worker.inbox.put(job)
    if not job.done.wait(timeout_s):
        raise ToolTimeout(tool, timeout_s)
    if len(job.outcome) == 2:
        raise job.outcome[0]
    return job.outcome[0]


def bound_tool_calls(env: Any) -> None:
    """Bound the calls of an environment that is not a ``ToolEnvironment`` (whose step bounds
    them itself) by replacing its ``step`` and ``reset`` on the instance. It cannot know what
    a late call may still change, so after one every later step of the episode is answered
    with a timeout error, until the next ``reset``."""
    from ..records import Observation

    step, reset = env.step, env.reset
    stopped: list[str] = []  # the late call's message, while its episode lasts

    def bounded_step(action: Any) -> Observation:
        name = getattr(action, "name", None) or "the tool call"
        if stopped:
            return Observation(text=f"error: {stopped[0]}", error=TIMEOUT)
        try:
            return call_with_time_limit(name, lambda: step(action), tool_limits().timeout_s)
        except ToolTimeout as err:
            stopped.append(stopped_message(err))
            return Observation(text=f"error: {err}", error=TIMEOUT)

    def fresh_reset(task: Any) -> Any:
        stopped.clear()
        return reset(task)

    env.step, env.reset = bounded_step, fresh_reset


def stopped_message(err: ToolTimeout) -> str:
    """Why the tools answer no more calls in an episode after ``err``."""
    return (
        f"the tools are stopped for the rest of this episode: {err.tool} did not return "
        f"within the {err.timeout_s:g} s limit and may still change the state"
    )
