"""One retry policy for the policy, the roles and the embeddings (common/retry.py): backoff
with jitter from the endpoint's settings, a server's Retry-After honoured, 408, 429, 5xx and
transport errors retried and nothing else."""

from __future__ import annotations

import asyncio
import time

import pytest
from langchain_core.messages import HumanMessage

from coevolve.agents.config import EndpointConfig
from coevolve.common.retry import RetryPolicy, asked_wait_s, retryable_status
from coevolve.testing.openai_script import Reply


def test_which_statuses_are_retried_and_how_long_the_wait_is():
    assert [s for s in (400, 401, 404, 408, 409, 422, 429, 500, 503) if retryable_status(s)] == [
        408,
        429,
        500,
        503,
    ]
    policy = RetryPolicy(max_retries=5, retry_base_s=0.1, retry_max_s=1.0)
    for failed, most in [(1, 0.15), (2, 0.3), (3, 0.6), (4, 1.5), (8, 1.5)]:
        assert 0.5 * min(1.0, 0.1 * 2 ** (failed - 1)) <= policy.delay(failed) <= most

    class Asked(Exception):
        retry_after_s = 0.8

    assert policy.delay(1, Asked()) >= 0.8  # the server's Retry-After, up to retry_max_s
    Asked.retry_after_s = 30.0
    assert policy.delay(1, Asked()) == 1.0
    assert RetryPolicy.of(EndpointConfig(base_url="http://x/v1", model="m", max_retries=1)) == (
        RetryPolicy(1, 0.2, 5.0)
    )
    assert asked_wait_s(None) is None


def test_a_role_honours_retry_after_and_gives_up_on_a_4xx(scripted_server):
    from coevolve.agents.roles.llm import chat_model
    from coevolve.agents.roles.replies import ReplyError, ask

    server = scripted_server([Reply.status(429, headers={"Retry-After": "0.4"}), Reply.text("ok")])
    endpoint = EndpointConfig(
        base_url=server.base_url,
        model=server.model,
        max_retries=2,
        retry_base_s=0.01,
        retry_max_s=1.0,
    )
    started = time.perf_counter()
    reply = asyncio.run(ask(chat_model(endpoint), [HumanMessage("hi")]))
    assert reply.content == "ok" and time.perf_counter() - started >= 0.4
    refused = scripted_server([Reply.status(400), Reply.text("never asked")])
    endpoint = endpoint.model_copy(update={"base_url": refused.base_url})
    with pytest.raises(ReplyError):
        asyncio.run(ask(chat_model(endpoint), [HumanMessage("hi")]))
    assert len(refused.requests) == 1
