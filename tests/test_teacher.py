"""The teacher (agents/roles/teacher.py): a larger model shown the flagged family's seed tasks
writes and carries out new tasks over real HTTP; and the frontier check (graph/graph.py)
that keeps only candidates the current policy does not already solve."""

from __future__ import annotations

import asyncio
from collections import defaultdict

import pytest

from coevolve.agents.policy.rollout import run_rollouts
from coevolve.agents.prompts import TEACHER_PROMPT
from coevolve.agents.roles.role_factory import build_roles
from coevolve.agents.roles.role_interfaces import RolesConfig
from coevolve.agents.roles.teacher import TeacherExplorer, worked_example
from coevolve.config import EndpointConfig
from coevolve.envs.base import replay_reference
from coevolve.envs.world import WorldEnvironment, load_split
from coevolve.graph.context import SynthesisRuntime
from coevolve.graph.graph import run_synthesis
from coevolve.memory.history import OutcomeHistory
from coevolve.memory.patterns import PatternCounts
from coevolve.memory.signals import SignalConfig, detect_signals
from coevolve.memory.store import TaskStore
from coevolve.records import SynthesisContext
from coevolve.testing.openai_server import Reply
from coevolve.testing.reference_agent import HalfRightPolicy
from coevolve.testing.role_replies import teacher_reply

TRAIN = load_split("train")
FLAGGED_TASKS = TRAIN[:18]


@pytest.fixture(scope="module")
def flagged():
    trajectories = run_rollouts(
        HalfRightPolicy(), WorldEnvironment, FLAGGED_TASKS, k=4, progress=False
    )
    config = SignalConfig(kinds=["boundary"], budget=6, per_task_limit=1)
    items = detect_signals(trajectories, OutcomeHistory(), PatternCounts(), config, cycle=0)
    assert items, "the scripted rollouts should disagree on some tasks"
    return items


def _teacher_roles(server, **settings) -> RolesConfig:
    endpoint = EndpointConfig(
        base_url=server.base_url, model=server.model, timeout_s=10, max_retries=0
    )
    config = RolesConfig(teacher="teacher", explorer_rounds=1, **settings)
    return build_roles(config, {"teacher": endpoint}, seed_tasks=TRAIN)


def test_the_worked_examples_are_seed_tasks_of_the_family_with_real_results():
    by_family = defaultdict(list)
    for task in TRAIN:
        by_family[task.family].append(task)
    explorer = TeacherExplorer(model=None, examples=by_family, max_examples=2)
    flagged_task = by_family["update_phone"][3]
    chosen = explorer.examples_for(flagged_task)
    assert len(chosen) == 2 and flagged_task not in chosen
    assert {task.family for task in chosen} == {"update_phone"}
    text = worked_example(chosen[0], WorldEnvironment, 1)
    assert text.startswith(f"Example 1\nRequest: {chosen[0].instruction}\nCalls:\n1. ")
    assert "id=c" in text  # a result the environment gave, not a made-up one
    # Every round of a family opens alike, so a server's prompt cache reads it once.
    context = SynthesisContext(summary="s")
    first = explorer.opening(None, flagged_task, context, "goal", 0, WorldEnvironment)
    other = explorer.opening(
        None, by_family["update_phone"][5], context, "goal", 1, WorldEnvironment
    )
    assert [m.content for m in first] == [m.content for m in other]
    assert first[0].content.startswith(TEACHER_PROMPT[:40])
    assert first[1].content.startswith("Tools:\n")
    # A family with no other seed task shows the flagged task itself.
    alone = TeacherExplorer(model=None, examples={}, max_examples=2)
    assert alone.examples_for(flagged_task) == [flagged_task]


def test_a_synthesis_pass_on_the_teacher_over_http(flagged, scripted_server):
    server = scripted_server(lambda body: teacher_reply(body) or Reply.status(400, "unexpected"))
    roles = _teacher_roles(server)
    assert roles.explorer.name.startswith("explorer:teacher(")
    assert roles.abstractor.name == "abstractor:teacher-written"
    runtime = SynthesisRuntime(roles=roles, make_env=WorldEnvironment, store=TaskStore(None))
    result = asyncio.run(run_synthesis(flagged, FLAGGED_TASKS, runtime, max_concurrency=4))
    assert result.counts["accepted"] >= 1
    for task in result.accepted:
        assert task.source == "synthesized"
        assert task.instruction.startswith("What is ") and task.reference_answer
        assert replay_reference(WorldEnvironment(), task)[0] == 1.0
    openings = [r.body["messages"][1]["content"] for r in server.requests]
    assert all(text.startswith("Tools:\nfind_contact(") for text in openings)
    assert all(
        "Worked examples" in text and "tools" not in r.body
        for text, r in zip(openings, server.requests, strict=True)
    )
    # the numbered call's made-up result was cut: the rounds ran the real find_contact
    results = [
        m["content"]
        for r in server.requests
        for m in r.body["messages"][2:]
        if m["role"] == "user" and m["content"].startswith("2. find_contact(")
    ]
    assert results and not any("id=c9" in text for text in results)


