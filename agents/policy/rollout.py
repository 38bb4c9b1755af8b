"""The rollout engine: K episodes per task, batched across episodes, scored by the verifier.

All live episodes advance in lockstep: at each step the policy gets every live
conversation in one ``generate`` call (one padded forward pass in-process, or
many requests in flight to an endpoint). A policy that says ``reports_each_reply``
(the endpoint policy) hands each reply over as it arrives, so its episode steps
its environment, and is verified if it ended, while the step's other requests
are still in flight. Each episode has its own fresh environment. A failure of
the policy for one conversation ends that episode with ``error`` set and keeps
everything it did so far; ``transport_failure`` marks one where the endpoint gave
no usable reply, which is not the agent's outcome.

It is the one episode loop: evaluation, the cycle's rollouts, hard negatives'
failure episodes and GRPO's multi-turn rollout and reference episodes
(``training/grpo/multiturn_rollout.py``, whose policy says ``continues_ids`` and
is handed each episode's last prompt and reply ids) all play here.
"""

from __future__ import annotations

import asyncio
import functools
import time
from collections.abc import Callable, Coroutine, Sequence
from dataclasses import dataclass, field
from typing import Any, ParamSpec, TypeVar

from ...common.errors import PROGRAMMING_ERRORS
from ...envs.base import Environment
from ...records import ModelTurn, Observation, Step, Task, Trajectory
from ..prompts import POLICY_SYSTEM_PROMPT
from .conversation import opening_messages, shown_observation
from .policy_interface import AssistantMessage, Message, Policy
from .rendering import turn_from_ids

_P = ParamSpec("_P")
_R = TypeVar("_R")


@dataclass
class _Episode:
    task: Task
    env: Environment
    rollout_index: int
    messages: list[Message] = field(default_factory=list)
    steps: list[Step] = field(default_factory=list)
    turn: int = 0
    calls: int = 0  # assistant messages with calls in the current user turn (steps)
    done: bool = False
    finished: bool = True
    error: str | None = None
    transport_failure: bool = False  # the endpoint gave no usable reply: not an outcome
    final_answer: str | None = None
    prompt_tokens: int = 0
    completion_tokens: int = 0
    model_turns: list[ModelTurn] = field(default_factory=list)
    last_ids: list[int] = field(default_factory=list)  # the last turn's prompt + completion
    score: float | None = None  # the verifier's, once the episode ended


def _record_ids(episode: _Episode, reply: AssistantMessage) -> None:
    """Keep the reply's token ids (when the policy gave them) as the next ``ModelTurn``."""
    if reply.prompt_token_ids is None or reply.completion_token_ids is None:
        return
    episode.model_turns.append(
        turn_from_ids(
            len(episode.messages),
            reply.prompt_token_ids,
            reply.completion_token_ids,
            reply.completion_logprobs,
            episode.last_ids,
        )
    )
    episode.last_ids = reply.prompt_token_ids + reply.completion_token_ids


def _apply(episode: _Episode, reply: AssistantMessage, max_tool_calls: int) -> None:
    """Advance one episode by one assistant message, by the rules of an episode: a message
    without calls answers the turn (``end_turn`` gives the next query, or ends the
    episode); a message with calls steps the environment, and the ``max_tool_calls``-th
    such message of a turn ends the episode unfinished."""
    episode.prompt_tokens += reply.prompt_tokens
    episode.completion_tokens += reply.completion_tokens
    # Ids a failed reply still carries were generated (a reply cut by a token budget):
    # they stay in the record, though the reply is not acted on.
    _record_ids(episode, reply)
    if reply.error is not None:
        episode.error, episode.finished, episode.done = reply.error, False, True
        episode.transport_failure = reply.transport_failure
        return
    episode.messages.append(reply.to_openai())
    if reply.is_final:
        query = episode.env.end_turn(reply.content)
        if query is not None:
            episode.messages.append({"role": "user", "content": query})
        episode.final_answer = reply.content
        episode.turn, episode.calls = episode.turn + 1, 0
        episode.done, episode.finished = query is None, True
        return
    steps, results = act(episode.env, reply, episode.turn)
    episode.steps.extend(steps)
    episode.messages.extend(results)
    # One step, however many calls it makes (BFCL's counting).
    bound = episode.calls + 1 >= max_tool_calls
    episode.calls += 1
    episode.done, episode.finished = bound, not bound


