"""Tool calls as models write them (issue 70, item 2), over real HTTP.

Qwen2.5-Coder behind llama-server writes its call as a fenced ```json object in the
reply's content; before, nothing read it, so every episode ended on a "final answer"
scored 0 with no error counted. Here the project's scripted OpenAI-compatible server
answers in each form a model writes, and the endpoint policy plays episodes of the
built-in world through the one episode loop (agents/policy/rollout.py).
"""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
from typing import get_args

import pytest
import yaml

from coevolve.agents.config import PolicyConfig
from coevolve.agents.policy.endpoint_policy import EndpointPolicy
from coevolve.agents.policy.eval_report import evaluation_report
from coevolve.agents.policy.policy_interface import parse_assistant_text
from coevolve.agents.policy.rollout import run_rollouts
from coevolve.agents.roles.explorer import LLMExplorer
from coevolve.agents.roles.llm import chat_model
from coevolve.config import CoevolveConfig, ConfigError, EndpointConfig
from coevolve.envs.parsing import UNREADABLE_CALL
from coevolve.envs.world import WorldEnvironment, load_split
from coevolve.memory.signals import FlaggedTrajectory
from coevolve.records import CALL_FORMS, CallForm, Signal, SynthesisContext, ToolCall, Trajectory
from coevolve.runner import build_policy
from coevolve.testing.openai_server import Reply
from coevolve.testing.reference_agent import call_reply, reference_replies

HELDOUT = load_split("heldout")
# One call, no answer asked: set_reminder(text=..., date=..., time=...).
REMINDER = next(t for t in HELDOUT if t.family == "set_reminder")
# One lookup, and the answer is the phone number it finds.
PHONE = next(t for t in HELDOUT if t.family == "phone_lookup" and t.reference_answer)


def endpoint(server, **options) -> EndpointConfig:
    return EndpointConfig(
        base_url=server.base_url, model=server.model, timeout_s=10.0, max_retries=0, **options
    )


def play(server, task, read_json_calls: bool, max_tool_calls: int = 12) -> Trajectory:
    policy = EndpointPolicy(endpoint(server), read_json_calls=read_json_calls)
    try:
        [trajectory] = run_rollouts(
            policy, WorldEnvironment, [task], max_tool_calls=max_tool_calls, progress=False
        )
    finally:
        asyncio.run(policy.aclose())
    return trajectory


def test_the_forms_are_the_records():
    assert CALL_FORMS == get_args(CallForm)


@pytest.mark.parametrize("form", CALL_FORMS)
def test_each_form_is_read_through_the_endpoint_policy(scripted_server, form):
    [call] = REMINDER.reference_calls
    server = scripted_server([call_reply(call, form), Reply.text("Done.")])
    trajectory = play(server, REMINDER, read_json_calls=True)
    [step] = trajectory.steps
    assert (step.call.name, step.call.arguments) == (call.name, call.arguments)
    assert step.call_form == form and step.observation.error is None
    assert trajectory.final_answer == "Done." and trajectory.score == 1.0
    # The tool result answers the call the replayed assistant message names.
    assistant, result = trajectory.messages[2], trajectory.messages[3]
    assert [c["id"] for c in assistant["tool_calls"]] == [result["tool_call_id"]]
    overall = evaluation_report([trajectory], [REMINDER], "world", {}, "p").overall
    assert overall.calls_by_form == {f: int(f == form) for f in CALL_FORMS}
    assert overall.unreadable_calls == 0 and overall.call_errors == {}


# The number is in the text, so read as an answer this reply would score 1.0: it did
# before (the whole text was taken as the final answer).
BROKEN_FENCE = (
    "```json\n"
    f'{{"name": "find_contact", "arguments": {{"name": "Gia", "phone": "{PHONE.reference_answer}"}}\n'
    "```"
)


