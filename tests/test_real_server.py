"""A real OpenAI-compatible server: `transformers serve` with the tiny model, over real HTTP.

Every other endpoint test talks to the scripted server (coevolve.testing); this
one checks that a server we did not write answers the endpoint policy, and
records what it does differently:
- ``GET /v1/models`` fails (500) unless the Hugging Face hub cache directory
  exists: the fixture points ``HF_HUB_CACHE`` at an empty one;
- it has no tool-call parser for our model, so calls come back as text in
  ``content`` (the endpoint policy parses plain call lines and <tool_call> blocks);
- it applies the model's own chat template with the ``tools`` we send;
- it accepts ``response_format`` and ``tool_choice`` with HTTP 200 and ignores them
  (its log says "Ignoring unsupported fields in the request", once): the roles learn
  that from the first structured reply and then ask for JSON in plain requests;
- it has no LoRA API (``POST /v1/load_lora_adapter`` is 404): a run whose policy it
  serves trains adapters and, with ``policy.hot_load: best_effort``, keeps serving the
  base model with a warning;
- from transformers 5.25 it refuses (HTTP 400) a prompt that leaves no room for a reply
  in the model's context, as vLLM does with ``--max-model-len``: a rollout's prompt, the
  world's tool schemas in it, is about 5,100 of the tiny tokenizer's tokens, so the
  fixture's tiny model takes 8,192 positions (the preset has 1,024).

One server serves the whole module; the tests count the requests it saw in its
own access log.
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import socket
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import httpx
import pytest
import yaml
from langchain_core.messages import HumanMessage
from pydantic import BaseModel

from coevolve.agents.policy.endpoint_policy import EndpointPolicy
from coevolve.agents.policy.rollout import run_rollouts
from coevolve.agents.roles.llm import (
    StructuredOutputError,
    chat_model,
    forget_endpoint_capabilities,
    response_format_support,
    structured_call,
)
from coevolve.agents.roles.role_factory import build_roles
from coevolve.agents.roles.role_interfaces import RolesConfig
from coevolve.config import EndpointConfig
from coevolve.envs.world import WorldEnvironment, load_split
from coevolve.graph.synthesis.context import SynthesisRuntime
from coevolve.graph.synthesis.graph import run_synthesis
from coevolve.memory.signals import FlaggedTrajectory
from coevolve.memory.store import TaskStore
from coevolve.records import Signal
from coevolve.testing.presets import load_preset, tiny_bootstrap
from coevolve.training.bootstrap.build import bootstrap

pytest.importorskip("fastapi", reason="transformers serve needs fastapi (the dev extra)")
pytestmark = pytest.mark.slow


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


@dataclass(frozen=True)
class RealServer:
    base_url: str  # with /v1
    model: str  # the tiny model's directory, the name the server knows it by
    log: Path  # the server's stdout and stderr: uvicorn's access log, its warnings

    def requests(self, route: str, status: int = 200) -> int:
        """How many ``POST /v1/<route>`` requests the server answered with ``status``."""
        line = f'"POST /v1/{route} HTTP/1.1" {status}'
        return self.log.read_text().count(line)

    def endpoint(self, **settings) -> EndpointConfig:
        # max_tokens 16: the tiny model's replies are noise either way; short ones are fast.
        defaults = {"max_tokens": 16, "timeout_s": 60, "max_retries": 1, "concurrency": 2}
        return EndpointConfig(base_url=self.base_url, model=self.model, **{**defaults, **settings})


@pytest.fixture(scope="module")
def real_server(tmp_path_factory):
    """`transformers serve` preloading the tiny bootstrap model (a RealServer)."""
    root = tmp_path_factory.mktemp("real-server")
    model = tiny_bootstrap(max_position_embeddings=8192)  # room for the tool schemas
    model_dir = bootstrap(model, cache_dir=root / "cache", progress=False)
    port = _free_port()
    (root / "hub").mkdir()
    env = {
        **os.environ,
        "HF_HUB_CACHE": str(root / "hub"),
        "HF_HUB_OFFLINE": "1",
        "OMP_NUM_THREADS": "1",
    }
    command = [
        str(Path(sys.executable).parent / "transformers"),
        "serve",
        str(model_dir),
        "--host",
        "127.0.0.1",
        "--port",
        str(port),
    ]
    log = (root / "serve.log").open("w")
    server = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT, env=env)
    base = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 180
        while True:
            if server.poll() is not None:
                pytest.fail(
                    f"transformers serve exited: {(root / 'serve.log').read_text()[-2000:]}"
                )
            try:
                if httpx.get(f"{base}/health", timeout=2).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            if time.monotonic() > deadline:
                pytest.fail("transformers serve did not come up in 180 s")
            time.sleep(0.5)
        yield RealServer(f"{base}/v1", str(model_dir), root / "serve.log")
    finally:
        server.terminate()
        try:
            server.wait(timeout=20)
        except subprocess.TimeoutExpired:
            server.kill()
        log.close()


def test_real_server_lists_models_once_the_hub_cache_exists(real_server):
    base_url = real_server.base_url
    listed = httpx.get(f"{base_url}/models", timeout=30)
    assert listed.status_code == 200 and listed.json()["object"] == "list"


def test_real_server_answers_endpoint_rollouts(real_server):
    base_url, model = real_server.base_url, real_server.model
    endpoint = EndpointConfig(
        base_url=base_url, model=model, max_tokens=12, timeout_s=60, max_retries=1, concurrency=2
    )
    policy = EndpointPolicy(endpoint)
    tasks = load_split("heldout")[:3]
    trajectories = run_rollouts(
        policy, WorldEnvironment, tasks, k=1, max_tool_calls=2, progress=False, cycle=0
    )
    assert [t.task_id for t in trajectories] == [t.id for t in tasks]
    for trajectory in trajectories:
        # Answered over HTTP by the real server: no transport or rejection error, and
        # the server's own token counts came back.
        assert trajectory.error is None, trajectory.error
        assert trajectory.prompt_tokens > 0 and trajectory.completion_tokens > 0
        assert trajectory.score in (0.0, 1.0)


def test_real_server_renders_the_tools_we_send_into_the_prompt(real_server):
    base_url, model = real_server.base_url, real_server.model
    tool = WorldEnvironment().tools()[0]
    sizes = []
    for extra in ({}, {"tools": [tool]}):
        body = {"model": model, "messages": [{"role": "user", "content": "Hi"}], "max_tokens": 2}
        reply = httpx.post(f"{base_url}/chat/completions", json={**body, **extra}, timeout=60)
        assert reply.status_code == 200, reply.text
        sizes.append(reply.json()["usage"]["prompt_tokens"])
    assert sizes[1] > sizes[0]


# --------------------------------------------------------------------------- structured output


class Pair(BaseModel):
    a: int


def test_real_server_ignores_response_format_and_the_roles_learn_it_once(real_server, caplog):
    """transformers serve answers a request with response_format (and tool_choice) with
    200 and an unconstrained reply: the first structured call learns that and falls back,
    every later one sends a single plain request."""
    forget_endpoint_capabilities()
    model = chat_model(real_server.endpoint())
    before = real_server.requests("chat/completions")
    with caplog.at_level(logging.WARNING, logger="coevolve.agents.roles"):
        for _ in range(3):
            # The tiny model's reply is no JSON: a clear error, never a crash.
            with pytest.raises(StructuredOutputError, match="JSON reply unreadable"):
                asyncio.run(structured_call(model, Pair, [HumanMessage("find_contact Ana")]))
    assert response_format_support(model) == "ignored"
    # 2 requests for the first call (with response_format, then plain), 1 for each later one.
    assert real_server.requests("chat/completions") - before == 4
    [warning] = [r.getMessage() for r in caplog.records if "response_format" in r.getMessage()]
    assert f"endpoint {real_server.base_url}" in warning and "ignores response_format" in warning
    server_log = real_server.log.read_text()
    assert "Ignoring unsupported fields in the request: {'response_format'}" in server_log

    # tool_choice (which coevolve does not send) is ignored the same way, not refused.
    body = {
        "model": real_server.model,
        "messages": [{"role": "user", "content": "Hi"}],
        "max_tokens": 2,
        "tools": [WorldEnvironment().tools()[0]],
        "tool_choice": "auto",
    }
    reply = httpx.post(f"{real_server.base_url}/chat/completions", json=body, timeout=60)
    assert reply.status_code == 200, reply.text
    assert "Ignoring unsupported fields in the request: {'tool_choice'}" in (
        real_server.log.read_text()
    )


# --------------------------------------------------------------------------- synthesis


@pytest.fixture(scope="module")
def real_flagged(real_server):
    """Two failed episodes of the real server's policy, flagged (the parents and the items)."""
    tasks = load_split("validation", size=18)[:2]
    policy = EndpointPolicy(real_server.endpoint())
    trajectories = run_rollouts(
        policy, WorldEnvironment, tasks, k=1, max_tool_calls=1, progress=False, cycle=0
    )
    items = [
        FlaggedTrajectory(
            trajectory=trajectory,
            signals=[
                Signal(
                    kind="boundary",
                    trajectory_id=trajectory.id,
                    task_id=task.id,
                    family=task.family,
                )
            ],
        )
        for trajectory, task in zip(trajectories, tasks, strict=True)
    ]
    return items, tasks


