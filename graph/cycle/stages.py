"""The stages of a cycle as functions: the library API beside ``coevolve.run``.

Each stage takes the run's runtime, the cycle and what the earlier stages made (in
memory: no stage reads another's files), does its work, writes the cycle's files
(``CycleFiles``, for resume and export) and returns what it made with its figures. The
cycle graph's nodes (graph/cycle/graph.py) are these calls plus the checkpointed state (they
read a stage's input back from the cycle's files, which a resume finds); a script can call
them itself, the way ART exposes ``gather`` and
``model.train`` beside its one-call loop::

    from coevolve import build_bootstrap_agent, build_runtime
    from coevolve.config import load_config
    from coevolve.graph.cycle import stages

    config = load_config("configs/quickstart.yaml")
    build_bootstrap_agent(config, say=print)  # trains only when the cache lacks it
    rt = build_runtime(config)
    trajectories, _ = await stages.rollout(rt, cycle=1)
    flagged, _ = await stages.signals(rt, 1, trajectories)
    synthesized, _ = await stages.synthesize(rt, 1, flagged)
    pool, _ = stages.update_pool(rt, 1, synthesized.accepted)
    trained, _ = await stages.train(rt, 1, trajectories, flagged, pool, adapter=None)
    episodes, evaluation = await stages.evaluate(rt, 1)

Every stage seeds the random generators per (seed, cycle, stage), as the loop
does, so a stage run again samples alike.
"""

from __future__ import annotations

import time
from collections import Counter
from collections.abc import Sequence
from typing import TYPE_CHECKING

from ...agents.policy.eval_report import left_out_note
from ...outputs.summary import (
    EvaluationFigures,
    FamilyFlags,
    PoolFigures,
    RolloutFigures,
    SignalFigures,
    SynthesisFigures,
    TrainFigures,
    synthesized_by_parent_family,
)
from ...records import (
    PoolSample,
    SignalKind,
    Task,
    Trajectory,
    is_success,
    split_transport_failures,
)
from ..synthesis.state import REPLY_ERRORS, TOKENS, SynthesisResult
from .context import CycleRuntime, seed_everything
from .evaluation import evaluate_agent

if TYPE_CHECKING:  # pragma: no cover
    from ...records import FlaggedTrajectory, TrainResult

__all__ = [
    "PoolSample",
    "evaluate",
    "pool_sample",
    "record_synthesis",
    "rollout",
    "signals",
    "synthesis_input",
    "synthesize",
    "train",
    "update_pool",
]


def _success_rate(trajectories: Sequence[Trajectory]) -> float:
    if not trajectories:
        return 0.0
    return sum(is_success(t.score) for t in trajectories) / len(trajectories)


async def rollout(rt: CycleRuntime, cycle: int) -> tuple[list[Trajectory], RolloutFigures]:
    """The cycle's tasks sampled from the pool and played K times each, diagnosed."""
    from ...envs.diagnosis import count_labels
    from ...envs.registry import annotate

    config = rt.config
    tasks = rt.pool.sample(cycle, rt.history, config.pool)
    seed_everything(config.seed, cycle, "rollout")
    started = time.perf_counter()
    trajectories = await rt.play(
        tasks,
        k=config.rollout.k,
        temperature=config.rollout.temperature,
        cycle=cycle,
        description=f"cycle {cycle} · rollout",
    )
    elapsed = time.perf_counter() - started
    # Episodes the endpoint gave no reply for are not the agent's outcomes: they stay out
    # of rollouts.jsonl, which signals, history, patterns and training read.
    trajectories, lost = split_transport_failures(trajectories)
    # SEAL's diagnosis: a label per turn (BFCL) or step (world) and the graded progress,
    # stored on each trajectory and counted per cycle.
    trajectories = annotate(trajectories, {task.id: task for task in tasks})
    rt.files(cycle).write_rollouts(trajectories)
    rt.files(cycle).write_unreachable("rollout", lost)
    sources = Counter(task.source for task in tasks)
    figures = RolloutFigures(
        tasks=len(tasks),
        seed_tasks=sources.get("seed", 0),
        synthesized_tasks=sources.get("synthesized", 0),
        episodes=len(trajectories),
        left_out=len(lost),
        success=_success_rate(trajectories),
        diagnosis=count_labels(trajectories),
        tokens=sum(t.completion_tokens for t in trajectories),
        time_s=elapsed,
    )
    rt.say(
        f"cycle {cycle} · rollout: {len(tasks)} tasks ({figures.synthesized_tasks} synthesized)"
        f" × {config.rollout.k} = {len(trajectories) + len(lost)} episodes"
        f"{left_out_note(len(lost))}, success {figures.success:.1%} [{elapsed:.0f} s]"
    )
    return trajectories, figures


