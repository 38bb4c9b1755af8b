"""Rollout throughput benchmarks.

    .venv/bin/python bench/rollout.py            # both parts
    .venv/bin/python bench/rollout.py --part endpoint
    .venv/bin/python bench/rollout.py --part inprocess
    .venv/bin/python bench/rollout.py --part episodes --model DIR

(a) in-process: generated tokens/s of the rollout engine with the in-process
    policy, against plain batched ``model.generate`` over the same prompts and
    model. Target ratio >= 0.8.
(c) episodes: whole greedy evaluation episodes (validation, 4 per family) with
    the in-process policy keeping each episode's KV cache between steps, against
    re-encoding the conversation at every step; same model, same tasks. Prints
    both times, the ratio, and whether every episode came out the same.
(b) endpoint: 256 episodes x 5 replies (4 tool calls, then an answer) against
    the scripted test server at 50 ms per reply and concurrency 64, against the
    ideal ceil(256/64) * 5 * 50 ms. Target <= 1.25x. The server runs in its own
    process, as a real endpoint would, on one event loop as vLLM's does
    (``--server threads``: the tests' thread-per-connection server instead); on
    a small machine it competes with the
    client for the cores, so both CPU figures are printed: client CPU per
    request is the client process's CPU time over the requests it made.
    ``--floor`` then sends the same requests (each step's conversations, as the
    engine sent them) again, in the same 5 lockstep steps: from the bare HTTP
    library (aiohttp, no framework around it), and through the policy's
    ``generate`` without the engine. Their ratios are what the server and the
    transport leave to the engine. ``--delay-ms`` sets the reply time (300 ms is
    closer to a real model's than the default 50).
"""

from __future__ import annotations

import argparse
import gc
import math
import os
import resource
import socket
import subprocess
import sys
import time
import urllib.request
from typing import Any


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def bench_endpoint(
    episodes: int = 256,
    replies: int = 5,
    concurrency: int = 64,
    delay_s: float = 0.05,
    server_kind: str = "asyncio",
    floor: bool = False,
) -> float:
    from coevolve.agents.policy.endpoint_policy import EndpointPolicy
    from coevolve.agents.policy.rollout import run_rollouts
    from coevolve.config import EndpointConfig
    from coevolve.envs.world import WorldEnvironment, load_split

    port = _free_port()
    server = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "coevolve.testing.async_openai_server"
            if server_kind == "asyncio"
            else "coevolve.testing.openai_server",
            "--port",
            str(port),
            "--delay",
            str(delay_s),
            "--calls-then-answer",
            str(replies - 1),
        ],
        stdout=subprocess.DEVNULL,
    )
    try:
        base_url = f"http://127.0.0.1:{port}/v1"
        for _ in range(100):
            try:
                urllib.request.urlopen(f"{base_url}/models", timeout=1).read()
                break
            except OSError:
                time.sleep(0.1)
        endpoint = EndpointConfig(
            base_url=base_url, model="scripted-model", concurrency=concurrency, timeout_s=30
        )
        tasks = load_split("train", size=episodes)
        # warm-up: open the connection pool, import everything
        run_rollouts(
            EndpointPolicy(endpoint),
            WorldEnvironment,
            tasks[:concurrency],
            progress=False,
            max_tool_calls=replies,
        )
        policy = EndpointPolicy(endpoint)
        # The warm-up's garbage must not start a full collection inside the measured
        # rollout (one took 0.26 s there, a fifth of a millisecond a request).
        gc.collect()
        client_cpu = time.process_time()
        started = time.perf_counter()
        trajectories = run_rollouts(
            policy, WorldEnvironment, tasks, progress=False, max_tool_calls=replies
        )
        wall = time.perf_counter() - started
        client_cpu = time.process_time() - client_cpu
        floors = _floor_walls(endpoint, trajectories, replies) if floor else None
    finally:
        server.terminate()
        server.wait()
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    server_cpu_s = usage.ru_utime + usage.ru_stime
    errors = sum(t.error is not None for t in trajectories)
    steps = {len(t.steps) for t in trajectories}
    ideal = math.ceil(episodes / concurrency) * replies * delay_s
    ratio = wall / ideal if ideal > 0 else float("inf")  # no ideal for replies of no time
    print(
        f"(b) endpoint: {episodes} episodes x {replies} replies, concurrency {concurrency}, {delay_s * 1000:.0f} ms/reply, "
        f"scripted server on {'one event loop' if server_kind == 'asyncio' else 'a thread per connection'}"
    )
    print(
        f"    wall {wall:.2f} s, ideal {ideal:.2f} s, ratio {ratio:.2f}x (target <= 1.25x)  errors={errors} tool calls/episode={sorted(steps)}"
    )
    print(
        f"    CPU: client {client_cpu:.2f} s ({client_cpu / (episodes * replies) * 1000:.2f} ms/request), "
        f"server {server_cpu_s:.2f} s (incl. its start-up and the warm-up), {os.cpu_count()} cores, "
        f"load average {os.getloadavg()[0]:.1f} (other work competes for the same cores)"
    )
    if floors is not None:
        shown = ", ".join(
            f"{name} {seconds:.2f} s ({seconds / ideal if ideal > 0 else float('inf'):.3f}x)"
            for name, seconds in floors.items()
        )
        print(f"    the same requests in the same steps: {shown}, the engine {ratio:.3f}x")
        bare = floors["bare aiohttp"]
        print(
            f"    over the bare library: policy.generate {floors['policy.generate'] / bare:.3f}, "
            f"the engine {wall / bare:.3f}"
        )
    return ratio


