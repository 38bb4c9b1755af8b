"""The synthesis roles' interfaces and the records that pass between them.

Which implementation of each role runs follows from one switch,
``synthesis.synthesizer`` (``SYNTHESIZERS``): the environment's own task generator,
variations of the flagged task (no model, no generator), or the LLM roles behind
OpenAI-compatible endpoints. The synthesis graph only sees these protocols;
``coevolve.agents.roles.role_factory.build_roles`` builds them from ``RolesConfig``.
This module imports no concrete role; the roles import it.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal, Protocol

from pydantic import BaseModel, ConfigDict, Field

from ...envs.base import Environment
from ...envs.brief import EnvironmentBrief
from ...records import (
    CandidateTask,
    FlaggedTrajectory,
    Neighbour,
    Observation,
    SignalKind,
    SynthesisContext,
    Task,
    ToolCall,
    Turn,
    Verdict,
)
from ..prompts import (
    ABSTRACTOR_PROMPT,
    EXPLORER_PROMPT,
    JUDGE_PROMPT,
    SUMMARIZER_PROMPT,
    fill_environment,
)


class Interaction(BaseModel):
    """One (action, observation) pair of an exploration round."""

    model_config = ConfigDict(extra="forbid")

    call: ToolCall
    observation: Observation


class WrittenRequest(BaseModel):
    """The request an explorer says its round carried out (the variation explorer's: the
    parent's request with the variant's values)."""

    model_config = ConfigDict(extra="forbid")

    request: str
    answer: str | None = None


class ExplorationRound(BaseModel):
    """One independent exploration from a fresh environment."""

    model_config = ConfigDict(extra="forbid")

    objective: str
    setup: dict = Field(default_factory=dict, description="The task setup the round started from.")
    interactions: list[Interaction] = Field(default_factory=list)
    written: WrittenRequest | None = Field(
        default=None,
        description="What the explorer says the round carried out; None: it said nothing "
        "(every explorer but the variation explorer).",
    )
    not_varied: str | None = Field(
        default=None,
        description="Variation: why the flagged task gave no variant in this round (the "
        "reason and its detail); the round then holds no interactions.",
    )


EnvFactory = Callable[[], Environment]


class Summarizer(Protocol):
    name: str

    async def summarize(self, item: FlaggedTrajectory, task: Task) -> SynthesisContext: ...


class Explorer(Protocol):
    name: str

    async def explore(
        self, item: FlaggedTrajectory, task: Task, context: SynthesisContext, make_env: EnvFactory
    ) -> list[ExplorationRound]: ...


class RejectedCandidate(BaseModel):
    """A candidate an abstractor dropped before judging, and why."""

    model_config = ConfigDict(extra="forbid")

    description: str
    reason: str


class Abstraction(BaseModel):
    """What an abstractor made of one flagged item: the candidates to judge and what it dropped."""

    model_config = ConfigDict(extra="forbid")

    candidates: list[CandidateTask] = Field(default_factory=list)
    rejections: list[RejectedCandidate] = Field(default_factory=list)


@dataclass(frozen=True)
class AbstractionInput:
    """What an abstractor works from: one flagged item, its parent task and what the pass
    learnt of it (the summary, the exploration rounds, the nearest stored tasks)."""

    item: FlaggedTrajectory
    task: Task
    context: SynthesisContext
    rounds: Sequence[ExplorationRound]
    neighbours: Sequence[Neighbour]
    make_env: EnvFactory


class Abstractor(Protocol):
    name: str
    # False: it writes from the flagged episode alone, so the pass runs no exploration for it.
    reads_exploration: bool

    async def abstract(self, given: AbstractionInput) -> Abstraction: ...


class Judge(Protocol):
    name: str

    async def judge(self, candidate: CandidateTask, make_env: EnvFactory) -> Verdict: ...


# --------------------------------------------------------------------------- shared pieces

# The order in which an item's signals name the candidates it produces (the
# default budget priority of memory.signals.SignalConfig).
SIGNAL_PRIORITY: tuple[SignalKind, ...] = (
    "unsolved",
    "forgetting",
    "rare",
    "boundary",
    "random",
    "oracle",
)


def primary_signal(item: FlaggedTrajectory) -> SignalKind | None:
    """The signal a flagged item's candidates are attributed to."""
    kinds = item.kinds
    return next((kind for kind in SIGNAL_PRIORITY if kind in kinds), None)


