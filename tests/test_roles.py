"""The synthesis roles: offline ones on real world tasks, LLM ones over real HTTP.

LLM paths talk to the scripted OpenAI-compatible server (``scripted_server``),
never to a patched client.
"""

from __future__ import annotations

import asyncio
import json

import pytest
from langchain_core.messages import HumanMessage, SystemMessage
from pydantic import BaseModel

from coevolve.agents import prompts
from coevolve.agents.policy.policy_interface import AssistantMessage
from coevolve.agents.policy.rollout import run_rollouts
from coevolve.agents.prompts import fill_environment
from coevolve.agents.roles.abstractor import OfflineAbstractor
from coevolve.agents.roles.explorer import LLMExplorer, OfflineExplorer
from coevolve.agents.roles.judge import ExecutableJudge, LLMJudge
from coevolve.agents.roles.llm import ReplyError, StructuredOutputError, chat_model, structured_call
from coevolve.agents.roles.llm_abstractor import LLMAbstractor
from coevolve.agents.roles.role_factory import build_roles
from coevolve.agents.roles.role_interfaces import (
    AbstractionInput,
    ExplorationRound,
    Interaction,
    RolesConfig,
    candidate_to_task,
)
from coevolve.agents.roles.summarizer import LLMSummarizer, OfflineSummarizer
from coevolve.agents.roles.task_text import text_similarity
from coevolve.config import EndpointConfig
from coevolve.envs.base import replay_reference
from coevolve.envs.world import WorldEnvironment, make_task
from coevolve.memory.signals import FlaggedTrajectory
from coevolve.records import (
    CandidateTask,
    Neighbour,
    Observation,
    Signal,
    SynthesisContext,
    ToolCall,
    Trajectory,
    Verdict,
)
from coevolve.testing.openai_server import Reply

FAMILIES = ["send_message", "buy_item", "update_phone", "cancel_event", "phone_lookup"]
TASKS = {family: make_task("train", 900 + i, family) for i, family in enumerate(FAMILIES)}

# What the LLM roles send when built with no environment: their prompts, the environment
# slot saying the generic text.
SUMMARIZER_PROMPT, EXPLORER_PROMPT, ABSTRACTOR_PROMPT, JUDGE_PROMPT = (
    fill_environment(prompt, None)
    for prompt in (
        prompts.SUMMARIZER_PROMPT,
        prompts.EXPLORER_PROMPT,
        prompts.ABSTRACTOR_PROMPT,
        prompts.JUDGE_PROMPT,
    )
)


class SlipPolicy:
    """A unit-test policy: plays the reference but garbles the last call (a real failure)."""

    version = "slip"
    needs_tasks = True

    def __init__(self):
        self.temperatures = []

    async def generate(self, conversations, tools, temperature=None, tasks=None):
        self.temperatures.append(temperature)
        replies = []
        for conversation, task in zip(conversations, tasks, strict=True):
            done = sum(m["role"] == "tool" for m in conversation)
            reference = task.reference_calls
            if done >= len(reference) or (
                done == len(reference) - 1 and not reference[-1].arguments
            ):
                replies.append(AssistantMessage(content="Done."))
                continue
            call = reference[done]
            if done == len(reference) - 1:
                key = next(iter(call.arguments))
                call = ToolCall(name=call.name, arguments={**call.arguments, key: "zz9"})
            replies.append(
                AssistantMessage(tool_calls=[call.model_copy(update={"id": f"c{done}"})])
            )
        return replies

    async def aclose(self):
        pass


EVIDENCE = {
    "forgetting": lambda t: {"level": "task", "key": t.id, "window": [1.0, 1.0], "now": 0.0},
    "boundary": lambda t: {"task_id": t.id, "scores": [1.0, 0.0, 0.0]},
    "rare": lambda t: {
        "pattern": "find_contact!not_found",
        "count": 1,
        "total": 80,
        "frequency": 0.0125,
    },
    "unsolved": lambda t: {"task_id": t.id, "scores": [0.0, 0.0, 0.0], "history": []},
}


def flagged(tasks, kinds=("boundary",)):
    """Real failing trajectories of ``tasks`` (rolled out with SlipPolicy), flagged by ``kinds``."""
    trajectories = run_rollouts(SlipPolicy(), WorldEnvironment, tasks, progress=False, cycle=1)
    items = []
    for trajectory, task in zip(trajectories, tasks, strict=True):
        assert trajectory.score == 0.0
        signals = [
            Signal(
                kind=kind,
                trajectory_id=trajectory.id,
                task_id=task.id,
                family=task.family,
                cycle=1,
                evidence=EVIDENCE[kind](task),
            )
            for kind in kinds
        ]
        items.append(FlaggedTrajectory(trajectory=trajectory, signals=signals))
    return items


def run(coro):
    return asyncio.run(coro)


async def offline_pipeline(
    item, task, explorer=None, neighbours=(), make_env=WorldEnvironment, steer=False
):
    summarizer, judge = OfflineSummarizer(), ExecutableJudge()
    abstractor = OfflineAbstractor(steer=steer)
    explorer = explorer or OfflineExplorer()
    context = await summarizer.summarize(item, task)
    rounds = await explorer.explore(item, task, context, make_env)
    abstraction = await abstractor.abstract(
        AbstractionInput(item, task, context, rounds, neighbours, make_env)
    )
    candidates = abstraction.candidates
    verdicts = [await judge.judge(c, make_env) for c in candidates]
    return context, rounds, candidates, verdicts, abstraction.rejections


# --------------------------------------------------------------------------- offline roles


