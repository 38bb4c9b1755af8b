"""A policy behind an OpenAI-compatible chat-completions endpoint (vLLM, a hosted API).

Each conversation of a batch is one request; all of them are in flight at once,
bounded by ``endpoint.concurrency``. Transient failures (5xx, 429, timeouts,
dropped connections, bodies that are not a chat completion) are retried with
exponential backoff and jitter (a server's Retry-After honoured), by
``tenacity``; a conversation that still fails comes back as an
``AssistantMessage`` with ``error`` and ``transport_failure`` set, so one bad
request never ends a batch of rollouts, and the loop can tell an endpoint that
gave no reply from an agent that failed. Only a configuration mistake that dooms every request (a wrong
key, an unknown model or URL) raises ``PolicyError``.

Requests go out on the project's HTTP client (``common/http.py``: aiohttp, one
session per event loop), not through the openai SDK or httpx: they spend 4-6 ms and
0.8-9 ms of CPU per request, which at rollout fan-out (64 requests in flight) would be
the bottleneck, not the server. Bodies are encoded once and decoded with orjson and
read as dicts (``completion_body``). One policy
counts every attempt, so error messages are honest ("failed after 4 attempts").
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import orjson
from pydantic import ValidationError

from ...common.http import HttpClient, RequestTimeout, TransportError, error_detail
from ...common.retry import RetryPolicy, retry_after_s, retryable_status
from ..config import EndpointConfig
from .completion_body import (
    completion_problem,
    encode_request,
    message_from_completion,
    shown,
)
from .per_loop import PerLoop
from .policy_interface import (
    AssistantMessage,
    LoraApiMissing,
    Message,
    PolicyError,
)


class _Transient(Exception):
    """A failed attempt worth retrying; the message says what went wrong."""

    def __init__(self, message: str, retry_after_s: float | None = None):
        super().__init__(message)
        self.retry_after_s = retry_after_s


def _is_transient(error: BaseException) -> bool:
    return isinstance(error, _Transient)


class _Rejected(Exception):
    """The server refused this one request (a 4xx that retrying cannot fix)."""


class EndpointPolicy:
    """The Policy protocol over an OpenAI-compatible endpoint.

    ``tools_in_request=False`` leaves ``tools`` out of the request, for servers
    started without a tool-call parser (vLLM refuses tools then); such a model
    writes ``<tool_call>`` blocks in its text, which are parsed from the content.
    ``retry_base_s`` and ``retry_max_s`` shape the backoff between attempts (None:
    the endpoint's). ``read_json_calls`` reads a call the model wrote in its text as a
    JSON object (alone or in a fenced block), as llama-server's Qwen2.5 Coder does
    (``policy.read_json_calls``); off, such a call is an ``unreadable_call``.
    """

    # generate() takes on_reply: the rollout engine steps each episode as its reply
    # arrives, while the rest of the step's requests are in flight.
    reports_each_reply = True

    def __init__(
        self,
        endpoint: EndpointConfig,
        *,
        tools_in_request: bool = True,
        version: str | None = None,
        retry_base_s: float | None = None,
        retry_max_s: float | None = None,
        read_json_calls: bool = False,
    ):
        self.endpoint = endpoint
        self.read_json_calls = read_json_calls
        self._base_endpoint = endpoint  # what the server serves without a loaded adapter
        self.tools_in_request = tools_in_request
        self.version = version or endpoint.model
        self.retry_base_s = endpoint.retry_base_s if retry_base_s is None else retry_base_s
        self.retry_max_s = endpoint.retry_max_s if retry_max_s is None else retry_max_s
        self._http = HttpClient(
            timeout_s=endpoint.timeout_s,
            max_connections=endpoint.concurrency,
            headers={
                "Content-Type": "application/json",
                "Accept": "application/json",
                # Read the key now: a missing variable is a configuration error to report
                # before any rollout starts. "EMPTY" without a key variable, as the openai
                # client sends.
                "Authorization": f"Bearer {endpoint.api_key()}",
            },
        )
        self._chat_url = self._url("chat/completions")
        # The semaphore (the running loop's requests in flight) belongs to the event loop
        # that made it (the client keeps its connections per loop too); callers that run
        # asyncio.run() per batch get fresh ones.
        self._semaphores = PerLoop(lambda: asyncio.Semaphore(self.endpoint.concurrency))
        self._loaded_adapter: str | None = None  # the adapter this policy hot-loaded last
        # Tool lists' JSON by list object: an environment hands the same list with every
        # reply of an episode (the world's is one list for all), and its 31 schemas were
        # 24 of the 25 us it took to encode a request.
        self._encoded_tools: dict[int, tuple[Sequence[dict[str, Any]], bytes, int]] = {}

    # ------------------------------------------------------------------ public API

    async def generate(
        self,
        conversations: Sequence[Sequence[Message]],
        tools: Sequence[Sequence[dict[str, Any]]],
        temperature: float | None = None,
        on_reply: Callable[[int, AssistantMessage], None] | None = None,
    ) -> list[AssistantMessage]:
        """The next assistant message of each conversation (``tools[i]`` for ``conversations[i]``).

        ``on_reply(i, message)`` is called with each conversation's message as soon as it
        arrives, before the others have; an exception it raises is raised by ``generate``
        once every request has ended."""
        if len(tools) != len(conversations):
            raise ValueError(
                f"got {len(conversations)} conversations but {len(tools)} tool lists; "
                "pass one tool list per conversation"
            )
        semaphore = self._semaphores.get()
        if temperature is None:
            temperature = self.endpoint.temperature

        async def complete(
            index: int, messages: Sequence[Message], tool_list: Sequence[dict[str, Any]]
        ) -> AssistantMessage:
            message = await self._complete(semaphore, list(messages), tool_list, temperature)
            if on_reply is not None:
                on_reply(index, message)
            return message

        results = await asyncio.gather(
            *map(complete, range(len(conversations)), conversations, tools),
            return_exceptions=True,
        )
        # Wait for every request before raising, so none is left running unobserved.
        for result in results:
            if isinstance(result, BaseException):
                raise result
        return [r for r in results if isinstance(r, AssistantMessage)]

    async def load_adapter(self, name: str, path: str) -> None:
        """Serve the LoRA adapter at ``path`` (a directory the *server* can read) as ``name``.

        Uses vLLM's runtime LoRA API (the server needs ``--enable-lora`` and
        ``VLLM_ALLOW_RUNTIME_LORA_UPDATING=True``): ``POST /v1/load_lora_adapter``
        for the new adapter, then requests go to ``name``, then the adapter
        served before (if it was one this policy loaded) is unloaded with
        ``POST /v1/unload_lora_adapter``. Loading first means no request ever
        names an adapter that is gone. Raises PolicyError when the server refuses.
        """
        previous = self._loaded_adapter
        if previous == name:  # vLLM refuses to load a name twice; reload under it
            await self._lora_request("unload_lora_adapter", {"lora_name": name})
            previous = None
        await self._lora_request(
            "load_lora_adapter", {"lora_name": name, "lora_path": path}, loaded_ok=True
        )
        self.endpoint = self.endpoint.model_copy(update={"model": name})
        self.version = name
        self._loaded_adapter = name
        if previous is not None:
            await self._lora_request("unload_lora_adapter", {"lora_name": previous})

    async def serve_adapter(self, adapter_dir: str | Path) -> None:
        """Serve the adapter directory as ``<base model>-coevolve-<directory name>``
        (``load_adapter``), the one name every adapter of a run is served under."""
        path = Path(adapter_dir).resolve()
        await self.load_adapter(f"{self._base_endpoint.model}-coevolve-{path.name}", str(path))

    async def unload_adapter(self) -> None:
        """Unload the adapter this policy loaded (if any); requests name the base model again."""
        loaded, self._loaded_adapter = self._loaded_adapter, None
        self.endpoint = self._base_endpoint
        self.version = self._base_endpoint.model
        if loaded is not None:
            await self._lora_request("unload_lora_adapter", {"lora_name": loaded})

    def sibling(self) -> EndpointPolicy:
        """A second policy on the same server and base model, with its own adapter and
        connections: a second agent served beside this one (vLLM ``--max-loras`` 2)."""
        return EndpointPolicy(
            self._base_endpoint,
            tools_in_request=self.tools_in_request,
            retry_base_s=self.retry_base_s,
            retry_max_s=self.retry_max_s,
            read_json_calls=self.read_json_calls,
        )

    async def _lora_request(
        self, route: str, body: dict[str, str], loaded_ok: bool = False
    ) -> None:
        """One call of vLLM's LoRA API. With ``loaded_ok``, "already loaded" is success: a
        resumed run re-loads the adapter of its last cycle, which the server may still hold
        (an adapter directory never changes once written, so the name means the same weights)."""
        try:
            response = await self._http.request("POST", self._url(route), orjson.dumps(body))
        except TransportError as err:
            raise PolicyError(f"{self._where()}: {route} failed: {err}") from None
        status = response.status
        if 200 <= status < 300:
            return
        detail = error_detail(response.body, response.reason)
        if loaded_ok and status == 400 and "already" in detail:
            return
        message = f"{self._where()}: {route} refused (HTTP {status}: {detail})"
        if route == "load_lora_adapter" and status in (404, 405, 501):
            raise LoraApiMissing(
                f"{message} (is vLLM started with --enable-lora and "
                "VLLM_ALLOW_RUNTIME_LORA_UPDATING=True?)"
            )
        raise PolicyError(message)

    async def aclose(self) -> None:
        """Close the running loop's connections; other loops close theirs when they end."""
        self._semaphores.clear()
        await self._http.aclose()

    # ------------------------------------------------------------------ one request

    async def _complete(
        self,
        semaphore: asyncio.Semaphore,
        messages: list[Message],
        tools: Sequence[dict[str, Any]],
        temperature: float,
    ) -> AssistantMessage:
        request: dict[str, Any] = {
            "model": self.endpoint.model,
            "messages": messages,
            "temperature": temperature,
            "max_tokens": self.endpoint.max_tokens,
        }
        if self.endpoint.return_token_ids:
            # vLLM's extensions: the prompt's and the completion's token ids, and the
            # log-prob of every sampled token (choice.logprobs.content[i].logprob).
            request["return_token_ids"] = True
            request["logprobs"] = True
        # Encoded once, sent as is by every attempt.
        payload = encode_request(request)
        if tools and self.tools_in_request:  # spliced in before the object's closing brace
            payload = b'%s,"tools":%s}' % (payload[:-1], self._tools_json(tools))
        attempts = self.endpoint.max_retries + 1
        try:
            # The first attempt outside tenacity: building and driving its retry object
            # took a third of the client's CPU per request at rollout fan-out
            # (docs/benchmarks.md), and most requests succeed the first time.
            try:
                return await self._attempt(semaphore, payload)
            except _Transient as err:
                if attempts == 1:
                    raise
                await asyncio.sleep(self._retry_policy().delay(1, err))
            # One AsyncRetrying per request: tenacity keeps a call's state on the object
            # (per thread), so the concurrent requests of a batch cannot share one. The
            # endpoints' one retry policy (common/retry.py), after the first attempt.
            retrying = self._retry_policy().asynchronous(_is_transient, done_before=1)
            return await retrying(self._attempt, semaphore, payload)
        except _Transient as err:
            return AssistantMessage(
                error=f"{self._where()} failed after {attempts} attempt{'s' * (attempts > 1)}: "
                f"{err}",
                transport_failure=True,
            )
        except _Rejected as err:
            return AssistantMessage(error=f"{self._where()} rejected the request: {err}")

    def _tools_json(self, tools: Sequence[dict[str, Any]]) -> bytes:
        """``tools`` as JSON, encoded once per list object; a list edited in place after
        it was sent is encoded again only if its length changed, so environments hand a
        new list when their tools change (``Environment.tools``)."""
        key = id(tools)
        cached = self._encoded_tools.get(key)
        if cached is not None and cached[0] is tools and cached[2] == len(tools):
            return cached[1]
        if len(self._encoded_tools) >= 256:  # lists of finished episodes
            self._encoded_tools.clear()
        data = encode_request(list(tools))
        self._encoded_tools[key] = (tools, data, len(tools))
        return data

    async def _attempt(self, semaphore: asyncio.Semaphore, payload: bytes) -> AssistantMessage:
        # The backoff sleeps between attempts, outside the semaphore, so waiting never
        # holds a slot.
        async with semaphore:
            body = await self._post(payload)
        try:
            return message_from_completion(body, read_json_calls=self.read_json_calls)
        except ValidationError as err:  # a field of a type the shape check let through
            where = ".".join(str(part) for part in err.errors()[0]["loc"])
            raise _Transient(f"malformed response ({where}: {err.errors()[0]['msg']})") from None

    async def _post(self, payload: bytes) -> dict[str, Any]:
        """One attempt: the completion as a dict, or _Transient / _Rejected / PolicyError."""
        try:
            response = await self._http.request("POST", self._chat_url, payload)
        except RequestTimeout:
            raise _Transient(f"timed out after {self.endpoint.timeout_s:g} s") from None
        except TransportError as err:
            raise _Transient(f"connection error: {err}") from None
        status = response.status
        data = response.body
        if not 200 <= status < 300:
            detail = error_detail(data, response.reason)
            if retryable_status(status):
                retry_after = retry_after_s(response.headers.get("retry-after"))
                raise _Transient(f"HTTP {status}: {detail}", retry_after)
            if status in (401, 403):
                raise PolicyError(self._auth_help(status, detail))
            if status == 404:
                raise PolicyError(await self._not_found_help(detail))
            raise _Rejected(f"HTTP {status}: {detail}")
        # A 200 whose body is not a chat completion is a transient server fault (a
        # proxy's error page, a truncated body), not a crash.
        try:
            body = orjson.loads(data)
        except orjson.JSONDecodeError:
            raise _Transient(f"malformed response (not JSON): {shown(data)}") from None
        problem = completion_problem(body)
        if problem:
            raise _Transient(f"malformed response ({problem}): {shown(data)}")
        return body

    def _retry_policy(self) -> RetryPolicy:
        """The endpoint's retry policy (common/retry.py: exponential backoff with jitter, a
        server's Retry-After honoured up to retry_max_s)."""
        return RetryPolicy(self.endpoint.max_retries, self.retry_base_s, self.retry_max_s)

    # ------------------------------------------------------------------ plumbing

    def _url(self, route: str) -> str:
        return f"{self.endpoint.base_url.rstrip('/')}/{route}"

    def _where(self) -> str:
        return f"endpoint {self.endpoint.base_url} (model {self.endpoint.model!r})"

    def _auth_help(self, status: int, detail: str) -> str:
        if self.endpoint.api_key_env:
            fix = (
                f"check the key in the environment variable {self.endpoint.api_key_env} "
                "(named by the endpoint's api_key_env)"
            )
        else:
            fix = (
                "the endpoint needs an API key: set api_key_env to the name of the "
                "environment variable that holds it"
            )
        return f"{self._where()} refused the API key (HTTP {status}: {detail}); {fix}"

    async def _not_found_help(self, detail: str) -> str:
        """Name the models the server does serve, when it will say."""
        served = ""
        try:
            response = await self._http.request("GET", self._url("models"))
            page = orjson.loads(response.body)
            names = [model["id"] for model in page["data"] if isinstance(model.get("id"), str)]
            if names:
                served = f"; the server serves: {', '.join(names)}"
        except (TransportError, orjson.JSONDecodeError, LookupError, TypeError, AttributeError):
            pass  # the hint is optional; the 404 itself is the error
        return (
            f"{self._where()} answered 404 ({detail}){served}. Check the endpoint's 'model' "
            "(a LoRA adapter must be loaded first) and that 'base_url' ends in /v1."
        )
