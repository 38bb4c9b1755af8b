"""Chat models for the synthesis roles, and structured output that survives real servers.

Every LLM role talks to an OpenAI-compatible endpoint through an
``EndpointChatModel`` (``chat_model``; agents/roles/chat_endpoint.py), a LangChain chat
model sent on the project's HTTP client; a ``ChatOpenAI`` a user passes in works
too. ``structured_call`` asks for a pydantic schema the strict way
first (``response_format`` with a JSON schema, which vLLM and OpenAI honour) and
falls back to a plain request for JSON whose text is read tolerantly: code
fences, prose around the object, a bare list where an object holding one list
was asked for, unknown top-level keys. Model text is data: it is read with
``json``, never evaluated.

One ``asyncio.Semaphore`` (the ``limiter``) bounds the LLM requests in flight
across every role of a run; each request holds it only while it is on the wire.

What an endpoint does with ``response_format`` is learnt once and remembered
per endpoint (base URL and model, ``response_format_support``): a server that
refuses it (a 4xx that a plain request then does not get), or silently ignores
it (``transformers serve`` answers 200 and leaves the reply unconstrained: a
reply that does not even start a JSON object), is logged once as a WARNING and
every later structured call to it is a single plain request for JSON.

Replies are bounded, read and retried at one boundary (``agents/roles/replies.py``:
``ask``, ``ReplyError``), and JSON is read from them in linear time
(``agents/roles/json_reply.py``); both are re-exported here.
"""

from __future__ import annotations

import asyncio
import functools
import json
import logging
import threading
import weakref
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from langchain_core.messages import BaseMessage, HumanMessage
from pydantic import BaseModel, SecretStr

from .chat_endpoint import EndpointChatModel
from .json_reply import SchemaT, balanced_spans, iter_json_values, parse_json_reply
from .replies import (
    ReplyCounts,
    ReplyError,
    ReplyKind,
    ReplyTooLongError,
    ask,
    check_reply_length,
    counting_replies,
    describe_error,
    field_of,
    limited,
    model_label,
    names_response_format,
    reply_length,
)

if TYPE_CHECKING:
    from ..config import EndpointConfig

log = logging.getLogger(__name__)

__all__ = [
    "EndpointChatModel",
    "ReplyCounts",
    "ReplyError",
    "ReplyKind",
    "ReplyTooLongError",
    "StructuredOutputError",
    "ask",
    "balanced_spans",
    "chat_model",
    "check_reply_length",
    "counting_replies",
    "forget_endpoint_capabilities",
    "iter_json_values",
    "json_instruction",
    "limited",
    "model_label",
    "parse_json_reply",
    "reply_length",
    "response_format",
    "response_format_support",
    "structured_call",
]

# How much of an unreadable reply an error message quotes.
_RAW_QUOTE = 500


class StructuredOutputError(RuntimeError):
    """Neither the structured request nor the plain JSON fallback gave a valid object.

    ``raw`` holds the text of the last reply (None when no reply came back).
    """

    def __init__(self, message: str, raw: str | None = None):
        super().__init__(message)
        self.raw = raw


# --------------------------------------------------------------------------- models


def chat_model(endpoint: EndpointConfig, temperature: float | None = None) -> EndpointChatModel:
    """The chat model of one endpoint (``EndpointChatModel``, agents/roles/chat_endpoint.py);
    ``temperature`` overrides the endpoint's.

    Replies longer than ``endpoint.reply_limit()`` characters raise ``ReplyTooLongError``.
    """
    return EndpointChatModel(
        model=endpoint.model,
        base_url=endpoint.base_url,
        api_key=SecretStr(endpoint.api_key()),
        temperature=endpoint.temperature if temperature is None else temperature,
        max_tokens=endpoint.max_tokens,
        length_field=endpoint.length_field,
        timeout_s=endpoint.timeout_s,
        max_connections=max(endpoint.concurrency, 1) * 2,
        max_reply_chars=endpoint.reply_limit(),
        reply_retries=endpoint.max_retries,
        retry_base_s=endpoint.retry_base_s,
        retry_max_s=endpoint.retry_max_s,
    )


