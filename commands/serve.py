"""``coevolve serve``: the ``vllm serve`` (or ``trl vllm-serve``, ``transformers serve``,
llama.cpp's ``llama-server``) command a config expects, printed or run.

A run's endpoint and training settings decide the server's flags: the model and
the port come from the endpoint, LoRA hot-loading needs ``--enable-lora`` with a
``--max-lora-rank`` at least the adapters' rank and vLLM's runtime-LoRA variable,
and tools in the request need vLLM's tool-call parser for the model's family.
Writing them by hand let a rank above ``--max-lora-rank`` or a missing variable
surface only mid-run, when the first adapter failed to load.
"""

from __future__ import annotations

import os
import shlex
import shutil
from pathlib import Path
from typing import Annotated, Any
from urllib.parse import urlparse

import typer

from .common import SetOption, console, fail

# vLLM's accepted --max-lora-rank values.
VLLM_LORA_RANKS = (1, 8, 16, 32, 64, 128, 256, 320, 512)
# vLLM's tool-call parser by model family (a substring of the model name, lowercased).
TOOL_CALL_PARSERS = (
    ("qwen3-coder", "qwen3_coder"),
    ("qwen", "hermes"),
    ("hermes", "hermes"),
    ("llama-3", "llama3_json"),
    ("llama3", "llama3_json"),
    ("mistral", "mistral"),
    ("granite", "granite"),
)
RUNTIME_LORA = "VLLM_ALLOW_RUNTIME_LORA_UPDATING"


class ServeError(ValueError):
    """A config the server command cannot be derived from; the message says what to set."""


def vllm_command(
    config: Any, endpoint: str | None = None, tool_call_parser: str | None = None
) -> tuple[dict[str, str], list[str]]:
    """(environment variables, argv) of the ``vllm serve`` that serves ``endpoint`` of
    ``config`` (default: the policy's)."""
    name = endpoint
    if name is None:
        if not isinstance(config.policy.endpoint, str):
            raise ServeError(
                "the policy is not on a named endpoint: pass --endpoint NAME (one of: "
                f"{', '.join(config.endpoints) or 'none defined'})"
            )
        name = config.policy.endpoint
    served, host, port = _served_here(config, name)
    argv = ["vllm", "serve", served.model, "--host", host, "--port", port]
    # Sampling as the request and the config say: without it vLLM fills every field a
    # request leaves out (top_p, top_k, repetition_penalty) from generation_config.json.
    argv += ["--generation-config", "vllm"]
    environment: dict[str, str] = {}
    serves_policy = config.policy.kind == "endpoint" and config.policy.endpoint == name
    length = served.max_model_len
    if length is None and serves_policy:
        # The longest conversation training reads, and one reply on top of it.
        length = config.training.max_length + served.max_tokens
    if length is not None:
        argv += ["--max-model-len", str(length)]
    argv += _parallel(served.tensor_parallel_size, served.data_parallel_size)
    if serves_policy and config.policy.renders_tools:
        parser = tool_call_parser or _parser_for(served.model)
        argv += ["--enable-auto-tool-choice", "--tool-call-parser", parser]
    if serves_policy and config.policy.hot_load != "off":
        rank = config.training.lora.r
        fitting = [r for r in VLLM_LORA_RANKS if r >= rank]
        if not fitting:
            raise ServeError(
                f"training.lora.r {rank} is above vLLM's largest --max-lora-rank "
                f"({VLLM_LORA_RANKS[-1]}): lower it"
            )
        # The cycle's new adapter is loaded before the old one is unloaded: two at once.
        argv += ["--enable-lora", "--max-lora-rank", str(fitting[0]), "--max-loras", "2"]
        environment[RUNTIME_LORA] = "True"
    return environment, argv


def _parallel(tensor: int, data: int) -> list[str]:
    """The parallelism flags vLLM and ``trl vllm-serve`` share (none at 1, their default)."""
    flags = []
    if tensor > 1:
        flags += ["--tensor-parallel-size", str(tensor)]
    if data > 1:
        flags += ["--data-parallel-size", str(data)]
    return flags


def trl_vllm_command(config: Any, model: str | None = None) -> tuple[dict[str, str], list[str]]:
    """(environment variables, argv) of the ``trl vllm-serve`` that GRPO generates with under
    ``training.grpo.vllm: server``: the base model the step trains (TRL pushes the new weights
    to it every step), at ``grpo.vllm_server_url``, holding ``training.max_length``."""
    grpo = config.training.grpo
    if grpo.vllm != "server" or grpo.vllm_server_url is None:
        raise ServeError(
            "training.grpo.vllm is not 'server': `trl vllm-serve` serves GRPO's generation only "
            "then (set training.grpo.vllm: server and training.grpo.vllm_server_url)"
        )
    url = urlparse(grpo.vllm_server_url)
    if url.hostname not in ("127.0.0.1", "localhost", "0.0.0.0", "::1") or url.port is None:
        raise ServeError(
            f"training.grpo.vllm_server_url is {grpo.vllm_server_url}: serve it on this machine "
            "with a port (e.g. http://127.0.0.1:8001)"
        )
    if model is None:
        model = config.policy.train_model
        if model is None and config.policy.kind == "local" and config.policy.model != "bootstrap":
            model = config.policy.model
    if model is None:
        raise ServeError(
            "the model GRPO trains is not named in the config (policy.train_model, or a local "
            "policy.model directory): pass --model"
        )
    argv = ["trl", "vllm-serve", "--model", model, "--host", url.hostname, "--port", str(url.port)]
    argv += ["--max-model-len", str(config.training.max_length)]
    argv += _parallel(grpo.vllm_tensor_parallel_size, grpo.vllm_data_parallel_size)
    return {}, argv


