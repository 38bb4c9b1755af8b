"""The built-in world's apps: state, typed tools and their implementations.

The state is one plain JSON-able dict, so a task can carry its whole initial
state and be replayed anywhere. Ids are short (``c3``, ``e2``, ``p5``) and
observations are compact ``key=value`` lines, because a small model has to copy
values from observations into later calls and every token it copies is a chance
to get one wrong.
"""

from __future__ import annotations

import json
import re
from typing import Any

from ..base import ToolError, tool_schema

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

_S = {"type": "string"}
_I = {"type": "integer"}


def _str(description: str) -> dict[str, str]:
    return {**_S, "description": description}


TOOL_SCHEMAS: list[dict[str, Any]] = [
    # contacts
    tool_schema(
        "find_contact", "Find a contact by name.", {"name": _str("Contact name")}, ["name"]
    ),
    tool_schema("list_contacts", "List all contacts.", {}),
    tool_schema(
        "add_contact",
        "Save a new contact.",
        {"name": _str("Contact name"), "phone": _str("Phone number like 555-0123")},
        ["name", "phone"],
    ),
    tool_schema(
        "update_phone",
        "Change a contact's phone number.",
        {"contact_id": _str("Contact id like c3"), "phone": _str("New phone number like 555-0123")},
        ["contact_id", "phone"],
    ),
    tool_schema(
        "delete_contact", "Delete a contact.", {"contact_id": _str("Contact id")}, ["contact_id"]
    ),
    # messages
    tool_schema(
        "send_message",
        "Send a text message to a contact.",
        {"contact_id": _str("Contact id like c3"), "text": _str("Message text")},
        ["contact_id", "text"],
    ),
    tool_schema(
        "read_messages",
        "Read the conversation with a contact, oldest first.",
        {"contact_id": _str("Contact id")},
        ["contact_id"],
    ),
    tool_schema(
        "search_messages", "Find messages containing a word.", {"query": _str("Word")}, ["query"]
    ),
    tool_schema(
        "delete_message", "Delete a message.", {"message_id": _str("Message id")}, ["message_id"]
    ),
    # calendar
    tool_schema(
        "find_event", "Find calendar events by title.", {"title": _str("Event title")}, ["title"]
    ),
    tool_schema(
        "list_events", "List the events on a date.", {"date": _str("Date MM-DD")}, ["date"]
    ),
    tool_schema(
        "create_event",
        "Create a calendar event.",
        {"title": _str("Title"), "date": _str("Date MM-DD"), "time": _str("Time HH:MM")},
        ["title", "date", "time"],
    ),
    tool_schema(
        "move_event",
        "Move an event to a new date and time.",
        {
            "event_id": _str("Event id like e2"),
            "date": _str("Date MM-DD"),
            "time": _str("Time HH:MM"),
        },
        ["event_id", "date", "time"],
    ),
    tool_schema(
        "cancel_event", "Cancel (delete) an event.", {"event_id": _str("Event id")}, ["event_id"]
    ),
    # notes
    tool_schema(
        "create_note",
        "Create a note.",
        {"title": _str("Title"), "body": _str("Text")},
        ["title", "body"],
    ),
    tool_schema("find_note", "Find notes by title.", {"title": _str("Title")}, ["title"]),
    tool_schema("read_note", "Read a note's text.", {"note_id": _str("Note id")}, ["note_id"]),
    tool_schema(
        "append_note",
        "Add a line to the end of a note.",
        {"note_id": _str("Note id"), "text": _str("Text to add")},
        ["note_id", "text"],
    ),
    tool_schema("delete_note", "Delete a note.", {"note_id": _str("Note id")}, ["note_id"]),
    # shop
    tool_schema(
        "search_products", "Search the shop's products.", {"query": _str("Product name")}, ["query"]
    ),
    tool_schema(
        "add_to_cart",
        "Put a product in the cart.",
        {
            "product_id": _str("Product id like p4"),
            "quantity": {**_I, "description": "How many, 1-9"},
        },
        ["product_id", "quantity"],
    ),
    tool_schema("view_cart", "Show the cart and its total.", {}),
    tool_schema(
        "remove_from_cart",
        "Take a product out of the cart.",
        {"product_id": _str("Product id")},
        ["product_id"],
    ),
    tool_schema("checkout", "Pay for the cart from the wallet and place an order.", {}),
    tool_schema("list_orders", "List placed orders.", {}),
    tool_schema(
        "cancel_order",
        "Cancel an order and refund it to the wallet.",
        {"order_id": _str("Order id")},
        ["order_id"],
    ),
    # wallet
    tool_schema("get_balance", "Show the wallet balance.", {}),
    tool_schema(
        "top_up",
        "Add money to the wallet.",
        {"amount": {**_I, "description": "Whole amount, 1-500"}},
        ["amount"],
    ),
    # reminders
    tool_schema(
        "set_reminder",
        "Set a reminder.",
        {"text": _str("What to remind"), "date": _str("Date MM-DD"), "time": _str("Time HH:MM")},
        ["text", "date", "time"],
    ),
    tool_schema("list_reminders", "List reminders.", {}),
    tool_schema(
        "delete_reminder",
        "Delete a reminder.",
        {"reminder_id": _str("Reminder id")},
        ["reminder_id"],
    ),
]

