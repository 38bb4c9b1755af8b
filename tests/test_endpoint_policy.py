"""EndpointPolicy against the scripted server, over real HTTP."""

from __future__ import annotations

import asyncio

import pytest

from coevolve.agents.policy.endpoint_policy import EndpointPolicy
from coevolve.agents.policy.policy_interface import AssistantMessage, Policy, PolicyError
from coevolve.config import ConfigError, EndpointConfig
from coevolve.records import ToolCall
from coevolve.testing.openai_server import Reply

CONVERSATION = [
    {"role": "system", "content": "You are an assistant."},
    {"role": "user", "content": "What is Ana's number?"},
]
TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "find_contact",
            "description": "Find a contact by name.",
            "parameters": {"type": "object", "properties": {"name": {"type": "string"}}},
        },
    }
]


def make_policy(server, **endpoint_options) -> EndpointPolicy:
    options = {"base_url": server.base_url, "model": server.model, "timeout_s": 5.0}
    options.update(endpoint_options)
    return EndpointPolicy(EndpointConfig(**options), retry_base_s=0.01, retry_max_s=0.05)


def generate(policy: EndpointPolicy, n: int = 1, tools=(), **kwargs) -> list[AssistantMessage]:
    async def run():
        try:
            return await policy.generate([CONVERSATION] * n, [list(tools)] * n, **kwargs)
        finally:
            await policy.aclose()

    return asyncio.run(run())


def test_it_is_a_policy(scripted_server):
    policy = make_policy(scripted_server())
    assert isinstance(policy, Policy)
    assert policy.version == policy.endpoint.model
    assert EndpointPolicy(policy.endpoint, version="cycle-3").version == "cycle-3"


def test_tool_calls_are_parsed_with_the_server_ids(scripted_server):
    server = scripted_server([Reply.tool_calls([("find_contact", {"name": "Ana"})])])
    [message] = generate(make_policy(server), tools=TOOLS)
    assert message.error is None
    assert message.tool_calls == [
        ToolCall(name="find_contact", arguments={"name": "Ana"}, id=message.tool_calls[0].id)
    ]
    sent_id = message.tool_calls[0].id
    assert sent_id and sent_id.startswith("call_")
    assert message.finish_reason == "tool_calls"
    assert message.prompt_tokens > 0 and message.completion_tokens > 0
    assert message.to_openai()["tool_calls"][0]["id"] == sent_id


def test_text_answer(scripted_server):
    server = scripted_server([Reply.text("Ana's number is 555-0192.")])
    [message] = generate(make_policy(server))
    assert message.content == "Ana's number is 555-0192."
    assert message.is_final and message.finish_reason == "stop" and message.error is None
    assert message.completion_tokens == 4


def test_bad_json_arguments_become_invalid_tool_calls(scripted_server):
    server = scripted_server(
        [Reply.tool_calls([("find_contact", '{"name": "Ana"'), ("list_notes", "{}")])]
    )
    [message] = generate(make_policy(server), tools=TOOLS)
    assert [call.name for call in message.tool_calls] == ["list_notes"]
    [bad] = message.invalid_tool_calls
    assert (bad.name, bad.raw, bad.error) == ("find_contact", '{"name": "Ana"', "bad_json")
    assert bad.id.startswith("call_") and "not valid JSON" in bad.message
    assert not message.is_final
    assert message.to_openai()["tool_calls"][1]["function"]["arguments"] == '{"name": "Ana"'


def test_a_call_without_a_name_goes_back_as_text(scripted_server):
    server = scripted_server([Reply.tool_calls([("", {"name": "Ana"})], content="Trying.")])
    [message] = generate(make_policy(server), tools=TOOLS)
    [bad] = message.invalid_tool_calls
    assert bad.name is None and bad.error == "parse_error"
    # The conversation cannot carry a nameless tool call; the attempt goes back as text.
    replay = message.to_openai()
    assert "tool_calls" not in replay
    assert replay["content"].startswith("Trying.") and '"Ana"' in replay["content"]


def test_tool_calls_in_the_content_are_parsed(scripted_server):
    text = 'Looking.\n<tool_call>{"name": "find_contact", "arguments": {"name": "Ana"}}</tool_call>'
    server = scripted_server([Reply.text(text)])
    [message] = generate(make_policy(server), tools=TOOLS)
    assert message.content == "Looking."
    assert [(c.name, c.arguments) for c in message.tool_calls] == [
        ("find_contact", {"name": "Ana"})
    ]
    assert message.raw == text


