"""The synthesis roles' chat model: a LangChain ``BaseChatModel`` over an
OpenAI-compatible ``/chat/completions`` endpoint, sent on the project's HTTP client.

``EndpointChatModel`` implements the documented extension points of a LangChain chat
model (``_agenerate``, ``_generate``, ``_llm_type``, ``bind_tools``) and nothing
private of anyone's. It does what the roles need and what ``ChatOpenAI`` did for
them through overridden private methods:

- the request is built here and posted as it is on ``common/http.py``'s client
  (aiohttp, one session per event loop), without the openai SDK, whose typed
  methods walk every request through a transform that cost 2.5-3 ms of CPU a call
  with 31 tool schemas bound (docs/benchmarks/synthesis.md);
- the length limit goes under the name the endpoint honours (``length_field``:
  ``max_tokens``, which OpenAI-compatible servers read, or ``max_completion_tokens``);
- a reply longer than ``max_reply_chars`` (content and tool-call arguments) raises
  ``ReplyTooLongError`` before anything parses it;
- the endpoint's retry settings ride on the model (``reply_retries``,
  ``retry_base_s``, ``retry_max_s``) for the reply boundary, ``agents/roles/replies.py``,
  which retries under the one retry policy (``common/retry.py``); the model itself
  asks once;
- failures raise the openai SDK's error classes (its documented table of status
  codes; ``APITimeoutError``, ``APIConnectionError``), so the reply boundary reads
  this model and a user's ``ChatOpenAI`` alike; the SDK itself sends nothing.

Messages go out as the chat-completions API has them (tool calls a reply carried,
unreadable ones included, so every tool message answers a call the request names);
a reply comes back as an ``AIMessage`` with its tool calls parsed by langchain-core's
parser (``parse_tool_call``), unreadable ones as invalid tool calls, and its token
usage, also added to the caller's ``counting_replies``.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import httpx
import orjson
from langchain_core.callbacks import AsyncCallbackManagerForLLMRun, CallbackManagerForLLMRun
from langchain_core.language_models import BaseChatModel, LanguageModelInput
from langchain_core.messages import (
    AIMessage,
    BaseMessage,
    ChatMessage,
    HumanMessage,
    SystemMessage,
    ToolMessage,
    convert_to_openai_messages,
)
from langchain_core.messages.ai import UsageMetadata
from langchain_core.output_parsers.openai_tools import make_invalid_tool_call, parse_tool_call
from langchain_core.outputs import ChatGeneration, ChatResult
from langchain_core.runnables import Runnable
from langchain_core.tools import BaseTool
from langchain_core.utils.function_calling import convert_to_openai_tool
from pydantic import ConfigDict, Field, PrivateAttr, SecretStr

from ...common.http import HttpClient, RequestTimeout, Response, TransportError
from ..policy.completion_body import encode_request, shown
from ..policy.policy_interface import function_call
from .replies import check_reply_length, count_reply_tokens, mark_answered


class EndpointChatModel(BaseChatModel):
    """Chat completions of one model behind an OpenAI-compatible endpoint (module doc)."""

    model_config = ConfigDict(populate_by_name=True, protected_namespaces=())

    model_name: str = Field(alias="model")
    base_url: str
    api_key: SecretStr = SecretStr("EMPTY")
    temperature: float | None = None
    max_tokens: int | None = None
    # The name the length limit is sent under (EndpointConfig.length_field).
    length_field: str = "max_tokens"
    # Merged into every request body (a server's own parameters: top_k, ...).
    extra_body: dict[str, Any] | None = None
    timeout_s: float = 60.0
    max_connections: int = 16
    # Longer replies raise ReplyTooLongError unread (None: no limit).
    max_reply_chars: int | None = None
    # The endpoint's retry policy, applied by the reply boundary (agents/roles/replies.py: ask).
    reply_retries: int = 0
    retry_base_s: float = 0.2
    retry_max_s: float = 5.0

    _http: HttpClient | None = PrivateAttr(default=None)

    @property
    def _llm_type(self) -> str:
        return "coevolve-openai-compatible"

    @property
    def _identifying_params(self) -> dict[str, Any]:
        return {"model_name": self.model_name, "base_url": self.base_url}

    # ------------------------------------------------------------------ LangChain API

    def bind_tools(
        self,
        tools: Sequence[dict[str, Any] | type | Callable[..., Any] | BaseTool],
        *,
        tool_choice: str | dict[str, Any] | bool | None = None,
        **kwargs: Any,
    ) -> Runnable[LanguageModelInput, AIMessage]:
        """The model with ``tools`` (OpenAI tool dicts, pydantic classes, functions or
        LangChain tools) sent in every request; ``tool_choice`` as the API takes it, a
        tool's name, "any" (any tool) or True (the one tool)."""
        formatted = [convert_to_openai_tool(tool) for tool in tools]
        if tool_choice is not None and tool_choice is not False:
            kwargs["tool_choice"] = _tool_choice(tool_choice, formatted)
        return self.bind(tools=formatted, **kwargs)

    async def _agenerate(
        self,
        messages: list[BaseMessage],
        stop: list[str] | None = None,
        run_manager: AsyncCallbackManagerForLLMRun | None = None,
        **kwargs: Any,
    ) -> ChatResult:
        reply = await self._post(self._request(messages, stop, kwargs))
        check_reply_length(reply, self.max_reply_chars, self.model_name)
        result = chat_result(reply, self.model_name)
        # chat_result read the reply's usage onto every message: count it once
        usage = getattr(result.generations[0].message, "usage_metadata", None)
        if usage is not None:
            count_reply_tokens(usage["input_tokens"], usage["output_tokens"])
        return result

    def _generate(
        self,
        messages: list[BaseMessage],
        stop: list[str] | None = None,
        run_manager: CallbackManagerForLLMRun | None = None,
        **kwargs: Any,
    ) -> ChatResult:
        """The synchronous path (``invoke``): ``_agenerate`` on an event loop of its own,
        in a worker thread when the caller is inside a running loop."""
        coroutine = self._agenerate(messages, stop, None, **kwargs)
        try:
            asyncio.get_running_loop()
        except RuntimeError:
            return asyncio.run(coroutine)
        with ThreadPoolExecutor(1) as worker:
            return worker.submit(asyncio.run, coroutine).result()

    # ------------------------------------------------------------------ the request

    def _request(
        self, messages: list[BaseMessage], stop: list[str] | None, options: dict[str, Any]
    ) -> dict[str, Any]:
        request: dict[str, Any] = {
            "model": self.model_name,
            "messages": [message_dict(message) for message in messages],
        }
        if self.temperature is not None:
            request["temperature"] = self.temperature
        if self.max_tokens is not None:
            request[self.length_field] = self.max_tokens
        if stop:
            request["stop"] = stop
        # What was bound (tools, tool_choice, response_format, ...); LangChain's own
        # tracing keys (ls_*) are not the server's business.
        request.update((k, v) for k, v in options.items() if not k.startswith("ls_"))
        request.update(self.extra_body or {})
        return request

    def _client(self) -> HttpClient:
        wanted = (self.timeout_s, max(1, self.max_connections))  # as HttpClient keeps them
        if self._http is None or (self._http.timeout_s, self._http.max_connections) != wanted:
            self._http = HttpClient(timeout_s=self.timeout_s, max_connections=self.max_connections)
        return self._http

    async def _post(self, request: dict[str, Any]) -> Any:
        """POST the request; the reply's JSON. No response raises ``openai.APITimeoutError``
        or ``APIConnectionError``, an error status the SDK's ``APIStatusError`` subclass
        for it, a body that is not JSON ``ValueError``."""
        url = f"{self.base_url.rstrip('/')}/chat/completions"
        headers = {
            "Authorization": f"Bearer {self.api_key.get_secret_value()}",
            "Content-Type": "application/json",
        }
        try:
            response = await self._client().request("POST", url, encode_request(request), headers)
        except TransportError as err:  # RequestTimeout included
            import openai

            if isinstance(err, RequestTimeout):
                raise openai.APITimeoutError(request=_error_request(url)) from None
            raise openai.APIConnectionError(message=str(err), request=_error_request(url)) from None
        mark_answered()  # from here on, a failure is about what the server sent
        if response.status >= 400:
            raise status_error(response, _error_request(url))
        try:
            return orjson.loads(response.body)
        except orjson.JSONDecodeError:
            raise ValueError(f"the reply's body is not JSON: {shown(response.body)}") from None


