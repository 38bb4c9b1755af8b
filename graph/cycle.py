"""The closed loop as a LangGraph StateGraph: one pass per cycle, looping.

    START -> baseline -> rollout -> signals -> synthesize -> synthesis -> record_synthesis
                            ^                               (subgraph)          |
                            |                                                   v
                            +---- (more cycles) ---- evaluate <- train <- update_pool
                                                        |
                                                        +-> END

- *baseline* evaluates the starting policy on the held-out split (cycle 0);
- *rollout* samples the cycle's tasks from the pool and runs K episodes each;
- *signals* flags failure-prone trajectories (forgetting, boundary, rare);
- *synthesize* hands the kept flagged items and their parent tasks to
  *synthesis*, which runs the synthesis graph (graph/synthesis.py) with the
  cycle's synthesis runtime (Studio draws its prepare, branch and dedup nodes), and
  *record_synthesis* writes its accepted tasks and rejections and the stage's
  figures;
- *update_pool* adds the accepted tasks, with provenance, to the training pool;
- *train* runs the configured TRL step (sft / grpo / dpo) with a LoRA adapter,
  saves ``adapters/cycle-N`` and swaps it into the policy
  (``graph/training_step.py``);
- *evaluate* measures held-out success per family.

The state stays small and JSON-friendly (figures and file paths): the
trajectories, flagged items and tasks of a cycle live in files under
``<run_dir>/cycles/NNN/``, written atomically. Only while the synthesis stage
runs does it hold the pass's input and output (the keys the subgraph reads and
writes), and record_synthesis empties them. The runner (coevolve.runner)
compiles ``builder`` with a SQLite checkpointer, so a killed run resumes after
its last finished node; the synthesis subgraph checkpoints into the same saver,
so a pass killed half-way resumes inside it (its finished branches are kept).
Every node can run again after a kill without doing harm: sampling is seeded
per (seed, cycle, stage), the history and pattern counts record a cycle once,
a synthesis pass takes its cycle's tasks out of the task store before it reads
the store (prepare) and again before it stores (dedup), the pool adds by task
id, and a finished adapter is reused.

The heavy objects a node needs (policy, environment factory, pool, store,
roles) are injected as the graph's runtime context: its ``context_schema`` is
``CycleRuntime`` (``graph/runtime.py``), built by ``graph/runtime_factory.py``.
The synthesis pass gets its own ``SynthesisRuntime`` from it
(``CycleRuntime.synthesis_runtime``). LangGraph Studio sends JSON;
``graph/studio.py`` turns it into a runtime.
"""

from __future__ import annotations

import operator
import time
from collections import Counter
from collections.abc import Sequence
from typing import Annotated, Any, Literal, TypedDict

from langgraph.graph import END, START, StateGraph
from langgraph.runtime import Runtime

from ..memory.signals import FlaggedTrajectory
from ..outputs.summary import (
    CycleSummary,
    FamilyFlags,
    PoolFigures,
    RolloutFigures,
    SignalFigures,
    SynthesisFigures,
    TrainFigures,
)
from ..outputs.tracking import log_cycle
from ..records import SignalKind, Task, Trajectory, is_success
from .evaluation import evaluate_agent, shared_baseline, validation_by_family
from .runtime import CycleRuntime, seed_everything
from .synthesis import graph as synthesis_graph
from .synthesis_state import REPLY_ERRORS, Rejection, SynthesisResult


class CycleState(TypedDict, total=False):
    cycle: int  # the cycle in progress (1-based); 0 during the baseline
    cycles: int  # how many cycles the run makes
    adapter: str | None  # the adapter the policy serves now (None: the base model)
    # The figures of the cycle in progress: "cycle", then each stage's figures model
    # (coevolve.outputs.summary) dumped under the stage's name.
    current: dict[str, Any]
    # One CycleSummary per finished cycle, dumped (read them with CycleSummary.model_validate).
    finished: Annotated[list[dict[str, Any]], operator.add]
    # The synthesis subgraph reads and writes these keys (those of its input and output
    # schemas); they hold a pass's items only while the stage runs (record_synthesis
    # empties them).
    flagged: list[dict[str, Any]]  # the cycle's kept flagged items, as JSON
    parents: list[dict[str, Any]]  # their parent tasks, as JSON
    accepted: list[Task]
    counts: dict[str, int]
    rejections: list[Rejection]
    roles: dict[str, str]
    synthesis_started: float  # wall-clock time the stage started


