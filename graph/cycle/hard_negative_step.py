"""The training step of a cycle with a failure agent (Co-Evolving Agents, arXiv 2511.22254).

Runs in place of the plain training step when ``hard_negatives.enabled``
(``coevolve.graph.cycle.training_step.train_cycle`` hands over to ``train_with_hard_negatives``):

1. the **failure agent** (a second LoRA adapter, ``adapters/failure-cycle-N``,
   on the policy's base model, switched in with peft) rolls out on the cycle's
   tasks -> ``cycles/NNN/failure_rollouts.jsonl``;
2. both agents' episodes get their failure grade (graded progress; on the world with
   the reference's calls counted too); the share of failures at or
   above ``hard_threshold`` is recorded per agent (``cycles/NNN/hard_negatives.json``
   and the cycle's ``train`` figures, key ``hard_negatives``);
3. the failure agent trains by DPO on (failure, failure) pairs of a task from
   both agents (never a success) -> ``adapters/failure-cycle-N``;
4. the target trains by DPO + SFT on (expert, failure) pairs, its own failures
   and the failure agent's -> ``adapters/cycle-N``, the policy of the next cycle.

Every stage leaves a file, so a run killed half-way resumes after the last
finished one: the rollouts file, then each adapter (saved atomically), then
``train.json``. The failure agent of cycle N continues ``failure-cycle-K``, the
latest finished one before N (``policy.adapter``, the target's starting point,
when there is none).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING

from pydantic import Field

from ...records import (
    HardNegativeFigures,
    TrainResult,
    Trajectory,
    is_success,
    split_transport_failures,
)
from ...run_files import RunFiles

if TYPE_CHECKING:  # pragma: no cover
    from ...agents.policy.policy_interface import Message
    from ...outputs.tracking import TrainTracking
    from ...records import Task
    from ...training.config import TrainingConfig
    from ...training.datasets import PreferencePair
    from ...training.hard_negatives.agents import Objective
    from ...training.hard_negatives.pairs import RankedPair
    from .context import CycleRuntime


class HardNegativeTrainResult(TrainResult):
    """The target's training result, with the failure agent's and the cycle's shares."""

    failure: TrainResult | None = Field(
        default=None, description="The failure agent's step (None: no failure agent)."
    )
    failure_adapter: str | None = Field(
        default=None, description="The failure agent's adapter after this cycle (None: the base)."
    )
    hard_negatives: HardNegativeFigures | None = Field(
        default=None,
        description="Shares of hard negatives per agent, pair counts, the failure agent's time.",
    )


def failure_adapter_dir(run_dir: Path, cycle: int) -> Path:
    return RunFiles(run_dir).failure_adapter(cycle)


def latest_failure_adapter(run_dir: Path, cycle: int, start: str | None) -> str | None:
    """The failure agent's adapter before ``cycle``: the latest finished ``failure-cycle-K``
    (K < cycle), else ``start`` (the target's starting adapter; None: the base model)."""
    from ...training.trainers import is_adapter_complete

    for earlier in range(cycle - 1, 0, -1):
        path = failure_adapter_dir(run_dir, earlier)
        if is_adapter_complete(path):
            return str(path)
    return start


async def _preference_step(
    rt: CycleRuntime,
    cycle: int,
    seed_label: str,
    training: TrainingConfig,
    objective: Objective,
    pairs: Sequence[PreferencePair],
    *,
    output_dir: Path,
    previous_adapter: str | None,
    tracking: TrainTracking | None = None,
) -> TrainResult:
    """One preference adapter of the step (the failure agent's or the target's): the one a
    killed run finished, else trained now, seeded by the cycle and ``seed_label``."""
    from ...training.hard_negatives.agents import train_preference_adapter
    from ...training.trainers import is_adapter_complete, load_train_result
    from .context import seed_everything

    if is_adapter_complete(output_dir):
        return load_train_result(output_dir)
    assert rt.model_dir is not None, "train_with_hard_negatives checks the base model first"
    seed_everything(rt.config.seed, cycle, seed_label)
    return await asyncio.to_thread(
        train_preference_adapter,
        training,
        objective,
        model_dir=rt.model_dir,
        output_dir=output_dir,
        previous_adapter=previous_adapter,
        pairs=pairs,
        progress=rt.progress,
        tracking=tracking,
    )