TOOL_NAMES = tuple(schema["function"]["name"] for schema in TOOL_SCHEMAS)
APPS = {
    "contacts": ("find_contact", "list_contacts", "add_contact", "update_phone", "delete_contact"),
    "messages": ("send_message", "read_messages", "search_messages", "delete_message"),
    "calendar": ("find_event", "list_events", "create_event", "move_event", "cancel_event"),
    "notes": ("create_note", "find_note", "read_note", "append_note", "delete_note"),
    "shop": (
        "search_products",
        "add_to_cart",
        "view_cart",
        "remove_from_cart",
        "checkout",
        "list_orders",
        "cancel_order",
    ),
    "wallet": ("get_balance", "top_up"),
    "reminders": ("set_reminder", "list_reminders", "delete_reminder"),
}
# Tools that change state: the describer writes instructions from these.
MUTATING_TOOLS = frozenset(
    {
        "add_contact",
        "update_phone",
        "delete_contact",
        "send_message",
        "delete_message",
        "create_event",
        "move_event",
        "cancel_event",
        "create_note",
        "append_note",
        "delete_note",
        "add_to_cart",
        "remove_from_cart",
        "checkout",
        "cancel_order",
        "top_up",
        "set_reminder",
        "delete_reminder",
    }
)


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


def _same(a: str, b: str) -> bool:
    return a.strip().lower() == b.strip().lower()


