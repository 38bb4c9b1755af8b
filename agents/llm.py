"""Chat models for the synthesis roles, and structured output that survives real servers.

Every LLM role talks to an OpenAI-compatible endpoint through langchain-openai's
``ChatOpenAI``. ``structured_call`` asks for a pydantic schema the strict way
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

Replies are bounded before anything reads them: a chat model from
``chat_model`` rejects a reply whose text (content plus tool-call arguments)
is longer than ``EndpointConfig.reply_limit()`` with ``ReplyTooLongError``
("reply too long"), so a server that ignores ``max_tokens`` cannot stall a
pass. JSON is extracted from a reply in linear time (``iter_json_values``):
one scan finds the balanced ``{...}``/``[...]`` spans, and each is handed to
``json.loads`` once.

Every request goes through one reply boundary, ``ask``: whatever fails between
sending the request and holding a chat message (the connection, an error
status, a body that is not a chat completion, the client library's own parsing
of it: ``{"choices": null}`` makes the openai SDK raise TypeError) becomes a
``ReplyError`` with its kind and reason. Failed attempts are retried under the
endpoint's retry policy (``max_retries``, backoff from ``retry_base_s``; the
SDK's own retries are off, so there is one policy), and counted where the
caller asked (``counting_reply_errors``). An exception raised
before any reply came back is ours (a bad argument, a bug) and is raised as it
is, so a programming error still ends a pass.
"""

from __future__ import annotations

import asyncio
import contextvars
import functools
import json
import logging
import random
import re
import threading
import weakref
from collections import Counter
from collections.abc import Iterator, Sequence
from contextlib import AbstractAsyncContextManager, contextmanager, nullcontext
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Literal, TypeVar

import httpx
from langchain_core.messages import BaseMessage, HumanMessage
from pydantic import BaseModel, SecretStr, ValidationError

from .per_loop import PerLoop

if TYPE_CHECKING:
    from langchain_openai import ChatOpenAI

    from .config import EndpointConfig

log = logging.getLogger(__name__)

SchemaT = TypeVar("SchemaT", bound=BaseModel)

# How much of an unreadable reply an error message quotes.
_RAW_QUOTE = 500


ReplyKind = Literal["transport", "status", "body", "too_long"]


class ReplyError(RuntimeError):
    """An endpoint gave no readable reply. ``kind`` says where it failed: ``transport`` (no
    answer: refused, dropped, timed out), ``status`` (an HTTP error status), ``body`` (an
    answer that is no chat completion, the client library's parsing included) or
    ``too_long``; the message says what happened, and ``cause`` is the original error."""

    def __init__(self, kind: ReplyKind, reason: str, cause: BaseException | None = None):
        super().__init__(reason)
        self.kind: ReplyKind = kind
        self.cause = cause


class ReplyTooLongError(ReplyError):
    """A reply longer than the endpoint's limit; it is rejected unread, and not asked again."""

    def __init__(self, length: int, limit: int, model: str):
        super().__init__(
            "too_long",
            f"reply too long: {length} characters from {model}, limit {limit} "
            "(raise endpoints.<name>.max_reply_chars or max_tokens if such replies are expected)",
        )
        self.length = length
        self.limit = limit


def reply_length(response: Any) -> int:
    """Characters of reply text in a chat completion (an SDK object or a dict): every
    choice's content plus its tool calls' arguments."""
    total = 0
    for choice in _field(response, "choices") or []:
        message = _field(choice, "message")
        content = _field(message, "content")
        total += len(content) if isinstance(content, str) else 0
        for call in _field(message, "tool_calls") or []:
            arguments = _field(_field(call, "function"), "arguments")
            total += len(arguments) if isinstance(arguments, str) else 0
    return total


def check_reply_length(response: Any, limit: int | None, model: str) -> None:
    """``ReplyTooLongError`` when a chat completion's reply text is longer than ``limit``."""
    if limit is None:
        return
    length = reply_length(response)
    if length > limit:
        raise ReplyTooLongError(length, limit, model)


def _field(obj: Any, key: str) -> Any:
    return obj.get(key) if isinstance(obj, dict) else getattr(obj, key, None)


