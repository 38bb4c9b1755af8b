"""The task writer (agents/roles/task_writer.py, training/writer_model.py): its format, its curation, the
synthesis pass on it over real HTTP, the loop with no task generator, and its training."""

from __future__ import annotations

import asyncio
import inspect
import json
import subprocess
import sys
from pathlib import Path

import pytest

from coevolve.agents.policy.rollout import run_rollouts
from coevolve.agents.prompts import WRITER_PROMPT
from coevolve.agents.roles.replies import ReplyError
from coevolve.agents.roles.role_factory import build_roles
from coevolve.agents.roles.role_interfaces import AbstractionInput, Interaction, RolesConfig
from coevolve.agents.roles.task_writer import (
    TaskWriter,
    parse_writing,
    render_calls,
    render_writing,
    ungrounded_values,
)
from coevolve.config import EndpointConfig
from coevolve.envs.world import WorldEnvironment, load_split
from coevolve.graph.context import SynthesisRuntime
from coevolve.graph.graph import run_synthesis
from coevolve.memory.history import OutcomeHistory
from coevolve.memory.patterns import PatternCounts
from coevolve.memory.signals import SignalConfig, detect_signals
from coevolve.memory.store import TaskStore
from coevolve.records import SynthesisContext
from coevolve.testing.openai_server import Reply
from coevolve.testing.reference_agent import HalfRightPolicy, reference_replies
from coevolve.testing.role_replies import teacher_reply, writer_reply
from coevolve.training.writer_model import writer_example

TRAIN = load_split("train")
TASKS = [t for t in TRAIN if len(t.turns[0].reference_calls) >= 2][:24]


def replayed(task):
    env = WorldEnvironment()
    env.reset(task)
    return [Interaction(call=c, observation=env.step(c)) for c in task.turns[0].reference_calls]


def test_writing_round_trips_and_bad_replies_say_why():
    assert parse_writing(render_writing("Text Ana: late", None)) == ("Text Ana: late", None)
    assert parse_writing(render_writing("What is Ana's number?", "555-1")) == (
        "What is Ana's number?",
        "555-1",
    )
    assert parse_writing("Sure!\nrequest: Call Bo\nANSWER: none") == ("Call Bo", None)
    with pytest.raises(ValueError, match="no 'Request:' line"):
        parse_writing("Here is a task for you.")


def test_every_training_task_is_grounded_and_a_vague_request_is_not():
    for task in TRAIN[:300]:
        assert ungrounded_values(task.turns[0].query, replayed(task)) == [], task.id
    task = next(t for t in TRAIN if t.family == "move_and_tell_two")
    calls = replayed(task)
    missing = ungrounded_values("Move my event and tell people.", calls)
    move = next(i.call for i in calls if i.call.name == "move_event")
    assert move.arguments["date"] in missing and move.arguments["time"] in missing
    # a message text's words must be named, not only its values
    send = next(i for i in calls if i.call.name == "send_message")
    assert send.call.arguments["text"] in ungrounded_values(
        "Tell Lou I am moving to a new training.", [send]
    )
    # the message repeats the date and time the move's result showed: grounded by it
    assert not any(value.startswith(calls[0].call.arguments["title"]) for value in missing[2:])


def test_a_seed_task_teaches_the_writer_its_own_format():
    task = next(t for t in TRAIN if t.family == "buy_with_topup")
    system, user, assistant = writer_example(task, WorldEnvironment)
    assert system == {"role": "system", "content": WRITER_PROMPT}
    assert user["content"] == render_calls(replayed(task))
    assert "error: insufficient balance" in user["content"]  # the recovery stays in
    assert parse_writing(assistant["content"]) == (task.turns[0].query, task.reference_answer)


@pytest.fixture(scope="module")
def flagged():
    trajectories = run_rollouts(HalfRightPolicy(), WorldEnvironment, TASKS, k=4, progress=False)
    config = SignalConfig(kinds=["boundary"], budget=8, per_task_limit=1)
    items = detect_signals(trajectories, OutcomeHistory(), PatternCounts(), config, cycle=0)
    assert items
    return items


def writer_endpoint(server) -> EndpointConfig:
    return EndpointConfig(base_url=server.base_url, model=server.model, timeout_s=10, max_retries=0)


