"""Synthesis benchmarks.

    .venv/bin/python bench/synthesis.py                 # both parts
    .venv/bin/python bench/synthesis.py --part graph [--server asyncio|threads]
    .venv/bin/python bench/synthesis.py --part dedup

(a) graph: 64 flagged items through the synthesis graph on the LLM path (every
    role on an endpoint) against the scripted test server at 50 ms per reply
    and an LLM concurrency of 16. Each item makes 5 sequential LLM calls
    (summary, one exploration round of a tool call and a stop, one abstraction,
    one verdict), so the ideal is max(ceil(64 * 5 / 16), 5) * 50 ms. Target
    <= 1.5x. The server runs in its own process, as a real endpoint would, on
    one event loop as vLLM's does (``--server threads``: the tests'
    thread-per-connection server). Prints the dedup stage's share of the wall
    time and the client's CPU per LLM call; ``BENCH_PROFILE=1`` adds a cProfile
    table (``BENCH_PROFILE_SORT``, ``BENCH_PROFILE_LINES``).
(b) dedup: cost per task of add_if_novel against a 10,000-task store,
    embedding included, batched (bench/dedup.py). Target <= 5 ms.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import math
import os
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path
from typing import Any

ITEMS, REPLIES_PER_ITEM, CONCURRENCY, DELAY_S = 64, 5, 16, 0.05

SERVER = """
import asyncio, sys, time
from coevolve.agents.prompts import ABSTRACTOR_PROMPT, EXPLORER_PROMPT, JUDGE_PROMPT, SUMMARIZER_PROMPT
from coevolve.testing.openai_server import Reply, ScriptedOpenAIServer

def script(body):
    messages = body["messages"]
    system = messages[0]["content"]
    if system == SUMMARIZER_PROMPT:
        return Reply.json_content({"summary": "stopped early", "failure_cause": "missing call"})
    if system == EXPLORER_PROMPT:
        if not any(m["role"] == "tool" for m in messages):
            return Reply.tool_calls([("list_contacts", {})])
        return Reply.text("done")
    if system == ABSTRACTOR_PROMPT:
        return Reply.json_content([{"description": "a note", "query": "Make a note called bench saying hello.",
            "minimal_actions": [{"name": "create_note", "arguments": {"title": "bench", "body": "hello"}}]}])
    if system == JUDGE_PROMPT:
        return Reply.json_content({"success": True, "reason": "ok", "api_match": True,
            "parameter_usage": True, "logical_flow": True, "final_result": True, "failed_or_skipped_steps": []})
    return Reply.status(400, "unexpected")

app = ScriptedOpenAIServer(script, delay_s=float(sys.argv[2]), port=int(sys.argv[1]))
if sys.argv[3] == "asyncio":
    from coevolve.testing.async_openai_server import serve
    asyncio.run(serve(app, "127.0.0.1", app.port))
else:
    app.start()
    while True:
        time.sleep(3600)
