"""The synthesis graph end to end: offline on the built-in world, and on the LLM path
against the local OpenAI-compatible test server (real HTTP)."""

from __future__ import annotations

import asyncio
import json
from typing import Any

import pytest
from langgraph.checkpoint.memory import InMemorySaver

from coevolve.agents.policy.rollout import run_rollouts
from coevolve.agents.roles.role_factory import build_roles
from coevolve.agents.roles.role_interfaces import RolesConfig
from coevolve.agents.roles.summarizer import OfflineSummarizer
from coevolve.config import EndpointConfig
from coevolve.envs.base import replay_reference
from coevolve.envs.world import WorldEnvironment, load_split
from coevolve.graph.synthesis import graph as synthesis
from coevolve.graph.synthesis.context import SynthesisRuntime
from coevolve.graph.synthesis.graph import run_synthesis
from coevolve.memory.history import OutcomeHistory
from coevolve.memory.patterns import PatternCounts
from coevolve.memory.signals import SignalConfig, detect_signals
from coevolve.memory.store import TaskStore
from coevolve.testing.openai_server import Reply
from coevolve.testing.reference_agent import HalfRightPolicy
from coevolve.testing.role_replies import role_of, role_reply

TASKS = load_split("validation", size=18)


@pytest.fixture(scope="module")
def flagged():
    trajectories = run_rollouts(HalfRightPolicy(), WorldEnvironment, TASKS, k=4, progress=False)
    config = SignalConfig(kinds=["boundary"], budget=6, per_task_limit=1)
    items = detect_signals(trajectories, OutcomeHistory(), PatternCounts(), config, cycle=0)
    assert items, "the scripted rollouts should disagree on some tasks"
    return items


@pytest.fixture(scope="module")
def store():
    return TaskStore(None)


def test_graph_exposes_builder_and_compiled_graph():
    from langgraph.checkpoint.memory import InMemorySaver

    drawn = synthesis.graph.get_graph()
    assert set(drawn.nodes) == {"__start__", "prepare", "branch", "frontier", "dedup", "__end__"}
    # prepare fans out one branch per flagged item (Send), or goes straight to the frontier
    # check (which passes everything on when it is off).
    assert {(e.source, e.target) for e in drawn.edges} == {
        ("__start__", "prepare"),
        ("prepare", "branch"),
        ("prepare", "frontier"),
        ("branch", "frontier"),
        ("frontier", "dedup"),
        ("dedup", "__end__"),
    }
    own = synthesis.builder.compile(checkpointer=InMemorySaver())  # tests bring their own
    assert set(own.get_graph().nodes) == set(drawn.nodes)


def test_offline_pass_on_the_world(flagged, store):
    runtime = SynthesisRuntime(
        roles=build_roles(RolesConfig(), {}, synthesizer="generator"),
        make_env=WorldEnvironment,
        store=store,
    )
    result = asyncio.run(run_synthesis(flagged, TASKS, runtime, cycle=3))
    counts = result.counts
    assert counts["flagged"] == len(flagged) == counts["explored"]
    assert counts["candidates"] >= counts["judged_ok"] >= counts["accepted"] > 0
    assert counts["judged_ok"] == counts["accepted"] + counts["duplicates"]
    # what the abstractor made, by signal and kind, reaches the result (the cycle's figures)
    kinds = {key: n for key, n in counts.items() if key.startswith("kind:boundary:")}
    assert kinds and sum(kinds.values()) == counts["candidates"]
    assert set(result.roles.values()) == {
        "generator",
        "summarizer:offline",
        "explorer:offline",
        "abstractor:offline",
        "judge:offline",
    }
    parents = {t.id for t in TASKS}
    for task in result.accepted:
        assert task.source == "synthesized" and task.cycle == 3 and task.signal == "boundary"
        assert task.parent_task_id in parents
        assert replay_reference(WorldEnvironment(), task)[0] == 1.0
        assert task.id in store
    assert all(r.reason for r in result.rejections)

    # The same pass again: everything is already in the store.
    again = asyncio.run(run_synthesis(flagged, TASKS, runtime, cycle=3))
    assert again.counts["accepted"] == 0 and again.counts["duplicates"] == again.counts["judged_ok"]


def test_missing_parent_is_a_rejection_not_a_crash(flagged, store):
    runtime = SynthesisRuntime(
        roles=build_roles(RolesConfig(), {}, synthesizer="generator"),
        make_env=WorldEnvironment,
        store=store,
    )
    result = asyncio.run(run_synthesis(flagged[:1], [], runtime))
    assert result.counts["flagged"] == 1 and result.counts["accepted"] == 0
    assert result.rejections[0].stage == "input"