SYNTHESIS_CLEARED: dict[str, Any] = {
    "flagged": [],
    "parents": [],
    "accepted": [],
    "counts": {},
    "rejections": [],
    "roles": {},
}


def _success_rate(trajectories: list[Trajectory]) -> float:
    if not trajectories:
        return 0.0
    return sum(is_success(t.score) for t in trajectories) / len(trajectories)


# --------------------------------------------------------------------------- nodes


async def baseline(state: CycleState, runtime: Runtime[CycleRuntime]) -> dict[str, Any]:
    rt = runtime.context
    started = time.perf_counter()
    evaluation = await shared_baseline(rt)
    summary = CycleSummary(cycle=0, evaluate=evaluation, time_s=time.perf_counter() - started)
    log_cycle(rt.config, rt.run_dir, summary)
    return {"cycle": 0, "adapter": state.get("adapter"), "finished": [summary.model_dump()]}


async def rollout(state: CycleState, runtime: Runtime[CycleRuntime]) -> dict[str, Any]:
    from ..agents.rollout import rollout as run

    rt = runtime.context
    config = rt.config
    cycle = state.get("cycle", 0) + 1
    tasks = rt.pool.sample(cycle, rt.history, config.pool)
    seed_everything(config.seed, cycle, "rollout")
    started = time.perf_counter()
    trajectories = await run(
        rt.policy,
        rt.make_env,
        tasks,
        k=config.rollout.k,
        temperature=config.rollout.temperature,
        max_tool_calls=config.rollout.max_tool_calls,
        system_prompt=config.policy.system_prompt,
        progress=rt.progress,
        cycle=cycle,
        description=f"cycle {cycle} · rollout",
    )
    elapsed = time.perf_counter() - started
    # SEAL's diagnosis: a label per turn (BFCL) or step (world) and the graded progress,
    # stored on each trajectory and counted per cycle.
    from ..envs.diagnosis import count_labels
    from ..envs.registry import annotate

    trajectories = annotate(trajectories, {task.id: task for task in tasks})
    rt.files(cycle).write_rollouts(trajectories)
    sources = Counter(task.source for task in tasks)
    figures = RolloutFigures(
        tasks=len(tasks),
        seed_tasks=sources.get("seed", 0),
        synthesized_tasks=sources.get("synthesized", 0),
        episodes=len(trajectories),
        success=_success_rate(trajectories),
        diagnosis=count_labels(trajectories),
        tokens=sum(t.completion_tokens for t in trajectories),
        time_s=elapsed,
    )
    rt.say(
        f"cycle {cycle} · rollout: {len(tasks)} tasks ({figures.synthesized_tasks} synthesized)"
        f" × {config.rollout.k} = {len(trajectories)} episodes, success {figures.success:.1%}"
        f" [{elapsed:.0f} s]"
    )
    return {"cycle": cycle, "current": {"cycle": cycle, "rollout": figures.model_dump()}}


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
    from ..memory.signals import failure_rates

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