class World:
    """The apps over one state dict. Each public tool method returns the observation text."""

    def __init__(self, state: State):
        self.state = state

    def run(self, name: str, arguments: dict[str, Any]) -> str:
        if name not in TOOL_NAMES:
            raise ToolError("unknown_tool", f"unknown tool {name!r}")
        return str(getattr(self, name)(**arguments))

    # ------------------------------------------------------------ helpers
    def _new_id(self, collection: str) -> str:
        prefix = ID_PREFIX[collection]
        number = self.state["next_id"][prefix]
        self.state["next_id"][prefix] = number + 1
        return f"{prefix}{number}"

    def _get(self, collection: str, item_id: str, what: str) -> dict[str, Any]:
        item = self.state[collection].get(item_id)
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

    # ------------------------------------------------------------ contacts
    def find_contact(self, name: str) -> str:
        found = [
            render(cid, name=c["name"], phone=c["phone"])
            for cid, c in self.state["contacts"].items()
            if _same(c["name"], name)
        ]
        if not found:
            raise ToolError("not_found", f"no contact named {name}")
        return "\n".join(found)

    def list_contacts(self) -> str:
        rows = [
            render(cid, name=c["name"], phone=c["phone"])
            for cid, c in self.state["contacts"].items()
        ]
        return "\n".join(rows) or "no contacts"

    def add_contact(self, name: str, phone: str) -> str:
        self._check(PHONE, phone, "phone", "555-0123")
        if not name.strip():
            raise ToolError("invalid_value", "name must not be empty")
        if any(_same(c["name"], name) for c in self.state["contacts"].values()):
            raise ToolError("duplicate", f"a contact named {name} already exists")
        contact_id = self._new_id("contacts")
        self.state["contacts"][contact_id] = {"name": name.strip(), "phone": phone}
        return "saved " + render(contact_id, name=name.strip(), phone=phone)

    def update_phone(self, contact_id: str, phone: str) -> str:
        self._check(PHONE, phone, "phone", "555-0123")
        contact = self._get("contacts", contact_id, "contact")
        contact["phone"] = phone
        return "updated " + render(contact_id, name=contact["name"], phone=phone)

    def delete_contact(self, contact_id: str) -> str:
        contact = self._get("contacts", contact_id, "contact")
        del self.state["contacts"][contact_id]
        return f"deleted contact {contact['name']}"

    # ------------------------------------------------------------ messages
    def send_message(self, contact_id: str, text: str) -> str:
        self._get("contacts", contact_id, "contact")
        if not text.strip():
            raise ToolError("invalid_value", "message text must not be empty")
        message_id = self._new_id("messages")
        self.state["messages"][message_id] = {
            "contact_id": contact_id,
            "direction": "out",
            "text": text,
        }
        return "sent " + render(message_id, to=self._contact_name(contact_id))

    def read_messages(self, contact_id: str) -> str:
        self._get("contacts", contact_id, "contact")
        rows = [
            render(
                mid,
                **{"from" if m["direction"] == "in" else "to": self._contact_name(contact_id)},
                text=m["text"],
            )
            for mid, m in self.state["messages"].items()
            if m["contact_id"] == contact_id
        ]
        return "\n".join(rows) or "no messages"

    def search_messages(self, query: str) -> str:
        rows = [
            render(mid, contact=self._contact_name(m["contact_id"]), text=m["text"])
            for mid, m in self.state["messages"].items()
            if query.strip().lower() in m["text"].lower()
        ]
        return "\n".join(rows) or "no messages"

    def delete_message(self, message_id: str) -> str:
        self._get("messages", message_id, "message")
        del self.state["messages"][message_id]
        return f"deleted message {message_id}"

    # ------------------------------------------------------------ calendar
    def find_event(self, title: str) -> str:
        rows = [
            render(eid, title=e["title"], date=e["date"], time=e["time"])
            for eid, e in self.state["events"].items()
            if _same(e["title"], title)
        ]
        if not rows:
            raise ToolError("not_found", f"no event titled {title}")
        return "\n".join(rows)

    def list_events(self, date: str) -> str:
        self._check(DATE, date, "date", "05-14")
        rows = [
            render(eid, title=e["title"], date=e["date"], time=e["time"])
            for eid, e in sorted(self.state["events"].items(), key=lambda kv: kv[1]["time"])
            if e["date"] == date
        ]
        return "\n".join(rows) or f"no events on {date}"

    def create_event(self, title: str, date: str, time: str) -> str:
        self._check(DATE, date, "date", "05-14")
        self._check(TIME, time, "time", "09:30")
        if not title.strip():
            raise ToolError("invalid_value", "title must not be empty")
        event_id = self._new_id("events")
        self.state["events"][event_id] = {"title": title.strip(), "date": date, "time": time}
        return "created " + render(event_id, title=title.strip(), date=date, time=time)

    def move_event(self, event_id: str, date: str, time: str) -> str:
        self._check(DATE, date, "date", "05-14")
        self._check(TIME, time, "time", "09:30")
        event = self._get("events", event_id, "event")
        event.update(date=date, time=time)
        return "moved " + render(event_id, title=event["title"], date=date, time=time)

    def cancel_event(self, event_id: str) -> str:
        event = self._get("events", event_id, "event")
        del self.state["events"][event_id]
        return f"cancelled {event['title']}"

    # ------------------------------------------------------------ notes
    def create_note(self, title: str, body: str) -> str:
        if not title.strip():
            raise ToolError("invalid_value", "title must not be empty")
        note_id = self._new_id("notes")
        self.state["notes"][note_id] = {"title": title.strip(), "body": body}
        return "created " + render(note_id, title=title.strip())

    def find_note(self, title: str) -> str:
        rows = [
            render(nid, title=n["title"])
            for nid, n in self.state["notes"].items()
            if _same(n["title"], title)
        ]
        if not rows:
            raise ToolError("not_found", f"no note titled {title}")
        return "\n".join(rows)

    def read_note(self, note_id: str) -> str:
        note = self._get("notes", note_id, "note")
        return render(note_id, title=note["title"], body=note["body"])

    def append_note(self, note_id: str, text: str) -> str:
        note = self._get("notes", note_id, "note")
        note["body"] = f"{note['body']}\n{text}" if note["body"] else text
        return "updated " + render(note_id, title=note["title"])

    def delete_note(self, note_id: str) -> str:
        note = self._get("notes", note_id, "note")
        del self.state["notes"][note_id]
        return f"deleted note {note['title']}"

    # ------------------------------------------------------------ shop
    def search_products(self, query: str) -> str:
        words = query.strip().lower()
        rows = [
            render(pid, name=p["name"], price=p["price"])
            for pid, p in self.state["products"].items()
            if words and words in p["name"].lower()
        ]
        return "\n".join(rows) or f"no products match {query}"

    def add_to_cart(self, product_id: str, quantity: int) -> str:
        self._get("products", product_id, "product")
        quantity = int(quantity)
        if not 1 <= quantity <= 9:
            raise ToolError("invalid_value", "quantity must be between 1 and 9")
        cart = self.state["cart"]
        cart[product_id] = cart.get(product_id, 0) + quantity
        return f"cart {product_id} x{cart[product_id]} total={self._cart_total()}"

    def _cart_total(self) -> int:
        products = self.state["products"]
        return sum(products[pid]["price"] * qty for pid, qty in self.state["cart"].items())

    def view_cart(self) -> str:
        products = self.state["products"]
        rows = [
            render(pid, name=products[pid]["name"], quantity=qty, price=products[pid]["price"])
            for pid, qty in self.state["cart"].items()
        ]
        return "\n".join([*rows, f"total={self._cart_total()}"]) if rows else "cart is empty"

    def remove_from_cart(self, product_id: str) -> str:
        if product_id not in self.state["cart"]:
            raise ToolError("not_found", f"{product_id} is not in the cart")
        del self.state["cart"][product_id]
        return f"removed {product_id} total={self._cart_total()}"

    def checkout(self) -> str:
        if not self.state["cart"]:
            raise ToolError("empty_cart", "the cart is empty")
        total = self._cart_total()
        balance = self.state["wallet"]["balance"]
        if total > balance:
            raise ToolError(
                "insufficient_balance",
                f"insufficient balance: total={total} balance={balance} short={total - balance}",
            )
        order_id = self._new_id("orders")
        self.state["orders"][order_id] = {
            "items": dict(self.state["cart"]),
            "total": total,
            "status": "placed",
        }
        self.state["cart"] = {}
        self.state["wallet"]["balance"] = balance - total
        return f"ordered {render(order_id, total=total)} balance={balance - total}"

    def list_orders(self) -> str:
        products = self.state["products"]
        rows = []
        for oid, order in self.state["orders"].items():
            items = ",".join(
                f"{products[pid]['name']}x{qty}" for pid, qty in order["items"].items()
            )
            rows.append(render(oid, items=items, total=order["total"], status=order["status"]))
        return "\n".join(rows) or "no orders"

    def cancel_order(self, order_id: str) -> str:
        order = self._get("orders", order_id, "order")
        if order["status"] == "cancelled":
            raise ToolError("already_cancelled", f"order {order_id} is already cancelled")
        order["status"] = "cancelled"
        self.state["wallet"]["balance"] += order["total"]
        return f"cancelled {order_id} refund={order['total']} balance={self.state['wallet']['balance']}"

    # ------------------------------------------------------------ wallet
    def get_balance(self) -> str:
        return f"balance={self.state['wallet']['balance']}"

    def top_up(self, amount: int) -> str:
        amount = int(amount)
        if not 1 <= amount <= 500:
            raise ToolError("invalid_value", "amount must be between 1 and 500")
        self.state["wallet"]["balance"] += amount
        return f"balance={self.state['wallet']['balance']}"

    # ------------------------------------------------------------ reminders
    def set_reminder(self, text: str, date: str, time: str) -> str:
        self._check(DATE, date, "date", "05-14")
        self._check(TIME, time, "time", "09:30")
        if not text.strip():
            raise ToolError("invalid_value", "reminder text must not be empty")
        reminder_id = self._new_id("reminders")
        self.state["reminders"][reminder_id] = {"text": text, "date": date, "time": time}
        return "set " + render(reminder_id, text=text, date=date, time=time)

    def list_reminders(self) -> str:
        rows = [
            render(rid, text=r["text"], date=r["date"], time=r["time"])
            for rid, r in self.state["reminders"].items()
        ]
        return "\n".join(rows) or "no reminders"

    def delete_reminder(self, reminder_id: str) -> str:
        self._get("reminders", reminder_id, "reminder")
        del self.state["reminders"][reminder_id]
        return f"deleted reminder {reminder_id}"