def _served_here(config: Any, name: str) -> tuple[Any, str, str]:
    """(endpoint config, host, port) of endpoint ``name``, which must be on this machine."""
    if name not in config.endpoints:
        raise ServeError(
            f"no endpoint {name!r} in the config; defined: {', '.join(config.endpoints) or 'none'}"
        )
    served = config.endpoints[name]
    url = urlparse(served.base_url)
    if url.hostname not in ("127.0.0.1", "localhost", "0.0.0.0", "::1") or url.port is None:
        raise ServeError(
            f"endpoint {name!r} is at {served.base_url}: serve it on this machine with a port "
            "in base_url (e.g. http://127.0.0.1:8000/v1)"
        )
    return served, url.hostname, str(url.port)


def transformers_command(config: Any, endpoint: str) -> tuple[dict[str, str], list[str]]:
    """(environment variables, argv) of the ``transformers serve`` that serves ``endpoint``:
    the CPU path, e.g. the task writer (its directory is the model name requests send)."""
    served, host, port = _served_here(config, endpoint)
    argv = ["transformers", "serve", served.model, "--host", host, "--port", port]
    # Offline, with an existing hub cache: its /v1/models lists the cache and fails without one.
    return {"HF_HUB_OFFLINE": "1"}, argv


# Context a llama-server slot holds when the endpoint sets no max_model_len: the world's
# tool prompt (2.3k tokens) with worked examples and a few turns of exploration.
LLAMA_CPP_SLOT_CONTEXT = 8192
LARGER_MODEL_GGUF = "larger-model/qwen2.5-coder-1.5b-instruct-q4_k_m.gguf"
LLAMA_SERVER = "llama.cpp/bin/llama-server"


def llama_cpp_command(config: Any, endpoint: str) -> tuple[dict[str, str], list[str]]:
    """(environment variables, argv) of the ``llama-server`` that serves ``endpoint``: a GGUF
    model on the CPU under the endpoint's model name, one slot per request in flight, each
    slot holding ``max_model_len`` tokens and caching its prompt for the next request."""
    from ..common.files import default_cache_dir

    served, host, port = _served_here(config, endpoint)
    settings = served.llama_cpp
    cache = default_cache_dir()
    gguf = (
        Path(settings.gguf_file).expanduser() if settings.gguf_file else cache / LARGER_MODEL_GGUF
    )
    binary = settings.binary or shutil.which("llama-server") or str(cache / LLAMA_SERVER)
    slots = served.concurrency
    per_slot = served.max_model_len or LLAMA_CPP_SLOT_CONTEXT
    argv = [binary, "-m", str(gguf), "--alias", served.model, "--host", host, "--port", port]
    # -c is the whole KV cache, split evenly across the -np slots.
    argv += ["-c", str(per_slot * slots), "-np", str(slots), "--no-kv-unified"]
    if settings.threads is not None:
        argv += ["-t", str(settings.threads)]
    argv += ["--jinja"]
    if settings.chat_template_file is not None:
        argv += ["--chat-template-file", settings.chat_template_file]
    argv += ["--cache-reuse", str(settings.cache_reuse), "--cache-ram", str(settings.cache_ram_mib)]
    argv += ["--no-webui"]
    return {}, argv


def _missing_llama_cpp(argv: list[str]) -> str | None:
    """What of a llama-server command is not on this machine, with how to get it."""
    binary, gguf = Path(argv[0]), Path(argv[argv.index("-m") + 1])
    if shutil.which(str(binary)) is None:
        return (
            f"llama-server is not at {binary}: `make larger-model` builds it "
            "(--dry-run prints the command)"
        )
    if not gguf.is_file():
        return (
            f"the GGUF file {gguf} is not there: `make larger-model` joins the larger model, or set "
            "llama_cpp.gguf_file"
        )
    return None


def _parser_for(model: str) -> str:
    lowered = model.lower()
    for family, parser in TOOL_CALL_PARSERS:
        if family in lowered:
            return parser
    raise ServeError(
        f"no known vLLM tool-call parser for {model!r}: pass --tool-call-parser (see vLLM's "
        "tool calling docs), or set policy.tools_in_prompt: false"
    )


# Flags derived here that a --vllm-arg of the same name replaces (each takes one value).
DERIVED_FLAGS = (
    "--generation-config",
    "--max-model-len",
    "--tensor-parallel-size",
    "--data-parallel-size",
    # llama-server's
    "-c",
    "-np",
    "-t",
    "--cache-reuse",
    "--cache-ram",
)


