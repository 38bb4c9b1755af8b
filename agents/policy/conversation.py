"""Conversations from tasks: the opening messages, and reference demonstrations."""

from __future__ import annotations

import re

from ...envs.base import Environment, replay_reference
from ...envs.limits import tool_limits
from ...records import Task, Trajectory
from ..prompts import POLICY_SYSTEM_PROMPT
from .policy_interface import Message, tool_call_message

DONE_ANSWER = "Done."

# How a cut observation ends in the agent's conversation; the count is what it does not see.
_CUT_MARK = re.compile(r"… \[cut: (\d+) more characters\]\Z")


def shown_observation(text: str, limit: int | None = None) -> str:
    """What the agent sees of an observation: its first ``limit`` characters (default
    ``env.max_observation_chars``), marked when cut (``… [cut: N more characters]``). A
    step keeps the whole text: the verifier and the replays read that."""
    limit = tool_limits().max_observation_chars if limit is None else limit
    if len(text) <= limit:
        return text
    return f"{text[:limit]}… [cut: {len(text) - limit} more characters]"


def observations_cut(trajectory: Trajectory) -> int:
    """How many of the episode's observations reached the agent cut (its tool messages
    that end with the cut mark)."""
    return sum(
        message.get("role") == "tool"
        and _CUT_MARK.search(str(message.get("content") or "")) is not None
        for message in trajectory.messages
    )


def opening_messages(query: str, system_prompt: str | None = POLICY_SYSTEM_PROMPT) -> list[Message]:
    messages: list[Message] = (
        [{"role": "system", "content": system_prompt}] if system_prompt else []
    )
    messages.append({"role": "user", "content": query})
    return messages


def final_answer(task: Task) -> str:
    """What a demonstration answers at the end: the asked-for value, or a short confirmation."""
    return task.reference_answer if task.reference_answer is not None else DONE_ANSWER


def reference_conversation(
    env: Environment, task: Task, system_prompt: str | None = POLICY_SYSTEM_PROMPT
) -> tuple[list[Message], float]:
    """Replay the reference solution and record it as a conversation, one call per message.

    Returns the messages and the verifier's score, so a caller can keep only
    demonstrations that verify.
    """
    answers = [DONE_ANSWER] * (len(task.turns) - 1) + [final_answer(task)]
    score, steps = replay_reference(env, task, answers=answers)
    messages = opening_messages(task.turns[0].query, system_prompt)
    for index, turn in enumerate(task.turns):
        if index > 0:
            messages.append({"role": "user", "content": turn.query})
        observations = [step.observation for step in steps if step.turn == index]
        for number, (call, observation) in enumerate(
            zip(turn.reference_calls, observations, strict=True)
        ):
            call_id = f"call_{index}_{number}"
            messages.append(
                {
                    "role": "assistant",
                    "content": "",
                    "tool_calls": [tool_call_message(call, call_id)],
                }
            )
            # A demonstration shows what an episode shows the agent.
            shown = shown_observation(observation.text)
            messages.append({"role": "tool", "tool_call_id": call_id, "content": shown})
        messages.append({"role": "assistant", "content": answers[index]})
    return messages, score