def flag_map(
    trajectories: Sequence[Trajectory],
    flagged: Sequence[FlaggedTrajectory],
    kept: Sequence[FlaggedTrajectory],
    kinds: Sequence[SignalKind],
) -> SignalFigures:
    """Where the flags land: counts by kind and by family, before and after the budget.

    ``flag_precision`` is the share of kept items (the synthesis budget) whose family
    is below 50% success over this cycle's rollouts: the families the agent cannot
    do yet.
    """
    from ...memory.signals import failure_rates

    rates = failure_rates(trajectories)
    families = sorted({t.family for t in trajectories})

    def of_family(items: Sequence[FlaggedTrajectory], family: str) -> tuple[dict[str, int], int]:
        """Items of the family by kind (kinds with none left out), and how many items."""
        mine = [item for item in items if item.trajectory.family == family]
        counts = Counter(kind for item in mine for kind in item.kinds)
        return {kind: counts[kind] for kind in kinds if counts.get(kind, 0)}, len(mine)

    by_family: dict[str, FamilyFlags] = {}
    for family in families:
        flagged_kinds, flagged_items = of_family(flagged, family)
        kept_kinds, kept_items = of_family(kept, family)
        by_family[family] = FamilyFlags(
            rollout_success=round(1.0 - rates.get(family, 0.0), 4),
            flagged=flagged_kinds,
            flagged_items=flagged_items,
            kept=kept_kinds,
            kept_items=kept_items,
        )
    by_kind = Counter(kind for item in flagged for kind in item.kinds)
    kept_by_kind = Counter(kind for item in kept for kind in item.kinds)
    weak = [item for item in kept if rates.get(item.trajectory.family, 0.0) > 0.5]
    return SignalFigures(
        flagged=len(flagged),
        kept=len(kept),
        by_kind={kind: by_kind.get(kind, 0) for kind in kinds},
        kept_by_kind={kind: kept_by_kind.get(kind, 0) for kind in kinds},
        by_family=by_family,
        flag_precision=len(weak) / len(kept) if kept else 0.0,
    )


async def signals(
    rt: CycleRuntime, cycle: int, trajectories: Sequence[Trajectory]
) -> tuple[list[FlaggedTrajectory], SignalFigures]:
    """The failure-prone trajectories the cycle keeps for synthesis (the detectors, then
    the budget; or random or oracle selection), each beside its task's nearest miss."""
    from ...memory.signals import (
        apply_budget,
        attach_nearest_misses,
        detect_signals,
        select_oracle,
        select_random,
    )
    from .evaluation import validation_by_family

    settings = rt.config.signals
    started = time.perf_counter()
    flagged = detect_signals(trajectories, rt.history, rt.patterns, settings, cycle, budgeted=False)
    validation: dict[str, float] | None = None
    if settings.selection == "random":
        kept = select_random(trajectories, settings, cycle, rt.config.seed)
    elif settings.selection == "oracle":
        validation = await validation_by_family(rt, cycle)
        kept = select_oracle(trajectories, validation, settings, cycle, rt.config.seed)
    else:
        kept = apply_budget(flagged, settings, trajectories)
    # The summarizer reads each flagged episode beside its task's nearest miss; the
    # failure agent's episodes of the previous cycle (hard negatives) count too.
    misses = list(trajectories)
    if cycle > 1:
        misses += rt.files(cycle - 1).failure_rollouts()
    kept = attach_nearest_misses(kept, misses)
    rt.files(cycle).write_flagged(kept)
    figures = flag_map(trajectories, flagged, kept, settings.detector_kinds)
    figures.nearest_misses = sum(item.nearest_miss is not None for item in kept)
    figures.oracle_validation = validation
    figures.time_s = time.perf_counter() - started
    found = ", ".join(f"{k} {n}" for k, n in figures.by_kind.items())
    rt.say(
        f"cycle {cycle} · signals: flagged {len(flagged)} ({found}); kept {len(kept)}, "
        f"{figures.flag_precision or 0.0:.0%} of them on families under 50% rollout success"
    )
    return kept, figures


def synthesis_input(
    rt: CycleRuntime, flagged: Sequence[FlaggedTrajectory]
) -> tuple[list[FlaggedTrajectory], list[Task]]:
    """What a synthesis pass works on: the flagged items and their parent tasks (none when
    ``synthesis.enabled`` is off: the static arm's pool stays the seed tasks)."""
    items = list(flagged) if rt.config.synthesis.enabled else []
    parent_ids = {item.trajectory.task_id for item in items}
    return items, [task for task in rt.pool.tasks if task.id in parent_ids]