def test_a_round_without_a_request_is_asked_once_more_then_rejected(flagged, scripted_server):
    def silent(body):
        if len(body["messages"]) == 2:
            return Reply.text("1. list_contacts()")
        return Reply.text("All done.")

    server = scripted_server(silent)
    runtime = SynthesisRuntime(
        roles=_teacher_roles(server), make_env=WorldEnvironment, store=TaskStore(None)
    )
    result = asyncio.run(run_synthesis(flagged[:1], FLAGGED_TASKS, runtime))
    assert result.counts["accepted"] == 0
    reasons = [r.reason for r in result.rejections if r.stage == "abstract"]
    assert reasons == ["the teacher wrote no REQUEST line for its round"]
    # the list, the stop, and the one follow-up asking for the REQUEST line
    assert len(server.requests) == 3
    assert "REQUEST:" in server.requests[-1].body["messages"][-1]["content"]


def test_the_frontier_check_rejects_what_the_student_already_solves(flagged, scripted_server):
    server = scripted_server(lambda body: teacher_reply(body) or Reply.status(400, "unexpected"))
    asked: list[list[str]] = []

    async def student_success(tasks):
        asked.append([task.instruction for task in tasks])
        # solves the first candidate always, the others never
        return [1.0] + [0.0] * (len(tasks) - 1)

    runtime = SynthesisRuntime(
        roles=_teacher_roles(server),
        make_env=WorldEnvironment,
        store=TaskStore(None),
        student_success=student_success,
        frontier_max_solved=0.5,
    )
    result = asyncio.run(run_synthesis(flagged, FLAGGED_TASKS, runtime, max_concurrency=4))
    [candidates] = asked  # one batch for every candidate of the pass
    assert len(candidates) == result.counts["judged_ok"] >= 2
    assert result.counts["at_frontier"] == len(candidates) - 1
    [rejected] = [r for r in result.rejections if r.stage == "frontier"]
    assert rejected.candidate == candidates[0]
    assert rejected.reason == "the student already solves it (100% of its frontier episodes)"
    assert candidates[0] not in [task.instruction for task in result.accepted]


@pytest.mark.parametrize(
    "reply, call, problem",
    [
        (
            'REQUEST: Text Tom: hi.\nCalls:\n1. find_contact(name="Tom") ',
            ("find_contact", {"name": "Tom"}),
            None,
        ),
        (
            '2. add_contact(name="Tom", phone="555-7890") -> saved id=c6',
            ("add_contact", {"name": "Tom", "phone": "555-7890"}),
            None,
        ),
        ('```json\n{"name": "list_contacts", "arguments": {}}\n```', ("list_contacts", {}), None),
        ("ANSWER: none", None, None),
        ('3. send_message(contact_id=c7, text="hi"', None, "not a tool call"),
    ],
)
def test_the_first_call_of_a_reply_is_read_in_any_form_and_a_made_up_result_is_cut(
    reply, call, problem
):
    from coevolve.agents.roles.teacher import first_call

    found, why = first_call(reply, "call")
    assert (None if found is None else (found.name, found.arguments)) == call
    assert (why is None) if problem is None else why.startswith(problem)


EXAMPLE = "examples.support_desk.env:make_env"


@pytest.mark.slow
@pytest.mark.parametrize("source", ["teacher", "compose"])
def test_both_sources_run_through_the_loop_on_the_support_desk(
    source, tmp_path, cache_dir, tiny_build, scripted_server, monkeypatch
):
    """A user's environment, no task generator: a cycle with the teacher (a scripted one that
    does its first worked example again) or the composer (chains written by a scripted task
    writer), the frontier check on, the tiny model as the agent."""
    from coevolve.config import CoevolveConfig
    from coevolve.runner import run
    from coevolve.testing.presets import tiny_bootstrap
    from coevolve.testing.role_replies import copying_teacher_reply, writer_reply

    monkeypatch.setenv("COEVOLVE_CACHE", str(cache_dir))
    server = scripted_server(
        lambda body: (
            copying_teacher_reply(body) or writer_reply(body) or Reply.status(400, "unexpected")
        )
    )
    roles = (
        {"teacher": "model", "explorer_rounds": 1}
        if source == "teacher"
        else {"composer": True, "writer": "model", "explorer_rounds": 2}
    )
    config = CoevolveConfig.model_validate(
        {
            "run_dir": str(tmp_path / "run"),
            "cycles": 1,
            "env": {"name": EXAMPLE},
            "rollout": {"k": 2, "max_tool_calls": 2},
            "policy": {"max_new_tokens": 16},
            "pool": {"rollout_tasks": 6, "replay_demonstrations": 4},
            "signals": {"budget": 4},
            "synthesis": {"roles": roles, "frontier_samples": 1, "dedup_threshold": 0.995},
            "training": {"max_steps": 2, "batch_size": 2},
            "evaluation": {"per_family": 1},
            "endpoints": {"model": {"base_url": server.base_url, "model": server.model}},
        }
    ).model_copy(update={"bootstrap": tiny_bootstrap()})
    result = run(config, progress=False)
    _, first = result.cycles
    figures = first.synthesize
    assert figures is not None and figures.explored > 0 and figures.candidates > 0
    assert figures.at_frontier is not None  # the frontier check ran
    explorer = figures.roles["explorer"]
    assert explorer.startswith("explorer:teacher(" if source == "teacher" else "explorer:composer")
    assert server.requests, "the source's model was asked"
