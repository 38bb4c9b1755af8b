"""What an endpoint supports is learnt once and remembered: structured output
(``response_format``) in ``agents/roles/llm.py``, and adapter hot-loading (``policy.hot_load``)
in ``graph/cycle/training_step.py``. Against the scripted server over real HTTP; the same
checks against ``transformers serve`` are in test_real_server.py."""

from __future__ import annotations

import asyncio
import logging
from types import SimpleNamespace

import pytest
from langchain_core.messages import HumanMessage
from pydantic import BaseModel

from coevolve.agents.policy.endpoint_policy import EndpointPolicy
from coevolve.agents.policy.policy_interface import PolicyError
from coevolve.agents.roles.llm import (
    ReplyError,
    ReplyTooLongError,
    StructuredOutputError,
    chat_model,
    forget_endpoint_capabilities,
    response_format_support,
    structured_call,
)
from coevolve.config import CoevolveConfig, EndpointConfig
from coevolve.graph.cycle.training_step import use_adapter
from coevolve.testing.openai_server import Reply

LLM_LOGGER = "coevolve.agents.roles"


class Pair(BaseModel):
    a: int
    b: str = ""


@pytest.fixture(autouse=True)
def fresh_capabilities():
    forget_endpoint_capabilities()
    yield
    forget_endpoint_capabilities()


def endpoint(server) -> EndpointConfig:
    return EndpointConfig(base_url=server.base_url, model=server.model, timeout_s=10, max_retries=0)


def ask(model) -> Pair:
    return asyncio.run(structured_call(model, Pair, [HumanMessage("hi")]))


def capability_warnings(caplog) -> list[str]:
    return [r.getMessage() for r in caplog.records if "response_format" in r.getMessage()]


def test_a_refused_response_format_is_remembered_and_logged_once(scripted_server, caplog):
    server = scripted_server([Reply.text('{"a": 1}')], repeat_last=True)
    server.refuse_fields = frozenset({"response_format"})
    model = chat_model(endpoint(server))
    with caplog.at_level(logging.WARNING, logger=LLM_LOGGER):
        assert [ask(model).a for _ in range(3)] == [1, 1, 1]
        # A second chat model of the same endpoint (another role) shares what was learnt.
        assert ask(chat_model(endpoint(server), temperature=0.1)).a == 1
    bodies = server.chat_bodies()
    assert ["response_format" in body for body in bodies] == [True, False, False, False, False]
    assert [r.status for r in server.requests] == [400, 200, 200, 200, 200]
    assert response_format_support(model) == "refused"
    [warning] = capability_warnings(caplog)
    assert f"endpoint {server.base_url} (model {server.model}) does not support" in warning
    assert "roles parse JSON from plain replies" in warning
    assert "400" in warning and "unsupported fields in the request" in warning


def test_an_ignored_response_format_is_remembered(scripted_server, caplog):
    # transformers serve answers 200 and leaves the reply unconstrained.
    server = scripted_server(
        [Reply.text("hello there"), Reply.text('{"a": 2}'), Reply.text('sure: {"a": 3}')]
    )
    model = chat_model(endpoint(server))
    with caplog.at_level(logging.WARNING, logger=LLM_LOGGER):
        assert ask(model).a == 2
        assert ask(model).a == 3
    first, second, third = server.chat_bodies()
    assert "response_format" in first
    assert "response_format" not in second and "response_format" not in third
    assert response_format_support(model) == "ignored"
    [warning] = capability_warnings(caplog)
    assert "ignores response_format" in warning and "'hello there'" in warning


def test_an_honoured_response_format_is_sent_every_time(scripted_server, caplog):
    server = scripted_server([Reply.json_content({"a": 4})], repeat_last=True)
    model = chat_model(endpoint(server))
    with caplog.at_level(logging.WARNING, logger=LLM_LOGGER):
        assert [ask(model).a for _ in range(3)] == [4, 4, 4]
    assert all("response_format" in body for body in server.chat_bodies())
    assert response_format_support(model) is None and not capability_warnings(caplog)


@pytest.mark.parametrize(
    "script",
    [
        # Refused with and without response_format (a prompt too long for the context):
        # the refusal says nothing about response_format.
        [Reply.status(400, "too long"), Reply.status(400, "too long")],
        # A guided decoder's whitespace, then no object: no proof the schema was ignored.
        [Reply.text("  \n"), Reply.text("no")],
        # A truncated object: what an enforcing server sends when max_tokens cuts it off.
        [Reply.text('{"a": ', finish_reason="length"), Reply.text("no")],
        # Server errors and broken bodies are not refusals.
        [Reply.status(500, "down"), Reply.text("no")],
        [Reply.malformed(), Reply.text("no")],
    ],
    ids=["refused-both", "whitespace", "truncated", "server-error", "malformed"],
)
def test_no_capability_is_learnt_without_evidence(scripted_server, script):
    server = scripted_server(script)
    model = chat_model(endpoint(server))
    with pytest.raises((StructuredOutputError, ReplyError)):
        ask(model)
    assert response_format_support(model) is None


