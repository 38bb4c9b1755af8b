"""The scripted OpenAI-compatible test server, over real HTTP."""

from __future__ import annotations

import asyncio
import contextlib
import json
import math
import time
from typing import Any

import httpx
import openai
import pytest

from coevolve.testing.openai_server import Reply, ScriptedOpenAIServer, hash_embedding

USER: Any = [{"role": "user", "content": "find Ana please"}]
# One client for the module: building a client per request costs more than the request.
HTTP = httpx.Client(timeout=5.0)


def chat(server: ScriptedOpenAIServer, timeout: float = 5.0, **body) -> httpx.Response:
    payload = {"model": server.model, "messages": USER, **body}
    return HTTP.post(f"{server.base_url}/chat/completions", json=payload, timeout=timeout)


def cosine(a: list[float], b: list[float]) -> float:
    return sum(x * y for x, y in zip(a, b, strict=True))


def test_text_reply_has_the_chat_completion_shape(scripted_server):
    server = scripted_server([Reply.text("hello there")])
    body = chat(server).json()
    assert body["object"] == "chat.completion"
    assert body["model"] == server.model
    choice = body["choices"][0]
    assert choice["message"] == {"role": "assistant", "content": "hello there"}
    assert choice["finish_reason"] == "stop"
    assert body["usage"] == {"prompt_tokens": 3, "completion_tokens": 2, "total_tokens": 5}


def test_tool_call_reply_has_unique_ids_and_json_arguments(scripted_server):
    server = scripted_server(
        [Reply.tool_calls([("find_contact", {"name": "Ana"}), ("list_notes", {})])] * 2
    )
    first, second = (chat(server).json()["choices"][0] for _ in range(2))
    assert first["finish_reason"] == "tool_calls"
    calls = first["message"]["tool_calls"]
    assert [c["function"]["name"] for c in calls] == ["find_contact", "list_notes"]
    assert json.loads(calls[0]["function"]["arguments"]) == {"name": "Ana"}
    assert all(c["type"] == "function" for c in calls)
    ids = [c["id"] for c in calls + second["message"]["tool_calls"]]
    assert len(set(ids)) == 4


def test_raw_argument_string_is_sent_verbatim(scripted_server):
    server = scripted_server([Reply.tool_calls([("find_contact", '{"name": "Ana"')])])
    call = chat(server).json()["choices"][0]["message"]["tool_calls"][0]
    assert call["function"]["arguments"] == '{"name": "Ana"'


def test_json_content_and_the_openai_client(scripted_server):
    server = scripted_server([Reply.json_content({"summary": "ok", "focus": ["a"]})])
    client = openai.OpenAI(base_url=server.base_url, api_key="EMPTY", max_retries=0)
    completion = client.chat.completions.create(
        model=server.model,
        messages=USER,
        response_format={"type": "json_object"},
        temperature=0.2,
        max_tokens=64,
        tools=[{"type": "function", "function": {"name": "f", "parameters": {}}}],
        tool_choice="auto",
    )
    content = completion.choices[0].message.content or ""
    assert json.loads(content) == {"summary": "ok", "focus": ["a"]}
    request = server.requests[0]
    assert request.path == "/v1/chat/completions" and request.method == "POST"
    assert request.status == 200
    assert request.body["response_format"] == {"type": "json_object"}
    assert request.body["temperature"] == 0.2 and request.body["max_tokens"] == 64
    assert request.body["tools"][0]["function"]["name"] == "f"
    assert request.body["tool_choice"] == "auto"
    assert server.chat_bodies() == [request.body]


def test_callable_script_sees_the_request(scripted_server):
    server = scripted_server(lambda body: f"{len(body['messages'])} messages")
    assert chat(server).json()["choices"][0]["message"]["content"] == "1 messages"


def test_default_script_echoes_the_last_user_message(scripted_server):
    server = scripted_server()
    assert chat(server).json()["choices"][0]["message"]["content"] == "find Ana please"


def test_exhausted_script_answers_500_and_notes_it(scripted_server):
    server = scripted_server(["only one"])
    assert chat(server).status_code == 200
    response = chat(server)
    assert response.status_code == 500
    assert "script exhausted after 1 replies" in response.json()["error"]["message"]
    assert server.requests[-1].note == "script exhausted after 1 replies"


def test_repeat_last(scripted_server):
    server = scripted_server(["a", "b"], repeat_last=True)
    contents = [chat(server).json()["choices"][0]["message"]["content"] for _ in range(4)]
    assert contents == ["a", "b", "b", "b"]


def test_a_failing_script_callable_answers_500(scripted_server):
    server = scripted_server(lambda body: 1 / 0)
    response = chat(server)
    assert response.status_code == 500
    assert "ZeroDivisionError" in response.json()["error"]["message"]


