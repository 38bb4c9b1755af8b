"""Preference pairs ranked by failure grade, for the Co-Evolving Agents step: failures and
hard-negative shares, (failure, failure) pairs for the failure agent and (expert, failure)
pairs for the target.

An episode's failure grade (``Trajectory.failure_grade``, from its environment's
``failure_grade``) is how close it came to success: BFCL's turn-level progress,
and on the world the graded progress with the reference's calls counted as units
too, since the world's state changes alone grade nearly every failure 0."""

from __future__ import annotations

import json
import logging
from collections import defaultdict
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Literal

from pydantic import Field

from ...agents.policy.policy_interface import Message
from ...envs.base import TASK_ERRORS
from ...records import AgentShare, Task, Trajectory, is_success
from ..datasets import (
    PreferencePair,
    demonstrations_by_task,
    every_item_failed,
    json_arguments,
    split_opening,
)

if TYPE_CHECKING:  # pragma: no cover
    from collections.abc import Callable

    from ...envs.base import Environment
    from .settings import HardNegativeConfig

logger = logging.getLogger(__name__)

Agent = Literal["target", "failure"]


def with_failure_grades(
    trajectories: Sequence[Trajectory], tasks: Mapping[str, Task]
) -> list[Trajectory]:
    """The trajectories with ``failure_grade`` (and ``progress``) filled in where missing,
    from the task's environment (its registry spec). One whose task is unknown, or whose
    environment is not registered, keeps None and is never ranked."""
    from ...envs.registry import find_environment

    out = []
    tried, crashed = 0, []
    for trajectory in trajectories:
        task = tasks.get(trajectory.task_id)
        spec = find_environment(task.env) if task is not None else None
        if trajectory.failure_grade is not None or task is None or spec is None:
            out.append(trajectory)
            continue
        tried += 1
        try:
            value = spec.failure_grade(task, trajectory)
            progress = trajectory.progress
            if progress is None:
                _, progress = spec.diagnose(task, trajectory)
        except TASK_ERRORS as err:  # one odd trajectory must not end the cycle
            crashed.append(f"{trajectory.id}: {type(err).__name__}: {err}")
            logger.warning("no failure grade for %s", crashed[-1])
            out.append(trajectory)
            continue
        update = {"failure_grade": _unit(value), "progress": _unit(progress)}
        out.append(trajectory.model_copy(update=update))
    if tried and len(crashed) == tried:
        raise every_item_failed("failure grades", tried, crashed[0])
    return out


def _unit(value: float) -> float:
    return min(max(value, 0.0), 1.0)


def grade(trajectory: Trajectory) -> float:
    return trajectory.failure_grade or 0.0


def is_failure(trajectory: Trajectory) -> bool:
    """A finished episode below full score, with an assistant turn and a failure grade."""
    if is_success(trajectory.score) or trajectory.failure_grade is None:
        return False
    if trajectory.error is not None:
        return False
    opening, rest = split_opening(trajectory.messages)
    return bool(opening) and any(m.get("role") == "assistant" for m in rest)


def hard_negative_share(trajectories: Sequence[Trajectory], threshold: float) -> AgentShare:
    """How many of the episodes' failures are hard negatives (failure grade >= ``threshold``).

    ``share`` is hard / failures (None without failures); ``success`` the share of
    episodes that succeeded; ``mean_failure_grade`` the mean grade of the failures.
    """
    failures = [t for t in trajectories if is_failure(t)]
    hard = [t for t in failures if grade(t) >= threshold]
    successes = sum(is_success(t.score) for t in trajectories)
    return {
        "episodes": len(trajectories),
        "success": successes / len(trajectories) if trajectories else None,
        "failures": len(failures),
        "hard": len(hard),
        "share": len(hard) / len(failures) if failures else None,
        "mean_failure_grade": (
            sum(grade(t) for t in failures) / len(failures) if failures else None
        ),
    }


class RankedPair(PreferencePair):
    """A preference pair with where its sides came from and their failure grades."""

    chosen_agent: Literal["target", "failure", "expert"]
    rejected_agent: Agent
    chosen_id: str
    rejected_id: str
    chosen_grade: float
    rejected_grade: float
    chosen_score: float
    rejected_score: float
    hard: bool = Field(description="The rejected side (for failure pairs: the chosen) is hard.")


def _distinct_failures(
    tagged: Sequence[tuple[Agent, Trajectory]],
) -> list[tuple[Agent, Trajectory, list[Message], list[Message]]]:
    """(agent, trajectory, opening, rest) of each distinct failure, highest grade first."""
    seen: set[str] = set()
    out = []
    ranked = sorted(tagged, key=lambda item: -grade(item[1]))
    for agent, trajectory in ranked:
        if not is_failure(trajectory):
            continue
        messages = json_arguments(trajectory.messages)
        key = json.dumps(messages, sort_keys=True, ensure_ascii=False)
        if key in seen:
            continue
        seen.add(key)
        opening, rest = split_opening(messages)
        out.append((agent, trajectory, opening, rest))
    return out


def _by_task(
    target: Sequence[Trajectory], failure: Sequence[Trajectory]
) -> dict[str, list[tuple[Agent, Trajectory]]]:
    grouped: dict[str, list[tuple[Agent, Trajectory]]] = defaultdict(list)
    for trajectory in target:
        grouped[trajectory.task_id].append(("target", trajectory))
    for trajectory in failure:
        grouped[trajectory.task_id].append(("failure", trajectory))
    return grouped