def test_a_synthesis_pass_on_the_writer_over_http(flagged, scripted_server):
    def script(body):
        return writer_reply(body) or Reply.status(400, "only the writer is asked")

    server = scripted_server(script)
    config = RolesConfig(
        writer="writer", writer_material="both", explorer_policy_rounds=2, explorer_rounds=2
    )
    roles = build_roles(config, {"writer": writer_endpoint(server)}, policy=HalfRightPolicy())
    assert roles.abstractor.name.startswith("abstractor:writer(")
    runtime = SynthesisRuntime(roles=roles, make_env=WorldEnvironment, store=TaskStore(None))
    result = asyncio.run(run_synthesis(flagged, TASKS, runtime, max_concurrency=4))
    assert result.counts["accepted"] >= 1
    for task in result.accepted:
        assert task.source == "synthesized" and task.parent_task_id in {t.id for t in TASKS}
    kinds = {key.rsplit(":", 1)[1] for key in result.counts if key.startswith("kind:")}
    assert kinds and kinds <= {"hindsight", "explored"}
    # every request the writer was asked for is the writer's own prompt over rendered calls
    asked = [r for r in server.chat_bodies() if r["messages"][0]["content"] == WRITER_PROMPT]
    assert asked and all(r["messages"][1]["content"].startswith("1. ") for r in asked)


@pytest.mark.parametrize("material", ["hindsight", "both"])
def test_a_hindsight_writer_runs_no_exploration(flagged, scripted_server, material):
    server = scripted_server(lambda body: writer_reply(body) or Reply.status(400, "writer only"))
    config = RolesConfig(
        writer="writer", writer_material=material, explorer_policy_rounds=2, explorer_rounds=2
    )
    roles = build_roles(config, {"writer": writer_endpoint(server)}, policy=HalfRightPolicy())
    explored = []
    explore = roles.explorer.explore

    async def counting(item, *args):
        explored.append(item.trajectory.id)
        return await explore(item, *args)

    roles.explorer.explore = counting
    runtime = SynthesisRuntime(roles=roles, make_env=WorldEnvironment, store=TaskStore(None))
    result = asyncio.run(run_synthesis(flagged, TASKS, runtime, max_concurrency=4))
    kinds = {key.rsplit(":", 1)[1] for key in result.counts if key.startswith("kind:")}
    if material == "hindsight":
        assert explored == [] and kinds == {"hindsight"}
        # every item passes the explore stage: its material is its own episode
        assert result.counts["explored"] == len(flagged)
    else:
        assert len(explored) == len(flagged)
    assert result.counts["accepted"] >= 1


def test_the_writer_keeps_every_rejection_with_its_reason(flagged, scripted_server):
    replies = iter(["Request: Do the thing.\nAnswer: -", "no idea", "Request: x"])

    server = scripted_server(lambda body: Reply.text(next(replies, "Request: again")))
    writer = TaskWriter(
        build_roles(RolesConfig(writer="w"), {"w": writer_endpoint(server)}).abstractor.model,
        max_candidates=3,
    )
    item = next(i for i in flagged if len(i.trajectory.steps) >= 1)
    task = next(t for t in TASKS if t.id == item.trajectory.task_id)
    context = SynthesisContext(summary="s", do_not_repeat=[task.turns[0].query])
    abstraction = asyncio.run(
        writer.abstract(AbstractionInput(item, task, context, [], [], WorldEnvironment))
    )
    reasons = [r.reason for r in abstraction.rejections]
    assert any(reason.startswith("curation: the request does not name") for reason in reasons)
    assert not abstraction.candidates


def test_a_writer_endpoint_that_is_down_fails_the_branch(flagged):
    endpoint = EndpointConfig(
        base_url="http://127.0.0.1:9/v1", model="writer", timeout_s=2, max_retries=0
    )
    writer = build_roles(RolesConfig(writer="w"), {"w": endpoint}).abstractor
    item = flagged[0]
    task = next(t for t in TASKS if t.id == item.trajectory.task_id)
    given = AbstractionInput(item, task, SynthesisContext(summary="s"), [], [], WorldEnvironment)
    with pytest.raises(ReplyError):
        asyncio.run(writer.abstract(given))


def test_a_writer_on_an_unknown_endpoint_is_a_config_error():
    from coevolve.config import ConfigError, load_config

    with pytest.raises(ConfigError, match=r"synthesis\.roles\.writer .nowhere. is not in"):
        load_config({"synthesis": {"roles": {"writer": "nowhere"}}})


# --------------------------------------------------------------------------- no oracle


def _called_from_evaluation() -> bool:
    return any(frame.function == "evaluation_tasks" for frame in inspect.stack())


# The synthesizers a user has: the task writer relabelling what the policy explored, the
# teacher (a larger model writing and doing tasks) with the frontier check on, and the
# composer (chains from the tool schemas, written by the task writer clause by clause).
NO_ORACLE_ROLES = {
    "writer": {"writer": "writer", "explorer_rounds": 1, "explorer_policy_rounds": 1},
    "teacher": {"teacher": "writer", "explorer_rounds": 1},
    "compose": {"writer": "writer", "composer": True, "explorer_rounds": 2},
}


