"""A small HTTP/1.1 client on asyncio: the project's one HTTP client.

The endpoint policy sends on it; so do the synthesis roles (their chat completions
posted directly, anything else through an httpx transport under langchain-openai:
``agents/pool_transport.py``) and the embeddings (``SyncPool``,
``memory/embeddings.py``). Why this and not aiohttp: docs/benchmarks.md, "Which
HTTP client".

At rollout fan-out (64 requests in flight, thousands per step) the client's CPU per
request sets the pace, not the server: the openai SDK spends 1-2 ms per request and
httpx alone about 1 ms (its pool, anyio and h11 layers). This client does one
thing: keep-alive connections to one server, a request written in one ``write``,
a response read by a ``Protocol`` (Content-Length, chunked, or until close), one
timer per request. About 0.1 ms per request.

It does not do proxies, redirects, cookies, compression (no ``Accept-Encoding`` is
sent) or HTTP/2. ``open_pool`` returns it for an ``http``/``https`` URL no proxy
variable applies to, and an httpx-based pool with the same interface otherwise.
"""

from __future__ import annotations

import asyncio
import importlib
import os
import ssl
import threading
import urllib.request
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Protocol
from urllib.parse import urlsplit

import orjson

# Most bytes of one response kept in memory: far above any chat completion (token
# ids and log-probs of a long reply are a few MB); a server that sends more is broken.
MAX_RESPONSE_BYTES = 64 * 1024 * 1024
_MAX_HEAD_BYTES = 64 * 1024


class TransportError(Exception):
    """The request did not get a complete HTTP response (refused, reset, garbled)."""


class RequestTimeout(TransportError):
    """No complete response within the timeout."""


@dataclass(slots=True)
class Response:
    status: int
    reason: str
    headers: dict[str, str]  # names lower-cased
    body: bytes


class Pool(Protocol):
    """Connections to one server: ``request`` sends one request and reads its response."""

    async def request(
        self,
        method: str,
        path: str,
        body: bytes | None = None,
        headers: Mapping[str, str] | None = None,
    ) -> Response: ...

    async def aclose(self) -> None: ...


def error_detail(data: bytes, reason: str) -> str:
    """The server's own words: the message of an OpenAI-style ``{"error": {...}}`` body,
    else the body's text, else the HTTP reason phrase."""
    try:
        body: Any = orjson.loads(data)
    except orjson.JSONDecodeError:
        text = data[:200].decode("utf-8", "replace").strip()
        return text or reason
    if isinstance(body, dict) and isinstance(body.get("error"), dict):
        body = body["error"]
    if isinstance(body, dict):
        # vLLM answers some errors as {"message": ...} or FastAPI's {"detail": ...}.
        for key in ("message", "detail"):
            if isinstance(body.get(key), str) and body[key]:
                return str(body[key])
    return reason or data[:200].decode("utf-8", "replace")


def retry_after_s(value: str | None) -> float | None:
    """Retry-After in seconds (the HTTP-date form is rare enough to ignore)."""
    try:
        return max(0.0, float(value)) if value else None
    except ValueError:
        return None


def open_pool(
    base_url: str, headers: dict[str, str], timeout_s: float, max_connections: int
) -> Pool:
    """A pool for ``base_url`` (paths of requests are appended to its path)."""
    parts = urlsplit(base_url)
    host = parts.hostname or ""
    if parts.scheme in ("http", "https") and not _proxied(parts.scheme, host):
        return LeanPool(base_url, headers, timeout_s, max_connections)
    return HttpxPool(base_url, headers, timeout_s, max_connections)


def _proxied(scheme: str, host: str) -> bool:
    proxies = urllib.request.getproxies()
    if not (proxies.get(scheme) or proxies.get("all")):
        return False
    return not urllib.request.proxy_bypass(host)


