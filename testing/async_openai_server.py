"""The scripted server's asyncio transport, for throughput benchmarks: the same app
(``ScriptedOpenAIServer``: its script, ``next_reply`` and ``completion``) as the
threaded transport, on one event loop, with aiohttp's low-level server
(``aiohttp.web.Server``) reading and writing HTTP.

``ScriptedOpenAIServer`` answers each connection in a thread of its own: right for
tests (a reply can block, drop the connection, fail), but at 64 requests in flight
on two cores its threads take turns on the GIL, and the slowest reply of each wave
sets the pace of a lockstep rollout. vLLM's server is one event loop; so is this
one. It answers ``GET /v1/models`` and ``POST /v1/chat/completions`` with the same
script and the same completion bodies as the threaded server (and the app's
``api_key``: 401 without its bearer key), and nothing else: scripted error replies,
dropped connections, model checks and recorded requests are the threaded server's
business. A script that cannot give a reply (a list run out, a callable that
raised) gets a 500, as on the threaded server. ``python -m
coevolve.testing.async_openai_server`` runs it, with the threaded server's
command-line options.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Coroutine, Sequence
from typing import Any

from aiohttp import web

from .openai_bodies import BODY_DECODE_ERRORS, dumps_body, loads_body
from .openai_server import CHAT_PATH, ScriptedOpenAIServer, _ScriptProblem
from .server_cli import server_from_args

_Route = Callable[[ScriptedOpenAIServer, bytes], Coroutine[Any, Any, web.Response]]


async def serve(
    app: ScriptedOpenAIServer, host: str, port: int, started: Callable[[], None] | None = None
) -> None:
    """Answer ``app``'s script on ``host:port`` until cancelled; ``started`` is called
    once the port is listening."""

    # aiohttp's low-level server: it reads and writes HTTP/1.1 (keep-alive, chunked
    # bodies, TCP_NODELAY) and hands every request to one handler; the routes are
    # this module's, as few as the bench needs (an Application's router and
    # middlewares would cost CPU per request for nothing). No access log: a line
    # per request is CPU too. Cancelling waits at most a second for requests in flight.
    async def handle(request: web.BaseRequest) -> web.Response:
        return await _handle(app, request)

    runner = web.ServerRunner(web.Server(handle, access_log=None), shutdown_timeout=1.0)
    await runner.setup()
    try:
        await web.TCPSite(runner, host, port, backlog=1024).start()
        if started is not None:
            started()
        await asyncio.Event().wait()  # until cancelled
    finally:
        await runner.cleanup()


async def _handle(app: ScriptedOpenAIServer, request: web.BaseRequest) -> web.Response:
    if app.api_key is not None:
        if request.headers.get("Authorization") != f"Bearer {app.api_key}":
            return _error(401, "Incorrect API key provided.", "invalid_api_key")
    path = request.path.rstrip("/")
    route = _ROUTES.get((request.method, path))
    if route is None:
        return _error(404, f"no route {request.method} {path}")
    # The whole body, however long (no 1 MiB cap as on aiohttp's Application).
    return await route(app, await request.content.read())


async def _models(app: ScriptedOpenAIServer, raw: bytes) -> web.Response:
    data = [{"id": name, "object": "model", "owned_by": "coevolve"} for name in app.models]
    return _json(200, {"object": "list", "data": data})


async def _chat(app: ScriptedOpenAIServer, raw: bytes) -> web.Response:
    try:
        body = loads_body(raw)
    except BODY_DECODE_ERRORS:
        return _error(400, "the request body is not JSON")
    if not isinstance(body, dict) or not isinstance(body.get("messages"), list):
        return _error(400, "'messages' must be a list of messages")
    try:
        reply = app.next_reply(body)
    except _ScriptProblem as problem:
        return _error(500, f"scripted server: {problem}", "server_error")
    await asyncio.sleep(app.delay_s + reply.delay_s)
    return _json(200, app.completion(body, reply))


_ROUTES: dict[tuple[str, str], _Route] = {
    ("GET", "/v1/models"): _models,
    ("POST", CHAT_PATH): _chat,
}


def _json(status: int, payload: dict[str, Any]) -> web.Response:
    return web.Response(status=status, body=dumps_body(payload), content_type="application/json")


def _error(status: int, message: str, kind: str = "invalid_request_error") -> web.Response:
    return _json(status, {"error": {"message": message, "type": kind, "param": None}})


def main(argv: Sequence[str] | None = None) -> None:
    server, args = server_from_args(argv, prog="python -m coevolve.testing.async_openai_server")

    def started() -> None:
        print(
            f"serving {', '.join(server.models)} at http://{args.host}:{args.port}/v1", flush=True
        )

    try:
        asyncio.run(serve(server, args.host, args.port, started))
    except KeyboardInterrupt:
        pass


if __name__ == "__main__":
    main()