async def train_with_hard_negatives(
    rt: CycleRuntime, cycle: int, previous_adapter: str | None, rollouts: Sequence[Trajectory]
) -> HardNegativeTrainResult:
    """The cycle's failure-agent rollouts and training, then the target's DPO + SFT step.

    ``rt`` is the cycle's ``CycleRuntime``, ``rollouts`` the cycle's rollouts (the rollout
    stage's). Returns the target's result; the caller
    swaps ``adapter_dir`` into the policy.
    """
    from ...training.hard_negatives.agents import failure_pairs, with_failure_grades

    config = rt.config
    settings = config.hard_negatives
    files = rt.files(cycle)
    if files.train_record.exists():  # finished before a kill
        return HardNegativeTrainResult.model_validate_json(files.train_record.read_text())
    if rt.model_dir is None:
        from ...common.errors import RunError

        raise RunError(
            "training needs the base model locally: set policy.train_model to the "
            "directory of the model the endpoint serves"
        )
    failure_before = latest_failure_adapter(rt.run_dir, cycle, config.policy.adapter)
    task_ids = list(dict.fromkeys(t.task_id for t in rollouts))
    by_id = {task.id: task for task in rt.pool.tasks}
    tasks = [by_id[task_id] for task_id in task_ids if task_id in by_id]

    # 1. The failure agent's episodes on the same tasks; 2. both agents' failure grades.
    failure_trajectories, rollout_time = await _failure_agent_rollouts(
        rt, cycle, tasks, by_id, failure_before
    )
    trajectories = with_failure_grades(list(rollouts), by_id)

    # 3. The failure agent: DPO on (failure, failure) pairs from both agents.
    f_pairs = failure_pairs(
        trajectories,
        failure_trajectories,
        settings.failure_pairs_per_task,
        settings.hard_threshold,
    )
    train_started = time.perf_counter()
    failure_result = (
        await _train_failure_agent(rt, cycle, f_pairs, failure_before)
        if settings.failure_agent
        else None
    )
    failure_train_time = time.perf_counter() - train_started

    # 4. The target: DPO + SFT on (expert, failure) pairs.
    target, experts, t_pairs = await _train_target(
        rt, cycle, previous_adapter, tasks, trajectories, failure_trajectories
    )
    figures = _hard_negative_figures(
        rt,
        trajectories,
        failure_trajectories,
        f_pairs,
        t_pairs,
        experts=len(experts),
        rollout_time=rollout_time,
        failure_train_time=failure_train_time,
    )
    files.write_hard_negative_figures(figures)
    result = HardNegativeTrainResult(
        **target.model_dump(),
        failure=failure_result,
        failure_adapter=failure_before if failure_result is None else failure_result.adapter_dir,
        hard_negatives=figures,
    )
    files.write_train_record(result)
    _say(rt, cycle, figures)
    return result


async def _failure_agent_rollouts(
    rt: CycleRuntime,
    cycle: int,
    tasks: list[Task],
    by_id: dict[str, Task],
    failure_before: str | None,
) -> tuple[list[Trajectory], float]:
    """The failure agent's graded episodes on the cycle's tasks (those a killed run wrote,
    else played now with the adapter ``failure_before``) and the seconds playing took
    (0.0 when nothing was played; no episodes without a failure agent)."""
    from ...training.hard_negatives.agents import failure_agent_policy, with_failure_grades
    from .context import seed_everything

    config = rt.config
    settings = config.hard_negatives
    files = rt.files(cycle)
    failure_started = time.perf_counter()
    rollout_time = 0.0
    if not settings.failure_agent:
        return [], rollout_time
    if files.has_failure_rollouts():
        failure_trajectories = files.failure_rollouts()
    else:
        seed_everything(config.seed, cycle, "failure-rollout")
        async with failure_agent_policy(
            rt.policy, failure_before, config.policy.hot_load
        ) as failure_policy:
            failure_trajectories = await rt.play(
                tasks,
                k=settings.failure_rollouts or config.rollout.k,
                temperature=(
                    settings.failure_temperature
                    if settings.failure_temperature is not None
                    else config.rollout.temperature
                ),
                cycle=cycle,
                description=f"cycle {cycle} · failure agent",
                policy=failure_policy,
            )
        # Episodes the endpoint gave no reply for are no failures of the failure agent.
        failure_trajectories, _ = split_transport_failures(failure_trajectories)
        version = f"failure:{Path(failure_before).name if failure_before else 'base'}"
        failure_trajectories = [
            t.model_copy(update={"id": f"{t.id}/failure", "policy_version": version})
            for t in failure_trajectories
        ]
        rollout_time = time.perf_counter() - failure_started
    failure_trajectories = with_failure_grades(failure_trajectories, by_id)
    files.write_failure_rollouts(failure_trajectories)
    return failure_trajectories, rollout_time


