"""The project's HTTP client (common/http.py: aiohttp, one session per event loop), over
real sockets: connections kept alive and bounded, timeouts, a dropped or refused
connection as a clear error, Retry-After read and honoured, sessions closed with their
event loop, and the blocking client the embeddings use."""

from __future__ import annotations

import asyncio
import gc
import json
import logging
import socket
import threading
import time
import warnings
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from coevolve.common.http import BlockingClient, HttpClient, RequestTimeout, TransportError

OK = b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: 2\r\n\r\n{}"


class RawServer:
    """A server on the running loop that answers every request with ``answer`` after
    ``hold_s``, counting connections and requests in flight. An answer ending in
    b"<close>" closes the connection after it."""

    def __init__(self, answer: bytes = OK, hold_s: float = 0.0):
        self.answer, self.hold_s = answer, hold_s
        self.connections = self.in_flight = self.max_in_flight = self.requests = 0

    async def start(self) -> str:
        self.server = await asyncio.start_server(self._handle, "127.0.0.1", 0)
        return f"http://127.0.0.1:{self.server.sockets[0].getsockname()[1]}/v1"

    async def _handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.connections += 1
        try:
            while True:
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
                self.requests += 1
                self.in_flight += 1
                self.max_in_flight = max(self.max_in_flight, self.in_flight)
                await asyncio.sleep(self.hold_s)
                self.in_flight -= 1
                writer.write(self.answer.removesuffix(b"<close>"))
                await writer.drain()
                if self.answer.endswith(b"<close>"):
                    break
        except (asyncio.IncompleteReadError, ConnectionError):
            pass
        finally:
            writer.close()

    def close(self) -> None:
        self.server.close()


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def test_connections_are_kept_alive_and_bounded():
    async def main():
        server = RawServer(hold_s=0.05)
        url = await server.start()
        client = HttpClient(timeout_s=5.0, max_connections=2)
        try:
            burst = await asyncio.gather(*(client.request("POST", url, b"{}") for _ in range(6)))
            for _ in range(3):  # one after another: the kept-alive connections again
                await client.request("GET", url)
        finally:
            await client.aclose()
            server.close()
        return server, burst

    server, burst = asyncio.run(main())
    assert [r.status for r in burst] == [200] * 6 and burst[0].body == b"{}"
    assert burst[0].headers["content-type"] == "application/json"
    assert server.max_in_flight == 2  # six at once, two at a time
    assert server.connections == 2 and server.requests == 9


def test_no_response_in_time_is_a_timeout():
    async def main():
        server = RawServer(hold_s=2.0)
        url = await server.start()
        client = HttpClient(timeout_s=0.2, max_connections=1)
        started = time.perf_counter()
        try:
            with pytest.raises(RequestTimeout, match=r"no response within 0\.2 s"):
                await client.request("POST", url, b"{}")
        finally:
            await client.aclose()
            server.close()
        return time.perf_counter() - started

    assert asyncio.run(main()) < 1.5


def test_a_dropped_or_refused_connection_is_a_transport_error():
    cut = b"HTTP/1.1 200 OK\r\nContent-Length: 10\r\n\r\nhel<close>"

    async def main():
        server = RawServer(answer=cut)
        url = await server.start()
        client = HttpClient(timeout_s=5.0, max_connections=1)
        try:
            with pytest.raises(TransportError):
                await client.request("POST", url, b"{}")
            # Nothing listens there: the error says it could not connect, and where.
            port = free_port()
            with pytest.raises(
                TransportError, match=rf"Cannot connect to host 127\.0\.0\.1:{port}"
            ):
                await client.request("GET", f"http://127.0.0.1:{port}/v1/models")
        finally:
            await client.aclose()
            server.close()

    asyncio.run(main())


def test_a_proxy_named_by_the_environment_is_used(monkeypatch):
    for name in ("http_proxy", "HTTP_PROXY", "all_proxy", "ALL_PROXY", "no_proxy", "NO_PROXY"):
        monkeypatch.delenv(name, raising=False)

    async def main():
        proxy = RawServer()
        address = (await proxy.start()).removesuffix("/v1")
        monkeypatch.setenv("http_proxy", address)
        client = HttpClient(timeout_s=5.0, max_connections=1)
        try:
            # A host that resolves nowhere: only the proxy can answer.
            response = await client.request("GET", "http://coevolve.invalid/v1/models")
        finally:
            await client.aclose()
            proxy.close()
        return proxy, response

    proxy, response = asyncio.run(main())
    assert response.status == 200 and proxy.requests == 1