def test_offline_pipeline_yields_accepted_candidates_that_verify():
    tasks = list(TASKS.values())
    accepted, questions = 0, 0
    for item, task in zip(flagged(tasks), tasks, strict=True):
        _, rounds, candidates, verdicts, _ = run(offline_pipeline(item, task))
        assert len(rounds) == 3 and 1 <= len(candidates) <= 3
        for candidate, verdict in zip(candidates, verdicts, strict=True):
            assert candidate.parent_task_id == task.id and candidate.signal == "boundary"
            assert "check" not in candidate.setup and "state" in candidate.setup
            if not verdict.accepted:
                assert verdict.reason
                continue
            accepted += 1
            assert verdict.success and verdict.execution_reward == 1.0
            assert verdict.api_match and verdict.parameter_usage and verdict.logical_flow
            new = candidate_to_task(candidate, task, cycle=2)
            score, steps = replay_reference(WorldEnvironment(), new)
            assert score == 1.0 and not any(s.observation.error for s in steps)
            assert new.source == "synthesized" and new.parent_task_id == task.id
            # The family names the candidate's own calls; the parent is provenance.
            assert new.family == ">".join(c.name for c in candidate.minimal_actions)
            assert new.signal == "boundary" and new.cycle == 2
            questions += new.reference_answer is not None
    assert accepted >= len(tasks) and questions >= 1  # lookups become questions with answers


def test_offline_summarizer_reads_the_failure_per_signal():
    task = TASKS["send_message"]
    [item] = flagged([task], kinds=("forgetting", "rare", "boundary"))
    context = run(OfflineSummarizer().summarize(item, task))
    assert context.do_not_repeat == [task.instruction]
    assert "send_message" in context.focus_patterns and "find_contact" in context.focus_patterns
    assert "zz9" in context.failure_cause and "send_message" in context.failure_cause
    assert "not_found" in context.failure_cause  # the failing step's error
    objectives = " ".join(context.exploration_objectives)
    assert len(context.exploration_objectives) == 3
    assert "Reinforce the forgotten skill" in objectives
    assert "rare scenario 'find_contact!not_found'" in objectives
    assert "boundary" in objectives
    assert "[1.0, 0.0, 0.0]" in context.instability_pattern


def test_offline_exploration_is_deterministic_given_the_seed():
    task = TASKS["buy_item"]
    [item] = flagged([task])
    context = run(OfflineSummarizer().summarize(item, task))

    def explore(seed):
        explorer = OfflineExplorer(rounds=3, steps=4, seed=seed)
        return run(explorer.explore(item, task, context, WorldEnvironment))

    first, again, other = explore(0), explore(0), explore(1)
    assert first == again and first != other
    # Round 1 varies the reference: the same tools in order, with freshly sampled values.
    assert [i.call.name for i in first[0].interactions] == [c.name for c in task.reference_calls]
    for exploration in first:
        assert exploration.setup == task.setup and exploration.objective
        assert 1 <= len(exploration.interactions) <= 4 + len(task.reference_calls)
    given = [AbstractionInput(item, task, context, r, [], WorldEnvironment) for r in (first, again)]
    candidates, repeated = (run(OfflineAbstractor().abstract(g)) for g in given)
    assert candidates.candidates and candidates == repeated


def test_policy_drives_some_rounds_at_high_temperature():
    task = TASKS["update_phone"]
    [item] = flagged([task])
    context = run(OfflineSummarizer().summarize(item, task))
    policy = SlipPolicy()
    explorer = OfflineExplorer(rounds=3, steps=4, policy=policy, policy_temperature=1.3)
    assert explorer.name == "explorer:offline+policy(slip)"
    rounds = run(explorer.explore(item, task, context, WorldEnvironment))
    assert len(rounds) == 3 and set(policy.temperatures) == {1.3}
    driven = rounds[-1].interactions
    assert [i.call.name for i in driven] == ["find_contact", "update_phone"]
    assert driven[-1].observation.error == "not_found"  # the policy's own slip, logged


class PlainEnvironment(WorldEnvironment):
    """The world without a sampler, describer or action windows, under another name (like
    BFCL): None blocks a protocol's method (``isinstance(env, SupportsDescribe)`` is False)."""

    name = "plain"
    sample_action = None  # type: ignore[assignment]
    describe = None  # type: ignore[assignment]
    changes_state = None  # type: ignore[assignment]
    setup_after = None  # type: ignore[assignment]
    lookup_answer = None  # type: ignore[assignment]


def test_offline_roles_without_sampler_or_describer():
    task = TASKS["buy_item"]
    [item] = flagged([task])
    for policy in (None, SlipPolicy()):
        explorer = OfflineExplorer(rounds=2, steps=4, policy=policy)
        _, rounds, candidates, verdicts, _ = run(
            offline_pipeline(item, task, explorer=explorer, make_env=PlainEnvironment)
        )
        assert len(rounds) == 2
        for exploration in rounds:  # replays of (cut) references, or the policy's episodes
            names = [i.call.name for i in exploration.interactions]
            assert names and names[0] == "search_products"
        for candidate in candidates:  # windows start where the round did
            assert candidate.query.startswith("Use the tools to do the following, in order: ")
            assert candidate.minimal_actions[0].name == "search_products"
        assert any(v.accepted for v in verdicts)