@pytest.mark.parametrize("read_json_calls", [True, False])
def test_a_call_shaped_unreadable_reply_is_a_counted_error_not_the_answer(
    scripted_server, read_json_calls
):
    server = scripted_server([Reply.text(BROKEN_FENCE)], repeat_last=True)
    trajectory = play(server, PHONE, read_json_calls, max_tool_calls=2)
    assert [s.observation.error for s in trajectory.steps] == [UNREADABLE_CALL] * 2
    assert all(s.call is None and s.raw for s in trajectory.steps)
    assert "not valid JSON" in trajectory.steps[0].observation.text
    assert trajectory.final_answer is None and trajectory.score == 0.0
    assert not trajectory.finished  # cut off by the call limit, never answered
    # The model is shown what it wrote, and why it was not read.
    assert trajectory.messages[2] == {"role": "assistant", "content": BROKEN_FENCE}
    assert trajectory.messages[3]["content"].startswith("error: the tool call is not valid JSON")
    overall = evaluation_report([trajectory], [PHONE], "world", {}, "p").overall
    assert overall.unreadable_calls == 2 and overall.call_errors == {UNREADABLE_CALL: 2}
    assert sum(overall.calls_by_form.values()) == 0


def test_a_json_call_is_not_executed_while_the_setting_is_off(scripted_server):
    [call] = REMINDER.reference_calls
    server = scripted_server([call_reply(call, "fenced_json"), Reply.text("Done.")])
    trajectory = play(server, REMINDER, read_json_calls=False)
    [step] = trajectory.steps
    assert step.call is None and step.observation.error == UNREADABLE_CALL
    assert "policy.read_json_calls" in step.observation.text
    assert trajectory.final_answer == "Done." and trajectory.score == 0.0


@pytest.mark.parametrize(
    ("text", "kind"),
    [
        ('{"name": "find_contact", "arguments": {"name": "Ana"', UNREADABLE_CALL),  # bare
        ('```\n{"name": "find_contact", "arguments": {"na', UNREADABLE_CALL),  # fence cut off
        ('Calling {"name": "find_contact", "arguments": {}} now.', UNREADABLE_CALL),  # in prose
        ('<tool_call>{"name": "find_contact", "arguments": {"na', UNREADABLE_CALL),  # unclosed
        ('<tool_call>{"name": "find_contact", "arguments": {</tool_call>', "bad_json"),  # closed
        ('```json\n{"name": "find_contact", "arguments": "{oops"}\n```', UNREADABLE_CALL),
    ],
)
def test_call_shaped_text_in_no_readable_form_is_an_invalid_call(text, kind):
    parsed = parse_assistant_text(text, read_json_calls=True)
    assert parsed.tool_calls == [] and [bad.error for bad in parsed.invalid_tool_calls] == [kind]
    assert parsed.invalid_tool_calls[0].message


@pytest.mark.parametrize(
    "text",
    [
        "Gia's number is 555-5654.",
        '{"name": "Gia", "phone": "555-5654"}',  # a record, not a call: no arguments
        'Here it is:\n```json\n{"phone": "555-5654"}\n```',
        "```python\nprint(1)\n```",
        "[1, 2, 3]",
    ],
)
def test_answers_that_are_no_call_stay_answers(text):
    parsed = parse_assistant_text(text, read_json_calls=True)
    assert parsed == (text.strip(), [], [], None)


def test_fenced_calls_between_prose_keep_the_prose_and_every_call():
    text = (
        "First the contact.\n```json\n"
        '[{"name": "find_contact", "arguments": {"name": "Ana"}}, {"name": "get_balance"}]\n'
        '```\nthen\n```\n{"function": {"name": "list_notes", "arguments": "{}"}}\n```'
    )
    content, calls, invalid, form = parse_assistant_text(text, "c", read_json_calls=True)
    assert [(c.name, c.arguments, c.id) for c in calls] == [
        ("find_contact", {"name": "Ana"}, "c_0"),
        ("get_balance", {}, "c_0_1"),
        ("list_notes", {}, "c_1"),
    ]
    assert invalid == [] and form == "fenced_json"
    assert content == "First the contact.\n\nthen"


