"""One synthesis pass: flagged trajectories in, validated novel tasks out.

    flagged items --Send--> [summarize -> explore -> abstract -> judge] (one branch each)
                  \\-> frontier (the current policy on the candidates) -> dedup (task store)
                  -> accepted tasks

Roles, the environment factory and the task store are injected through the
graph's runtime context, its ``context_schema`` ``SynthesisRuntime``
(graph/cycle/context.py), never built inside nodes. The cycle graph (graph/cycle/graph.py)
runs this graph from its ``synthesis`` node with the cycle's
``CycleRuntime.synthesis_runtime()``; LangGraph Studio runs it through
``loop/studio.py``, which builds the runtime from Studio's JSON context.

``builder`` is the uncompiled graph and ``graph`` the compiled one without a
checkpointer; a runner compiles ``builder`` with its own saver, and called from
the cycle's node it checkpoints into the cycle's saver.
"""

from __future__ import annotations

import asyncio
import logging
from collections import Counter
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any, cast

from langgraph.graph import END, START, StateGraph
from langgraph.runtime import Runtime
from langgraph.types import Send

from ...agents.roles.llm import ReplyCounts, counting_replies
from ...agents.roles.role_interfaces import AbstractionInput, candidate_to_task, primary_signal
from ...common.errors import PROGRAMMING_ERRORS
from ...envs.base import SupportsVariants
from ...records import CandidateTask, FlaggedTrajectory, Neighbour, Task, Verdict
from .context import SynthesisRuntime
from .state import (
    REPLY_ERRORS,
    TOKENS,
    BranchState,
    JudgedCandidate,
    Rejection,
    SynthesisInput,
    SynthesisOutput,
    SynthesisResult,
    SynthesisState,
    add_counts,
)

if TYPE_CHECKING:  # pragma: no cover
    from chromadb.api.types import Where
    from langchain_core.runnables import RunnableConfig

    from ...memory.store import DedupResult, TaskStore

log = logging.getLogger("coevolve.synthesis")


async def _remove_cycle(rt: SynthesisRuntime, cycle: int) -> int:
    """Take the synthesized tasks of ``cycle`` out of the store (``replace_cycle`` only)."""
    if not rt.replace_cycle:
        return 0
    where = {"$and": [{"source": "synthesized"}, {"cycle": cycle}]}
    return int(await asyncio.to_thread(rt.store.remove, where))


# --------------------------------------------------------------------------- nodes


async def prepare(state: SynthesisState, runtime: Runtime[SynthesisRuntime]) -> SynthesisState:
    """Validate the input (Studio sends JSON), report which role implementations run, and
    look up every parent's nearest stored tasks in one batch (the abstractor's "do not repeat")."""
    rt = runtime.context
    cycle = int(state.get("cycle", 0))
    removed = await _remove_cycle(rt, cycle)
    if rt.on_start is not None:
        rt.on_start(cycle)
    flagged = [FlaggedTrajectory.model_validate(item) for item in state.get("flagged", [])]
    parents = [Task.model_validate(task) for task in state.get("parents", [])]
    known = {task.id for task in parents}
    rejections = [
        Rejection(
            stage="input",
            trajectory_id=item.trajectory.id,
            reason=f"parent task {item.trajectory.task_id} not given",
        )
        for item in flagged
        if item.trajectory.task_id not in known
    ]
    roles = rt.roles.names()
    log.info("synthesis roles: %s", ", ".join(f"{k}={v}" for k, v in roles.items()))
    kept = [item for item in flagged if item.trajectory.task_id in known]
    neighbours: dict[str, list[Neighbour]] = {}
    wanted = sorted({item.trajectory.task_id for item in kept})
    if wanted and rt.neighbours > 0:
        from chromadb.errors import ChromaError

        by_id = {task.id: task for task in parents}
        try:
            found = await asyncio.to_thread(
                rt.store.nearest_many, [by_id[i].instruction for i in wanted], rt.neighbours
            )
            neighbours = {
                task_id: [Neighbour(id=n.id, text=n.text, similarity=n.similarity) for n in near]
                for task_id, near in zip(wanted, found, strict=True)
            }
        except (ChromaError, RuntimeError, OSError, ValueError) as err:  # costs the list only
            # A store hiccup (Chroma, the embedder's RuntimeError, the disk) costs the "do not
            # repeat" list, not the pass.
            log.warning("nearest-task lookup failed: %s", err)
    return {
        "flagged": kept,
        "parents": parents,
        "neighbours": neighbours,
        "cycle": cycle,
        "roles": roles,
        "counts": {"flagged": len(flagged), "removed": removed},
        "rejections": rejections,
    }