def test_abstractor_skips_neighbours_and_says_why():
    task = TASKS["send_message"]
    [item] = flagged([task])
    _, _, candidates, _, rejections = run(offline_pipeline(item, task))
    assert candidates and not any(r.reason.startswith("repeats existing") for r in rejections)
    assert len({c.query for c in candidates}) == len(candidates)
    neighbour = Neighbour(id="world-train-0001", text=candidates[0].query.upper(), similarity=0.99)
    _, _, again, _, rejections = run(offline_pipeline(item, task, neighbours=[neighbour]))
    assert candidates[0].query not in [c.query for c in again]
    assert any(r.reason.startswith("repeats existing task world-train-0001") for r in rejections)
    assert text_similarity("Text Bo: 'hi'.", "text bo hi") == 1.0


def test_executable_judge_rejects_bad_candidates_with_reasons():
    task = TASKS["send_message"]
    setup = {"state": task.setup["state"]}
    contact_id = task.reference_calls[-1].arguments["contact_id"]
    judge = ExecutableJudge()

    def verdict(actions, answer=None, with_setup=True) -> Verdict:
        candidate = CandidateTask(
            description="d",
            query="q",
            minimal_actions=[ToolCall(name=n, arguments=a) for n, a in actions],
            reference_answer=answer,
            setup=setup if with_setup else {},
        )
        return run(judge.judge(candidate, WorldEnvironment))

    good = verdict([("send_message", {"contact_id": contact_id, "text": "hi"})])
    assert good.accepted and good.success and good.execution_reward == 1.0
    cases = {
        "unknown tool": verdict([("teleport", {"to": "moon"})]),
        "bad_arguments": verdict([("send_message", {"contact": contact_id})]),
        "not_found": verdict([("send_message", {"contact_id": "c99", "text": "hi"})]),
        "no setup['state']": verdict([("get_balance", {})], with_setup=False),
        "trivial": verdict([("list_contacts", {})]),
        "appears in no observation": verdict([("get_balance", {})], answer="123456"),
    }
    for expected, result in cases.items():
        assert not result.accepted and not result.success and result.execution_reward == 0.0
        assert expected in result.reason, (expected, result.reason)
    assert cases["unknown tool"].api_match is False
    assert cases["bad_arguments"].parameter_usage is False
    assert cases["not_found"].logical_flow is False and cases["not_found"].failed_or_skipped_steps
    answer = verdict(
        [("get_balance", {})], answer=task.setup["state"]["wallet"]["balance"].__str__()
    )
    assert answer.accepted


def test_a_recovered_error_is_not_a_failure():
    task = make_task("train", 7, "buy_with_topup")
    candidate = CandidateTask(
        description="d",
        query=task.instruction,
        minimal_actions=task.reference_calls,
        setup={"state": task.setup["state"]},
    )
    verdict = run(ExecutableJudge().judge(candidate, WorldEnvironment))
    assert verdict.accepted and "recovered" in verdict.reason


def test_replay_reference_answers_per_turn_or_does_nothing():
    task = TASKS["phone_lookup"]  # a question: the answer decides the score
    score, steps = replay_reference(WorldEnvironment(), task)
    assert score == 1.0 and [s.call for s in steps] == task.reference_calls
    score, steps = replay_reference(WorldEnvironment(), task, answers=["no idea"])
    assert score == 0.0 and len(steps) == len(task.reference_calls)
    score, steps = replay_reference(WorldEnvironment(), task, calls=False)
    assert score == 0.0 and steps == []
    with pytest.raises(ValueError, match="2 answers given for the 1 turns"):
        replay_reference(WorldEnvironment(), task, answers=["a", "b"])


def test_candidate_to_task_is_stable_and_verifies():
    task = TASKS["update_phone"]
    calls = task.reference_calls
    candidate = CandidateTask(
        description="d", query="Give Ana a new number.", minimal_actions=calls, signal="rare"
    )
    first = candidate_to_task(candidate, task, cycle=3)
    assert first.id == candidate_to_task(candidate, task, cycle=3).id
    assert first.id.startswith("syn-c3-") and first.id != candidate_to_task(candidate, task, 4).id
    assert first.setup == {"state": task.setup["state"]}  # the parent's, without its check
    assert first.turns[0].reference_calls == calls and first.signal == "rare"
    assert replay_reference(WorldEnvironment(), first)[0] == 1.0
    other = candidate.model_copy(update={"query": "Another query."})
    assert candidate_to_task(other, task, 3).id != first.id


# --------------------------------------------------------------------------- build_roles


def endpoint(server, **options) -> EndpointConfig:
    settings = {"base_url": server.base_url, "model": server.model, "timeout_s": 5.0}
    return EndpointConfig(**{**settings, "max_retries": 0, **options})


