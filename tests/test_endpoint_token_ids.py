"""Token ids and log-probs from an endpoint (vLLM's return_token_ids and logprobs), over
real HTTP against the scripted server."""

from __future__ import annotations

import asyncio
import json

from coevolve.agents.policy.endpoint_policy import EndpointPolicy
from coevolve.agents.policy.policy_interface import AssistantMessage
from coevolve.config import EndpointConfig
from coevolve.testing.openai_script import count_tokens, fake_logprob, fake_token_ids, message_text
from coevolve.testing.openai_server import Reply

CONVERSATION = [
    {"role": "system", "content": "You are an assistant."},
    {"role": "user", "content": "What is Ana's number?"},
]


def generate(server, **endpoint_options) -> AssistantMessage:
    endpoint = EndpointConfig(
        base_url=server.base_url, model=server.model, timeout_s=5.0, **endpoint_options
    )
    policy = EndpointPolicy(endpoint, retry_base_s=0.01, retry_max_s=0.05)

    async def run():
        try:
            return await policy.generate([CONVERSATION], [[]])
        finally:
            await policy.aclose()

    [message] = asyncio.run(run())
    return message


def test_token_ids_and_logprobs_land_on_the_message(scripted_server):
    server = scripted_server([Reply.text("Ana's number is 555-0192")])
    message = generate(server, return_token_ids=True)
    assert message.error is None and message.content == "Ana's number is 555-0192"
    [body] = server.chat_bodies()
    assert body["return_token_ids"] is True and body["logprobs"] is True

    prompt_text = " ".join(message_text(m) for m in CONVERSATION)
    assert message.prompt_token_ids == fake_token_ids(prompt_text)
    assert message.completion_token_ids == fake_token_ids("Ana's number is 555-0192")
    assert message.completion_logprobs == [
        fake_logprob(token_id) for token_id in message.completion_token_ids
    ]
    # As many ids as the usage counts, as with vLLM.
    assert len(message.prompt_token_ids) == message.prompt_tokens == count_tokens(prompt_text)
    assert len(message.completion_token_ids) == message.completion_tokens == 4


def test_token_ids_come_with_tool_calls_too(scripted_server):
    server = scripted_server([Reply.tool_calls([("find_contact", {"name": "Ana"})])])
    message = generate(server, return_token_ids=True)
    assert [call.name for call in message.tool_calls] == ["find_contact"]
    assert message.completion_token_ids and message.completion_logprobs
    assert len(message.completion_token_ids) == len(message.completion_logprobs)


def test_without_the_flag_nothing_is_requested_and_nothing_is_set(scripted_server):
    server = scripted_server(["hello"])
    message = generate(server)
    [body] = server.chat_bodies()
    assert "return_token_ids" not in body and "logprobs" not in body
    assert message.content == "hello"
    assert message.prompt_token_ids is None
    assert message.completion_token_ids is None
    assert message.completion_logprobs is None


def completion_body(**extra_choice) -> str:
    """A chat completion written out, as a server other than the scripted one answers."""
    choice = {"index": 0, "message": {"role": "assistant", "content": "hello"}}
    choice["finish_reason"] = "stop"
    choice.update(extra_choice)
    usage = {"prompt_tokens": 3, "completion_tokens": 1, "total_tokens": 4}
    return json.dumps({"object": "chat.completion", "choices": [choice], "usage": usage})


def test_a_server_that_ignores_the_request_leaves_them_none(scripted_server):
    # A hosted API without vLLM's extension answers a plain completion.
    server = scripted_server([Reply(raw_body=completion_body(logprobs=None))])
    message = generate(server, return_token_ids=True)
    assert message.content == "hello" and message.error is None
    assert message.prompt_token_ids is None and message.completion_token_ids is None
    assert message.completion_logprobs is None


def test_ids_that_are_not_lists_of_numbers_are_dropped_not_trusted(scripted_server):
    broken = completion_body(
        token_ids=[1, "2"], logprobs={"content": [{"token": "hello", "logprob": "low"}]}
    )
    server = scripted_server(
        [Reply(raw_body=broken.replace('"object"', '"prompt_token_ids": 7, "object"'))]
    )
    message = generate(server, return_token_ids=True)
    assert message.content == "hello" and message.error is None
    assert message.prompt_token_ids is None and message.completion_token_ids is None
    assert message.completion_logprobs is None