def test_the_setting_reaches_the_policy_a_config_builds(scripted_server):
    server = scripted_server()
    config = CoevolveConfig.model_validate(
        {
            "endpoints": {"agent": {"base_url": server.base_url, "model": server.model}},
            "policy": {"kind": "endpoint", "endpoint": "agent", "read_json_calls": True},
        }
    )
    assert build_policy(config).read_json_calls is True
    assert CoevolveConfig().policy.read_json_calls is False  # the bootstrap agent's default
    description = PolicyConfig.model_fields["read_json_calls"].description
    assert "SmolLM2" in description and "unreadable_call" in description
    with pytest.raises((ConfigError, ValueError), match="read_json_calls"):
        CoevolveConfig.model_validate({"policy": {"read_json_calls": "sometimes"}})


def test_the_llm_explorer_reads_a_fenced_json_call(scripted_server):
    """A synthesis role on a larger model behind llama-server: its fenced call is run."""
    task = next(t for t in HELDOUT if t.family == "send_message")
    trajectory = Trajectory(
        id="t/c0/r0", task_id=task.id, env="world", family=task.family, score=0.0
    )
    item = FlaggedTrajectory(
        trajectory=trajectory,
        signals=[
            Signal(
                kind="boundary", trajectory_id=trajectory.id, task_id=task.id, family=task.family
            )
        ],
    )
    name = task.reference_calls[0].arguments["name"]
    server = scripted_server(
        [
            call_reply(ToolCall(name="find_contact", arguments={"name": name}), "fenced_json"),
            Reply.text('```json\n{"name": "send_message", "arguments": {"contact_id": \n```'),
            Reply.text("Done."),
        ]
    )
    explorer = LLMExplorer(chat_model(endpoint(server)), rounds=1, steps=5)
    context = SynthesisContext(summary="s", exploration_objectives=["look the contact up"])
    [exploration] = asyncio.run(explorer.explore(item, task, context, WorldEnvironment))
    [interaction] = exploration.interactions
    assert interaction.call == ToolCall(name="find_contact", arguments={"name": name})
    assert interaction.observation.error is None
    bodies = server.chat_bodies()
    assert len(bodies) == 3  # the unreadable call did not end the round
    tools = [m for m in bodies[2]["messages"] if m["role"] == "tool"]
    assert len(tools) == 2 and tools[1]["content"].startswith("error: the tool call is not valid")


def test_coevolve_eval_reports_the_calls_by_form(scripted_server, tmp_path):
    """`coevolve eval --policy qwen.yaml` on a model that writes fenced JSON calls."""
    server = scripted_server(reference_replies(HELDOUT, call_form="fenced_json"))
    config = tmp_path / "qwen.yaml"
    config.write_text(
        yaml.safe_dump(
            {
                "endpoints": {"qwen": {"base_url": server.base_url, "model": server.model}},
                "policy": {"kind": "endpoint", "endpoint": "qwen", "read_json_calls": True},
            }
        )
    )
    limit = 6

    command = [sys.executable, "-m", "coevolve", "eval", "--env", "world", "--split", "heldout"]
    command += ["--policy", str(config), "--limit", str(limit)]

    def coevolve(*args):
        done = subprocess.run(
            [*command, *args],
            capture_output=True,
            text=True,
            timeout=300,
        )
        assert done.returncode == 0, done.stderr
        return done

    report = json.loads(coevolve("--json").stdout)
    overall = report["overall"]
    calls = sum(len(task.reference_calls) for task in HELDOUT[:limit])
    assert overall["success_rate"] == 1.0 and overall["episodes"] == limit
    assert overall["calls_by_form"] == {f: calls * (f == "fenced_json") for f in CALL_FORMS}
    assert overall["unreadable_calls"] == 0 and overall["call_errors"] == {}
    table = coevolve().stdout
    assert "tool calls by form" in table and "fenced JSON" in table and "unreadable" in table