class StructuredOutputError(RuntimeError):
    """Neither the structured request nor the plain JSON fallback gave a valid object.

    ``raw`` holds the text of the last reply (None when no reply came back).
    """

    def __init__(self, message: str, raw: str | None = None):
        super().__init__(message)
        self.raw = raw


# --------------------------------------------------------------------------- models


class _PerLoopTransport(httpx.AsyncBaseTransport):
    """An httpx transport with one connection pool per event loop (see ``per_loop``)."""

    def __init__(self, **options: Any):
        self._pools = PerLoop(lambda: httpx.AsyncHTTPTransport(**options))

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        response = await self._pools.get().handle_async_request(request)
        attempt = _ATTEMPT.get()
        if attempt is not None:  # from here on, a failure is about what the server sent
            attempt.answered = True
        return response

    async def aclose(self) -> None:
        pool = self._pools.pop()
        if pool is not None:
            await pool.aclose()


@functools.cache
def _bounded_chat_class() -> type[ChatOpenAI]:
    """``ChatOpenAI`` that refuses a reply longer than ``max_reply_chars`` before reading it.

    The check runs on the SDK's response object, before langchain builds a
    message (and parses tool-call arguments) from it; every role gets it,
    tool-calling ones included.
    """
    from langchain_openai import ChatOpenAI

    class BoundedChatOpenAI(ChatOpenAI):
        max_reply_chars: int | None = None
        # The endpoint's retry policy, applied by the reply boundary (``ask``) to every
        # failed attempt; the SDK's own retries are off, so no request is retried twice over.
        reply_retries: int = 0
        retry_base_s: float = 0.2
        retry_max_s: float = 5.0
        # The name the length limit is sent under (EndpointConfig.length_field): langchain
        # sends max_completion_tokens, which many OpenAI-compatible servers ignore.
        length_field: str = "max_tokens"

        def _get_request_payload(self, input_: Any, *, stop: Any = None, **kwargs: Any) -> dict:
            payload = super()._get_request_payload(input_, stop=stop, **kwargs)
            if self.length_field != "max_completion_tokens" and "max_completion_tokens" in payload:
                payload[self.length_field] = payload.pop("max_completion_tokens")
            return payload

        def _create_chat_result(self, response: Any, generation_info: Any = None) -> Any:
            check_reply_length(response, self.max_reply_chars, self.model_name)
            return super()._create_chat_result(response, generation_info)

    return BoundedChatOpenAI


def chat_model(endpoint: EndpointConfig, temperature: float | None = None) -> ChatOpenAI:
    """A ``ChatOpenAI`` for one endpoint; ``temperature`` overrides the endpoint's.

    Replies longer than ``endpoint.reply_limit()`` characters raise ``ReplyTooLongError``.
    """
    client = httpx.AsyncClient(
        transport=_PerLoopTransport(
            limits=httpx.Limits(max_connections=max(endpoint.concurrency, 1) * 2)
        ),
        timeout=endpoint.timeout_s,
    )
    chat_class: Any = _bounded_chat_class()
    return chat_class(
        max_reply_chars=endpoint.reply_limit(),
        retry_base_s=endpoint.retry_base_s,
        retry_max_s=endpoint.retry_max_s,
        length_field=endpoint.length_field,
        base_url=endpoint.base_url,
        model=endpoint.model,
        api_key=SecretStr(endpoint.api_key()),
        timeout=endpoint.timeout_s,
        max_retries=0,
        reply_retries=endpoint.max_retries,
        max_completion_tokens=endpoint.max_tokens,
        temperature=endpoint.temperature if temperature is None else temperature,
        http_async_client=client,
    )


def model_label(model: Any) -> str:
    """The model name a role prints in its ``name`` ("llm(<model>)")."""
    return str(getattr(model, "model_name", None) or getattr(model, "model", None) or "model")


def limited(limiter: asyncio.Semaphore | None) -> AbstractAsyncContextManager[Any]:
    """The limiter as a context manager; no limit when there is none."""
    return limiter if limiter is not None else nullcontext()


# --------------------------------------------------------------------------- the reply boundary


