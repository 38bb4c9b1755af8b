"""Client CPU per chat-completion request: our client path against the bare libraries.

    .venv/bin/python bench/http_clients.py [--requests 2000] [--concurrency 64] [--delay-ms 0]

The scripted server (its asyncio transport) runs in a process of its own, so only
the client's work is counted: ``time.process_time`` of this process over
``--requests`` requests, ``--concurrency`` in flight, each carrying the world's
31 tool schemas (about 7 KB, as a rollout's do) and answered with one tool call
after ``--delay-ms``. Clients: the endpoint policy's ``generate`` (one conversation
a call: the request encoded, the reply read into an ``AssistantMessage``), our HTTP
client (``common/http.py``'s ``HttpClient``, under the policy, the roles and the
embeddings), aiohttp's ``ClientSession`` used directly (the bare library ours is
built on), httpx's ``AsyncClient`` directly, and the openai SDK's
``chat.completions.create`` (on the httpx it is built on). The HTTP clients send the
same bytes and read the body as JSON. CPU time counts this process only, so a
machine shared with other jobs moves the wall time far more than the CPU figures;
both are printed, with the ratios to bare aiohttp.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import socket
import subprocess
import sys
import time
from collections.abc import Awaitable, Callable, Coroutine
from typing import Any

import orjson

from coevolve.common.http import HttpClient


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _request_body() -> dict[str, Any]:
    from coevolve.envs.world.apps import tool_schemas

    return {
        "model": "scripted-model",
        "messages": [
            {"role": "system", "content": "You are a helpful assistant with tools."},
            {"role": "user", "content": "What is Ana's phone number?"},
        ],
        "tools": tool_schemas(),
        "max_tokens": 96,
        "temperature": 0.7,
    }


async def _drive(call: Callable[[], Awaitable[Any]], requests: int, concurrency: int) -> None:
    left = requests

    async def worker() -> None:
        nonlocal left
        while left > 0:
            left -= 1
            await call()

    await asyncio.gather(*(worker() for _ in range(concurrency)))


async def _ours(base_url: str, body: bytes, requests: int, concurrency: int) -> None:
    """``common/http.py``'s client, as the endpoint policy holds it."""
    client = HttpClient(
        timeout_s=30.0, max_connections=concurrency, headers={"content-type": "application/json"}
    )
    url = base_url + "/chat/completions"

    async def call() -> None:
        response = await client.request("POST", url, body)
        orjson.loads(response.body)

    await _drive(call, requests, concurrency)
    await client.aclose()


async def _policy(base_url: str, body: bytes, requests: int, concurrency: int) -> None:
    """``EndpointPolicy.generate``, one conversation a call, the request's messages and tools."""
    from coevolve.agents.policy.endpoint_policy import EndpointPolicy
    from coevolve.config import EndpointConfig

    request = orjson.loads(body)
    endpoint = EndpointConfig(
        base_url=base_url,
        model=request["model"],
        concurrency=concurrency,
        timeout_s=30.0,
        max_tokens=request["max_tokens"],
        temperature=request["temperature"],
    )
    policy = EndpointPolicy(endpoint)
    conversation, tools = request["messages"], request["tools"]

    async def call() -> None:
        [message] = await policy.generate([conversation], [tools])
        assert message.error is None, message.error

    await _drive(call, requests, concurrency)
    await policy.aclose()


async def _httpx(base_url: str, body: bytes, requests: int, concurrency: int) -> None:
    import httpx

    limits = httpx.Limits(max_connections=concurrency, max_keepalive_connections=concurrency)
    headers = {"content-type": "application/json"}
    async with httpx.AsyncClient(limits=limits, timeout=30.0, headers=headers) as client:
        url = base_url + "/chat/completions"

        async def call() -> None:
            response = await client.post(url, content=body)
            orjson.loads(response.content)

        await _drive(call, requests, concurrency)