def test_a_server_that_is_down_is_a_clear_error_on_every_path():
    """The policy, a role and the embeddings, each against a port where nothing listens."""
    from langchain_core.messages import HumanMessage

    from coevolve.agents.policy.endpoint_policy import EndpointPolicy
    from coevolve.agents.roles.llm import ReplyError, ask, chat_model
    from coevolve.config import EndpointConfig
    from coevolve.memory.embeddings import EmbeddingError, OpenAIEmbedding

    base_url = f"http://127.0.0.1:{free_port()}/v1"
    endpoint = EndpointConfig(base_url=base_url, model="m", max_retries=0)
    [message] = asyncio.run(
        EndpointPolicy(endpoint).generate([[{"role": "user", "content": "hi"}]], [[]])
    )
    assert message.transport_failure and base_url in (message.error or "")
    assert "connection error: ClientConnectorError: Cannot connect to host" in (message.error or "")

    with pytest.raises(ReplyError, match="no reply from m: APIConnectionError") as failed:
        asyncio.run(ask(chat_model(endpoint), [HumanMessage("hi")]))
    assert failed.value.kind == "transport" and "Cannot connect to host" in str(failed.value.cause)

    embedding = OpenAIEmbedding(base_url, "m", max_retries=0)
    with pytest.raises(EmbeddingError, match=r"failed after 1 attempt; last error TransportError"):
        embedding(["x"])


def test_retry_after_is_read_and_the_embeddings_honour_it():
    """The policy's and the roles' Retry-After tests are in test_endpoint_policy.py and
    test_retry_policy.py; here the header as the client hands it over, and the
    embeddings waiting for it."""
    hits: list[float] = []

    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def do_POST(self) -> None:
            body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
            hits.append(time.monotonic())
            if len(hits) == 1:
                code, extra = 429, {"Retry-After": "0.4"}
                payload: dict = {"error": {"message": "slow down"}}
            else:
                code, extra = 200, {}
                data = [{"index": i, "embedding": [1.0, 2.0]} for i in range(len(body["input"]))]
                payload = {"data": data}
            raw = json.dumps(payload).encode()
            self.send_response(code)
            for name, value in {**extra, "Content-Length": str(len(raw))}.items():
                self.send_header(name, value)
            self.end_headers()
            self.wfile.write(raw)

        def log_message(self, *args: object) -> None:
            pass

    httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=httpd.serve_forever, daemon=True).start()
    base_url = f"http://127.0.0.1:{httpd.server_address[1]}/v1"
    try:
        client = BlockingClient(timeout_s=5.0, max_connections=1)
        response = client.request("POST", base_url + "/embeddings", b'{"input": ["x"]}')
        assert response.status == 429 and response.headers.get("retry-after") == "0.4"
        client.close()

        from coevolve.memory.embeddings import OpenAIEmbedding

        hits.clear()
        embedding = OpenAIEmbedding(base_url, "m", max_retries=1, retry_base_s=0.01)
        assert len(embedding(["x", "y"])) == 2
        assert len(hits) == 2 and hits[1] - hits[0] >= 0.35  # the backoff alone: ~0.01 s
    finally:
        httpd.shutdown()
        httpd.server_close()


def test_sessions_close_with_their_event_loop(caplog):
    """One client across several asyncio.run calls (a fresh session in each loop), and a
    client dropped while its loop still runs: no session is left open for the garbage
    collector to complain about."""

    async def once(client: HttpClient) -> int:
        server = RawServer()
        url = await server.start()
        try:
            return (await client.request("GET", url)).status
        finally:
            server.close()

    async def dropped_while_running() -> None:
        client = HttpClient(timeout_s=5.0, max_connections=1)
        assert await once(client) == 200
        del client
        gc.collect()
        await asyncio.sleep(0.05)  # the loop closes the dropped client's session

    with warnings.catch_warnings(record=True) as caught, caplog.at_level(logging.ERROR):
        warnings.simplefilter("always")
        client = HttpClient(timeout_s=5.0, max_connections=1)
        assert [asyncio.run(once(client)) for _ in range(3)] == [200, 200, 200]
        asyncio.run(dropped_while_running())
        del client
        gc.collect()
    assert not [w for w in caught if issubclass(w.category, ResourceWarning)]
    assert "Unclosed" not in caplog.text


def test_the_blocking_client_works_inside_a_running_loop(scripted_server):
    """Chroma calls the embedding function synchronously, also from async code."""
    server = scripted_server()
    client = BlockingClient(timeout_s=5.0, max_connections=2)

    async def inside_a_loop() -> int:
        return client.request("GET", f"{server.base_url}/models").status

    assert asyncio.run(inside_a_loop()) == 200
    client.close()  # its session closed, its thread ended; a later request starts them again
    assert client.request("GET", f"{server.base_url}/models").status == 200
    client.close()
