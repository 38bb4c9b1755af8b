"""Composed exploration: chains of calls built from the tool schemas, written clause by clause.

A user has tools, seed tasks and a model no larger than the agent; no task generator, no
action sampler, no describer. Synthesis gets its worth from whole tasks the agent cannot do
yet (docs/synthesis.md), and the task writer is good at one clause and poor at compound
requests. So the two halves are split:

- ``ComposingExplorer`` (no model) composes chains of calls from a fresh environment in the
  flagged task's state. The tools are read from ``env.tools()`` (names, parameters, types,
  which are required); every argument value comes from an earlier result of the same chain,
  from what the starting state shows, from the seed tasks' reference calls, or from a
  schema's enum (``ArgumentSource``, agents/roles/chain_values.py). Its rounds aim at the flagged task's tool sequence and
  those of its family's seed tasks (the structure of the failure, with new values); every
  call runs for real, and the chain is replayed in a fresh environment.
- ``ClauseWriter`` (agents/roles/clause_writer.py) asks the task writer for one clause per call (the call, with the earlier
  results it draws on as context), grounds each clause on its own (``ungrounded_values``:
  every argument value is named by the clause, an earlier clause or an earlier result),
  and joins the clauses into one request: "<first>, then <second>, then <third>".

Nothing here calls ``sample_action``, ``describe`` or ``variant``, or reads a split other
than the seed tasks it is given.
"""

from __future__ import annotations

import random
from collections import defaultdict
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from ...envs.base import Environment
from ...records import FlaggedTrajectory, SynthesisContext, Task, ToolCall
from .abstractor import actions_key
from .chain_values import (
    ArgumentSource,
    Chain,
    SeedValues,
    Tool,
    is_id,
    observed_values,
    read_tools,
)
from .role_interfaces import EnvFactory, ExplorationRound, Interaction
from .task_writer import succeeded

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
        chain = Chain([])
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
        chain: Chain | None = None,
        length: int | None = None,
    ) -> list[Interaction]:
        chain = chain or Chain([])
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
        chain: Chain,
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
