"""Task families of the built-in world (their states come from ``states.py``).

Families differ in structure, because that is what targeted data can fix:
how many calls (1-6), which values flow from an observation into a later call
(ids, prices, times, message text), and whether an error has to be recovered
from (a missing contact, a payment short of funds). Entity values are drawn
from pools that are partitioned between splits (``states.py``), so the held-out
split has names, products, titles and phrases never seen in training.
"""

from __future__ import annotations

import random
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from ...records import ToolCall
from .app_state import State
from .apps import World
from .states import Pools, clock, date, phone, receive


def _unused(rng: random.Random, pool: list[str], items: dict[str, Any], key: str) -> str:
    """A value of ``pool`` that no item of a collection has as its ``key`` yet."""
    taken = {item[key] for item in items.values()}
    return rng.choice([value for value in pool if value not in taken])


def _pick(
    rng: random.Random, state: State, collection: str, exclude: tuple[str, ...] = ()
) -> tuple[str, dict[str, Any]]:
    item_id = rng.choice(sorted(i for i in state[collection] if i not in exclude))
    return item_id, state[collection][item_id]


def _next(state: State, prefix: str) -> str:
    return f"{prefix}{state['next_id'][prefix]}"


def call(tool: str, /, **arguments: Any) -> ToolCall:
    return ToolCall(name=tool, arguments=arguments)


# --------------------------------------------------------------------------- families


@dataclass
class Draft:
    """What a family generator produces; the split builder turns it into a Task."""

    instruction: str
    calls: list[ToolCall]
    answer: str | None = None
    # Checker relaxations: fields the verifier ignores, texts it only requires to contain.
    check: dict[str, Any] = field(default_factory=dict)


Generator = Callable[[random.Random, Pools, State], Draft]


def phone_lookup(rng: random.Random, pools: Pools, state: State) -> Draft:
    _, contact = _pick(rng, state, "contacts")
    name = contact["name"]
    phrasing = rng.choice(
        [
            f"What is {name}'s phone number?",
            f"Look up the number for {name}.",
            f"I need {name}'s number.",
            f"Find {name}'s phone number for me.",
        ]
    )
    return Draft(phrasing, [call("find_contact", name=name)], answer=contact["phone"])


def add_contact(rng: random.Random, pools: Pools, state: State) -> Draft:
    name, number = _unused(rng, pools.names, state["contacts"], "name"), phone(rng)
    phrasing = rng.choice(
        [
            f"Save {name}'s number {number}.",
            f"Add {name} to my contacts, phone {number}.",
            f"New contact: {name}, {number}.",
            f"Please store {number} as {name}.",
        ]
    )
    return Draft(phrasing, [call("add_contact", name=name, phone=number)])


def create_event(rng: random.Random, pools: Pools, state: State) -> Draft:
    title = _unused(rng, pools.titles, state["events"], "title")
    day, time = date(rng), clock(rng)
    phrasing = rng.choice(
        [
            f"Put {title} on my calendar on {day} at {time}.",
            f"Schedule {title} for {day} {time}.",
            f"Add an event {title}, {day} at {time}.",
            f"Book {title} on {day} at {time} in my calendar.",
        ]
    )
    return Draft(phrasing, [call("create_event", title=title, date=day, time=time)])


def price_check(rng: random.Random, pools: Pools, state: State) -> Draft:
    _, product = _pick(rng, state, "products")
    name = product["name"]
    phrasing = rng.choice(
        [
            f"How much does the {name} cost?",
            f"What is the price of a {name}?",
            f"Check the shop price of the {name}.",
        ]
    )
    return Draft(phrasing, [call("search_products", query=name)], answer=str(product["price"]))


def set_reminder(rng: random.Random, pools: Pools, state: State) -> Draft:
    text, day, time = rng.choice(pools.messages), date(rng), clock(rng)
    phrasing = rng.choice(
        [
            f"Remind me to {text} on {day} at {time}.",
            f"Set a reminder '{text}' for {day} {time}.",
            f"On {day} at {time} remind me: {text}.",
        ]
    )
    return Draft(phrasing, [call("set_reminder", text=text, date=day, time=time)])


def send_message(rng: random.Random, pools: Pools, state: State) -> Draft:
    contact_id, contact = _pick(rng, state, "contacts")
    name, text = contact["name"], rng.choice(pools.messages)
    phrasing = rng.choice(
        [
            f"Text {name}: {text}.",
            f"Send {name} a message saying '{text}'.",
            f"Message {name} '{text}'.",
            f"Tell {name} '{text}' by text.",
        ]
    )
    return Draft(
        phrasing,
        [call("find_contact", name=name), call("send_message", contact_id=contact_id, text=text)],
    )


def update_phone(rng: random.Random, pools: Pools, state: State) -> Draft:
    contact_id, contact = _pick(rng, state, "contacts")
    name, number = contact["name"], phone(rng)
    phrasing = rng.choice(
        [
            f"{name} has a new number: {number}. Update it.",
            f"Change {name}'s phone to {number}.",
            f"Update {name}'s number to {number}.",
        ]
    )
    return Draft(
        phrasing,
        [
            call("find_contact", name=name),
            call("update_phone", contact_id=contact_id, phone=number),
        ],
    )


