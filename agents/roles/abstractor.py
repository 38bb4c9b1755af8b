"""The task-abstractor: exploration rounds -> candidate tasks (query + minimal actions).

``OfflineAbstractor`` picks successful action windows that change state and
relabels them with the environment's describer. ``LLMAbstractor``
(``agents/roles/llm_abstractor.py``) asks a model for tasks instead; both check repeats
with the shared text helpers (``agents/roles/task_text.py``: ``repeats``, ``actions_key``).

Both return an ``Abstraction``: the candidates, and what they dropped before
judging and why.
"""

from __future__ import annotations

import difflib
import logging
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Literal

from ...envs.base import Environment, SupportsActionWindows, SupportsDescribe, SupportsVariants
from ...envs.parsing import render_call
from ...records import (
    CandidateTask,
    FlaggedTrajectory,
    SignalKind,
    SynthesisContext,
    Task,
    ToolCall,
)
from .explorer import focus_tools, tool_names
from .role_interfaces import (
    Abstraction,
    AbstractionInput,
    Interaction,
    RejectedCandidate,
    candidate_setup,
    primary_signal,
)
from .summarizer import failing_step
from .task_text import actions_key, call_values, mentions, normalise, repeats

log = logging.getLogger(__name__)

# --------------------------------------------------------------------------- environment traits


@dataclass
class _Traits:
    """What the offline abstractor needs to know about an environment."""

    mutating: Callable[[ToolCall], bool]
    # The setup of the state after ``prefix`` calls from ``setup``; None if it cannot be built.
    setup_after: Callable[[Mapping[str, Any], Sequence[ToolCall]], dict[str, Any] | None]
    # Whether calls that change nothing (lookups) may be left out of a window.
    drop_lookups: bool
    # The answer a lone lookup gives, for question tasks; None if it gives none.
    answer: Callable[[Interaction], str | None] = lambda interaction: None


def _traits(env: Environment) -> _Traits:
    if isinstance(env, SupportsActionWindows):

        def setup_after(setup: Mapping[str, Any], prefix: Sequence[ToolCall]) -> dict[str, Any]:
            return {**candidate_setup(setup), **env.setup_after(setup, prefix)}

        return _Traits(
            env.changes_state,
            setup_after,
            drop_lookups=True,
            answer=lambda interaction: env.lookup_answer(interaction.call, interaction.observation),
        )

    def start_only(setup: Mapping[str, Any], prefix: Sequence[ToolCall]) -> dict[str, Any] | None:
        return None if prefix else candidate_setup(setup)

    # Unknown state: every successful call counts, and windows start where the round did.
    return _Traits(lambda call: True, start_only, drop_lookups=False)


def generic_description(calls: Sequence[ToolCall]) -> str:
    """An instruction for environments without a describer."""
    steps = "; then ".join(render_call(call) for call in calls)
    return f"Use the tools to do the following, in order: {steps}."


# --------------------------------------------------------------------------- offline


@dataclass
class _Window:
    round_index: int
    start: int  # first interaction of the window
    end: int  # its last interaction: a state change, or a lookup that answers a question
    kept: list[int]  # interactions that make up the minimal actions
    links: int  # kept lookups whose observation supplies a later argument
    answer: str | None = None  # for a question task: what the answer must contain


def prefix_length(item: FlaggedTrajectory, failing: int, length: int) -> int:
    """How many of an unsolved task's first calls its step-toward variant keeps.

    At least the calls up to and including the failing one; then a further share
    of the remaining calls equal to the family's rollout success this cycle (the
    signal's ``family_success``), so the step grows toward the whole task as the
    family is learnt. Always one call short of the whole (that is the other variant),
    except for a one-call task.
    """
    if length <= 1:
        return length
    success = 0.0
    for signal in item.signals:
        if signal.kind == "unsolved":
            success = float(signal.evidence.get("family_success", 0.0))
    base = failing + 1
    grown = base + round(success * max(length - base, 0))
    return max(1, min(grown, length - 1))


def _one_per_sequence_first(
    proposals: Sequence[tuple[tuple, CandidateTask]],
) -> list[CandidateTask]:
    """The ranked candidates with the best of each tool sequence first, so the few kept
    ones differ; the rest after them, in rank order within their sequence."""
    by_sequence: dict[tuple[str, ...], list[CandidateTask]] = {}
    for _, candidate in proposals:
        sequence = tuple(c.name for c in candidate.minimal_actions)
        by_sequence.setdefault(sequence, []).append(candidate)
    ordered = [group[0] for group in by_sequence.values()]
    return ordered + [c for group in by_sequence.values() for c in group[1:]]


