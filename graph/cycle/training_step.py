"""The training step of a cycle (the cycle graph's *train* node): ``train_cycle``.

It gathers the cycle's training data from the earlier stages' outputs (successful
conversations of the rollouts, demonstrations of the pool sample's accepted and replayed
tasks, preference pairs; SEAL weights from ``sft_weights`` and the flagged items), writes what it trains on for ``coevolve export``, runs the TRL
step (``training.trainers.train_adapter``: in a thread, or with ``training.launcher``
subprocess or accelerate in processes of its own, ``training.launch``) or, with
``hard_negatives.enabled``, hands over to
``graph.cycle.hard_negative_step.train_with_hard_negatives``, and makes the policy serve
the new adapter (``use_adapter``). A finished step is reused after a kill.
``coevolve.runner`` re-exports these.
"""

from __future__ import annotations

import asyncio
import logging
from collections import Counter
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, TypedDict

from pydantic import JsonValue

from ...agents.policy.policy_interface import LoraApiMissing
from ...common.errors import RunError
from .context import CycleRuntime, seed_everything

log = logging.getLogger(__name__)

if TYPE_CHECKING:  # pragma: no cover
    from ...agents.policy.policy_interface import Message
    from ...envs.base import Environment
    from ...outputs.tracking import TrainTracking
    from ...records import FlaggedTrajectory, PoolSample, Task, TrainResult, Trajectory
    from ...training.datasets import PreferencePair, TrainingConversation
    from ...training.grpo_config import GrpoConfig
    from ...training.seal import ReweightConfig


class TrainStepArguments(TypedDict):
    """What a cycle hands its training step, in process or launched (``train_adapter``)."""

    model_dir: Path
    output_dir: Path
    previous_adapter: str | Path | None
    conversations: list[TrainingConversation]
    pairs: list[PreferencePair]
    tasks: list[Task]
    make_env: Callable[[], Environment]
    system_prompt: str | None
    progress: bool
    tracking: TrainTracking | None
    capability_state_path: Path
    example_weights: list[float] | None
    tools_in_prompt: bool


async def use_adapter(rt: CycleRuntime, adapter: str | None) -> None:
    """Make the policy serve ``adapter``: reload in-process, or hot-load into vLLM.

    vLLM serves it as ``<model>-coevolve-<adapter directory>``, e.g. ``...-coevolve-cycle-2``.
    An endpoint's ``policy.hot_load`` decides what a server without the LoRA API
    (404/405/501) does: stop the run (required), or stay on what it served, with a
    warning (best_effort); ``off`` makes no request. Any other refusal stops the run.
    """
    if adapter is None:
        return
    from ...agents.policy.endpoint_policy import EndpointPolicy
    from ...agents.policy.local_policy import LocalPolicy

    policy = rt.config.policy
    if isinstance(rt.policy, LocalPolicy):
        rt.policy.reload_adapter(adapter)
        return
    if not isinstance(rt.policy, EndpointPolicy) or policy.endpoint is None:
        raise RunError(
            f"the policy ({type(rt.policy).__name__}) cannot swap in the adapter {adapter}: "
            "train with a local policy (policy.kind: local) or an endpoint (policy.kind: endpoint)"
        )
    endpoint = rt.config.endpoint(policy.endpoint)
    path = Path(adapter).resolve()
    if policy.hot_load == "off":
        log.info(
            "policy.hot_load is off: %s keeps serving %s; the adapter is saved in %s",
            endpoint.base_url,
            rt.policy.version,
            path,
        )
        return
    try:
        await rt.policy.serve_adapter(path)
    except LoraApiMissing as err:
        if policy.hot_load == "required":
            raise LoraApiMissing(
                f"{err}; to keep serving the model without the adapter, set "
                "policy.hot_load: best_effort"
            ) from None
        # A server without runtime LoRA loading (transformers serve, vLLM without
        # --enable-lora) still answers the base model: the run goes on, measuring that.
        log.warning(
            "could not hot-load the adapter %s (%s); the policy keeps serving %s, so the "
            "next rollouts and evaluation measure that model, not this adapter "
            "(policy.hot_load: best_effort)",
            path,
            err,
            rt.policy.version,
        )


