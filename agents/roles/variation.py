"""Variations of a task the agent failed, with no model and no task generator (issue 85).

A variant keeps the parent's calls in the parent's order and the flow of values between
them, and changes the values:

- **slots** are argument values the request states verbatim; each gets a new value from
  the task's own state (another entity of the same kind, or the entity renamed everywhere
  in the state), from other seed tasks' stated values of the same tool argument, or in the
  old value's format (555-0192, 05-14, 09:30, a count), and changes everywhere at once:
  request, calls, texts built from it, the answer, the parent's ``check`` and the state;
- **copied values** (ids, a price, a message body, an error's ``short=``) are read again
  from the variant's own observation at the place the parent read them;
- the variant is replayed in a fresh environment and kept only when every call fails or
  succeeds as the parent's did and the environment's verifier scores it 1.0.

It uses only the ``Environment`` protocol (``envs/base.py``): never a generator, a
sampler or a describer. A task that cannot be varied gets a reason from ``REASONS``.
"""

from __future__ import annotations

import functools
import hashlib
import json
import random
import re
from collections import Counter
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from ...envs.base import Environment, answer_in_observations, replay_reference
from ...records import Task, ToolCall, is_success

REASONS = (
    "no_calls",  # nothing to replay
    "parent_fails",  # the parent's own reference does not replay to 1.0
    "id_in_request",  # an id argument is written in the request
    "row_chosen_by_unstated",  # a copied value's row is picked by a value no call takes
    "copied_text",  # a text built from values read off an observation
    "computed_value",  # a number neither stated nor observed
    "paraphrased_value",  # a text neither stated verbatim nor observed
    "no_new_value",  # nothing stated to vary, or no new value for it
    "old_value_in_request",  # the new request still names a value that changed
    "uncarried_value",  # a new value no call or observation carries
    "replay_failed",  # a call failed (or succeeded) where the parent's did not
    "verifier_rejected",  # the environment's verifier scored the variant below 1.0
)
ATTEMPTS = 8  # value draws tried per key before giving up with the commonest reason

Path = tuple[str | int, ...]
# Whole tokens: "c3" is not in "c31", "30" is not in "09:30", "kent" not in "dev.kent@x".
_LEFT, _RIGHT = r"(?<![\w@.:/-])", r"(?![\w@/-]|[.:]\w)"
_FIELD = re.compile(r"(?<!\S)([A-Za-z_][\w.-]*)=")
_NUMBER_WORDS = {1: ("a", "an", "one"), 2: ("two",), 3: ("three",), 4: ("four",)}


@dataclass
class Variant:
    task: Task  # the parent's id, env, family and split kept; provenance is the caller's
    replaced: dict[str, str]  # old -> new, every slot that changed
    reread: list[tuple[int, str, str, str]]  # (call index, argument, old, new) read again
    renamed_in_state: dict[str, str]  # old -> new, the slots renamed everywhere in the state


@dataclass
class NotVaried:
    reason: str  # one of REASONS
    detail: str


# --------------------------------------------------------------------------- text


def names(text: str, value: object) -> bool:
    """``value`` appears in ``text`` as a whole token, any case, maybe plural."""
    return _pattern((str(value),)).search(text) is not None


@functools.lru_cache(maxsize=8192)
def _pattern(olds: tuple[str, ...]) -> re.Pattern[str]:
    alternatives = "|".join(re.escape(old.strip()) for old in sorted(olds, key=len, reverse=True))
    article, plural = r"(?:\b(an?) )?", r"((?<=[a-z])(?:es|s))?"
    return re.compile(article + _LEFT + f"({alternatives})" + plural + _RIGHT, re.IGNORECASE)


