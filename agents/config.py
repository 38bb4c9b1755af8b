"""Configuration of the agent side: endpoints, the policy, rollout sampling, evaluation."""

from __future__ import annotations

import os
from typing import Literal

from pydantic import Field, model_validator

from ..common.config_base import ConfigError, Section
from ..envs.registry import ENVIRONMENTS, per_environment
from .prompts import POLICY_SYSTEM_PROMPT

# Characters per token of an endpoint's default reply limit (EndpointConfig.reply_limit).
CHARS_PER_TOKEN = 16


class LlamaCppConfig(Section):
    """How `coevolve serve` starts llama.cpp's ``llama-server`` for an endpoint whose
    ``server`` is llama.cpp. The context a slot holds comes from the endpoint's
    ``max_model_len`` and the slots from its ``concurrency``."""

    gguf_file: str | None = Field(
        default=None,
        description="The GGUF model file llama-server loads (None: the larger model `make "
        "larger-model` joins, $COEVOLVE_CACHE/larger-model/qwen2.5-coder-1.5b-instruct-q4_k_m.gguf).",
    )
    binary: str | None = Field(
        default=None,
        description="The llama-server program (None: llama-server on PATH, else the one `make "
        "larger-model` builds, $COEVOLVE_CACHE/llama.cpp/bin/llama-server).",
    )
    threads: int | None = Field(
        default=None,
        gt=0,
        description="CPU threads for generation and prompt processing (-t; None: every core "
        "this process may use). On a machine shared with training, fewer is faster: on 2 "
        "loaded cores 1 thread decoded 8-9 tokens/s and 2 threads 1.4 (docs/teacher.md).",
    )
    chat_template_file: str | None = Field(
        default=None,
        description="A Jinja chat template file instead of the one in the GGUF's metadata "
        "(--chat-template-file). Templates always render with --jinja, which tool calls need.",
    )
    cache_reuse: int = Field(
        default=256,
        ge=0,
        description="Smallest run of prompt tokens llama-server reuses from a slot's cache by "
        "shifting it (--cache-reuse; 0: only a common prefix is reused). The roles' prompts "
        "share a long prefix (tools, worked examples), so most of a next prompt is cached.",
    )
    cache_ram_mib: int = Field(
        default=2048,
        ge=0,
        description="MiB of host memory for prompts cached beyond the slots (--cache-ram; 0: "
        "none). llama-server's default, 8192, is a third of a 24 GB machine.",
    )