@pytest.mark.slow
@pytest.mark.parametrize("synthesizer", sorted(NO_ORACLE_ROLES))
def test_the_llm_loop_calls_no_task_generator_and_reads_no_evaluation_task_outside_evaluation(
    tmp_path, tiny_build, scripted_server, monkeypatch, synthesizer
):
    """A whole run with the writer as the abstractor and the policy as the explorer, or with
    the teacher, on an environment whose task generator raises and whose validation and
    held-out splits can be read only by the evaluation's loader."""
    from coevolve.envs.world import env as world_env
    from coevolve.envs.world import splits
    from coevolve.runner import run
    from coevolve.testing.presets import endpoint_run

    touched: list[str] = []

    def generator(*args, **kwargs):
        touched.append("task generator")
        raise AssertionError("the LLM path called the environment's task generator")

    original = splits._generate

    def guarded(family, split, rng_key, task_id):
        if split in ("validation", "heldout") and not _called_from_evaluation():
            touched.append(f"{split} read outside evaluation")
            raise AssertionError(f"the LLM path read a {split} task outside evaluation")
        return original(family, split, rng_key, task_id)

    splits._load_split.cache_clear()
    monkeypatch.setattr(splits, "make_variant", generator)
    monkeypatch.setattr(splits, "_generate", guarded)
    monkeypatch.setattr(world_env.WorldEnvironment, "variant", generator)
    monkeypatch.setattr(world_env.WorldEnvironment, "describe", generator)
    monkeypatch.setattr(world_env.WorldEnvironment, "sample_action", generator)

    train = load_split("train")
    policy = reference_replies(train, wrong=lambda task_id: task_id[-1] in "02468")
    server = scripted_server(lambda body: teacher_reply(body) or writer_reply(body) or policy(body))
    config = endpoint_run(
        tmp_path / "run",
        server.base_url,
        server.model,
        tiny_build,
        cycles=1,
        endpoints={"writer": {"base_url": server.base_url, "model": server.model}},
        signals={"rare_min_observations": 8, "budget": 16},
        synthesis={
            "max_concurrency": 1,
            # the scripted writer's requests all read "Please <calls>": alike, not the same
            "dedup_threshold": 0.995,
            "roles": NO_ORACLE_ROLES[synthesizer],
            "frontier_samples": 1 if synthesizer == "teacher" else 0,
        },
    )
    try:
        result = run(config, progress=False)
    finally:
        splits._load_split.cache_clear()
    assert touched == []
    [_, first] = result.cycles
    assert first.synthesize is not None and first.synthesize.accepted >= 1
    # The endpoint's replies cost tokens, as its usage reported them (the cost a cycle).
    assert first.synthesize.tokens["prompt"] > 0 and first.synthesize.tokens["completion"] > 0
    rows = [json.loads(line) for line in Path(result.run_dir, "synthesized_tasks.jsonl").open()]
    assert rows and all(row["source"] == "synthesized" for row in rows)
    if synthesizer == "teacher":  # the scripted policy cannot do a new task: all at the frontier
        assert first.synthesize.at_frontier == first.synthesize.judged_ok >= 1


# --------------------------------------------------------------------------- training


@pytest.mark.slow
def test_coevolve_writer_teaches_on_the_seed_tasks_only(tmp_path, tiny_build):
    import yaml

    config = tmp_path / "writer.yaml"
    config.write_text(
        yaml.safe_dump(
            {
                "pool": {"seed_tasks": 12},
                "writer": {"base": str(tiny_build), "max_steps": 2, "batch_size": 2},
            }
        )
    )
    run = [sys.executable, "-m", "coevolve", "writer", str(config), "--cache-dir", str(tmp_path)]
    out = subprocess.run([*run, "--json"], capture_output=True, text=True, timeout=600)
    assert out.returncode == 0, out.stderr[-2000:]
    metadata = json.loads(out.stdout.strip().splitlines()[-1])
    assert metadata["steps"] == 2 and metadata["examples"] == 12
    assert metadata["task_ids"] == [t.id for t in TRAIN[:12]]  # the seed tasks, nothing else
    path = Path(metadata["path"])
    assert (path / "model.safetensors").is_file() and (path / "tokenizer.json").is_file()
    again = subprocess.run(run, capture_output=True, text=True, timeout=600)
    assert again.returncode == 0 and f"task writer: {path}" in again.stdout.replace("\n", "")


def test_material_keeps_each_call_that_ran_once():
    from coevolve.agents.roles.task_writer import succeeded
    from coevolve.records import Observation, ToolCall

    find = ToolCall(name="find_contact", arguments={"name": "Pax"})
    other = ToolCall(name="find_contact", arguments={"name": "Ugo"})
    found = Observation(text="id=c1 name=Pax phone=555-2964")
    failed = Observation(text="error: no such contact", error="not_found")
    steps = [(find, found), (find, found), (other, failed), (None, failed), (find, found)]
    assert [i.call for i in succeeded(steps)] == [find]