def fan_out(state: SynthesisState) -> list[Send] | str:
    parents = {task.id: task for task in state["parents"]}
    neighbours = state.get("neighbours", {})
    sends = [
        Send(
            "branch",
            {
                "item": item,
                "parent": parents[item.trajectory.task_id],
                "branch_cycle": state["cycle"],
                "parent_neighbours": neighbours.get(item.trajectory.task_id, []),
            },
        )
        for item in state["flagged"]
    ]
    return sends or "frontier"


def _reject(
    stage: str, item: FlaggedTrajectory, reason: str, candidate: str | None = None
) -> Rejection:
    return Rejection(
        stage=stage, trajectory_id=item.trajectory.id, candidate=candidate, reason=reason
    )


class SynthesisError(RuntimeError):
    """Every flagged item of a pass failed with an exception: the pass did not run."""


def _with_reply_counts(update: BranchState, replies: ReplyCounts) -> BranchState:
    """A node's update with the reply errors its role met and the tokens its replies took
    added to its counts."""
    counts = {REPLY_ERRORS + kind: n for kind, n in replies.errors.items()}
    if replies.prompt_tokens or replies.completion_tokens:
        counts[TOKENS + "prompt"] = replies.prompt_tokens
        counts[TOKENS + "completion"] = replies.completion_tokens
    if not counts:
        return update
    return {**update, "counts": add_counts(update.get("counts"), counts)}


def _crashed(stage: str, item: FlaggedTrajectory, err: Exception) -> BranchState:
    """A role's failure on one item: re-raised if it is a bug (a programming error in our
    code or a role's ends the pass), else a rejection and a count."""
    if isinstance(err, PROGRAMMING_ERRORS):
        raise err
    return {
        "rejections": [_reject(stage, item, f"{type(err).__name__}: {err}")],
        "counts": {"crashed": 1},
    }


async def summarize(state: BranchState, runtime: Runtime[SynthesisRuntime]) -> BranchState:
    rt, item = runtime.context, state["item"]
    with counting_replies() as replies:
        try:
            context = await rt.roles.summarizer.summarize(item, state["parent"])
        except Exception as err:  # boundary: one unreachable endpoint or bad reply, not the pass
            return _with_reply_counts(
                {"context": None, **_crashed("summarize", item, err)}, replies
            )
    return _with_reply_counts({"context": context}, replies)


async def explore(state: BranchState, runtime: Runtime[SynthesisRuntime]) -> BranchState:
    rt, item, context = runtime.context, state["item"], state.get("context")
    if context is None:
        return {"rounds": []}
    if not rt.roles.abstractor.reads_exploration:
        # Its material is the flagged episode itself: the item passes this stage unexplored
        # (a policy round is a generation per item on a CPU, for nothing).
        return {"rounds": [], "counts": {"explored": 1}}
    with counting_replies() as replies:
        try:
            rounds = await rt.roles.explorer.explore(item, state["parent"], context, rt.make_env)
        except Exception as err:  # boundary: the explorer's endpoint and environment
            return _with_reply_counts({"rounds": [], **_crashed("explore", item, err)}, replies)
    explored = any(r.interactions for r in rounds)
    rejections = [] if explored else [_reject("explore", item, "exploration made no interactions")]
    update: BranchState = {
        "rounds": rounds,
        "counts": {"explored": int(explored)},
        "rejections": rejections,
    }
    return _with_reply_counts(update, replies)