def replace_values(text: str, mapping: Mapping[str, str]) -> str:
    """Every whole-token occurrence of an old value replaced by its new one, in one pass (so
    a -> b, b -> c swaps), keeping a capital first letter and a plural ending, and
    fitting "a"/"an" before it."""
    if not mapping:
        return text
    lookup = {old.strip().casefold(): new for old, new in mapping.items()}

    def swap(match: re.Match[str]) -> str:
        article, found, plural = match.group(1), match.group(2), match.group(3) or ""
        new = lookup[found.casefold()]
        if found[:1].isupper() and new[:1].islower() and found != found.upper():
            new = new[:1].upper() + new[1:]
        if plural:  # "2 lotions" -> "3 socks", "3 wrenches"
            plural = (
                "" if new.endswith("s") else "es" if new.endswith(("x", "z", "ch", "sh")) else "s"
            )
        if article:  # "a login ticket" -> "an other ticket"
            article = article[0] + ("n" if new[:1].casefold() in "aeiou" else "") + " "
        return (article or "") + new + plural

    return _pattern(tuple(mapping)).sub(swap, text)


def _fields(row: str) -> list[tuple[str, str]]:
    """``key=value`` pairs of an observation line; quoted values unquoted, a bare value runs
    to the next ``key=`` (``name=Dev Kent email=...``)."""
    marks = list(_FIELD.finditer(row))
    found = []
    for mark, after in zip(marks, [*marks[1:], None], strict=False):
        raw = row[mark.end() : after.start() if after else len(row)].strip()
        if raw.startswith('"'):
            try:
                raw = str(json.loads(raw))
            except ValueError:
                raw = raw.strip('"')
        found.append((mark.group(1), raw))
    return found


def _tokens(row: str) -> list[str]:
    return [word.strip(".,;:!?()'\"") for word in row.split()]


# --------------------------------------------------------------------------- places


@dataclass(frozen=True)
class Place:
    """Where in an earlier observation a copied value was read."""

    step: int
    row: int  # the line; -1 for the last of several
    key: str | None  # the field's name; None: the token at ``token``
    token: int = 0
    row_by: str | None = None  # the line is the one holding this slot's (old) value


def find_place(
    value: str, observations: Sequence[str], before: int, slots: Sequence[str]
) -> Place | None:
    """The latest observation before call ``before`` that shows ``value``, and where."""
    for step in range(before - 1, -1, -1):
        rows = observations[step].splitlines()
        for index, row in enumerate(rows):
            key = next((k for k, v in _fields(row) if v.casefold() == value.casefold()), None)
            tokens = [t.casefold() for t in _tokens(row)]
            if key is None and value.casefold() not in tokens:
                continue
            token = tokens.index(value.casefold()) if key is None else 0
            # several lines: the one a slot picks, else the same position (last stays last)
            by = next(
                (s for s in slots if names(row, s) and sum(names(r, s) for r in rows) == 1), None
            )
            last = len(rows) > 1 and index == len(rows) - 1
            return Place(step, -1 if last else index, key, token, by if len(rows) > 1 else None)
    return None


def read_place(
    place: Place, observations: Sequence[str], slot_map: Mapping[str, str]
) -> str | None:
    """The value at ``place`` in the variant's observations; None when it is not there."""
    rows = observations[place.step].splitlines()
    if place.row_by is not None:
        holding = [row for row in rows if names(row, slot_map.get(place.row_by, place.row_by))]
        rows, row_index = holding, 0 if len(holding) == 1 else len(holding)
    else:
        row_index = place.row if place.row >= 0 else len(rows) - 1
    if not 0 <= row_index < len(rows):
        return None
    row = rows[row_index]
    if place.key is not None:
        return next((v for k, v in _fields(row) if k == place.key), None)
    tokens = _tokens(row)
    return tokens[place.token] if place.token < len(tokens) else None


# --------------------------------------------------------------------------- data walks


def _leaves(data: Any, path: Path = ()) -> Iterator[tuple[Path, Any]]:
    if isinstance(data, Mapping):
        for key, value in data.items():
            yield from _leaves(value, (*path, key))
    elif isinstance(data, list):
        for index, value in enumerate(data):
            yield from _leaves(value, (*path, index))
    else:
        yield path, data


