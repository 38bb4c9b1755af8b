"""Training data from a cycle's records: verified conversations, demonstrations, preference pairs.

Everything here is plain messages (OpenAI format, tool-call arguments as JSON
strings): the trainers turn them into token ids or rendered text, so Arrow
never sees argument dicts (it would merge differently-keyed dicts into
null-filled structs).
"""

from __future__ import annotations

import json
import logging
from collections import defaultdict
from collections.abc import Callable, Sequence
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict

from ..agents.policy.conversation import reference_conversation
from ..agents.policy.policy_interface import Message
from ..agents.prompts import POLICY_SYSTEM_PROMPT
from ..envs.base import TASK_ERRORS, Environment
from ..records import ModelTurn, Task, Trajectory, is_success

logger = logging.getLogger(__name__)


class ReplayError(RuntimeError):
    """Every item of a batch raised while being replayed: the step has nothing to learn from,
    which is a broken environment or task set, not a batch of failed tasks."""


def every_item_failed(what: str, total: int, first: str) -> ReplayError:
    """The error for a batch of ``total`` items that all raised, naming the first failure."""
    return ReplayError(
        f"every one of the {total} {what} raised, so there is nothing to train on; the "
        f"first: {first}"
    )


def json_arguments(messages: Sequence[Message]) -> list[Message]:
    """Copies of the messages with every tool-call argument a JSON string (the OpenAI form)."""
    out = []
    for message in messages:
        message = dict(message)
        if message.get("tool_calls"):
            calls = []
            for call in message["tool_calls"]:
                function = dict(call.get("function", {}))
                if not isinstance(function.get("arguments", ""), str):
                    function["arguments"] = json.dumps(function["arguments"], ensure_ascii=False)
                calls.append({**call, "function": function})
            message["tool_calls"] = calls
        out.append(message)
    return out


def split_opening(messages: Sequence[Message]) -> tuple[list[Message], list[Message]]:
    """(system and first user message, everything after): the prompt and the model's part."""
    for index, message in enumerate(messages):
        if message.get("role") == "user":
            return list(messages[: index + 1]), list(messages[index + 1 :])
    return [], list(messages)


def _usable(trajectory: Trajectory) -> bool:
    """A complete episode whose conversation has an assistant turn after the request."""
    if trajectory.error is not None or not trajectory.finished:
        return False
    opening, rest = split_opening(trajectory.messages)
    return bool(opening) and any(message.get("role") == "assistant" for message in rest)


def _key(messages: Sequence[Message]) -> str:
    return json.dumps(json_arguments(messages), sort_keys=True, ensure_ascii=False)


# Where a training row came from: a seed task's or a synthesized task's reference solution
# (its demonstration, or for GRPO its prompt), or the cycle's rollouts (a verified success,
# or a preference pair). A bench unit counts its rows by source: how much of what an arm
# learned from is the seed set, not what its synthesis added.
TrainingSource = Literal["seed", "synthesized", "rollout"]
TRAINING_SOURCES: tuple[TrainingSource, ...] = ("seed", "synthesized", "rollout")


class TrainingConversation(BaseModel):
    """One SFT example: a conversation, the tools its prompt carries, where it came from
    and, when it is a rollout whose policy gave token ids, those ids (trained on instead of
    a re-tokenisation)."""

    model_config = ConfigDict(extra="forbid")

    messages: list[dict[str, Any]]
    tools: list[dict[str, Any]] | None = None
    model_turns: list[ModelTurn] = []
    source: TrainingSource | None = None  # None: made outside a cycle's train stage


def successful_conversations(
    trajectories: Sequence[Trajectory], max_per_task: int, min_score: float = 1.0
) -> list[list[Message]]:
    """The messages of ``successful_trajectories``."""
    return [
        json_arguments(t.messages)
        for t in successful_trajectories(trajectories, max_per_task, min_score)
    ]


def successful_trajectories(
    trajectories: Sequence[Trajectory], max_per_task: int, min_score: float = 1.0
) -> list[Trajectory]:
    """Rejection sampling: verified successes (score >= ``min_score``), at most ``max_per_task`` each.

    Identical conversations of a task count once; shorter ones (fewer messages)
    are preferred, then the order given. Unfinished or errored episodes never count.
    """
    if max_per_task < 1:
        raise ValueError(f"max_per_task must be >= 1, got {max_per_task}")
    by_task: dict[str, list[Trajectory]] = defaultdict(list)
    for trajectory in trajectories:
        if trajectory.score >= min_score and _usable(trajectory):
            by_task[trajectory.task_id].append(trajectory)
    kept = []
    for task_trajectories in by_task.values():
        shortest_first = sorted(task_trajectories, key=lambda t: len(t.messages))
        kept.extend(_distinct(shortest_first)[:max_per_task])
    return kept