async def train_cycle(
    rt: CycleRuntime,
    cycle: int,
    previous_adapter: str | None,
    trajectories: Sequence[Trajectory],
    flagged: Sequence[FlaggedTrajectory],
    pool: PoolSample,
) -> TrainResult:
    """The cycle's training data, the TRL step, and the policy update: from the cycle's
    rollouts, its kept flagged items and the pool's sample (the stages' outputs; nothing
    read from the cycle's files but the finished step's record)."""
    if (
        rt.config.hard_negatives.enabled
    ):  # failure agent + DPO + SFT target (graph/cycle/hard_negative_step.py)
        from .hard_negative_step import train_with_hard_negatives

        coevolved = await train_with_hard_negatives(rt, cycle, previous_adapter, trajectories)
        await use_adapter(rt, coevolved.adapter_dir)
        return coevolved
    result = finished_step(rt, cycle)
    if result is None:
        if rt.model_dir is None:
            raise RunError(
                "training needs the base model locally: set policy.train_model to the "
                "directory of the model the endpoint serves"
            )
        data = cycle_training_data(rt, trajectories, flagged, pool)
        result = await run_train_step(rt, cycle, previous_adapter, rt.model_dir, data)
    await use_adapter(rt, result.adapter_dir)
    return result


def finished_step(rt: CycleRuntime, cycle: int) -> TrainResult | None:
    """The cycle's step as a killed run finished it (from its record, or from its complete
    adapter and the rows of ``train_data.jsonl``), else None."""
    from ...training.trainers import TrainResult, is_adapter_complete, load_train_result

    files = rt.files(cycle)
    output_dir = rt.run_files.adapter(cycle)
    if files.train_record.exists():  # trained before a kill; the adapter is complete
        return TrainResult.model_validate_json(files.train_record.read_text())
    if is_adapter_complete(output_dir):  # killed between saving the adapter and the record
        # train_data.jsonl was written before the step: its rows say what the step learned from
        result = load_train_result(output_dir).model_copy(
            update={"rows_by_source": rows_by_source(files.train_data())}
        )
        files.write_train_record(result)
        return result
    return None


@dataclass
class CycleTrainingData:
    """What a cycle's step trains on: conversations (SFT, and GRPO's demonstration steps)
    with SEAL's weights, preference pairs (DPO), and tasks (GRPO's prompts)."""

    conversations: list[TrainingConversation]
    example_weights: list[float] | None
    pairs: list[PreferencePair]
    tasks: list[Task]


def cycle_training_data(
    rt: CycleRuntime,
    trajectories: Sequence[Trajectory],
    flagged: Sequence[FlaggedTrajectory],
    pool: PoolSample,
) -> CycleTrainingData:
    """The cycle's successful rollouts, the demonstrations of the pool sample's accepted
    and replayed tasks, SEAL's weights, the tasks and the preference pairs, every prompt
    with the tools the policy is served."""
    from ...training.datasets import (
        TrainingConversation,
        demonstrations_by_task,
        preference_pairs,
    )

    config = rt.config
    training = config.training
    accepted, replay = list(pool.accepted), list(pool.replay)
    tasks_by_id = {task.id: task for task in [*rt.pool.tasks, *accepted, *replay]}
    tools_of = prompt_tools(rt, tasks_by_id)
    conversations = rollout_conversations(rt, trajectories, tools_of)
    successes = len(conversations)

    def rendered(
        demonstrations: Iterable[tuple[Task, list[Message]]],
    ) -> list[TrainingConversation]:
        return [
            TrainingConversation(messages=messages, tools=tools_of(task.id), source=task.source)
            for task, messages in demonstrations
        ]

    demonstrated = demonstrations_by_task(
        accepted + replay, rt.make_env, config.policy.system_prompt
    )
    conversations += rendered(demonstrated)
    example_weights = None
    if training.algorithm == "sft" and training.seal.reweight.enable:
        example_weights = [1.0] * successes + sft_weights(
            [task for task, _ in demonstrated], flagged, training.seal.reweight
        )
    task_ids = {t.task_id for t in trajectories}
    tasks = [task for task in rt.pool.tasks if task.id in task_ids] + accepted
    if training.algorithm == "grpo":
        if training.grpo.demonstration_steps:
            replayed_ids = {task.id for task in replay}
            conversations = demonstration_data(
                training.grpo,
                tasks,
                trajectories,
                conversations[:successes],
                rendered(pair for pair in demonstrated if pair[0].id in replayed_ids),
                lambda failed: rendered(
                    demonstrations_by_task(failed, rt.make_env, config.policy.system_prompt)
                ),
            )
        if training.grpo.prompts == "spread":
            tasks = tasks_by_spread(
                tasks, trajectories, training.grpo.prompts_per_step, training.grpo.num_generations
            )
    pairs = [
        pair.model_copy(update={"tools": tools_of(pair.task_id)})
        for pair in preference_pairs(trajectories, max_per_task=training.dpo.max_pairs_per_task)
    ]
    return CycleTrainingData(conversations, example_weights, pairs, tasks)