def test_build_roles_follows_the_one_synthesizer_switch(scripted_server):
    server = scripted_server()
    endpoints = {"big": endpoint(server), "small": endpoint(server, model="small-model")}
    roles = build_roles(RolesConfig(), endpoints)  # the default: variations, no model
    assert roles.names() == {
        "synthesizer": "variation",
        "summarizer": "summarizer:offline",
        "explorer": "explorer:variation",
        "abstractor": "abstractor:variation",
        "judge": "judge:offline",
    }
    assert roles.limiter is None

    roles = build_roles(
        RolesConfig(), endpoints, synthesizer="generator", make_env=WorldEnvironment
    )
    assert roles.names() == {
        "synthesizer": "generator",
        "summarizer": "summarizer:offline",
        "explorer": "explorer:offline",
        "abstractor": "abstractor:offline",
        "judge": "judge:offline",
    }
    roles = build_roles(
        RolesConfig(explorer_rounds=5), endpoints, SlipPolicy(), synthesizer="generator"
    )
    assert roles.names()["explorer"] == "explorer:offline+policy(slip)"
    assert roles.explorer.rounds == 5

    config = RolesConfig(default_endpoint="big", llm_concurrency=3)
    roles = build_roles(config, endpoints, synthesizer="llm")
    assert roles.names()["summarizer"] == "summarizer:llm(scripted-model)"
    assert roles.names()["judge"] == "judge:llm(scripted-model)"
    limiters = {id(getattr(roles, r).limiter) for r in ("summarizer", "explorer", "abstractor")}
    assert limiters == {id(roles.limiter)} and roles.limiter._value == 3

    config = RolesConfig(default_endpoint="big", explorer="small", judge="offline")
    roles = build_roles(config, endpoints, policy=SlipPolicy(), synthesizer="llm")
    assert roles.names()["explorer"] == "explorer:llm(small-model)"
    assert roles.names()["judge"] == "judge:offline"
    assert roles.names()["abstractor"] == "abstractor:llm(scripted-model)"
    roles = build_roles(RolesConfig(judge="big"), endpoints, SlipPolicy(), synthesizer="llm")
    assert roles.names()["judge"] == "judge:llm(scripted-model)"
    # an offline abstractor among LLM roles relabels explored windows, never the generator
    assert roles.names()["abstractor"] == "abstractor:offline" and not roles.abstractor.steer


def test_a_synthesizer_the_environment_or_the_endpoints_cannot_serve_is_refused(scripted_server):
    from coevolve.envs.registry import get_environment

    desk = get_environment("examples.support_desk.env:make_env").environment
    with pytest.raises(ValueError, match="has none: use synthesizer: variation"):
        build_roles(RolesConfig(), {}, synthesizer="generator", make_env=desk)
    with pytest.raises(ValueError, match="'llm' needs an endpoint"):
        build_roles(RolesConfig(), {}, synthesizer="llm")


def test_build_roles_unknown_endpoint_names_the_known_ones(scripted_server):
    endpoints = {"big": endpoint(scripted_server())}
    with pytest.raises(ValueError, match=r"'nope'.*known: big"):
        build_roles(RolesConfig(abstractor="nope"), endpoints, synthesizer="llm")
    with pytest.raises(ValueError, match=r"default_endpoint.*known: none defined"):
        build_roles(RolesConfig(default_endpoint="big"), {}, synthesizer="llm")
    with pytest.raises(ValueError, match="extra"):
        RolesConfig(summariser="offline")
    assert all(field.description for field in RolesConfig.model_fields.values())
    assert RolesConfig().judge_prompt == prompts.JUDGE_PROMPT


# --------------------------------------------------------------------------- LLM roles


class Pair(BaseModel):
    a: int
    b: str = ""


def test_structured_call_json_schema_path(scripted_server):
    server = scripted_server([Reply.json_content({"a": 1, "b": "x"})])
    result = run(structured_call(chat_model(endpoint(server)), Pair, [HumanMessage("hi")]))
    assert result == Pair(a=1, b="x")
    [body] = server.chat_bodies()
    # the length limit under the name OpenAI-compatible servers honour (length_field), once
    assert body["max_tokens"] == 512 and body["temperature"] == 0.7
    assert "max_completion_tokens" not in body
    assert body["response_format"]["type"] == "json_schema"
    assert body["response_format"]["json_schema"]["name"] == "Pair"


def test_structured_call_reads_json_in_prose_and_falls_back(scripted_server):
    fenced = 'Sure! Here it is:\n```json\n{"a": 2, "b": "y"}\n```\nAnything else?'
    server = scripted_server([Reply.text(fenced)])
    model = chat_model(endpoint(server))
    assert run(structured_call(model, Pair, [HumanMessage("hi")])) == Pair(a=2, b="y")
    assert len(server.chat_bodies()) == 1  # read tolerantly, no second request

    # The server refuses response_format: a plain request for JSON follows.
    server = scripted_server(
        [Reply.status(400, "response_format is not supported"), Reply.text('ok {"a": 3} done')]
    )
    assert run(structured_call(chat_model(endpoint(server)), Pair, [HumanMessage("hi")])).a == 3
    first, second = server.chat_bodies()
    assert "response_format" in first and "response_format" not in second
    assert "JSON schema" in second["messages"][-1]["content"]

    # Unparsable structured reply, then JSON in the fallback.
    server = scripted_server([Reply.malformed("not json"), Reply.text('{"a": 4}')])
    assert run(structured_call(chat_model(endpoint(server)), Pair, [HumanMessage("hi")])).a == 4


def test_structured_call_failure_is_a_clear_error(scripted_server):
    server = scripted_server([Reply.text("no idea"), Reply.text('{"b": "missing a"}')])
    with pytest.raises(StructuredOutputError, match="does not fit Pair") as info:
        run(structured_call(chat_model(endpoint(server)), Pair, [HumanMessage("hi")]))
    assert info.value.raw == '{"b": "missing a"}'
    # No readable reply at all is not a content problem: it is the endpoint's ReplyError.
    server = scripted_server([Reply.malformed(), Reply.malformed()])
    with pytest.raises(ReplyError, match="unreadable reply from scripted-model") as failed:
        run(structured_call(chat_model(endpoint(server)), Pair, [HumanMessage("hi")]))
    assert failed.value.kind == "body"


CONTEXT = {
    "summary": "The agent texted the wrong contact id.",
    "failure_cause": "send_message used an id it did not look up",
    "instability_pattern": "succeeds 1 of 3 times",
    "focus_patterns": ["find_contact > send_message"],
    "exploration_objectives": ["message several contacts after looking them up"],
    "do_not_repeat": [],
}