class EndpointConfig(Section):
    """An OpenAI-compatible chat-completions endpoint (vLLM, a hosted API, a test server)."""

    base_url: str = Field(description="Server URL including /v1, e.g. http://127.0.0.1:8000/v1.")
    model: str = Field(
        description="Model name the server knows; with vLLM a LoRA adapter name works too."
    )
    api_key_env: str | None = Field(
        default=None,
        description="Name of the environment variable holding the API key (None: no key).",
    )
    temperature: float = Field(default=0.7, ge=0.0, le=2.0, description="Sampling temperature.")
    max_tokens: int = Field(default=512, gt=0, description="Most tokens per reply.")
    length_field: Literal["max_tokens", "max_completion_tokens"] = Field(
        default="max_tokens",
        description="The request field the synthesis roles send max_tokens under. max_tokens: "
        "what OpenAI-compatible servers honour (vLLM, SGLang, llama.cpp, transformers serve; "
        "some ignore max_completion_tokens and run on). max_completion_tokens: OpenAI's "
        "reasoning models, which refuse max_tokens. Never both: several servers refuse that.",
    )
    timeout_s: float = Field(
        default=60.0, gt=0, description="Seconds before one request is abandoned."
    )
    max_retries: int = Field(
        default=3,
        ge=0,
        description="Retries of one request after an HTTP 408, 429 or 5xx, a timeout, a dropped "
        "connection or a reply that cannot be read (a body that is no chat completion, null "
        "choices); never after another 4xx. One policy (common/retry.py) for the policy, the "
        "synthesis roles and the embeddings on this endpoint.",
    )
    retry_base_s: float = Field(
        default=0.2,
        gt=0,
        description="Seconds before the first retry; each further retry waits twice as long "
        "(with jitter), up to retry_max_s.",
    )
    retry_max_s: float = Field(
        default=5.0,
        gt=0,
        description="Longest wait between two retries, in seconds; a server's Retry-After "
        "(429, 503) is honoured up to it (raise it for a hosted API's rate limits).",
    )
    concurrency: int = Field(default=16, gt=0, description="Most requests in flight at once.")
    server: Literal["vllm", "transformers", "llama.cpp"] = Field(
        default="vllm",
        description="The server `coevolve serve` starts for this endpoint: vllm (a GPU; LoRA "
        "hot-loading, tool parsing), transformers (`transformers serve`, the CPU path: it "
        "serves any local model directory by its path as the model name, and has no LoRA API) "
        "or llama.cpp (`llama-server`, a GGUF model on a CPU with a prompt cache per slot; "
        "`make larger-model` builds it; see the llama_cpp section).",
    )
    llama_cpp: LlamaCppConfig = Field(
        default_factory=LlamaCppConfig,
        description="server: llama.cpp only: the GGUF file and the flags llama-server gets.",
    )
    tensor_parallel_size: int = Field(
        default=1,
        gt=0,
        description="GPUs each replica of the model is split across (`coevolve serve` passes "
        "vLLM's --tensor-parallel-size): above 1 for a model too big for one GPU.",
    )
    data_parallel_size: int = Field(
        default=1,
        gt=0,
        description="Replicas of the model behind the one port (`coevolve serve` passes vLLM's "
        "--data-parallel-size): more throughput; GPUs used = tensor × data parallel size.",
    )
    max_model_len: int | None = Field(
        default=None,
        gt=0,
        description="Longest context, prompt plus reply, in tokens, the server holds (vLLM's "
        "--max-model-len). None: for the policy's endpoint, the longest conversation training "
        "reads (training.max_length) plus one reply (max_tokens); for another endpoint, the "
        "model's own limit.",
    )
    return_token_ids: bool = Field(
        default=False,
        description="Ask the server for the prompt's and the reply's token ids and the "
        "reply's log-probs (vLLM >= 0.10.2: return_token_ids and logprobs), for token-exact "
        "trajectories; a server that ignores the request leaves them None.",
    )
    max_reply_chars: int | None = Field(
        default=None,
        gt=0,
        description="Longest reply (text plus tool-call arguments, in characters) that is read; "
        f"a longer one is rejected unparsed as 'reply too long'. None: {CHARS_PER_TOKEN} × "
        "max_tokens, far above real text (3-5 characters a token), so only a server that "
        "ignores max_tokens (a proxy, a misconfigured or hostile server) reaches it.",
    )

    @model_validator(mode="after")
    def _llama_cpp_only_for_its_server(self) -> EndpointConfig:
        if self.server != "llama.cpp" and self.llama_cpp != LlamaCppConfig():
            raise ValueError(
                f"the llama_cpp section is for server: llama.cpp, and this endpoint's server is "
                f"{self.server}: set server: llama.cpp, or remove the section"
            )
        return self

    def reply_limit(self) -> int:
        """The longest reply, in characters, that a role reads from this endpoint."""
        return self.max_reply_chars or CHARS_PER_TOKEN * self.max_tokens

    def api_key(self) -> str:
        if self.api_key_env is None:
            return "EMPTY"
        key = os.environ.get(self.api_key_env)
        if not key:
            raise ConfigError(
                f"endpoint {self.base_url}: environment variable {self.api_key_env} is not set"
            )
        return key


