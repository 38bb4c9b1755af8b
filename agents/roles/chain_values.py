"""The values a composed chain's calls take: results read as fields, tools read from their
schemas, the seed tasks' argument values and the fields they flowed from, and the rule
that matches them to a parameter (``ArgumentSource``). Used by ``agents/roles/composer.py``;
nothing here knows an environment beyond its tools and results.
"""

from __future__ import annotations

import json
import random
import re
from collections import defaultdict
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from ...records import Task, ToolCall
from .abstractor import actions_key
from .role_interfaces import EnvFactory, Interaction

# --------------------------------------------------------------------------- reading results

_PAIR = re.compile(r'([A-Za-z_]\w*)=("(?:[^"\\]|\\.)*"|[^\s,;]+)')
_EXAMPLE = re.compile(r"\b(?:like|e\.g\.)\s+([A-Za-z]*[-_]?\d[\w-]*)")


def observed_values(text: str) -> list[tuple[str, str]]:
    """The (key, value) pairs a result shows, in order: ``key=value`` tokens (a quoted value
    whole) and the scalar fields of a JSON result, each under its own key."""
    pairs: list[tuple[str, str]] = []
    try:
        _json_leaves(json.loads(text), None, pairs)
    except ValueError:
        pass
    for key, value in _PAIR.findall(text):
        pairs.append((key, value[1:-1] if value.startswith('"') else value.rstrip(".")))
    return pairs


def _json_leaves(value: Any, key: str | None, out: list[tuple[str, str]]) -> None:
    if isinstance(value, Mapping):
        for inner, item in value.items():
            _json_leaves(item, str(inner), out)
    elif isinstance(value, list):
        for item in value:
            _json_leaves(item, key, out)
    elif key is not None and isinstance(value, str | int | float) and not isinstance(value, bool):
        out.append((key, str(value)))


def shape(value: object) -> str:
    """A value with its digits folded: ``c7`` and ``c12`` are ``c#``, ``p4`` is ``p#``."""
    return re.sub(r"\d+", "#", str(value))


def is_id(parameter: str) -> bool:
    return parameter == "id" or parameter.endswith("_id")


# --------------------------------------------------------------------------- the tools


@dataclass(frozen=True)
class Parameter:
    name: str
    type: str
    required: bool
    enum: tuple[Any, ...] = ()
    example: str | None = None  # "Contact id like c3": the shape of the ids it takes


@dataclass(frozen=True)
class Tool:
    name: str
    parameters: tuple[Parameter, ...]


def read_tools(schemas: Sequence[Mapping[str, Any]]) -> dict[str, Tool]:
    """The tools as the composer uses them, read from OpenAI tool schemas."""
    tools: dict[str, Tool] = {}
    for schema in schemas:
        function = schema.get("function", schema)
        spec = function.get("parameters") or {}
        required = set(spec.get("required") or [])
        parameters = []
        for name, about in (spec.get("properties") or {}).items():
            example = _EXAMPLE.search(str(about.get("description") or ""))
            parameters.append(
                Parameter(
                    name=name,
                    type=str(about.get("type", "string")),
                    required=name in required,
                    enum=tuple(about.get("enum") or ()),
                    example=example.group(1) if example else None,
                )
            )
        tools[function["name"]] = Tool(function["name"], tuple(parameters))
    return tools


# --------------------------------------------------------------------------- seed values


class SeedValues:
    """The argument values of the seed tasks' reference calls, by tool and parameter, and
    the shapes of the ids each parameter took."""

    def __init__(self, tasks: Iterable[Task]):
        self.by_call: dict[tuple[str, str], list[Any]] = defaultdict(list)
        self.by_parameter: dict[str, list[Any]] = defaultdict(list)
        self.id_shapes: dict[str, set[str]] = defaultdict(set)
        self.flows: dict[tuple[str, str], dict[str, int]] = defaultdict(lambda: defaultdict(int))
        for task in tasks:
            for call in task.reference_calls:
                for parameter, value in call.arguments.items():
                    if isinstance(value, Mapping | list):
                        continue
                    for pool in (self.by_call[call.name, parameter], self.by_parameter[parameter]):
                        if value not in pool:
                            pool.append(value)
                    if is_id(parameter):
                        self.id_shapes[parameter].add(shape(value))

    def learn_flows(self, tasks: Iterable[Task], make_env: EnvFactory) -> None:
        """Which result fields the seed tasks' calls took their values from, replayed: a
        ``create_note(body=...)`` that wrote the ``text=`` a ``read_messages`` showed, an
        ``add_to_cart(product_id=...)`` the ``id=`` of a product found."""
        for task in tasks:
            env = make_env()
            env.reset(task)
            shown: list[tuple[str, str]] = []
            for call in task.reference_calls:
                for parameter, value in call.arguments.items():
                    keys = [k for k, v in reversed(shown) if v == str(value) and k != parameter]
                    if keys:
                        self.flows[call.name, parameter][keys[0]] += 1
                observation = env.step(call)
                if not observation.error:
                    shown += observed_values(observation.text)

    def flowed_keys(self, tool: str, parameter: str) -> list[str]:
        """The result fields a parameter took its value from in the seed tasks, most often
        first."""
        found = self.flows.get((tool, parameter)) or {}
        return sorted(found, key=lambda key: -found[key])

    def values(self, tool: str, parameter: str) -> list[Any]:
        """The tool's own values for the parameter, else those any tool gave it."""
        return list(self.by_call.get((tool, parameter)) or self.by_parameter.get(parameter) or [])