def test_llm_summarizer(scripted_server):
    task = TASKS["send_message"]
    [item] = flagged([task], kinds=("boundary", "rare"))
    server = scripted_server([Reply.json_content(CONTEXT)])
    summarizer = LLMSummarizer(chat_model(endpoint(server)))
    assert summarizer.name == "summarizer:llm(scripted-model)"
    context = run(summarizer.summarize(item, task))
    assert context.summary == CONTEXT["summary"] and context.do_not_repeat == [task.instruction]
    [body] = server.chat_bodies()
    assert body["messages"][0]["content"] == SUMMARIZER_PROMPT
    request = body["messages"][1]["content"]
    assert task.instruction in request and "zz9" in request and "rare:" in request

    server = scripted_server([Reply.malformed(), Reply.text("I cannot answer that.")])
    context = run(LLMSummarizer(chat_model(endpoint(server))).summarize(item, task))
    assert context.summary.startswith("[LLM summary unreadable:")
    assert "send_message" in context.focus_patterns  # the offline reading took over


def explorer_script(body):
    """Round-independent: decide from the conversation so far (rounds run concurrently)."""
    messages = body["messages"]
    done = sum(m["role"] == "tool" for m in messages)
    goal = messages[1]["content"]
    name = "Bo" if "round 1 of" in goal else "Ed"
    if done == 0:
        return Reply.tool_calls([("find_contact", '{"name": ')])  # broken JSON arguments
    if done == 1:
        return Reply.tool_calls([("find_contact", {"name": name})])
    if done == 2:
        return Reply.tool_calls([("no_such_tool", {})])
    return Reply.text("I found the contacts.")


def test_llm_explorer_runs_rounds_with_tools(scripted_server):
    task = TASKS["send_message"]
    [item] = flagged([task])
    server = scripted_server(explorer_script)
    explorer = LLMExplorer(chat_model(endpoint(server)), rounds=2, steps=5)
    context = SynthesisContext(**{**CONTEXT, "exploration_objectives": ["goal A", "goal B"]})
    rounds = run(explorer.explore(item, task, context, WorldEnvironment))
    assert [r.objective for r in rounds] == ["goal A", "goal B"]
    names = task.setup["state"]["contacts"]
    for exploration, person in zip(rounds, ["Bo", "Ed"], strict=True):
        assert exploration.setup == task.setup
        first, second = exploration.interactions  # the broken call is not an interaction
        assert first.call == ToolCall(name="find_contact", arguments={"name": person})
        expected = any(c["name"] == person for c in names.values())
        assert (first.observation.error is None) == expected
        assert second.call.name == "no_such_tool" and second.observation.error == "unknown_tool"
    bodies = server.chat_bodies()
    assert len(bodies) == 8 and all(b["messages"][0]["content"] == EXPLORER_PROMPT for b in bodies)
    assert {t["function"]["name"] for t in bodies[0]["tools"]} >= {"find_contact", "send_message"}
    broken = next(m for b in bodies for m in b["messages"] if m["role"] == "tool")
    assert broken["content"].startswith("error:")


def test_llm_explorer_reads_calls_a_server_left_in_the_text(scripted_server):
    """transformers serve has no tool-call parser: the calls come back as content."""
    task = TASKS["send_message"]
    [item] = flagged([task])
    server = scripted_server(
        [
            Reply.text(
                '<tool_call>{"name": "find_contact", "arguments": {"name": "Bo"}}</tool_call>'
            ),
            Reply.text('find_contact(name="Ed")\nsend_message(contact_id="c1"'),
            Reply.text("Done."),
        ]
    )
    explorer = LLMExplorer(chat_model(endpoint(server)), rounds=1, steps=5)
    [exploration] = run(explorer.explore(item, task, SynthesisContext(**CONTEXT), WorldEnvironment))
    assert [i.call for i in exploration.interactions] == [
        ToolCall(name="find_contact", arguments={"name": "Bo"}),
        ToolCall(name="find_contact", arguments={"name": "Ed"}),
    ]
    bodies = server.chat_bodies()
    assert len(bodies) == 3
    # The next request carries the reply as structured calls, each answered by a tool message.
    replayed = [m for m in bodies[2]["messages"] if m["role"] == "assistant"]
    assert [len(m.get("tool_calls") or []) for m in replayed] == [1, 2]
    tools = [m for m in bodies[2]["messages"] if m["role"] == "tool"]
    assert len(tools) == 3 and tools[2]["content"].startswith("error:")  # the cut-off call
    assert {m["tool_call_id"] for m in tools} == {
        c["id"] for m in replayed for c in m["tool_calls"]
    }


def test_llm_explorer_stops_at_the_step_budget(scripted_server):
    task = TASKS["buy_item"]
    [item] = flagged([task])
    server = scripted_server(
        [Reply.tool_calls([("get_balance", {}), ("view_cart", {}), ("list_orders", {})])],
        repeat_last=True,
    )
    explorer = LLMExplorer(chat_model(endpoint(server)), rounds=1, steps=2)
    [exploration] = run(explorer.explore(item, task, SynthesisContext(**CONTEXT), WorldEnvironment))
    assert [i.call.name for i in exploration.interactions] == ["get_balance", "view_cart"]
    assert len(server.chat_bodies()) == 1


def world_round(task, calls):
    env = WorldEnvironment()
    env.reset(task)
    interactions = [Interaction(call=c, observation=env.step(c)) for c in calls]
    return ExplorationRound(objective="o", setup=task.setup, interactions=interactions)


