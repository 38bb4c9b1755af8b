"""A small OpenAI-compatible HTTP server with scripted replies, for tests and benchmarks.

Everything that talks to an LLM endpoint (the endpoint policy, the synthesis
roles, embeddings-based dedup, LoRA hot-loading) is tested against real HTTP
rather than a patched client, so that timeouts, dropped connections and broken
bodies go through the same code paths as in production. Standard library only
(orjson, when installed, parses and writes bodies faster: a benchmark's server
must not be the bottleneck it measures), so it runs wherever the package does::

    from coevolve.testing.openai_server import Reply, ScriptedOpenAIServer

    with ScriptedOpenAIServer([Reply.tool_calls([("find_contact", {"name": "Ana"})]),
                               Reply.text("Ana's number is 555-0192")]) as server:
        ...  # point an EndpointConfig at server.base_url, model server.model
        assert len(server.chat_bodies()) == 2

Routes (all under ``/v1``): ``POST /chat/completions`` (answers from the
script), ``GET /models``, ``POST /embeddings`` (deterministic hash-based
bag-of-words vectors), and vLLM's runtime LoRA API ``POST /load_lora_adapter``
and ``POST /unload_lora_adapter``. Every request is recorded.

Run ``python -m coevolve.testing.server_cli --port 8765 --delay 0.05`` for a
manual echo server.
"""

from __future__ import annotations

import base64
import itertools
import json
import socket
import struct
import threading
import time
import traceback
from collections.abc import Callable, Iterable, Sequence
from typing import Any

from ..common.errors import PROGRAMMING_ERRORS
from .openai_bodies import BODY_DECODE_ERRORS, chat_completion, dumps_body, loads_body
from .openai_script import (
    RecordedRequest,
    Reply,
    Script,
    calls_then_answer,
    count_tokens,
    echo_reply,
    hash_embedding,
)
from .threaded_http import RequestHandler, ThreadedHTTPServer

__all__ = [
    "CHAT_PATH",
    "DEFAULT_MODEL",
    "RecordedRequest",
    "Reply",
    "Script",
    "ScriptedOpenAIServer",
    "calls_then_answer",
    "hash_embedding",
]

DEFAULT_MODEL = "scripted-model"
CHAT_PATH = "/v1/chat/completions"


# --------------------------------------------------------------------------- the server