def _map_leaves(data: Any, change: Callable[[Path, Any], Any], path: Path = ()) -> Any:
    if isinstance(data, Mapping):
        return {key: _map_leaves(value, change, (*path, key)) for key, value in data.items()}
    if isinstance(data, list):
        return [_map_leaves(value, change, (*path, i)) for i, value in enumerate(data)]
    return change(path, data)


def _shape(path: Path) -> Path:
    """A state path with its ids as ``*`` (``state.contacts.*.name``): one kind of value."""
    return tuple("*" if isinstance(p, int) or any(c.isdigit() for c in p) else p for p in path)


def _is_id(path: Path) -> bool:
    return str(path[-1]) == "id" or str(path[-1]).endswith("_id")


def _state(setup: Mapping[str, Any]) -> dict[str, Any]:
    """The setup without its checker relaxations: what the world starts from."""
    return {key: value for key, value in setup.items() if key != "check"}


def _text_of(data: Any) -> str:
    return "\n".join(str(v) for _, v in _leaves(data) if isinstance(v, str))


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
                for path, value in _leaves(call.arguments):
                    if isinstance(value, str | int) and not isinstance(value, bool):
                        if not _is_id(path) and names(request, value):
                            where = (call.name, str(path[-1]))
                            pools.stated.setdefault(where, []).append((task.id, value))
            for path, value in _leaves(_state(task.setup)):
                if isinstance(value, str) and value.strip():
                    pools.by_shape.setdefault(_shape(path), []).append((task.id, value))
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


def _slot(
    old: str | int, tool: str, argument: str, task: Task, pools: ValuePools, enum: list[Any]
) -> Slot:
    """Where new values for one stated value can come from. A value of the state gets
    another entity's value of the same kind, or (held by one entity) a name the state does
    not have, renamed everywhere; a value outside the state keeps outside it."""
    request = " ".join(turn.query for turn in task.turns)
    state = _state(task.setup)
    known = request + "\n" + _text_of(state)
    text = str(old).strip()
    seen = [v for tid, v in pools.stated.get((tool, argument), []) if tid != task.id]
    seen = [*seen, *(v for v in enum if isinstance(v, str | int))]
    if isinstance(old, int):
        ints = sorted({int(v) for v in seen if isinstance(v, int) and v != old})
        return Slot(text, {"seen": [str(v) for v in ints]}, _has_format(text))
    at = [
        p
        for p, v in _leaves(state)
        if isinstance(v, str) and v.strip().casefold() == text.casefold()
    ]
    words = sorted({str(v) for v in seen if isinstance(v, str)})
    if not at:
        fresh = [v for v in words if not names(known, v)]
        return Slot(text, {"seen": fresh}, _has_format(text))
    shapes = {_shape(p) for p in at}
    kind = {v for p, v in _leaves(state) if isinstance(v, str) and _shape(p) in shapes}
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