def test_llm_abstractor_validates_actions(scripted_server):
    task = TASKS["send_message"]
    [item] = flagged([task])
    contact_id = task.reference_calls[-1].arguments["contact_id"]
    name = task.setup["state"]["contacts"][contact_id]["name"]
    good = {
        "description": "look up, then text",
        "query": f"Text {name} that the store is open.",
        "minimal_actions": [
            {"name": "find_contact", "arguments": {"name": name}},
            f'send_message(contact_id="{contact_id}", text="store is open")',
        ],
        "reference_answer": None,
    }
    reply = {
        "candidates": [
            good,
            {**good, "query": "Broken one.", "minimal_actions": ["send_message(contact_id=c1"]},
            {**good, "query": task.instruction},
            {**good, "description": "same actions again"},
            {**good, "query": "No actions.", "minimal_actions": []},
        ]
    }
    server = scripted_server([Reply.json_content(reply)])
    abstractor = LLMAbstractor(chat_model(endpoint(server)), max_candidates=3)
    context = SynthesisContext(**{**CONTEXT, "do_not_repeat": [task.instruction]})
    rounds = [world_round(task, task.reference_calls)]
    given = AbstractionInput(item, task, context, rounds, [], WorldEnvironment)
    abstraction = run(abstractor.abstract(given))
    [candidate] = abstraction.candidates
    assert candidate.minimal_actions[1] == ToolCall(
        name="send_message", arguments={"contact_id": contact_id, "text": "store is open"}
    )
    assert candidate.setup == {"state": task.setup["state"]} and candidate.signal == "boundary"
    reasons = [r.reason for r in abstraction.rejections]
    assert len(reasons) == 4
    assert reasons[0].startswith("action 1 unreadable")
    assert reasons[1].startswith("repeats a do-not-repeat task")
    assert reasons[2] == "duplicates another candidate of this item"
    assert reasons[3] == "no minimal actions"
    request = server.chat_bodies()[0]["messages"][1]["content"]
    assert "find_contact(name=" in request and "Do not repeat" in request
    assert run(ExecutableJudge().judge(candidate, WorldEnvironment)).accepted

    # A bare list is read too; an unreadable reply is one recorded rejection, no crash.
    server = scripted_server([Reply.text(json.dumps([good]))])
    abstractor = LLMAbstractor(chat_model(endpoint(server)))
    abstraction = run(abstractor.abstract(given))
    assert len(abstraction.candidates) == 1 and abstraction.rejections == []
    server = scripted_server([Reply.malformed(), Reply.text("sorry")])
    abstractor = LLMAbstractor(chat_model(endpoint(server)))
    abstraction = run(abstractor.abstract(given))
    assert abstraction.candidates == []
    [rejection] = abstraction.rejections
    assert rejection.reason.startswith("abstractor reply unreadable")


VERDICT = {
    "api_match": True,
    "parameter_usage": True,
    "logical_flow": True,
    "final_result": True,
    "failed_or_skipped_steps": [],
    "success": True,
    "reason": "The lookup feeds the message; the query is fulfilled.",
}


def test_llm_judge(scripted_server):
    task = TASKS["send_message"]
    candidate = CandidateTask(
        description="d",
        query=task.instruction,
        minimal_actions=task.reference_calls,
        setup={"state": task.setup["state"]},
    )
    server = scripted_server([Reply.json_content(VERDICT)])
    judge = LLMJudge(chat_model(endpoint(server)))
    verdict = run(judge.judge(candidate, WorldEnvironment))
    assert verdict.success and verdict.accepted and verdict.execution_reward == 1.0
    assert verdict.reason == VERDICT["reason"]
    [body] = server.chat_bodies()
    assert body["messages"][0]["content"] == JUDGE_PROMPT
    assert "sent id=" in body["messages"][1]["content"]  # the replay's observations

    assert verdict.is_accepted(judge_veto=True)

    # The model may reject a task whose replay was clean: with the veto (the default)
    # that rejects it; the paper's rule (judge_veto: false) lets the reward accept it.
    server = scripted_server([Reply.json_content({**VERDICT, "success": False, "reason": "vague"})])
    verdict = run(LLMJudge(chat_model(endpoint(server))).judge(candidate, WorldEnvironment))
    assert not verdict.success and verdict.reason == "vague" and verdict.execution_reward == 1.0
    assert not verdict.is_accepted(judge_veto=True)
    assert verdict.is_accepted(judge_veto=False) and verdict.accepted

    # A broken replay with an unreadable reply: rejected, with the reason, no crash.
    broken = candidate.model_copy(update={"minimal_actions": [ToolCall(name="fly")]})
    server = scripted_server([Reply.malformed(), Reply.text("hmm")])
    verdict = run(LLMJudge(chat_model(endpoint(server))).judge(broken, WorldEnvironment))
    assert not verdict.accepted and verdict.execution_reward == 0.0
    assert verdict.reason.startswith("judge reply unreadable:") and verdict.failed_or_skipped_steps

    # Nothing to replay: rejected without asking the model.
    server = scripted_server([])
    no_setup = candidate.model_copy(update={"setup": {}})
    verdict = run(LLMJudge(chat_model(endpoint(server))).judge(no_setup, WorldEnvironment))
    assert not verdict.accepted and server.chat_bodies() == []


