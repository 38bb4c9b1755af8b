"""The in-process policy: a transformers causal LM (optionally with a LoRA adapter) on this machine.

Every live conversation is answered in one batch per chunk of ``batch_size``.
With ``kv_reuse`` (the default) each conversation's keys and values are kept
between its steps (``agents/policy/kv_reuse.py``), so a step encodes only its new
tokens; without it, one padded ``model.generate`` call re-encodes every
prompt. A LoRA adapter is merged into the weights while it serves. Replies are
parsed by ``parse_assistant_text``: Qwen2.5 ``<tool_call>`` blocks or plain call
lines, and JSON call objects with ``read_json_calls``. The bootstrap agent (``coevolve.training.bootstrap``: SmolLM2 with the
plain-calls template) is the usual model; any local causal LM whose chat
template speaks one of the two formats works too.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextvars
import functools
import json
import threading
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from jinja2 import TemplateError

from ...common.errors import PROGRAMMING_ERRORS
from ...common.tokenization import load_tokenizer
from .policy_interface import AssistantMessage, Message, PolicyError, parse_assistant_text
from .rendering import encode, end_of_turn_id, render_conversation, reply_drop_ids


class LocalPolicy:
    """A causal LM in this process, implementing the ``Policy`` protocol.

    ``temperature`` is the default for ``generate`` (0: greedy). With
    ``tools_in_prompt`` the tool schemas are rendered into the prompt by the chat
    template; the bootstrap model is trained without them (it learned the tools
    from demonstrations), so the default is off. ``read_json_calls`` also reads a call
    written as a JSON object, alone or in a fenced block (``policy.read_json_calls``).
    """

    def __init__(
        self,
        model_path: str | Path,
        adapter_path: str | Path | None = None,
        device: str = "cpu",
        max_new_tokens: int = 96,
        temperature: float = 0.0,
        batch_size: int = 64,
        tools_in_prompt: bool = False,
        version: str | None = None,
        seed: int | None = None,
        kv_reuse: bool = True,
        merge_adapter: bool = True,
        max_live_episodes: int | None = None,
        read_json_calls: bool = False,
    ) -> None:
        _check_sizes(max_new_tokens, batch_size, temperature, max_live_episodes)
        self.model_path = Path(model_path)
        if not (self.model_path / "config.json").exists():
            raise PolicyError(
                f"no model at {self.model_path} (config.json missing); build one with "
                "coevolve.training.bootstrap.build.bootstrap() or give a saved model directory"
            )
        self.device = device
        self.max_new_tokens = max_new_tokens
        self.temperature = temperature
        self.batch_size = batch_size
        # Read by the rollout engine (agents/policy/rollout.py): episodes it keeps going at once.
        self.max_live_episodes = max_live_episodes
        self.tools_in_prompt = tools_in_prompt
        self.read_json_calls = read_json_calls
        self.kv_reuse = kv_reuse
        self.merge_adapter = merge_adapter
        self._fixed_version = version
        self._base_version: str | None = None
        self._lock = threading.Lock()
        # Generation runs on one thread of its own, not asyncio.to_thread's pool: glibc's
        # malloc gives each thread an arena and keeps what was freed there, so keys,
        # values and activations spread over the pool's threads stayed resident once per
        # thread (SmolLM2 evaluation, 108 episodes: 6.3 GiB peak, 5.3 GiB after it ended).
        self._generation_thread = concurrent.futures.ThreadPoolExecutor(
            max_workers=1, thread_name_prefix="local-policy"
        )

        self._load_model(device, seed)
        from .prefix_cache import PrefixCache

        self.prefix_cache = PrefixCache()
        if adapter_path is not None:
            self.reload_adapter(adapter_path)

    def _load_model(self, device: str, seed: int | None) -> None:
        """The tokenizer and the base model (seeded first when ``seed`` is given), in eval
        mode on ``device``, serving without an adapter; its end and pad tokens, the special
        tokens replies drop, and its context length."""
        import torch
        from transformers import AutoModelForCausalLM

        if seed is not None:
            torch.manual_seed(seed)
        self.tokenizer = load_tokenizer(self.model_path)
        self.base_model = AutoModelForCausalLM.from_pretrained(str(self.model_path))
        self.base_model.to(device)  # type: ignore[arg-type]
        self.base_model.eval()
        self.model: Any = self.base_model
        self.adapter_path: Path | None = None
        self._adapter_name: str | None = None
        self._adapter_count = 0
        self.eos_token_id = self._eos_id()
        self.pad_token_id = (
            self.tokenizer.pad_token_id
            if self.tokenizer.pad_token_id is not None
            else self.eos_token_id
        )
        # Special tokens are dropped from replies, except the tool-call tags the parser needs.
        self._drop_ids = reply_drop_ids(self.tokenizer)
        self.max_positions = int(
            getattr(self.base_model.config, "max_position_embeddings", 0)
            or self.tokenizer.model_max_length
        )

    # ------------------------------------------------------------------ identity

    @property
    def version(self) -> str:
        if self._fixed_version is not None:
            return self._fixed_version
        if self._base_version is None:  # read once: rollouts ask for it per trajectory
            self._base_version = self.model_path.name
            metadata = self.model_path / "bootstrap.json"
            if metadata.exists():
                try:
                    key = json.loads(metadata.read_text())["cache_key"][:8]
                    self._base_version = f"bootstrap-{key}"
                except (ValueError, KeyError, OSError):
                    pass
        base = self._base_version
        if self.adapter_path is not None:
            return f"{base}+{self.adapter_path.name}"
        return base

    @version.setter
    def version(self, value: str) -> None:
        self._fixed_version = value

    # ------------------------------------------------------------------ adapters

    def reload_adapter(self, adapter_path: str | Path | None) -> None:
        """Swap in the LoRA adapter saved at ``adapter_path`` (None: back to the base model)."""
        if adapter_path is not None and not (Path(adapter_path) / "adapter_config.json").exists():
            raise PolicyError(f"no LoRA adapter at {adapter_path} (adapter_config.json missing)")
        with self._lock:
            self.prefix_cache.clear()  # cached keys and values belong to the old weights
            if self._adapter_name is not None and self.merge_adapter:
                self.model.unmerge_adapter()
            if adapter_path is None:
                if self._adapter_name is not None:
                    self.base_model = self.model.unload()
                    self.base_model.eval()
                    self.model = self.base_model
                self.adapter_path = None
                self._adapter_name = None
                return
            path = Path(adapter_path)
            self._adapter_count += 1
            name = f"adapter_{self._adapter_count}"
            if self._adapter_name is None:
                from peft import PeftModel

                self.model = PeftModel.from_pretrained(
                    self.base_model, str(path), adapter_name=name, is_trainable=False
                )
            else:
                self.model.load_adapter(str(path), adapter_name=name, is_trainable=False)
                self.model.set_adapter(name)
                self.model.delete_adapter(self._adapter_name)
            self.model.to(self.device)
            self.model.eval()
            if self.merge_adapter:
                # Rollouts then run at the base model's speed (no LoRA matmuls per layer);
                # unmerged again before the next swap.
                self.model.merge_adapter()
            self.adapter_path = path
            self._adapter_name = name

    def release_cache(self) -> None:
        """Forget every conversation's kept keys and values (the rollout engine calls this
        when its episodes have ended)."""
        from .kv_reuse import return_freed_memory

        with self._lock:
            self.prefix_cache.clear()
            return_freed_memory()

    # ------------------------------------------------------------------ generation

    async def generate(
        self,
        conversations: Sequence[Sequence[Message]],
        tools: Sequence[Sequence[dict[str, Any]]] | None = None,
        temperature: float | None = None,
        **_: Any,
    ) -> list[AssistantMessage]:
        """The next assistant message of every conversation (one batched generate per chunk)."""
        context = contextvars.copy_context()  # as asyncio.to_thread passes it
        return await asyncio.get_running_loop().run_in_executor(
            self._generation_thread,
            functools.partial(context.run, self.generate_sync, conversations, tools, temperature),
        )

    def generate_sync(
        self,
        conversations: Sequence[Sequence[Message]],
        tools: Sequence[Sequence[dict[str, Any]]] | None = None,
        temperature: float | None = None,
    ) -> list[AssistantMessage]:
        """``generate`` without an event loop."""
        temperature = self.temperature if temperature is None else temperature
        if temperature < 0:
            raise ValueError(f"temperature must be >= 0, got {temperature}")
        replies: list[AssistantMessage | None] = [None] * len(conversations)
        prompts: list[tuple[int, list[int]]] = []
        for index, conversation in enumerate(conversations):
            conversation_tools = tools[index] if tools is not None else None
            # One conversation the chat template refuses must not end the batch.
            try:
                ids = self._prompt_ids(conversation, conversation_tools)
            except (TemplateError, ValueError) as err:
                replies[index] = AssistantMessage(error=f"{type(err).__name__}: {err}")
                continue
            if isinstance(ids, str):
                replies[index] = AssistantMessage(error=ids)
            else:
                prompts.append((index, ids))
        # Similar lengths together: less padding per chunk.
        prompts.sort(key=lambda item: len(item[1]))
        with self._lock:
            if self.kv_reuse:
                self.prefix_cache.tick()
            for start in range(0, len(prompts), self.batch_size):
                chunk = prompts[start : start + self.batch_size]
                try:
                    outputs = self._generate_chunk([ids for _, ids in chunk], temperature)
                except PROGRAMMING_ERRORS:
                    raise
                except (RuntimeError, ValueError) as err:  # out of memory, a device error
                    message = f"generation failed: {type(err).__name__}: {err}"
                    for index, _ in chunk:
                        replies[index] = AssistantMessage(error=message)
                    continue
                for (index, _), reply in zip(chunk, outputs, strict=True):
                    replies[index] = reply
        return [
            reply if reply is not None else AssistantMessage(error="no reply") for reply in replies
        ]

    def _render(self, messages: Sequence[Message], tools: Sequence[dict[str, Any]] | None) -> str:
        return render_conversation(self.tokenizer, messages, tools, add_generation_prompt=True)

    def _encode(self, text: str) -> list[int]:
        return encode(self.tokenizer, text)

    def _prompt_ids(
        self, conversation: Sequence[Message], tools: Sequence[dict[str, Any]] | None
    ) -> list[int] | str:
        """Token ids of the prompt, or an error text when it cannot be made to fit.

        ``tools`` are rendered only with ``tools_in_prompt``.

        A prompt too long for the model loses its oldest messages after the first
        user message (the system prompt and the request stay).
        """
        if not self.tools_in_prompt:
            tools = None
        elif tools and "tools" not in (self.tokenizer.chat_template or ""):
            # Rendering nothing would train and serve a prompt without the tools the
            # config promised; say so instead.
            raise PolicyError(
                f"the chat template of {self.model_path} does not render tool schemas "
                "(SmolLM2's plain-calls format has no tool list); set policy.tools_in_prompt: "
                "false, or use a model whose template takes `tools`"
            )
        limit = self.max_positions - self.max_new_tokens
        messages = list(conversation)
        ids = self._encode(self._render(messages, tools))
        if len(ids) <= limit:
            return ids
        first_user = next((i for i, m in enumerate(messages) if m.get("role") == "user"), -1)
        keep = first_user + 1
        while len(ids) > limit and len(messages) > keep + 1:
            del messages[keep]
            # A tool result whose call was dropped reads as noise: drop it too.
            while len(messages) > keep + 1 and messages[keep].get("role") == "tool":
                del messages[keep]
            ids = self._encode(self._render(messages, tools))
        if len(ids) > limit:
            return (
                f"prompt too long: {len(ids)} tokens, the model takes {self.max_positions} "
                f"including {self.max_new_tokens} new tokens"
            )
        return ids

    def _generate_chunk(
        self, prompts: list[list[int]], temperature: float
    ) -> list[AssistantMessage]:
        if self.kv_reuse:
            from .kv_reuse import generate_batch

            logprobs: list[list[float]] = []
            tokens = generate_batch(
                self.model,
                prompts,
                self.prefix_cache,
                max_new_tokens=self.max_new_tokens,
                eos_token_id=self.eos_token_id,
                pad_token_id=self.pad_token_id,
                temperature=temperature,
                logprobs=logprobs,
            )
            return [
                self._reply(new, ids, scores)
                for new, ids, scores in zip(tokens, prompts, logprobs, strict=True)
            ]
        import torch

        width = max(len(ids) for ids in prompts)
        input_ids = torch.full((len(prompts), width), self.pad_token_id, dtype=torch.long)
        attention_mask = torch.zeros((len(prompts), width), dtype=torch.long)
        for row, ids in enumerate(prompts):
            input_ids[row, width - len(ids) :] = torch.tensor(ids, dtype=torch.long)
            attention_mask[row, width - len(ids) :] = 1
        sampling: dict[str, Any] = (
            {"do_sample": True, "temperature": float(temperature), "top_k": 0, "top_p": 1.0}
            if temperature > 0
            else {"do_sample": False}
        )
        with torch.inference_mode():
            output = self.model.generate(
                input_ids=input_ids.to(self.device),
                attention_mask=attention_mask.to(self.device),
                max_new_tokens=self.max_new_tokens,
                eos_token_id=self.eos_token_id,
                pad_token_id=self.pad_token_id,
                **sampling,
            )
        new_tokens = output[:, width:].tolist()
        return [
            self._reply(tokens, ids, None) for tokens, ids in zip(new_tokens, prompts, strict=True)
        ]

    def _reply(
        self, tokens: list[int], prompt: list[int], logprobs: list[float] | None
    ) -> AssistantMessage:
        if self.eos_token_id in tokens:
            end = tokens.index(self.eos_token_id)
            finish_reason, completion_tokens = "stop", end + 1
        else:
            end = len(tokens)
            finish_reason, completion_tokens = "length", len(tokens)
        text = self._decode(tokens[:end])
        parsed = parse_assistant_text(text, read_json_calls=self.read_json_calls)
        return AssistantMessage(
            content=parsed.content,
            tool_calls=parsed.tool_calls,
            invalid_tool_calls=parsed.invalid_tool_calls,
            raw=text,
            call_form=parsed.form,
            prompt_tokens=len(prompt),
            completion_tokens=completion_tokens,
            finish_reason=finish_reason,
            # Exactly what the model read and wrote (padding after the end-of-turn token
            # cut off), so training can use these ids instead of re-tokenising the text.
            prompt_token_ids=list(prompt),
            completion_token_ids=tokens[:completion_tokens],
            completion_logprobs=logprobs[:completion_tokens] if logprobs is not None else None,
        )

    def _decode(self, tokens: list[int]) -> str:
        """Generated text without special tokens, tool-call tags kept even if special."""
        return self.tokenizer.decode(
            [token for token in tokens if token not in self._drop_ids], skip_special_tokens=False
        )

    def _eos_id(self) -> int:
        try:
            return end_of_turn_id(self.tokenizer)
        except ValueError as err:
            raise PolicyError(
                f"the tokenizer at {self.model_path} has no end-of-turn token"
            ) from err

    async def aclose(self) -> None:
        """Drop the model so its memory can be freed."""
        import gc

        with self._lock:
            self.model = None
            self.base_model = None  # type: ignore[assignment]
        self._generation_thread.shutdown(wait=False)
        gc.collect()


def _check_sizes(
    max_new_tokens: int, batch_size: int, temperature: float, max_live_episodes: int | None
) -> None:
    """ValueError for a size or temperature ``LocalPolicy`` cannot generate with."""
    if max_new_tokens < 1:
        raise ValueError(f"max_new_tokens must be >= 1, got {max_new_tokens}")
    if batch_size < 1:
        raise ValueError(f"batch_size must be >= 1, got {batch_size}")
    if temperature < 0:
        raise ValueError(f"temperature must be >= 0, got {temperature}")
    if max_live_episodes is not None and max_live_episodes < 1:
        raise ValueError(f"max_live_episodes must be >= 1 or None, got {max_live_episodes}")
