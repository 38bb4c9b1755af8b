"""The built-in world as an Environment: reset, step, describer, sampler.

The verifier (``verify``) and its pieces (``replay``, ``clone``) live in
``coevolve.envs.world.verifier`` and are re-exported here."""

from __future__ import annotations

import random
import re
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from ...records import Observation, Task, ToolCall, Trajectory
from ..base import ToolEnvironment, ToolError
from ..brief import EnvironmentBrief
from .app_state import State
from .apps import MUTATING_TOOLS, TOOL_NAMES, World, tool_schemas
from .states import clock, date, phone, pools_for
from .verifier import clone, replay, verify

__all__ = ["WorldEnvironment", "clone", "replay", "verify"]


# World lookups whose single-row observation answers the question the describer
# writes for them ("find Ana's phone number", "find the price of the lamp", ...).
_LOOKUP_ANSWER_FIELDS = {
    "find_contact": "phone",
    "search_products": "price",
    "get_balance": "balance",
}


class WorldEnvironment(ToolEnvironment):
    """A seeded simulation of a person's apps: contacts, messages, calendar, notes, shop, wallet, reminders."""

    name = "world"

    def __init__(self) -> None:
        self.task: Task | None = None
        self.world: World | None = None
        self.answer: str | None = None
        self.turn = 0

    def tools(self) -> list[dict[str, Any]]:
        return tool_schemas()

    def brief(self) -> EnvironmentBrief:
        """What the synthesis roles' prompts say of the world."""
        return EnvironmentBrief(
            description="a simulated set of a person's apps (contacts, messages, calendar, "
            "notes, a shop with a cart and orders, a wallet, reminders)",
            tools=list(TOOL_NAMES),
            ids="ids look like c3, e2, p5, o1",
            action_pattern="find_contact > send_message",
            lookups="find/list/search/read",
            variations="other people, items, dates, quantities",
            known_values="names, titles, product names, dates",
            answer_values="a phone number, a price, a time",
        )

    def reset(self, task: Task) -> str:
        if "state" not in task.setup:
            raise ValueError(
                f"world task {task.id} has no setup['state']; it was not made for the world"
            )
        self.task = task
        self.world = World(clone(task.setup["state"]))
        self.answer = None
        self._stopped_by = None  # a new episode: no earlier call's time-out stops its tools
        self.turn = 0
        return task.turns[0].query

    def _execute(self, call: ToolCall) -> str:
        if self.world is None:
            raise ToolError("not_started", "the episode has not started: call reset(task) first")
        return self.world.run(call.name, dict(call.arguments))

    def score(self) -> float:
        if self.task is None or self.world is None:
            raise RuntimeError("score() before reset()")
        return verify(self.task, self.world.state, self.answer)

    def progress(self) -> float:
        """Graded progress: the fraction of expected state changes (and answer) achieved."""
        from .world_diagnosis import world_progress

        if self.task is None or self.world is None:
            raise RuntimeError("progress() before reset()")
        return world_progress(self.task, self.world.state, self.answer)

    def diagnose(self, trajectory: Trajectory) -> list[str]:
        """SEAL-style labels of a trajectory of the current task: one per step plus an
        outcome label (coevolve.envs.diagnosis documents the mapping)."""
        from .world_diagnosis import diagnose_world

        if self.task is None:
            raise RuntimeError("diagnose() before reset()")
        return diagnose_world(self.task, trajectory.steps, trajectory.final_answer)

    # ------------------------------------------------------------ offline synthesis helpers

    def structure_key(self, calls: Sequence[ToolCall]) -> str:
        """The family whose tool graph ``calls`` follow (``other:a>b`` when none does)."""
        from .splits import structure_key

        return structure_key([call.name for call in calls])

    def variant(self, task: Task, key: str, part: tuple[int, int] | None = None) -> Task | None:
        """A new task with ``task``'s structure on fresh training values and state.

        The structure comes from ``task``'s own reference calls, not its label. With
        ``part=(start, end)`` the task asks for calls ``start:end`` only, from the
        state the earlier calls leave (cut back to the last state-changing call, so
        the verifier has something to check), in the describer's words; None when
        that leaves nothing.
        """
        from .splits import make_variant

        family = self.structure_key(task.reference_calls)
        if family.startswith("other:"):
            return None
        fresh = make_variant(family, key)
        length = len(fresh.reference_calls)
        start, end = part if part is not None else (0, length)
        start, end = max(start, 0), min(end, length)
        if (start, end) == (0, length):
            return fresh
        calls = fresh.reference_calls[start:end]
        while calls and calls[-1].name not in MUTATING_TOOLS:
            calls = calls[:-1]
        if not calls:
            return None
        state = replay(fresh.setup["state"], fresh.reference_calls[:start])
        setup = {"state": state, "check": {}}
        turn = fresh.turns[0].model_copy(
            update={"query": self.describe(calls, setup), "reference_calls": calls}
        )
        return fresh.model_copy(
            update={
                "id": f"{fresh.id}-calls{start}-{start + len(calls)}",
                "family": self.structure_key(calls),
                "turns": [turn],
                "reference_answer": None,
                "setup": setup,
            }
        )

    def changes_state(self, call: ToolCall) -> bool:
        return call.name in MUTATING_TOOLS

    def setup_after(self, setup: Mapping[str, Any], calls: Sequence[ToolCall]) -> dict[str, Any]:
        """``{"state": ...}`` after replaying ``calls`` on ``setup``'s state."""
        return {"state": replay(setup["state"], calls) if calls else setup["state"]}

    def lookup_answer(self, call: ToolCall, observation: Observation) -> str | None:
        """The field a single-row lookup shows that answers the question the describer writes
        for it ("find Ana's phone number": the phone), or None."""
        field = _LOOKUP_ANSWER_FIELDS.get(call.name)
        text = observation.text.strip()
        if field is None or observation.error or "\n" in text:
            return None
        match = re.search(rf"(?:^|\s){field}=(\S+)", text)
        return match.group(1) if match else None

    def describe(self, calls: Sequence[ToolCall], setup: Mapping[str, Any]) -> str:
        """Write an instruction that the given valid action sequence fulfils."""
        world = World(clone(setup["state"]))
        clauses: list[str] = []
        for tool_call in calls:
            before = clone(world.state)
            try:
                world.run(tool_call.name, dict(tool_call.arguments))
            except (ToolError, TypeError):
                continue
            if tool_call.name in MUTATING_TOOLS:
                clauses.append(_clause(tool_call, before, world.state))
        if not clauses and calls:
            clauses.append(_lookup_clause(calls[-1], world.state))
        clauses = [c for c in clauses if c]
        if not clauses:
            return "Do nothing."
        text = (
            clauses[0]
            if len(clauses) == 1
            else ", then ".join(clauses[:-1]) + ", and then " + clauses[-1]
        )
        return text[0].upper() + text[1:] + "."

    def sample_action(
        self, rng: random.Random, focus_tools: Sequence[str] | None = None
    ) -> ToolCall | None:
        """A call with arguments that make sense in the current state (it may still fail)."""
        if self.world is None:
            raise RuntimeError("sample_action() before reset()")
        names = [n for n in (focus_tools or TOOL_NAMES) if n in TOOL_NAMES] or list(TOOL_NAMES)
        for _ in range(20):
            name = rng.choice(names)
            arguments = _sample_arguments(name, self.world.state, rng)
            if arguments is not None:
                return ToolCall(name=name, arguments=arguments)
        return None