def _tool_choice(choice: str | dict[str, Any] | bool, tools: list[dict[str, Any]]) -> Any:
    if isinstance(choice, dict) or choice in ("auto", "none", "required"):
        return choice
    if choice == "any":
        return "required"
    if choice is True:
        if len(tools) != 1:
            raise ValueError("tool_choice=True needs exactly one tool")
        choice = tools[0]["function"]["name"]
    return {"type": "function", "function": {"name": choice}}


# --------------------------------------------------------------------------- messages


def message_dict(message: BaseMessage) -> dict[str, Any]:
    """A LangChain message as the chat-completions API takes it. An assistant message
    carries its tool calls, unreadable ones included (with their raw arguments), so the
    tool messages that answer them name calls the request holds."""
    entry: dict[str, Any]
    if isinstance(message, AIMessage):
        entry = {"role": "assistant", "content": _content(message)}
        calls = [
            function_call(call["id"], call["name"], json.dumps(call["args"], ensure_ascii=False))
            for call in message.tool_calls
        ] + [
            function_call(call["id"], call["name"], call["args"])
            for call in message.invalid_tool_calls
        ]
        if calls:
            entry["tool_calls"] = calls
            entry["content"] = entry["content"] or None
    elif isinstance(message, ToolMessage):
        return {"role": "tool", "tool_call_id": message.tool_call_id, "content": _content(message)}
    elif isinstance(message, SystemMessage):
        entry = {"role": "system", "content": _content(message)}
    elif isinstance(message, HumanMessage):
        entry = {"role": "user", "content": _content(message)}
    elif isinstance(message, ChatMessage):
        entry = {"role": message.role, "content": _content(message)}
    else:
        raise ValueError(f"a {type(message).__name__} cannot be sent as a chat completion message")
    if message.name:
        entry["name"] = message.name
    return entry


