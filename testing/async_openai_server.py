"""The scripted server's asyncio transport, for throughput benchmarks: the same app
(``ScriptedOpenAIServer``: its script, ``next_reply`` and ``completion``) as the
threaded transport, on one event loop.

``ScriptedOpenAIServer`` answers each connection in a thread of its own: right for
tests (a reply can block, drop the connection, fail), but at 64 requests in flight
on two cores its threads take turns on the GIL, and the slowest reply of each wave
sets the pace of a lockstep rollout. vLLM's server is one event loop; so is this
one. It answers ``GET /v1/models`` and ``POST /v1/chat/completions`` with the same
script and the same completion bodies as the threaded server, and nothing else:
error replies, dropped connections and recorded requests are the threaded
server's business. ``python -m coevolve.testing.async_openai_server`` runs it, with
the threaded server's command-line options.
"""

from __future__ import annotations

import asyncio
import socket
from collections.abc import Sequence
from typing import Any

from .openai_bodies import BODY_DECODE_ERRORS, dumps_body, loads_body
from .openai_server import CHAT_PATH, ScriptedOpenAIServer
from .server_cli import server_from_args

_REASONS = {200: b"OK", 400: b"Bad Request", 404: b"Not Found", 500: b"Internal Server Error"}


async def serve(app: ScriptedOpenAIServer, host: str, port: int) -> None:
    """Answer ``app``'s script on ``host:port`` until cancelled."""
    server = await asyncio.start_server(
        lambda reader, writer: _connection(app, reader, writer), host, port, backlog=1024
    )
    async with server:
        await server.serve_forever()


async def _connection(
    app: ScriptedOpenAIServer, reader: asyncio.StreamReader, writer: asyncio.StreamWriter
) -> None:
    sock = writer.get_extra_info("socket")
    if sock is not None:  # head and body leave in one write; no need to wait for an ACK
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    try:
        while True:  # keep-alive: one request after another on this connection
            head = await reader.readuntil(b"\r\n\r\n")
            request_line, *header_lines = head.decode("latin-1").split("\r\n")
            method, target, _ = request_line.split(" ", 2)
            length = 0
            for line in header_lines:
                name, _, value = line.partition(":")
                if name.strip().lower() == "content-length":
                    length = int(value)
            body = await reader.readexactly(length) if length else b""
            status, payload = await _answer(app, method, target.split("?", 1)[0].rstrip("/"), body)
            data = dumps_body(payload)
            writer.write(
                b"HTTP/1.1 %d %s\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n"
                % (status, _REASONS[status], len(data))
                + data
            )
            await writer.drain()
    except (asyncio.IncompleteReadError, asyncio.LimitOverrunError, ConnectionError, ValueError):
        pass  # the client closed the connection, or sent something this server does not read
    finally:
        writer.close()


async def _answer(
    app: ScriptedOpenAIServer, method: str, path: str, raw: bytes
) -> tuple[int, dict[str, Any]]:
    if method == "GET" and path == "/v1/models":
        return 200, {
            "object": "list",
            "data": [
                {"id": name, "object": "model", "owned_by": "coevolve"} for name in app.models
            ],
        }
    if method != "POST" or path != CHAT_PATH:
        return 404, _error(f"no route {method} {path}")
    try:
        body = loads_body(raw)
    except BODY_DECODE_ERRORS:
        return 400, _error("the request body is not JSON")
    if not isinstance(body, dict) or not isinstance(body.get("messages"), list):
        return 400, _error("'messages' must be a list of messages")
    reply = app.next_reply(body)
    await asyncio.sleep(app.delay_s + reply.delay_s)
    return 200, app.completion(body, reply)


def _error(message: str) -> dict[str, Any]:
    return {"error": {"message": message, "type": "invalid_request_error", "param": None}}


def main(argv: Sequence[str] | None = None) -> None:
    server, args = server_from_args(argv, prog="python -m coevolve.testing.async_openai_server")
    print(f"serving {', '.join(server.models)} at http://{args.host}:{args.port}/v1", flush=True)
    try:
        asyncio.run(serve(server, args.host, args.port))
    except KeyboardInterrupt:
        pass


if __name__ == "__main__":
    main()