# --------------------------------------------------------------------------- endpoint capabilities

# (base URL, model) -> how the endpoint treats response_format, once known not to honour
# it: "refused" or "ignored". Absent: honoured, or not known yet (both send it).
_NO_RESPONSE_FORMAT: dict[tuple[str, str], str] = {}
_CAPABILITY_LOCK = threading.Lock()


def _endpoint_key(model: Any) -> tuple[str, str] | None:
    """The endpoint a chat model talks to; None for a model that is not an HTTP client."""
    # EndpointChatModel's base_url, or ChatOpenAI's openai_api_base.
    base = getattr(model, "base_url", None) or getattr(model, "openai_api_base", None)
    name = getattr(model, "model_name", None)
    if isinstance(base, str) and isinstance(name, str):
        return base.rstrip("/"), name
    return None


def response_format_support(model: Any) -> str | None:
    """What ``model``'s endpoint was found to do with ``response_format``: "refused",
    "ignored", or None (honoured, or nothing learnt yet)."""
    key = _endpoint_key(model)
    return None if key is None else _NO_RESPONSE_FORMAT.get(key)


def forget_endpoint_capabilities() -> None:
    """Forget what every endpoint was found to support (a server restarted or replaced)."""
    with _CAPABILITY_LOCK:
        _NO_RESPONSE_FORMAT.clear()


def _remember_no_response_format(model: Any, how: str, evidence: str) -> None:
    """Record that the endpoint does not honour response_format; log it the first time."""
    key = _endpoint_key(model)
    if key is None:
        return
    with _CAPABILITY_LOCK:
        if key in _NO_RESPONSE_FORMAT:
            return
        _NO_RESPONSE_FORMAT[key] = how
    log.warning(
        "endpoint %s (model %s) %s response_format (%s); roles parse JSON from plain replies",
        key[0],
        key[1],
        "does not support" if how == "refused" else "ignores",
        evidence,
    )


def _is_refusal(err: BaseException | None) -> bool:
    """A request the server refused for what it asked (400, 422, or a 5xx whose message
    names response_format: a server that does not know json_schema), not for who or when."""
    import openai

    return isinstance(err, openai.BadRequestError | openai.UnprocessableEntityError) or (
        names_response_format(err)
    )


def _ignores_schema(raw: str) -> bool:
    """True when a reply to a request with a JSON schema shows the schema was not enforced.

    A server that enforces it (guided decoding) starts every reply with the object's
    ``{``; an empty reply or text that starts otherwise cannot come from one. A reply
    of whitespace only proves nothing (guided decoders may emit whitespace first).
    """
    start = raw.lstrip()
    return raw == "" or (start != "" and not start.startswith("{"))


def _quote(text: str, limit: int = 80) -> str:
    return repr(text if len(text) <= limit else text[:limit] + "...")


# --------------------------------------------------------------------------- structured output


