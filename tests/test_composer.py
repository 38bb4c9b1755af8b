"""Composed exploration (agents/roles/composer.py): chains of calls from the tool schemas, earlier
results and seed values, on the world and on a user's environment, written by the task
writer clause by clause over real HTTP."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from coevolve.agents.roles.chain_values import observed_values
from coevolve.agents.roles.clause_writer import ClauseWriter, join_clauses
from coevolve.agents.roles.composer import ComposingExplorer
from coevolve.agents.roles.judge import execute_candidate
from coevolve.agents.roles.role_factory import build_roles
from coevolve.agents.roles.role_interfaces import AbstractionInput, RolesConfig, candidate_setup
from coevolve.config import EndpointConfig
from coevolve.envs.world import WorldEnvironment, load_split
from coevolve.envs.world.splits import structure_key
from coevolve.graph.context import SynthesisRuntime
from coevolve.graph.graph import run_synthesis
from coevolve.memory.store import TaskStore
from coevolve.records import (
    CandidateTask,
    FlaggedTrajectory,
    Signal,
    SynthesisContext,
    Task,
    Trajectory,
)
from coevolve.testing.openai_server import Reply
from coevolve.testing.role_replies import writer_reply

ROOT = Path(__file__).resolve().parents[1]
SEEDS = load_split("train")[:100]


def flagged(task: Task) -> FlaggedTrajectory:
    trajectory = Trajectory(
        id=f"failed-{task.id}", task_id=task.id, env=task.env, family=task.family, score=0.0
    )
    signal = Signal(
        kind="unsolved", trajectory_id=trajectory.id, task_id=task.id, family=task.family
    )
    return FlaggedTrajectory(trajectory=trajectory, signals=[signal])


def compose(composer: ComposingExplorer, task: Task, make_env=WorldEnvironment):
    context = SynthesisContext(summary="failed")
    return asyncio.run(composer.explore(flagged(task), task, context, make_env))


def replays(calls, setup, make_env=WorldEnvironment) -> bool:
    candidate = CandidateTask(
        description="composed", query="(any)", minimal_actions=calls, setup=candidate_setup(setup)
    )
    return execute_candidate(candidate, make_env).verdict().success


@pytest.fixture
def no_world_helpers(monkeypatch):
    """The world's action sampler, describer and task generator raise: a user has none."""

    def helper(*args, **kwargs):
        raise AssertionError("the composer called a world-only helper")

    for name in ("sample_action", "describe", "variant"):
        monkeypatch.setattr(WorldEnvironment, name, helper)


def test_a_chain_takes_its_values_from_earlier_results_and_seed_tasks_only(no_world_helpers):
    seed_values = {
        str(v) for task in SEEDS for call in task.reference_calls for v in call.arguments.values()
    }
    composer = ComposingExplorer(SEEDS, rounds=6, steps=6)
    passed_on = 0
    for task in [t for t in SEEDS if len(t.reference_calls) >= 2][:20]:
        survey = WorldEnvironment()
        survey.reset(task)
        shown = survey.step({"name": "list_contacts", "arguments": {}}).text
        for exploration in compose(composer, task):
            earlier: list[str] = []
            for interaction in exploration.interactions:
                for parameter, value in interaction.call.arguments.items():
                    results = [v for text in earlier for _, v in observed_values(text)]
                    if parameter.endswith("_id"):  # an id is read, never guessed
                        assert str(value) in results, (task.id, interaction.call)
                        passed_on += 1
                    else:
                        assert str(value) in seed_values | set(results) or value in shown
                earlier.append(interaction.observation.text)
    assert passed_on >= 10


def test_it_composes_whole_compound_tasks_that_replay(no_world_helpers):
    composer = ComposingExplorer(SEEDS, rounds=4, steps=6)
    for family in ("message_new_contact", "move_and_tell_two"):
        task = next(t for t in SEEDS if t.family == family)
        whole = []
        for exploration in compose(composer, task):
            calls = [i.call for i in exploration.interactions]
            if structure_key([c.name for c in calls]) == family:
                whole.append(exploration)
                assert replays(calls, exploration.setup), calls
        assert whole, family
    # the message goes to the contact the chain itself saved, after the lookup found nobody
    [find, add, send] = whole_new_contact = next(
        e.interactions
        for e in compose(composer, next(t for t in SEEDS if t.family == "message_new_contact"))
        if len(e.interactions) == 3
    )
    assert (
        find.observation.error == "not_found"
        and find.call.arguments["name"] == (add.call.arguments["name"])
    )
    assert ("id", send.call.arguments["contact_id"]) in observed_values(add.observation.text)
    assert whole_new_contact[0].call.arguments["name"] not in str(
        next(t for t in SEEDS if t.family == "message_new_contact").setup
    )


def test_a_pass_is_reproducible_from_its_seed():
    task = next(t for t in SEEDS if t.family == "buy_two")
    first = compose(ComposingExplorer(SEEDS, seed=3), task)
    assert first == compose(ComposingExplorer(SEEDS, seed=3), task)
    assert first != compose(ComposingExplorer(SEEDS, seed=4), task)