def demonstrations(
    tasks: Sequence[Task],
    make_env: Callable[[], Environment],
    system_prompt: str | None = POLICY_SYSTEM_PROMPT,
) -> list[list[Message]]:
    """Each task's reference solution replayed as a conversation, kept only when it verifies.

    A task whose replay fails (score < 1, or the environment raised) is left out
    and logged: a synthesized task with a broken reference must not teach.
    """
    return [messages for _, messages in demonstrations_by_task(tasks, make_env, system_prompt)]


def demonstrations_by_task(
    tasks: Sequence[Task],
    make_env: Callable[[], Environment],
    system_prompt: str | None = POLICY_SYSTEM_PROMPT,
) -> list[tuple[Task, list[Message]]]:
    """``demonstrations``, each with the task it demonstrates."""
    conversations = []
    crashed: list[str] = []
    for task in tasks:
        try:
            messages, score = reference_conversation(make_env(), task, system_prompt)
        except TASK_ERRORS as err:  # one broken task must not end the cycle
            crashed.append(f"{task.id}: {type(err).__name__}: {err}")
            logger.warning("demonstration of %s", crashed[-1])
            continue
        if is_success(score):
            conversations.append((task, messages))
        else:
            logger.info(
                "demonstration of %s does not verify (score %.2f); left out", task.id, score
            )
    if tasks and len(crashed) == len(tasks):
        raise every_item_failed("reference replays", len(tasks), crashed[0])
    return conversations


class PreferencePair(BaseModel):
    """A successful and a failed episode of one task, split after the shared opening."""

    model_config = ConfigDict(extra="forbid")

    task_id: str
    prompt: list[dict[str, Any]]
    chosen: list[dict[str, Any]]
    rejected: list[dict[str, Any]]
    tools: list[dict[str, Any]] | None = None
    chosen_turns: list[ModelTurn] = []
    rejected_turns: list[ModelTurn] = []


def preference_pairs(
    trajectories: Sequence[Trajectory],
    max_per_task: int,
    min_success: float = 1.0,
    max_failure: float = 0.5,
) -> list[PreferencePair]:
    """(success, failure) pairs of the same task for DPO.

    Successes score >= ``min_success``, failures < ``max_failure``; both must be
    finished episodes with the same opening (system prompt and request). Distinct
    successes and failures are paired in order (shortest success first, lowest
    failure first), each used at most once, up to ``max_per_task`` pairs per task.
    """
    if max_per_task < 1:
        raise ValueError(f"max_per_task must be >= 1, got {max_per_task}")
    if max_failure > min_success:
        raise ValueError(
            f"max_failure ({max_failure}) must not exceed min_success ({min_success}): "
            "an episode would be both chosen and rejected"
        )
    by_task: dict[str, list[Trajectory]] = defaultdict(list)
    for trajectory in trajectories:
        if _usable(trajectory):
            by_task[trajectory.task_id].append(trajectory)
    pairs = []
    for task_id, task_trajectories in by_task.items():
        successes = _distinct(
            sorted(
                (t for t in task_trajectories if t.score >= min_success),
                key=lambda t: len(t.messages),
            )
        )
        failures = _distinct(
            sorted((t for t in task_trajectories if t.score < max_failure), key=lambda t: t.score)
        )
        used: set[int] = set()
        for success in successes:
            if len(used) >= max_per_task:
                break
            opening, chosen = split_opening(json_arguments(success.messages))
            for index, failure in enumerate(failures):
                if index in used:
                    continue
                failure_opening, rejected = split_opening(json_arguments(failure.messages))
                if failure_opening != opening:
                    continue
                used.add(index)
                pairs.append(
                    PreferencePair(
                        task_id=task_id,
                        prompt=opening,
                        chosen=chosen,
                        rejected=rejected,
                        chosen_turns=success.model_turns,
                        rejected_turns=failure.model_turns,
                    )
                )
                break
    return pairs


def _distinct(trajectories: Sequence[Trajectory]) -> list[Trajectory]:
    seen: set[str] = set()
    out = []
    for trajectory in trajectories:
        key = _key(trajectory.messages)
        if key not in seen:
            seen.add(key)
            out.append(trajectory)
    return out
