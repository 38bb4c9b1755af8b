"""Variation as the synthesis graph's explorer and abstractor: the explorer makes each
variant's calls (replayed in a fresh environment), the abstractor turns its request and
calls into a candidate; the judge replays and verifies as for any synthesizer."""

from __future__ import annotations

from collections.abc import Sequence

from ....records import CandidateTask, FlaggedTrajectory, SynthesisContext, Task, ToolCall
from ..role_interfaces import (
    Abstraction,
    AbstractionInput,
    EnvFactory,
    ExplorationRound,
    Interaction,
    RejectedCandidate,
    WrittenRequest,
    primary_signal,
)
from ..task_text import actions_key, repeats
from .engine import NotVaried, vary
from .values import ValuePools


class VariationExplorer:
    """Variations of the flagged task itself: its calls in its order, new values, no model.

    Each round is one variant (``engine.vary``): the parent's calls with new values, copied
    values read again from the new observations, and the interactions of the replay in a
    fresh environment that verified it; ``written`` carries the parent's
    request with the new values for the abstractor. A rare item gets one variant (a rare
    pattern needs seeing, not drilling); the others ``variants``. A round that could not
    vary the task says why in ``not_varied``.
    """

    name = "explorer:variation"

    def __init__(self, seed_tasks: Sequence[Task], variants: int = 3, seed: int = 0):
        if variants < 1:
            raise ValueError(f"variants must be >= 1, got {variants}")
        self.values = ValuePools.from_tasks(seed_tasks)  # other seeds' values, read once
        self.variants = variants
        self.seed = seed

    async def explore(
        self, item: FlaggedTrajectory, task: Task, context: SynthesisContext, make_env: EnvFactory
    ) -> list[ExplorationRound]:
        count = 1 if "rare" in item.kinds and len(item.kinds) == 1 else self.variants
        objective = f"vary {task.id}: its calls with new values"
        rounds = []
        for index in range(count):
            outcome = vary(
                task, make_env, self.values, key=f"{self.seed}:{item.trajectory.id}:{index}"
            )
            if isinstance(outcome, NotVaried):
                rounds.append(
                    ExplorationRound(
                        objective=objective,
                        setup=dict(task.setup),
                        not_varied=f"{outcome.reason}: {outcome.detail}",
                    )
                )
                continue
            variant = outcome.task
            # the replay that verified the variant is its round: no second replay here
            interactions = [
                Interaction(
                    call=ToolCall(name=step.call.name, arguments=dict(step.call.arguments)),
                    observation=step.observation,
                )
                for step in outcome.steps
                if step.call is not None
            ]
            rounds.append(
                ExplorationRound(
                    objective=objective,
                    setup=dict(variant.setup),
                    interactions=interactions,
                    written=WrittenRequest(
                        request=variant.instruction, answer=variant.reference_answer
                    ),
                )
            )
        return rounds


class VariationAbstractor:
    """The variation explorer's rounds as candidates: the request it wrote, the calls it ran.

    A round that could not vary the task is a rejection with its reason; a variant whose
    calls and setup repeat another's (two keys that chose the same values), or whose
    request repeats a stored task, is dropped with the reason too.
    """

    name = "abstractor:variation"
    reads_exploration = True

    async def abstract(self, given: AbstractionInput) -> Abstraction:
        task, kind = given.task, primary_signal(given.item)
        candidates: list[CandidateTask] = []
        rejected: list[RejectedCandidate] = []
        seen: set[str] = set()
        for index, exploration in enumerate(given.rounds):
            description = f"variation {index} of {task.id}"
            if exploration.written is None or not exploration.interactions:
                why = exploration.not_varied or "the explorer made no variant"
                rejected.append(
                    RejectedCandidate(description=description, reason=f"not varied: {why}")
                )
                continue
            calls = [interaction.call for interaction in exploration.interactions]
            key = actions_key(calls, exploration.setup)
            repeated = (
                "repeats another variation"
                if key in seen
                else repeats([exploration.written.request], given)
            )
            if repeated:
                rejected.append(RejectedCandidate(description=description, reason=repeated))
                continue
            seen.add(key)
            candidates.append(
                CandidateTask(
                    description=f"{description} ({' > '.join(c.name for c in calls)}): "
                    f"{exploration.written.request}",
                    query=exploration.written.request,
                    minimal_actions=calls,
                    reference_answer=exploration.written.answer,
                    parent_task_id=task.id,
                    signal=kind,
                    setup=dict(exploration.setup),
                    kind="variation",
                )
            )
        return Abstraction(candidates=candidates, rejections=rejected)