def test_scripted_errors(scripted_server):
    server = scripted_server(
        [
            Reply.status(503, "overloaded"),
            Reply.status(429, headers={"Retry-After": "1"}),
            Reply.malformed("{not json"),
            Reply.drop(),
            Reply.text("finally"),
        ]
    )
    response = chat(server)
    assert response.status_code == 503
    assert response.json()["error"]["message"] == "overloaded"
    response = chat(server)
    assert response.status_code == 429 and response.headers["Retry-After"] == "1"
    response = chat(server)
    assert response.status_code == 200 and response.text == "{not json"
    with pytest.raises(httpx.RemoteProtocolError):
        chat(server)
    assert chat(server).json()["choices"][0]["message"]["content"] == "finally"
    assert [r.status for r in server.requests] == [503, 429, 200, None, 200]
    assert server.requests[3].note == "dropped the connection"


def test_delay_causes_client_timeouts(scripted_server):
    server = scripted_server([Reply.delay(1.0, Reply.text("late")), Reply.text("on time")])
    started = time.monotonic()
    with pytest.raises(httpx.ReadTimeout):
        chat(server, timeout=0.2)
    assert time.monotonic() - started < 0.9
    assert chat(server).json()["choices"][0]["message"]["content"] == "on time"


def test_unknown_model_path_and_bad_body(scripted_server):
    server = scripted_server(["unused"])
    response = chat(server, model="no-such-model")
    assert response.status_code == 404
    assert "no-such-model" in response.json()["error"]["message"]
    assert HTTP.get(f"{server.base_url}/nowhere").status_code == 404
    assert HTTP.post(f"{server.base_url}/chat/completions", content=b"{").status_code == 400
    assert chat(server, n=2).status_code == 400
    # None of these consumed the script.
    assert chat(server).json()["choices"][0]["message"]["content"] == "unused"


def test_accept_any_model(scripted_server):
    server = scripted_server(["hi"], accept_any_model=True)
    assert chat(server, model="whatever").json()["model"] == "whatever"


def test_api_key_is_checked_when_set(scripted_server):
    server = scripted_server(["hi"], api_key="secret")
    assert chat(server).status_code == 401
    client = openai.OpenAI(base_url=server.base_url, api_key="secret", max_retries=0)
    reply = client.chat.completions.create(model=server.model, messages=USER)
    assert reply.choices[0].message.content == "hi"


def test_hash_embeddings_are_deterministic_and_similar_for_similar_texts():
    a = hash_embedding("Send Ana the meeting notes", 128)
    assert a == hash_embedding("send ana the meeting notes!", 128)
    assert math.isclose(cosine(a, a), 1.0)
    near = cosine(a, hash_embedding("Send Bo the meeting notes", 128))
    far = cosine(a, hash_embedding("top up the wallet by 20", 128))
    assert near > 0.6 > far
    assert math.isclose(cosine(hash_embedding("", 8), hash_embedding("", 8)), 1.0)


def test_embeddings_endpoint_with_the_openai_client(scripted_server):
    server = scripted_server(embedding_dim=64)
    client = openai.OpenAI(base_url=server.base_url, api_key="EMPTY", max_retries=0)
    # The client asks for base64 by default; the floats must come back the same.
    result = client.embeddings.create(model="any-embedder", input=["book a table", "book a table"])
    first, second = (item.embedding for item in result.data)
    assert len(first) == 64 and first == second
    assert first == pytest.approx(hash_embedding("book a table", 64), abs=1e-6)
    as_floats = HTTP.post(
        f"{server.base_url}/embeddings",
        json={"model": "m", "input": "book a table", "encoding_format": "float", "dimensions": 16},
    ).json()
    assert as_floats["data"][0]["embedding"] == hash_embedding("book a table", 16)
    assert as_floats["usage"]["prompt_tokens"] == 3


def test_lora_adapters_load_unload_and_serve(scripted_server):
    server = scripted_server(["from the adapter"])
    url = server.base_url

    def model_ids():
        return [m["id"] for m in HTTP.get(f"{url}/models").json()["data"]]

    assert model_ids() == [server.model]
    assert chat(server, model="cycle-1").status_code == 404
    response = HTTP.post(
        f"{url}/load_lora_adapter", json={"lora_name": "cycle-1", "lora_path": "/runs/a/cycle-1"}
    )
    assert response.status_code == 200 and "cycle-1" in response.text
    assert (
        HTTP.post(
            f"{url}/load_lora_adapter", json={"lora_name": "cycle-1", "lora_path": "/x"}
        ).status_code
        == 400
    )
    assert model_ids() == [server.model, "cycle-1"]
    assert server.loaded_adapters == {"cycle-1": "/runs/a/cycle-1"}
    reply = chat(server, model="cycle-1").json()
    assert reply["model"] == "cycle-1"
    assert reply["choices"][0]["message"]["content"] == "from the adapter"

    assert HTTP.post(f"{url}/unload_lora_adapter", json={"lora_name": "cycle-1"}).is_success
    missing = HTTP.post(f"{url}/unload_lora_adapter", json={"lora_name": "cycle-1"})
    assert missing.status_code == 404
    assert model_ids() == [server.model]
    assert [r.body.get("lora_name") for r in server.requests if "lora" in r.path] == ["cycle-1"] * 4