def test_plain_call_lines_in_the_content_are_parsed_and_prose_stays_the_answer(scripted_server):
    """What a server without a tool parser returns for the bootstrap agent's format."""
    server = scripted_server([Reply.text('find_contact(name="Ana")'), Reply.text("Done.")])
    policy = make_policy(server)
    [call] = generate(policy, tools=TOOLS)
    assert [(c.name, c.arguments) for c in call.tool_calls] == [("find_contact", {"name": "Ana"})]
    [answer] = generate(policy, tools=TOOLS)
    assert answer.tool_calls == [] and answer.content == "Done."


def test_temperature_tools_and_max_tokens_are_sent(scripted_server):
    server = scripted_server(["a", "b", "c"])
    policy = make_policy(server, temperature=0.3, max_tokens=77)
    generate(policy, tools=TOOLS)
    generate(policy, tools=TOOLS, temperature=0.9)
    generate(EndpointPolicy(policy.endpoint, tools_in_request=False), tools=TOOLS)
    first, second, third = server.chat_bodies()
    assert first["temperature"] == 0.3 and first["max_tokens"] == 77
    assert first["tools"] == TOOLS and first["messages"] == CONVERSATION
    assert first["model"] == server.model
    assert second["temperature"] == 0.9
    assert "tools" not in third


def test_a_tool_list_sent_again_or_replaced_arrives_as_it_is_now(scripted_server):
    """Tool lists' JSON is reused per list object: the same list sent again, a new list,
    and a list that grew in place each reach the server as they are at the send."""
    server = scripted_server(["a", "b", "c", "d"])
    policy = make_policy(server)
    shared = list(TOOLS)
    other = [{**TOOLS[0], "function": {**TOOLS[0]["function"], "name": "call_contact"}}]

    async def run():
        try:
            await policy.generate([CONVERSATION, CONVERSATION], [shared, shared])
            await policy.generate([CONVERSATION], [other])
            shared.append(other[0])
            await policy.generate([CONVERSATION], [shared])
        finally:
            await policy.aclose()

    asyncio.run(run())
    bodies = server.chat_bodies()
    assert [b["tools"] for b in bodies] == [TOOLS, TOOLS, other, TOOLS + other]
    assert all(b["messages"] == CONVERSATION and b["model"] == server.model for b in bodies)


def test_no_tools_key_when_there_are_no_tools(scripted_server):
    server = scripted_server(["a"])
    generate(make_policy(server))
    assert "tools" not in server.chat_bodies()[0]


def test_retries_5xx_malformed_and_dropped_then_succeeds(scripted_server):
    server = scripted_server(
        [
            Reply.status(500),
            Reply.status(503),
            Reply.status(429),
            Reply.malformed("{not json"),
            Reply.malformed('{"object": "chat.completion", "choices": []}'),
            Reply.drop(),
            Reply.text("made it"),
        ]
    )
    [message] = generate(make_policy(server, max_retries=6))
    assert message.error is None and message.content == "made it"
    assert len(server.chat_bodies()) == 7


def test_retries_timeouts(scripted_server):
    server = scripted_server([Reply.delay(1.0), Reply.text("on time")])
    [message] = generate(make_policy(server, timeout_s=0.3, max_retries=1))
    assert message.error is None and message.content == "on time"
    assert len(server.chat_bodies()) == 2


def test_retry_after_is_honoured(scripted_server):
    server = scripted_server([Reply.status(429, headers={"Retry-After": "0.3"}), Reply.text("ok")])
    endpoint = make_policy(server, max_retries=1).endpoint
    policy = EndpointPolicy(endpoint, retry_base_s=0.01, retry_max_s=1.0)
    [message] = generate(policy)
    assert message.content == "ok"
    first, second = server.requests
    assert second.time - first.time >= 0.25  # the backoff alone would be ~0.01 s


def test_client_errors_other_than_408_and_429_are_not_retried(scripted_server):
    server = scripted_server([Reply.status(400, "context too long"), Reply.text("unused")])
    [message] = generate(make_policy(server, max_retries=3))
    assert message.error is not None
    assert "HTTP 400" in message.error and "context too long" in message.error
    assert len(server.chat_bodies()) == 1