class OfflineAbstractor:
    """Successful, state-changing action windows relabelled by the environment's describer."""

    name = "abstractor:offline"
    reads_exploration = True

    def __init__(self, max_candidates: int = 3, max_window: int = 5, steer: bool = True):
        if max_candidates < 1 or max_window < 1:
            raise ValueError("max_candidates and max_window must be >= 1")
        self.max_candidates = max_candidates
        self.max_window = max_window
        self.steer = steer

    def _steered(
        self, item: FlaggedTrajectory, task: Task, context: SynthesisContext, env: Any
    ) -> list[CandidateTask]:
        """Signal-specific candidates that keep the parent's structure (needs SupportsVariants).

        All are made by the environment on fresh training values and states:
        - forgetting: the whole structure again (replay of the lost skill);
        - boundary: the whole structure, and the diverging transition (the failing
          call and the one before it) on its own;
        - unsolved: the first calls up to the failing one, more of them as the
          family's success rises (a step toward the structure; ``prefix_length``),
          and the whole structure;
        - rare: the whole structure once; explored windows (compositions with
          other sub-skills) fill the rest.
        """
        if not isinstance(env, SupportsVariants) or not task.reference_calls:
            return []
        kind = primary_signal(item)
        failing = context.failing_step
        if failing is None:
            failing = failing_step(item.trajectory, task.reference_calls)
        length = len(task.reference_calls)
        failing = min(failing if failing is not None else 0, length - 1)
        whole = (0, length)
        first_steps = (0, prefix_length(item, failing, length))
        # The diverging transition (the call before the failing one, and it) on its own.
        transition = (max(failing - 1, 0), failing + 1)
        plan: list[tuple[int, int]]
        match kind:
            case "boundary":
                plan = [whole] * (self.max_candidates - 1) + [transition]
            case "unsolved":
                plan = [first_steps] + [whole] * (self.max_candidates - 1)
            case "rare":
                plan = [whole]
            case _:  # forgetting: replay the lost skill whole
                plan = [whole] * self.max_candidates
        candidates = []
        for index, part in enumerate(plan):
            key = f"{item.trajectory.id}:{kind}:{index}"
            fresh = env.variant(task, key, part=part) if part != whole else None
            if fresh is None:  # the whole structure, or a part the env cannot cut
                fresh = env.variant(task, key)
            if fresh is None:
                continue
            calls = fresh.reference_calls
            label: Literal["structure_variant", "prefix", "transition"] = (
                "structure_variant"
                if len(calls) == length
                else "prefix"
                if part[0] == 0
                else "transition"
            )
            names = " > ".join(call.name for call in calls)
            candidates.append(
                CandidateTask(
                    description=f"{label} of {task.id}'s structure ({names}), "
                    f"failing step {failing}: {fresh.instruction}",
                    query=fresh.instruction,
                    minimal_actions=calls,
                    reference_answer=fresh.reference_answer,
                    parent_task_id=task.id,
                    signal=kind,
                    setup=dict(fresh.setup),
                    kind=label,
                )
            )
        return candidates

    async def abstract(self, given: AbstractionInput) -> Abstraction:
        item, task, context = given.item, given.task, given.context
        env = given.make_env()
        steered = self._steered(item, task, context, env) if self.steer else []
        kind = primary_signal(item)
        # Rare items also get explored windows (compositions with other sub-skills);
        # the other kinds are answered by the failing structure itself.
        if steered and kind != "rare":
            return Abstraction(candidates=steered[: self.max_candidates])
        rejected: list[RejectedCandidate] = []
        proposals = self._proposals(given, env, kind, rejected)
        chosen = self._choose(_one_per_sequence_first(proposals), given, rejected)
        chosen = (steered + chosen)[: self.max_candidates] if steered else chosen
        if not chosen:
            rejected.append(
                RejectedCandidate(
                    description=f"{len(given.rounds)} exploration round(s)",
                    reason="no successful state-changing action window"
                    if not proposals
                    else "every window repeated an existing task",
                )
            )
        return Abstraction(candidates=chosen, rejections=rejected)

    def _proposals(
        self,
        given: AbstractionInput,
        env: Any,
        kind: SignalKind | None,
        rejected: list[RejectedCandidate],
    ) -> list[tuple[tuple, CandidateTask]]:
        """Every explored window as a ranked candidate, best first, once per calls and
        setup; a window that is the parent task itself goes to ``rejected``."""
        task, rounds = given.task, given.rounds
        traits = _traits(env)
        describe = env.describe if isinstance(env, SupportsDescribe) else None
        focus = set(
            focus_tools(
                given.context, task, tool_names(env) or [c.name for c in task.reference_calls]
            )
        )
        parent_key = actions_key(task.reference_calls, candidate_setup(task.setup))
        parent_names = [call.name for call in task.reference_calls]
        proposals: list[tuple[tuple, CandidateTask]] = []
        seen: set[str] = set()
        for index, exploration in enumerate(rounds):
            for window in self._windows(index, exploration.interactions, traits):
                interactions = exploration.interactions
                prefix = [i.call for i in interactions[: window.start]]
                setup = traits.setup_after(exploration.setup, prefix)
                if setup is None:
                    continue
                calls = [interactions[k].call for k in window.kept]
                key = actions_key(calls, setup)
                if key in seen:
                    continue
                seen.add(key)
                query = describe(calls, setup) if describe else generic_description(calls)
                if not query or normalise(query) == "do nothing":
                    continue
                names = [c.name for c in calls]
                candidate = CandidateTask(
                    description=f"{' > '.join(names)} (from exploring {task.id}): {query}",
                    query=query,
                    minimal_actions=calls,
                    reference_answer=window.answer,
                    parent_task_id=task.id,
                    signal=kind,
                    setup=setup,
                )
                if key == parent_key:
                    rejected.append(
                        RejectedCandidate(
                            description=candidate.description, reason="repeats the parent task"
                        )
                    )
                    continue
                # Best first: every value stated or looked up, shaped like the parent's
                # solution (the skill the signal is about), on the focus tools, passing
                # values from lookups into later calls.
                rank = (
                    self._unstated_values(window, interactions, query),
                    -round(difflib.SequenceMatcher(None, names, parent_names).ratio(), 3),
                    -len(focus.intersection(names)),
                    -window.links,
                    len(window.kept),
                    window.round_index,
                    window.end,
                )
                proposals.append((rank, candidate))
        proposals.sort(key=lambda pair: pair[0])
        return proposals

    def _choose(
        self,
        ordered: Sequence[CandidateTask],
        given: AbstractionInput,
        rejected: list[RejectedCandidate],
    ) -> list[CandidateTask]:
        """The first ``max_candidates`` of ``ordered`` with distinct queries that repeat no
        existing task; those that do go to ``rejected``."""
        chosen: list[CandidateTask] = []
        queries: set[str] = set()
        for candidate in ordered:
            if len(chosen) >= self.max_candidates:
                break
            if normalise(candidate.query) in queries:
                continue
            why = repeats([candidate.query], given)
            if why:
                rejected.append(RejectedCandidate(description=candidate.description, reason=why))
                continue
            queries.add(normalise(candidate.query))
            chosen.append(candidate)
        return chosen

    def _windows(
        self, round_index: int, interactions: Sequence[Interaction], traits: _Traits
    ) -> list[_Window]:
        ok = [i.observation.error is None for i in interactions]
        windows: list[_Window] = []
        for end, interaction in enumerate(interactions):
            if not ok[end]:
                continue
            if not traits.mutating(interaction.call):
                answer = traits.answer(interaction)
                if answer is not None:  # a question the lookup answers on its own
                    windows.append(_Window(round_index, end, end, [end], 0, answer))
                continue
            seen_kept: set[tuple[int, ...]] = set()
            start = end
            while start >= 0 and ok[start] and end - start < self.max_window:
                kept, links = self._select(interactions, start, end, traits)
                if tuple(kept) not in seen_kept:
                    seen_kept.add(tuple(kept))
                    windows.append(_Window(round_index, start, end, kept, links))
                start -= 1
        return windows

    @staticmethod
    def _select(
        interactions: Sequence[Interaction], start: int, end: int, traits: _Traits
    ) -> tuple[list[int], int]:
        """The window's calls worth keeping: state changes, and lookups that feed them."""
        kept = [end]
        needed = set(call_values(interactions[end].call))
        links = 0
        for k in range(end - 1, start - 1, -1):
            interaction = interactions[k]
            if not traits.drop_lookups or traits.mutating(interaction.call):
                kept.append(k)
                needed.update(call_values(interaction.call))
            elif any(mentions(interaction.observation.text, v) for v in needed):
                kept.append(k)
                links += 1
                needed.update(call_values(interaction.call))
        kept.reverse()
        return kept, links

    @staticmethod
    def _unstated_values(window: _Window, interactions: Sequence[Interaction], query: str) -> int:
        """Argument values neither the query states nor a kept earlier observation shows."""
        unstated = 0
        shown = ""
        for k in window.kept:
            call = interactions[k].call
            unstated += sum(
                not mentions(query, v) and not mentions(shown, v) for v in call_values(call)
            )
            shown += "\n" + interactions[k].observation.text
        return unstated
