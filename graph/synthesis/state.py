"""The synthesis graph's state and records: what a pass carries and what it returns.

``SynthesisState`` is the pass's state and ``BranchState`` one flagged item's on
its way through the four roles; their reducers merge the parallel branches.
``SynthesisResult`` is a finished pass, read from the graph's output.
"""

from __future__ import annotations

import operator
from typing import Annotated, TypedDict

from pydantic import BaseModel

from ...agents.roles.role_interfaces import ExplorationRound
from ...records import CandidateTask, FlaggedTrajectory, Neighbour, SynthesisContext, Task, Verdict

# The synthesis funnel: how many items reach each stage of a pass, in order.
FUNNEL_STAGES = ("flagged", "explored", "candidates", "judged_ok", "duplicates", "accepted")


def add_counts(left: dict[str, int] | None, right: dict[str, int] | None) -> dict[str, int]:
    """Reducer: stage counts from parallel branches add up."""
    merged = dict(left or {})
    for key, value in (right or {}).items():
        merged[key] = merged.get(key, 0) + value
    return merged


class Rejection(BaseModel):
    """Why something did not make it, and where."""

    stage: str
    trajectory_id: str | None = None
    candidate: str | None = None
    reason: str


class JudgedCandidate(BaseModel):
    candidate: CandidateTask
    verdict: Verdict
    parent_id: str
    signal: str | None = None
    trajectory_id: str | None = None  # the flagged trajectory it came from


class SynthesisInput(TypedDict, total=False):
    flagged: list[FlaggedTrajectory]
    parents: list[Task]
    cycle: int


class SynthesisOutput(TypedDict, total=False):
    accepted: list[Task]
    counts: dict[str, int]
    rejections: list[Rejection]
    roles: dict[str, str]


class SynthesisState(TypedDict, total=False):
    flagged: list[FlaggedTrajectory]
    parents: list[Task]
    cycle: int
    roles: dict[str, str]
    neighbours: dict[str, list[Neighbour]]  # parent task id -> nearest stored tasks
    judged: Annotated[list[JudgedCandidate], operator.add]
    judged_at_frontier: list[JudgedCandidate]  # those the frontier check kept
    counts: Annotated[dict[str, int], add_counts]
    rejections: Annotated[list[Rejection], operator.add]
    accepted: list[Task]


class BranchState(TypedDict, total=False):
    """One flagged item on its way through the four roles."""

    item: FlaggedTrajectory
    parent: Task
    branch_cycle: int
    parent_neighbours: list[Neighbour]
    context: SynthesisContext | None
    rounds: list[ExplorationRound]
    proposals: list[CandidateTask]
    # Shared with the parent graph, where the reducers merge the branches.
    judged: Annotated[list[JudgedCandidate], operator.add]
    counts: Annotated[dict[str, int], add_counts]
    rejections: Annotated[list[Rejection], operator.add]


# Counts of endpoint replies that could not be read, by kind: "reply_errors:<kind>".
REPLY_ERRORS = "reply_errors:"
# Tokens the endpoints reported for the roles' replies: "tokens:prompt", "tokens:completion".
TOKENS = "tokens:"


class SynthesisResult(BaseModel):
    accepted: list[Task]
    # the funnel (FUNNEL_STAGES), crashed items, kind:<signal>:<kind>, reply_errors:<kind>,
    # tokens:prompt|completion
    counts: dict[str, int]
    rejections: list[Rejection]
    roles: dict[str, str]

    @classmethod
    def from_output(cls, out: SynthesisOutput) -> SynthesisResult:
        """The result of a pass from the graph's output (also the cycle graph's state)."""
        found = out.get("counts") or {}
        counts = {stage: found.get(stage, 0) for stage in FUNNEL_STAGES}
        counts["crashed"] = found.get("crashed", 0)
        # candidates by "kind:<signal>:<kind>" (what the abstractor made for each signal), and
        # unreadable endpoint replies by "reply_errors:<kind>", the replies' tokens
        counts.update(
            {key: n for key, n in found.items() if key.startswith(("kind:", REPLY_ERRORS, TOKENS))}
        )
        if "at_frontier" in found:  # only a pass with the frontier check has the stage
            counts["at_frontier"] = found["at_frontier"]
        return cls(
            accepted=out.get("accepted") or [],
            counts=counts,
            rejections=out.get("rejections") or [],
            roles=out.get("roles") or {},
        )
