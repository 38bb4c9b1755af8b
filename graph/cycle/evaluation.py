"""The evaluate stage: the current agent on the evaluation split (held-out, or validation
when tuning), its cycle-0 evaluation shared between runs that start from the same agent,
and the oracle arm's read of validation."""

from __future__ import annotations

import hashlib
import json
import time

from ...agents.policy.eval_report import left_out_note, split_label
from ...outputs.summary import EvaluationFigures
from ...records import Trajectory, split_transport_failures
from .context import CycleRuntime, seed_everything


async def evaluate_agent(
    rt: CycleRuntime, cycle: int
) -> tuple[list[Trajectory], EvaluationFigures]:
    """The current agent on the evaluation split: the episodes the endpoint answered
    (``cycles/NNN/eval.jsonl``) and the figures."""
    from ...agents.policy.eval_report import evaluation_report as summarize

    config = rt.config
    seed_everything(config.seed, cycle, "evaluate")
    started = time.perf_counter()
    trajectories = await rt.play(
        rt.eval_tasks,
        k=1,
        temperature=config.rollout.eval_temperature,
        cycle=cycle,
        description=f"cycle {cycle} · evaluate",
    )
    elapsed = time.perf_counter() - started
    ran, lost = split_transport_failures(trajectories)
    rt.files(cycle).write_evaluation(ran)
    rt.files(cycle).write_unreachable("evaluate", lost)
    report = summarize(
        trajectories,
        rt.eval_tasks,
        env=config.env.name,
        scope={"split": config.evaluation.split},
        policy=rt.policy.version,
    )
    result = EvaluationFigures(
        success=report.overall.success_rate,
        tool_sequence=report.overall.tool_sequence_accuracy,
        calls=report.overall.call_accuracy,
        episodes=report.overall.episodes,
        left_out=report.overall.left_out,
        by_family={f: s.success_rate for f, s in report.by_family.items()},
        tokens=sum(t.completion_tokens for t in trajectories),
        time_s=elapsed,
    )
    rt.say(
        f"cycle {cycle} · evaluate: {split_label(rt.config.evaluation.split)} success {result.success:.1%} "
        f"({report.overall.successes}/{report.overall.episodes}"
        f"{left_out_note(report.overall.left_out)}), tool sequence "
        f"{result.tool_sequence:.1%} [{elapsed:.0f} s]"
    )
    return ran, result


async def validation_by_family(rt: CycleRuntime, cycle: int) -> dict[str, float]:
    """The current agent's greedy success per family on the validation split (oracle
    selection only: the ablation's reference arm may read validation, a product run never)."""
    from ...agents.policy.eval_report import evaluation_report as summarize
    from ...envs.catalog import first_per_family, load_tasks

    config = rt.config
    tasks = first_per_family(
        load_tasks(config.env.name, split="validation", seed=config.env.seed),
        config.evaluation.per_family or 4,
    )
    seed_everything(config.seed, cycle, "oracle-validation")
    started = time.perf_counter()
    trajectories = await rt.play(
        tasks, k=1, temperature=0.0, cycle=cycle, description=f"cycle {cycle} · oracle: validation"
    )
    report = summarize(
        trajectories,
        tasks,
        env=config.env.name,
        scope={"split": "validation"},
        policy=rt.policy.version,
    )
    by_family = {f: s.success_rate for f, s in report.by_family.items()}
    weak = [f for f, s in by_family.items() if s < config.signals.oracle_threshold]
    rt.say(
        f"cycle {cycle} · oracle: {len(weak)} of {len(by_family)} families under "
        f"{config.signals.oracle_threshold:.0%} on validation [{time.perf_counter() - started:.0f} s]"
    )
    return by_family


def _baseline_key(rt: CycleRuntime) -> str | None:
    """What makes two runs' cycle-0 evaluations the same, hashed; None when it cannot be
    known (an endpoint serves whatever it serves)."""
    config = rt.config
    if config.policy.kind != "local":
        return None
    identity = {
        "policy": rt.policy.version,
        "model": config.policy.model,
        "adapter": config.policy.adapter,
        "max_new_tokens": config.policy.max_new_tokens,
        "system_prompt": config.policy.system_prompt,
        "tasks": [task.id for task in rt.eval_tasks],
        "env": config.env.model_dump(mode="json"),
        "temperature": config.rollout.eval_temperature,
        "max_tool_calls": config.rollout.max_tool_calls,
        "seed": config.seed,
    }
    text = json.dumps(identity, sort_keys=True)
    return hashlib.sha256(text.encode()).hexdigest()[:16]


async def shared_baseline(rt: CycleRuntime) -> EvaluationFigures:
    """The cycle-0 evaluation, from ``rt.baseline_cache`` when a run of the same agent made
    it already (its trajectories copied into this run), else made now and shared."""
    from ...common.files import write_atomically
    from ...run_files import SharedBaselineFiles

    key = _baseline_key(rt) if rt.baseline_cache is not None else None
    if key is None or rt.baseline_cache is None:
        return (await evaluate_agent(rt, 0))[1]
    shared = rt.baseline_cache / key
    # The cache's own files (not a cycle's): its figures and a copy of cycle 0's episodes.
    cache = SharedBaselineFiles(shared)
    figures, trajectories = cache.figures, cache.episodes
    if figures.is_file() and trajectories.is_file():
        evaluation = EvaluationFigures.model_validate_json(figures.read_text())
        write_atomically(rt.files(0).evaluation_episodes, trajectories.read_text())
        rt.say(
            f"cycle 0 · evaluate: {split_label(rt.config.evaluation.split)} success {evaluation.success:.1%}, the same agent's "
            f"evaluation shared by an earlier run ({shared})"
        )
        return evaluation
    _, evaluation = await evaluate_agent(rt, 0)
    shared.mkdir(parents=True, exist_ok=True)
    write_atomically(trajectories, rt.files(0).evaluation_episodes.read_text())
    write_atomically(figures, evaluation.model_dump_json(indent=2))
    return evaluation