def _without(argv: list[str], extra: list[str]) -> list[str]:
    """``argv`` less each derived flag (and its value) that ``extra`` sets itself."""
    given = {item.split("=", 1)[0] for item in extra}
    out: list[str] = []
    skip = False
    for item in argv:
        if skip:
            skip = False
        elif item in DERIVED_FLAGS and item in given:
            skip = True
        else:
            out.append(item)
    return out


def shell_line(environment: dict[str, str], argv: list[str]) -> str:
    """The command as one shell line, variables first."""
    return " ".join(
        [*(f"{k}={shlex.quote(v)}" for k, v in environment.items()), *map(shlex.quote, argv)]
    )


def serve_command(
    config_path: Annotated[str, typer.Argument(help="The run's YAML config.")],
    endpoint: Annotated[
        str | None,
        typer.Option(help="The entry of `endpoints` to serve (default: the policy's)."),
    ] = None,
    tool_call_parser: Annotated[
        str | None,
        typer.Option(help="vLLM's --tool-call-parser (default: from the model's family)."),
    ] = None,
    grpo: Annotated[
        bool,
        typer.Option(
            "--grpo",
            help="Serve GRPO's generation (`trl vllm-serve`, training.grpo.vllm: server) instead "
            "of an endpoint; the default when the policy has no endpoint and the config asks so.",
        ),
    ] = False,
    model: Annotated[
        str | None,
        typer.Option(help="--grpo: the model trl vllm-serve loads (default: policy.train_model)."),
    ] = None,
    dry_run: Annotated[
        bool, typer.Option("--dry-run", help="Print the command instead of running it.")
    ] = False,
    extra: Annotated[
        list[str] | None,
        typer.Option(
            "--vllm-arg",
            help="One more argument for the server (vllm serve, llama-server), repeatable (e.g. "
            "--vllm-arg=--max-model-len --vllm-arg=16384); it replaces a derived flag of its name.",
        ),
    ] = None,
    overrides: SetOption = None,
) -> None:
    """Serve a config's endpoint: with vLLM, the model, its port, sampling as the request says
    (--generation-config vllm), the context (--max-model-len), tensor and data parallelism,
    LoRA hot-loading at the adapters' rank and tool calling, derived from the config; with
    ``transformers serve`` (the endpoint's ``server: transformers``, the CPU path), the model
    directory and port; with llama.cpp's ``llama-server`` (``server: llama.cpp``, a GGUF model
    on the CPU), the file, context, slots, threads, chat template and prompt cache; with
    --grpo, the ``trl vllm-serve`` GRPO generates with."""
    from ..config import ConfigError, load_config

    try:
        config = load_config(config_path, overrides or [])
        environment, argv = _server_command(config, endpoint, tool_call_parser, grpo, model)
    except (ConfigError, ServeError) as err:
        raise fail(str(err)) from None
    extra = list(extra or [])
    argv = [*_without(argv, extra), *extra]
    if dry_run:
        console.print(shell_line(environment, argv), soft_wrap=True, markup=False)
        return
    _check_installed(argv)
    console.print(shell_line(environment, argv), soft_wrap=True, markup=False)
    os.execvpe(argv[0], argv, {**os.environ, **environment})


def _server_command(
    config: Any, endpoint: str | None, tool_call_parser: str | None, grpo: bool, model: str | None
) -> tuple[dict[str, str], list[str]]:
    """The server to start and its environment: ``trl vllm-serve`` for --grpo (or when the
    policy has no endpoint and training.grpo.vllm is server), else the endpoint's server
    (``transformers serve``, llama.cpp's ``llama-server``, or ``vllm serve``)."""
    name = endpoint or config.policy.endpoint
    grpo_server = config.training.grpo.vllm == "server"
    if grpo or (endpoint is None and not isinstance(name, str) and grpo_server):
        return trl_vllm_command(config, model)
    server = config.endpoints[name].server if name in config.endpoints else None
    if isinstance(name, str) and server == "transformers":
        return transformers_command(config, name)
    if isinstance(name, str) and server == "llama.cpp":
        return llama_cpp_command(config, name)
    return vllm_command(config, endpoint, tool_call_parser)


def _check_installed(argv: list[str]) -> None:
    """The error exit when the server ``argv`` starts is not installed here; the venv's own
    ``transformers`` console script, found beside this Python when PATH lacks it, goes into
    ``argv``."""
    if argv[:2] != ["vllm", "serve"] and argv[0] not in ("trl", "transformers"):
        missing = _missing_llama_cpp(argv)
        if missing is not None:
            raise fail(missing)
    elif argv[0] == "transformers":
        import sys

        local = Path(sys.executable).parent / "transformers"
        argv[0] = str(local) if local.exists() else argv[0]
    else:
        import importlib.util

        has_vllm = importlib.util.find_spec("vllm") if argv[0] == "trl" else shutil.which("vllm")
        if has_vllm is None:
            raise fail(
                "vLLM is not installed here: pip install 'coevolve[vllm]' on a machine with a GPU "
                "(--dry-run prints the command)"
            )