def failure_pairs(
    target: Sequence[Trajectory],
    failure: Sequence[Trajectory],
    max_per_task: int,
    hard_threshold: float = 0.6,
) -> list[RankedPair]:
    """(failure, failure) pairs of one task for the failure agent's DPO.

    Failures (score < 1, failure grade known, finished without error) of both
    agents are pooled per task; in every pair the chosen side has a strictly higher
    grade than the rejected one (ties are dropped), either agent may be on
    either side, and a success is never on either side. Both sides share the
    opening (system prompt and request). Pairs whose chosen side has the highest
    grade come first, then the widest margin; at most ``max_per_task`` per task,
    each failure chosen at most once.
    """
    if max_per_task < 1:
        raise ValueError(f"max_per_task must be >= 1, got {max_per_task}")
    pairs = []
    for task_id, tagged in _by_task(target, failure).items():
        failures = _distinct_failures(tagged)
        candidates = []
        for i, (c_agent, chosen, c_open, c_rest) in enumerate(failures):
            for r_agent, rejected, r_open, r_rest in failures[i + 1 :]:
                c_grade, r_grade = grade(chosen), grade(rejected)
                if c_grade <= r_grade or c_open != r_open:
                    continue
                candidates.append(
                    (-c_grade, -(c_grade - r_grade), i, c_agent, chosen, c_rest, r_agent, rejected, r_rest, c_open)
                )  # fmt: skip
        candidates.sort(key=lambda item: item[:3])
        used: set[str] = set()
        for _, _, _, c_agent, chosen, c_rest, r_agent, rejected, r_rest, opening in candidates:
            if len(used) >= max_per_task:
                break
            if chosen.id in used:
                continue
            used.add(chosen.id)
            pairs.append(
                RankedPair(
                    task_id=task_id,
                    prompt=opening,
                    chosen=c_rest,
                    rejected=r_rest,
                    chosen_turns=chosen.model_turns,  # token ids where the rollout kept them
                    rejected_turns=rejected.model_turns,
                    chosen_agent=c_agent,
                    rejected_agent=r_agent,
                    chosen_id=chosen.id,
                    rejected_id=rejected.id,
                    chosen_grade=grade(chosen),
                    rejected_grade=grade(rejected),
                    chosen_score=chosen.score,
                    rejected_score=rejected.score,
                    hard=grade(chosen) >= hard_threshold,
                )
            )
    return pairs


def expert_conversations(
    tasks: Sequence[Task],
    make_env: Callable[[], Environment],
    system_prompt: str | None,
    successes: Sequence[Trajectory] = (),
) -> dict[str, list[Message]]:
    """The expert conversation of each task: its reference solution replayed, kept only when
    it verifies; otherwise the shortest verified success among ``successes``."""
    experts = {
        task.id: json_arguments(messages)
        for task, messages in demonstrations_by_task(tasks, make_env, system_prompt)
    }
    for trajectory in sorted(successes, key=lambda t: len(t.messages)):
        if (
            trajectory.task_id not in experts
            and is_success(trajectory.score)
            and trajectory.error is None
            and trajectory.finished
        ):
            experts[trajectory.task_id] = json_arguments(trajectory.messages)
    return experts


def target_pairs(
    experts: Mapping[str, Sequence[Message]],
    target: Sequence[Trajectory],
    failure: Sequence[Trajectory],
    settings: HardNegativeConfig,
) -> list[RankedPair]:
    """(expert, failure) pairs of one task for the target's DPO + SFT.

    Per task, ``round(failure_share * pairs_per_task)`` rejected sides come from
    the failure agent's failures and the rest from the target's own, highest
    failure grade first, only failures graded >= ``min_negative_progress``;
    when one source runs short the other fills in (unless the share is 0 or 1).
    The expert is always the chosen side. A rejected conversation longer than the
    expert's by more than ``truncate_extra_turns`` (assistant, tool) turns is cut.
    """
    share = settings.failure_share
    pairs = []
    for task_id, tagged in _by_task(target, failure).items():
        expert = experts.get(task_id)
        if expert is None:
            continue
        opening, chosen = split_opening(json_arguments(expert))
        pool: dict[Agent, list[tuple[Trajectory, list[Message]]]] = {"target": [], "failure": []}
        for agent, trajectory, t_open, rest in _distinct_failures(tagged):
            if t_open == opening and grade(trajectory) >= settings.min_negative_progress:
                pool[agent].append((trajectory, rest))
        quota_failure = round(share * settings.pairs_per_task)
        picked: list[tuple[Agent, Trajectory, list[Message]]] = []
        picked += [("failure", t, r) for t, r in pool["failure"][:quota_failure]]
        picked += [
            ("target", t, r) for t, r in pool["target"][: settings.pairs_per_task - len(picked)]
        ]
        if 0.0 < share < 1.0:  # one side ran short: the other fills in
            for agent in ("failure", "target"):
                for t, r in pool[agent]:
                    if len(picked) >= settings.pairs_per_task:
                        break
                    if all(t.id != p[1].id for p in picked):
                        picked.append((agent, t, r))
        for agent, trajectory, rest in picked:
            whole = len(rest)
            if settings.truncate_extra_turns is not None:
                rest = rest[: len(chosen) + 2 * settings.truncate_extra_turns]
            pairs.append(
                RankedPair(
                    task_id=task_id,
                    prompt=opening,
                    chosen=chosen,
                    rejected=rest,
                    # The expert is rendered; the negative keeps its generated ids unless cut.
                    rejected_turns=trajectory.model_turns if len(rest) == whole else [],
                    chosen_agent="expert",
                    rejected_agent=agent,
                    chosen_id=f"{task_id}/expert",
                    rejected_id=trajectory.id,
                    chosen_grade=1.0,
                    rejected_grade=grade(trajectory),
                    chosen_score=1.0,
                    rejected_score=trajectory.score,
                    hard=grade(trajectory) >= settings.hard_threshold,
                )
            )
    return pairs
