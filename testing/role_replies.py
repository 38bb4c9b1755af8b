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
    EXPLORER_PROMPT,
    JUDGE_PROMPT,
    SUMMARIZER_PROMPT,
    filled_from,
)
from .openai_server import Reply

ROLE_NAMES = ("summarizer", "explorer", "abstractor", "judge")
ROLE_PROMPTS = (SUMMARIZER_PROMPT, EXPLORER_PROMPT, ABSTRACTOR_PROMPT, JUDGE_PROMPT)

_CONTACT = re.compile(r"name=(\w+) phone=(\S+)")


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
    """Whether ``system`` is the default ``prompt``, whatever environment fills its slots."""
    return filled_from(system, prompt)


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