def test_it_composes_on_the_support_desk_with_no_sampler_and_its_describer_unused(monkeypatch):
    monkeypatch.chdir(ROOT)  # the example's import path is relative to it
    from coevolve.envs.catalog import load_tasks
    from coevolve.envs.function_tools import FunctionEnvironment
    from coevolve.envs.registry import get_environment

    def describe(*args, **kwargs):
        raise AssertionError("the composer called the environment's describer")

    monkeypatch.setattr(FunctionEnvironment, "describe", describe)
    name = "examples.support_desk.env:make_env"
    make_env = get_environment(name).environment
    env = make_env()
    assert not any(hasattr(env, helper) for helper in ("sample_action", "variant"))
    seeds = load_tasks(name, "train", 0)
    composer = ComposingExplorer(seeds, rounds=4, steps=4)
    accepted = []
    for task in [t for t in seeds if len(t.reference_calls) >= 2]:
        for exploration in compose(composer, task, make_env):
            calls = [i.call for i in exploration.interactions]
            if len(calls) >= 2 and replays(calls, exploration.setup, make_env):
                accepted.append(exploration)
    assert len(accepted) >= 5
    # a customer id found by email is passed on to the next call
    assert any(
        ("customer_id", later.call.arguments.get("customer_id"))
        in observed_values(first.observation.text)
        for e in accepted
        for first, later in zip(e.interactions, e.interactions[1:], strict=False)
        if first.call.name == "find_customer"
    )


# --------------------------------------------------------------------------- the writer


def writer_endpoint(server) -> EndpointConfig:
    return EndpointConfig(base_url=server.base_url, model=server.model, timeout_s=10, max_retries=0)


def new_contact_material():
    task = next(t for t in SEEDS if t.family == "message_new_contact")
    rounds = compose(ComposingExplorer(SEEDS, rounds=2), task)
    assert [i.call.name for i in rounds[0].interactions] == [
        "find_contact",
        "add_contact",
        "send_message",
    ]
    return task, rounds[:1]


def test_the_clause_writer_writes_one_clause_per_call_and_joins_them(scripted_server):
    server = scripted_server(lambda body: writer_reply(body) or Reply.status(400, "writer only"))
    config = RolesConfig(writer="writer", composer=True)
    roles = build_roles(config, {"writer": writer_endpoint(server)}, seed_tasks=SEEDS)
    assert isinstance(roles.explorer, ComposingExplorer)
    assert isinstance(roles.abstractor, ClauseWriter)
    task, rounds = new_contact_material()
    given = AbstractionInput(
        flagged(task), task, SynthesisContext(summary="s"), rounds, [], WorldEnvironment
    )
    abstraction = asyncio.run(roles.abstractor.abstract(given))
    [candidate] = abstraction.candidates
    assert candidate.kind == "composed" and candidate.query.count(", then ") == 2
    add = rounds[0].interactions[1]
    assert add.call.arguments["phone"] in candidate.query
    # the clauses are asked for at once: in whatever order they arrive
    asked = sorted(b["messages"][1]["content"] for b in server.chat_bodies())
    assert len(asked) == 3
    assert sum(text.startswith("1. find_contact(") for text in asked) == 1
    [send] = [text for text in asked if "send_message(" in text]
    # the message's clause sees the result that saved the contact, then its own call
    assert send.startswith("Earlier result: saved id=") and "\n1. send_message(" in send


def test_a_clause_that_misses_a_value_rejects_the_chain_naming_the_clause(scripted_server):
    def script(body):
        material = body["messages"][-1]["content"]
        if "send_message(" in material:
            return Reply.text("Request: Text them.\nAnswer: -")
        return writer_reply(body)

    server = scripted_server(script)
    roles = build_roles(
        RolesConfig(writer="writer", composer=True),
        {"writer": writer_endpoint(server)},
        seed_tasks=SEEDS,
    )
    task, rounds = new_contact_material()
    given = AbstractionInput(
        flagged(task), task, SynthesisContext(summary="s"), rounds, [], WorldEnvironment
    )
    abstraction = asyncio.run(roles.abstractor.abstract(given))
    assert not abstraction.candidates
    [rejection] = abstraction.rejections
    text = rounds[0].interactions[2].call.arguments["text"]
    assert rejection.reason == (
        f"curation: clause 3 (send_message) 'Text them.' does not name {text}"
    )


def test_clauses_join_into_one_request():
    assert join_clauses(["Find Ana.", "Text Ana: hi."], []) == "Find Ana, then text Ana: hi."
    assert join_clauses(["Save Bo as 555-1", "Bo gets a text"], []) == (
        "Save Bo as 555-1, then bo gets a text."
    )
    from coevolve.records import ToolCall

    named = [ToolCall(name="find_contact", arguments={"name": "Bo"})]
    assert join_clauses(["Save it", "Bo gets a text"], named) == "Save it, then Bo gets a text."
    assert join_clauses(["Find Ana", "What is her number?"], []) == (
        "Find Ana, then what is her number?"
    )


def test_a_synthesis_pass_on_the_composer_over_http(scripted_server, no_world_helpers):
    server = scripted_server(lambda body: writer_reply(body) or Reply.status(400, "writer only"))
    roles = build_roles(
        RolesConfig(writer="writer", composer=True),
        {"writer": writer_endpoint(server)},
        seed_tasks=SEEDS,
    )
    parents = [t for t in SEEDS if t.family in ("message_new_contact", "move_and_tell_two")]
    runtime = SynthesisRuntime(
        roles=roles, make_env=WorldEnvironment, store=TaskStore(None, threshold=0.995)
    )
    items = [flagged(task) for task in parents]
    result = asyncio.run(run_synthesis(items, parents, runtime, max_concurrency=2))
    assert result.counts["accepted"] >= 2
    assert {key.rsplit(":", 1)[1] for key in result.counts if key.startswith("kind:")} == {
        "composed"
    }
    families = {task.family for task in result.accepted}
    assert {"message_new_contact", "move_and_tell_two"} <= families


def test_the_composer_needs_the_writer():
    with pytest.raises(ValueError, match=r"composer needs synthesis\.roles\.writer"):
        RolesConfig(composer=True)
    with pytest.raises(ValueError, match="both explorers"):
        RolesConfig(composer=True, writer="w", teacher="t")
