"""`coevolve serve`: the vllm serve command derived from a config, for the shipped configs."""

from __future__ import annotations

import os
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
        "synthesis:\n  synthesizer: llm\n  roles:\n    default_endpoint: writer\n"
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


def _llama_cpp_config(tmp_path: Path, section: str = "") -> Path:
    config = tmp_path / "teacher.yaml"
    config.write_text(
        "endpoints:\n  teacher:\n    base_url: http://127.0.0.1:8020/v1\n"
        "    model: teacher\n    server: llama.cpp\n    concurrency: 2\n"
        f"    max_model_len: 4096\n{section}"
        "synthesis:\n  synthesizer: llm\n  roles:\n    explorer: teacher\n"
    )
    return config


def test_an_endpoint_on_llama_cpp_gets_llama_server_with_its_flags(tmp_path):
    """Context per slot times slots, slots from concurrency, threads, the GGUF's own template
    rendered with --jinja, and the prompt cache, all from the endpoint."""
    section = (
        "    llama_cpp:\n      gguf_file: /models/teacher.gguf\n      binary: /opt/llama-server\n"
        "      threads: 2\n      cache_reuse: 128\n"
    )
    out = dry_run(str(_llama_cpp_config(tmp_path, section)), "--endpoint", "teacher", "--dry-run")
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == (
        "/opt/llama-server -m /models/teacher.gguf --alias teacher --host 127.0.0.1 --port 8020 "
        "-c 8192 -np 2 --no-kv-unified -t 2 --jinja --cache-reuse 128 --cache-ram 2048 "
        "--no-webui"
    )
    replaced = dry_run(
        str(_llama_cpp_config(tmp_path, section)),
        *("--endpoint", "teacher", "--dry-run", "--vllm-arg=-c", "--vllm-arg=2048"),
    )
    assert " -c 8192 " not in replaced.stdout and replaced.stdout.strip().endswith("-c 2048")


def test_llama_cpp_defaults_to_what_make_larger_model_installs_and_says_so_when_absent(tmp_path):
    cache = tmp_path / "cache"
    env = {**os.environ, "COEVOLVE_CACHE": str(cache), "PATH": os.path.dirname(sys.executable)}
    command = [sys.executable, "-m", "coevolve", "serve", str(_llama_cpp_config(tmp_path))]
    command += ["--endpoint", "teacher"]
    printed = subprocess.run(
        [*command, "--dry-run"], capture_output=True, text=True, timeout=120, env=env
    )
    assert printed.returncode == 0, printed.stderr
    assert printed.stdout.startswith(
        f"{cache}/llama.cpp/bin/llama-server -m "
        f"{cache}/larger-model/qwen2.5-coder-1.5b-instruct-q4_k_m.gguf "
    )
    absent = subprocess.run(command, capture_output=True, text=True, timeout=120, env=env)
    assert absent.returncode == 2
    [line] = absent.stderr.strip().splitlines()
    assert line.startswith("error: llama-server is not at ") and "`make larger-model`" in line


def test_a_llama_cpp_section_on_another_server_is_refused(tmp_path):
    config = tmp_path / "wrong.yaml"
    config.write_text(
        "endpoints:\n  writer:\n    base_url: http://127.0.0.1:8011/v1\n    model: w\n"
        "    server: transformers\n    llama_cpp:\n      threads: 2\n"
    )
    out = dry_run(str(config), "--endpoint", "writer", "--dry-run")
    assert out.returncode == 2
    assert "the llama_cpp section is for server: llama.cpp" in out.stderr


def _larger_model_installed() -> tuple[Path, Path] | None:
    from coevolve.commands.serve import LARGER_MODEL_GGUF, LLAMA_SERVER
    from coevolve.common.files import default_cache_dir

    binary = shutil.which("llama-server") or str(default_cache_dir() / LLAMA_SERVER)
    gguf = default_cache_dir() / LARGER_MODEL_GGUF
    return (Path(binary), gguf) if Path(binary).is_file() and gguf.is_file() else None


@pytest.mark.slow
@pytest.mark.skipif(
    _larger_model_installed() is None, reason="`make larger-model` has not run here"
)
def test_the_teacher_served_by_coevolve_serve_answers_and_caches_its_prompt(tmp_path):
    """The wiring end to end, when `make teacher` has installed llama-server and the model:
    `coevolve serve` starts it from the config; a chat request with a tool gets a reply, and
    a second request with the same opening is served from the slot's prompt cache."""
    import json
    import socket
    import time
    import urllib.request

    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    config = tmp_path / "teacher.yaml"
    config.write_text(
        f"endpoints:\n  teacher:\n    base_url: http://127.0.0.1:{port}/v1\n    model: teacher\n"
        "    server: llama.cpp\n    concurrency: 1\n    max_model_len: 2048\n"
    )
    server = subprocess.Popen(
        [sys.executable, "-m", "coevolve", "serve", str(config), "--endpoint", "teacher"],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    base = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 300
        while time.monotonic() < deadline:
            try:
                with urllib.request.urlopen(f"{base}/health", timeout=5) as ok:
                    if ok.status == 200:
                        break
            except OSError:
                time.sleep(1)
        else:
            pytest.fail("llama-server did not come up within 300 s")
        tool = {
            "type": "function",
            "function": {
                "name": "find_contact",
                "description": "Look up a contact by name.",
                "parameters": {
                    "type": "object",
                    "properties": {"name": {"type": "string"}},
                    "required": ["name"],
                },
            },
        }
        body = {
            "model": "teacher",
            "messages": [
                {"role": "system", "content": "You call tools to help the user. " * 20},
                {"role": "user", "content": "Find the contact named Ana."},
            ],
            "tools": [tool],
            "max_tokens": 48,
            "temperature": 0,
        }
        replies = []
        for _ in range(2):
            request = urllib.request.Request(
                f"{base}/v1/chat/completions",
                data=json.dumps(body).encode(),
                headers={"Content-Type": "application/json"},
            )
            with urllib.request.urlopen(request, timeout=600) as response:
                replies.append(json.loads(response.read()))
        message = replies[0]["choices"][0]["message"]
        assert message.get("tool_calls") or message.get("content")
        # llama-server reports how many prompt tokens it took from the cache.
        assert replies[1]["timings"]["cache_n"] > 0
    finally:
        server.terminate()
        server.wait(timeout=30)