def _content(message: BaseMessage) -> Any:
    if isinstance(message.content, str):
        return message.content
    return convert_to_openai_messages(message)["content"]  # content blocks


# --------------------------------------------------------------------------- replies


def chat_result(reply: Any, model_name: str) -> ChatResult:
    """A chat completion (decoded JSON) as LangChain's result; ``ValueError`` or
    ``TypeError`` for a body that is not one."""
    if not isinstance(reply, dict):
        raise ValueError(f"the reply is not a JSON object: {shown(orjson.dumps(reply))}")
    if reply.get("error"):
        raise ValueError(f"the reply is an error: {reply['error']}")
    choices = reply.get("choices")
    if not isinstance(choices, list) or not choices:
        raise ValueError(f"the reply has no choices: choices={choices!r}")
    usage = _usage(reply.get("usage"))
    generations = []
    for choice in choices:
        if not isinstance(choice, dict) or not isinstance(choice.get("message"), dict):
            raise ValueError(f"a choice without a message: {choice!r:.200}")
        message = _ai_message(choice["message"], reply.get("id"))
        if usage is not None:
            message.usage_metadata = usage
        info: dict[str, Any] = {"finish_reason": choice.get("finish_reason")}
        if choice.get("logprobs") is not None:
            info["logprobs"] = choice["logprobs"]
        generations.append(ChatGeneration(message=message, generation_info=info))
    llm_output = {
        "token_usage": reply.get("usage"),
        "model_name": reply.get("model") or model_name,
    }
    return ChatResult(generations=generations, llm_output=llm_output)


def _ai_message(message: dict[str, Any], reply_id: Any) -> AIMessage:
    content = message.get("content")
    if content is None:
        content = ""
    elif not isinstance(content, str | list):
        raise ValueError(f"the reply's content is not text: {content!r:.200}")
    calls, invalid = [], []
    raw_calls = message.get("tool_calls") or []
    if not isinstance(raw_calls, list):
        raise ValueError(f"tool_calls is not a list: {raw_calls!r:.200}")
    for raw in raw_calls:
        if not isinstance(raw, dict) or not isinstance(raw.get("function"), dict):
            raise ValueError(f"a tool call without a function: {raw!r:.200}")
        try:
            call = parse_tool_call(raw, return_id=True)
        except Exception as err:  # arguments that are not JSON: the model's mistake
            invalid.append(make_invalid_tool_call(raw, str(err)))
            continue
        if call is not None:
            calls.append(call)
    return AIMessage(
        content=content,
        tool_calls=calls,
        invalid_tool_calls=invalid,
        id=reply_id if isinstance(reply_id, str) else None,
    )


def _usage(usage: Any) -> UsageMetadata | None:
    if not isinstance(usage, dict):
        return None
    prompt, completion, total = (
        _count(usage.get(key)) for key in ("prompt_tokens", "completion_tokens", "total_tokens")
    )
    if prompt is None or completion is None:
        return None
    total = prompt + completion if total is None else total
    return UsageMetadata(input_tokens=prompt, output_tokens=completion, total_tokens=total)


def _count(value: Any) -> int | None:
    if isinstance(value, int) and not isinstance(value, bool) and value >= 0:
        return value
    return None


# --------------------------------------------------------------------------- errors


def _error_request(url: str) -> Any:
    """The request an SDK error names. The SDK's errors are typed with its own httpx fork
    (httpx2); they read only the request, status and headers, which httpx's classes carry
    alike. Built only on failure."""
    return httpx.Request("POST", url)


def status_error(response: Response, request: httpx.Request) -> Exception:
    """The openai SDK's exception for an error status, with the SDK's message and body."""
    import openai

    classes: dict[int, type[openai.APIStatusError]] = {
        400: openai.BadRequestError,
        401: openai.AuthenticationError,
        403: openai.PermissionDeniedError,
        404: openai.NotFoundError,
        409: openai.ConflictError,
        422: openai.UnprocessableEntityError,
        429: openai.RateLimitError,
    }
    status = response.status
    cls = classes.get(status) or (
        openai.InternalServerError if status >= 500 else openai.APIStatusError
    )
    text = response.body.decode("utf-8", "replace").strip()
    try:
        body: Any = orjson.loads(text)
        message = f"Error code: {status} - {body}"
    except orjson.JSONDecodeError:
        body, message = text, text or f"Error code: {status}"
    data = body.get("error", body) if isinstance(body, dict) else body
    # Response headers as they came; the body is whole (aiohttp decoded any compression).
    headers = [
        (name, value)
        for name, value in response.headers.items()
        if name.lower() not in ("content-encoding", "transfer-encoding", "content-length")
    ]
    read_back: Any = httpx.Response(status, headers=headers, content=response.body, request=request)
    return cls(message, response=read_back, body=data)
