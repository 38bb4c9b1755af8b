"""Composed exploration: chains of calls built from the tool schemas, written clause by clause.

A user has tools, seed tasks and a model no larger than the agent; no task generator, no
action sampler, no describer. Synthesis gets its worth from whole tasks the agent cannot do
yet (docs/synthesis.md), and the task writer is good at one clause and poor at compound
requests. So the two halves are split:

- ``ComposingExplorer`` (no model) composes chains of calls from a fresh environment in the
  flagged task's state. The tools are read from ``env.tools()`` (names, parameters, types,
  which are required); every argument value comes from an earlier result of the same chain,
  from what the starting state shows, from the seed tasks' reference calls, or from a
  schema's enum (``ArgumentSource``). Its rounds aim at the flagged task's tool sequence and
  those of its family's seed tasks (the structure of the failure, with new values); every
  call runs for real, and the chain is replayed in a fresh environment.
- ``ClauseWriter`` asks the task writer for one clause per call (the call, with the earlier
  results it draws on as context), grounds each clause on its own (``ungrounded_values``:
  every argument value is named by the clause, an earlier clause or an earlier result),
  and joins the clauses into one request: "<first>, then <second>, then <third>".

Nothing here calls ``sample_action``, ``describe`` or ``variant``, or reads a split other
than the seed tasks it is given.
"""

from __future__ import annotations

import asyncio
import json
import random
import re
from collections import defaultdict
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from langchain_core.messages import HumanMessage, SystemMessage

from ..envs.base import Environment
from ..records import CandidateTask, FlaggedTrajectory, SynthesisContext, Task, ToolCall
from .abstractor import actions_key, normalise, repeats
from .llm import model_label
from .prompts import WRITER_PROMPT
from .replies import ask, raise_unless_one_replied
from .roles import (
    Abstraction,
    AbstractionInput,
    EnvFactory,
    ExplorationRound,
    Interaction,
    RejectedCandidate,
    candidate_setup,
    primary_signal,
)
from .writer import OBSERVATION_CHARS, parse_writing, render_calls, succeeded, ungrounded_values

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


# --------------------------------------------------------------------------- the explorer


@dataclass(frozen=True)
class AimStep:
    """One step of a structure to aim at: a tool, whether the reference's call erred there
    (a lookup that finds nobody before the contact is added), and whether its result
    showed fields (a search that found the product, not "no products match")."""

    tool: str
    errs: bool
    shows: bool


Aim = tuple[AimStep, ...]


@dataclass
class _Chain:
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
        chain: _Chain,
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
        chain: _Chain,
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
        self, parameter: Parameter, keys: Sequence[str], chain: _Chain, rng: random.Random
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


def _answers(failed: Interaction, later: Sequence[Interaction]) -> bool:
    """Whether a later call that succeeded carries on from a failed one: a call of another
    tool that uses all of its values (no Lars found, so Lars is added), or the same call
    again after another call succeeded in between (checkout, a top-up, checkout)."""
    values = {str(v) for v in failed.call.arguments.values()}
    key = actions_key([failed.call])
    for number, interaction in enumerate(later):
        if interaction.observation.error:
            continue
        if interaction.call.name != failed.call.name:
            if values and values <= {str(v) for v in interaction.call.arguments.values()}:
                return True
        elif actions_key([interaction.call]) == key:
            return any(not i.observation.error for i in later[:number])
    return False


def composed_calls(interactions: Sequence[Interaction]) -> list[Interaction]:
    """A chain's calls as a task: those that succeeded, each once (``succeeded``), and a
    failed call that a later call answers (``_answers``): the failed lookup is part of
    message_new_contact, the failed checkout of buy_with_topup, and the judge counts both
    as recovered."""
    positions: dict[str, int] = {}
    for index, interaction in enumerate(interactions):
        if not interaction.observation.error:
            positions.setdefault(actions_key([interaction.call]), index)
    kept = [
        (positions[actions_key([i.call])], i)
        for i in succeeded([(i.call, i.observation) for i in interactions])
    ]
    kept += [
        (index, interaction)
        for index, interaction in enumerate(interactions)
        if interaction.observation.error and _answers(interaction, interactions[index + 1 :])
    ]
    return [interaction for _, interaction in sorted(kept, key=lambda pair: pair[0])]


