"""The oracle policy: replays each task's reference solution through the rollout engine.

It is a self-check of the harness (conversation handling, environment, verifier,
evaluation): `coevolve eval --policy oracle` must report 100%.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from ...records import Task
from .conversation import DONE_ANSWER, final_answer
from .policy_interface import AssistantMessage, Message

PARALLEL_STEPS = 10


class OraclePolicy:
    """Knows the task of each conversation (``needs_tasks``) and plays its reference."""

    version = "oracle"
    needs_tasks = True

    async def generate(
        self,
        conversations: Sequence[Sequence[Message]],
        tools: Sequence[Sequence[dict[str, Any]]],
        temperature: float | None = None,
        tasks: Sequence[Task] | None = None,
    ) -> list[AssistantMessage]:
        if tasks is None or len(tasks) != len(conversations):
            raise ValueError("the oracle needs the task of every conversation")
        return [
            self._next(task, conversation)
            for task, conversation in zip(tasks, conversations, strict=True)
        ]

    @staticmethod
    def _next(task: Task, conversation: Sequence[Message]) -> AssistantMessage:
        turn = sum(m["role"] == "user" for m in conversation) - 1
        last_user = max(i for i, m in enumerate(conversation) if m["role"] == "user")
        done_calls = sum(m["role"] == "tool" for m in conversation[last_user:])
        reference = task.turns[turn].reference_calls
        if done_calls < len(reference):
            # One call per message, except in turns longer than any step limit (BFCL's
            # long-context turns reach 34 calls): those go out as parallel calls, at most
            # PARALLEL_STEPS messages per turn, as a model within BFCL's 20 steps would.
            per_message = max(1, -(-len(reference) // PARALLEL_STEPS))
            calls = reference[done_calls : done_calls + per_message]
            return AssistantMessage(
                tool_calls=[
                    call.model_copy(update={"id": f"call_{turn}_{done_calls + i}"})
                    for i, call in enumerate(calls)
                ]
            )
        is_last = turn == len(task.turns) - 1
        return AssistantMessage(content=final_answer(task) if is_last else DONE_ANSWER)

    async def aclose(self) -> None:
        return None