def candidate_setup(setup: Mapping[str, Any]) -> dict[str, Any]:
    """A setup for a new task: the state it starts from, without the parent's checker relaxations."""
    return {key: value for key, value in setup.items() if key != "check"}


def synthesized_task_id(candidate: CandidateTask, cycle: int) -> str:
    """``syn-c<cycle>-<hash>``: stable in the query, the actions and the setup."""
    payload = {
        "query": candidate.query,
        "actions": [{"name": c.name, "arguments": c.arguments} for c in candidate.minimal_actions],
        "setup": candidate.setup,
    }
    text = json.dumps(payload, sort_keys=True, ensure_ascii=False, default=str)
    return f"syn-c{cycle}-{hashlib.sha1(text.encode()).hexdigest()[:12]}"


def default_structure_key(calls: Sequence[ToolCall]) -> str:
    """The tool names in order: the structure key of environments without their own."""
    return ">".join(call.name for call in calls) or "no-calls"


def candidate_to_task(
    candidate: CandidateTask,
    parent: Task,
    cycle: int,
    structure_key: Callable[[Sequence[ToolCall]], str] | None = None,
) -> Task:
    """The Task a (validated) candidate becomes, with its provenance.

    One turn: the query, answered by the minimal actions. The setup is the
    candidate's own (the state it was abstracted from) or, if it has none, the
    parent's without the parent's checker relaxations. Its family is the structure
    key of its own calls (``structure_key``, default: the tool names in order), never
    the parent's: the parent and the signal are provenance.
    """
    setup = dict(candidate.setup) if candidate.setup else candidate_setup(parent.setup)
    calls = [ToolCall(name=c.name, arguments=dict(c.arguments)) for c in candidate.minimal_actions]
    return Task(
        id=synthesized_task_id(candidate.model_copy(update={"setup": setup}), cycle),
        env=parent.env,
        family=(structure_key or default_structure_key)(calls),
        split="train",
        turns=[Turn(query=candidate.query, reference_calls=calls)],
        reference_answer=candidate.reference_answer,
        setup=setup,
        source="synthesized",
        parent_task_id=candidate.parent_task_id or parent.id,
        signal=candidate.signal,
        cycle=cycle,
    )


# --------------------------------------------------------------------------- configuration

OFFLINE = "offline"
# The RolesConfig fields that name an endpoint (of the config's `endpoints`) or OFFLINE.
ENDPOINT_ROLES = ("default_endpoint", "summarizer", "explorer", "abstractor", "judge")

# What makes a run's synthesized tasks (`synthesis.synthesizer`), each with what it is.
Synthesizer = Literal["variation", "generator", "llm"]
SYNTHESIZERS: dict[str, str] = {
    "variation": "variations of the flagged task: its calls and their flow of values kept, new "
    "values, replayed and verified; no model, no task generator (agents/roles/variation.py)",
    "generator": "the environment's own task generator (`variant`), steered by the signals: "
    "the bench's reference (arm coevolve-oracle); only environments that have one",
    "llm": "the four roles as models behind OpenAI-compatible endpoints "
    "(synthesis.roles.default_endpoint and the per-role endpoints)",
}