def synthesis_on_the_real_server(real_server, real_flagged, caplog, **roles):
    """One synthesis pass with ``roles`` (RolesConfig fields), endpoint "real" on the server:
    the result, the chat completions the server answered, and the roles' warnings."""
    forget_endpoint_capabilities()
    items, tasks = real_flagged
    config = RolesConfig(
        default_endpoint="real", llm_concurrency=2, explorer_rounds=1, explorer_steps=2, **roles
    )
    runtime = SynthesisRuntime(
        roles=build_roles(config, {"real": real_server.endpoint()}, synthesizer="llm"),
        make_env=WorldEnvironment,
        store=TaskStore(None),
    )
    before = real_server.requests("chat/completions")
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="coevolve.agents"):
        result = asyncio.run(run_synthesis(items, tasks, runtime, max_concurrency=2))
    warnings = [r.getMessage() for r in caplog.records]
    return result, real_server.requests("chat/completions") - before, warnings


def test_real_server_answers_every_llm_synthesis_role(real_server, real_flagged, caplog):
    """The synthesis graph over real HTTP: the tiny model's replies are unreadable, and each
    role says so in a recorded reason; nothing crashes and nothing is accepted."""
    items, _ = real_flagged
    n = len(items)

    # Summarizer, explorer and abstractor on the server. The judge is built on it too, but
    # sees no candidate: noise makes none.
    result, requests, warnings = synthesis_on_the_real_server(real_server, real_flagged, caplog)
    roles = dict(result.roles)
    assert roles.pop("synthesizer") == "llm"
    assert set(roles) == {"summarizer", "explorer", "abstractor", "judge"}
    assert all(f":llm({real_server.model})" in name for name in roles.values())
    assert result.counts["flagged"] == n and result.counts["crashed"] == 0
    assert result.accepted == [] and result.counts["candidates"] == 0
    # The summarizer fell back to the environment-grounded context, saying why.
    summarizer = [w for w in warnings if w.startswith("summarizer reply unreadable")]
    assert len(summarizer) == n and all("reply is empty" in w or "JSON" in w for w in summarizer)
    by_stage: dict[str, list[str]] = {}
    for rejection in result.rejections:
        by_stage.setdefault(rejection.stage, []).append(rejection.reason)
    assert by_stage["explore"] == ["exploration made no interactions"] * n
    assert len(by_stage["abstract"]) == n
    assert all(r.startswith("abstractor reply unreadable") for r in by_stage["abstract"])
    # Per item: summarizer 1 (+1 for the one call that learnt response_format is ignored;
    # concurrent first calls may each learn it), explorer 1 (noise holds no call line, which ends its round),
    # abstractor 1 (plain, once learnt; else 2).
    assert 3 * n + 1 <= requests <= 5 * n, requests

    # The judge on the server: the offline explorer and abstractor make candidates from the
    # world, and the judge's verdict on each is a request to the server.
    result, requests, warnings = synthesis_on_the_real_server(
        real_server, real_flagged, caplog, explorer="offline", abstractor="offline"
    )
    assert result.roles["judge"] == f"judge:llm({real_server.model})"
    judged = result.counts["candidates"]
    assert judged > 0 and result.counts["crashed"] == 0
    judge_reasons = [r.reason for r in result.rejections if r.stage == "judge"]
    unreadable = [r for r in judge_reasons if r.startswith("judge reply unreadable")]
    assert unreadable and len(judge_reasons) == judged
    assert result.accepted == []  # the judge's veto: no readable yes, no task
    # Summarizer 1 per item (+1 when it learns), judge 1 per candidate whose replay ran.
    assert n + len(unreadable) <= requests <= 2 * n + 2 * judged, requests


