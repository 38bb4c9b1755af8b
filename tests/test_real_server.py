"""A real OpenAI-compatible server: `transformers serve` with the tiny model, over real HTTP.

Every other endpoint test talks to the scripted server (coevolve.testing); this
one checks that a server we did not write answers the endpoint policy, and
records what it does differently:
- ``GET /v1/models`` fails (500) unless the Hugging Face hub cache directory
  exists: the fixture points ``HF_HUB_CACHE`` at an empty one;
- it has no tool-call parser for our model, so calls come back as text in
  ``content`` (the endpoint policy parses plain call lines and <tool_call> blocks);
- it applies the model's own chat template with the ``tools`` we send.
"""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest

from coevolve.agents.endpoint_policy import EndpointPolicy
from coevolve.agents.rollout import run_rollouts
from coevolve.config import EndpointConfig
from coevolve.envs.world import WorldEnvironment, load_split
from coevolve.testing.presets import tiny_bootstrap
from coevolve.training.bootstrap import bootstrap

pytest.importorskip("fastapi", reason="transformers serve needs fastapi (the dev extra)")
pytestmark = pytest.mark.slow


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


@pytest.fixture(scope="module")
def real_server(tmp_path_factory):
    """(base_url, model name): `transformers serve` preloading the tiny bootstrap model."""
    root = tmp_path_factory.mktemp("real-server")
    model_dir = bootstrap(tiny_bootstrap(), cache_dir=root / "cache", progress=False)
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
        yield f"{base}/v1", str(model_dir)
    finally:
        server.terminate()
        try:
            server.wait(timeout=20)
        except subprocess.TimeoutExpired:
            server.kill()
        log.close()


def test_real_server_lists_models_once_the_hub_cache_exists(real_server):
    base_url, _ = real_server
    listed = httpx.get(f"{base_url}/models", timeout=30)
    assert listed.status_code == 200 and listed.json()["object"] == "list"


def test_real_server_answers_endpoint_rollouts(real_server):
    base_url, model = real_server
    endpoint = EndpointConfig(
        base_url=base_url, model=model, max_tokens=12, timeout_s=60, max_retries=1, concurrency=2
    )
    policy = EndpointPolicy(endpoint)
    tasks = load_split("heldout")[:3]
    trajectories = run_rollouts(
        policy, WorldEnvironment, tasks, k=1, max_steps=2, progress=False, cycle=0
    )
    assert [t.task_id for t in trajectories] == [t.id for t in tasks]
    for trajectory in trajectories:
        # Answered over HTTP by the real server: no transport or rejection error, and
        # the server's own token counts came back.
        assert trajectory.error is None, trajectory.error
        assert trajectory.prompt_tokens > 0 and trajectory.completion_tokens > 0
        assert trajectory.score in (0.0, 1.0)


def test_real_server_renders_the_tools_we_send_into_the_prompt(real_server):
    base_url, model = real_server
    tool = WorldEnvironment().tools()[0]
    sizes = []
    for extra in ({}, {"tools": [tool]}):
        body = {"model": model, "messages": [{"role": "user", "content": "Hi"}], "max_tokens": 2}
        reply = httpx.post(f"{base_url}/chat/completions", json={**body, **extra}, timeout=60)
        assert reply.status_code == 200, reply.text
        sizes.append(reply.json()["usage"]["prompt_tokens"])
    assert sizes[1] > sizes[0]