@dataclass
class Chain:
    """The calls of one round so far, each with its real result."""

    steps: list[Interaction]

    def results(self) -> list[list[tuple[str, str]]]:
        return [observed_values(i.observation.text) for i in self.steps if not i.observation.error]

    def has(self, call: ToolCall) -> bool:
        """Whether the call already succeeded in the chain (one that failed may be made
        again once the state has changed: checkout after a top-up)."""
        key = actions_key([call])
        return any(actions_key([i.call]) == key and not i.observation.error for i in self.steps)


class ArgumentSource:
    """Where a chain's argument values come from, and the rule that matches them.

    A field of an earlier result *flows* into parameter ``P`` of tool ``T`` when it is named
    ``P`` (``customer_id=C-142`` into ``customer_id``), or when the seed tasks' replays
    show ``T``'s ``P`` taking the value of a field of that name (``SeedValues.learn_flows``:
    ``create_note``'s ``body`` takes the ``text=`` that ``read_messages`` showed). Then:

    - an id (``P`` is ``id`` or ends in ``_id``) comes only from an earlier result of the
      chain: a field that flows into ``P``, or a field named ``id`` whose shape (digits
      folded: ``c#``) is one the seed tasks gave ``P`` or the schema's example shows
      ("Contact id like c3"); any ``id`` when neither says. The latest result that has one
      is read first, so ``send_message`` takes the contact ``add_contact`` just saved.
      Never a seed task's id: in another state it names something else.
    - any other value: first the value a failed call of the chain gave ``P`` (the lookup
      that found no Lars is followed by ``add_contact(name="Lars")``); then, most often, a
      field of an earlier result that the seeds showed flowing into ``P``; else, at
      random, a field named ``P`` in an earlier result or in what the starting state shows
      (the survey: the results of the tools that need no argument, from its own fresh
      environment), or a value the seed tasks' calls of ``T`` gave ``P`` (of any tool when
      ``T`` has none); where the reference's call erred, a seed value the state does not
      show (a name not in the contacts). The flagged task's own values are tried only in
      the last two tries of a call (``own``): the structure is kept, the values are new
      where the state allows (a shop with none of the other seeds' products does not).
    - an enum: one of the schema's values.
    """

    def __init__(self, seeds: SeedValues, own: Iterable[Any], survey: Sequence[tuple[str, str]]):
        self.seeds = seeds
        self.own = {str(value) for value in own}
        self.survey = list(survey)

    def call(
        self,
        tool: Tool,
        chain: Chain,
        rng: random.Random,
        expect_error: bool = False,
        own: bool = False,
    ) -> ToolCall | None:
        """A call of ``tool`` from what the chain knows; None when a required value is not
        known. ``own``: the flagged task's own seed values may be chosen too."""
        arguments: dict[str, Any] = {}
        for parameter in tool.parameters:
            value = self.value(tool, parameter, chain, rng, expect_error, own)
            if value is None:
                if parameter.required:
                    return None
                continue
            if parameter.required or rng.random() < 0.5:
                arguments[parameter.name] = value
        return ToolCall(name=tool.name, arguments=arguments)

    def value(
        self,
        tool: Tool,
        parameter: Parameter,
        chain: Chain,
        rng: random.Random,
        expect_error: bool,
        own: bool = False,
    ) -> Any:
        if parameter.enum:
            return rng.choice(parameter.enum)
        keys = [parameter.name, *self.seeds.flowed_keys(tool.name, parameter.name)]
        if is_id(parameter.name):
            return self._id(parameter, keys, chain, rng)
        failed = [
            i.call.arguments[parameter.name]
            for i in chain.steps
            if i.observation.error and parameter.name in i.call.arguments
        ]
        if failed:
            return failed[-1]
        flowed = [v for result in chain.results() for k, v in result if k in keys[1:]]
        seen = [v for result in chain.results() for k, v in result if k == parameter.name]
        seen += [v for k, v in self.survey if k == parameter.name]
        seeded = self.seeds.values(tool.name, parameter.name)
        seeded = [v for v in seeded if (str(v) in self.own) == own] or seeded
        if expect_error:
            unseen = [v for v in seeded if str(v) not in set(seen)]
            pools = [unseen or seeded]
        else:
            pools = [seen, seeded] if rng.random() < 0.5 else [seeded, seen]
            if flowed and rng.random() < 0.8:
                pools.insert(0, flowed[-1:])
        for pool in pools:
            typed = [v for v in (_typed(v, parameter.type) for v in pool) if v is not None]
            if typed:
                return rng.choice(typed)
        return None

    def _id(
        self, parameter: Parameter, keys: Sequence[str], chain: Chain, rng: random.Random
    ) -> str | None:
        shapes = set(self.seeds.id_shapes.get(parameter.name, ()))
        if parameter.example:
            shapes.add(shape(parameter.example))
        for result in reversed(chain.results()):
            named = [v for k, v in result if k in keys]
            ids = [v for k, v in result if k == "id" and (not shapes or shape(v) in shapes)]
            found = named or ids
            if found:
                return rng.choice(found)
        return None


def _typed(value: Any, kind: str) -> Any:
    """``value`` as the schema's type, or None when it is not one."""
    if kind == "integer":
        try:
            return int(str(value))
        except ValueError:
            return None
    if kind == "number":
        try:
            return float(str(value))
        except ValueError:
            return None
    if kind == "boolean":
        return value if isinstance(value, bool) else None
    return value if isinstance(value, str) else str(value)