def _floor_walls(endpoint: Any, trajectories: list[Any], replies: int) -> dict[str, float]:
    """Seconds for the engine's requests, step by step, from the bare HTTP library
    (aiohttp's ``ClientSession``, nothing around it) and through
    ``EndpointPolicy.generate``: the conversation of step ``s`` is each episode's
    messages before its ``s``-th assistant message."""
    import asyncio

    import aiohttp
    import orjson

    from coevolve.agents.policy.endpoint_policy import EndpointPolicy
    from coevolve.envs.world import WorldEnvironment

    tools = WorldEnvironment().tools()
    steps: list[list[list[dict[str, Any]]]] = [[] for _ in range(replies)]
    for trajectory in trajectories:
        assistant_at = [i for i, m in enumerate(trajectory.messages) if m["role"] == "assistant"]
        for step, index in enumerate(assistant_at[:replies]):
            steps[step].append(trajectory.messages[:index])

    def body_of(messages: list[dict[str, Any]]) -> bytes:
        body = {"model": endpoint.model, "messages": messages, "tools": tools}
        body["max_tokens"] = endpoint.max_tokens
        return orjson.dumps(body)

    async def bare_aiohttp() -> float:
        connector = aiohttp.TCPConnector(limit=endpoint.concurrency)
        headers = {"Content-Type": "application/json"}
        url = endpoint.base_url.rstrip("/") + "/chat/completions"
        async with aiohttp.ClientSession(connector=connector, headers=headers) as session:

            async def one(messages: list[dict[str, Any]]) -> None:
                async with session.post(url, data=body_of(messages)) as response:
                    orjson.loads(await response.read())

            started = time.perf_counter()
            for conversations in steps:
                await asyncio.gather(*(one(messages) for messages in conversations))
            return time.perf_counter() - started

    async def generate_only() -> float:
        policy = EndpointPolicy(endpoint)
        started = time.perf_counter()
        for conversations in steps:
            await policy.generate(conversations, [tools] * len(conversations))
        wall = time.perf_counter() - started
        await policy.aclose()
        return wall

    walls = {}
    for name, part in (
        ("bare aiohttp", bare_aiohttp),
        ("policy.generate", generate_only),
    ):
        # The engine's measured rollout sees no full collection (they all fall in its
        # warm-up); the garbage of one timed part must not start one inside the next.
        gc.collect()
        walls[name] = asyncio.run(part())
    return walls