class ComposingExplorer:
    """Chains of calls composed from the tool schemas, earlier results and seed values; no
    model, no sampler, no describer.

    Round ``i`` aims at a structure: the flagged task's tool sequence first, then each of
    its family's seed tasks' in turn (a one-call structure goes on with a walk step); every
    third round walks freely, three times as likely to pick a tool of those structures as
    another. A call is tried again with other values,
    up to ``tries`` times, when it fails where the reference's call did not (a title the
    calendar lacks) or shows nothing where the reference's showed fields (a search that
    matched no product). A round keeps ``composed_calls`` of what ran, replayed in a fresh
    environment (cut where the replay differs). Deterministic given ``seed``.
    """

    def __init__(
        self,
        seed_tasks: Sequence[Task] = (),
        rounds: int = 4,
        steps: int = 6,
        seed: int = 0,
        tries: int = 8,
    ):
        if rounds < 1 or steps < 2 or tries < 1:
            raise ValueError(f"rounds >= 1, steps >= 2, tries >= 1; got {rounds}, {steps}, {tries}")
        self.seed_tasks = sorted(seed_tasks, key=lambda task: task.id)
        self.seeds = SeedValues(self.seed_tasks)
        self.families: dict[str, list[Task]] = defaultdict(list)
        for task in self.seed_tasks:
            self.families[task.family].append(task)
        self.rounds = rounds
        self.steps = steps
        self.seed = seed
        self.tries = tries
        self.name = "explorer:composer"
        self._aims: dict[str, Aim] = {}
        self._learnt = False

    def aims(self, task: Task, make_env: EnvFactory) -> list[Aim]:
        """The structures to aim at: the task's own tool sequence, then its family's seed
        tasks' (distinct), each step as its replay went."""
        found: list[Aim] = []
        for example in [task, *self.families.get(task.family, [])]:
            if example.id not in self._aims:
                self._aims[example.id] = _replayed_aim(example, make_env)
            aim = self._aims[example.id]
            if aim and aim not in found:
                found.append(aim)
        return found

    async def explore(
        self, item: FlaggedTrajectory, task: Task, context: SynthesisContext, make_env: EnvFactory
    ) -> list[ExplorationRound]:
        if not self._learnt:
            self.seeds.learn_flows(self.seed_tasks, make_env)
            self._learnt = True
        probe = make_env()
        probe.reset(task)
        tools = read_tools(probe.tools())
        if self.seed_tasks:
            own = [value for call in task.reference_calls for value in call.arguments.values()]
            source = ArgumentSource(self.seeds, own, _survey(probe, tools))
        else:  # no seed tasks given: the flagged task's own values are all there is
            alone = SeedValues([task])
            alone.learn_flows([task], make_env)
            source = ArgumentSource(alone, (), _survey(probe, tools))
        aims = [
            tuple(step for step in aim if step.tool in tools) for aim in self.aims(task, make_env)
        ]
        aims = [aim for aim in aims if aim]
        aimed = {step.tool for aim in aims for step in aim}
        rounds = []
        for index in range(self.rounds):
            rng = random.Random(f"compose:{self.seed}:{item.trajectory.id}:{index}")
            env = make_env()
            env.reset(task)
            if aims and index % 3 != 2:
                aim = aims[index % len(aims)]
                steps = self._follow(env, aim, tools, source, rng)
                objective = "composed after " + " > ".join(step.tool for step in aim)
            else:
                steps = self._walk(env, tools, aimed, source, rng)
                objective = "composed walk, leaning to " + (", ".join(sorted(aimed)) or "none")
            rounds.append(
                ExplorationRound(
                    objective=objective,
                    setup=dict(task.setup),
                    interactions=_replayed(composed_calls(steps), task, make_env),
                )
            )
        return rounds

    def _follow(
        self,
        env: Environment,
        aim: Aim,
        tools: Mapping[str, Tool],
        source: ArgumentSource,
        rng: random.Random,
    ) -> list[Interaction]:
        chain = _Chain([])
        for step in aim[: self.steps]:
            self._step(env, tools[step.tool], chain, source, rng, step)
        if len(chain.steps) < 2:  # a one-call structure: a chain goes on from it
            aimed = {step.tool for step in aim}
            return self._walk(env, tools, aimed, source, rng, chain, length=2)
        return chain.steps

    def _walk(
        self,
        env: Environment,
        tools: Mapping[str, Tool],
        aimed: set[str],
        source: ArgumentSource,
        rng: random.Random,
        chain: _Chain | None = None,
        length: int | None = None,
    ) -> list[Interaction]:
        chain = chain or _Chain([])
        names = sorted(tools)
        weights = [3.0 if name in aimed else 1.0 for name in names]
        length = length or rng.randint(2, self.steps)
        for _ in range(length * self.tries):
            if sum(not i.observation.error for i in chain.steps) >= length:
                break
            tool = tools[rng.choices(names, weights)[0]]
            self._step(env, tool, chain, source, rng, AimStep(tool.name, False, False))
        return chain.steps

    def _step(
        self,
        env: Environment,
        tool: Tool,
        chain: _Chain,
        source: ArgumentSource,
        rng: random.Random,
        aim: AimStep,
    ) -> None:
        """Run one call of ``tool`` as ``aim`` expects it to go, with other values when it
        does not (up to ``tries``); a failed call stays in the chain only where the
        reference's call failed too."""
        tried: set[str] = set()
        for attempt in range(self.tries):
            own = attempt >= self.tries - 2
            call = source.call(tool, chain, rng, expect_error=aim.errs, own=own)
            if call is None:
                return
            key = actions_key([call])
            if chain.has(call) or key in tried:
                continue
            tried.add(key)
            observation = env.step(call)
            if observation.error and not aim.errs:
                continue
            if aim.shows and not observation.error and not observed_values(observation.text):
                continue
            chain.steps.append(Interaction(call=call, observation=observation))
            return