async def signals(state: CycleState, runtime: Runtime[CycleRuntime]) -> dict[str, Any]:
    from ..memory.signals import (
        apply_budget,
        attach_nearest_misses,
        detect_signals,
        select_oracle,
        select_random,
    )

    rt = runtime.context
    cycle = state["cycle"]
    started = time.perf_counter()
    trajectories = rt.files(cycle).rollouts()
    flagged = detect_signals(
        trajectories, rt.history, rt.patterns, rt.config.signals, cycle, budgeted=False
    )
    validation: dict[str, float] | None = None
    if rt.config.signals.selection == "random":
        kept = select_random(trajectories, rt.config.signals, cycle, rt.config.seed)
    elif rt.config.signals.selection == "oracle":
        validation = await validation_by_family(rt, cycle)
        kept = select_oracle(trajectories, validation, rt.config.signals, cycle, rt.config.seed)
    else:
        kept = apply_budget(flagged, rt.config.signals, trajectories)
    # The summarizer reads each flagged episode beside its task's nearest miss; the
    # failure agent's episodes of the previous cycle (hard negatives) count too.
    misses = list(trajectories)
    if cycle > 1:
        misses += rt.files(cycle - 1).failure_rollouts()
    kept = attach_nearest_misses(kept, misses)
    rt.files(cycle).write_flagged(kept)
    figures = flag_map(trajectories, flagged, kept, rt.config.signals.detector_kinds)
    figures.nearest_misses = sum(item.nearest_miss is not None for item in kept)
    figures.oracle_validation = validation
    figures.time_s = time.perf_counter() - started
    found = ", ".join(f"{k} {n}" for k, n in figures.by_kind.items())
    rt.say(
        f"cycle {cycle} · signals: flagged {len(flagged)} ({found}); kept {len(kept)}, "
        f"{figures.flag_precision or 0.0:.0%} of them on families under 50% rollout success"
    )
    return {"current": {**state.get("current", {}), "signals": figures.model_dump()}}


async def synthesize(state: CycleState, runtime: Runtime[CycleRuntime]) -> dict[str, Any]:
    """The synthesis subgraph's input: the cycle's kept flagged items and their parent tasks."""

    rt = runtime.context
    cycle = state["cycle"]
    flagged = rt.files(cycle).flagged()
    if not rt.config.synthesis.enabled:
        flagged = []  # the static arm: the pool stays the seed tasks
    parent_ids = {item.trajectory.task_id for item in flagged}
    parents = [task for task in rt.pool.tasks if task.id in parent_ids]
    # JSON in the cycle's state, as everywhere else in it (the subgraph validates it).
    return {
        "flagged": [item.model_dump(mode="json") for item in flagged],
        "parents": [task.model_dump(mode="json") for task in parents],
        "synthesis_started": time.time(),
    }


async def synthesis(state: CycleState, runtime: Runtime[CycleRuntime]) -> dict[str, Any]:
    """The synthesis graph on the pass's input, with the cycle's synthesis runtime.

    Called from this node, it checkpoints into the cycle's saver under this node's
    namespace, so a pass killed half-way resumes inside it; Studio draws its nodes."""
    graph_input: Any = {
        "flagged": state.get("flagged", []),
        "parents": state.get("parents", []),
        "cycle": state["cycle"],
    }
    output: dict[str, Any] = await synthesis_graph.ainvoke(
        graph_input, context=runtime.context.synthesis_runtime()
    )
    return output


async def record_synthesis(state: CycleState, runtime: Runtime[CycleRuntime]) -> dict[str, Any]:
    """The synthesis subgraph's output: the cycle's files and the synthesize figures."""

    rt = runtime.context
    cycle = state["cycle"]
    result = SynthesisResult.from_output(state)
    rt.files(cycle).write_synthesized(result.accepted)
    # Every rejection with its stage and reason, not only the most common ones.
    rt.files(cycle).write_rejections(result.rejections)
    reasons = Counter(r.reason for r in result.rejections)
    stage_counts = {
        k: v for k, v in result.counts.items() if not k.startswith(("kind:", REPLY_ERRORS))
    }
    figures = SynthesisFigures.model_validate(
        {
            **stage_counts,
            "accepted": len(result.accepted),
            "by_signal": dict(Counter(task.signal or "none" for task in result.accepted)),
            "by_family": dict(Counter(task.family for task in result.accepted)),
            "candidate_kinds": {
                key.removeprefix("kind:"): value
                for key, value in result.counts.items()
                if key.startswith("kind:")
            },
            "reply_errors": {
                key.removeprefix(REPLY_ERRORS): value
                for key, value in result.counts.items()
                if key.startswith(REPLY_ERRORS)
            },
            "top_rejections": dict(reasons.most_common(3)),
            "rejections": len(result.rejections),
            "roles": result.roles,
            # Tasks of a killed attempt of this pass that the pass took out of the store.
            "removed_on_resume": (state.get("counts") or {}).get("removed", 0),
            "time_s": time.time() - state.get("synthesis_started", time.time()),
        }
    )
    rt.say(
        f"cycle {cycle} · synthesize: {figures.candidates} candidates, "
        f"{figures.duplicates} duplicates, {figures.accepted} accepted"
        + (
            f", {sum(figures.reply_errors.values())} unreadable endpoint replies"
            if figures.reply_errors
            else ""
        )
        + f" [{figures.time_s:.0f} s]"
    )
    return {
        "current": {**state.get("current", {}), "synthesize": figures.model_dump()},
        **SYNTHESIS_CLEARED,
    }