def bench_inprocess(
    episodes: int = 64, max_new_tokens: int = 64, model_path: str | None = None
) -> float:
    import asyncio

    import torch

    from coevolve.agents.policy.conversation import opening_messages
    from coevolve.agents.policy.local_policy import LocalPolicy
    from coevolve.agents.policy.policy_interface import arguments_as_dicts
    from coevolve.agents.policy.rollout import run_rollouts
    from coevolve.envs.world import WorldEnvironment, load_split
    from coevolve.training.bootstrap.build import BootstrapConfig, bootstrap

    torch.manual_seed(0)
    model_dir = model_path or bootstrap(BootstrapConfig())
    policy = LocalPolicy(str(model_dir), max_new_tokens=max_new_tokens, batch_size=episodes)
    tasks = load_split("validation", size=episodes)
    env = WorldEnvironment()

    # Plain batched generate over the first-step prompts of the same tasks, same model.
    tokenizer, model = policy.tokenizer, policy.model
    prompts = [
        tokenizer.apply_chat_template(
            arguments_as_dicts(opening_messages(env.reset(task))),
            tokenize=False,
            add_generation_prompt=True,
        )
        for task in tasks
    ]
    batch = tokenizer(prompts, return_tensors="pt", padding=True, add_special_tokens=False)
    with torch.inference_mode():
        model.generate(
            **batch, max_new_tokens=4, do_sample=False, pad_token_id=tokenizer.pad_token_id
        )  # warm-up
        started = time.perf_counter()
        out = model.generate(
            **batch,
            max_new_tokens=max_new_tokens,
            do_sample=False,
            pad_token_id=tokenizer.pad_token_id,
        )
        plain_s = time.perf_counter() - started
    new = out[:, batch["input_ids"].shape[1] :]
    plain_tokens = int(sum(_until_eos(row, tokenizer.eos_token_id) for row in new))
    plain_rate = plain_tokens / plain_s

    # The rollout engine's first step on the same tasks (max_tool_calls=1: one generate per episode).
    started = time.perf_counter()
    trajectories = run_rollouts(policy, WorldEnvironment, tasks, progress=False, max_tool_calls=1)
    engine_s = time.perf_counter() - started
    engine_tokens = sum(t.completion_tokens for t in trajectories)
    engine_rate = engine_tokens / engine_s
    asyncio.run(policy.aclose())
    ratio = engine_rate / plain_rate
    print(f"(a) in-process: {episodes} episodes, batch {episodes}, max_new_tokens {max_new_tokens}")
    print(f"    plain generate {plain_rate:,.0f} tok/s ({plain_tokens} tokens in {plain_s:.2f} s)")
    print(
        f"    rollout engine {engine_rate:,.0f} tok/s ({engine_tokens} tokens in {engine_s:.2f} s, whole episodes)"
    )
    print(f"    ratio {ratio:.2f} (target >= 0.8)")
    return ratio


def bench_episodes(model_path: str | None = None, per_family: int = 4) -> float:
    import torch

    from coevolve.agents.policy.local_policy import LocalPolicy
    from coevolve.agents.policy.rollout import run_rollouts
    from coevolve.envs.world import WorldEnvironment, load_split
    from coevolve.records import is_success
    from coevolve.training.bootstrap.build import BootstrapConfig, bootstrap

    model_dir = model_path or bootstrap(BootstrapConfig())
    seen: dict[str, int] = {}
    tasks = []
    for task in load_split("validation"):
        seen[task.family] = seen.get(task.family, 0) + 1
        if seen[task.family] <= per_family:
            tasks.append(task)
    results = {}
    for kv_reuse in (True, False):
        torch.manual_seed(0)
        policy = LocalPolicy(str(model_dir), max_new_tokens=64, kv_reuse=kv_reuse)
        started = time.perf_counter()
        trajectories = run_rollouts(
            policy, WorldEnvironment, tasks, k=1, temperature=0.0, max_tool_calls=8, progress=False
        )
        elapsed = time.perf_counter() - started
        success = sum(is_success(t.score) for t in trajectories) / len(trajectories)
        results[kv_reuse] = (
            elapsed,
            success,
            [m["content"] for t in trajectories for m in t.messages],
        )
        extra = ""
        if kv_reuse:
            cache = policy.prefix_cache
            extra = f", prompt tokens reused {cache.reused_tokens}, encoded {cache.encoded_tokens}"
        label = "KV reuse   " if kv_reuse else "re-encoding"
        print(f"    {label} {elapsed:7.1f} s, success {success:.1%}{extra}")
    ratio = results[False][0] / results[True][0]
    same = results[True][2] == results[False][2]
    print(
        f"(c) episodes: {len(tasks)} validation tasks, greedy; speed-up {ratio:.2f}x, same episodes: {same}"
    )
    return ratio


def _until_eos(row, eos_id: int) -> int:
    ids = row.tolist()
    return ids.index(eos_id) + 1 if eos_id in ids else len(ids)


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument(
        "--part", choices=["both", "endpoint", "inprocess", "episodes"], default="both"
    )
    parser.add_argument(
        "--model", help="(a): a model directory instead of the default bootstrap model"
    )
    parser.add_argument(
        "--server",
        choices=["asyncio", "threads"],
        default="asyncio",
        help="(b): the scripted server on one event loop, as vLLM's (default), or the tests' "
        "thread-per-connection server",
    )
    parser.add_argument(
        "--delay-ms",
        type=float,
        default=50.0,
        help="(b): the scripted server's time per reply, in ms (default 50)",
    )
    parser.add_argument(
        "--floor",
        action="store_true",
        help="(b): also send the engine's requests from the bare HTTP pool and through "
        "policy.generate alone, in the same steps: what the server and transport cost",
    )
    args = parser.parse_args()
    if args.part in ("both", "inprocess"):
        bench_inprocess(model_path=args.model)
    if args.part in ("both", "endpoint"):
        bench_endpoint(server_kind=args.server, floor=args.floor, delay_s=args.delay_ms / 1000)
    if args.part == "episodes":
        bench_episodes(model_path=args.model)


if __name__ == "__main__":
    main()