def _clause(call: ToolCall, before: State, after: State) -> str:
    args = call.arguments

    def contact(cid: str) -> str:
        return after["contacts"].get(cid, before["contacts"].get(cid, {})).get("name", cid)

    def product(pid: str) -> str:
        return before["products"].get(pid, {}).get("name", pid)

    match call.name:
        case "add_contact":
            return f"save {args['name']}'s number {args['phone']}"
        case "update_phone":
            return f"change {contact(args['contact_id'])}'s phone to {args['phone']}"
        case "delete_contact":
            return f"delete the contact {contact(args['contact_id'])}"
        case "send_message":
            return f"text {contact(args['contact_id'])}: '{args['text']}'"
        case "delete_message":
            return f"delete the message '{before['messages'][args['message_id']]['text']}'"
        case "create_event":
            return f"put {args['title']} on the calendar on {args['date']} at {args['time']}"
        case "move_event":
            return f"move {before['events'][args['event_id']]['title']} to {args['date']} at {args['time']}"
        case "cancel_event":
            return f"cancel {before['events'][args['event_id']]['title']}"
        case "create_note":
            return f"create a note titled {args['title']} saying '{args['body']}'"
        case "append_note":
            return f"add '{args['text']}' to the note {before['notes'][args['note_id']]['title']}"
        case "delete_note":
            return f"delete the note {before['notes'][args['note_id']]['title']}"
        case "add_to_cart":
            quantity = int(args["quantity"])
            name = product(args["product_id"])
            return f"put {quantity} {name}{'s' if quantity > 1 else ''} in the cart"
        case "remove_from_cart":
            return f"take the {product(args['product_id'])} out of the cart"
        case "checkout":
            return "check out"
        case "cancel_order":
            items = before["orders"][args["order_id"]]["items"]
            return f"cancel the order of the {' and '.join(product(p) for p in items)}"
        case "top_up":
            return f"top up the wallet by {args['amount']}"
        case "set_reminder":
            return f"set a reminder '{args['text']}' on {args['date']} at {args['time']}"
        case "delete_reminder":
            return f"delete the reminder '{before['reminders'][args['reminder_id']]['text']}'"
    return ""