def test_64_concurrent_requests_take_about_one_delay(scripted_server):
    server = scripted_server(delay_s=0.05)

    async def burst() -> list[httpx.Response]:
        limits = httpx.Limits(max_connections=100)
        async with httpx.AsyncClient(limits=limits, timeout=10) as client:
            payload = {"model": server.model, "messages": USER}
            url = f"{server.base_url}/chat/completions"
            return await asyncio.gather(*(client.post(url, json=payload) for _ in range(64)))

    started = time.monotonic()
    responses = asyncio.run(burst())
    elapsed = time.monotonic() - started
    assert all(r.status_code == 200 for r in responses)
    assert len(server.chat_bodies()) == 64
    assert server.max_in_flight > 8  # they really overlapped
    assert elapsed < 2.0  # 64 x 50 ms in sequence would be 3.2 s


def test_context_manager_and_stop():
    with ScriptedOpenAIServer(["hi"]) as server:
        url = server.base_url
        assert url.startswith("http://127.0.0.1:") and url.endswith("/v1")
        assert chat(server).status_code == 200
    with pytest.raises(RuntimeError, match="not running"):
        _ = server.base_url
    with pytest.raises(httpx.TransportError):
        HTTP.post(f"{url}/chat/completions", json={"model": "m", "messages": USER}, timeout=1)


def test_stop_cuts_a_delay_short():
    server = ScriptedOpenAIServer([Reply.delay(30)]).start()
    with httpx.Client(timeout=0.1) as client, pytest.raises(httpx.ReadTimeout):
        client.post(
            f"{server.base_url}/chat/completions", json={"model": server.model, "messages": USER}
        )
    started = time.monotonic()
    server.stop()
    assert time.monotonic() - started < 2.0


def test_the_asyncio_server_answers_endpoint_rollouts_over_real_http():
    """The fan-out bench's server: the same script, on one event loop."""
    import socket
    import subprocess
    import sys

    from coevolve.agents.policy.endpoint_policy import EndpointPolicy
    from coevolve.agents.policy.rollout import run_rollouts
    from coevolve.config import EndpointConfig
    from coevolve.envs.world import WorldEnvironment, load_split

    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    command = [sys.executable, "-m", "coevolve.testing.async_openai_server"]
    command += ["--port", str(port), "--calls-then-answer", "2", "--delay", "0.01"]
    server = subprocess.Popen(command, stdout=subprocess.PIPE, text=True)
    try:
        base_url = f"http://127.0.0.1:{port}/v1"
        assert server.stdout is not None
        # The line comes once the port listens: no retries needed after it.
        assert server.stdout.readline() == f"serving scripted-model at {base_url}\n"
        models = httpx.get(f"{base_url}/models", timeout=5).json()
        assert [m["id"] for m in models["data"]] == ["scripted-model"]
        assert httpx.post(f"{base_url}/nowhere", json={}).status_code == 404
        assert httpx.post(f"{base_url}/chat/completions", content=b"{").status_code == 400
        policy = EndpointPolicy(EndpointConfig(base_url=base_url, model="scripted-model"))
        tasks = load_split("validation")[:8]
        trajectories = run_rollouts(policy, WorldEnvironment, tasks, progress=False)
        assert all(t.error is None and t.final_answer == "done" for t in trajectories)
        assert [len(t.steps) for t in trajectories] == [2] * 8
    finally:
        server.terminate()
        server.wait()


def test_the_asyncio_server_keys_routes_and_the_script_end_over_real_http():
    """aiohttp's server under the asyncio transport: the bearer key, paths with a
    trailing slash or a query, a list script that runs out (500), other routes (404)."""
    import socket

    from coevolve.testing.async_openai_server import serve

    app = ScriptedOpenAIServer(["only once"], api_key="sk-test")
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    base_url = f"http://127.0.0.1:{port}/v1"
    payload = {"model": app.model, "messages": USER}

    async def scenario() -> None:
        listening = asyncio.Event()
        serving = asyncio.create_task(serve(app, "127.0.0.1", port, listening.set))
        try:
            await asyncio.wait_for(listening.wait(), timeout=10)
            async with httpx.AsyncClient(timeout=5) as client:
                assert (await client.get(f"{base_url}/models")).status_code == 401
                client.headers["Authorization"] = "Bearer sk-test"
                models = await client.get(f"{base_url}/models/?limit=5")
                assert models.status_code == 200
                assert [m["id"] for m in models.json()["data"]] == [app.model]
                first = await client.post(f"{base_url}/chat/completions", json=payload)
                assert first.status_code == 200
                assert first.headers["content-type"] == "application/json"
                assert first.json()["choices"][0]["message"]["content"] == "only once"
                ran_out = await client.post(f"{base_url}/chat/completions", json=payload)
                assert ran_out.status_code == 500
                assert "script exhausted" in ran_out.json()["error"]["message"]
                wrong_method = await client.get(f"{base_url}/chat/completions")
                assert wrong_method.status_code == 404
                assert (
                    wrong_method.json()["error"]["message"] == "no route GET /v1/chat/completions"
                )
        finally:
            serving.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await serving

    asyncio.run(scenario())
