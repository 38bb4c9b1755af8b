"""LangGraph Studio: `coevolve studio` serves the graphs; a run goes through the real server."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from typing import Any

import pytest

from coevolve.agents.policy.oracle import OraclePolicy
from coevolve.agents.policy.rollout import run_rollouts
from coevolve.envs.world import WorldEnvironment, load_split
from coevolve.memory.signals import FlaggedTrajectory
from coevolve.records import Signal

pytest.importorskip(
    "langgraph_api", reason="the studio extra (langgraph-cli[inmem]) is not installed"
)


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def _request(url: str, body: dict | None = None, timeout: float = 10) -> object:
    data = json.dumps(body).encode() if body is not None else None
    request = urllib.request.Request(url, data=data, headers={"content-type": "application/json"})
    with urllib.request.urlopen(request, timeout=timeout) as response:
        return json.loads(response.read())


@pytest.fixture(scope="module")
def studio(tmp_path_factory):
    port = _free_port()
    log = (tmp_path_factory.mktemp("studio") / "studio.log").open("w")
    process = subprocess.Popen(
        [sys.executable, "-m", "coevolve", "studio", "--port", str(port)],
        stdout=log,
        stderr=subprocess.STDOUT,
        start_new_session=True,  # langgraph dev starts workers; stop the whole group
    )
    base = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 180
        while True:
            try:
                assert _request(f"{base}/ok", timeout=2)["ok"] is True
                break
            except (OSError, ValueError):
                if process.poll() is not None or time.monotonic() > deadline:
                    raise RuntimeError(f"langgraph dev did not start; see {log.name}") from None
                time.sleep(0.5)
        yield base
    finally:
        os.killpg(process.pid, signal.SIGTERM)
        try:
            process.wait(timeout=20)
        except subprocess.TimeoutExpired:
            os.killpg(process.pid, signal.SIGKILL)
        log.close()


def test_the_graphs_are_listed(studio):
    assistants = _request(f"{studio}/assistants/search", {})
    assert {"synthesis", "cycle"} <= {assistant["graph_id"] for assistant in assistants}


def test_studio_draws_the_synthesis_nodes_inside_the_cycle(studio):
    assistants: Any = _request(f"{studio}/assistants/search", {"graph_id": "cycle"})
    cycle = next(a for a in assistants if a["graph_id"] == "cycle")
    drawn: Any = _request(f"{studio}/assistants/{cycle['assistant_id']}/graph?xray=true")
    nodes = {node["id"] for node in drawn["nodes"]}
    assert {"synthesize", "record_synthesis", "update_pool"} <= nodes
    assert {
        "synthesis:prepare",
        "synthesis:branch:summarize",
        "synthesis:branch:explore",
        "synthesis:branch:abstract",
        "synthesis:branch:judge",
        "synthesis:dedup",
    } <= nodes


def test_a_synthesis_pass_runs_through_the_server(studio):
    tasks = load_split("validation", size=18)[:2]
    trajectories = run_rollouts(OraclePolicy(), WorldEnvironment, tasks, progress=False)
    flagged = [
        FlaggedTrajectory(
            trajectory=t,
            signals=[Signal(kind="rare", trajectory_id=t.id, task_id=t.task_id, family=t.family)],
        ).model_dump(mode="json")
        for t in trajectories
    ]
    body = {
        "assistant_id": "synthesis",
        "input": {
            "flagged": flagged,
            "parents": [t.model_dump(mode="json") for t in tasks],
            "cycle": 1,
        },
    }
    out = _request(f"{studio}/runs/wait", body, timeout=300)
    assert out["counts"]["flagged"] == 2 and out["counts"]["accepted"] >= 1
    assert out["roles"]["judge"] == "judge:offline"
    assert all(task["source"] == "synthesized" for task in out["accepted"])