def cancel_event(rng: random.Random, pools: Pools, state: State) -> Draft:
    event_id, event = _pick(rng, state, "events")
    title = event["title"]
    phrasing = rng.choice(
        [f"Cancel my {title}.", f"Remove {title} from my calendar.", f"Delete the {title} event."]
    )
    return Draft(
        phrasing, [call("find_event", title=title), call("cancel_event", event_id=event_id)]
    )


def cancel_order(rng: random.Random, pools: Pools, state: State) -> Draft:
    world = World(state)
    ordered = {pid for order in state["orders"].values() for pid in order["items"]}
    # Distinct products per order, so "the order of the <item>" names one order.
    placed = []
    for _ in range(rng.randint(1, 2)):
        product_id, product = _pick(rng, state, "products", exclude=tuple(ordered))
        ordered.add(product_id)
        world.state["wallet"]["balance"] += product["price"]
        world.add_to_cart(product_id, 1)
        placed.append(_next(state, "o"))
        world.checkout()
    order_id = rng.choice(placed)
    item = state["products"][next(iter(state["orders"][order_id]["items"]))]["name"]
    phrasing = rng.choice(
        [
            f"Cancel my order of the {item}.",
            f"I don't want the {item} any more, cancel that order.",
            f"Please cancel the order with the {item} and get my money back.",
        ]
    )
    return Draft(phrasing, [call("list_orders"), call("cancel_order", order_id=order_id)])


def buy_item(rng: random.Random, pools: Pools, state: State) -> Draft:
    product_id, product = _pick(rng, state, "products")
    quantity = rng.choice([1, 1, 2, 3])
    state["wallet"]["balance"] = max(
        state["wallet"]["balance"], product["price"] * quantity + rng.randint(0, 30)
    )
    name = product["name"]
    count = f"{quantity} {name}s" if quantity > 1 else f"a {name}"
    phrasing = rng.choice(
        [f"Buy {count}.", f"Order {count} from the shop.", f"Get me {count}, and pay for it."]
    )
    return Draft(
        phrasing,
        [
            call("search_products", query=name),
            call("add_to_cart", product_id=product_id, quantity=quantity),
            call("checkout"),
        ],
    )


def message_new_contact(rng: random.Random, pools: Pools, state: State) -> Draft:
    name = _unused(rng, pools.names, state["contacts"], "name")
    number, text = phone(rng), rng.choice(pools.messages)
    new_id = _next(state, "c")
    phrasing = rng.choice(
        [
            f"Text {name}: {text}. If {name} is not in my contacts, the number is {number}.",
            f"Send {name} '{text}'. Save {name} as {number} first if needed.",
            f"Message {name} ({number}) '{text}'.",
        ]
    )
    return Draft(
        phrasing,
        [
            call("find_contact", name=name),
            call("add_contact", name=name, phone=number),
            call("send_message", contact_id=new_id, text=text),
        ],
    )


def save_message_note(rng: random.Random, pools: Pools, state: State) -> Draft:
    contact_id, contact = _pick(rng, state, "contacts")
    text = rng.choice(pools.messages)
    receive(World(state), contact_id, text)
    name = contact["name"]
    phrasing = rng.choice(
        [
            f"Save the last message from {name} as a note titled {name}.",
            f"Copy {name}'s latest text into a new note called {name}.",
            f"Make a note named {name} with what {name} last wrote to me.",
        ]
    )
    return Draft(
        phrasing,
        [
            call("find_contact", name=name),
            call("read_messages", contact_id=contact_id),
            call("create_note", title=name, body=text),
        ],
    )


def share_event_time(rng: random.Random, pools: Pools, state: State) -> Draft:
    _event_id, event = _pick(rng, state, "events")
    contact_id, contact = _pick(rng, state, "contacts")
    title, name = event["title"], contact["name"]
    phrasing = rng.choice(
        [
            f"Tell {name} when my {title} is.",
            f"Text {name} the date and time of the {title}.",
            f"Let {name} know the time of my {title}.",
        ]
    )
    return Draft(
        phrasing,
        [
            call("find_event", title=title),
            call("find_contact", name=name),
            call(
                "send_message",
                contact_id=contact_id,
                text=f"{title} is on {event['date']} at {event['time']}",
            ),
        ],
        check={"message_must_contain": [event["date"], event["time"]]},
    )


def remind_event(rng: random.Random, pools: Pools, state: State) -> Draft:
    _event_id, event = _pick(rng, state, "events")
    title = event["title"]
    phrasing = rng.choice(
        [
            f"Set a reminder for my {title} at the time it starts.",
            f"Remind me of the {title} when it begins.",
            f"Add a reminder called {title} at the {title}'s date and time.",
        ]
    )
    return Draft(
        phrasing,
        [
            call("find_event", title=title),
            call("set_reminder", text=title, date=event["date"], time=event["time"]),
        ],
    )


