"""The threaded HTTP transport of ``ScriptedOpenAIServer``: a thread per connection,
keep-alive HTTP/1.1, each request handed to the server's ``handle``."""

from __future__ import annotations

import socket
import sys
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any, Protocol


class RequestApp(Protocol):
    """What answers the requests (``ScriptedOpenAIServer``)."""

    def handle(self, handler: RequestHandler, method: str) -> None: ...
    def connection_opened(self, connection: socket.socket) -> None: ...
    def connection_closed(self, connection: socket.socket) -> None: ...


class ThreadedHTTPServer(ThreadingHTTPServer):
    daemon_threads = True  # a thread per connection; none of them may block exit
    request_queue_size = 1024  # benchmarks open many connections at once
    allow_reuse_address = True

    def __init__(self, address: tuple[str, int], app: RequestApp):
        self.app = app
        super().__init__(address, RequestHandler)

    def handle_error(self, request: Any, client_address: Any) -> None:
        if isinstance(sys.exc_info()[1], ConnectionError | TimeoutError):
            return  # clients that time out or vanish are part of the tests
        super().handle_error(request, client_address)


class RequestHandler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"  # keep-alive, as the openai client expects
    # Head and body go out in two writes; with Nagle's algorithm the second waits
    # for the client's delayed ACK (~40 ms), which would swamp benchmark delays.
    disable_nagle_algorithm = True
    server: ThreadedHTTPServer

    def setup(self) -> None:
        super().setup()
        self.server.app.connection_opened(self.connection)

    def finish(self) -> None:
        self.server.app.connection_closed(self.connection)
        try:
            super().finish()
        except OSError:
            pass

    def do_GET(self) -> None:
        self.server.app.handle(self, "GET")

    def do_POST(self) -> None:
        self.server.app.handle(self, "POST")

    def log_message(self, format: str, *args: Any) -> None:
        pass  # requests are recorded; stderr noise would drown test output
