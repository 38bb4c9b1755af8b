"""The bodies the scripted OpenAI servers write: chat completions, and JSON either way.

``chat_completion`` answers a request body with a ``Reply`` in vLLM's shapes
(token ids and log-probabilities when asked for). ``loads_body`` and
``dumps_body`` use orjson when it is installed: a benchmark's server must not be
the bottleneck it measures.
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from typing import Any

from .openai_script import Reply, count_tokens, fake_logprob, fake_token_ids, message_text

try:  # ~10x cheaper than json on the 10 KB bodies (tool schemas) a rollout sends
    import orjson

    def loads_body(data: bytes) -> Any:
        return orjson.loads(data)

    def dumps_body(payload: Any) -> bytes:
        return orjson.dumps(payload)

    BODY_DECODE_ERRORS: tuple[type[Exception], ...] = (orjson.JSONDecodeError,)
except ImportError:

    def loads_body(data: bytes) -> Any:
        return json.loads(data)

    def dumps_body(payload: Any) -> bytes:
        return json.dumps(payload).encode()

    BODY_DECODE_ERRORS = (json.JSONDecodeError, UnicodeDecodeError)


def chat_completion(body: dict[str, Any], reply: Reply, ids: Iterator[int]) -> dict[str, Any]:
    """The chat completion that answers ``body`` with ``reply``, in vLLM's shapes;
    ``ids`` numbers its call and completion ids."""
    message: dict[str, Any] = {"role": "assistant", "content": reply.content}
    if reply.calls:
        message["tool_calls"] = [
            {
                "id": f"call_{next(ids)}",
                "type": "function",
                "function": {
                    "name": name,
                    "arguments": args if isinstance(args, str) else json.dumps(args),
                },
            }
            for name, args in reply.calls
        ]
    finish_reason = reply.finish_reason or ("tool_calls" if reply.calls else "stop")
    prompt_text = " ".join(message_text(m) for m in body["messages"])
    completion_text = message_text(message)
    prompt_tokens = count_tokens(prompt_text)
    completion_tokens = count_tokens(completion_text)
    choice: dict[str, Any] = {
        "index": 0,
        "message": message,
        "finish_reason": finish_reason,
        "logprobs": None,
    }
    completion: dict[str, Any] = {
        "id": f"chatcmpl-{next(ids)}",
        "object": "chat.completion",
        "created": int(time.time()),
        "model": body["model"],
        "choices": [choice],
        "usage": {
            "prompt_tokens": prompt_tokens,
            "completion_tokens": completion_tokens,
            "total_tokens": prompt_tokens + completion_tokens,
        },
    }
    # vLLM's shapes: with return_token_ids the prompt's ids on the response and the
    # reply's on the choice; with logprobs one entry per reply token. The ids are
    # fake (one per word), deterministic, and as many as the usage counts.
    wants_ids, wants_logprobs = body.get("return_token_ids"), body.get("logprobs")
    completion_ids = fake_token_ids(completion_text) if wants_ids or wants_logprobs else []
    if wants_ids:
        completion["prompt_token_ids"] = fake_token_ids(prompt_text)
        choice["token_ids"] = completion_ids
    if wants_logprobs:
        words = completion_text.split()
        choice["logprobs"] = {
            "content": [
                {
                    "token": word,
                    "logprob": fake_logprob(token_id),
                    "bytes": list(word.encode()),
                    "top_logprobs": [],
                }
                for word, token_id in zip(words, completion_ids, strict=True)
            ]
        }
    return completion