class SyncPool:
    """A pool for callers without an event loop (Chroma calls embedding functions
    synchronously): one daemon thread runs a loop that owns an ``open_pool`` pool, and
    ``request`` blocks on it. Safe to call from several threads; a forked child makes
    its own thread and pool on first use. One thread per ``SyncPool``, for the life of
    the process (it holds no more than idle connections)."""

    def __init__(
        self, base_url: str, headers: dict[str, str], timeout_s: float, max_connections: int
    ):
        self._options = (base_url, headers, timeout_s, max_connections)
        self._lock = threading.Lock()
        self._owner: tuple[int, asyncio.AbstractEventLoop, Pool] | None = None

    def _loop_and_pool(self) -> tuple[asyncio.AbstractEventLoop, Pool]:
        with self._lock:
            if self._owner is None or self._owner[0] != os.getpid():
                loop = asyncio.new_event_loop()
                threading.Thread(target=loop.run_forever, name="coevolve-http", daemon=True).start()
                self._owner = (os.getpid(), loop, open_pool(*self._options))
            return self._owner[1], self._owner[2]

    def request(
        self,
        method: str,
        path: str,
        body: bytes | None = None,
        headers: Mapping[str, str] | None = None,
    ) -> Response:
        loop, pool = self._loop_and_pool()
        future = asyncio.run_coroutine_threadsafe(pool.request(method, path, body, headers), loop)
        return future.result()


# --------------------------------------------------------------------------- lean pool

_ssl_context: ssl.SSLContext | None = None


def _default_ssl_context() -> ssl.SSLContext:
    """One context for every pool: loading the CA store costs ~20 ms."""
    global _ssl_context
    if _ssl_context is None:
        _ssl_context = ssl.create_default_context()
    return _ssl_context


class LeanPool:
    """Keep-alive HTTP/1.1 connections to one server; at most ``max_connections`` open
    (a request beyond waits for a free one)."""

    def __init__(
        self, base_url: str, headers: dict[str, str], timeout_s: float, max_connections: int
    ):
        parts = urlsplit(base_url)
        self.host = parts.hostname or ""
        self.port = parts.port or (443 if parts.scheme == "https" else 80)
        self.tls = parts.scheme == "https"
        self.base_path = parts.path.rstrip("/")
        self.timeout_s = timeout_s
        authority = parts.netloc.rsplit("@", 1)[-1]
        lines = [f"Host: {authority}", "User-Agent: coevolve"]
        lines += [f"{name}: {value}" for name, value in headers.items()]
        self._head_tail = ("\r\n".join(lines) + "\r\n").encode("latin-1")
        self._idle: list[_Connection] = []
        self._slots = asyncio.Semaphore(max_connections)
        self._open: set[_Connection] = set()

    async def request(
        self,
        method: str,
        path: str,
        body: bytes | None = None,
        headers: Mapping[str, str] | None = None,
    ) -> Response:
        """One request; ``headers`` are sent besides the pool's own (Host, User-Agent and
        those it was opened with)."""
        head = f"{method} {self.base_path}{path} HTTP/1.1\r\n".encode("latin-1") + self._head_tail
        if headers:
            head += "".join(f"{name}: {value}\r\n" for name, value in headers.items()).encode(
                "latin-1"
            )
        if body is not None:
            head += b"Content-Length: %d\r\n" % len(body)
        head += b"\r\n"
        loop = asyncio.get_running_loop()
        deadline = loop.time() + self.timeout_s
        async with self._slots:
            connection = await self._connection(loop, deadline)
            waiter: asyncio.Future[Response] = loop.create_future()
            connection.start(waiter, head_only=method == "HEAD")
            connection.transport.write(head + body if body is not None else head)
            timer = loop.call_at(deadline, _expire, waiter, self.timeout_s)
            try:
                response = await waiter
            except BaseException:
                # A response may still be on its way: the connection cannot be reused.
                connection.abort()
                self._open.discard(connection)
                raise
            finally:
                timer.cancel()
            if connection.reusable:
                self._idle.append(connection)
            else:
                connection.abort()
                self._open.discard(connection)
            return response

    async def _connection(self, loop: asyncio.AbstractEventLoop, deadline: float) -> _Connection:
        while self._idle:
            connection = self._idle.pop()
            if connection.usable:
                return connection
            self._open.discard(connection)
        try:
            _, connection = await asyncio.wait_for(
                loop.create_connection(
                    _Connection,
                    self.host,
                    self.port,
                    ssl=_default_ssl_context() if self.tls else None,
                    server_hostname=self.host if self.tls else None,
                ),
                max(0.0, deadline - loop.time()),
            )
        except asyncio.TimeoutError:
            raise RequestTimeout("connecting timed out") from None
        except OSError as err:
            raise TransportError(f"{type(err).__name__}: {err}") from None
        self._open.add(connection)
        return connection

    async def aclose(self) -> None:
        for connection in list(self._open):
            connection.abort()
        self._open.clear()
        self._idle.clear()


