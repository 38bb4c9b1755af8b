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
  *synthesis*, which runs the synthesis graph (graph/synthesis/graph.py) with the
  cycle's synthesis runtime (Studio draws its prepare, branch and dedup nodes), and
  *record_synthesis* writes its accepted tasks and rejections and the stage's
  figures;
- *update_pool* adds the accepted tasks, with provenance, to the training pool;
- *train* runs the configured TRL step (sft / grpo / dpo) with a LoRA adapter,
  saves ``adapters/cycle-N`` and swaps it into the policy
  (``graph/cycle/training_step.py``);
- *evaluate* measures held-out success per family.

One name per meaning: the node ``rollout`` is the function ``rollout_node`` here (each
node ``X`` is ``X_node``), which calls the stage ``stages.rollout``, which runs the
engine beneath it (``agents.policy.rollout.play_rollouts``; ``graph.synthesis.graph.run_synthesis``,
``agents.policy.eval_report.evaluation_report``). Each node calls its stage (graph/cycle/stages.py,
the same functions a script can call itself, typed in and typed out) on the earlier
stages' outputs, read back from the cycle's files, and records the stage's figures in
the state.

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
``CycleRuntime`` (``graph/cycle/context.py``), built by ``loop/build_runtime.py``.
The synthesis pass gets its own ``SynthesisRuntime`` from it
(``CycleRuntime.synthesis_runtime``). LangGraph Studio sends JSON;
``loop/studio.py`` turns it into a runtime.
"""

from __future__ import annotations

import time
from typing import Any, Literal, cast

from langgraph.graph import END, START, StateGraph
from langgraph.runtime import Runtime

from ...outputs.summary import CycleSummary
from ...outputs.tracking import log_cycle
from ..synthesis.graph import graph as synthesis_graph
from ..synthesis.state import SynthesisResult
from . import stages
from .context import CycleRuntime
from .evaluation import shared_baseline
from .state import SYNTHESIS_CLEARED, CycleState

# --------------------------------------------------------------------------- nodes
# Each node: read what the stage needs from the cycle's files, call the stage
# (graph/cycle/stages.py), record its figures in the state.


async def baseline_node(state: CycleState, runtime: Runtime[CycleRuntime]) -> CycleState:
    rt = runtime.context
    started = time.perf_counter()
    evaluation = await shared_baseline(rt)
    summary = CycleSummary(cycle=0, evaluate=evaluation, time_s=time.perf_counter() - started)
    log_cycle(rt.config, rt.run_dir, summary)
    return {"cycle": 0, "adapter": state.get("adapter"), "finished": [summary.model_dump()]}


async def rollout_node(state: CycleState, runtime: Runtime[CycleRuntime]) -> CycleState:
    cycle = state.get("cycle", 0) + 1
    _, figures = await stages.rollout(runtime.context, cycle)
    return {"cycle": cycle, "current": {"cycle": cycle, "rollout": figures.model_dump()}}


async def signals_node(state: CycleState, runtime: Runtime[CycleRuntime]) -> CycleState:
    rt, cycle = runtime.context, state["cycle"]
    _, figures = await stages.signals(rt, cycle, rt.files(cycle).rollouts())
    return {"current": {**state.get("current", {}), "signals": figures.model_dump()}}


async def synthesize_node(state: CycleState, runtime: Runtime[CycleRuntime]) -> CycleState:
    """The synthesis pass's input: the cycle's kept flagged items and their parent tasks."""
    rt, cycle = runtime.context, state["cycle"]
    flagged, parents = stages.synthesis_input(rt, rt.files(cycle).flagged())
    # JSON in the cycle's state, as everywhere else in it (the synthesis graph validates it).
    return {
        "flagged": [item.model_dump(mode="json") for item in flagged],
        "parents": [task.model_dump(mode="json") for task in parents],
        "synthesis_started": time.time(),
    }


async def synthesis_node(state: CycleState, runtime: Runtime[CycleRuntime]) -> CycleState:
    """The synthesis graph on the pass's input, with the cycle's synthesis runtime.

    Called from this node, it checkpoints into the cycle's saver under this node's
    namespace, so a pass killed half-way resumes inside it; Studio draws its nodes."""
    # LangGraph types a compiled graph's input and output loosely: Any here, and a cast.
    graph_input: Any = {
        "flagged": state.get("flagged", []),
        "parents": state.get("parents", []),
        "cycle": state["cycle"],
    }
    output = await synthesis_graph.ainvoke(graph_input, context=runtime.context.synthesis_runtime())
    return cast(CycleState, output)  # the pass's output keys (SynthesisOutput) are the cycle's


async def record_synthesis_node(state: CycleState, runtime: Runtime[CycleRuntime]) -> CycleState:
    """The synthesis pass's output: the cycle's files and the synthesize figures."""
    figures = stages.record_synthesis(
        runtime.context,
        state["cycle"],
        SynthesisResult.from_output(state),
        time_s=time.time() - state.get("synthesis_started", time.time()),
        removed=(state.get("counts") or {}).get("removed", 0),
    )
    return {
        "current": {**state.get("current", {}), "synthesize": figures.model_dump()},
        **SYNTHESIS_CLEARED,
    }


async def update_pool_node(state: CycleState, runtime: Runtime[CycleRuntime]) -> CycleState:
    rt, cycle = runtime.context, state["cycle"]
    _, figures = stages.update_pool(rt, cycle, rt.files(cycle).synthesized())
    return {"current": {**state.get("current", {}), "pool": figures.model_dump()}}


async def train_node(state: CycleState, runtime: Runtime[CycleRuntime]) -> CycleState:
    """The train stage on the cycle's rollouts, flagged items and pool sample, read back
    from the cycle's files (the state holds none of them; a resume finds them there)."""
    rt, cycle = runtime.context, state["cycle"]
    files = rt.files(cycle)
    sample = stages.pool_sample(rt, cycle, files.synthesized())
    result, figures = await stages.train(
        rt, cycle, files.rollouts(), files.flagged(), sample, state.get("adapter")
    )
    return {
        "adapter": result.adapter_dir,
        "current": {**state.get("current", {}), "train": figures.model_dump()},
    }


async def evaluate_node(state: CycleState, runtime: Runtime[CycleRuntime]) -> CycleState:
    rt, cycle = runtime.context, state["cycle"]
    every = rt.config.evaluation.every
    figures = None
    if cycle % every == 0 or cycle >= rt.config.cycles:
        figures = (await stages.evaluate(rt, cycle))[1].model_dump()
    else:
        rt.say(f"cycle {cycle} · evaluate: skipped (evaluation.every = {every})")
    summary = CycleSummary.model_validate({**state.get("current", {}), "evaluate": figures})
    log_cycle(rt.config, rt.run_dir, summary)  # the trackers get the cycle's figures
    return {"current": {}, "finished": [summary.model_dump()]}


def next_step(state: CycleState) -> Literal["rollout", "__end__"]:
    return "rollout" if state.get("cycle", 0) < state.get("cycles", 0) else "__end__"


builder = StateGraph(CycleState, context_schema=CycleRuntime)
builder.add_node("baseline", baseline_node)
builder.add_node("rollout", rollout_node)
builder.add_node("signals", signals_node)
builder.add_node("synthesize", synthesize_node)
builder.add_node("synthesis", synthesis_node)
builder.add_node("record_synthesis", record_synthesis_node)
builder.add_node("update_pool", update_pool_node)
builder.add_node("train", train_node)
builder.add_node("evaluate", evaluate_node)
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
