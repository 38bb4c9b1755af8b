"""Replies of a sane synthesis model, for the scripted test server: every role on one server.

``role_reply(body)`` answers a synthesis role's request, told apart by its system
prompt, the way a cooperative model would: a summary, an exploration that lists
the contacts and stops, one look-up task for the first contact it saw, and a
verdict of success. Requests that are not a role's get None, so a script can
hand them to another reply function (the policy's ``reference_replies``)::

    policy = reference_replies(tasks)
    server = ScriptedOpenAIServer(lambda body: role_reply(body) or policy(body))
"""

from __future__ import annotations

import json
import re
from typing import Any

from ..agents.prompts import (
    ABSTRACTOR_PROMPT,
    ENVIRONMENT_SLOT,
    EXPLORER_PROMPT,
    JUDGE_PROMPT,
    SUMMARIZER_PROMPT,
    TEACHER_PROMPT,
    WRITER_PROMPT,
)
from .openai_server import Reply

ROLE_NAMES = ("summarizer", "explorer", "abstractor", "judge")
ROLE_PROMPTS = (SUMMARIZER_PROMPT, EXPLORER_PROMPT, ABSTRACTOR_PROMPT, JUDGE_PROMPT)

_CONTACT = re.compile(r"name=(\w+) phone=(\S+)")
_CALL_LINE = re.compile(r"^\d+\. (\w+)\((.*)\) -> ", re.MULTILINE)
_ARGUMENT = re.compile(r"\w+=(\"(?:[^\"\\]|\\.)*\"|[^,]+)")


def role_of(body: dict[str, Any]) -> str | None:
    """Which role sent a request ("summarizer", ...), or None for any other request."""
    messages = body.get("messages") or []
    system = messages[0].get("content") if messages and isinstance(messages[0], dict) else None
    if not isinstance(system, str):
        return None
    for name, prompt in zip(ROLE_NAMES, ROLE_PROMPTS, strict=True):
        if _same_prompt(system, prompt):
            return name
    return None


def _same_prompt(system: str, prompt: str) -> bool:
    """Whether ``system`` is the default ``prompt``, whatever environment fills its slot."""
    before, _, after = prompt.partition(ENVIRONMENT_SLOT)
    return system.startswith(before) and system.endswith(after)


def role_reply(body: dict[str, Any]) -> Reply | None:
    """A sane reply to a synthesis role's request; None when no role sent it."""
    role = role_of(body)
    messages = body["messages"]
    if role == "summarizer":
        return Reply.json_content(
            {"summary": "stopped early", "failure_cause": "missing call", "focus_patterns": []}
        )
    if role == "explorer":
        if not any(m.get("role") == "tool" for m in messages):
            return Reply.tool_calls([("list_contacts", {})])
        return Reply.text("done exploring")
    if role == "abstractor":
        request = [m for m in messages if m.get("role") == "user"][-1]["content"]
        match = _CONTACT.search(request if isinstance(request, str) else json.dumps(request))
        if match is None:
            return Reply.json_content([])
        name, phone = match.groups()
        return Reply.json_content(
            [
                {
                    "description": "look up a saved contact's number",
                    "query": f"What is {name}'s phone number?",
                    "minimal_actions": [{"name": "find_contact", "arguments": {"name": name}}],
                    "reference_answer": phone,
                }
            ]
        )
    if role == "judge":
        return Reply.json_content(
            {
                "success": True,
                "reason": "replays cleanly",
                "api_match": True,
                "parameter_usage": True,
                "logical_flow": True,
                "final_result": True,
                "failed_or_skipped_steps": [],
            }
        )
    return None


def writer_reply(body: dict[str, Any]) -> Reply | None:
    """A sane task writer's reply (agents/roles/task_writer.py): a request naming every call and its
    argument values, so it passes the grounding check; None for any other request."""
    messages = body.get("messages") or []
    if not messages or messages[0].get("content") != WRITER_PROMPT:
        return None
    user = messages[-1]["content"]
    clauses = []
    for name, arguments in _CALL_LINE.findall(user if isinstance(user, str) else ""):
        values = [value.strip().strip('"') for value in _ARGUMENT.findall(arguments)]
        clauses.append(" ".join([name.replace("_", " "), *values]))
    if not clauses:
        return Reply.text("I cannot tell.")
    return Reply.text(f"Request: Please {'; then '.join(clauses)}.\nAnswer: -")


def teacher_reply(body: dict[str, Any]) -> Reply | None:
    """A sane teacher's reply (agents/roles/teacher.py), numbered call lines as Qwen2.5-Coder
    writes them: it lists the contacts, writes a request for the first one's number as it
    looks it up (with a made-up result the teacher cuts off), then gives the number; None
    for any other request."""
    messages = body.get("messages") or []
    system = messages[0].get("content") if messages else None
    if not isinstance(system, str) or not _same_prompt(system, TEACHER_PROMPT):
        return None
    results = [m["content"] for m in messages[2:] if m.get("role") == "user"]
    if not results:
        return Reply.text("1. list_contacts()")
    seen = _CONTACT.search(results[0])
    if seen is None:
        return Reply.text("I found no contact.")
    name, phone = seen.groups()
    if len(results) == 1:
        request = f"REQUEST: What is {name}'s phone number?"
        return Reply.text(f'{request}\n2. find_contact(name="{name}") -> id=c9 name={name}')
    return Reply.text(f"ANSWER: {phone}")


_EXAMPLE_CALL = re.compile(r"^\d+\. (.+?) -> ", re.MULTILINE)


def copying_teacher_reply(body: dict[str, Any]) -> Reply | None:
    """A teacher for any environment: it does its first worked example again, call by
    call, under a request of its own words; None for any other request."""
    messages = body.get("messages") or []
    system = messages[0].get("content") if messages else None
    if not isinstance(system, str) or not _same_prompt(system, TEACHER_PROMPT):
        return None
    opening = messages[1]["content"]
    example = opening.split("Example 1\n", 1)[1].split("\n\nExample 2", 1)[0]
    request = example.split("\n", 1)[0].removeprefix("Request: ")
    calls = _EXAMPLE_CALL.findall(example)
    made = len([m for m in messages[2:] if m.get("role") == "user"])
    if made >= len(calls):
        return Reply.text("ANSWER: none")
    call = f"{made + 1}. {calls[made]}"
    return Reply.text(f"REQUEST: Once more: {request}\n{call}" if made == 0 else call)
