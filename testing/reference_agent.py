"""A reply function for the scripted test server that plays a task's reference solution.

``reference_replies(tasks)`` answers each chat completion with the next
reference call of the task whose user message it recognises (by the text of
the latest user turn), then the task's answer; unknown requests get "Done.".
``wrong(task_id)`` picks tasks whose last call gets a corrupted argument, so a
run has failures too. The answers depend only on the conversation, so runs
against it are reproducible: a stand-in for a model behind an endpoint when
testing the endpoint path end to end (HTTP, tool calling, scoring).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from ..records import Task
from .openai_server import Reply


def reference_replies(
    tasks: Sequence[Task], wrong: Callable[[str], bool] = lambda task_id: False
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
            return Reply.tool_calls([(call.name, arguments)])
        last = turn == len(task.turns) - 1
        return Reply.text(task.reference_answer if last and task.reference_answer else "Done.")

    return reply