class _Attempt:
    """One request in flight through ``ask``: whether any reply came back for it."""

    answered = False


# The attempt ``ask`` is making in this task; the chat models' transport marks it answered.
_ATTEMPT: contextvars.ContextVar[_Attempt | None] = contextvars.ContextVar(
    "coevolve_reply_attempt", default=None
)
# Where reply errors are counted, by kind (``counting_reply_errors``); None: not counted.
_REPLY_ERRORS: contextvars.ContextVar[Counter[str] | None] = contextvars.ContextVar(
    "coevolve_reply_errors", default=None
)


@contextmanager
def counting_reply_errors() -> Iterator[Counter[str]]:
    """Count the reply errors of every ``ask`` made inside the block (and in the tasks it
    starts), by kind: each failed attempt once, retried or not."""
    counter: Counter[str] = Counter()
    token = _REPLY_ERRORS.set(counter)
    try:
        yield counter
    finally:
        _REPLY_ERRORS.reset(token)


def _as_reply_error(err: Exception, answered: bool, model: str) -> ReplyError | None:
    """The reply error ``err`` stands for, or None when it is not about a reply (a bug of
    ours, or a request refused before it left)."""
    import openai

    if isinstance(err, ReplyError):
        return err
    if isinstance(err, openai.APIStatusError):
        return ReplyError(
            "status", f"HTTP {err.status_code} from {model}: {_describe_error(err)}", err
        )
    if isinstance(err, openai.APIConnectionError):  # timeouts included
        return ReplyError("transport", f"no reply from {model}: {_describe_error(err)}", err)
    if isinstance(err, openai.APIResponseValidationError) or answered:
        # The server answered and reading the answer failed, wherever: the SDK's parser,
        # langchain's message builder, our length check. That is the reply's fault.
        return ReplyError("body", f"unreadable reply from {model}: {_describe_error(err)}", err)
    return None


def _worth_retrying(error: ReplyError) -> bool:
    if error.kind == "too_long" or _names_response_format(error.cause):
        return False
    status = getattr(error.cause, "status_code", None)
    return not (isinstance(status, int) and 400 <= status < 500 and status not in (408, 429))


def _retry_policy(model: Any) -> tuple[int, float, float]:
    """(retries, base seconds, most seconds) of the endpoint behind a chat model."""
    retries = getattr(model, "reply_retries", 0)
    base = getattr(model, "retry_base_s", 0.2)
    most = getattr(model, "retry_max_s", 5.0)
    return (
        retries if isinstance(retries, int) else 0,
        base if isinstance(base, int | float) else 0.2,
        most if isinstance(most, int | float) else 5.0,
    )


async def ask(
    runnable: Any,
    messages: Sequence[BaseMessage],
    limiter: asyncio.Semaphore | None = None,
    *,
    model: Any = None,
    passthrough: tuple[type[BaseException], ...] = (),
) -> Any:
    """``runnable.ainvoke(messages)`` through the reply boundary; ``ReplyError`` when no
    readable reply came.

    ``model`` is the chat model behind ``runnable`` (default: ``runnable`` itself):
    its endpoint's retry policy applies. A failed attempt is asked again up to
    ``max_retries`` times with exponential backoff and jitter, unless retrying
    cannot help: a reply too long (a server that ignores ``max_tokens``), or a 4xx
    other than 408 and 429 (the request itself was refused). Exceptions of
    ``passthrough`` types are raised as they are.
    """
    chat = runnable if model is None else model
    label = model_label(chat)
    retries, base_s, most_s = _retry_policy(chat)
    for attempt_number in range(retries + 1):
        attempt = _Attempt()
        token = _ATTEMPT.set(attempt)
        try:
            async with limited(limiter):
                return await runnable.ainvoke(list(messages))
        except passthrough:
            raise
        except Exception as err:
            error = _as_reply_error(err, attempt.answered, label)
            if error is None:
                raise
        finally:
            _ATTEMPT.reset(token)
        counter = _REPLY_ERRORS.get()
        if counter is not None:
            counter[error.kind] += 1
        if attempt_number == retries or not _worth_retrying(error):
            raise error from error.cause
        log.info("%s; asking again (%d of %d)", error, attempt_number + 1, retries)
        delay = min(most_s, base_s * 2**attempt_number)
        await asyncio.sleep(delay * (0.5 + random.random() / 2))
    raise AssertionError("unreachable: the last attempt returns or raises")


