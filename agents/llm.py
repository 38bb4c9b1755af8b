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
"""

from __future__ import annotations

import asyncio
import functools
import json
import logging
import re
import weakref
from collections.abc import Sequence
from contextlib import AbstractAsyncContextManager, nullcontext
from typing import TYPE_CHECKING, Any, TypeVar

import httpx
from langchain_core.messages import BaseMessage, HumanMessage
from pydantic import BaseModel, SecretStr, ValidationError

if TYPE_CHECKING:
    from langchain_openai import ChatOpenAI

    from ..config import EndpointConfig

log = logging.getLogger(__name__)

SchemaT = TypeVar("SchemaT", bound=BaseModel)

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


class _PerLoopTransport(httpx.AsyncBaseTransport):
    """An httpx transport with one connection pool per event loop.

    Pooled connections belong to the loop that opened them; a run that calls
    ``asyncio.run`` more than once with the same chat model (a script, a test,
    a cycle runner) would otherwise reuse a dead loop's connections and fail
    with "Event loop is closed".
    """

    def __init__(self, **options: Any):
        self._options = options
        self._pools: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, httpx.AsyncHTTPTransport]
        self._pools = weakref.WeakKeyDictionary()

    def _pool(self) -> httpx.AsyncHTTPTransport:
        loop = asyncio.get_running_loop()
        pool = self._pools.get(loop)
        if pool is None:
            pool = httpx.AsyncHTTPTransport(**self._options)
            self._pools[loop] = pool
        return pool

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        return await self._pool().handle_async_request(request)

    async def aclose(self) -> None:
        loop = asyncio.get_running_loop()
        pool = self._pools.pop(loop, None)
        if pool is not None:
            await pool.aclose()


def chat_model(endpoint: EndpointConfig, temperature: float | None = None) -> ChatOpenAI:
    """A ``ChatOpenAI`` for one endpoint; ``temperature`` overrides the endpoint's."""
    from langchain_openai import ChatOpenAI

    client = httpx.AsyncClient(
        transport=_PerLoopTransport(
            limits=httpx.Limits(max_connections=max(endpoint.concurrency, 1) * 2)
        ),
        timeout=endpoint.timeout_s,
    )
    return ChatOpenAI(
        base_url=endpoint.base_url,
        model=endpoint.model,
        api_key=SecretStr(endpoint.api_key()),
        timeout=endpoint.timeout_s,
        max_retries=endpoint.max_retries,
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


# --------------------------------------------------------------------------- structured output


async def structured_call(
    model: Any,
    schema: type[SchemaT],
    messages: Sequence[BaseMessage],
    limiter: asyncio.Semaphore | None = None,
) -> SchemaT:
    """Ask ``model`` for an instance of ``schema``; raise StructuredOutputError if none comes.

    1. ``with_structured_output(..., method="json_schema")``: the server is
       told the schema. A reply that does not parse as-is is read tolerantly.
    2. If the server refused that request, or its reply held no valid object, a
       plain request that asks for JSON (the schema in the message), read
       tolerantly.
    """
    problems: list[str] = []
    raw: str | None = None
    try:
        runnable = _structured_runnable(model, schema)
        async with limited(limiter):
            result = await runnable.ainvoke(list(messages))
    except Exception as err:  # the server refused response_format, or the body was broken
        problems.append(f"structured request failed: {_describe_error(err)}")
    else:
        parsed = result.get("parsed")
        if parsed is not None:
            try:
                return schema.model_validate(_fit(parsed, schema))
            except ValidationError as err:
                problems.append(f"structured reply does not fit: {_short_validation(err)}")
        raw = _content_text(result.get("raw"))
        try:
            return parse_json_reply(raw, schema)
        except ValueError as err:
            problems.append(f"structured reply unreadable: {err}")

    fallback = [*messages, HumanMessage(content=json_instruction(schema))]
    try:
        async with limited(limiter):
            reply = await model.ainvoke(fallback)
    except Exception as err:
        problems.append(f"JSON request failed: {_describe_error(err)}")
        raise StructuredOutputError("; ".join(problems), raw) from err
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
    """``with_structured_output`` built once per (model, schema): building it, and the
    JSON schema inside it, cost more CPU than the request itself."""
    entry = _RUNNABLES.get(id(model))
    if entry is None or entry[0]() is not model:
        entry = (weakref.ref(model), {})
        _RUNNABLES[id(model)] = entry
    per_schema = entry[1]
    if schema not in per_schema:
        per_schema[schema] = model.with_structured_output(
            response_format(schema), method="json_schema", include_raw=True
        )
    return per_schema[schema]


@functools.cache
def response_format(schema: type[BaseModel]) -> dict[str, Any]:
    """The schema as an OpenAI ``json_schema`` response format.

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


def iter_json_values(text: str) -> list[Any]:
    """JSON objects (and lists) found in text: fenced blocks first, then the text from each brace."""
    decoder = json.JSONDecoder()
    sources = [block.strip() for block in _FENCE.findall(text)] + [text]
    found: list[Any] = []
    seen: set[str] = set()
    for source in sources:
        for match in re.finditer(r"[\[{]", source):
            try:
                value, _end = decoder.raw_decode(source, match.start())
            except json.JSONDecodeError:
                continue
            if not isinstance(value, dict | list):
                continue
            key = json.dumps(value, sort_keys=True, default=str)
            if key not in seen:
                seen.add(key)
                found.append(value)
            if len(found) >= 8:
                return found
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
