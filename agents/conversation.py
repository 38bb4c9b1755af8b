"""Conversations from tasks: the opening messages, and reference demonstrations."""

from __future__ import annotations

from ..envs.base import Environment
from ..records import Task
from .policy import Message, tool_call_message
from .prompts import POLICY_SYSTEM_PROMPT

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
    query: str | None = env.reset(task)
    messages = opening_messages(query or "", system_prompt)
    for index, turn in enumerate(task.turns):
        for number, call in enumerate(turn.reference_calls):
            call_id = f"call_{index}_{number}"
            observation = env.step(call)
            messages.append(
                {
                    "role": "assistant",
                    "content": "",
                    "tool_calls": [tool_call_message(call, call_id)],
                }
            )
            messages.append({"role": "tool", "tool_call_id": call_id, "content": observation.text})
        is_last = index == len(task.turns) - 1
        answer = final_answer(task) if is_last else DONE_ANSWER
        messages.append({"role": "assistant", "content": answer})
        query = env.end_turn(answer)
        if query is not None:
            messages.append({"role": "user", "content": query})
    return messages, env.score()