# --------------------------------------------------------------------------- endpoint capabilities

# (base URL, model) -> how the endpoint treats response_format, once known not to honour
# it: "refused" or "ignored". Absent: honoured, or not known yet (both send it).
_NO_RESPONSE_FORMAT: dict[tuple[str, str], str] = {}
_CAPABILITY_LOCK = threading.Lock()


def _endpoint_key(model: Any) -> tuple[str, str] | None:
    """The endpoint a chat model talks to; None for a model that is not an HTTP client."""
    base = getattr(model, "openai_api_base", None)
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
        _names_response_format(err)
    )


def _names_response_format(err: BaseException | None) -> bool:
    """A server error about the request's response_format (a server answered json_schema
    with HTTP 500): asking again cannot help."""
    import openai

    if not isinstance(err, openai.InternalServerError):
        return False
    text = str(err).lower()
    return "response_format" in text or "json_schema" in text


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
            # With response_format the SDK refuses a reply cut off by max_tokens, before
            # the chat model's own length check: bound it here, then read it like any other.
            limit = getattr(model, "max_reply_chars", None)
            check_reply_length(
                err.completion, limit if isinstance(limit, int) else None, model_label(model)
            )
            result = _first_message(err.completion)
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
        _remember_no_response_format(model, "refused", _describe_error(refusal))
    raw = _content_text(reply)
    try:
        return parse_json_reply(raw, schema)
    except ValueError as err:
        problems.append(f"JSON reply unreadable: {err}")
        quoted = raw if len(raw) <= _RAW_QUOTE else raw[:_RAW_QUOTE] + "..."
        raise StructuredOutputError(f"{'; '.join(problems)}; reply was {quoted!r}", raw) from None


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


def parse_json_reply(text: str, schema: type[SchemaT]) -> SchemaT:
    """Read an instance of ``schema`` from model text; ValueError says why not."""
    if not text or not text.strip():
        raise ValueError("the reply is empty")
    errors: list[str] = []
    for data in iter_json_values(text):
        try:
            return schema.model_validate(_fit(data, schema))
        except ValidationError as err:
            errors.append(_short_validation(err))
    if errors:
        raise ValueError(f"JSON does not fit {schema.__name__}: {errors[0]}")
    raise ValueError("no JSON object in the reply")


_FENCE = re.compile(r"```[a-zA-Z0-9_-]*\s*\n?(.*?)```", re.DOTALL)
_CLOSERS = {"{": "}", "[": "]"}
# How many values iter_json_values returns at most.
_MAX_VALUES = 8
# How many nested objects and lists of one parsed value are offered.
_NESTED_VISITS = 64


@dataclass
class _Span:
    """A balanced ``{...}`` or ``[...]`` in the text, and the balanced spans directly inside."""

    start: int
    end: int = -1
    children: list[_Span] = field(default_factory=list)


def balanced_spans(text: str) -> list[_Span]:
    """The outermost balanced bracket spans of ``text``, in order, in one pass.

    Brackets inside JSON strings (with escapes) do not count; quotes outside
    any bracket are prose and do not start strings. A closing bracket that
    does not match, or the end of the text, abandons the open brackets and
    promotes their finished inner spans to outermost ones, so JSON after prose
    such as "{ not json" is still found.
    """
    top: list[_Span] = []
    stack: list[tuple[str, _Span]] = []  # (expected closer, span)

    def abandon_open() -> None:
        for _closer, span in stack:  # bottom first: their finished children are in order
            top.extend(span.children)
        stack.clear()

    in_string = escaped = False
    for index, char in enumerate(text):
        if in_string:
            if escaped:
                escaped = False
            elif char == "\\":
                escaped = True
            elif char == '"':
                in_string = False
        elif char in _CLOSERS:
            stack.append((_CLOSERS[char], _Span(index)))
        elif not stack:
            continue
        elif char == '"':
            in_string = True
        elif char in "}]":
            closer, span = stack[-1]
            if char != closer:
                abandon_open()
                continue
            stack.pop()
            span.end = index + 1
            (stack[-1][1].children if stack else top).append(span)
    abandon_open()
    return top


