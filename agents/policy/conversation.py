"""Conversations from tasks: the opening messages, and reference demonstrations."""

from __future__ import annotations

from ...envs.base import Environment, replay_reference
from ...records import Task
from ..prompts import POLICY_SYSTEM_PROMPT
from .policy_interface import Message, tool_call_message

DONE_ANSWER = "Done."


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
            messages.append({"role": "tool", "tool_call_id": call_id, "content": observation.text})
        messages.append({"role": "assistant", "content": answers[index]})
    return messages, score