class RolesConfig(BaseModel):
    """Which implementation each synthesis role uses, and how it behaves."""

    model_config = ConfigDict(extra="forbid", validate_assignment=True)

    default_endpoint: str | None = Field(
        default=None,
        description="synthesizer llm: the entry of `endpoints` every role uses unless it names "
        "its own.",
    )
    summarizer: str | None = Field(
        default=None,
        description="Summarizer: an endpoint name, 'offline', or None for default_endpoint.",
    )
    explorer: str | None = Field(
        default=None,
        description="Explorer: an endpoint name, 'offline', or None for default_endpoint.",
    )
    abstractor: str | None = Field(
        default=None,
        description="Task-abstractor: an endpoint name, 'offline', or None for default_endpoint.",
    )
    judge: str | None = Field(
        default=None,
        description="Judge: an endpoint name, 'offline', or None for default_endpoint.",
    )
    llm_concurrency: int = Field(
        default=16, gt=0, description="Most LLM requests in flight at once, all roles together."
    )
    explorer_rounds: int | None = Field(
        default=None,
        gt=0,
        description="Independent exploration rounds per flagged item (None: 3 generator, 2 llm).",
    )
    explorer_steps: int | None = Field(
        default=None,
        gt=0,
        description="Most actions per exploration round (None: 4 generator, 5 llm).",
    )
    explorer_seed: int = Field(
        default=0,
        description="Seed of the generator path's random walks and of the variations' choice "
        "of new values.",
    )
    explorer_policy_rounds: int | None = Field(
        default=None,
        ge=0,
        description="synthesizer generator: exploration rounds the current policy drives (None: a third of the "
        "rounds, at least one, or all of them where the environment has no action sampler; 0: "
        "random walks, or perturbed reference solutions without a sampler, which saves a "
        "generation per flagged item on a CPU).",
    )
    policy_temperature: float = Field(
        default=1.2,
        ge=0.0,
        le=2.0,
        description="synthesizer generator: temperature of the rounds the current policy drives.",
    )
    max_candidates: int = Field(
        default=3,
        gt=0,
        description="Most candidate tasks the abstractor proposes per item (variation: variants "
        "of the flagged task).",
    )
    steer: bool = Field(
        default=True,
        description="synthesizer generator: answer a flagged failure with tasks that keep its "
        "structure (new values and state, generated per signal kind; see docs/architecture.md) "
        "where the environment can make them. False: explored action windows only.",
    )
    summarizer_temperature: float | None = Field(
        default=0.2, ge=0.0, le=2.0, description="LLM summarizer temperature (None: endpoint's)."
    )
    explorer_temperature: float | None = Field(
        default=1.0, ge=0.0, le=2.0, description="LLM explorer temperature (None: endpoint's)."
    )
    abstractor_temperature: float | None = Field(
        default=0.4, ge=0.0, le=2.0, description="LLM abstractor temperature (None: endpoint's)."
    )
    judge_temperature: float | None = Field(
        default=0.0, ge=0.0, le=2.0, description="LLM judge temperature (None: endpoint's)."
    )
    summarizer_prompt: str = Field(
        default=SUMMARIZER_PROMPT,
        description="System prompt of the LLM summarizer; its {environment} slot, where it has "
        "one, says what the run's environment is (docs/environments.md).",
    )
    explorer_prompt: str = Field(
        default=EXPLORER_PROMPT,
        description="System prompt of the LLM explorer; its {environment} slot, where it has "
        "one, says what the run's environment is (docs/environments.md).",
    )
    abstractor_prompt: str = Field(
        default=ABSTRACTOR_PROMPT,
        description="System prompt of the LLM task-abstractor; its {environment} slot, where it has "
        "one, says what the run's environment is (docs/environments.md).",
    )
    judge_prompt: str = Field(
        default=JUDGE_PROMPT,
        description="System prompt of the LLM judge; its {environment} slot, where it has one, "
        "says what the run's environment is (docs/environments.md).",
    )

    def prompt_for(self, role: str, brief: EnvironmentBrief | None) -> str:
        """A role's system prompt (``<role>_prompt``) saying what the environment is."""
        return fill_environment(getattr(self, f"{role}_prompt"), brief)

    def endpoint_for(self, role: str) -> str | None:
        """The endpoint name a role uses, or None when it runs offline."""
        choice = getattr(self, role)
        name = self.default_endpoint if choice is None else choice
        return None if name is None or name == OFFLINE else name


# The RolesConfig fields only some synthesizers read (any other is read by every one): setting
# one for a synthesizer that does not read it is refused (graph/synthesis/config.py), not ignored.
_LLM_ONLY = (
    "default_endpoint",
    "summarizer",
    "explorer",
    "abstractor",
    "judge",
    "llm_concurrency",
    *(
        f"{role}_{knob}"
        for role in ("summarizer", "explorer", "abstractor", "judge")
        for knob in ("temperature", "prompt")
    ),
)
FIELDS_READ_BY: dict[str, tuple[str, ...]] = {
    **{name: ("llm",) for name in _LLM_ONLY},
    "explorer_rounds": ("generator", "llm"),
    "explorer_steps": ("generator", "llm"),
    "explorer_seed": ("generator", "variation"),
    "explorer_policy_rounds": ("generator",),
    "policy_temperature": ("generator",),
    "steer": ("generator",),
}


ROLE_NAMES = ("summarizer", "explorer", "abstractor", "judge")


@dataclass
class Roles:
    """The four synthesis roles of a run, built once and injected into the graph."""

    synthesizer: Synthesizer
    summarizer: Summarizer
    explorer: Explorer
    abstractor: Abstractor
    judge: Judge
    limiter: asyncio.Semaphore | None = field(default=None, repr=False)

    def names(self) -> dict[str, str]:
        """The synthesizer and which implementation each role uses (for the run log)."""
        return {"synthesizer": self.synthesizer} | {
            role: getattr(self, role).name for role in ROLE_NAMES
        }