def _advance(episode: _Episode, reply: AssistantMessage, max_tool_calls: int) -> None:
    """``_apply``, then the verifier's score as soon as the episode ended."""
    _apply(episode, reply, max_tool_calls)
    if episode.done:
        score, failure = verify(episode.env)
        episode.score = min(max(score, 0.0), 1.0)
        episode.error = episode.error or failure


def act(env: Environment, reply: AssistantMessage, turn: int) -> tuple[list[Step], list[Message]]:
    """Step ``env`` with every call of ``reply``: the steps, and the tool messages that answer
    them (an unreadable call is answered with its error, as an observation). A message holds
    what the agent may see of its observation (``shown_observation``: cut past
    ``env.max_observation_chars``, and marked); the step keeps it whole for the verifier."""
    steps: list[Step] = []
    results: list[Message] = []
    for call in reply.tool_calls:
        observation = env.step(call)
        steps.append(Step(turn=turn, call=call, call_form=reply.call_form, observation=observation))
        shown = shown_observation(observation.text)
        results.append({"role": "tool", "tool_call_id": call.id or "call", "content": shown})
    for bad in reply.invalid_tool_calls:
        observation = Observation(text=f"error: {bad.message}", error=bad.error)
        steps.append(Step(turn=turn, raw=bad.raw, observation=observation))
        results.append({"role": "tool", "tool_call_id": bad.id, "content": observation.text})
    return steps, results


def verify(env: Environment) -> tuple[float, str | None]:
    """The verifier's score of a finished episode, and why it is 0 when the verifier failed."""
    try:
        return env.score(), None
    except PROGRAMMING_ERRORS:
        raise
    except Exception as err:  # a boundary: BFCL's checker (third-party) reruns the model's calls
        return 0.0, f"verifier failed: {type(err).__name__}: {err}"


def _trajectory(episode: _Episode, policy_version: str, cycle: int) -> Trajectory:
    assert episode.score is not None, "an episode is verified when it ends"
    return Trajectory(
        id=f"{episode.task.id}/c{cycle}/r{episode.rollout_index}",
        task_id=episode.task.id,
        env=episode.task.env,
        family=episode.task.family,
        messages=episode.messages,
        steps=episode.steps,
        final_answer=episode.final_answer,
        score=episode.score,
        prompt_tokens=episode.prompt_tokens,
        completion_tokens=episode.completion_tokens,
        policy_version=policy_version,
        rollout_index=episode.rollout_index,
        cycle=cycle,
        finished=episode.finished,
        error=episode.error,
        transport_failure=episode.transport_failure,
        model_turns=episode.model_turns,
    )