def test_a_failing_conversation_does_not_spoil_the_batch(scripted_server):
    def script(body):
        # The conversation that says "doomed" always fails; the others succeed.
        if body["messages"][-1]["content"] == "doomed":
            return Reply.status(502, "bad gateway")
        return Reply.text("fine")

    server = scripted_server(script)
    policy = make_policy(server, max_retries=2)
    doomed = [{"role": "user", "content": "doomed"}]

    async def run():
        try:
            return await policy.generate([CONVERSATION, doomed, CONVERSATION], [[], [], []])
        finally:
            await policy.aclose()

    ok1, failed, ok2 = asyncio.run(run())
    assert ok1.content == ok2.content == "fine" and ok1.error is None and ok2.error is None
    assert failed.error is not None
    assert server.base_url in failed.error and repr(server.model) in failed.error
    assert "after 3 attempts" in failed.error and "HTTP 502: bad gateway" in failed.error
    assert len(server.chat_bodies()) == 2 + 3


def test_timeouts_exhaust_the_budget_with_a_clear_error(scripted_server):
    server = scripted_server([Reply.delay(1.0)], repeat_last=True)
    [message] = generate(make_policy(server, timeout_s=0.2, max_retries=1))
    assert message.error is not None
    assert "after 2 attempts" in message.error and "timed out after 0.2 s" in message.error
    assert len(server.chat_bodies()) == 2


def test_unknown_model_is_a_policy_error_naming_url_and_model(scripted_server):
    server = scripted_server(["unused"])
    policy = make_policy(server, model="qwen-typo", max_retries=3)
    with pytest.raises(PolicyError) as caught:
        generate(policy, n=3)
    message = str(caught.value)
    assert server.base_url in message and "qwen-typo" in message
    assert "404" in message and f"serves: {server.model}" in message and "/v1" in message
    assert len(server.chat_bodies()) == 3  # one try each, no retries


def test_refused_key_is_a_policy_error_saying_what_to_set(scripted_server, monkeypatch):
    server = scripted_server(["unused"], api_key="right")
    monkeypatch.setenv("COEVOLVE_TEST_KEY", "wrong")
    with pytest.raises(PolicyError) as caught:
        generate(make_policy(server, api_key_env="COEVOLVE_TEST_KEY"))
    message = str(caught.value)
    assert "401" in message and server.base_url in message and "COEVOLVE_TEST_KEY" in message

    monkeypatch.setenv("COEVOLVE_TEST_KEY", "right")
    [answer] = generate(make_policy(server, api_key_env="COEVOLVE_TEST_KEY"))
    assert answer.content == "unused"


def test_a_missing_key_variable_fails_at_construction(scripted_server, monkeypatch):
    monkeypatch.delenv("COEVOLVE_TEST_KEY", raising=False)
    with pytest.raises(ConfigError, match="COEVOLVE_TEST_KEY"):
        make_policy(scripted_server(), api_key_env="COEVOLVE_TEST_KEY")


def test_concurrency_limit_is_respected(scripted_server):
    server = scripted_server(delay_s=0.05)
    [*messages] = generate(make_policy(server, concurrency=3), n=12)
    assert all(m.error is None for m in messages)
    assert len(server.chat_bodies()) == 12
    assert 2 <= server.max_in_flight <= 3


def test_batch_runs_concurrently(scripted_server):
    server = scripted_server(delay_s=0.05)
    messages = generate(make_policy(server, concurrency=32), n=32)
    assert all(m.error is None for m in messages)
    assert server.max_in_flight >= 4


def test_the_same_policy_works_across_event_loops(scripted_server):
    server = scripted_server(["one", "two"])
    policy = make_policy(server)

    def run_once():
        return asyncio.run(policy.generate([CONVERSATION], [[]]))

    assert run_once()[0].content == "one"
    # A fresh loop (e.g. a sync caller using asyncio.run per step) gets a fresh client.
    assert run_once()[0].content == "two"
    asyncio.run(policy.aclose())


def test_mismatched_tools_are_a_caller_error(scripted_server):
    policy = make_policy(scripted_server())
    with pytest.raises(ValueError, match="one tool list per conversation"):
        asyncio.run(policy.generate([CONVERSATION, CONVERSATION], [[]]))


