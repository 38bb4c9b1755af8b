"""The project's HTTP client: aiohttp, one ``ClientSession`` per event loop.

The endpoint policy, the synthesis roles' chat models (``agents/roles/chat_endpoint.py``)
and the embeddings (``BlockingClient``, ``memory/embeddings.py``) send on it.
Why aiohttp: at rollout fan-out (64 requests in flight) the client's CPU per
request counts, and aiohttp spends about 0.1-0.2 ms a request where httpx spends
0.8-9 ms and the openai SDK 4-6 ms (``bench/http_clients.py``,
docs/benchmarks/rollout.md, "Which HTTP client").

This module frames nothing itself: it holds sessions and turns aiohttp's errors
into two of its own (``TransportError``, ``RequestTimeout``). A session, its
connections and its connector belong to the event loop that made them, and a
caller may run ``asyncio.run`` once per batch, so ``HttpClient`` keeps one session
per running loop. Each session is closed with its loop: an asynchronous generator
of the loop holds it, and ``asyncio.run`` closes every such generator before it
closes the loop (``loop.shutdown_asyncgens``), as the loop does when the generator
is dropped while the loop runs. So no session is left for the garbage collector to
complain about ("Unclosed client session"). Proxies named by the environment
(``http_proxy``, ``https_proxy``, ``no_proxy``) are honoured (aiohttp's
``trust_env``, turned on when such a variable is set).
"""

from __future__ import annotations

import asyncio
import atexit
import os
import threading
import urllib.request
import weakref
from collections.abc import AsyncGenerator, Mapping
from dataclasses import dataclass
from typing import Any

import aiohttp
import orjson


class TransportError(Exception):
    """The request got no complete HTTP response (refused, reset, dropped, garbled)."""


class RequestTimeout(TransportError):
    """No complete response within the timeout."""


@dataclass(slots=True)
class Response:
    status: int
    reason: str
    headers: Mapping[str, str]  # case-insensitive: headers.get("retry-after")
    body: bytes


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


async def _closed_with_loop(session: aiohttp.ClientSession) -> AsyncGenerator[None, None]:
    """Holds ``session`` open until the generator is closed: by ``asyncio.run`` before it
    closes the loop, or by the loop when the generator is dropped while it runs."""
    try:
        yield
    finally:
        await session.close()


class HttpClient:
    """Requests from any event loop, on one aiohttp session per loop: at most
    ``max_connections`` connections (a request beyond waits for a free one), each
    request answered within ``timeout_s`` (connecting and waiting for a connection
    included), ``headers`` sent with every request."""

    def __init__(
        self,
        *,
        timeout_s: float,
        max_connections: int,
        headers: Mapping[str, str] | None = None,
    ):
        self.timeout_s = timeout_s
        self.max_connections = max(1, max_connections)
        self._headers = dict(headers or {})
        self._sessions: dict[asyncio.AbstractEventLoop, aiohttp.ClientSession] = {}
        self._closers: dict[asyncio.AbstractEventLoop, AsyncGenerator[None, None]] = {}
        self._lock = threading.Lock()  # loops of several threads may share a client
        # Dropped while loops still run (a long-lived loop): they close its sessions. The
        # finalizer holds the sessions, so the garbage collector never finds one open.
        weakref.finalize(self, _close_sessions, self._closers).atexit = False

    async def request(
        self,
        method: str,
        url: str,
        body: bytes | None = None,
        headers: Mapping[str, str] | None = None,
    ) -> Response:
        """One request to ``url``; its whole response. ``headers`` are sent besides the
        client's. Raises ``RequestTimeout`` or ``TransportError`` when no complete
        response came; an error status is a response like any other."""
        session = self._sessions.get(asyncio.get_running_loop())
        if session is None or session.closed:
            session = await self._open()
        try:
            async with session.request(method, url, data=body, headers=headers) as response:
                data = await response.read()
        except asyncio.TimeoutError:
            raise RequestTimeout(f"no response within {self.timeout_s:g} s") from None
        except aiohttp.ClientError as err:
            raise TransportError(f"{type(err).__name__}: {err}") from None
        return Response(response.status, response.reason or "", response.headers, data)

    async def _open(self) -> aiohttp.ClientSession:
        """The running loop's session, made now; sessions of closed loops are forgotten
        (their loops closed them)."""
        loop = asyncio.get_running_loop()
        session = aiohttp.ClientSession(
            connector=aiohttp.TCPConnector(limit=self.max_connections),
            headers=self._headers,
            timeout=aiohttp.ClientTimeout(total=self.timeout_s),
            # Proxy variables are read per request when trusted (0.2 ms of CPU a request,
            # twice what the rest of a request costs): only when some are set.
            trust_env=bool(urllib.request.getproxies()),
        )
        closer = _closed_with_loop(session)
        await closer.__anext__()  # now the loop knows the generator, and will close it
        with self._lock:
            for gone in [other for other in self._sessions if other.is_closed()]:
                del self._sessions[gone], self._closers[gone]
            self._sessions[loop] = session
            self._closers[loop] = closer
        return session

    async def aclose(self) -> None:
        """Close the running loop's session (other loops close theirs when they end)."""
        loop = asyncio.get_running_loop()
        with self._lock:
            self._sessions.pop(loop, None)
            closer = self._closers.pop(loop, None)
        if closer is not None:
            await closer.aclose()