async def structured_call(
    model: Any,
    schema: type[SchemaT],
    messages: Sequence[BaseMessage],
    limiter: asyncio.Semaphore | None = None,
) -> SchemaT:
    """Ask ``model`` for an instance of ``schema``; raise StructuredOutputError if none comes.

    1. A request with ``response_format`` (a JSON schema): the server is told
       the schema. The reply's text is read tolerantly (``parse_json_reply``).
       Skipped for an endpoint known not to honour it (``response_format_support``).
    2. If the server refused that request, or its reply held no valid object, a
       plain request that asks for JSON (the schema in the message), read
       tolerantly. A refusal followed by an answered plain request, or a reply
       that shows the schema was ignored, is remembered for the endpoint.

    Both requests go through ``ask``. A request that gets no readable reply
    raises its ``ReplyError``: at once for a reply longer than the model's limit
    ("reply too long": not parsed, and no second request of a server that
    ignores ``max_tokens``) or a server that is not there; after the plain
    request for an error status or a broken body. ``StructuredOutputError``
    means replies came and none held a valid object.
    """
    import openai

    problems: list[str] = []
    raw: str | None = None
    refusal: BaseException | None = None
    if response_format_support(model) is None:
        answered = True
        try:
            result = await ask(
                _structured_runnable(model, schema),
                messages,
                limiter,
                model=model,
                passthrough=(openai.LengthFinishReasonError,),
            )
        except openai.LengthFinishReasonError as err:
            # With response_format the SDK's parse (a plain ChatOpenAI's path; chat_model's
            # models post without it) refuses a reply cut off by max_tokens, before the
            # chat model's own length check: bound it here, then read it like any other.
            limit = getattr(model, "max_reply_chars", None)
            check_reply_length(
                err.completion, limit if isinstance(limit, int) else None, model_label(model)
            )
            choices = field_of(err.completion, "choices") or []
            result = field_of(choices[0], "message") if choices else None
        except ReplyError as err:
            if err.kind in ("too_long", "transport"):
                raise  # no second request of a server that runs long, or that is not there
            # The server refused response_format, or its body was broken: ask plainly.
            problems.append(f"structured request failed: {err}")
            refusal = err.cause if _is_refusal(err.cause) else None
            answered = False
        if answered:
            raw = _content_text(result)
            try:
                return parse_json_reply(raw, schema)
            except ValueError as err:
                problems.append(f"structured reply unreadable: {err}")
                if _ignores_schema(raw):
                    _remember_no_response_format(
                        model, "ignored", f"a reply to a JSON schema began {_quote(raw)}"
                    )

    fallback = [*messages, HumanMessage(content=json_instruction(schema))]
    reply = await ask(model, fallback, limiter)
    if refusal is not None:  # refused with response_format, answered without it
        _remember_no_response_format(model, "refused", describe_error(refusal))
    raw = _content_text(reply)
    try:
        return parse_json_reply(raw, schema)
    except ValueError as err:
        problems.append(f"JSON reply unreadable: {err}")
        quoted = _quote(raw, _RAW_QUOTE)
        raise StructuredOutputError(f"{'; '.join(problems)}; reply was {quoted}", raw) from None


# By identity: chat models compare equal by their settings, but each holds its own
# clients (per event loop), so an equal-looking model must not share runnables.
_RUNNABLES: dict[int, tuple[weakref.ref[Any], dict[type, Any]]] = {}


def _structured_runnable(model: Any, schema: type[BaseModel]) -> Any:
    """The model bound to the schema's ``response_format``, built once per (model, schema).

    A plain ``bind`` rather than ``with_structured_output``: the latter parses
    the reply with langchain-core's partial-JSON parser, whose time grows with
    the square of the reply's length; the text is read here instead.
    """
    entry = _RUNNABLES.get(id(model))
    if entry is None or entry[0]() is not model:
        entry = (weakref.ref(model), {})
        _RUNNABLES[id(model)] = entry
    per_schema = entry[1]
    if schema not in per_schema:
        per_schema[schema] = model.bind(
            response_format={"type": "json_schema", "json_schema": response_format(schema)}
        )
    return per_schema[schema]


@functools.cache
def response_format(schema: type[BaseModel]) -> dict[str, Any]:
    """The schema as the ``json_schema`` of an OpenAI ``response_format``.

    Given as a plain JSON schema rather than the pydantic class: with the class,
    the openai SDK parses the reply inside the request and a reply that is not
    bare JSON is lost; this way the raw text survives for the tolerant reader.
    Not ``strict``: OpenAI's strict mode refuses free-form objects (tool-call
    arguments), and vLLM's guided decoding follows the schema either way.
    """
    return {"name": schema.__name__, "schema": schema.model_json_schema(), "strict": False}


@functools.cache
def json_instruction(schema: type[BaseModel]) -> str:
    """The fallback request: JSON only, with the schema spelled out."""
    return (
        "Reply with one JSON object and nothing else (no prose, no code fence). "
        "It must match this JSON schema:\n"
        + json.dumps(schema.model_json_schema(), ensure_ascii=False, separators=(",", ":"))
    )


def _content_text(message: Any) -> str:
    if message is None:
        return ""
    content = getattr(message, "content", message)
    if isinstance(content, str):
        return content
    if isinstance(content, list):  # content blocks
        return "".join(
            block.get("text", "") if isinstance(block, dict) else str(block) for block in content
        )
    return str(content)