def iter_json_values(text: str) -> list[Any]:
    """JSON objects and lists found in model text, in linear time: fenced blocks first, then
    the text; for each, its outermost balanced spans in order.

    A span that parses gives its value and then the objects and lists nested in
    it (without parsing again); a span that does not gives what its inner spans
    hold. The characters handed to ``json.loads`` are bounded by a small
    multiple of the text's length, so a long reply costs time in proportion to
    its length (langchain-core's partial-JSON parser takes time in its square).
    """
    sources = [block for block in _FENCE.findall(text) if block.strip()] + [text]
    found: list[Any] = []
    seen: set[str] = set()
    budget = 4 * sum(len(source) for source in sources)

    def add(value: Any) -> bool:
        """Record a value; True when enough were found."""
        try:
            key = json.dumps(value, sort_keys=True, default=str)
        except (ValueError, RecursionError):
            return False
        if key not in seen:
            seen.add(key)
            found.append(value)
        return len(found) >= _MAX_VALUES

    def add_nested(value: Any) -> bool:
        # Depth first, in text order, as the spans would be; two levels deep and
        # _NESTED_VISITS values at most, so the serialising in add() stays linear.
        pending = [(value, 0)]
        visits = 0
        while pending and visits < _NESTED_VISITS:
            item, depth = pending.pop()
            visits += 1
            if add(item):
                return True
            if depth < 2:
                children = list(item.values() if isinstance(item, dict) else item)
                pending += [
                    (c, depth + 1) for c in reversed(children) if isinstance(c, dict | list)
                ]
        return False

    def visit(source: str, spans: list[_Span]) -> bool:
        nonlocal budget
        for span in spans:
            if budget <= 0:
                return True
            budget -= span.end - span.start
            try:
                value = json.loads(source[span.start : span.end])
            except (ValueError, RecursionError):
                if visit(source, span.children):
                    return True
                continue
            if add_nested(value):
                return True
        return False

    for source in sources:
        if visit(source, balanced_spans(source)):
            break
    return found


def _fit(data: Any, schema: type[BaseModel]) -> Any:
    """Tolerate the usual near-misses: a bare list for a one-list schema, unknown keys."""
    fields = schema.model_fields
    if isinstance(data, list):
        lists = [name for name, field in fields.items() if _is_list(field.annotation)]
        if len(lists) == 1:
            return {lists[0]: data}
        return data
    if isinstance(data, dict) and len(data) == 1:
        [(only_key, only_value)] = data.items()
        if only_key not in fields:
            if isinstance(only_value, dict):
                data = only_value  # {"SynthesisContext": {...}}
            elif isinstance(only_value, list):
                return _fit(only_value, schema)  # {"tasks": [...]} for {"candidates": [...]}
    if not isinstance(data, dict):
        return data
    if schema.model_config.get("extra") == "forbid":
        data = {key: value for key, value in data.items() if key in fields}
    # A lone string where a list of strings belongs: ["that string"].
    return {
        key: [value]
        if isinstance(value, str) and key in fields and _is_list(fields[key].annotation)
        else value
        for key, value in data.items()
    }


def _is_list(annotation: Any) -> bool:
    return getattr(annotation, "__origin__", None) is list or annotation is list


def _short_validation(err: ValidationError) -> str:
    first = err.errors()[0]
    where = ".".join(str(part) for part in first["loc"]) or "(top level)"
    return f"{where}: {first['msg']} ({len(err.errors())} problem(s))"


def _first_message(completion: Any) -> Any:
    """The first choice's message of an SDK chat completion (None when it has none)."""
    choices = _field(completion, "choices") or []
    return _field(choices[0], "message") if choices else None


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


def _describe_error(err: BaseException) -> str:
    text = str(err).strip().replace("\n", " ")
    if len(text) > 300:
        text = text[:300] + "..."
    return f"{type(err).__name__}: {text}" if text else type(err).__name__