def _draw(
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


# --------------------------------------------------------------------------- the parent's flow


@dataclass
class Plan:
    """How each value of the parent is made in a variant."""

    slots: dict[str, tuple[str | int, str, str]]  # old text -> (value, tool, argument)
    copied: dict[tuple[int, Path], Place]  # (call index, argument path) -> where it was read
    answer: Place | None  # where the answer was read; None: written from the slots


def _unvariable(
    value: Any,
    where: str,
    request: str,
    before: Sequence[str],
    olds: Sequence[str],
    enum: list[Any],
) -> NotVaried | None:
    """Why a value neither stated nor read off an observation stops a variant; None when it
    can stay (a 1 written "a", a text built from slots, one of the schema's choices)."""
    if isinstance(value, int | float):
        if any(names(request, word) for word in _NUMBER_WORDS.get(int(value), ())):
            return None
        return NotVaried("computed_value", f"{where}={value} is neither stated nor observed")
    text = str(value)
    inside = [old for old in olds if names(text, old)]
    rest = replace_values(text, dict.fromkeys(inside, " "))
    observed = {v for obs in before for row in obs.splitlines() for _, v in _fields(row)}
    copied = sorted(v for v in observed if len(v) > 1 and not names(request, v) and names(rest, v))
    if copied:
        return NotVaried(
            "copied_text", f"{where}={text!r} copies {copied[0]!r} from an observation"
        )
    if inside or value in enum:
        return None
    return NotVaried(
        "paraphrased_value", f"{where}={text!r} is not in the request or an observation"
    )


def _plan(
    task: Task, observations: Sequence[str], enums: Mapping[tuple[str, str], list[Any]]
) -> Plan | NotVaried:
    request = " ".join(turn.query for turn in task.turns)
    values = [
        (index, call, path, value)
        for index, call in enumerate(task.reference_calls)
        for path, value in _leaves(call.arguments)
        if value is not None and not isinstance(value, bool) and str(value).strip()
    ]
    slots: dict[str, tuple[str | int, str, str]] = {}
    for _, call, path, value in values:
        if names(request, value):
            if _is_id(path):
                return NotVaried(
                    "id_in_request", f"{call.name}.{path[-1]}={value} is in the request"
                )
            slots.setdefault(str(value).strip(), (value, call.name, str(path[-1])))
    olds = list(slots)
    copied: dict[tuple[int, Path], Place] = {}
    for index, call, path, value in values:
        if str(value).strip() in slots:
            continue
        place = find_place(str(value), observations, index, olds)
        if place is not None:
            copied[(index, path)] = place
            continue
        enum = enums.get((call.name, str(path[-1])), [])
        where = f"{call.name}.{path[-1]}"
        problem = _unvariable(value, where, request, observations[:index], olds, enum)
        if problem is not None:
            return problem
    answer = task.reference_answer
    stated = answer is None or names(request, answer) or any(names(answer, old) for old in olds)
    answer_place = (
        None if stated else find_place(str(answer), observations, len(observations), olds)
    )
    places = [*copied.values(), *([answer_place] if answer_place else [])]
    unstated = _row_chosen_by_unstated(task, request, observations, places)
    return unstated or Plan(slots, copied, answer_place)


def _row_chosen_by_unstated(
    task: Task, request: str, observations: Sequence[str], places: Sequence[Place]
) -> NotVaried | None:
    """A value of the state the request names, which no call takes, in an observation a
    value is copied from: it picks the row (cancel the order *of the lamp*), and a variant
    could neither change it nor find the row again."""
    carried = [str(v) for _, v in _leaves([call.arguments for call in task.reference_calls])]
    sources = {place.step for place in places}
    for _, value in _leaves(_state(task.setup)):
        if not isinstance(value, str) or len(value) < 3 or not names(request, value):
            continue
        if any(names(text, value) for text in carried):
            continue
        if any(value.casefold() in observations[step].casefold() for step in sources):
            return NotVaried("row_chosen_by_unstated", f"{value!r} picks a row no call names")
    return None


# --------------------------------------------------------------------------- one variant


def _new_leaf(value: Any, mapping: Mapping[str, str]) -> Any:
    if isinstance(value, bool) or value is None:
        return value
    if isinstance(value, int) and str(value) in mapping:
        return int(mapping[str(value)])
    return replace_values(value, mapping) if isinstance(value, str) else value


def _set(data: Any, path: Path, value: Any) -> None:
    for step in path[:-1]:
        data = data[step]
    data[path[-1]] = value


def _replay_reading(
    task: Task,
    draft: Task,
    parent_errors: Sequence[str | None],
    plan: Plan,
    mapping: Mapping[str, str],
    make_env: Callable[[], Environment],
) -> tuple[list[str], list[tuple[int, str, str, str]]] | NotVaried:
    """Run the draft's calls in a fresh environment, filling each copied value from the new
    observation at its place; every call must fail or succeed as the parent's did."""
    env = make_env()
    env.reset(draft)
    observations: list[str] = []
    reread: list[tuple[int, str, str, str]] = []
    parent_calls = task.reference_calls
    index = 0
    for number, turn in enumerate(draft.turns):
        for call in turn.reference_calls:
            for (at, path), place in plan.copied.items():
                if at != index:
                    continue
                old, got = (
                    _get(parent_calls[at].arguments, path),
                    read_place(place, observations, mapping),
                )
                if got is None or (isinstance(old, int) and not got.lstrip("-").isdigit()):
                    return NotVaried(
                        "replay_failed", f"call {at}: {path[-1]} not found where {old!r} was"
                    )
                _set(call.arguments, path, int(got) if isinstance(old, int) else got)
                reread.append((at, str(path[-1]), str(old), got))
            observation = env.step(call)
            if observation.error != parent_errors[index]:
                return NotVaried("replay_failed", f"{call.name}: {observation.text[:80]!r}")
            observations.append(observation.text)
            index += 1
        if number < len(draft.turns) - 1:
            env.end_turn(None)
    return observations, reread


def _get(data: Any, path: Path) -> Any:
    for step in path:
        data = data[step]
    return data


def _attempt(
    task: Task,
    parent_errors: Sequence[str | None],
    plan: Plan,
    mapping: Mapping[str, str],
    renamed: Mapping[str, str],
    make_env: Callable[[], Environment],
) -> Variant | NotVaried:
    """The variant these new values make, replayed and verified; or why it is refused."""
    queries = [replace_values(turn.query, mapping) for turn in task.turns]
    stale = [old for old in mapping if any(names(query, old) for query in queries)]
    if stale:
        return NotVaried("old_value_in_request", f"{stale[0]!r} is still in {' '.join(queries)!r}")
    state = _map_leaves(
        _state(task.setup), lambda _, v: replace_values(v, renamed) if isinstance(v, str) else v
    )
    turns = [
        turn.model_copy(
            update={
                "query": query,
                "reference_calls": [
                    ToolCall(
                        name=c.name,
                        arguments=_map_leaves(c.arguments, lambda _, v: _new_leaf(v, mapping)),
                    )
                    for c in turn.reference_calls
                ],
            }
        )
        for query, turn in zip(queries, task.turns, strict=True)
    ]
    draft = task.model_copy(update={"turns": turns, "setup": state})
    replayed = _replay_reading(task, draft, parent_errors, plan, mapping, make_env)
    if isinstance(replayed, NotVaried):
        return replayed
    observations, reread = replayed  # the draft's calls now hold the values read again
    answer = task.reference_answer
    if plan.answer is not None:
        answer = read_place(plan.answer, observations, mapping)
        if answer is None:
            return NotVaried(
                "replay_failed", f"the answer is not where {task.reference_answer!r} was"
            )
    elif answer is not None:
        answer = replace_values(answer, mapping)
    carried = [str(v) for c in draft.reference_calls for _, v in _leaves(c.arguments)]
    carried += observations
    lost = [new for new in mapping.values() if not any(names(text, new) for text in carried)]
    if lost:
        return NotVaried("uncarried_value", f"{lost[0]!r} is in no call and no observation")
    setup = dict(state)
    if "check" in task.setup:  # the parent's relaxations, with the new values (issue 85)
        copies = {old: new for _, _, old, new in reread}
        setup["check"] = _map_leaves(
            task.setup["check"],
            lambda _, v: (
                copies.get(v, _new_leaf(v, mapping))
                if isinstance(v, str)
                else _new_leaf(v, mapping)
            ),
        )
    digest = hashlib.sha1(
        json.dumps([queries, answer, setup], sort_keys=True, default=str).encode()
    ).hexdigest()[:10]
    variant = draft.model_copy(
        update={"id": f"{task.id}-var-{digest}", "reference_answer": answer, "setup": setup}
    )
    score, steps = replay_reference(make_env(), variant)
    if not is_success(score):
        return NotVaried("verifier_rejected", f"the verifier scored the variant {score:.2f}")
    if answer is not None and not answer_in_observations(steps, answer):
        return NotVaried("verifier_rejected", f"the answer {answer!r} is in no observation")
    return Variant(variant, dict(mapping), reread, dict(renamed))


# --------------------------------------------------------------------------- public


def _enums(schemas: Sequence[Mapping[str, Any]]) -> dict[tuple[str, str], list[Any]]:
    """Each tool argument's choices where its schema lists them (``enum``)."""
    found: dict[tuple[str, str], list[Any]] = {}
    for schema in schemas:
        function = schema.get("function", schema)
        for name, prop in (function.get("parameters", {}).get("properties") or {}).items():
            if isinstance(prop.get("enum"), list):
                found[(str(function.get("name")), name)] = prop["enum"]
    return found


def vary(
    task: Task,
    make_env: Callable[[], Environment],
    seed_tasks: Sequence[Task] | ValuePools,
    key: str,
) -> Variant | NotVaried:
    """A variant of ``task`` whose values ``key`` chooses (same key, same variant), replayed
    and scored 1.0 in fresh environments from ``make_env``; or why there is none.
    ``seed_tasks`` (train seeds only) lend their values; the task itself lends none."""
    if not task.reference_calls:
        return NotVaried("no_calls", "the task has no reference calls")
    pools = seed_tasks if isinstance(seed_tasks, ValuePools) else ValuePools.from_tasks(seed_tasks)
    env = make_env()
    enums = _enums(env.tools())
    score, steps = replay_reference(env, task)
    answer = task.reference_answer
    if not is_success(score) or (answer is not None and not answer_in_observations(steps, answer)):
        return NotVaried("parent_fails", f"the parent's reference does not check ({score:.2f})")
    plan = _plan(task, [step.observation.text for step in steps], enums)
    if isinstance(plan, NotVaried):
        return plan
    slots = [
        _slot(value, tool, arg, task, pools, enums.get((tool, arg), []))
        for value, tool, arg in plan.slots.values()
    ]
    if not any(slot.formatted or any(slot.options.values()) for slot in slots):
        return NotVaried("no_new_value", f"nothing to vary among {len(slots)} stated values")
    known = " ".join(turn.query for turn in task.turns) + "\n" + _text_of(_state(task.setup))
    errors = [step.observation.error for step in steps]
    failures: list[NotVaried] = []
    for attempt in range(ATTEMPTS):
        mapping, renamed = _draw(slots, known, random.Random(f"{key}:{attempt}"))
        if not mapping:
            failures.append(NotVaried("no_new_value", "no new value was left to draw"))
            continue
        result = _attempt(task, errors, plan, mapping, renamed, make_env)
        if isinstance(result, Variant):
            return result
        failures.append(result)
    commonest = Counter(failure.reason for failure in failures).most_common(1)[0][0]
    return next(failure for failure in failures if failure.reason == commonest)


def variation_coverage(
    tasks: Sequence[Task],
    make_env: Callable[[], Environment],
    seed_tasks: Sequence[Task],
    variants_per_task: int = 1,
) -> dict[str, Any]:
    """How many ``tasks`` get a replay-verified variant, and each reason for those that do
    not (a task counts under the reason of its first key): ``coevolve env vary``'s table."""
    pools = ValuePools.from_tasks(seed_tasks)
    reasons: Counter[str] = Counter()
    varied = variants = 0
    for task in tasks:
        made = [vary(task, make_env, pools, f"{task.id}:{n}") for n in range(variants_per_task)]
        kept = {v.task.id for v in made if isinstance(v, Variant)}
        variants += len(kept)
        varied += bool(kept)
        if not kept:
            reasons[next(m.reason for m in made if isinstance(m, NotVaried))] += 1
    return {
        "tasks": len(tasks),
        "varied": varied,
        "variants": variants,
        "not_varied": dict(reasons.most_common()),
    }