def test_capabilities_are_per_endpoint(scripted_server):
    refusing = scripted_server([Reply.text('{"a": 5}')], repeat_last=True)
    refusing.refuse_fields = frozenset({"response_format"})
    honouring = scripted_server([Reply.json_content({"a": 6})], repeat_last=True)
    assert ask(chat_model(endpoint(refusing))).a == 5
    assert ask(chat_model(endpoint(honouring))).a == 6
    assert response_format_support(chat_model(endpoint(refusing))) == "refused"
    assert response_format_support(chat_model(endpoint(honouring))) is None
    assert all("response_format" in body for body in honouring.chat_bodies())


# --------------------------------------------------------------------------- hot-loading


def adapter_runtime(server, hot_load: str) -> SimpleNamespace:
    """What ``use_adapter`` reads of a cycle's runtime: the config and the policy."""
    config = CoevolveConfig.model_validate(
        {
            "endpoints": {"agent": {"base_url": server.base_url, "model": server.model}},
            "policy": {"kind": "endpoint", "endpoint": "agent", "hot_load": hot_load},
        }
    )
    return SimpleNamespace(config=config, policy=EndpointPolicy(config.endpoint("agent")))


def load(rt: SimpleNamespace, adapter: str) -> None:
    asyncio.run(use_adapter(rt, adapter))  # type: ignore[arg-type]


def test_hot_load_required_stops_on_a_refusal_and_names_the_switch(scripted_server, tmp_path):
    server = scripted_server()
    server.refuse_adapters = (404, "Not Found")  # vLLM without runtime LoRA updating
    rt = adapter_runtime(server, "required")
    with pytest.raises(PolicyError, match=r"HTTP 404.*set policy.hot_load: best_effort"):
        load(rt, str(tmp_path / "cycle-1"))


def test_hot_load_best_effort_keeps_the_base_model_with_a_warning(
    scripted_server, tmp_path, caplog
):
    server = scripted_server()
    server.refuse_adapters = (404, "Not Found")
    rt = adapter_runtime(server, "best_effort")
    with caplog.at_level(logging.WARNING, logger="coevolve.graph.cycle.training_step"):
        load(rt, str(tmp_path / "cycle-1"))
    [warning] = [r.getMessage() for r in caplog.records]
    assert "could not hot-load the adapter" in warning and "HTTP 404" in warning
    assert f"keeps serving {server.model}" in warning
    assert rt.policy.endpoint.model == server.model  # requests still name the base model

    server.refuse_adapters = None  # a server that can load: best_effort loads
    load(rt, str(tmp_path / "cycle-2"))
    assert rt.policy.endpoint.model == f"{server.model}-coevolve-cycle-2"


def test_hot_load_best_effort_still_stops_when_a_server_with_the_api_fails_to_load(
    scripted_server, tmp_path
):
    # The API is there but the load failed (here: a path the server cannot read): going on
    # would measure the base model while the user believes the adapter is served.
    server = scripted_server()
    server.refuse_adapters = (400, "Bad Request")
    rt = adapter_runtime(server, "best_effort")
    with pytest.raises(PolicyError, match=r"HTTP 400") as info:
        load(rt, str(tmp_path / "cycle-1"))
    assert "best_effort" not in str(info.value)
    assert rt.policy.endpoint.model == server.model


def test_hot_load_off_makes_no_request(scripted_server, tmp_path):
    server = scripted_server()
    rt = adapter_runtime(server, "off")
    load(rt, str(tmp_path / "cycle-1"))
    assert not server.requests and rt.policy.endpoint.model == server.model


def test_a_reply_cut_off_by_max_tokens_is_read_not_raised(scripted_server):
    # With response_format the openai SDK raises LengthFinishReasonError on such a reply;
    # transformers serve ends most replies of a small max_tokens that way.
    server = scripted_server([Reply.text('{"a": 7}', finish_reason="length")], repeat_last=True)
    assert ask(chat_model(endpoint(server))).a == 7
    # A plain ChatOpenAI (a model a user injects) goes through the SDK's parse, which raises.
    from langchain_openai import ChatOpenAI

    plain = ChatOpenAI(base_url=server.base_url, model=server.model, api_key="EMPTY")
    assert ask(plain).a == 7
    server = scripted_server([Reply.text("x" * 100, finish_reason="length")])
    short = endpoint(server).model_copy(update={"max_reply_chars": 50})
    with pytest.raises(ReplyTooLongError, match="reply too long: 100 characters"):
        ask(chat_model(short))
    assert len(server.chat_bodies()) == 1  # no second request of a server that runs long


