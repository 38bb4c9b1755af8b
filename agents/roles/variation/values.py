"""Where a variant's new values come from: the task's own state (another entity of the same
kind, or one renamed everywhere), other seed tasks' stated values for the same tool
argument, or the old value's format; and the data walks over calls and states."""

from __future__ import annotations

import random
import re
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from ....records import Task
from .text import names

Path = tuple[str | int, ...]


# --------------------------------------------------------------------------- data walks


def leaves(data: Any, path: Path = ()) -> Iterator[tuple[Path, Any]]:
    if isinstance(data, Mapping):
        for key, value in data.items():
            yield from leaves(value, (*path, key))
    elif isinstance(data, list):
        for index, value in enumerate(data):
            yield from leaves(value, (*path, index))
    else:
        yield path, data


def map_leaves(data: Any, change: Callable[[Path, Any], Any], path: Path = ()) -> Any:
    if isinstance(data, Mapping):
        return {key: map_leaves(value, change, (*path, key)) for key, value in data.items()}
    if isinstance(data, list):
        return [map_leaves(value, change, (*path, i)) for i, value in enumerate(data)]
    return change(path, data)


def shape(path: Path) -> Path:
    """A state path with its ids as ``*`` (``state.contacts.*.name``): one kind of value."""
    return tuple("*" if isinstance(p, int) or any(c.isdigit() for c in p) else p for p in path)


def is_id(path: Path) -> bool:
    return str(path[-1]) == "id" or str(path[-1]).endswith("_id")


def state_of(setup: Mapping[str, Any]) -> dict[str, Any]:
    """The setup without its checker relaxations: what the world starts from."""
    return {key: value for key, value in setup.items() if key != "check"}


def text_of(data: Any) -> str:
    return "\n".join(str(v) for _, v in leaves(data) if isinstance(v, str))


# --------------------------------------------------------------------------- new values


@dataclass
class ValuePools:
    """Other seed tasks' values (train seeds only, as the caller passes them): the values
    their requests state for each tool argument, and their states' values by place."""

    stated: dict[tuple[str, str], list[tuple[str, str | int]]] = field(default_factory=dict)
    by_shape: dict[Path, list[tuple[str, str]]] = field(default_factory=dict)

    @classmethod
    def from_tasks(cls, tasks: Sequence[Task]) -> ValuePools:
        pools = cls()
        for task in tasks:
            request = " ".join(turn.query for turn in task.turns)
            for call in task.reference_calls:
                for path, value in leaves(call.arguments):
                    if isinstance(value, str | int) and not isinstance(value, bool):
                        if not is_id(path) and names(request, value):
                            where = (call.name, str(path[-1]))
                            pools.stated.setdefault(where, []).append((task.id, value))
            for path, value in leaves(state_of(task.setup)):
                if isinstance(value, str) and value.strip():
                    pools.by_shape.setdefault(shape(path), []).append((task.id, value))
        return pools


@dataclass
class Slot:
    old: str  # as the calls have it
    options: dict[str, list[str]]  # source ("other", "rename", "seen") -> new values
    formatted: bool  # new values can be made in the old one's format


def _like(old: str, rng: random.Random) -> str | None:
    """A new value in the old one's format: a count, MM-DD, HH:MM, 555-dddd; None if none."""
    if re.fullmatch(r"\d+", old):
        count = int(old)
        return str(rng.randint(max(2, count // 2), count * 2)) if count >= 2 else None
    if re.fullmatch(r"(0[1-9]|1[0-2])-\d\d", old):
        return f"{rng.randint(1, 12):02d}-{rng.randint(1, 28):02d}"
    if clock := re.fullmatch(r"(\d\d):(\d\d)", old):
        quarter = int(clock[2]) % 15 == 0
        minutes = rng.choice(["00", "15", "30", "45"]) if quarter else f"{rng.randint(0, 59):02d}"
        return f"{rng.randint(7, 21):02d}:{minutes}"
    if re.fullmatch(r"\d+(-\d+)+", old):  # keep the first group (555-), vary the rest
        head, rest = old.split("-", 1)
        return head + "-" + re.sub(r"\d", lambda _: str(rng.randint(0, 9)), rest)
    return None


def _has_format(value: str) -> bool:
    return _like(value, random.Random(0)) is not None


def slot_for(
    old: str | int, tool: str, argument: str, task: Task, pools: ValuePools, enum: list[Any]
) -> Slot:
    """Where new values for one stated value can come from. A value of the state gets
    another entity's value of the same kind, or (held by one entity) a name the state does
    not have, renamed everywhere; a value outside the state keeps outside it."""
    request = " ".join(turn.query for turn in task.turns)
    state = state_of(task.setup)
    known = request + "\n" + text_of(state)
    text = str(old).strip()
    seen = [v for tid, v in pools.stated.get((tool, argument), []) if tid != task.id]
    seen = [*seen, *(v for v in enum if isinstance(v, str | int))]
    if isinstance(old, int):
        ints = sorted({int(v) for v in seen if isinstance(v, int) and v != old})
        return Slot(text, {"seen": [str(v) for v in ints]}, _has_format(text))
    at = [
        p
        for p, v in leaves(state)
        if isinstance(v, str) and v.strip().casefold() == text.casefold()
    ]
    words = sorted({str(v) for v in seen if isinstance(v, str)})
    if not at:
        fresh = [v for v in words if not names(known, v)]
        return Slot(text, {"seen": fresh}, _has_format(text))
    shapes = {shape(p) for p in at}
    kind = {v for p, v in leaves(state) if isinstance(v, str) and shape(p) in shapes}
    options = {
        "other": sorted(
            v for v in kind if v.casefold() != text.casefold() and not names(request, v)
        )
    }
    if len(at) == 1 and not _has_format(text):  # rename a name, never a date
        elsewhere = [
            v for shape in shapes for tid, v in pools.by_shape.get(shape, []) if tid != task.id
        ]
        options["rename"] = sorted(v for v in {*words, *elsewhere} if not names(known, v))
    return Slot(text, options, _has_format(text))


def draw(
    slots: Sequence[Slot], known: str, rng: random.Random
) -> tuple[dict[str, str], dict[str, str]]:
    """One new value per slot that has any (old -> new), and those renamed in the state."""
    taken = {slot.old.casefold() for slot in slots}
    chosen: dict[str, str] = {}
    renamed: dict[str, str] = {}
    for slot in slots:
        kinds = {k: [v for v in vs if v.casefold() not in taken] for k, vs in slot.options.items()}
        if slot.formatted:
            made = {_like(slot.old, rng) for _ in range(4)}
            kinds["format"] = sorted(
                v for v in made if v and v.casefold() not in taken and not names(known, v)
            )
        kinds = {k: vs for k, vs in kinds.items() if vs}
        if not kinds:
            continue
        kind = rng.choice(sorted(kinds))
        new = rng.choice(kinds[kind])
        chosen[slot.old] = new
        taken.add(new.casefold())
        if kind == "rename":
            renamed[slot.old] = new
    return chosen, renamed