def _lookup_clause(call: ToolCall, state: State) -> str:
    args = call.arguments
    match call.name:
        case "find_contact":
            return f"find {args.get('name')}'s phone number"
        case "find_event":
            return f"find when {args.get('title')} is"
        case "search_products":
            return f"find the price of the {args.get('query')}"
        case "get_balance":
            return "check the wallet balance"
    return f"use {call.name} to look something up"


def _sample_arguments(name: str, state: State, rng: random.Random) -> dict[str, Any] | None:
    pools = pools_for("train")

    def pick(collection: str) -> str | None:
        ids = sorted(state[collection])
        return rng.choice(ids) if ids else None

    contact_id, event_id, note_id = pick("contacts"), pick("events"), pick("notes")
    product_id, order_id = pick("products"), pick("orders")
    message_id, reminder_id = pick("messages"), pick("reminders")
    text = rng.choice(pools.messages)
    days = sorted({e["date"] for e in state["events"].values()})
    in_cart = next(iter(state["cart"]), None)
    # Per tool: the item its call needs (None: the state has none, so no call; True: needs
    # none) and what makes its arguments, drawing from ``rng`` only for the chosen tool.
    tools: dict[str, tuple[Any, Callable[[], dict[str, Any]]]] = {
        "find_contact": (contact_id, lambda: {"name": state["contacts"][contact_id]["name"]}),
        "add_contact": (True, lambda: {"name": rng.choice(pools.names), "phone": phone(rng)}),
        "update_phone": (contact_id, lambda: {"contact_id": contact_id, "phone": phone(rng)}),
        "delete_contact": (contact_id, lambda: {"contact_id": contact_id}),
        "read_messages": (contact_id, lambda: {"contact_id": contact_id}),
        "send_message": (contact_id, lambda: {"contact_id": contact_id, "text": text}),
        "search_messages": (True, lambda: {"query": text.split()[0]}),
        "delete_message": (message_id, lambda: {"message_id": message_id}),
        "find_event": (event_id, lambda: {"title": state["events"][event_id]["title"]}),
        "list_events": (True, lambda: {"date": rng.choice(days) if days else date(rng)}),
        "create_event": (
            True,
            lambda: {"title": rng.choice(pools.titles), "date": date(rng), "time": clock(rng)},
        ),
        "move_event": (
            event_id,
            lambda: {"event_id": event_id, "date": date(rng), "time": clock(rng)},
        ),
        "cancel_event": (event_id, lambda: {"event_id": event_id}),
        "create_note": (True, lambda: {"title": rng.choice(pools.titles), "body": text}),
        "find_note": (note_id, lambda: {"title": state["notes"][note_id]["title"]}),
        "read_note": (note_id, lambda: {"note_id": note_id}),
        "delete_note": (note_id, lambda: {"note_id": note_id}),
        "append_note": (note_id, lambda: {"note_id": note_id, "text": text}),
        "search_products": (product_id, lambda: {"query": state["products"][product_id]["name"]}),
        "add_to_cart": (
            product_id,
            lambda: {"product_id": product_id, "quantity": rng.choice([1, 1, 2])},
        ),
        "remove_from_cart": (in_cart, lambda: {"product_id": in_cart}),
        "cancel_order": (order_id, lambda: {"order_id": order_id}),
        "top_up": (True, lambda: {"amount": rng.choice([10, 20, 25, 50])}),
        "set_reminder": (True, lambda: {"text": text, "date": date(rng), "time": clock(rng)}),
        "delete_reminder": (reminder_id, lambda: {"reminder_id": reminder_id}),
    }
    if name not in tools:  # a tool without arguments
        return {}
    needed, arguments = tools[name]
    return None if needed is None else arguments()