class ScriptedOpenAIServer:
    """An OpenAI-compatible server on 127.0.0.1, answering chat completions from a script.

    ``script`` is a list of replies consumed in order (a str means
    ``Reply.text``), or a callable from the request body to a reply; None
    echoes the last user message. When a list runs out the server answers 500
    and notes it on the request, unless ``repeat_last`` is set.

    ``delay_s`` is added to every chat completion (a benchmark's model latency).
    ``models`` are the model names served; a request for any other model (or a
    LoRA adapter not loaded) gets vLLM's 404, unless ``accept_any_model``. With ``api_key`` set, requests
    without ``Authorization: Bearer <api_key>`` get 401.
    """

    def __init__(
        self,
        script: Script | None = None,
        delay_s: float = 0.0,
        *,
        models: Sequence[str] = (DEFAULT_MODEL,),
        repeat_last: bool = False,
        accept_any_model: bool = False,
        embedding_dim: int = 256,
        api_key: str | None = None,
        host: str = "127.0.0.1",
        port: int = 0,
    ):
        if not models:
            raise ValueError("the server needs at least one model name")
        self.script = script
        self.delay_s = delay_s
        self.models = list(models)
        self.repeat_last = repeat_last
        self.accept_any_model = accept_any_model
        self.embedding_dim = embedding_dim
        self.api_key = api_key
        self.host = host
        self.port = port
        self._lock = threading.Lock()
        self._requests: list[RecordedRequest] = []
        self._script_index = 0
        self._script_bugs: list[BaseException] = []  # raised again by stop()
        self._adapters: dict[str, str] = {}
        # (status, message): answer every LoRA load with this error, as a vLLM started
        # without runtime LoRA updating does; None loads adapters. Settable while serving.
        self.refuse_adapters: tuple[int, str] | None = None
        # Request fields a chat completion is refused for (HTTP 400), as servers without
        # structured output refuse response_format. Settable while serving.
        self.refuse_fields: frozenset[str] = frozenset()
        self._in_flight = 0
        self._max_in_flight = 0
        self._ids = itertools.count(1)
        self._connections: set[socket.socket] = set()
        self._stopping = threading.Event()
        self._httpd: ThreadedHTTPServer | None = None
        self._thread: threading.Thread | None = None

    # ---------------------------------------------------------------- lifecycle

    def start(self) -> ScriptedOpenAIServer:
        if self._httpd is not None:
            return self
        self._stopping.clear()
        self._httpd = ThreadedHTTPServer((self.host, self.port), self)
        self.port = self._httpd.server_address[1]
        # stop() waits up to one poll interval; keep it short so test teardown is quick.
        self._thread = threading.Thread(
            target=self._httpd.serve_forever,
            kwargs={"poll_interval": 0.01},
            name=f"scripted-openai-{self.port}",
            daemon=True,
        )
        self._thread.start()
        return self

    def stop(self) -> None:
        """Stop serving, cut delays short and close kept-alive connections.

        Raises the first programming error (a failed assert, a TypeError) a script
        callable raised while serving: the request got a 500, the test gets the bug.
        """
        httpd, self._httpd = self._httpd, None
        if httpd is None:
            return
        self._stopping.set()
        httpd.shutdown()
        with self._lock:
            connections = list(self._connections)
        # Handler threads blocked reading a kept-alive connection would otherwise
        # keep answering on it after stop().
        for connection in connections:
            try:
                connection.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
        httpd.server_close()
        if self._thread is not None:
            self._thread.join(timeout=5)
        if self._script_bugs:
            bug, self._script_bugs = self._script_bugs[0], []
            raise bug

    def __enter__(self) -> ScriptedOpenAIServer:
        return self.start()

    def __exit__(self, *exc_info: object) -> None:
        self.stop()

    # ---------------------------------------------------------------- inspection

    @property
    def base_url(self) -> str:
        if self._httpd is None:
            raise RuntimeError("the server is not running: call start() or use it in a with block")
        return f"http://{self.host}:{self.port}/v1"

    @property
    def model(self) -> str:
        """The first (default) model name."""
        return self.models[0]

    @property
    def requests(self) -> list[RecordedRequest]:
        """A copy of every request so far, in arrival order."""
        with self._lock:
            return list(self._requests)

    def chat_bodies(self) -> list[dict[str, Any]]:
        """The JSON bodies of the chat-completion requests so far."""
        return [r.body for r in self.requests if r.path == CHAT_PATH and r.method == "POST"]

    @property
    def max_in_flight(self) -> int:
        """Most chat completions being answered at the same time so far."""
        with self._lock:
            return self._max_in_flight

    @property
    def loaded_adapters(self) -> dict[str, str]:
        """LoRA adapters loaded through the API: name -> path."""
        with self._lock:
            return dict(self._adapters)

    def clear(self) -> None:
        """Forget recorded requests and the in-flight maximum (the script position stays)."""
        with self._lock:
            self._requests.clear()
            self._max_in_flight = self._in_flight

    # ---------------------------------------------------------------- request handling

    def connection_opened(self, connection: socket.socket) -> None:
        with self._lock:
            self._connections.add(connection)

    def connection_closed(self, connection: socket.socket) -> None:
        with self._lock:
            self._connections.discard(connection)

    def handle(self, handler: RequestHandler, method: str) -> None:
        """Answer one request that the threaded HTTP server read."""
        path = handler.path.split("?", 1)[0].rstrip("/")
        length = int(handler.headers.get("Content-Length") or 0)
        raw = handler.rfile.read(length) if length else b""
        record = RecordedRequest(
            path=path,
            method=method,
            body=None,
            time=time.monotonic(),
            headers=dict(handler.headers),
        )
        if raw:
            try:
                record.body = loads_body(raw)
            except BODY_DECODE_ERRORS:
                record.body = raw.decode("utf-8", "replace")
                record.note = "request body is not JSON"
        with self._lock:
            self._requests.append(record)

        if self.api_key is not None:
            if handler.headers.get("Authorization") != f"Bearer {self.api_key}":
                self._error(handler, record, 401, "Incorrect API key provided.", "invalid_api_key")
                return
        routes: dict[tuple[str, str], Callable[[RequestHandler, RecordedRequest], None]] = {
            ("POST", CHAT_PATH): self._chat,
            ("GET", "/v1/models"): self._list_models,
            ("POST", "/v1/embeddings"): self._embeddings,
            ("POST", "/v1/load_lora_adapter"): self._load_adapter,
            ("POST", "/v1/unload_lora_adapter"): self._unload_adapter,
        }
        route = routes.get((method, path))
        if route is None:
            self._error(handler, record, 404, f"no route {method} {path}", "not_found")
            return
        if method == "POST" and not isinstance(record.body, dict):
            self._error(handler, record, 400, "the request body must be a JSON object")
            return
        route(handler, record)

    def _chat(self, handler: RequestHandler, record: RecordedRequest) -> None:
        body: dict[str, Any] = record.body
        if not isinstance(body.get("messages"), list):
            self._error(handler, record, 400, "'messages' must be a list of messages")
            return
        model = body.get("model")
        if not self.accept_any_model and model not in self._served_models():
            # vLLM's answer; clients must turn it into a configuration error.
            self._error(
                handler, record, 404, f"The model `{model}` does not exist.", "NotFoundError"
            )
            return
        if body.get("n", 1) != 1:
            self._error(handler, record, 400, "the scripted server supports n=1 only")
            return
        refused = sorted(self.refuse_fields & body.keys())
        if refused:
            self._error(handler, record, 400, f"unsupported fields in the request: {refused}")
            return
        # In flight: from arrival until the answer is ready. The count drops before
        # the answer is written, so a client that sends its next request on receipt
        # never sees its previous one still counted.
        with self._lock:
            self._in_flight += 1
            self._max_in_flight = max(self._max_in_flight, self._in_flight)
        try:
            reply = self.next_reply(body)
            wait = self.delay_s + reply.delay_s
            if wait > 0:
                self._stopping.wait(wait)  # stop() cuts the wait short
        except _ScriptProblem as problem:
            record.note = str(problem)
            self._error(handler, record, 500, f"scripted server: {problem}")
            return
        finally:
            with self._lock:
                self._in_flight -= 1
        if reply.drop_connection:
            record.note = "dropped the connection"
            handler.close_connection = True
        elif reply.raw_body is not None:
            record.note = "malformed body"
            raw = reply.raw_body.encode("utf-8", "surrogatepass")
            code, kind = reply.status_code, reply.content_type
            self._send(handler, record, code, raw, kind, headers=reply.headers)
        elif reply.status_code != 200:
            message = reply.error_message or f"scripted error {reply.status_code}"
            self._error(handler, record, reply.status_code, message, headers=reply.headers)
        else:
            self._send_json(handler, record, 200, self.completion(body, reply))

    def next_reply(self, body: dict[str, Any]) -> Reply:
        script = self.script
        if script is None:
            return echo_reply(body)
        if callable(script):
            try:
                reply = script(body)
            except Exception as err:  # boundary: the test's own script, answered with a 500
                # A broken script callable must show up in the test, not vanish in a thread:
                # a bug in it (a failed assert, a TypeError) is raised again by stop().
                if isinstance(err, PROGRAMMING_ERRORS):
                    self._script_bugs.append(err)
                detail = "".join(traceback.format_exception_only(type(err), err)).strip()
                raise _ScriptProblem(f"the script raised {detail}") from err
        else:
            with self._lock:
                index = self._script_index
                if index < len(script):
                    self._script_index += 1
                elif self.repeat_last and script:
                    index = len(script) - 1
                else:
                    raise _ScriptProblem(f"script exhausted after {len(script)} replies")
            reply = script[index]
        if isinstance(reply, str):
            return Reply.text(reply)
        if not isinstance(reply, Reply):
            raise _ScriptProblem(f"the script gave {type(reply).__name__}, not a Reply or str")
        return reply

    def completion(self, body: dict[str, Any], reply: Reply) -> dict[str, Any]:
        """The chat completion that answers ``body`` with ``reply`` (ids from this server)."""
        return chat_completion(body, reply, self._ids)

    def _list_models(self, handler: RequestHandler, record: RecordedRequest) -> None:
        about = {"object": "model", "created": int(time.time()), "owned_by": "scripted"}
        data = [{"id": name, **about, "root": name} for name in self.models]
        data += [
            {"id": name, **about, "root": path, "parent": self.models[0]}
            for name, path in self.loaded_adapters.items()
        ]
        self._send_json(handler, record, 200, {"object": "list", "data": data})

    def _embeddings(self, handler: RequestHandler, record: RecordedRequest) -> None:
        body: dict[str, Any] = record.body
        texts = body.get("input")
        if isinstance(texts, str):
            texts = [texts]
        if not isinstance(texts, list) or not texts:
            self._error(handler, record, 400, "'input' must be a string or a non-empty list")
            return
        dim = body.get("dimensions") or self.embedding_dim
        # The openai client asks for base64 unless told otherwise.
        as_base64 = body.get("encoding_format") == "base64"
        data = []
        for index, text in enumerate(texts):
            vector = hash_embedding(text if isinstance(text, str) else json.dumps(text), dim)
            encoded: Any = vector
            if as_base64:
                encoded = base64.b64encode(struct.pack(f"<{dim}f", *vector)).decode()
            data.append({"object": "embedding", "index": index, "embedding": encoded})
        tokens = sum(count_tokens(t) if isinstance(t, str) else len(t) for t in texts)
        usage = {"prompt_tokens": tokens, "total_tokens": tokens}
        payload = {"object": "list", "data": data, "model": body.get("model"), "usage": usage}
        self._send_json(handler, record, 200, payload)

    def _load_adapter(self, handler: RequestHandler, record: RecordedRequest) -> None:
        name, path = record.body.get("lora_name"), record.body.get("lora_path")
        refusal = self.refuse_adapters
        if refusal is not None:
            self._error(handler, record, refusal[0], refusal[1])
            return
        if not name or not path:
            self._error(handler, record, 400, "both 'lora_name' and 'lora_path' are required")
            return
        with self._lock:
            known = name in self._adapters
            if not known:
                self._adapters[name] = path
        if known:
            self._error(handler, record, 400, f"The lora adapter '{name}' has already been loaded.")
            return
        message = f"Success: LoRA adapter '{name}' added successfully."
        self._send(handler, record, 200, message.encode(), "text/plain; charset=utf-8")

    def _unload_adapter(self, handler: RequestHandler, record: RecordedRequest) -> None:
        name = record.body.get("lora_name")
        with self._lock:
            known = self._adapters.pop(name, None) is not None
        if not known:
            message = f"The lora adapter '{name}' cannot be found."
            self._error(handler, record, 404, message, "NotFoundError")
            return
        message = f"Success: LoRA adapter '{name}' removed successfully."
        self._send(handler, record, 200, message.encode(), "text/plain; charset=utf-8")

    def _served_models(self) -> set[str]:
        with self._lock:
            return set(self.models) | set(self._adapters)

    # ---------------------------------------------------------------- responses

    def _error(
        self,
        handler: RequestHandler,
        record: RecordedRequest,
        code: int,
        message: str,
        kind: str | None = None,
        headers: Iterable[tuple[str, str]] = (),
    ) -> None:
        error_type = kind or ("server_error" if code >= 500 else "invalid_request_error")
        payload = {"error": {"message": message, "type": error_type, "param": None, "code": code}}
        self._send_json(handler, record, code, payload, headers)

    def _send_json(
        self,
        handler: RequestHandler,
        record: RecordedRequest,
        code: int,
        payload: Any,
        headers: Iterable[tuple[str, str]] = (),
    ) -> None:
        self._send(handler, record, code, dumps_body(payload), "application/json", headers)

    def _send(
        self,
        handler: RequestHandler,
        record: RecordedRequest,
        code: int,
        data: bytes,
        content_type: str,
        headers: Iterable[tuple[str, str]] = (),
    ) -> None:
        record.status = code
        try:
            handler.send_response(code)
            handler.send_header("Content-Type", content_type)
            handler.send_header("Content-Length", str(len(data)))
            for name, value in headers:
                handler.send_header(name, value)
            handler.end_headers()  # http.server frames the head; Nagle is off for the body
            handler.wfile.write(data)
        except (BrokenPipeError, ConnectionResetError):
            # The client gave up (a timeout test): nothing left to answer.
            record.note = (record.note + "; " if record.note else "") + "client went away"
            handler.close_connection = True


class _ScriptProblem(Exception):
    """The script could not give a reply; the request is answered with a 500."""