def _replayed_aim(task: Task, make_env: EnvFactory) -> Aim:
    env = make_env()
    env.reset(task)
    steps = []
    for call in task.reference_calls:
        observation = env.step(call)
        shows = bool(observed_values(observation.text))
        steps.append(AimStep(call.name, bool(observation.error), shows))
    return tuple(steps)


def _survey(env: Environment, tools: Mapping[str, Tool]) -> list[tuple[str, str]]:
    """What the starting state shows: the fields of the results of every tool that needs
    no argument, called once in ``env`` (a fresh copy no chain runs in: a tool like
    checkout may change it). Ids are left out: a chain's ids come from its own calls."""
    pairs: list[tuple[str, str]] = []
    for tool in tools.values():
        if any(parameter.required for parameter in tool.parameters):
            continue
        observation = env.step(ToolCall(name=tool.name, arguments={}))
        if not observation.error:
            pairs += [(k, v) for k, v in observed_values(observation.text) if not is_id(k)]
    return pairs


def _replayed(
    interactions: Sequence[Interaction], task: Task, make_env: EnvFactory
) -> list[Interaction]:
    """The chain run again in a fresh environment, with its results there; cut at the first
    call whose outcome differs (a failed attempt that changed the state after all)."""
    env = make_env()
    env.reset(task)
    replayed: list[Interaction] = []
    for interaction in interactions:
        observation = env.step(interaction.call)
        if bool(observation.error) != bool(interaction.observation.error):
            break
        replayed.append(Interaction(call=interaction.call, observation=observation))
    return replayed


# --------------------------------------------------------------------------- the writer

JOINER = ", then "


def clause_input(interaction: Interaction, earlier: Sequence[Interaction]) -> str:
    """What the writer reads for one clause: the earlier results that show one of the call's
    values ("Earlier result: id=c5 name=Lars ..."), then the call as ``render_calls`` writes
    it. Only those: the clause is about this call, not the ones before it."""
    values = [str(v) for v in interaction.call.arguments.values() if str(v).strip()]
    lines = []
    for before in earlier:
        text = " ".join(before.observation.text.split())
        if any(re.search(rf"(?<![\w-]){re.escape(v)}(?![\w-])", text) for v in values):
            cut = text if len(text) <= OBSERVATION_CHARS else text[:OBSERVATION_CHARS] + "..."
            lines.append(f"Earlier result: {cut}")
    return "\n".join([*lines, render_calls([interaction])])


def clause_ungrounded(
    clause: str, interaction: Interaction, earlier: Sequence[Interaction], said: Sequence[str]
) -> list[str]:
    """The call's argument values that neither the clause, an earlier clause (``said``: the
    agent reads the whole request) nor an earlier result names (``ungrounded_values``)."""
    context = [clause, *said, *(i.observation.text for i in earlier)]
    return ungrounded_values("\n".join(context), [interaction])


def join_clauses(clauses: Sequence[str], calls: Sequence[ToolCall]) -> str:
    """One request of the clauses in order: "<first>, then <second>, then <third>." Each
    clause loses its closing stop; a later one starts lower-case unless its first word is a
    value of the calls (a name: "then Lars ..."); the last keeps a question mark."""
    values = {str(v) for call in calls for v in call.arguments.values()}
    parts = []
    for number, clause in enumerate(clauses):
        text = clause.strip().rstrip(".!;,")
        first = text.split(maxsplit=1)[0] if text else ""
        if number and first and first not in values and first[:1].isupper():
            text = text[:1].lower() + text[1:]
        parts.append(text.rstrip("?"))
    ending = "?" if clauses and clauses[-1].strip().endswith("?") else "."
    request = JOINER.join(parts) + ending
    return request[:1].upper() + request[1:]