async def update_pool(state: CycleState, runtime: Runtime[CycleRuntime]) -> dict[str, Any]:

    rt = runtime.context
    cycle = state["cycle"]
    started = time.perf_counter()
    accepted = rt.files(cycle).synthesized()
    added = rt.pool.add(accepted)
    counts = rt.pool.counts()
    figures = PoolFigures(
        added=added,
        seed=counts.get("seed", 0),
        synthesized=counts.get("synthesized", 0),
        size=len(rt.pool),
        time_s=time.perf_counter() - started,
    )
    rt.say(f"cycle {cycle} · pool: +{added} tasks, {len(rt.pool)} in all")
    return {"current": {**state.get("current", {}), "pool": figures.model_dump()}}


async def train(state: CycleState, runtime: Runtime[CycleRuntime]) -> dict[str, Any]:
    rt = runtime.context
    cycle = state["cycle"]
    started = time.perf_counter()
    from .training_step import train_cycle

    result = await train_cycle(rt, cycle, state.get("adapter"))
    # A hard-negatives step's result carries the failure agent's figures too.
    figures = TrainFigures(**result.model_dump(), stage_time_s=time.perf_counter() - started)
    adapter = result.adapter_dir
    if result.skipped:
        rt.say(f"cycle {cycle} · train: skipped ({result.skipped})")
    else:
        loss = f"{result.final_loss:.3f}" if result.final_loss is not None else "n/a"
        rt.say(
            f"cycle {cycle} · train ({result.algorithm}): {result.examples} examples, "
            f"{result.steps} steps, loss {loss} [{result.train_time_s:.0f} s]"
        )
    return {
        "adapter": adapter,
        "current": {**state.get("current", {}), "train": figures.model_dump()},
    }


async def evaluate(state: CycleState, runtime: Runtime[CycleRuntime]) -> dict[str, Any]:
    rt = runtime.context
    cycle = state["cycle"]
    every = rt.config.evaluation.every
    figures = None
    if cycle % every == 0 or cycle >= rt.config.cycles:
        figures = (await evaluate_agent(rt, cycle)).model_dump()
    else:
        rt.say(f"cycle {cycle} · evaluate: skipped (evaluation.every = {every})")
    summary = CycleSummary.model_validate({**state.get("current", {}), "evaluate": figures})
    log_cycle(rt.config, rt.run_dir, summary)  # the trackers get the cycle's figures
    return {"current": {}, "finished": [summary.model_dump()]}


def next_step(state: CycleState) -> Literal["rollout", "__end__"]:
    return "rollout" if state.get("cycle", 0) < state.get("cycles", 0) else "__end__"


builder = StateGraph(CycleState, context_schema=CycleRuntime)
builder.add_node("baseline", baseline)
builder.add_node("rollout", rollout)
builder.add_node("signals", signals)
builder.add_node("synthesize", synthesize)
builder.add_node("synthesis", synthesis)
builder.add_node("record_synthesis", record_synthesis)
builder.add_node("update_pool", update_pool)
builder.add_node("train", train)
builder.add_node("evaluate", evaluate)
builder.add_edge(START, "baseline")
builder.add_conditional_edges("baseline", next_step, ["rollout", END])
builder.add_edge("rollout", "signals")
builder.add_edge("signals", "synthesize")
builder.add_edge("synthesize", "synthesis")
builder.add_edge("synthesis", "record_synthesis")
builder.add_edge("record_synthesis", "update_pool")
builder.add_edge("update_pool", "train")
builder.add_edge("train", "evaluate")
builder.add_conditional_edges("evaluate", next_step, ["rollout", END])
# Studio compiles nothing itself; runners compile `builder` with their own checkpointer.
graph = builder.compile()
