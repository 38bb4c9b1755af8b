"""The built-in world's state and what every app's tools share.

The state is one plain JSON-able dict (``empty_state``), so a task can carry
its whole initial state and be replayed anywhere. Ids are short (``c3``,
``e2``, ``p5``) and observations are compact ``key=value`` lines (``render``),
because a small model has to copy values from observations into later calls
and every token it copies is a chance to get one wrong. ``AppState`` holds the
state and the helpers the tools (``apps.World``) use.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from typing import Any, TypeVar

from ..base import ToolError

State = dict[str, Any]

COLLECTIONS = ("contacts", "messages", "events", "notes", "products", "cart", "orders", "reminders")
ID_PREFIX = {
    "contacts": "c",
    "messages": "m",
    "events": "e",
    "notes": "n",
    "orders": "o",
    "reminders": "r",
}

PHONE = re.compile(r"^555-\d{4}$")
DATE = re.compile(r"^(0[1-9]|1[0-2])-(0[1-9]|[12]\d|3[01])$")
TIME = re.compile(r"^([01]\d|2[0-3]):[0-5]\d$")

ToolMethod = TypeVar("ToolMethod", bound=Callable[..., str])
# The names of the tools marked @mutating (apps.MUTATING_TOOLS once World is defined).
mutating_names: set[str] = set()


def mutating(method: ToolMethod) -> ToolMethod:
    """Mark a World tool that changes the state (the describer writes instructions from these)."""
    mutating_names.add(method.__name__)
    return method


def empty_state(balance: int = 0) -> State:
    state: State = {name: {} for name in COLLECTIONS}
    state["wallet"] = {"balance": balance}
    state["next_id"] = {prefix: 1 for prefix in ID_PREFIX.values()}
    return state


def render(item_id: str | None = None, **fields: Any) -> str:
    """One compact observation line: ``id=c3 name=Ana phone=555-0192``."""
    parts = [f"id={item_id}"] if item_id else []
    for key, value in fields.items():
        text = str(value)
        parts.append(f"{key}={json.dumps(text) if (' ' in text or not text) else text}")
    return " ".join(parts)


def same_text(a: str, b: str) -> bool:
    return a.strip().lower() == b.strip().lower()


class AppState:
    """One state dict and the helpers every app's tools use."""

    def __init__(self, state: State):
        self.state = state

    def _new_id(self, collection: str) -> str:
        prefix = ID_PREFIX[collection]
        number = self.state["next_id"][prefix]
        self.state["next_id"][prefix] = number + 1
        return f"{prefix}{number}"

    def _get(self, collection: str, item_id: str, what: str, pop: bool = False) -> dict[str, Any]:
        items = self.state[collection]
        item = items.pop(item_id, None) if pop else items.get(item_id)
        if item is None:
            raise ToolError("not_found", f"no {what} with id {item_id}")
        return item

    @staticmethod
    def _check(pattern: re.Pattern[str], value: str, what: str, example: str) -> None:
        if not pattern.match(value):
            raise ToolError(
                "invalid_value", f"{what} {value!r} is not valid; use the form {example}"
            )

    def _contact_name(self, contact_id: str) -> str:
        contact = self.state["contacts"].get(contact_id)
        return contact["name"] if contact else contact_id