def test_importing_the_module_does_not_import_openai():
    # A fresh interpreter: this test process has imported openai already.
    import subprocess
    import sys

    code = (
        "import sys, coevolve.agents.policy.endpoint_policy; "
        "assert 'openai' not in sys.modules, 'openai imported eagerly'"
    )
    subprocess.run([sys.executable, "-c", code], check=True)


def test_hot_loading_an_adapter_loads_the_new_then_unloads_the_old(scripted_server):
    server = scripted_server([Reply.text("hi")] * 3)
    policy = make_policy(server)

    async def cycle():
        try:
            await policy.load_adapter("base-coevolve-cycle-1", "/runs/a/adapters/cycle-1")
            first = await policy.generate([CONVERSATION], [[]])
            await policy.load_adapter("base-coevolve-cycle-2", "/runs/a/adapters/cycle-2")
            second = await policy.generate([CONVERSATION], [[]])
            return first, second
        finally:
            await policy.aclose()

    first, second = asyncio.run(cycle())
    assert first[0].content == second[0].content == "hi"
    routes = [(r.path, r.body.get("lora_name"), r.body.get("model")) for r in server.requests]
    assert routes == [
        ("/v1/load_lora_adapter", "base-coevolve-cycle-1", None),
        ("/v1/chat/completions", None, "base-coevolve-cycle-1"),
        ("/v1/load_lora_adapter", "base-coevolve-cycle-2", None),
        ("/v1/unload_lora_adapter", "base-coevolve-cycle-1", None),
        ("/v1/chat/completions", None, "base-coevolve-cycle-2"),
    ]
    assert server.loaded_adapters == {"base-coevolve-cycle-2": "/runs/a/adapters/cycle-2"}
    assert policy.version == "base-coevolve-cycle-2"


def test_hot_loading_an_adapter_the_server_still_holds_is_fine(scripted_server):
    server = scripted_server([Reply.text("hi")])
    first, resumed = make_policy(server), make_policy(server)  # a resumed run: a new process

    async def load(policy):
        try:
            await policy.load_adapter("a-cycle-1", "/x")
        finally:
            await policy.aclose()

    asyncio.run(load(first))
    asyncio.run(load(resumed))
    assert resumed.version == "a-cycle-1"
    assert server.loaded_adapters == {"a-cycle-1": "/x"}


def test_hot_loading_without_a_server_is_a_clear_error():
    policy = EndpointPolicy(
        EndpointConfig(base_url="http://127.0.0.1:9/v1", model="m", timeout_s=2)
    )

    async def load():
        try:
            await policy.load_adapter("a", "/x")
        finally:
            await policy.aclose()

    with pytest.raises(PolicyError, match="load_lora_adapter failed"):
        asyncio.run(load())


def test_each_reply_is_handed_over_as_it_arrives(scripted_server):
    """on_reply sees a fast reply before a slow one has come back, each reply once, the
    same messages generate returns, failures included (the engine steps episodes then)."""

    def script(body):
        question = body["messages"][-1]["content"]
        if question == "slow":
            return Reply.text("late").delayed(0.4)
        if question == "broken":
            return Reply.status(400, "bad request")
        return Reply.text("early")

    server = scripted_server(script)
    policy = make_policy(server, max_retries=0)
    conversations = [[{"role": "user", "content": q}] for q in ("slow", "fast", "broken")]
    seen = []

    async def run():
        try:
            return await policy.generate(
                conversations,
                [[]] * 3,
                on_reply=lambda index, message: seen.append((index, message)),
            )
        finally:
            await policy.aclose()

    messages = asyncio.run(run())
    assert [m.content for m in messages[:2]] == ["late", "early"] and messages[2].error
    assert [index for index, _ in seen][-1] == 0  # the slow one last
    assert sorted(seen, key=lambda pair: pair[0]) == list(enumerate(messages))


def test_an_on_reply_error_is_raised_after_every_request_ended(scripted_server):
    server = scripted_server(lambda body: Reply.text("ok"))
    policy = make_policy(server)
    seen = []

    def on_reply(index, message):
        seen.append(index)
        if index == 0:
            raise ZeroDivisionError("a bug in the caller")

    async def run():
        try:
            return await policy.generate([CONVERSATION] * 4, [[]] * 4, on_reply=on_reply)
        finally:
            await policy.aclose()

    with pytest.raises(ZeroDivisionError):
        asyncio.run(run())
    assert sorted(seen) == [0, 1, 2, 3]
