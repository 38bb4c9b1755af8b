"""A reply function for the scripted test server that plays a task's reference solution.

``reference_replies(tasks)`` answers each chat completion with the next
reference call of the task whose user message it recognises (by the text of
the latest user turn), then the task's answer; unknown requests get "Done.".
``wrong(task_id)`` picks tasks whose last call gets a corrupted argument, so a
run has failures too; ``call_form`` is how it writes its calls (``call_reply``:
the server's tool_calls field, or in the text as a model without the server's
tool parser writes them). The answers depend only on the conversation, so runs
against it are reproducible: a stand-in for a model behind an endpoint when
testing the endpoint path end to end (HTTP, tool calling, scoring).
"""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from typing import Any

from ..agents.policy.policy_interface import AssistantMessage
from ..envs.parsing import render_call
from ..records import CallForm, Task, ToolCall
from .openai_server import Reply


def call_reply(call: ToolCall, form: CallForm = "tool_calls_field") -> Reply:
    """A reply making ``call``, written in ``form``: the server's tool_calls field, a
    ``<tool_call>`` tag, a JSON object alone or in a ```json fence, or a call line."""
    if form == "tool_calls_field":
        return Reply.tool_calls([(call.name, call.arguments)])
    if form == "call_line":
        return Reply.text(render_call(call))
    written = json.dumps({"name": call.name, "arguments": call.arguments}, ensure_ascii=False)
    if form == "tool_call_tag":
        return Reply.text(f"<tool_call>\n{written}\n</tool_call>")
    if form == "fenced_json":
        return Reply.text(f"```json\n{written}\n```")
    return Reply.text(written)


def reference_replies(
    tasks: Sequence[Task],
    wrong: Callable[[str], bool] = lambda task_id: False,
    call_form: CallForm = "tool_calls_field",
) -> Callable[[dict[str, Any]], Reply]:
    by_query = {turn.query: (task, i) for task in tasks for i, turn in enumerate(task.turns)}

    def reply(body: dict[str, Any]) -> Reply:
        messages = body["messages"]
        users = [i for i, m in enumerate(messages) if m["role"] == "user"]
        if not users:
            return Reply.text("Done.")
        last_user = users[-1]
        found = by_query.get(messages[last_user]["content"])
        if found is None:
            return Reply.text("Done.")
        task, turn = found
        made = sum(1 for m in messages[last_user + 1 :] if m["role"] == "assistant")
        calls = task.turns[turn].reference_calls
        if made < len(calls):
            call = calls[made]
            arguments = dict(call.arguments)
            if wrong(task.id) and made == len(calls) - 1:
                key = next((k for k, v in arguments.items() if isinstance(v, str)), None)
                if key is not None:
                    arguments[key] = arguments[key] + "x"
            return call_reply(ToolCall(name=call.name, arguments=arguments), call_form)
        last = turn == len(task.turns) - 1
        return Reply.text(task.reference_answer if last and task.reference_answer else "Done.")

    return reply


class HalfRightPolicy:
    """An in-process policy for tests: plays the reference in half the episodes and stops
    one call early in the others, so the K rollouts of a task disagree (a boundary signal)."""

    version = "half-right"
    needs_tasks = True

    def __init__(self) -> None:
        self.parity: dict[int, bool] = {}  # the engine keeps one message list per episode

    async def generate(
        self,
        conversations: Sequence[Sequence[dict[str, Any]]],
        tools: Sequence[Sequence[dict[str, Any]]],
        temperature: float | None = None,
        tasks: Sequence[Task] | None = None,
    ) -> list[AssistantMessage]:
        assert tasks is not None, "the engine hands needs_tasks policies their tasks"
        replies = []
        for conversation, task in zip(conversations, tasks, strict=True):
            done = sum(m["role"] == "tool" for m in conversation)
            reference = task.reference_calls
            right = self.parity.setdefault(id(conversation), len(self.parity) % 2 == 0)
            if done < len(reference) and (right or done < len(reference) - 1):
                call = reference[done].model_copy(update={"id": f"c{done}"})
                replies.append(AssistantMessage(tool_calls=[call]))
            else:
                replies.append(AssistantMessage(content=task.reference_answer or "Done."))
        return replies

    async def aclose(self) -> None:
        pass