async def play_rollouts(
    policy: Policy,
    make_env: Callable[[], Environment],
    tasks: Sequence[Task],
    k: int = 1,
    temperature: float | None = None,
    max_tool_calls: int = 12,
    system_prompt: str | None = POLICY_SYSTEM_PROMPT,
    progress: bool = True,
    cycle: int = 0,
    description: str = "rollouts",
    openings: Sequence[Sequence[Message]] | None = None,
) -> list[Trajectory]:
    """Run ``k`` episodes of every task; return their trajectories in task order.

    ``max_tool_calls`` bounds the assistant messages that call tools (each with one
    or more calls) in one user turn; BFCL allows 20. ``openings`` (one per task)
    replaces the system prompt and first query an episode opens with (GRPO's dataset
    rows carry their own).
    """
    if k < 1:
        raise ValueError(f"k must be >= 1, got {k}")
    if max_tool_calls < 1:
        raise ValueError(f"max_tool_calls must be >= 1, got {max_tool_calls}")
    if openings is not None and len(openings) != len(tasks):
        raise ValueError(f"{len(openings)} openings for {len(tasks)} tasks")
    episodes = [
        _Episode(task=task, env=make_env(), rollout_index=i) for task in tasks for i in range(k)
    ]
    for index, episode in enumerate(episodes):
        query = episode.env.reset(episode.task)
        episode.messages = (
            opening_messages(query, system_prompt)
            if openings is None
            else [dict(message) for message in openings[index // k]]
        )
    needs_tasks = bool(getattr(policy, "needs_tasks", False))
    reports_each_reply = bool(getattr(policy, "reports_each_reply", False))
    # A policy that continues each episode on the ids it generated (GRPO's multi-turn
    # rollout) is given them: the last reply's prompt and reply ids.
    continues_ids = bool(getattr(policy, "continues_ids", False))

    # A policy that keeps each live episode's keys and values may bound how many play at
    # once; the next episode starts as one ends.
    window = getattr(policy, "max_live_episodes", None) or len(episodes)
    waiting = episodes[window:]
    bar = _ProgressBar(len(episodes), description, enabled=progress)
    with bar:
        live = episodes[:window]
        while live:
            extra: dict[str, Any] = {"tasks": [e.task for e in live]} if needs_tasks else {}
            if continues_ids:
                extra["previous_ids"] = [e.last_ids for e in live]
            advanced: set[int] = set()
            if reports_each_reply:
                extra["on_reply"] = _advancer(live, advanced, max_tool_calls)
            replies = await policy.generate(
                [e.messages for e in live], [e.env.tools() for e in live], temperature, **extra
            )
            if len(replies) != len(live):
                raise RuntimeError(
                    f"policy returned {len(replies)} messages for {len(live)} conversations"
                )
            for index, (episode, reply) in enumerate(zip(live, replies, strict=True)):
                if index not in advanced:
                    _advance(episode, reply, max_tool_calls)
            still_live = [e for e in live if not e.done]
            bar.advance(len(live) - len(still_live), sum(r.completion_tokens for r in replies))
            room = window - len(still_live)
            live = still_live + waiting[:room]
            waiting = waiting[room:]
    # Keys and values kept for the next step are of no use once every episode ended.
    release = getattr(policy, "release_cache", None)
    if callable(release):
        release()
    version = policy.version
    return [_trajectory(e, version, cycle) for e in episodes]


def _advancer(
    live: list[_Episode], advanced: set[int], max_tool_calls: int
) -> Callable[[int, AssistantMessage], None]:
    """The ``on_reply`` of one step: advance ``live[index]`` by its reply, once."""

    def on_reply(index: int, reply: AssistantMessage) -> None:
        if index not in advanced:
            advanced.add(index)
            _advance(live[index], reply, max_tool_calls)

    return on_reply


def _synchronous(
    coroutine_function: Callable[_P, Coroutine[Any, Any, _R]],
) -> Callable[_P, _R]:
    """``coroutine_function`` run to completion in a new event loop, with its signature
    kept, so a type checker sees the arguments a caller passes through."""

    @functools.wraps(coroutine_function)
    def run(*args: _P.args, **kwargs: _P.kwargs) -> _R:
        return asyncio.run(coroutine_function(*args, **kwargs))

    return run


run_rollouts = _synchronous(play_rollouts)
"""Synchronous ``play_rollouts`` for scripts and the CLI (inside an event loop, await
``play_rollouts``)."""


class _ProgressBar:
    """Episodes done, with generated tokens/s: the two numbers a person watches."""

    def __init__(self, total: int, description: str, enabled: bool):
        self.enabled = enabled and total > 0
        self.tokens = 0
        self.started = time.perf_counter()
        if self.enabled:
            from rich.progress import (
                BarColumn,
                MofNCompleteColumn,
                Progress,
                TextColumn,
                TimeElapsedColumn,
            )

            self.progress = Progress(
                TextColumn("{task.description}"),
                BarColumn(),
                MofNCompleteColumn(),
                TimeElapsedColumn(),
                TextColumn("{task.fields[rate]}"),
                transient=True,
            )
            self.task_id = self.progress.add_task(description, total=total, rate="")

    def __enter__(self) -> _ProgressBar:
        if self.enabled:
            self.progress.start()
        return self

    def __exit__(self, *exc: object) -> None:
        if self.enabled:
            self.progress.stop()

    def advance(self, episodes: int, tokens: int) -> None:
        if not self.enabled:
            return
        self.tokens += tokens
        rate = self.tokens / max(time.perf_counter() - self.started, 1e-9)
        self.progress.update(self.task_id, advance=episodes, rate=f"{rate:,.0f} tok/s")