async def abstract(state: BranchState, runtime: Runtime[SynthesisRuntime]) -> BranchState:
    rt, item, context = runtime.context, state["item"], state.get("context")
    rounds = state.get("rounds", [])
    if context is None or (not rounds and rt.roles.abstractor.reads_exploration):
        return {"proposals": []}
    neighbours = state.get("parent_neighbours", [])
    given = AbstractionInput(item, state["parent"], context, rounds, neighbours, rt.make_env)
    with counting_replies() as replies:
        try:
            abstraction = await rt.roles.abstractor.abstract(given)
        except Exception as err:  # boundary: the abstractor's endpoint
            return _with_reply_counts({"proposals": [], **_crashed("abstract", item, err)}, replies)
    proposals = abstraction.candidates
    rejections = [
        _reject("abstract", item, d.reason, d.description) for d in abstraction.rejections
    ]
    if not proposals and not rejections:
        rejections = [_reject("abstract", item, "no candidate task found in the exploration")]
    signal = primary_signal(item) or "none"
    kinds = Counter(f"kind:{signal}:{proposal.kind}" for proposal in proposals)
    counts = {"candidates": len(proposals), **kinds}
    return _with_reply_counts(
        {"proposals": proposals, "counts": counts, "rejections": rejections}, replies
    )


async def judge(state: BranchState, runtime: Runtime[SynthesisRuntime]) -> BranchState:
    rt, item = runtime.context, state["item"]
    judged, rejections = [], []
    signal = primary_signal(item)
    with counting_replies() as replies:
        verdicts = [await _verdict(rt, candidate) for candidate in state.get("proposals", [])]
    for candidate, verdict in zip(state.get("proposals", []), verdicts, strict=True):
        if verdict.is_accepted(rt.judge_veto):
            judged.append(
                JudgedCandidate(
                    candidate=candidate,
                    verdict=verdict,
                    parent_id=state["parent"].id,
                    signal=signal,
                    trajectory_id=item.trajectory.id,
                )
            )
        else:
            rejections.append(_reject("judge", item, verdict.reason, candidate.query))
    update: BranchState = {
        "judged": judged,
        "counts": {"judged_ok": len(judged)},
        "rejections": rejections,
    }
    return _with_reply_counts(update, replies)


async def _verdict(rt: SynthesisRuntime, candidate: CandidateTask) -> Verdict:
    try:
        return await rt.roles.judge.judge(candidate, rt.make_env)
    except PROGRAMMING_ERRORS:
        raise
    except Exception as err:  # boundary: the judge's endpoint fails one candidate, not all
        return Verdict(success=False, reason=f"judge failed: {type(err).__name__}: {err}")


def _as_tasks(
    rt: SynthesisRuntime, state: SynthesisState, judged: Sequence[JudgedCandidate]
) -> list[Task]:
    """The accepted candidates as the tasks the pool would hold (provenance filled in)."""
    parents = {task.id: task for task in state.get("parents", [])}
    env = rt.make_env()
    structure_key = env.structure_key if isinstance(env, SupportsVariants) else None
    tasks = []
    for one in judged:
        candidate = one.candidate
        if candidate.signal is None and one.signal is not None:
            candidate = candidate.model_copy(update={"signal": one.signal})
        parent = parents[one.parent_id]
        tasks.append(candidate_to_task(candidate, parent, state.get("cycle", 0), structure_key))
    return tasks


async def frontier(state: SynthesisState, runtime: Runtime[SynthesisRuntime]) -> SynthesisState:
    """The frontier check (``synthesis.frontier_samples``): the current policy plays every
    accepted candidate, all in one batch; one it already solves in more than
    ``frontier_max_solved`` of its episodes is rejected. Without the check, nothing."""
    rt = runtime.context
    judged = state.get("judged", [])
    if rt.student_success is None:
        return {}
    tasks = _as_tasks(rt, state, judged)
    solved = await rt.student_success(tasks) if tasks else []
    kept, rejections = [], []
    for one, share in zip(judged, solved, strict=True):
        if share <= rt.frontier_max_solved:
            kept.append(one)
            continue
        reason = f"the student already solves it ({share:.0%} of its frontier episodes)"
        rejections.append(
            Rejection(
                stage="frontier",
                trajectory_id=one.trajectory_id,
                candidate=one.candidate.query,
                reason=reason,
            )
        )
    return {
        "judged_at_frontier": kept,
        "counts": {"at_frontier": len(kept)},
        "rejections": rejections,
    }