async def _train_failure_agent(
    rt: CycleRuntime, cycle: int, f_pairs: Sequence[RankedPair], failure_before: str | None
) -> TrainResult:
    """The failure agent's DPO step on its pairs (``adapters/failure-cycle-N``), or, once
    the agent is frozen (``freeze_failure_after``), a skipped step that keeps ``failure_before``."""
    from ...training.hard_negatives.agents import failure_objective
    from ...training.trainers import is_adapter_complete

    settings = rt.config.hard_negatives
    failure_out = failure_adapter_dir(rt.run_dir, cycle)
    if not is_adapter_complete(failure_out) and not settings.trains_failure_agent(cycle):
        return TrainResult(
            algorithm="dpo",
            adapter_dir=failure_before,
            previous_adapter=failure_before,
            skipped=f"failure agent frozen after cycle {settings.freeze_failure_after}",
        )
    return await _preference_step(
        rt,
        cycle,
        "train-failure",
        settings.failure_config(rt.config.training),
        failure_objective(settings).model_copy(
            update={"pairs": len(f_pairs), "hard_pairs": sum(p.hard for p in f_pairs)}
        ),
        f_pairs,
        output_dir=failure_out,
        previous_adapter=failure_before,
    )


async def _train_target(
    rt: CycleRuntime,
    cycle: int,
    previous_adapter: str | None,
    tasks: list[Task],
    trajectories: list[Trajectory],
    failure_trajectories: list[Trajectory],
) -> tuple[TrainResult, dict[str, list[Message]], list[RankedPair]]:
    """The target's DPO + SFT step on (expert, failure) pairs (``adapters/cycle-N``), with
    the expert conversations and the pairs it trained on."""
    from ...outputs.tracking import for_training
    from ...training.hard_negatives.agents import (
        expert_conversations,
        target_objective,
        target_pairs,
    )

    config = rt.config
    settings = config.hard_negatives
    played = {t.task_id for t in trajectories + failure_trajectories}
    experts = expert_conversations(
        [task for task in tasks if task.id in played],
        rt.make_env,
        config.policy.system_prompt,
        successes=trajectories,
    )
    t_pairs = target_pairs(experts, trajectories, failure_trajectories, settings)
    target = await _preference_step(
        rt,
        cycle,
        "train",
        settings.target_config(config.training),
        target_objective(settings).model_copy(
            update={
                "pairs": len(t_pairs),
                "hard_pairs": sum(p.hard for p in t_pairs),
                "pairs_by_source": _pairs_by_source(t_pairs),
            }
        ),
        t_pairs,
        output_dir=rt.run_files.adapter(cycle),
        previous_adapter=previous_adapter,
        tracking=for_training(config, rt.run_dir, cycle),
    )
    return target, experts, t_pairs


def _pairs_by_source(t_pairs: Sequence[RankedPair]) -> dict[str, int]:
    """How many of the target's pairs reject each agent's episode."""
    return {
        agent: sum(p.rejected_agent == agent for p in t_pairs) for agent in ("target", "failure")
    }


def _hard_negative_figures(
    rt: CycleRuntime,
    trajectories: list[Trajectory],
    failure_trajectories: list[Trajectory],
    f_pairs: Sequence[RankedPair],
    t_pairs: Sequence[RankedPair],
    *,
    experts: int,
    rollout_time: float,
    failure_train_time: float,
) -> HardNegativeFigures:
    """The cycle's ``hard_negatives.json``: each agent's share of hard negatives, the
    pairs of both steps, and the failure agent's time."""
    from ...training.hard_negatives.agents import hard_negative_share

    settings = rt.config.hard_negatives
    return {
        "threshold": settings.hard_threshold,
        "target": hard_negative_share(trajectories, settings.hard_threshold),
        "failure_agent": (
            hard_negative_share(failure_trajectories, settings.hard_threshold)
            if settings.failure_agent
            else None
        ),
        "failure_pairs": len(f_pairs),
        "failure_pairs_hard": sum(p.hard for p in f_pairs),
        "failure_pairs_with_success": sum(
            is_success(p.chosen_score) or is_success(p.rejected_score) for p in f_pairs
        ),
        "target_pairs": len(t_pairs),
        "target_pairs_hard": sum(p.hard for p in t_pairs),
        "target_pairs_by_source": _pairs_by_source(t_pairs),
        "experts": experts,
        "failure_rollout_time_s": round(rollout_time, 3),
        "failure_train_time_s": round(failure_train_time, 3),
        "failure_time_s": round(rollout_time + failure_train_time, 3),
    }


def _percent(value: float | None) -> str:
    return "n/a" if value is None else f"{value:.0%}"


def _say(rt: CycleRuntime, cycle: int, figures: HardNegativeFigures) -> None:
    target = figures["target"]
    failure = figures.get("failure_agent")
    text = (
        f"cycle {cycle} · hard negatives (grade >= {figures['threshold']}): target "
        f"{_percent(target['share'])} of {target['failures']} failures"
    )
    if failure is not None:
        text += (
            f", failure agent {_percent(failure['share'])} of {failure['failures']} "
            f"(it succeeded in {_percent(failure['success'])} of its episodes)"
        )
    text += f"; pairs: failure agent {figures['failure_pairs']}, target {figures['target_pairs']}"
    rt.say(text)
