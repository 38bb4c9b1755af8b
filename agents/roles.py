"""The synthesis roles' interfaces and the records that pass between them.

Each role has two implementations: an LLM one (an OpenAI-compatible endpoint
through langchain-openai, structured output with a tolerant JSON fallback) and
an environment-grounded offline one that needs no LLM. The synthesis graph
only sees these protocols; which implementation runs is configuration.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Protocol

from pydantic import BaseModel, ConfigDict, Field

from ..envs.base import Environment
from ..memory.signals import FlaggedTrajectory
from ..records import CandidateTask, Observation, SynthesisContext, Task, ToolCall, Verdict


class Interaction(BaseModel):
    """One (action, observation) pair of an exploration round."""

    model_config = ConfigDict(extra="forbid")

    call: ToolCall
    observation: Observation


class ExplorationRound(BaseModel):
    """One independent exploration from a fresh environment."""

    model_config = ConfigDict(extra="forbid")

    objective: str
    setup: dict = Field(default_factory=dict, description="The task setup the round started from.")
    interactions: list[Interaction] = Field(default_factory=list)


class Neighbour(BaseModel):
    """An existing task close to a candidate: shown to the abstractor as 'do not repeat'."""

    model_config = ConfigDict(extra="forbid")

    id: str
    text: str
    similarity: float


EnvFactory = Callable[[], Environment]


class Summarizer(Protocol):
    name: str

    async def summarize(self, item: FlaggedTrajectory, task: Task) -> SynthesisContext: ...


class Explorer(Protocol):
    name: str

    async def explore(
        self, item: FlaggedTrajectory, task: Task, context: SynthesisContext, make_env: EnvFactory
    ) -> list[ExplorationRound]: ...


class Abstractor(Protocol):
    name: str

    async def abstract(
        self,
        item: FlaggedTrajectory,
        task: Task,
        context: SynthesisContext,
        rounds: Sequence[ExplorationRound],
        neighbours: Sequence[Neighbour],
        make_env: EnvFactory,
    ) -> list[CandidateTask]: ...


class Judge(Protocol):
    name: str

    async def judge(self, candidate: CandidateTask, make_env: EnvFactory) -> Verdict: ...