@dataclass(frozen=True)
class _Clause:
    text: str
    answer: str | None


class ClauseWriter:
    """An abstractor that has the task writer write a composed chain one clause per call,
    grounds each clause, and joins them into one request (``join_clauses``)."""

    reads_exploration = True

    def __init__(
        self,
        model: Any,
        limiter: asyncio.Semaphore | None = None,
        prompt: str = WRITER_PROMPT,
        max_candidates: int = 3,
        grounding: bool = True,
    ):
        if max_candidates < 1:
            raise ValueError("max_candidates must be >= 1")
        self.model = model
        self.limiter = limiter
        self.prompt = prompt
        self.max_candidates = max_candidates
        self.grounding = grounding
        self.name = f"abstractor:clause-writer({model_label(model)})"

    def chains(self, given: AbstractionInput) -> tuple[list[tuple[dict, list[Interaction]]], list]:
        """(setup, calls) of each distinct round of two calls or more, and the rejections
        of the others."""
        chosen: list[tuple[dict, list[Interaction]]] = []
        rejected: list[RejectedCandidate] = []
        keys: set[str] = set()
        for number, exploration in enumerate(given.rounds, 1):
            calls = composed_calls(exploration.interactions)
            key = actions_key([i.call for i in calls], exploration.setup)
            if len(calls) < 2:
                why = f"round {number} composed {len(calls)} call(s) that ran; a chain needs two"
                rejected.append(RejectedCandidate(description=exploration.objective, reason=why))
            elif key not in keys:
                keys.add(key)
                chosen.append((dict(exploration.setup), calls))
        return chosen[: self.max_candidates], rejected

    async def abstract(self, given: AbstractionInput) -> Abstraction:
        chains, rejected = self.chains(given)
        if not chains:
            return Abstraction(rejections=rejected)
        asks = [
            self._write(clause_input(call, calls[:number]))
            for _, calls in chains
            for number, call in enumerate(calls)
        ]
        replies = list(await asyncio.gather(*asks, return_exceptions=True))
        raise_unless_one_replied(replies)
        chosen: list[CandidateTask] = []
        queries: set[str] = set()
        for setup, calls in chains:
            own, replies = replies[: len(calls)], replies[len(calls) :]
            description = "composed: " + " > ".join(i.call.name for i in calls)
            written = self._clauses(calls, own)
            if isinstance(written, str):
                rejected.append(RejectedCandidate(description=description, reason=written))
                continue
            query = join_clauses([c.text for c in written], [i.call for i in calls])
            problem = repeats([query], given)
            if problem is None and normalise(query) in queries:
                problem = "duplicates another candidate of this item"
            if problem is not None:
                rejected.append(RejectedCandidate(description=description, reason=problem))
                continue
            queries.add(normalise(query))
            chosen.append(
                CandidateTask(
                    description=description,
                    query=query,
                    minimal_actions=[i.call for i in calls],
                    reference_answer=written[-1].answer,
                    parent_task_id=given.task.id,
                    signal=primary_signal(given.item),
                    setup=candidate_setup(setup),
                    kind="composed",
                )
            )
        return Abstraction(candidates=chosen, rejections=rejected)

    def _clauses(
        self, calls: Sequence[Interaction], replies: Sequence[str | BaseException]
    ) -> list[_Clause] | str:
        """The chain's clauses, or why it is rejected, naming the clause."""
        clauses: list[_Clause] = []
        for number, (call, reply) in enumerate(zip(calls, replies, strict=True), 1):
            which = f"clause {number} ({call.call.name})"
            if isinstance(reply, BaseException):
                return f"{which}: the writer failed: {reply}"
            try:
                text, answer = parse_writing(reply)
            except ValueError as err:
                return f"{which}: writer reply unreadable: {err}"
            if self.grounding:
                said = [c.text for c in clauses]
                missing = clause_ungrounded(text, call, calls[: number - 1], said)
                if missing:
                    return f"curation: {which} {text!r} does not name {', '.join(missing[:4])}"
            clauses.append(_Clause(text, answer))
        return clauses

    async def _write(self, material: str) -> str:
        messages = [SystemMessage(self.prompt), HumanMessage(material)]
        reply = await ask(self.model, messages, self.limiter)
        content = getattr(reply, "content", reply)
        return content if isinstance(content, str) else str(content)
