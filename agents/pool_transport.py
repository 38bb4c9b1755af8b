"""The synthesis roles' HTTP: langchain-openai's chat requests on the project's one client.

The roles keep langchain-openai (messages, tool binding, results) and its openai
client, but their bytes go out on ``common/lean_http``'s pool, the endpoint
policy's client: one pool per server and event loop (``PerLoop``).

Two ways onto the pool:

- ``PoolTransport`` is an httpx transport under the SDK's client: whatever the SDK
  sends (streaming, the Responses API, a model without a base URL) goes through it.
- ``PoolTransport.post_json`` posts a chat completion langchain has already built,
  without the SDK's typed methods. ``create`` and ``parse`` walk every request
  through a TypedDict transform that renames nothing in a chat completion, and with
  the world's 31 tool schemas that cost 2.5-3 ms of CPU a call: most of the
  synthesis graph's client time (docs/benchmarks.md, "Synthesis and dedup"). A
  failure raises the error class the SDK raises for it (its documented table of
  status codes), so the reply boundary (``agents/replies.py``) reads both paths alike.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any
from urllib.parse import urlsplit

import httpx
import orjson

from ..common.lean_http import Pool, RequestTimeout, Response, TransportError, open_pool
from .completion_body import shown
from .per_loop import PerLoop
from .replies import mark_answered

# Request headers the pool writes itself, or that would change what it reads back:
# it does not decompress, so no Accept-Encoding is passed on.
_POOL_OWN_HEADERS = frozenset(
    {"host", "content-length", "connection", "accept-encoding", "transfer-encoding", "user-agent"}
)
# Response headers about a body the pool has already de-chunked (and never compressed).
_DECODED_HEADERS = frozenset({"transfer-encoding", "content-encoding", "content-length"})


class PoolTransport(httpx.AsyncBaseTransport):
    """httpx's transport for the roles' chat models, and their direct chat-completion post."""

    def __init__(self, timeout_s: float, max_connections: int):
        self.timeout_s = timeout_s
        self.max_connections = max_connections
        self._pools: PerLoop[dict[str, Pool]] = PerLoop(dict)

    def _pool(self, origin: str) -> Pool:
        pools = self._pools.get()
        if origin not in pools:
            pools[origin] = open_pool(origin, {}, self.timeout_s, self.max_connections)
        return pools[origin]

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        url = request.url
        pool = self._pool(f"{url.scheme}://{url.netloc.decode('ascii')}")
        body = await request.aread()
        headers = {
            name: value
            for name, value in request.headers.items()
            if name.lower() not in _POOL_OWN_HEADERS
        }
        try:
            response = await pool.request(
                request.method, url.raw_path.decode("ascii"), body or None, headers
            )
        except RequestTimeout as err:
            raise httpx.ReadTimeout(str(err), request=request) from None
        except TransportError as err:
            raise httpx.ConnectError(str(err), request=request) from None
        mark_answered()  # from here on, a failure is about what the server sent
        return _httpx_response(response, request)

    async def post_json(self, url: str, body: bytes, headers: Mapping[str, str]) -> Any:
        """POST a JSON ``body`` to ``url``; the reply's JSON. A request that gets no
        response raises ``openai.APITimeoutError`` or ``APIConnectionError``, an error
        status the SDK's ``APIStatusError`` subclass for it, a body that is not JSON
        ``ValueError``."""
        import openai

        parts = urlsplit(url)
        path = parts.path + (f"?{parts.query}" if parts.query else "")
        try:
            response = await self._pool(f"{parts.scheme}://{parts.netloc}").request(
                "POST", path, body, headers
            )
        except RequestTimeout:
            raise openai.APITimeoutError(request=_error_request(url)) from None
        except TransportError as err:
            raise openai.APIConnectionError(message=str(err), request=_error_request(url)) from None
        mark_answered()
        if response.status >= 400:
            raise status_error(response, _error_request(url))
        try:
            return orjson.loads(response.body)
        except orjson.JSONDecodeError:
            raise ValueError(f"the reply's body is not JSON: {shown(response.body)}") from None

    async def aclose(self) -> None:
        for pool in (self._pools.pop() or {}).values():
            await pool.aclose()


def _error_request(url: str) -> Any:
    """The request an SDK error names. The SDK's errors are typed with its own httpx fork
    (httpx2); they read only the request, status and headers, which httpx's classes carry
    alike. Built only on failure: a successful call has no use for one."""
    return httpx.Request("POST", url)


def _httpx_response(response: Response, request: httpx.Request) -> httpx.Response:
    return httpx.Response(
        response.status,
        headers=[
            (name, value)
            for name, value in response.headers.items()
            if name not in _DECODED_HEADERS
        ],
        content=response.body,
        request=request,
    )


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
    read_back: Any = _httpx_response(response, request)  # httpx for httpx2: see _error_request
    return cls(message, response=read_back, body=data)