def _expire(waiter: asyncio.Future[Response], timeout_s: float) -> None:
    if not waiter.done():
        waiter.set_exception(RequestTimeout(f"no response within {timeout_s:g} s"))


class _Connection(asyncio.Protocol):
    """One connection; reads the response to the request in flight into ``waiter``."""

    def __init__(self) -> None:
        self.transport: Any = None
        self.waiter: asyncio.Future[Response] | None = None
        self.lost = False
        self.reusable = False
        self._buffer = bytearray()
        self._head: tuple[int, str, dict[str, str], bool] | None = None
        self._length: int | None = None  # Content-Length; None: chunked or until close
        self._chunked = False
        self._chunks = bytearray()
        self._head_only = False

    # ------------------------------------------------------------------ asyncio callbacks

    def connection_made(self, transport: Any) -> None:
        self.transport = transport

    def data_received(self, data: bytes) -> None:
        if self.waiter is None or self.waiter.done():
            # Bytes nobody asked for: the connection's state is unknown from here on.
            self.abort()
            return
        self._buffer += data
        try:
            self._parse()
        except TransportError as err:
            self._fail(err)

    def connection_lost(self, exc: Exception | None) -> None:
        self.lost = True
        waiter = self.waiter
        if waiter is None or waiter.done():
            return
        if self._head is not None and self._length is None and not self._chunked:
            self._finish(bytes(self._buffer), keep_alive=False)  # the body ran until close
            return
        why = f"{type(exc).__name__}: {exc}" if exc else "the server closed the connection"
        self._fail(TransportError(why))

    # ------------------------------------------------------------------ state

    @property
    def usable(self) -> bool:
        return not self.lost and not self.transport.is_closing()

    def start(self, waiter: asyncio.Future[Response], head_only: bool = False) -> None:
        self.waiter = waiter
        self.reusable = False
        self._buffer.clear()
        self._chunks.clear()
        self._head = None
        self._length = None
        self._chunked = False
        self._head_only = head_only

    def abort(self) -> None:
        self.lost = True
        if self.transport is not None:
            self.transport.abort()

    def _fail(self, err: TransportError) -> None:
        if self.waiter is not None and not self.waiter.done():
            self.waiter.set_exception(err)
        self.abort()

    def _finish(self, body: bytes, keep_alive: bool) -> None:
        assert self._head is not None and self.waiter is not None
        status, reason, headers, head_keep_alive = self._head
        self.reusable = keep_alive and head_keep_alive and not self._buffer
        if not self.waiter.done():
            self.waiter.set_result(Response(status, reason, headers, body))

    # ------------------------------------------------------------------ parsing

    def _parse(self) -> None:
        buffer = self._buffer
        if self._head is None:
            end = buffer.find(b"\r\n\r\n")
            if end < 0:
                if len(buffer) > _MAX_HEAD_BYTES:
                    raise TransportError("response head too long")
                return
            head = bytes(buffer[:end]).decode("latin-1")
            del buffer[: end + 4]
            status_line, *lines = head.split("\r\n")
            version, _, rest = status_line.partition(" ")
            code, _, reason = rest.partition(" ")
            if not version.startswith("HTTP/") or not code.isdigit():
                raise TransportError(f"not an HTTP response: {status_line[:80]!r}")
            status = int(code)
            headers: dict[str, str] = {}
            for line in lines:
                name, sep, value = line.partition(":")
                if sep:
                    headers[name.strip().lower()] = value.strip()
            if 100 <= status < 200:  # 100 Continue and friends: the real answer follows
                self._parse()
                return
            connection = headers.get("connection", "").lower()
            keep_alive = "close" not in connection and (
                version == "HTTP/1.1" or "keep-alive" in connection
            )
            self._head = (status, reason, headers, keep_alive)
            if self._head_only or status in (204, 304):
                self._length = 0
            elif "chunked" in headers.get("transfer-encoding", "").lower():
                self._chunked = True
            elif "content-length" in headers:
                try:
                    self._length = int(headers["content-length"])
                except ValueError:
                    raise TransportError("bad Content-Length") from None
                if not 0 <= self._length <= MAX_RESPONSE_BYTES:
                    raise TransportError(f"response of {self._length} bytes refused")
        if self._chunked:
            self._parse_chunks()
        elif self._length is not None:
            if len(buffer) >= self._length:
                body = bytes(buffer[: self._length])
                del buffer[: self._length]
                self._finish(body, keep_alive=True)
        elif len(buffer) > MAX_RESPONSE_BYTES:
            raise TransportError("response too long")

    def _parse_chunks(self) -> None:
        buffer = self._buffer
        while True:
            end = buffer.find(b"\r\n")
            if end < 0:
                return
            size_text = bytes(buffer[:end]).split(b";", 1)[0].strip()
            try:
                size = int(size_text, 16)
            except ValueError:
                raise TransportError("bad chunk size") from None
            if size == 0:
                # The last chunk, then optional trailers, then an empty line.
                trailer_end = buffer.find(b"\r\n\r\n", end)
                if trailer_end < 0:
                    return  # the closing empty line has not arrived yet
                del buffer[: trailer_end + 4]
                self._finish(bytes(self._chunks), keep_alive=True)
                return
            if len(buffer) < end + 2 + size + 2:
                return
            self._chunks += buffer[end + 2 : end + 2 + size]
            if len(self._chunks) > MAX_RESPONSE_BYTES:
                raise TransportError("response too long")
            del buffer[: end + 2 + size + 2]