def rollout_conversations(
    rt: CycleRuntime,
    trajectories: Sequence[Trajectory],
    tools_of: Callable[[str], list[dict[str, JsonValue]] | None],
) -> list[TrainingConversation]:
    """The cycle's successful rollouts as training conversations. They train on the ids the
    model read and wrote (sft.token_ids), or are rendered like the demonstrations, with the
    policy's rendering and its prompts' tools."""
    from ...training.datasets import TrainingConversation, json_arguments, successful_trajectories

    sft = rt.config.training.sft
    return [
        TrainingConversation(
            messages=json_arguments(t.messages),
            tools=tools_of(t.task_id),
            model_turns=t.model_turns if sft.token_ids else [],
            source="rollout",
        )
        for t in successful_trajectories(
            trajectories, max_per_task=sft.max_per_task, min_score=sft.min_score
        )
    ]


def train_rows(rt: CycleRuntime, data: CycleTrainingData) -> list[dict[str, object]]:
    """What this cycle's step trains on, for `coevolve export` (sft: conversations, dpo:
    pairs, grpo: prompts), each row with its source (TrainingSource), which the bench's
    units count."""
    algorithm = rt.config.training.algorithm
    if algorithm == "sft":
        conversations = data.conversations
        weights = data.example_weights or [1.0] * len(conversations)
        return [
            {"messages": c.messages, "tools": c.tools, "weight": w, "source": c.source}
            for c, w in zip(conversations, weights, strict=True)
        ]
    if algorithm == "dpo":  # pairs of the cycle's own episodes
        return [{**pair.model_dump(mode="json"), "source": "rollout"} for pair in data.pairs]
    # grpo: the prompts its episodes start from, with each task's tools
    from ...training.grpo.grpo_trainer import grpo_rows

    rows_out: list[dict[str, object]] = []
    for task in data.tasks:
        rows, schemas = grpo_rows([task], rt.make_env, rt.config.policy.system_prompt, 1, True)
        rows_out += [
            {"prompt": row["prompt"], "tools": schemas, "task_id": task.id, "source": task.source}
            for row in rows
        ]
    return rows_out


async def run_train_step(
    rt: CycleRuntime,
    cycle: int,
    previous_adapter: str | None,
    model_dir: Path,
    data: CycleTrainingData,
) -> TrainResult:
    """Write the cycle's training rows, run the TRL step (in a thread, or in a process of
    its own with ``training.launcher``) and write its record."""
    from ...outputs.tracking import for_training
    from ...training.trainers import train_adapter

    config = rt.config
    training = config.training
    files = rt.files(cycle)
    rows = train_rows(rt, data)
    files.write_train_data(rows)
    seed = seed_everything(config.seed, cycle, "train")
    step = TrainStepArguments(
        model_dir=model_dir,
        output_dir=rt.run_files.adapter(cycle),
        previous_adapter=previous_adapter,
        conversations=data.conversations,
        pairs=data.pairs,
        tasks=data.tasks,
        make_env=rt.make_env,
        system_prompt=config.policy.system_prompt,
        progress=rt.progress,
        tracking=for_training(config, rt.run_dir, cycle),
        capability_state_path=rt.run_files.capability_state,
        example_weights=data.example_weights,
        tools_in_prompt=config.policy.renders_tools,
    )
    if training.launcher == "inprocess":
        result = await asyncio.to_thread(train_adapter, training, **step)
    else:  # a process of its own (training/launch.py); its output goes to run.log
        from ...outputs.tracking import release_shared_runs
        from ...training.launch import launch_train_adapter

        release_shared_runs()  # the child logs into the loop's W&B run

        result = await asyncio.to_thread(
            launch_train_adapter,
            training,
            step_file=files.train_step_spec,
            log_file=rt.run_files.log,
            environment=config.env.name,
            seed=seed,
            **step,
        )
    result = result.model_copy(update={"rows_by_source": rows_by_source(rows)})
    files.write_train_record(result)
    return result


def rows_by_source(rows: Iterable[Mapping[str, object]]) -> dict[str, int]:
    """How many training rows came from each source (``TrainingSource``; rows written before
    rows had one count as "unrecorded")."""
    counts = Counter(str(row.get("source") or "unrecorded") for row in rows)
    return dict(sorted(counts.items()))


def binary_outcomes(trajectories: Sequence[Trajectory]) -> dict[str, list[bool]]:
    """Task id -> whether each of its rollouts this cycle succeeded (``is_success``)."""
    from ...records import is_success

    outcomes: dict[str, list[bool]] = {}
    for trajectory in trajectories:
        outcomes.setdefault(trajectory.task_id, []).append(is_success(trajectory.score))
    return outcomes


