"""One variant of a failed task: the parent's flow of values planned, new values drawn, the
draft replayed with copied values read again, verified by the environment; or the reason
there is none (``REASONS``)."""

from __future__ import annotations

import hashlib
import json
import random
from collections import Counter
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from ....envs.base import Environment, answer_in_observations, replay_reference
from ....records import Step, Task, ToolCall, is_success
from .text import Place, fields, find_place, names, read_place, replace_values
from .values import Path, ValuePools, draw, is_id, leaves, map_leaves, slot_for, state_of, text_of

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
_NUMBER_WORDS = {1: ("a", "an", "one"), 2: ("two",), 3: ("three",), 4: ("four",)}


@dataclass
class Variant:
    task: Task  # the parent's id, env, family and split kept; provenance is the caller's
    replaced: dict[str, str]  # old -> new, every slot that changed
    reread: list[tuple[int, str, str, str]]  # (call index, argument, old, new) read again
    renamed_in_state: dict[str, str]  # old -> new, the slots renamed everywhere in the state
    steps: list[Step]  # the verifying replay's calls and observations (the explorer's round)


@dataclass
class NotVaried:
    reason: str  # one of REASONS
    detail: str


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
    observed = {v for obs in before for row in obs.splitlines() for _, v in fields(row)}
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
        for path, value in leaves(call.arguments)
        if value is not None and not isinstance(value, bool) and str(value).strip()
    ]
    slots: dict[str, tuple[str | int, str, str]] = {}
    for _, call, path, value in values:
        if names(request, value):
            if is_id(path):
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
    carried = [str(v) for _, v in leaves([call.arguments for call in task.reference_calls])]
    sources = {place.step for place in places}
    for _, value in leaves(state_of(task.setup)):
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
    state = map_leaves(
        state_of(task.setup), lambda _, v: replace_values(v, renamed) if isinstance(v, str) else v
    )
    turns = [
        turn.model_copy(
            update={
                "query": query,
                "reference_calls": [
                    ToolCall(
                        name=c.name,
                        arguments=map_leaves(c.arguments, lambda _, v: _new_leaf(v, mapping)),
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
    carried = [str(v) for c in draft.reference_calls for _, v in leaves(c.arguments)]
    carried += observations
    lost = [new for new in mapping.values() if not any(names(text, new) for text in carried)]
    if lost:
        return NotVaried("uncarried_value", f"{lost[0]!r} is in no call and no observation")
    setup = dict(state)
    if "check" in task.setup:  # the parent's relaxations, with the new values (issue 85)
        copies = {old: new for _, _, old, new in reread}
        setup["check"] = map_leaves(
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
    return Variant(variant, dict(mapping), reread, dict(renamed), steps)


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
        slot_for(value, tool, arg, task, pools, enums.get((tool, arg), []))
        for value, tool, arg in plan.slots.values()
    ]
    if not any(slot.formatted or any(slot.options.values()) for slot in slots):
        return NotVaried("no_new_value", f"nothing to vary among {len(slots)} stated values")
    known = " ".join(turn.query for turn in task.turns) + "\n" + text_of(state_of(task.setup))
    errors = [step.observation.error for step in steps]
    failures: list[NotVaried] = []
    for attempt in range(ATTEMPTS):
        mapping, renamed = draw(slots, known, random.Random(f"{key}:{attempt}"))
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
    progress: Callable[[Sequence[Task]], Iterable[Task]] = iter,
) -> dict[str, Any]:
    """How many ``tasks`` get a replay-verified variant, and each reason for those that do
    not (a task counts under the reason of its first key), in all and by family, with a
    first variant of each family as an example: ``coevolve env vary``'s table.
    ``progress`` wraps the tasks as they are varied (a progress bar)."""
    pools = ValuePools.from_tasks(seed_tasks)
    reasons: Counter[str] = Counter()
    varied = variants = 0
    by_family: dict[str, dict[str, Any]] = {}
    examples: dict[str, tuple[str, str]] = {}
    for task in progress(tasks):
        made = [vary(task, make_env, pools, f"{task.id}:{n}") for n in range(variants_per_task)]
        kept = {v.task.id: v for v in made if isinstance(v, Variant)}
        family = by_family.setdefault(task.family, {"tasks": 0, "varied": 0, "not_varied": {}})
        family["tasks"] += 1
        variants += len(kept)
        if kept:
            varied += 1
            family["varied"] += 1
            first = next(iter(kept.values()))
            examples.setdefault(task.family, (task.instruction, first.task.instruction))
            continue
        reason = next(m.reason for m in made if isinstance(m, NotVaried))
        reasons[reason] += 1
        family["not_varied"][reason] = family["not_varied"].get(reason, 0) + 1
    return {
        "tasks": len(tasks),
        "varied": varied,
        "variants": variants,
        "not_varied": dict(reasons.most_common()),
        "by_family": dict(sorted(by_family.items())),
        "examples": dict(sorted(examples.items())),
    }