async def _aiohttp(base_url: str, body: bytes, requests: int, concurrency: int) -> None:
    import aiohttp

    connector = aiohttp.TCPConnector(limit=concurrency)
    headers = {"content-type": "application/json"}
    async with aiohttp.ClientSession(connector=connector, headers=headers) as session:
        url = base_url + "/chat/completions"

        async def call() -> None:
            async with session.post(url, data=body) as response:
                orjson.loads(await response.read())

        await _drive(call, requests, concurrency)


async def _openai_sdk(base_url: str, body: bytes, requests: int, concurrency: int) -> None:
    import importlib

    from openai import AsyncOpenAI

    try:  # the httpx the SDK is built on: httpx2 for openai 3, httpx for openai 1 and 2
        httpx = importlib.import_module("httpx2")
    except ImportError:
        httpx = importlib.import_module("httpx")
    request = orjson.loads(body)
    limits = httpx.Limits(max_connections=concurrency, max_keepalive_connections=concurrency)
    client = AsyncOpenAI(
        base_url=base_url,
        api_key="none",
        max_retries=0,
        http_client=httpx.AsyncClient(limits=limits, timeout=30.0),
    )

    async def call() -> None:
        await client.chat.completions.create(**request)

    await _drive(call, requests, concurrency)
    await client.close()


Client = Callable[[str, bytes, int, int], Coroutine[Any, Any, None]]
CLIENTS: dict[str, Client] = {
    "policy": _policy,
    "HttpClient": _ours,
    "aiohttp": _aiohttp,
    "httpx": _httpx,
    "openai-sdk": _openai_sdk,
}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--requests", type=int, default=2000)
    parser.add_argument("--concurrency", type=int, default=64)
    parser.add_argument("--rounds", type=int, default=3, help="rounds per client (best kept)")
    parser.add_argument("--clients", nargs="*", choices=list(CLIENTS), help="default: all")
    parser.add_argument("--delay-ms", type=float, default=0.0, help="the server's time per reply")
    args = parser.parse_args()

    port = _free_port()
    server = subprocess.Popen(
        [
            *(sys.executable, "-m", "coevolve.testing.async_openai_server"),
            *("--port", str(port), "--calls-then-answer", "1000"),
            *("--delay", str(args.delay_ms / 1000)),
        ],
        stdout=subprocess.PIPE,
        text=True,
        env={**os.environ, "PYTHONUNBUFFERED": "1"},
    )
    try:
        assert server.stdout is not None
        server.stdout.readline()  # "serving ... at ..."
        base_url = f"http://127.0.0.1:{port}/v1"
        body = orjson.dumps(_request_body())
        print(
            f"{args.requests} requests, {args.concurrency} in flight, {len(body) / 1024:.1f} KB "
            f"each; best of {args.rounds} rounds; client process only"
        )
        figures = {}
        chosen = {name: CLIENTS[name] for name in args.clients or CLIENTS}
        chosen.setdefault("aiohttp", CLIENTS["aiohttp"])  # the ratios' reference
        for name, run in chosen.items():
            best_cpu, best_wall = float("inf"), float("inf")
            for _ in range(args.rounds):
                cpu, wall = time.process_time(), time.perf_counter()
                asyncio.run(run(base_url, body, args.requests, args.concurrency))
                best_cpu = min(best_cpu, time.process_time() - cpu)
                best_wall = min(best_wall, time.perf_counter() - wall)
            figures[name] = (best_cpu, best_wall)
        bare_cpu, bare_wall = figures["aiohttp"]
        print(
            f"{'client':<12} {'CPU ms/request':>15} {'x aiohttp':>10} {'wall s':>8} {'x aiohttp':>10}"
        )
        for name, (cpu, wall) in figures.items():
            per = 1000 * cpu / args.requests
            print(
                f"{name:<12} {per:>15.3f} {cpu / bare_cpu:>10.2f} {wall:>8.2f} "
                f"{wall / bare_wall:>10.3f}"
            )
    finally:
        server.terminate()
        server.wait(timeout=10)


if __name__ == "__main__":
    main()