def _close_sessions(closers: dict[asyncio.AbstractEventLoop, AsyncGenerator[None, None]]) -> None:
    for loop, closer in list(closers.items()):
        if not loop.is_closed():
            try:
                asyncio.run_coroutine_threadsafe(_aclose(closer), loop)
            except RuntimeError:  # closed meanwhile
                pass


async def _aclose(closer: AsyncGenerator[None, None]) -> None:
    await closer.aclose()


class BlockingClient:
    """An ``HttpClient`` for callers without an event loop (Chroma calls embedding
    functions synchronously, maybe from inside a running loop): one daemon thread runs a
    loop that owns the client, and ``request`` blocks on it. Safe to call from several
    threads; a forked child makes its own thread on first use. The session is closed and
    the thread ends when the ``BlockingClient`` is dropped, or the process exits."""

    def __init__(
        self,
        *,
        timeout_s: float,
        max_connections: int,
        headers: Mapping[str, str] | None = None,
    ):
        self._options: dict[str, Any] = {
            "timeout_s": timeout_s,
            "max_connections": max_connections,
            "headers": headers,
        }
        self._lock = threading.Lock()
        self._owner: tuple[int, asyncio.AbstractEventLoop, HttpClient] | None = None
        self._finalizer: weakref.finalize | None = None

    def _loop_and_client(self) -> tuple[asyncio.AbstractEventLoop, HttpClient]:
        with self._lock:
            if self._owner is None or self._owner[0] != os.getpid():
                if self._finalizer is not None:  # a parent's thread, not in this process
                    self._finalizer.detach()
                loop = asyncio.new_event_loop()
                threading.Thread(
                    target=_serve, args=(loop,), name="coevolve-http", daemon=True
                ).start()
                client = HttpClient(**self._options)
                self._owner = (os.getpid(), loop, client)
                self._finalizer = weakref.finalize(self, _stop, loop, client, False)
                self._finalizer.atexit = False  # at exit, _close_blocking_clients waits for it
                _LIVE.add(self)
            return self._owner[1], self._owner[2]

    def request(
        self,
        method: str,
        url: str,
        body: bytes | None = None,
        headers: Mapping[str, str] | None = None,
    ) -> Response:
        loop, client = self._loop_and_client()
        done = asyncio.run_coroutine_threadsafe(client.request(method, url, body, headers), loop)
        return done.result()

    def close(self) -> None:
        """Close the session and end the thread (a later request starts them again)."""
        with self._lock:
            owner, self._owner = self._owner, None
            if self._finalizer is not None:
                self._finalizer.detach()
        if owner is not None and owner[0] == os.getpid():
            _stop(owner[1], owner[2], True)


def _serve(loop: asyncio.AbstractEventLoop) -> None:
    asyncio.set_event_loop(loop)
    try:
        loop.run_forever()
    finally:
        loop.close()


def _stop(loop: asyncio.AbstractEventLoop, client: HttpClient, wait: bool) -> None:
    """Close ``client``'s session on ``loop``, then stop the loop (its thread ends)."""
    try:
        done = asyncio.run_coroutine_threadsafe(client.aclose(), loop)
        done.add_done_callback(lambda _: loop.call_soon_threadsafe(loop.stop))
    except RuntimeError:  # the loop is closed already
        return
    if wait:
        try:
            done.result(timeout=5)
        except Exception:  # closing is best effort
            pass


_LIVE: weakref.WeakSet[BlockingClient] = weakref.WeakSet()


@atexit.register
def _close_blocking_clients() -> None:
    for client in list(_LIVE):
        client.close()
