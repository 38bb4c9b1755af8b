"""The endpoint policy's HTTP/1.1 client, over real sockets: the response framings a
server may use (Content-Length, chunked, until close), keep-alive, timeouts, and the
httpx pool it falls back to behind a proxy."""

from __future__ import annotations

import asyncio

import pytest

from coevolve.common.lean_http import (
    HttpxPool,
    LeanPool,
    RequestTimeout,
    TransportError,
    open_pool,
)


async def raw_server(answers: list[bytes], hold_s: float = 0.0):
    """A server that answers each request (one per connection read) with the next raw bytes;
    an answer ending in b"<close>" closes the connection after it."""
    connections = []

    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        connections.append(writer)
        while answers:
            head = await reader.readuntil(b"\r\n\r\n")
            length = next(
                (
                    int(line.split(b":")[1])
                    for line in head.split(b"\r\n")
                    if line.lower().startswith(b"content-length")
                ),
                0,
            )
            await reader.readexactly(length)
            await asyncio.sleep(hold_s)
            answer = answers.pop(0)
            close = answer.endswith(b"<close>")
            writer.write(answer.removesuffix(b"<close>"))
            await writer.drain()
            if close:
                writer.close()
                return

    server = await asyncio.start_server(handle, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    return server, f"http://127.0.0.1:{port}/v1", connections


def run(answers: list[bytes], requests: int = 1, timeout_s: float = 5.0, hold_s: float = 0.0):
    async def main():
        server, url, connections = await raw_server(answers, hold_s)
        pool = open_pool(url, {"Content-Type": "application/json"}, timeout_s, 4)
        try:
            return [await pool.request("POST", "/x", b"{}") for _ in range(requests)], connections
        finally:
            await pool.aclose()
            server.close()

    return asyncio.run(main())


def test_content_length_and_keep_alive():
    answer = b"HTTP/1.1 200 OK\r\nContent-Length: 5\r\nX-Thing: a\r\n\r\nhello"
    [first, second], connections = run([answer, answer], requests=2)
    assert (first.status, first.reason, first.body) == (200, "OK", b"hello")
    assert first.headers["x-thing"] == "a" and second.body == b"hello"
    assert len(connections) == 1  # the second request reused the connection


def test_chunked_body_with_trailers():
    answer = (
        b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n"
        b"4\r\nhell\r\n1;ext=1\r\no\r\n0\r\nTrailer: x\r\n\r\n"
    )
    [response], _ = run([answer])
    assert response.body == b"hello"


def test_body_until_close_and_connection_close():
    until_close = b"HTTP/1.0 200 OK\r\n\r\nhello<close>"
    closing = b"HTTP/1.1 503 Busy\r\nConnection: close\r\nContent-Length: 2\r\n\r\nno<close>"
    [first, second], connections = run([until_close, closing], requests=2)
    assert first.body == b"hello" and (second.status, second.body) == (503, b"no")
    assert len(connections) == 2


def test_a_connection_closed_mid_response_is_a_transport_error():
    with pytest.raises(TransportError, match="closed the connection"):
        run([b"HTTP/1.1 200 OK\r\nContent-Length: 10\r\n\r\nhel<close>"])


def test_garbage_is_a_transport_error():
    with pytest.raises(TransportError, match="not an HTTP response"):
        run([b"SSH-2.0-OpenSSH\r\n\r\n"])


def test_no_answer_in_time_is_a_timeout():
    with pytest.raises(RequestTimeout, match=r"0\.2 s"):
        run([b"HTTP/1.1 200 OK\r\nContent-Length: 0\r\n\r\n"], timeout_s=0.2, hold_s=1.0)


def test_refused_connection_is_a_transport_error():
    async def main():
        pool = open_pool("http://127.0.0.1:9/v1", {}, 2.0, 1)
        try:
            await pool.request("GET", "/models")
        finally:
            await pool.aclose()

    with pytest.raises(TransportError, match="ConnectionRefusedError"):
        asyncio.run(main())


def test_a_proxy_sends_requests_through_httpx(monkeypatch):
    for name in ("http_proxy", "HTTP_PROXY", "all_proxy", "ALL_PROXY", "no_proxy", "NO_PROXY"):
        monkeypatch.delenv(name, raising=False)
    assert isinstance(open_pool("http://example.org/v1", {}, 1.0, 1), LeanPool)
    monkeypatch.setenv("http_proxy", "http://proxy.invalid:3128")
    assert isinstance(open_pool("http://example.org/v1", {}, 1.0, 1), HttpxPool)
    monkeypatch.setenv("no_proxy", "example.org")
    assert isinstance(open_pool("http://example.org/v1", {}, 1.0, 1), LeanPool)


def test_the_httpx_pool_answers_alike(scripted_server):
    server = scripted_server()

    async def main():
        pool = HttpxPool(server.base_url, {}, 5.0, 2)
        try:
            return await pool.request("GET", "/models")
        finally:
            await pool.aclose()

    response = asyncio.run(main())
    assert response.status == 200 and b"scripted-model" in response.body
    assert response.headers["content-type"] == "application/json"