def all_failed(tasks: Sequence[Task], trajectories: Sequence[Trajectory]) -> list[Task]:
    """The tasks every rollout of which failed this cycle (binary success)."""
    outcomes = binary_outcomes(trajectories)
    return [task for task in tasks if outcomes.get(task.id) and not any(outcomes[task.id])]


def demonstration_data(
    grpo: GrpoConfig,
    tasks: Sequence[Task],
    trajectories: Sequence[Trajectory],
    successes: Sequence[TrainingConversation],
    pool_replay: Sequence[TrainingConversation],
    demonstrate: Callable[[list[Task]], list[TrainingConversation]],
) -> list[TrainingConversation]:
    """What GRPO's demonstration steps train on: the reference solutions
    (``demonstrate``) of the tasks every rollout of which failed this cycle, which would
    give groups without reward spread, then the cycle's verified successes
    (``grpo.replay_successes``) and the pool's replayed reference solutions, the SFT arms'
    replay (``grpo.replay_pool``)."""
    return [
        *demonstrate(all_failed(tasks, trajectories)),
        *(successes if grpo.replay_successes else []),
        *(pool_replay if grpo.replay_pool else []),
    ]


def tasks_by_spread(
    tasks: Sequence[Task], trajectories: Sequence[Trajectory], minimum: int, group_size: int
) -> list[Task]:
    """GRPO's tasks where the gradient is (``training.grpo.prompts: spread``): those whose
    group of ``group_size`` episodes would, by this cycle's rollouts, more likely than not
    both succeed and fail, the likeliest first; the others only as many as it takes to
    reach ``minimum``. A task's success rate is its own rollouts' weighed with its family's
    (``training.grpo.dynamic_sampling.success_rates``): most tasks synthesized in a cycle are
    variants of tasks no rollout solved, and played as groups they all fail (at the
    quickstart, 72 of 77 GRPO tasks were such new tasks, with mean reward 0.1)."""
    from ...training.grpo.dynamic_sampling import has_spread, spread_chance, success_rates

    outcomes = binary_outcomes(trajectories)
    families = {t.task_id: t.family for t in trajectories}
    rates = success_rates(tasks, outcomes, families)
    chance = {task.id: spread_chance(rates[task.id], group_size) for task in tasks}
    ranked = sorted(tasks, key=lambda task: -chance[task.id])
    chosen = [task for task in ranked if chance[task.id] >= 0.5]
    filler = [task for task in ranked if chance[task.id] < 0.5][: max(0, minimum - len(chosen))]
    log.info(
        "GRPO tasks by expected spread: %d kept (%d with mixed outcomes this cycle, %d new), "
        "%d of %d others to fill the round",
        len(chosen),
        sum(has_spread(outcomes.get(task.id, ())) for task in chosen),
        sum(task.id not in outcomes for task in chosen),
        len(filler),
        len(tasks) - len(chosen),
    )
    return chosen + filler


def prompt_tools(
    rt: CycleRuntime, tasks_by_id: Mapping[str, Task]
) -> Callable[[str], list[dict[str, JsonValue]] | None]:
    """``task id -> the tool schemas its prompt carries`` (None when prompts carry none): a
    fresh environment reset to the task, as a rollout starts, so training renders the
    prompt the policy is served."""
    if not rt.config.policy.renders_tools:
        return lambda task_id: None
    cache: dict[str, list[dict[str, JsonValue]] | None] = {}

    def tools_of(task_id: str) -> list[dict[str, JsonValue]] | None:
        if task_id not in cache:
            task = tasks_by_id.get(task_id)
            if task is None:
                cache[task_id] = None
            else:
                env = rt.make_env()
                env.reset(task)
                cache[task_id] = list(env.tools())
        return cache[task_id]

    return tools_of


def sft_weights(
    tasks: list[Task], flagged: Sequence[FlaggedTrajectory], settings: ReweightConfig
) -> list[float]:
    """SEAL's weight per demonstrated task: the diagnosis of the failure it answers.

    A task synthesized this cycle takes the labels of the flagged episode of its
    parent task (the cycle's flagged items), so the demonstrations answering severe
    failures (a spurious call, an invalid tool) weigh more; replayed tasks and
    tasks whose parent episode is unknown weigh 1.0.
    """
    from ...training.seal import trajectory_weight

    labels: dict[str, list[str]] = {}
    for item in flagged:
        labels.setdefault(item.trajectory.task_id, list(item.trajectory.diagnosis))
    return [
        trajectory_weight(labels[task.parent_task_id], settings)
        if task.source == "synthesized" and task.parent_task_id in labels
        else 1.0
        for task in tasks
    ]