async def dedup(state: SynthesisState, runtime: Runtime[SynthesisRuntime]) -> SynthesisState:
    """Store the novel accepted candidates; duplicates of the store or the batch are dropped.

    A pass in which every flagged item failed with an exception raises ``SynthesisError``
    here, before anything is stored, so the pass (or the cycle node) fails and a resumed
    run tries it again."""
    counts = state.get("counts", {})
    flagged = counts.get("flagged", 0)
    if flagged and counts.get("crashed", 0) >= flagged:
        first = state["rejections"][0].reason if state.get("rejections") else "unknown"
        raise SynthesisError(
            f"every one of the {flagged} flagged items failed with an exception, so the "
            f"pass made nothing; the first: {first}"
        )
    rt = runtime.context
    removed = await _remove_cycle(rt, state.get("cycle", 0))
    judged = state.get("judged", [])
    if rt.student_success is not None:
        judged = state.get("judged_at_frontier", [])
    tasks = _as_tasks(rt, state, judged)
    came_from: dict[str, str | None] = {}  # task id -> the flagged trajectory behind it
    for task, one in zip(tasks, judged, strict=True):
        came_from.setdefault(task.id, one.trajectory_id)
    if not tasks:
        return {"accepted": [], "counts": {"duplicates": 0, "accepted": 0, "removed": removed}}
    result = await asyncio.to_thread(_add_novel, rt.store, tasks, rt.max_accepted, rt.dedup_where)
    rejections = [
        Rejection(
            stage="dedup",
            trajectory_id=came_from.get(d.task.id),
            candidate=d.task.instruction,
            reason=f"duplicate of {d.matched_id} ({d.against}, similarity {d.similarity:.2f})",
        )
        for d in result.duplicates
    ]
    return {
        "accepted": result.accepted,
        "counts": {
            "duplicates": len(result.duplicates),
            "accepted": len(result.accepted),
            "removed": removed,
        },
        "rejections": rejections,
    }


def _add_novel(
    store: TaskStore, tasks: list[Task], cap: int | None, where: Where | None = None
) -> DedupResult:
    """``store.add_if_novel``, stopping once ``cap`` tasks are stored (in the judged order)."""
    if cap is None:
        return store.add_if_novel(tasks, where)
    from ...memory.store import DedupResult

    result = DedupResult()
    start = 0
    while start < len(tasks) and len(result.accepted) < cap:
        chunk = tasks[start : start + cap - len(result.accepted)]
        start += len(chunk)
        found = store.add_if_novel(chunk, where)
        result.accepted.extend(found.accepted)
        result.duplicates.extend(found.duplicates)
    return result


# --------------------------------------------------------------------------- graphs

branch_builder = StateGraph(BranchState, context_schema=SynthesisRuntime)
branch_builder.add_sequence([summarize, explore, abstract, judge])
branch_builder.add_edge(START, "summarize")
branch_builder.add_edge("judge", END)
branch = branch_builder.compile()

builder = StateGraph(
    SynthesisState,
    context_schema=SynthesisRuntime,
    input_schema=SynthesisInput,
    output_schema=SynthesisOutput,
)
builder.add_node("prepare", prepare)
builder.add_node("branch", branch)
builder.add_node("frontier", frontier)
builder.add_node("dedup", dedup)
builder.add_edge(START, "prepare")
builder.add_conditional_edges("prepare", fan_out, ["branch", "frontier"])
builder.add_edge("branch", "frontier")
builder.add_edge("frontier", "dedup")
builder.add_edge("dedup", END)
graph = builder.compile()


# --------------------------------------------------------------------------- running


async def run_synthesis(
    flagged: Sequence[FlaggedTrajectory],
    parents: Sequence[Task],
    runtime: SynthesisRuntime,
    cycle: int = 0,
    max_concurrency: int | None = None,
) -> SynthesisResult:
    """Run one synthesis pass with an injected runtime on ``graph`` (no checkpoints).

    Raises ``SynthesisError`` when every flagged item failed with an exception."""
    config: RunnableConfig = {"max_concurrency": max_concurrency} if max_concurrency else {}
    # LangGraph types a compiled graph's input and output loosely: Any here, and a cast.
    graph_input: Any = {"flagged": list(flagged), "parents": list(parents), "cycle": cycle}
    out = cast(SynthesisOutput, await graph.ainvoke(graph_input, config=config, context=runtime))
    return SynthesisResult.from_output(out)