"""


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def bench_graph(server_kind: str = "asyncio") -> float:
    from coevolve.agents.policy.oracle import OraclePolicy
    from coevolve.agents.policy.rollout import run_rollouts
    from coevolve.agents.roles.role_factory import build_roles
    from coevolve.agents.roles.role_interfaces import RolesConfig
    from coevolve.config import EndpointConfig
    from coevolve.envs.world import WorldEnvironment, load_split
    from coevolve.graph.synthesis.context import SynthesisRuntime
    from coevolve.graph.synthesis.graph import run_synthesis
    from coevolve.memory.store import TaskStore
    from coevolve.records import FlaggedTrajectory, Signal

    port = _free_port()
    server = subprocess.Popen([sys.executable, "-c", SERVER, str(port), str(DELAY_S), server_kind])
    try:
        base_url = f"http://127.0.0.1:{port}/v1"
        for _ in range(100):  # until the server listens
            try:
                urllib.request.urlopen(f"{base_url}/models", timeout=1).read()
                break
            except OSError:
                time.sleep(0.1)
        tasks = load_split("train", size=ITEMS)
        trajectories = run_rollouts(OraclePolicy(), WorldEnvironment, tasks, progress=False)
        flagged = [
            FlaggedTrajectory(
                trajectory=t,
                signals=[
                    Signal(kind="rare", trajectory_id=t.id, task_id=t.task_id, family=t.family)
                ],
            )
            for t in trajectories
        ]
        endpoint = EndpointConfig(
            base_url=base_url, model="scripted-model", timeout_s=30, max_retries=0
        )
        config = RolesConfig(
            default_endpoint="bench",
            llm_concurrency=CONCURRENCY,
            explorer_rounds=1,
            max_candidates=1,
        )

        class TimedStore(TaskStore):
            """The store, timing the dedup stage's calls (embedding, query, write)."""

            dedup_s = 0.0

            def add_if_novel(self, *args: Any, **kwargs: Any) -> Any:
                started = time.perf_counter()
                try:
                    return super().add_if_novel(*args, **kwargs)
                finally:
                    self.dedup_s += time.perf_counter() - started

        store = TimedStore(None)
        # Load the embedding model and its kernels for these batch shapes before timing.
        store.add_if_novel(load_split("validation")[:ITEMS])
        store.nearest_many([t.instruction for t in tasks], 5)

        def runtime() -> SynthesisRuntime:
            return SynthesisRuntime(
                roles=build_roles(config, {"bench": endpoint}, make_env=WorldEnvironment),
                make_env=WorldEnvironment,
                store=store,
            )

        asyncio.run(
            run_synthesis(flagged[:4], tasks, runtime(), cycle=0, max_concurrency=ITEMS)
        )  # warm-up
        rt = runtime()
        profiler = None
        if os.environ.get("BENCH_PROFILE"):
            import cProfile

            profiler = cProfile.Profile()
            profiler.enable()
        store.dedup_s = 0.0
        client_cpu = time.process_time()
        started = time.perf_counter()
        result = asyncio.run(run_synthesis(flagged, tasks, rt, cycle=1, max_concurrency=ITEMS))
        wall = time.perf_counter() - started
        client_cpu = time.process_time() - client_cpu
        if profiler is not None:
            import pstats

            profiler.disable()
            pstats.Stats(profiler).sort_stats(
                os.environ.get("BENCH_PROFILE_SORT", "tottime")
            ).print_stats(int(os.environ.get("BENCH_PROFILE_LINES", "25")))
    finally:
        server.terminate()
        server.wait()
    ideal = max(math.ceil(ITEMS * REPLIES_PER_ITEM / CONCURRENCY), REPLIES_PER_ITEM) * DELAY_S
    ratio = wall / ideal
    llm_ratio = (wall - store.dedup_s) / ideal
    print(
        f"(a) graph, LLM path: {ITEMS} items x {REPLIES_PER_ITEM} calls, concurrency {CONCURRENCY}, {DELAY_S * 1000:.0f} ms/reply"
    )
    print(
        f"    scripted server on {'one event loop' if server_kind == 'asyncio' else 'a thread per connection'}"
    )
    print(f"    wall {wall:.2f} s, ideal {ideal:.2f} s, ratio {ratio:.2f}x (target <= 1.5x)")
    print(
        f"    of which the dedup stage {store.dedup_s:.2f} s (embedding, no LLM): the rest, "
        f"{wall - store.dedup_s:.2f} s, is {llm_ratio:.2f}x the ideal"
    )
    print(
        f"    client CPU {client_cpu:.2f} s ({1000 * client_cpu / (ITEMS * REPLIES_PER_ITEM):.2f} ms "
        f"per LLM call, everything included), {os.cpu_count()} cores"
    )
    print(f"    stages {json.dumps(result.counts)}")
    return ratio


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--part", choices=["both", "graph", "dedup"], default="both")
    parser.add_argument(
        "--server",
        choices=["asyncio", "threads"],
        default="asyncio",
        help="(a): the scripted server on one event loop, as vLLM's (default), or the tests' "
        "thread-per-connection server",
    )
    args = parser.parse_args()
    if args.part in ("both", "graph"):
        bench_graph(args.server)
    if args.part in ("both", "dedup"):
        subprocess.run([sys.executable, str(Path(__file__).with_name("dedup.py"))], check=True)


if __name__ == "__main__":
    main()