def record_synthesis(
    rt: CycleRuntime, cycle: int, result: SynthesisResult, time_s: float, removed: int = 0
) -> SynthesisFigures:
    """A finished pass's accepted tasks and rejections in the cycle's files, and its figures
    (``removed``: tasks of a killed attempt of the pass that it took out of the store)."""
    files = rt.files(cycle)
    files.write_synthesized(result.accepted)
    # Every rejection with its stage and reason, not only the most common ones.
    files.write_rejections(result.rejections)
    reasons = Counter(r.reason for r in result.rejections)
    counts = result.counts
    figures = SynthesisFigures.model_validate(
        {
            **{
                k: v for k, v in counts.items() if not k.startswith(("kind:", REPLY_ERRORS, TOKENS))
            },
            "accepted": len(result.accepted),
            "by_signal": dict(Counter(task.signal or "none" for task in result.accepted)),
            "by_family": dict(Counter(task.family for task in result.accepted)),
            "by_parent_family": synthesized_by_parent_family(result.accepted, rt.pool.tasks),
            "by_calls": {
                str(calls): n
                for calls, n in sorted(
                    Counter(len(task.reference_calls) for task in result.accepted).items()
                )
            },
            "candidate_kinds": {
                key.removeprefix("kind:"): n for key, n in counts.items() if key.startswith("kind:")
            },
            "reply_errors": {
                key.removeprefix(REPLY_ERRORS): n
                for key, n in counts.items()
                if key.startswith(REPLY_ERRORS)
            },
            "tokens": {
                key.removeprefix(TOKENS): n for key, n in counts.items() if key.startswith(TOKENS)
            },
            "top_rejections": dict(reasons.most_common(3)),
            "rejections": len(result.rejections),
            "roles": result.roles,
            "removed_on_resume": removed,
            "time_s": time_s,
        }
    )
    rt.say(
        f"cycle {cycle} · synthesize: {figures.candidates} candidates, "
        + (
            f"{figures.at_frontier} of {figures.judged_ok} judged at the frontier, "
            if figures.at_frontier is not None
            else ""
        )
        + f"{figures.duplicates} duplicates, {figures.accepted} accepted"
        + (
            f", {sum(figures.reply_errors.values())} unreadable endpoint replies"
            if figures.reply_errors
            else ""
        )
        + f" [{figures.time_s:.0f} s]"
    )
    return figures


async def synthesize(
    rt: CycleRuntime, cycle: int, flagged: Sequence[FlaggedTrajectory]
) -> tuple[SynthesisResult, SynthesisFigures]:
    """One synthesis pass on the flagged items (the synthesis graph, without checkpoints),
    recorded in the cycle's files. The loop runs the same graph as checkpointed nodes."""
    from ..synthesis.graph import run_synthesis

    started = time.time()
    items, parents = synthesis_input(rt, flagged)
    result = await run_synthesis(
        items, parents, rt.synthesis_runtime(), cycle, rt.config.synthesis.max_concurrency
    )
    return result, record_synthesis(rt, cycle, result, time.time() - started)


def pool_sample(rt: CycleRuntime, cycle: int, accepted: Sequence[Task]) -> PoolSample:
    """The cycle's ``PoolSample`` once ``accepted`` is in the pool (seeded per cycle: the
    same after a resume)."""
    pool = rt.config.pool
    replay = rt.pool.replay_sample(
        cycle, pool.replay_demonstrations, {t.id for t in accepted}, pool.seed
    )
    return PoolSample(accepted=list(accepted), replay=replay)


def update_pool(
    rt: CycleRuntime, cycle: int, accepted: Sequence[Task]
) -> tuple[PoolSample, PoolFigures]:
    """The accepted tasks, with their provenance, added to the training pool, and what the
    training step demonstrates from it (``PoolSample``)."""
    started = time.perf_counter()
    added = rt.pool.add(list(accepted))
    counts = rt.pool.counts()
    sample = pool_sample(rt, cycle, accepted)
    figures = PoolFigures(
        added=added,
        seed=counts.get("seed", 0),
        synthesized=counts.get("synthesized", 0),
        size=len(rt.pool),
        time_s=time.perf_counter() - started,
    )
    rt.say(f"cycle {cycle} · pool: +{added} tasks, {len(rt.pool)} in all")
    return sample, figures


async def train(
    rt: CycleRuntime,
    cycle: int,
    trajectories: Sequence[Trajectory],
    flagged: Sequence[FlaggedTrajectory],
    pool: PoolSample,
    adapter: str | None,
) -> tuple[TrainResult, TrainFigures]:
    """The cycle's TRL step on top of ``adapter`` (None: the base model), and the policy
    serving its new adapter (graph/cycle/training_step.py). It trains on the cycle's rollouts
    (``rollout``), its kept flagged items (``signals``: SEAL's weights) and the pool's
    sample (``update_pool``: the accepted and replayed tasks' demonstrations)."""
    from .training_step import train_cycle

    started = time.perf_counter()
    result = await train_cycle(rt, cycle, adapter, trajectories, flagged, pool)
    # A hard-negatives step's result carries the failure agent's figures too.
    figures = TrainFigures(**result.model_dump(), stage_time_s=time.perf_counter() - started)
    if result.skipped:
        rt.say(f"cycle {cycle} · train: skipped ({result.skipped})")
    else:
        loss = f"{result.final_loss:.3f}" if result.final_loss is not None else "n/a"
        rt.say(
            f"cycle {cycle} · train ({result.algorithm}): {result.examples} examples, "
            f"{result.steps} steps, loss {loss} [{result.train_time_s:.0f} s]"
        )
    return result, figures


async def evaluate(rt: CycleRuntime, cycle: int) -> tuple[list[Trajectory], EvaluationFigures]:
    """The agent on the evaluation split (``evaluation.split``): its episodes (those the
    endpoint answered) and the success per family."""
    return await evaluate_agent(rt, cycle)