def test_a_server_that_honours_only_max_tokens_and_refuses_json_schema_with_a_500(
    scripted_server, caplog
):
    """What a real server did: replies ran to thousands of tokens because the limit came as
    max_completion_tokens, and json_schema got HTTP 500 on every call. The limit now goes
    as max_tokens, and the 500 naming response_format is learnt once, without retries."""

    def script(body):
        if (body.get("response_format") or {}).get("type") == "json_schema":
            return Reply.status(500, "Unknown response_format type: json_schema")
        limit = body.get("max_tokens")  # max_completion_tokens means nothing to this server
        return Reply.text('{"a": 7}' if limit is not None else '{"a": 7, "b": "' + "x" * 5000)

    server = scripted_server(script)
    model = chat_model(
        EndpointConfig(base_url=server.base_url, model=server.model, timeout_s=10, max_retries=3)
    )
    with caplog.at_level(logging.WARNING, logger=LLM_LOGGER):
        assert [ask(model).a for _ in range(3)] == [7, 7, 7]
    bodies = server.chat_bodies()
    assert len(bodies) == 4  # one refused structured request, then plain requests only
    assert sum("response_format" in body for body in bodies) == 1
    assert all(body["max_tokens"] == 512 and "max_completion_tokens" not in body for body in bodies)
    assert response_format_support(model) == "refused" and len(capability_warnings(caplog)) == 1

    # OpenAI's reasoning models refuse max_tokens: the other name, never both.
    server = scripted_server([Reply.json_content({"a": 1})])
    other = EndpointConfig(
        base_url=server.base_url, model=server.model, length_field="max_completion_tokens"
    )
    assert ask(chat_model(other)).a == 1
    [body] = server.chat_bodies()
    assert body["max_completion_tokens"] == 512 and "max_tokens" not in body


def test_the_roles_send_on_the_projects_http_client(scripted_server):
    """The roles' chat model is a LangChain chat model of our own (no subclass of
    ChatOpenAI, no openai SDK on the way) sending on the endpoint policy's HTTP client
    (common/http.py); the key and content type go with every request."""
    from langchain_openai import ChatOpenAI

    from coevolve.agents.roles.chat_endpoint import EndpointChatModel
    from coevolve.common.http import HttpClient

    server = scripted_server([Reply.json_content({"a": 7, "b": "x"})], repeat_last=True)
    model = chat_model(endpoint(server))
    assert isinstance(model, EndpointChatModel) and not isinstance(model, ChatOpenAI)

    async def twice():
        first = await structured_call(model, Pair, [HumanMessage("hi")])
        second = await structured_call(model, Pair, [HumanMessage("again")])
        return first, second

    first, second = asyncio.run(twice())
    assert (first.a, second.b) == (7, "x")
    assert isinstance(model._client(), HttpClient)
    last = server.requests[-1]
    assert last.body["messages"][-1]["content"] == "again"
    assert last.headers.get("Authorization") == "Bearer EMPTY"
    assert last.headers.get("Content-Type") == "application/json"


def test_chat_completions_skip_the_sdk_but_keep_its_errors(scripted_server):
    """A chat completion is posted as the chat model builds it, tools bound included,
    without the openai SDK (its per-call transform cost most of the synthesis graph's
    client CPU); an error status still raises the openai SDK's class for it, with the
    server's message, so the reply boundary reads it as it reads a ChatOpenAI's."""
    import openai
    from langchain_core.tools import tool

    from coevolve.agents.roles.replies import ask as ask_once

    @tool
    def send_message(to: str, text: str) -> str:
        """Send a text message."""
        return "sent"

    server = scripted_server(
        [
            Reply.tool_calls([("send_message", {"to": "Bo", "text": "hi"})]),
            Reply.text("fine"),
            Reply.status(429, "slow down"),
            Reply.status(404, "no such model"),
        ]
    )
    model = chat_model(endpoint(server))
    bound = model.bind_tools([send_message])
    reply = asyncio.run(ask_once(bound, [HumanMessage("text Bo hi")], model=model))
    assert reply.tool_calls[0]["args"] == {"to": "Bo", "text": "hi"}
    body = server.chat_bodies()[0]
    assert body["tools"][0]["function"]["name"] == "send_message"
    assert body["max_tokens"] == 512 and "stream" not in body

    # A server's own parameters (extra_body) are merged into the body.
    with_extra = model.model_copy(update={"extra_body": {"top_k": 5}})
    assert asyncio.run(ask_once(with_extra, [HumanMessage("hi")])).content == "fine"
    assert server.chat_bodies()[-1]["top_k"] == 5

    expected = [(429, openai.RateLimitError, "slow down"), (404, openai.NotFoundError, "no such")]
    for status, cls, message in expected:
        with pytest.raises(ReplyError) as caught:
            asyncio.run(ask_once(model, [HumanMessage("hi")]))
        assert caught.value.kind == "status" and type(caught.value.cause) is cls
        assert caught.value.cause.status_code == status and message in str(caught.value)