def test_llm_concurrency_limit_is_shared(scripted_server):
    server = scripted_server([Reply.json_content(VERDICT)], delay_s=0.05, repeat_last=True)
    roles = build_roles(
        RolesConfig(default_endpoint="main", llm_concurrency=2),
        {"main": endpoint(server)},
        synthesizer="llm",
    )
    task = TASKS["send_message"]
    candidate = CandidateTask(
        description="d",
        query=task.instruction,
        minimal_actions=task.reference_calls,
        setup={"state": task.setup["state"]},
    )

    async def many():
        return await asyncio.gather(
            *(roles.judge.judge(candidate, WorldEnvironment) for _ in range(8))
        )

    verdicts = run(many())
    assert all(v.success for v in verdicts) and len(server.chat_bodies()) == 8
    assert server.max_in_flight == 2

    unlimited = scripted_server([Reply.json_content(VERDICT)], delay_s=0.05, repeat_last=True)
    judge = LLMJudge(chat_model(endpoint(unlimited)))

    async def unbounded():
        return await asyncio.gather(*(judge.judge(candidate, WorldEnvironment) for _ in range(8)))

    run(unbounded())
    assert unlimited.max_in_flight > 2


def role_script(body):
    """One server for every role: each is told apart by its system prompt."""
    messages = body["messages"]
    system = messages[0]["content"]
    if system == SUMMARIZER_PROMPT:
        return Reply.json_content(CONTEXT)
    if system == EXPLORER_PROMPT:
        if sum(m["role"] == "tool" for m in messages) == 0:
            return Reply.tool_calls([("list_contacts", {})])
        return Reply.text("done")
    if system == ABSTRACTOR_PROMPT:
        contacts = TASKS["send_message"].setup["state"]["contacts"]
        cid, contact = sorted(contacts.items())[0]
        return Reply.json_content(
            [
                {
                    "description": "text after a lookup",
                    "query": f"Text {contact['name']}: see you at noon.",
                    "minimal_actions": [
                        {"name": "find_contact", "arguments": {"name": contact["name"]}},
                        {
                            "name": "send_message",
                            "arguments": {"contact_id": cid, "text": "see you at noon"},
                        },
                    ],
                }
            ]
        )
    if system == JUDGE_PROMPT:
        return Reply.text(f"My verdict:\n```json\n{json.dumps(VERDICT)}\n```")
    return Reply.status(400, "unexpected request")


def test_llm_pipeline_through_build_roles(scripted_server):
    server = scripted_server(role_script)
    roles = build_roles(
        RolesConfig(default_endpoint="main"), {"main": endpoint(server)}, synthesizer="llm"
    )
    task = TASKS["send_message"]
    [item] = flagged([task])

    async def pipeline():
        context = await roles.summarizer.summarize(item, task)
        rounds = await roles.explorer.explore(item, task, context, WorldEnvironment)
        abstraction = await roles.abstractor.abstract(
            AbstractionInput(item, task, context, rounds, [], WorldEnvironment)
        )
        candidates = abstraction.candidates
        return (
            rounds,
            candidates,
            [await roles.judge.judge(c, WorldEnvironment) for c in candidates],
        )

    rounds, [candidate], [verdict] = run(pipeline())
    assert len(rounds) == 2 and all(r.interactions[0].call.name == "list_contacts" for r in rounds)
    assert verdict.success and verdict.accepted
    new = candidate_to_task(candidate, task, cycle=1)
    assert replay_reference(WorldEnvironment(), new)[0] == 1.0
    assert isinstance(rounds[0].interactions[0].observation, Observation)
    assert all(
        isinstance(m, dict) for b in server.chat_bodies() for m in b["messages"]
    )  # every request was a real chat completion


def test_a_chat_model_outlives_its_event_loop(scripted_server):
    """Pooled connections are per event loop: a second asyncio.run reuses the model."""
    server = scripted_server([Reply.json_content({"a": 6})], repeat_last=True)
    model = chat_model(endpoint(server))
    for _ in range(3):
        assert run(structured_call(model, Pair, [HumanMessage("hi")])).a == 6
    assert len(server.chat_bodies()) == 3


def test_system_messages_are_sent_verbatim(scripted_server):
    server = scripted_server([Reply.json_content({"a": 5})])
    run(
        structured_call(chat_model(endpoint(server)), Pair, [SystemMessage("S"), HumanMessage("U")])
    )
    [body] = server.chat_bodies()
    assert [m["role"] for m in body["messages"]] == ["system", "user"]


# --------------------------------------------------------------------------- steered synthesis


def _contains_in_order(calls, names):
    position = 0
    for call in calls:
        if position < len(names) and call == names[position]:
            position += 1
    return position == len(names)


@pytest.mark.parametrize("family", sorted(__import__("coevolve").envs.world.FAMILIES))
def test_structure_variants_keep_every_familys_structure_and_verify(family):
    """Forgetting answers a failure with whole-structure variants on new values: all verify."""
    task = make_task("train", 950, family)
    [item] = flagged([task], kinds=("forgetting",))
    _, _, candidates, verdicts, _ = run(offline_pipeline(item, task, steer=True))
    assert len(candidates) == 3
    parent_tools = [c.name for c in task.reference_calls]
    for candidate, verdict in zip(candidates, verdicts, strict=True):
        assert candidate.kind == "structure_variant" and candidate.signal == "forgetting"
        assert [c.name for c in candidate.minimal_actions] == parent_tools
        assert candidate.query != task.instruction  # new entities and state
        assert verdict.vetoed_accepted, verdict.reason
        new = candidate_to_task(candidate, task, 1, WorldEnvironment().structure_key)
        assert new.family == family and new.parent_task_id == task.id
        assert replay_reference(WorldEnvironment(), new)[0] == 1.0
    assert len({c.query for c in candidates}) == 3