# --------------------------------------------------------------------------- a run


def test_real_server_is_the_policy_of_a_one_cycle_run(real_server, tmp_path):
    """`coevolve run --cycles 1` with the policy on the real server: rollouts, synthesis,
    a LoRA step on the tiny model's local copy, evaluation and the summary. The server
    has no LoRA API; with policy.hot_load: best_effort the run says so and goes on."""
    run_dir = tmp_path / "run"
    quick = load_preset("bench-quick")
    config = {
        "run_dir": str(run_dir),
        "endpoints": {
            "real": real_server.endpoint(max_tokens=12).model_dump(mode="json", exclude_unset=True)
        },
        "policy": {
            "kind": "endpoint",
            "endpoint": "real",
            "train_model": real_server.model,
            "hot_load": "best_effort",
            # the tiny model reads 1024 positions; the world's 31 tool schemas fill 5k
            "tools_in_prompt": False,
        },
        **{key: quick[key] for key in ("rollout", "pool", "signals", "synthesis", "evaluation")},
        "training": {**load_preset("training-tiny"), "max_steps": 1, "batch_size": 2},
    }
    path = tmp_path / "config.yaml"
    path.write_text(yaml.safe_dump(config))
    env = {**os.environ, "PYTHONUNBUFFERED": "1", "COLUMNS": "200", "OMP_NUM_THREADS": "1"}
    before = real_server.requests("chat/completions")
    run = subprocess.run(
        [sys.executable, "-m", "coevolve", "run", str(path), "--cycles", "1", "--json"],
        capture_output=True,
        text=True,
        timeout=600,
        env=env,
    )
    assert run.returncode == 0, run.stderr[-3000:]
    assert real_server.requests("chat/completions") - before > 0  # the policy was the server

    summary = json.loads((run_dir / "summary.json").read_text())
    assert [c["cycle"] for c in summary["cycles"]] == [0, 1]
    trained = json.loads((run_dir / "cycles" / "001" / "train.json").read_text())
    assert trained["steps"] == 1 and (run_dir / "adapters" / "cycle-1").is_dir()
    # The load was tried once, refused by the server, and the run said what that means.
    assert real_server.requests("load_lora_adapter", 404) == 1
    [warning] = [
        line for line in (run_dir / "run.log").read_text().splitlines() if "hot-load" in line
    ]
    assert "WARNING" in warning and "HTTP 404" in warning
    assert f"keeps serving {real_server.model}" in warning