def test_builder_compiles_with_a_checkpointer(flagged):
    runtime = SynthesisRuntime(
        roles=build_roles(RolesConfig(), {}, synthesizer="generator"),
        make_env=WorldEnvironment,
        store=TaskStore(None),
    )
    graph = synthesis.builder.compile(checkpointer=InMemorySaver())
    config = {"configurable": {"thread_id": "t1"}}
    out = asyncio.run(
        graph.ainvoke(
            {"flagged": flagged[:2], "parents": TASKS, "cycle": 0}, config, context=runtime
        )
    )
    assert out["counts"]["flagged"] == 2
    assert graph.get_state(config).values["accepted"] == out["accepted"]


@pytest.mark.parametrize("replace_cycle", [True, False])
def test_dedup_run_again_replaces_what_its_cycle_stored(flagged, replace_cycle):
    """A checkpointed pass (the cycle graph's subgraph) killed after dedup's store writes
    runs dedup again on resume: with replace_cycle the same tasks end up stored once and
    accepted; without it they would be dropped as duplicates of themselves."""
    store = TaskStore(None)
    runtime = SynthesisRuntime(
        roles=build_roles(RolesConfig(), {}, synthesizer="generator"),
        make_env=WorldEnvironment,
        store=store,
        replace_cycle=replace_cycle,
    )
    # No context schema: the graph takes a runtime object, a host or a JSON spec.
    graph: Any = synthesis.builder.compile(checkpointer=InMemorySaver())
    config: Any = {"configurable": {"thread_id": "killed"}}
    first = asyncio.run(
        graph.ainvoke({"flagged": flagged, "parents": TASKS, "cycle": 2}, config, context=runtime)
    )
    assert first["accepted"] and first["counts"]["removed"] == 0
    stored = store.count()
    before_dedup = next(s for s in graph.get_state_history(config) if s.next == ("dedup",))
    again = asyncio.run(graph.ainvoke(None, before_dedup.config, context=runtime))
    assert store.count() == stored
    if replace_cycle:
        assert [t.id for t in again["accepted"]] == [t.id for t in first["accepted"]]
        assert again["counts"]["removed"] == len(first["accepted"])
    else:
        assert again["accepted"] == [] and again["counts"]["removed"] == 0


def llm_script(body):
    """Every role on one server (testing/role_replies.py), but the abstractor's reply is
    unreadable for one parent so that path is exercised too."""
    messages = body["messages"]
    if role_of(body) == "abstractor" and "world-validation-0000" in json.dumps(messages):
        return Reply.text("I cannot produce tasks today.")
    user = messages[-1]["content"] if isinstance(messages[-1].get("content"), str) else ""
    return role_reply(body) or Reply.status(400, f"unexpected request: {user[:40]}")


def test_llm_pass_against_the_test_server(flagged, scripted_server):
    server = scripted_server(llm_script)
    endpoint = EndpointConfig(
        base_url=server.base_url, model=server.model, timeout_s=10, max_retries=0
    )
    roles = build_roles(
        RolesConfig(default_endpoint="main", llm_concurrency=4),
        {"main": endpoint},
        synthesizer="llm",
    )
    runtime = SynthesisRuntime(roles=roles, make_env=WorldEnvironment, store=TaskStore(None))
    result = asyncio.run(run_synthesis(flagged, TASKS, runtime, max_concurrency=8))
    roles_ran = dict(result.roles)
    assert roles_ran.pop("synthesizer") == "llm"
    assert all(name.endswith(")") and ":llm(" in name for name in roles_ran.values())
    assert result.counts["flagged"] == len(flagged) and result.counts["explored"] == len(flagged)
    assert result.counts["accepted"] >= 1
    assert server.max_in_flight <= 4
    for task in result.accepted:
        assert replay_reference(WorldEnvironment(), task)[0] == 1.0


def test_max_accepted_caps_what_a_pass_stores(flagged):
    capped_store = TaskStore(None)
    runtime = SynthesisRuntime(
        roles=build_roles(RolesConfig(), {}, synthesizer="generator"),
        make_env=WorldEnvironment,
        store=capped_store,
        max_accepted=2,
    )
    result = asyncio.run(run_synthesis(flagged, TASKS, runtime, cycle=1))
    assert len(result.accepted) == 2 == capped_store.count()
    free = asyncio.run(
        run_synthesis(
            flagged,
            TASKS,
            SynthesisRuntime(
                roles=build_roles(RolesConfig(), {}, synthesizer="generator"),
                make_env=WorldEnvironment,
                store=TaskStore(None),
            ),
            cycle=1,
        )
    )
    assert len(free.accepted) > 2
    # the cap keeps the first novel tasks in the judged order
    assert [t.id for t in result.accepted] == [t.id for t in free.accepted[:2]]


class _FailingSummarizer:
    name = "summarizer:failing"

    def __init__(self, error, only=None):
        self.error, self.only = error, only

    async def summarize(self, item, task):
        if self.only is None or item.trajectory.id == self.only:
            raise self.error
        return await OfflineSummarizer().summarize(item, task)