def test_each_signal_kind_generates_differently_around_the_failing_transition():
    """SlipPolicy garbles the last call: the failing step is the last one, for every kind."""
    task = TASKS["buy_item"]  # search_products > add_to_cart > checkout
    made = {}
    for kind in ("forgetting", "boundary", "unsolved", "rare"):
        [item] = flagged([task], kinds=(kind,))
        context, _, candidates, verdicts, _ = run(offline_pipeline(item, task, steer=True))
        failing = context.failing_step
        assert failing is not None
        transition = [c.name for c in task.reference_calls][max(failing - 1, 0) : failing + 1]
        for candidate in candidates:
            assert candidate.signal == kind
            if candidate.kind in ("structure_variant", "transition"):
                assert _contains_in_order([c.name for c in candidate.minimal_actions], transition)
        assert all(
            v.vetoed_accepted
            for v, c in zip(verdicts, candidates, strict=True)
            if c.kind != "window"
        )
        made[kind] = [c.kind for c in candidates]
    assert made["forgetting"] == ["structure_variant"] * 3
    assert made["boundary"] == ["structure_variant", "structure_variant", "transition"]
    assert made["unsolved"] == ["prefix", "structure_variant", "structure_variant"]
    assert made["rare"][0] == "structure_variant" and "window" in made["rare"][1:]
    assert len({tuple(kinds) for kinds in made.values()}) >= 3


def test_the_unsolved_step_toward_a_task_grows_with_its_family_success():
    """A 4-call task failing at its first call: 1 call at 0% family success, 3 at 100%."""
    from coevolve.agents.roles.abstractor import prefix_length

    task = TASKS["buy_item"]
    [item] = flagged([task], kinds=("unsolved",))

    def at(success, failing=0, length=4):
        signal = item.signals[0].model_copy(update={"evidence": {"family_success": success}})
        return prefix_length(item.model_copy(update={"signals": [signal]}), failing, length)

    assert [at(s) for s in (0.0, 0.34, 0.67, 1.0)] == [1, 2, 3, 3]
    assert at(0.0, failing=3) == 3  # failing at the last call: all calls before it
    assert at(0.5, length=1) == 1
    # The detector records the family's success on the signal.
    from coevolve.memory.history import OutcomeHistory
    from coevolve.memory.patterns import PatternCounts
    from coevolve.memory.signals import SignalConfig, detect_signals

    solved = item.trajectory.model_copy(update={"id": "x/r1", "task_id": "other", "score": 1.0})
    found = detect_signals(
        [item.trajectory, solved],
        OutcomeHistory(None),
        PatternCounts(None),
        SignalConfig(kinds=["unsolved"]),
        cycle=1,
    )
    assert [f.signals[0].evidence["family_success"] for f in found] == [0.5]


def test_the_summarizer_aims_at_where_the_nearest_miss_broke():
    """Own episode: no calls at all (fails at call 0). Nearest miss: all calls but a garbled last."""
    from coevolve.agents.roles.summarizer import offline_context, render_flagged

    task = TASKS["buy_item"]  # search_products > add_to_cart > checkout
    [item] = flagged([task], kinds=("unsolved",))
    miss = item.trajectory.model_copy(update={"id": "miss", "progress": 0.5})
    own = item.trajectory.model_copy(update={"steps": [], "progress": 0.0})
    alone = offline_context(item.model_copy(update={"trajectory": own}), task)
    linked = item.model_copy(update={"trajectory": own, "nearest_miss": miss})
    context = offline_context(linked, task)
    assert alone.failing_step == 0
    assert (
        context.failing_step == 2 and "nearest miss miss (progress 0.50)" in context.failure_cause
    )
    assert "Nearest miss miss" in render_flagged(linked, task)  # what an LLM summarizer reads


def test_nearest_misses_link_each_flagged_episode_to_a_further_failure_of_its_task():
    from coevolve.memory.signals import attach_nearest_misses

    def episode(id_, task, score, progress):
        return Trajectory(
            id=id_, task_id=task, env="world", family="f", score=score, progress=progress
        )

    flagged_items = [
        FlaggedTrajectory(trajectory=episode("a0", "a", 0.0, 0.2), signals=[]),
        FlaggedTrajectory(trajectory=episode("b0", "b", 0.0, 0.9), signals=[]),
    ]
    episodes = [
        episode("a1", "a", 0.0, 0.6),
        episode("a2", "a", 0.0, 0.8),  # the nearest miss of a0
        episode("a3", "a", 1.0, 1.0),  # a success is no miss
        episode("b1", "b", 0.0, 0.5),  # not further than b0
        episode("c1", "c", 0.0, 0.95),  # another task
    ]
    linked = attach_nearest_misses(flagged_items, episodes)
    assert [i.nearest_miss.id if i.nearest_miss else None for i in linked] == ["a2", None]


def test_the_repeat_check_agrees_with_the_full_similarity():
    """``similar`` skips difflib's quadratic ratio when its upper bounds already fall
    short; it must decide every pair as ``text_similarity >= 0.95`` does."""
    import random

    from coevolve.agents.roles.task_text import REPEAT_SIMILARITY, similar
    from coevolve.envs.world import load_split

    texts = [task.instruction for task in load_split("train", size=60)]
    rng = random.Random(0)
    near = [t[: len(t) - rng.randint(0, 3)] + rng.choice(["", ".", " now"]) for t in texts]
    pairs = [(a, b) for a in texts[:30] for b in texts[30:]] + list(zip(texts, near, strict=True))
    decided = [similar(a, b) for a, b in pairs]
    assert decided == [text_similarity(a, b) >= REPEAT_SIMILARITY for a, b in pairs]
    assert any(decided) and not all(decided)
