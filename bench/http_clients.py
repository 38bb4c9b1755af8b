"""Client CPU per chat-completion request: the hand-written pool against the libraries.

    .venv/bin/python bench/http_clients.py [--requests 2000] [--concurrency 64]

The scripted server (its asyncio transport) runs in a process of its own, so only
the client's work is counted: ``time.process_time`` of this process over
``--requests`` requests, ``--concurrency`` in flight, each carrying the world's
31 tool schemas (about 10 KB, as a rollout's do) and answered with one tool call.
Clients: ``lean_http.LeanPool`` (what the endpoint policy uses), httpx through
``lean_http.HttpxPool``, aiohttp's ``ClientSession``, and the openai SDK's
``chat.completions.create`` (on the httpx it is built on). Every client sends the same bytes
and reads the body as JSON. CPU time counts this process only, so a machine shared
with other jobs moves the wall time far more than the CPU figures; both are printed.
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
from functools import partial
from typing import Any

import orjson

from coevolve.common.lean_http import HttpxPool, LeanPool


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


async def _pool(
    pool_class: type[Any], base_url: str, body: bytes, requests: int, concurrency: int
) -> None:
    """One of lean_http's pools (``LeanPool``, or ``HttpxPool`` over httpx)."""
    pool = pool_class(base_url, {"content-type": "application/json"}, 30.0, concurrency)

    async def call() -> None:
        response = await pool.request("POST", "/chat/completions", body)
        orjson.loads(response.body)

    await _drive(call, requests, concurrency)
    await pool.aclose()


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
    from openai import AsyncOpenAI

    from coevolve.common.lean_http import _httpx_module

    httpx = _httpx_module()  # the httpx the SDK is built on (httpx2 for openai 3)
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
    "lean_http": partial(_pool, LeanPool),
    "httpx": partial(_pool, HttpxPool),
    "aiohttp": _aiohttp,
    "openai-sdk": _openai_sdk,
}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--requests", type=int, default=2000)
    parser.add_argument("--concurrency", type=int, default=64)
    parser.add_argument("--rounds", type=int, default=3, help="rounds per client (best kept)")
    args = parser.parse_args()

    port = _free_port()
    server = subprocess.Popen(
        [
            *(sys.executable, "-m", "coevolve.testing.async_openai_server"),
            *("--port", str(port), "--calls-then-answer", "1000"),
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
        for name, run in CLIENTS.items():
            best_cpu, best_wall = float("inf"), float("inf")
            for _ in range(args.rounds):
                cpu, wall = time.process_time(), time.perf_counter()
                asyncio.run(run(base_url, body, args.requests, args.concurrency))
                best_cpu = min(best_cpu, time.process_time() - cpu)
                best_wall = min(best_wall, time.perf_counter() - wall)
            figures[name] = (best_cpu, best_wall)
        lean_cpu = figures["lean_http"][0]
        print(f"{'client':<12} {'CPU ms/request':>15} {'x lean_http':>12} {'wall s':>8}")
        for name, (cpu, wall) in figures.items():
            per = 1000 * cpu / args.requests
            print(f"{name:<12} {per:>15.3f} {cpu / lean_cpu:>12.2f} {wall:>8.2f}")
    finally:
        server.terminate()
        server.wait(timeout=10)


if __name__ == "__main__":
    main()
