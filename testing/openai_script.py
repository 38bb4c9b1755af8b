"""What the scripted OpenAI server answers and records: ``Reply``, scripts, recorded
requests, hash-based embeddings and rough token counts. Standard library only."""

from __future__ import annotations

import hashlib
import json
import math
import re
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

# --------------------------------------------------------------------------- replies


@dataclass(frozen=True)
class Reply:
    """What the server answers to one chat completion. Build one with the class helpers.

    A reply is either a completion (``content`` and/or ``calls``), an HTTP error
    (``status_code`` other than 200), a body sent verbatim (``raw_body``, with
    ``status_code`` and ``content_type``: a broken completion, a proxy's HTML
    page) or a dropped connection; ``delay_s`` waits before any of them.
    """

    content: str | None = None
    # (name, arguments): arguments as a dict, or as a raw string to simulate bad JSON.
    calls: tuple[tuple[str, dict[str, Any] | str], ...] = ()
    finish_reason: str | None = None
    status_code: int = 200
    error_message: str | None = None
    headers: tuple[tuple[str, str], ...] = ()
    raw_body: str | None = None
    content_type: str = "application/json"
    drop_connection: bool = False
    delay_s: float = 0.0

    @classmethod
    def text(cls, content: str, finish_reason: str = "stop") -> Reply:
        return cls(content=content, finish_reason=finish_reason)

    @classmethod
    def tool_calls(
        cls,
        calls: Iterable[tuple[str, Mapping[str, Any] | str]],
        content: str | None = None,
    ) -> Reply:
        """Structured tool calls; an arguments string is sent verbatim (e.g. broken JSON)."""
        normalised = tuple(
            (name, args if isinstance(args, str) else dict(args)) for name, args in calls
        )
        return cls(content=content, calls=normalised)

    @classmethod
    def json_content(cls, obj: Any) -> Reply:
        """Content that is JSON text, as a structured-output (``response_format``) role expects."""
        return cls(content=json.dumps(obj, ensure_ascii=False), finish_reason="stop")

    @classmethod
    def status(
        cls, code: int, message: str | None = None, headers: Mapping[str, str] | None = None
    ) -> Reply:
        """An HTTP error with an OpenAI-style error body (e.g. 500, 503, 429 with Retry-After)."""
        return cls(status_code=code, error_message=message, headers=tuple((headers or {}).items()))

    @classmethod
    def malformed(
        cls, body: str = "not json", status: int = 200, content_type: str = "application/json"
    ) -> Reply:
        """A body sent as it is: by default a 200 whose body is not a chat completion."""
        return cls(raw_body=body, status_code=status, content_type=content_type)

    @classmethod
    def drop(cls) -> Reply:
        """Close the connection without answering."""
        return cls(drop_connection=True)

    @classmethod
    def delay(cls, seconds: float, then: Reply | None = None) -> Reply:
        """Wait ``seconds`` before answering ``then`` (default: a short text), to cause timeouts."""
        return replace(then if then is not None else cls.text("(delayed)"), delay_s=seconds)

    def delayed(self, seconds: float) -> Reply:
        """This reply, sent after ``seconds``."""
        return replace(self, delay_s=seconds)


Script = Sequence[Reply | str] | Callable[[dict[str, Any]], Reply | str]


@dataclass
class RecordedRequest:
    """One request as the server saw it. ``time`` is ``time.monotonic()`` at arrival."""

    path: str
    method: str
    body: Any
    time: float
    headers: dict[str, str] = field(default_factory=dict)
    status: int | None = None  # None until answered, and for a dropped connection
    note: str | None = None  # what the server did out of the ordinary (script exhausted, ...)


# --------------------------------------------------------------------------- embeddings

_WORD = re.compile(r"\w+")


def hash_embedding(text: str, dim: int = 256) -> list[float]:
    """A deterministic unit vector: hashed bag of lowercased words.

    Equal texts give equal vectors, texts sharing most words give close ones,
    which is all dedup tests need, without any model weights.
    """
    vector = [0.0] * dim
    words = _WORD.findall(text.lower()) or ["<empty>"]  # an all-zero vector has no cosine
    for word in words:
        digest = hashlib.blake2b(word.encode(), digest_size=8).digest()
        index = int.from_bytes(digest[:4], "little") % dim
        vector[index] += 1.0 if digest[4] & 1 else -1.0
    norm = math.sqrt(sum(v * v for v in vector))
    if norm == 0.0:  # words whose signs cancelled out in the same bucket
        vector[0], norm = 1.0, 1.0
    return [v / norm for v in vector]


def count_tokens(text: str) -> int:
    return len(text.split())


# Size of the fake vocabulary of ``fake_token_ids``.
FAKE_VOCABULARY = 32_000


def fake_token_ids(text: str) -> list[int]:
    """One deterministic id per whitespace-separated word (as ``count_tokens`` counts them):
    what the server returns as token ids, since it has no tokenizer."""
    return [
        int.from_bytes(hashlib.blake2b(word.encode(), digest_size=4).digest(), "little")
        % FAKE_VOCABULARY
        for word in text.split()
    ]


def fake_logprob(token_id: int) -> float:
    """A deterministic log-probability in (-2, 0] for a fake token id."""
    return -(token_id % 1000) / 500.0


def message_text(message: Any) -> str:
    """All the text of one chat message, for rough token counts."""
    if not isinstance(message, Mapping):
        return ""
    parts: list[str] = []
    content = message.get("content")
    if isinstance(content, str):
        parts.append(content)
    elif isinstance(content, list):
        parts += [p.get("text", "") for p in content if isinstance(p, Mapping)]
    for call in message.get("tool_calls") or []:
        function = call.get("function", {}) if isinstance(call, Mapping) else {}
        arguments = function.get("arguments", "")
        parts += [str(function.get("name", "")), arguments if isinstance(arguments, str) else ""]
    return " ".join(parts)


def echo_reply(body: dict[str, Any]) -> Reply:
    """The default script: answer with the last user message."""
    for message in reversed(body["messages"]):
        if isinstance(message, Mapping) and message.get("role") == "user":
            return Reply.text(message_text(message))
    return Reply.text("")


def calls_then_answer(calls: int, name: str = "get_balance", arguments: str = "{}") -> Script:
    """A script for load tests: call ``name`` until the conversation holds ``calls`` tool
    results, then answer. Every episode then takes exactly ``calls + 1`` replies."""

    def reply(body: dict[str, Any]) -> Reply:
        done = sum(1 for m in body.get("messages", []) if m.get("role") == "tool")
        return Reply.tool_calls([(name, arguments)]) if done < calls else Reply.text("done")

    return reply
