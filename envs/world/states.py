"""Seeded states of the built-in world, and the value pools they draw from.

Entity values (names, products, event titles, message texts) are drawn from
pools partitioned between splits (``pools_for``), so the held-out split has
values never seen in training. ``make_state`` builds a small, plausible world
from a seeded generator; the task families (``families.py``) start from it.
"""

from __future__ import annotations

import random
from dataclasses import dataclass

from .app_state import State, empty_state
from .apps import World

NAMES = """Ana Bo Cy Dee Eli Fay Gus Hal Ida Jo Kai Liv Max Nia Oz Pam Quin Rex Sal Tom Uma Val Wes
Xia Yul Zed Abe Bea Cal Dot Ed Flo Gil Hana Ike Jan Kit Lou Mo Ned Ola Pia Ray Sue Ty Una Vic Wyn
Alf Bex Cas Dax Eve Fin Gia Hux Ivo Jax Kim Lea Mia Noa Ora Pip Rio Sky Tess Ugo Vera Wim Yara Zoe
Ari Ben Cleo Dan Ema Fox Gwen Hugo Isa Joy Kay Leo Mae Nat Otto Pax Rue Sam Tia Uli Vin Will Yves
Zia Amy Bram Cora Dov Esme Finn Gabe Hope Iris Jude Kurt Lars Mina Nico Opal Remy Sid Tam Vito""".split()

PRODUCTS = """lamp mug desk chair kettle towel pillow candle rug mirror clock vase fan heater
blender toaster kettlebell yoga-mat backpack wallet umbrella scarf gloves hat jacket boots socks
notebook pencil stapler marker eraser ruler tape glue scissors printer mouse keyboard monitor
cable charger speaker headset webcam tripod battery bulb drill hammer wrench saw ladder bucket
broom sponge soap shampoo razor brush comb lotion""".split()

EVENT_TITLES = """dentist standup gym lunch yoga review demo haircut doctor piano tennis dinner
interview retro sync vet swim class party meeting workshop brunch recital checkup game
massage training seminar hike concert movie picnic rehearsal exam tutoring errands call
planning offsite webinar fitting garage bakery museum library""".split()

MESSAGES = """running late|call me back|see you soon|on my way|happy birthday|thanks a lot|
lunch at noon|bring the keys|meeting moved|good luck today|miss you|dinner is ready|
pick up milk|running early|check your mail|call when free|almost there|all done|
send the file|got your note|back at six|need a ride|park is closed|rain later|
bus is late|keys are home|door is open|feed the cat|water the plants|game tonight|
see you at five|no rush|well done|take care|coffee later|movie at eight|
train delayed|store is open|book is back|shoes are ready|call the bank|trip is on""".replace(
    "\n", ""
).split("|")

SPLITS = ("train", "validation", "heldout")


def _partition(values: list[str]) -> dict[str, list[str]]:
    """Deterministic disjoint pools: 3/5 train, 1/5 validation, 1/5 held-out."""
    pools: dict[str, list[str]] = {split: [] for split in SPLITS}
    for index, value in enumerate(values):
        bucket = index % 5
        pools["train" if bucket < 3 else "validation" if bucket == 3 else "heldout"].append(value)
    return pools


@dataclass(frozen=True)
class Pools:
    names: list[str]
    products: list[str]
    titles: list[str]
    messages: list[str]


_NAME_POOLS = _partition(NAMES)
_PRODUCT_POOLS = _partition(PRODUCTS)
_TITLE_POOLS = _partition(EVENT_TITLES)
_MESSAGE_POOLS = _partition(MESSAGES)


def pools_for(split: str) -> Pools:
    if split not in SPLITS:
        raise ValueError(f"unknown world split {split!r}; allowed: {', '.join(SPLITS)}")
    return Pools(
        _NAME_POOLS[split], _PRODUCT_POOLS[split], _TITLE_POOLS[split], _MESSAGE_POOLS[split]
    )


def phone(rng: random.Random) -> str:
    return f"555-{rng.randrange(10000):04d}"


def date(rng: random.Random) -> str:
    return f"{rng.randint(1, 12):02d}-{rng.randint(1, 28):02d}"


def clock(rng: random.Random) -> str:
    return f"{rng.randint(7, 20):02d}:{rng.choice(['00', '30'])}"


def make_state(rng: random.Random, pools: Pools) -> State:
    """A small, plausible world: a handful of contacts, messages, events, products, orders."""
    world = World(empty_state(balance=rng.randint(40, 120)))
    for name in rng.sample(pools.names, rng.randint(4, 6)):
        world.add_contact(name, phone(rng))
    contact_ids = list(world.state["contacts"])
    for contact_id in rng.sample(contact_ids, 2):
        receive(world, contact_id, rng.choice(pools.messages))
    for title in rng.sample(pools.titles, rng.randint(2, 4)):
        world.create_event(title, date(rng), clock(rng))
    for title in rng.sample(pools.titles, rng.randint(0, 2)):
        world.create_note(title, rng.choice(pools.messages))
    for name in rng.sample(pools.products, rng.randint(4, 6)):
        _add_product(world, name, rng.randint(3, 40))
    if rng.random() < 0.5:
        world.add_to_cart(rng.choice(list(world.state["products"])), 1)
        if world._cart_total() <= world.state["wallet"]["balance"]:
            world.checkout()
        world.state["cart"] = {}
    return world.state


def receive(world: World, contact_id: str, text: str) -> str:
    message_id = world._new_id("messages")
    world.state["messages"][message_id] = {
        "contact_id": contact_id,
        "direction": "in",
        "text": text,
    }
    return message_id


def _add_product(world: World, name: str, price: int) -> str:
    product_id = f"p{len(world.state['products']) + 1}"
    world.state["products"][product_id] = {"name": name, "price": price}
    return product_id