# --------------------------------------------------------------------------- httpx pool


class HttpxPool:
    """The same interface over httpx, for what the lean pool leaves out (a proxy)."""

    def __init__(
        self, base_url: str, headers: dict[str, str], timeout_s: float, max_connections: int
    ):
        httpx = self._httpx = _httpx_module()
        self.base_url = base_url.rstrip("/")
        self.timeout_s = timeout_s
        limits = httpx.Limits(
            max_connections=max_connections, max_keepalive_connections=max_connections
        )
        self._client = httpx.AsyncClient(headers=headers, timeout=timeout_s, limits=limits)

    async def request(
        self,
        method: str,
        path: str,
        body: bytes | None = None,
        headers: Mapping[str, str] | None = None,
    ) -> Response:
        httpx = self._httpx
        try:
            response = await self._client.request(
                method, self.base_url + path, content=body, headers=dict(headers or {})
            )
        except httpx.TimeoutException:
            raise RequestTimeout(f"no response within {self.timeout_s:g} s") from None
        except httpx.TransportError as err:
            raise TransportError(f"{type(err).__name__}: {err}") from None
        headers = {name.lower(): value for name, value in response.headers.items()}
        return Response(response.status_code, response.reason_phrase, headers, response.content)

    async def aclose(self) -> None:
        await self._client.aclose()


def _httpx_module() -> Any:
    """httpx2 (what openai 3 is built on), else httpx (openai 1 and 2)."""
    try:
        return importlib.import_module("httpx2")
    except ImportError:
        return importlib.import_module("httpx")
