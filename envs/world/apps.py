"""The built-in world's apps: their typed tools and what each does to the state.

Each tool is a ``World`` method whose signature and docstring are its schema
(``tool_schemas``); the state and the helpers the tools share are in
``app_state.py``.
"""

from __future__ import annotations

from functools import cache
from typing import Any

from ..base import ToolError
from .app_state import (
    DATE,
    PHONE,
    TIME,
    AppState,
    empty_state,
    mutating,
    mutating_names,
    render,
    same_text,
)

# The tools of each app, in the order the policy sees them. Each is the World method of
# that name, whose signature and docstring are its schema (``tool_schemas``).
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
TOOL_NAMES = tuple(name for tools in APPS.values() for name in tools)


class World(AppState):
    """The apps over one state dict. Each public tool method returns the observation text."""

    def run(self, name: str, arguments: dict[str, Any]) -> str:
        if name not in TOOL_NAMES:
            raise ToolError("unknown_tool", f"unknown tool {name!r}")
        return str(getattr(self, name)(**arguments))

    # ------------------------------------------------------------ contacts
    def find_contact(self, name: str) -> str:
        """Find a contact by name.

        Args:
            name: Contact name
        """
        found = [
            render(cid, name=c["name"], phone=c["phone"])
            for cid, c in self.state["contacts"].items()
            if same_text(c["name"], name)
        ]
        if not found:
            raise ToolError("not_found", f"no contact named {name}")
        return "\n".join(found)

    def list_contacts(self) -> str:
        """List all contacts."""
        rows = [
            render(cid, name=c["name"], phone=c["phone"])
            for cid, c in self.state["contacts"].items()
        ]
        return "\n".join(rows) or "no contacts"

    @mutating
    def add_contact(self, name: str, phone: str) -> str:
        """Save a new contact.

        Args:
            name: Contact name
            phone: Phone number like 555-0123
        """
        self._check(PHONE, phone, "phone", "555-0123")
        if not name.strip():
            raise ToolError("invalid_value", "name must not be empty")
        if any(same_text(c["name"], name) for c in self.state["contacts"].values()):
            raise ToolError("duplicate", f"a contact named {name} already exists")
        contact_id = self._new_id("contacts")
        self.state["contacts"][contact_id] = {"name": name.strip(), "phone": phone}
        return "saved " + render(contact_id, name=name.strip(), phone=phone)

    @mutating
    def update_phone(self, contact_id: str, phone: str) -> str:
        """Change a contact's phone number.

        Args:
            contact_id: Contact id like c3
            phone: New phone number like 555-0123
        """
        self._check(PHONE, phone, "phone", "555-0123")
        contact = self._get("contacts", contact_id, "contact")
        contact["phone"] = phone
        return "updated " + render(contact_id, name=contact["name"], phone=phone)

    @mutating
    def delete_contact(self, contact_id: str) -> str:
        """Delete a contact.

        Args:
            contact_id: Contact id
        """
        contact = self._get("contacts", contact_id, "contact", pop=True)
        return f"deleted contact {contact['name']}"

    # ------------------------------------------------------------ messages
    @mutating
    def send_message(self, contact_id: str, text: str) -> str:
        """Send a text message to a contact.

        Args:
            contact_id: Contact id like c3
            text: Message text
        """
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
        """Read the conversation with a contact, oldest first.

        Args:
            contact_id: Contact id
        """
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
        """Find messages containing a word.

        Args:
            query: Word
        """
        rows = [
            render(mid, contact=self._contact_name(m["contact_id"]), text=m["text"])
            for mid, m in self.state["messages"].items()
            if query.strip().lower() in m["text"].lower()
        ]
        return "\n".join(rows) or "no messages"

    @mutating
    def delete_message(self, message_id: str) -> str:
        """Delete a message.

        Args:
            message_id: Message id
        """
        self._get("messages", message_id, "message", pop=True)
        return f"deleted message {message_id}"

    # ------------------------------------------------------------ calendar
    def find_event(self, title: str) -> str:
        """Find calendar events by title.

        Args:
            title: Event title
        """
        rows = [
            render(eid, title=e["title"], date=e["date"], time=e["time"])
            for eid, e in self.state["events"].items()
            if same_text(e["title"], title)
        ]
        if not rows:
            raise ToolError("not_found", f"no event titled {title}")
        return "\n".join(rows)

    def list_events(self, date: str) -> str:
        """List the events on a date.

        Args:
            date: Date MM-DD
        """
        self._check(DATE, date, "date", "05-14")
        rows = [
            render(eid, title=e["title"], date=e["date"], time=e["time"])
            for eid, e in sorted(self.state["events"].items(), key=lambda kv: kv[1]["time"])
            if e["date"] == date
        ]
        return "\n".join(rows) or f"no events on {date}"

    @mutating
    def create_event(self, title: str, date: str, time: str) -> str:
        """Create a calendar event.

        Args:
            title: Title
            date: Date MM-DD
            time: Time HH:MM
        """
        self._check(DATE, date, "date", "05-14")
        self._check(TIME, time, "time", "09:30")
        if not title.strip():
            raise ToolError("invalid_value", "title must not be empty")
        event_id = self._new_id("events")
        self.state["events"][event_id] = {"title": title.strip(), "date": date, "time": time}
        return "created " + render(event_id, title=title.strip(), date=date, time=time)

    @mutating
    def move_event(self, event_id: str, date: str, time: str) -> str:
        """Move an event to a new date and time.

        Args:
            event_id: Event id like e2
            date: Date MM-DD
            time: Time HH:MM
        """
        self._check(DATE, date, "date", "05-14")
        self._check(TIME, time, "time", "09:30")
        event = self._get("events", event_id, "event")
        event.update(date=date, time=time)
        return "moved " + render(event_id, title=event["title"], date=date, time=time)

    @mutating
    def cancel_event(self, event_id: str) -> str:
        """Cancel (delete) an event.

        Args:
            event_id: Event id
        """
        event = self._get("events", event_id, "event", pop=True)
        return f"cancelled {event['title']}"

    # ------------------------------------------------------------ notes
    @mutating
    def create_note(self, title: str, body: str) -> str:
        """Create a note.

        Args:
            title: Title
            body: Text
        """
        if not title.strip():
            raise ToolError("invalid_value", "title must not be empty")
        note_id = self._new_id("notes")
        self.state["notes"][note_id] = {"title": title.strip(), "body": body}
        return "created " + render(note_id, title=title.strip())

    def find_note(self, title: str) -> str:
        """Find notes by title.

        Args:
            title: Title
        """
        rows = [
            render(nid, title=n["title"])
            for nid, n in self.state["notes"].items()
            if same_text(n["title"], title)
        ]
        if not rows:
            raise ToolError("not_found", f"no note titled {title}")
        return "\n".join(rows)

    def read_note(self, note_id: str) -> str:
        """Read a note's text.

        Args:
            note_id: Note id
        """
        note = self._get("notes", note_id, "note")
        return render(note_id, title=note["title"], body=note["body"])

    @mutating
    def append_note(self, note_id: str, text: str) -> str:
        """Add a line to the end of a note.

        Args:
            note_id: Note id
            text: Text to add
        """
        note = self._get("notes", note_id, "note")
        note["body"] = f"{note['body']}\n{text}" if note["body"] else text
        return "updated " + render(note_id, title=note["title"])

    @mutating
    def delete_note(self, note_id: str) -> str:
        """Delete a note.

        Args:
            note_id: Note id
        """
        note = self._get("notes", note_id, "note", pop=True)
        return f"deleted note {note['title']}"

    # ------------------------------------------------------------ shop
    def search_products(self, query: str) -> str:
        """Search the shop's products.

        Args:
            query: Product name
        """
        words = query.strip().lower()
        rows = [
            render(pid, name=p["name"], price=p["price"])
            for pid, p in self.state["products"].items()
            if words and words in p["name"].lower()
        ]
        return "\n".join(rows) or f"no products match {query}"

    @mutating
    def add_to_cart(self, product_id: str, quantity: int) -> str:
        """Put a product in the cart.

        Args:
            product_id: Product id like p4
            quantity: How many, 1-9
        """
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
        """Show the cart and its total."""
        products = self.state["products"]
        rows = [
            render(pid, name=products[pid]["name"], quantity=qty, price=products[pid]["price"])
            for pid, qty in self.state["cart"].items()
        ]
        return "\n".join([*rows, f"total={self._cart_total()}"]) if rows else "cart is empty"

    @mutating
    def remove_from_cart(self, product_id: str) -> str:
        """Take a product out of the cart.

        Args:
            product_id: Product id
        """
        if product_id not in self.state["cart"]:
            raise ToolError("not_found", f"{product_id} is not in the cart")
        del self.state["cart"][product_id]
        return f"removed {product_id} total={self._cart_total()}"

    @mutating
    def checkout(self) -> str:
        """Pay for the cart from the wallet and place an order."""
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
        """List placed orders."""
        products = self.state["products"]
        rows = []
        for oid, order in self.state["orders"].items():
            items = ",".join(
                f"{products[pid]['name']}x{qty}" for pid, qty in order["items"].items()
            )
            rows.append(render(oid, items=items, total=order["total"], status=order["status"]))
        return "\n".join(rows) or "no orders"

    @mutating
    def cancel_order(self, order_id: str) -> str:
        """Cancel an order and refund it to the wallet.

        Args:
            order_id: Order id
        """
        order = self._get("orders", order_id, "order")
        if order["status"] == "cancelled":
            raise ToolError("already_cancelled", f"order {order_id} is already cancelled")
        order["status"] = "cancelled"
        self.state["wallet"]["balance"] += order["total"]
        return f"cancelled {order_id} refund={order['total']} balance={self.state['wallet']['balance']}"

    # ------------------------------------------------------------ wallet
    def get_balance(self) -> str:
        """Show the wallet balance."""
        return f"balance={self.state['wallet']['balance']}"

    @mutating
    def top_up(self, amount: int) -> str:
        """Add money to the wallet.

        Args:
            amount: Whole amount, 1-500
        """
        amount = int(amount)
        if not 1 <= amount <= 500:
            raise ToolError("invalid_value", "amount must be between 1 and 500")
        self.state["wallet"]["balance"] += amount
        return f"balance={self.state['wallet']['balance']}"

    # ------------------------------------------------------------ reminders
    @mutating
    def set_reminder(self, text: str, date: str, time: str) -> str:
        """Set a reminder.

        Args:
            text: What to remind
            date: Date MM-DD
            time: Time HH:MM
        """
        self._check(DATE, date, "date", "05-14")
        self._check(TIME, time, "time", "09:30")
        if not text.strip():
            raise ToolError("invalid_value", "reminder text must not be empty")
        reminder_id = self._new_id("reminders")
        self.state["reminders"][reminder_id] = {"text": text, "date": date, "time": time}
        return "set " + render(reminder_id, text=text, date=date, time=time)

    def list_reminders(self) -> str:
        """List reminders."""
        rows = [
            render(rid, text=r["text"], date=r["date"], time=r["time"])
            for rid, r in self.state["reminders"].items()
        ]
        return "\n".join(rows) or "no reminders"

    @mutating
    def delete_reminder(self, reminder_id: str) -> str:
        """Delete a reminder.

        Args:
            reminder_id: Reminder id
        """
        self._get("reminders", reminder_id, "reminder", pop=True)
        return f"deleted reminder {reminder_id}"


# Tools that change state: the describer writes instructions from these.
MUTATING_TOOLS = frozenset(mutating_names)


@cache
def tool_schemas() -> list[dict[str, Any]]:
    """The tools' OpenAI function schemas, derived from the World methods' type hints and
    docstrings (the summary line, and an ``Args:`` line per argument) as a user's tools'
    are. transformers' ``get_json_schema`` gives the same 31 schemas, but importing it
    imports torch: seconds on every ``coevolve env`` command."""
    from ..function_tools import function_schema

    world = World(empty_state())
    return [function_schema(getattr(world, name)) for name in TOOL_NAMES]