def reschedule_and_notify(rng: random.Random, pools: Pools, state: State) -> Draft:
    event_id, event = _pick(rng, state, "events")
    contact_id, contact = _pick(rng, state, "contacts")
    title, name, day, time = event["title"], contact["name"], date(rng), clock(rng)
    phrasing = rng.choice(
        [
            f"Move my {title} to {day} at {time} and tell {name} the new time.",
            f"Reschedule {title} to {day} {time}, then text {name} about it.",
            f"Push the {title} to {day} at {time} and let {name} know.",
        ]
    )
    return Draft(
        phrasing,
        [
            call("find_event", title=title),
            call("move_event", event_id=event_id, date=day, time=time),
            call("find_contact", name=name),
            call("send_message", contact_id=contact_id, text=f"{title} moved to {day} at {time}"),
        ],
        check={"message_must_contain": [day, time]},
    )


def buy_with_topup(rng: random.Random, pools: Pools, state: State) -> Draft:
    product_id, product = _pick(rng, state, "products")
    quantity = rng.choice([1, 2])
    total = product["price"] * quantity
    state["wallet"]["balance"] = rng.randint(0, total - 1)
    short = total - state["wallet"]["balance"]
    name = product["name"]
    count = f"{quantity} {name}s" if quantity > 1 else f"a {name}"
    phrasing = rng.choice(
        [
            f"Buy {count}. Top up the wallet if it is short.",
            f"Order {count}; add money to my wallet if the payment fails.",
            f"Get me {count}, topping up the wallet by what is missing if needed.",
        ]
    )
    return Draft(
        phrasing,
        [
            call("search_products", query=name),
            call("add_to_cart", product_id=product_id, quantity=quantity),
            call("checkout"),
            call("top_up", amount=short),
            call("checkout"),
        ],
        # How much to top up is the agent's choice; the order is what counts.
        check={"ignore": ["wallet"]},
    )


def buy_two(rng: random.Random, pools: Pools, state: State) -> Draft:
    first_id, first = _pick(rng, state, "products")
    second_id, second = _pick(rng, state, "products", exclude=(first_id,))
    state["wallet"]["balance"] = max(
        state["wallet"]["balance"], first["price"] + second["price"] + 5
    )
    a, b = first["name"], second["name"]
    phrasing = rng.choice(
        [
            f"Buy a {a} and a {b} in one order.",
            f"Order one {a} and one {b} together.",
            f"Put a {a} and a {b} in the cart and check out.",
        ]
    )
    return Draft(
        phrasing,
        [
            call("search_products", query=a),
            call("add_to_cart", product_id=first_id, quantity=1),
            call("search_products", query=b),
            call("add_to_cart", product_id=second_id, quantity=1),
            call("checkout"),
        ],
    )


def move_and_tell_two(rng: random.Random, pools: Pools, state: State) -> Draft:
    event_id, event = _pick(rng, state, "events")
    (first_id, first), (second_id, second) = (
        (cid, state["contacts"][cid]) for cid in rng.sample(sorted(state["contacts"]), 2)
    )
    title, day, time = event["title"], date(rng), clock(rng)
    a, b = first["name"], second["name"]
    phrasing = rng.choice(
        [
            f"Move {title} to {day} at {time} and text both {a} and {b} the new time.",
            f"Reschedule my {title} to {day} {time}; tell {a} and {b}.",
            f"Shift the {title} to {day} at {time}, then message {a} and then {b} about it.",
        ]
    )
    text = f"{title} moved to {day} at {time}"
    return Draft(
        phrasing,
        [
            call("find_event", title=title),
            call("move_event", event_id=event_id, date=day, time=time),
            call("find_contact", name=a),
            call("send_message", contact_id=first_id, text=text),
            call("find_contact", name=b),
            call("send_message", contact_id=second_id, text=text),
        ],
        check={"message_must_contain": [day, time]},
    )


# Family name -> (generator, weight in the seed training split, in percent).
# The uneven weights are deliberate: rare families (<= 3%) are what the rare and
# forgetting signals should find and targeted synthesis should lift.
FAMILIES: dict[str, tuple[Generator, int]] = {
    "phone_lookup": (phone_lookup, 11),
    "add_contact": (add_contact, 10),
    "create_event": (create_event, 10),
    "price_check": (price_check, 9),
    "set_reminder": (set_reminder, 6),
    "send_message": (send_message, 11),
    "update_phone": (update_phone, 6),
    "cancel_event": (cancel_event, 6),
    "cancel_order": (cancel_order, 4),
    "remind_event": (remind_event, 2),
    "buy_item": (buy_item, 8),
    "message_new_contact": (message_new_contact, 2),
    "save_message_note": (save_message_note, 3),
    "share_event_time": (share_event_time, 3),
    "reschedule_and_notify": (reschedule_and_notify, 3),
    "buy_with_topup": (buy_with_topup, 2),
    "buy_two": (buy_two, 2),
    "move_and_tell_two": (move_and_tell_two, 2),
}
assert sum(weight for _, weight in FAMILIES.values()) == 100