class PolicyConfig(Section):
    """The agent being trained: an in-process model or an OpenAI-compatible endpoint."""

    kind: Literal["local", "endpoint"] = Field(
        default="local",
        description="local: a transformers model in this process; endpoint: a server.",
    )
    model: str = Field(
        default="bootstrap",
        description="local: 'bootstrap' (the cached bootstrap model, built if missing) or a model directory.",
    )
    adapter: str | None = Field(
        default=None, description="local: a peft LoRA adapter directory to apply."
    )
    device: str = Field(default="cpu", description="local: torch device, e.g. cpu or cuda.")
    max_new_tokens: int = Field(
        default=96, gt=0, description="local: most tokens generated per message."
    )
    batch_size: int = Field(
        default=64, gt=0, description="local: most conversations in one generate call."
    )
    max_live_episodes: int | None = Field(
        default=None,
        gt=0,
        description=(
            "local: most episodes of a rollout or an evaluation played at once (null: all); "
            "the next starts as one ends. Each live episode's keys and values are kept "
            "between its steps (SmolLM2: 46 KB a token), so this bounds that memory."
        ),
    )
    endpoint: str | EndpointConfig | None = Field(
        default=None,
        description="endpoint: the name of an entry in `endpoints`, or an inline endpoint.",
    )
    system_prompt: str = Field(
        default=POLICY_SYSTEM_PROMPT, description="System message of every episode."
    )
    train_model: str | None = Field(
        default=None,
        description="endpoint: the served base model that `coevolve run` trains LoRA adapters "
        "on: a local directory, or a Hugging Face model id (e.g. Qwen/Qwen2.5-7B-Instruct; "
        "from the Hub cache, downloaded once when online). The server must read the "
        "adapters' paths.",
    )
    tools_in_prompt: bool | None = Field(
        default=None,
        description="Whether the tool schemas are part of the prompt, in rollouts and in every "
        "training example alike. None: the kind decides: an endpoint gets them (the "
        "request's `tools`, rendered by the server's chat template), a local model does not "
        "(the bootstrap agent learned the tools from demonstrations).",
    )
    read_json_calls: bool = Field(
        default=False,
        description="Read a tool call the model writes in its reply's text as a JSON object "
        '{"name": ..., "arguments": {...}} (or a list of them), alone or in a fenced block '
        "(```json or ```), besides the server's tool_calls field, <tool_call> tags and call "
        "lines, in the cycle's rollouts, evaluation and the explorer's policy rounds (not yet "
        "in GRPO's multi-turn training episodes, which keep tags and call lines). Turn it on "
        "for a model that writes its calls so, e.g. Qwen2.5-Coder behind llama-server. Off by "
        "default: the trained SmolLM2 agent is taught to write call lines, so off it acts "
        "only on the forms it was trained on, as before (nothing yet measures whether "
        "reading JSON from it changes its episodes). On or off, text that looks like a call in no form read (a JSON call while this is off, "
        "JSON naming a tool that does not parse, a call inside prose) is a failed call of "
        "kind unreadable_call, never the final answer.",
    )
    hot_load: Literal["required", "best_effort", "off"] = Field(
        default="required",
        description="endpoint: how each cycle's adapter reaches the server. required: vLLM's "
        "runtime LoRA API (POST /v1/load_lora_adapter); a refusal stops the run. best_effort: a "
        "server that lacks that API (HTTP 404, 405 or 501: transformers serve, vLLM without "
        "--enable-lora) keeps serving what it served, with a warning; rollouts and evaluation "
        "then measure that model, not the adapters. A server that has the API and fails to "
        "load (a path it cannot read, a rank above its --max-lora-rank) or is down still stops "
        "the run. off: never load; adapters are only saved under adapters/.",
    )

    @property
    def renders_tools(self) -> bool:
        """Whether prompts carry the tool schemas (``tools_in_prompt``, or the kind's default)."""
        if self.tools_in_prompt is not None:
            return self.tools_in_prompt
        return self.kind == "endpoint"

    @model_validator(mode="after")
    def _endpoint_matches_kind(self) -> PolicyConfig:
        if self.kind == "endpoint" and self.endpoint is None:
            raise ValueError(
                "kind 'endpoint' needs `endpoint:` (a name from `endpoints` or base_url + model)"
            )
        if self.kind == "local" and self.endpoint is not None:
            raise ValueError(
                "`endpoint` is only used with kind: endpoint; remove it or set kind: endpoint"
            )
        return self


class RolloutConfig(Section):
    """How episodes are sampled."""

    k: int = Field(default=8, gt=0, description="Rollouts per task per cycle (K).")
    temperature: float = Field(
        default=0.9, ge=0.0, le=2.0, description="Sampling temperature of rollouts."
    )
    eval_temperature: float = Field(
        default=0.0, ge=0.0, le=2.0, description="Temperature for evaluation (0: greedy)."
    )
    max_tool_calls: int = Field(
        default=12,
        gt=0,
        description="Most assistant messages that call tools per user turn before the episode "
        "is cut off (was max_steps: training.max_steps counts optimisation steps).",
    )
    max_unreachable_share: float = Field(
        default=0.1,
        ge=0.0,
        le=1.0,
        description="Stop the run when more than this share of a stage's episodes (rollout, "
        "evaluation) got no usable reply from the endpoint (connection, timeout, 5xx or "
        "unreadable body after every retry); a stage none of whose episodes got one always "
        "stops it. Below the share, those episodes are left out of every figure, signal and "
        "training set, and the figures say how many.",
    )


class EvaluationConfig(Section):
    """The held-out measurement after every cycle (and before the first)."""

    split: str = Field(
        default="heldout",
        description="Split evaluated each cycle: "
        f"{per_environment(lambda spec: (spec.evaluation_splits, spec.evaluation_note))}. "
        "Synthesis never sees it, and it may not be the split the loop trains on (env.split).",
    )
    per_family: int | None = Field(
        default=None,
        gt=0,
        description="Evaluate the first N tasks of every family (None: the whole split).",
    )
    every: int = Field(
        default=1,
        gt=0,
        description="Evaluate after every N-th cycle; cycle 0 and the last cycle always are "
        "(a bench that compares the start and the end saves the evaluations between).",
    )

    @model_validator(mode="after")
    def _known_split(self) -> EvaluationConfig:
        known = dict.fromkeys(split for spec in ENVIRONMENTS.values() for split in spec.splits)
        if self.split not in known:
            raise ValueError(
                f"split {self.split!r} is not a task split; allowed values: {', '.join(known)}"
            )
        return self
