"""`coevolve serve`: the vllm serve command derived from a config, for the shipped configs."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from coevolve.commands.serve import ServeError, vllm_command
from coevolve.config import load_config

ROOT = Path(__file__).resolve().parents[1]
QWEN = "Qwen/Qwen2.5-7B-Instruct --host 127.0.0.1 --port 8000"
TOOLS = "--enable-auto-tool-choice --tool-call-parser hermes"
# vLLM samples with the request's fields and its own defaults, not generation_config.json's.
SAMPLING = "--generation-config vllm"


def dry_run(*arguments: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "coevolve", "serve", *arguments],
        capture_output=True,
        text=True,
        timeout=120,
    )


@pytest.mark.parametrize(
    "config, rank, length",
    [("vllm.yaml", 16, 8192 + 512), ("bfcl.yaml", 16, 16384), ("seal-bfcl-gpu.yaml", 64, 16384)],
)
def test_the_shipped_gpu_configs_get_a_runnable_command(config, rank, length):
    out = dry_run(str(ROOT / "configs" / config), "--dry-run")
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == (
        f"VLLM_ALLOW_RUNTIME_LORA_UPDATING=True vllm serve {QWEN} {SAMPLING} "
        f"--max-model-len {length} {TOOLS} --enable-lora --max-lora-rank {rank} --max-loras 2"
    )
    # every comment in the config that shows a vllm serve command agrees on the rank
    text = (ROOT / "configs" / config).read_text()
    assert f"coevolve serve configs/{config}" in text


def test_the_lora_rank_fits_and_a_rank_vllm_cannot_serve_is_refused():
    config = load_config(ROOT / "configs" / "vllm.yaml", ["training.lora.r=20"])
    environment, argv = vllm_command(config)
    assert argv[argv.index("--max-lora-rank") + 1] == "32"
    assert environment == {"VLLM_ALLOW_RUNTIME_LORA_UPDATING": "True"}
    with pytest.raises(ServeError, match="above vLLM's largest --max-lora-rank"):
        vllm_command(load_config(ROOT / "configs" / "vllm.yaml", ["training.lora.r=600"]))
    # no hot-loading: no LoRA flags and no variable; no tools in the prompt: no parser
    config = load_config(
        ROOT / "configs" / "vllm.yaml", ["policy.hot_load='off'", "policy.tools_in_prompt=false"]
    )
    assert vllm_command(config) == (
        {},
        ["vllm", "serve", *QWEN.split(), *SAMPLING.split(), "--max-model-len", "8704"],
    )


def test_what_cannot_be_served_here_says_what_to_set(tmp_path):
    remote = load_config(
        ROOT / "configs" / "vllm.yaml", ["endpoints.qwen.base_url=https://api.example.com/v1"]
    )
    with pytest.raises(ServeError, match="serve it on this machine with a port"):
        vllm_command(remote)
    unknown = load_config(ROOT / "configs" / "vllm.yaml", ["endpoints.qwen.model=acme/widget-7b"])
    with pytest.raises(ServeError, match="pass --tool-call-parser"):
        vllm_command(unknown)
    assert "--tool-call-parser pythonic" in " ".join(vllm_command(unknown, None, "pythonic")[1])
    out = dry_run(str(ROOT / "configs" / "quickstart.yaml"), "--dry-run")
    assert out.returncode == 2 and "pass --endpoint NAME" in out.stderr


@pytest.mark.skipif(shutil.which("vllm") is not None, reason="vLLM is installed here")
def test_without_vllm_it_says_so_in_one_line():
    out = dry_run(str(ROOT / "configs" / "vllm.yaml"), "--vllm-arg=--max-model-len")
    assert out.returncode == 2
    [line] = out.stderr.strip().splitlines()
    assert line.startswith("error: vLLM is not installed here: pip install 'coevolve[vllm]'")


def test_an_endpoint_on_transformers_serve_gets_its_command(tmp_path):
    config = tmp_path / "writer.yaml"
    config.write_text(
        "endpoints:\n  writer:\n    base_url: http://127.0.0.1:8011/v1\n"
        "    model: /models/writer-1\n    server: transformers\n"
        "synthesis:\n  roles:\n    writer: writer\n"
    )
    out = dry_run(str(config), "--endpoint", "writer", "--dry-run")
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == (
        "HF_HUB_OFFLINE=1 transformers serve /models/writer-1 --host 127.0.0.1 --port 8011"
    )


def test_the_context_and_the_parallelism_come_from_the_config():
    """--max-model-len: the longest conversation training reads plus one reply, unless the
    endpoint sets it; tensor and data parallelism from the endpoint; a --vllm-arg of the
    same flag replaces the derived one."""
    config = load_config(
        ROOT / "configs" / "vllm.yaml",
        [
            "training.max_length=2048",
            "endpoints.qwen.max_tokens=256",
            "endpoints.qwen.tensor_parallel_size=2",
            "endpoints.qwen.data_parallel_size=4",
        ],
    )
    argv = vllm_command(config)[1]
    assert argv[argv.index("--max-model-len") + 1] == "2304"
    assert argv[argv.index("--tensor-parallel-size") + 1] == "2"
    assert argv[argv.index("--data-parallel-size") + 1] == "4"
    set_length = load_config(ROOT / "configs" / "vllm.yaml", ["endpoints.qwen.max_model_len=32768"])
    argv = vllm_command(set_length)[1]
    assert argv[argv.index("--max-model-len") + 1] == "32768"
    assert "--tensor-parallel-size" not in argv and "--data-parallel-size" not in argv
    out = dry_run(
        str(ROOT / "configs" / "vllm.yaml"), "--dry-run", "--vllm-arg=--max-model-len=4096"
    )
    assert out.returncode == 0, out.stderr
    assert out.stdout.count("--max-model-len") == 1 and "--max-model-len=4096" in out.stdout
    # a role's endpoint (not the policy's): the model's own context unless max_model_len says
    roles = load_config(
        ROOT / "configs" / "vllm.yaml",
        ["endpoints.judge={base_url: 'http://127.0.0.1:8002/v1', model: Qwen/Qwen2.5-7B-Instruct}"],
    )
    argv = vllm_command(roles, "judge")[1]
    assert "--max-model-len" not in argv and "--generation-config" in argv


def test_grpo_on_a_vllm_server_gets_trl_vllm_serve(tmp_path):
    config = tmp_path / "grpo-server.yaml"
    config.write_text(
        "policy:\n  kind: local\n  model: /models/qwen-0.5b\n  device: cuda\n"
        "training:\n  algorithm: grpo\n  device: cuda\n  max_length: 4096\n"
        "  grpo:\n    rollout: tool_loop\n    vllm: server\n"
        "    vllm_server_url: http://127.0.0.1:8001\n    vllm_data_parallel_size: 2\n"
    )
    out = dry_run(str(config), "--dry-run")
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == (
        "trl vllm-serve --model /models/qwen-0.5b --host 127.0.0.1 --port 8001 "
        "--max-model-len 4096 --data-parallel-size 2"
    )
    out = dry_run(str(ROOT / "configs" / "vllm.yaml"), "--grpo", "--dry-run")
    assert out.returncode == 2 and "training.grpo.vllm is not 'server'" in out.stderr
    named = dry_run(str(config), "--grpo", "--model", "Qwen/Qwen2.5-0.5B-Instruct", "--dry-run")
    assert "--model Qwen/Qwen2.5-0.5B-Instruct" in named.stdout