def _runtime_with(summarizer):
    import dataclasses

    roles = dataclasses.replace(
        build_roles(RolesConfig(), {}, synthesizer="generator"), summarizer=summarizer
    )
    return SynthesisRuntime(roles=roles, make_env=WorldEnvironment, store=TaskStore(None))


def test_one_item_failing_costs_that_item_only(flagged):
    runtime = _runtime_with(
        _FailingSummarizer(ConnectionError("down"), only=flagged[0].trajectory.id)
    )
    result = asyncio.run(run_synthesis(flagged, TASKS, runtime, cycle=1))
    assert result.counts["crashed"] == 1 and result.counts["accepted"] > 0
    assert any("ConnectionError: down" in r.reason for r in result.rejections)


def test_a_pass_where_every_item_fails_raises_instead_of_reporting_zero(flagged):
    from coevolve.graph.synthesis.graph import SynthesisError

    runtime = _runtime_with(_FailingSummarizer(ConnectionError("endpoint down")))
    with pytest.raises(SynthesisError, match=r"every one of the .* ConnectionError: endpoint down"):
        asyncio.run(run_synthesis(flagged, TASKS, runtime, cycle=1))


def test_a_bug_in_a_role_is_raised_not_turned_into_a_rejection(flagged):
    runtime = _runtime_with(
        _FailingSummarizer(TypeError("bad call"), only=flagged[0].trajectory.id)
    )
    with pytest.raises(TypeError, match="bad call"):
        asyncio.run(run_synthesis(flagged, TASKS, runtime, cycle=1))


class _BuggyDescriber(WorldEnvironment):
    def describe(self, calls, setup):
        raise TypeError("describe() takes 2 positional arguments but 3 were given")


class _BuggyVerifier(WorldEnvironment):
    def score(self):
        raise TypeError("'NoneType' object is not subscriptable")


@pytest.mark.parametrize(
    "make_env, message",
    [(_BuggyDescriber, "positional arguments"), (_BuggyVerifier, "not subscriptable")],
    ids=["abstractor", "judge"],
)
def test_a_type_error_under_a_role_ends_the_pass_with_that_error(flagged, make_env, message):
    """Not a rejection reason of a pass that "succeeds" with nothing accepted."""
    # Explored windows (steer off): the offline abstractor words each with the describer.
    roles = build_roles(RolesConfig(steer=False), {}, synthesizer="generator")
    runtime = SynthesisRuntime(roles=roles, make_env=make_env, store=TaskStore(None))
    with pytest.raises(TypeError, match=message):
        asyncio.run(run_synthesis(flagged, TASKS, runtime, cycle=1))


class NoGenerator(WorldEnvironment):
    """The world with its task generator, action sampler and describer taken away: what a
    user's environment offers. Calling one is a test failure, not a fallback."""

    def variant(self, *args: Any, **kwargs: Any) -> Any:
        raise AssertionError("variation called the task generator")

    def sample_action(self, *args: Any, **kwargs: Any) -> Any:
        raise AssertionError("variation called the action sampler")

    def describe(self, *args: Any, **kwargs: Any) -> Any:
        raise AssertionError("variation called the describer")


def test_a_variation_pass_makes_whole_tasks_of_the_flagged_structure_without_a_generator():
    """synthesis.synthesizer: variation (the default) through the graph: the parent's calls in
    its order with new values, its request reworded with them, replayed and verified; every
    task that cannot be varied is a rejection with its reason."""
    train = load_split("train", size=60)
    trajectories = run_rollouts(HalfRightPolicy(), NoGenerator, train[:24], k=4, progress=False)
    config = SignalConfig(kinds=["boundary", "unsolved"], budget=8, per_task_limit=1)
    flagged = detect_signals(trajectories, OutcomeHistory(), PatternCounts(), config, cycle=0)
    assert flagged
    roles = build_roles(RolesConfig(max_candidates=2), {}, seed_tasks=train)
    runtime = SynthesisRuntime(roles=roles, make_env=NoGenerator, store=TaskStore(None))
    result = asyncio.run(run_synthesis(flagged, train, runtime, cycle=1))
    assert result.roles["synthesizer"] == "variation" and result.accepted
    parents = {task.id: task for task in train}
    for task in result.accepted:
        parent = parents[task.parent_task_id]
        assert [c.name for c in task.reference_calls] == [c.name for c in parent.reference_calls]
        assert task.instruction != parent.instruction and ", then" not in task.instruction
        assert ("check" in task.setup) == ("check" in parent.setup)  # carried, never dropped
        assert [c.arguments for c in task.reference_calls] != [
            c.arguments for c in parent.reference_calls
        ]
        assert replay_reference(WorldEnvironment(), task)[0] == 1.0
    kinds = {key for key in result.counts if key.startswith("kind:")}
    assert kinds and all(key.endswith(":variation") for key in kinds)
    for rejection in result.rejections:
        assert rejection.reason  # a task it could not vary says why
