"""The Chroma task store: dedup of paraphrases, persistence, lookup, embedding endpoints.

Real MiniLM embeddings (loaded once for the session), real Chroma (in-memory,
on disk and as a `chroma run` server), real HTTP for the OpenAI-compatible
embedding function. Similarities quoted in comments were measured here.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import textwrap
import threading
import time
import urllib.request
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

from coevolve.envs.world import load_split
from coevolve.memory.embeddings import EmbeddingError, MiniLMEmbedding, OpenAIEmbedding
from coevolve.memory.store import TaskStore, task_text
from coevolve.records import Task, ToolCall, Turn


@pytest.fixture(scope="session")
def minilm() -> MiniLMEmbedding:
    return MiniLMEmbedding().load()


@pytest.fixture
def store(minilm):
    with TaskStore(embedding=minilm) as task_store:
        yield task_store


@pytest.fixture(scope="session")
def validation() -> dict[str, Task]:
    return {task.id: task for task in load_split("validation")}


def reworded(task: Task, query: str, suffix: str = "para") -> Task:
    """The same task (same calls, same setup) with a new id and another wording."""
    turns = [task.turns[0].model_copy(update={"query": query}), *task.turns[1:]]
    return task.model_copy(update={"id": f"{task.id}-{suffix}", "turns": turns}, deep=True)


def text_ana(query: str, task_id: str) -> Task:
    calls = [
        ToolCall(name="find_contact", arguments={"name": "Ana"}),
        ToolCall(name="send_message", arguments={"contact_id": "c1", "text": "running late"}),
    ]
    return Task(
        id=task_id,
        env="world",
        family="send_message",
        turns=[Turn(query=query, reference_calls=calls)],
    )


def one_per_family(tasks: list[Task]) -> list[Task]:
    """The first task of each family that shares no entity value with those already picked."""

    def values(task: Task) -> set[str]:
        return {
            str(value).lower()
            for call in task.reference_calls
            for key, value in call.arguments.items()
            if isinstance(value, str) and not key.endswith("_id")
        }

    picked: dict[str, Task] = {}
    used: set[str] = set()
    for task in tasks:
        if task.family not in picked and not values(task) & used:
            picked[task.family] = task
            used |= values(task)
    return list(picked.values())


# Paraphrases: (validation task id, another wording). MiniLM similarities of
# the task texts, measured: 0.916, 0.905, 0.924, 0.904, 0.943, 0.860, 0.898, 0.882.
PARAPHRASES = {
    "world-validation-0002": "Buy a backpack from the store.",
    "world-validation-0000": "Remove the hike from my calendar.",
    "world-validation-0017": "What is Pip's phone number?",
    "world-validation-0006": "Move my checkup to 01-26 08:30 and text Alf about it.",
    "world-validation-0013": "Change Nia's phone number to 555-9213.",
    "world-validation-0029": "Save the last message Cora sent me as a note titled Cora.",
    "world-validation-0080": "Purchase a bucket, adding money to the wallet if there isn't enough.",
    "world-validation-0023": "Message Mina that I'm running early.",
}


# --------------------------------------------------------------------------- dedup


def test_task_text_is_queries_then_tool_names(validation):
    task = validation["world-validation-0006"]
    assert task_text(task) == (
        "Push the checkup to 01-26 at 08:30 and let Alf know.\n"
        "find_event > move_event > find_contact > send_message"
    )


def test_paraphrase_of_a_stored_task_is_a_duplicate(store):
    original = text_ana("Text Ana: running late.", "ana")
    assert store.add_if_novel([original]).accepted == [original]

    paraphrase = text_ana("Send Ana a message saying 'running late'", "ana-2")  # 0.93
    lookup = Turn(
        query="I need Ana's number.",
        reference_calls=[ToolCall(name="find_contact", arguments={"name": "Ana"})],
    )
    other_goal = Task(id="ana-3", env="world", family="phone_lookup", turns=[lookup])
    result = store.add_if_novel([paraphrase, other_goal])

    assert [d.task.id for d in result.duplicates] == ["ana-2"]
    duplicate = result.duplicates[0]
    assert duplicate.matched_id == "ana" and duplicate.against == "store"
    assert 0.85 < duplicate.similarity < 1.0
    assert [t.id for t in result.accepted] == ["ana-3"]  # same contact, other goal
    assert store.count() == 2


def test_paraphrases_of_real_tasks_are_rejected(store, validation):
    originals = [validation[task_id] for task_id in PARAPHRASES]
    assert len(store.add_if_novel(originals).accepted) == len(originals)

    candidates = [reworded(validation[task_id], query) for task_id, query in PARAPHRASES.items()]
    result = store.add_if_novel(candidates)

    assert result.accepted == []
    matched = {d.task.id: d.matched_id for d in result.duplicates}
    assert matched == {f"{task_id}-para": task_id for task_id in PARAPHRASES}
    assert all(d.against == "store" and d.similarity >= 0.85 for d in result.duplicates)


def test_exact_duplicate_under_a_new_id_is_rejected(store, validation):
    task = validation["world-validation-0003"]
    store.add_if_novel([task])
    copy = task.model_copy(update={"id": "copy-of-0003"})
    result = store.add_if_novel([copy])
    assert result.accepted == []
    assert result.duplicates[0].matched_id == task.id
    assert result.duplicates[0].similarity == pytest.approx(1.0, abs=1e-3)


def test_distinct_tasks_of_every_family_are_kept(store, validation):
    tasks = one_per_family(list(validation.values()))
    assert len({t.family for t in tasks}) == len(tasks) >= 18
    result = store.add_if_novel(tasks)
    assert result.duplicates == []
    assert result.accepted == tasks
    assert store.count() == len(tasks)
    # The closest pair among them is far below the threshold (measured 0.61).
    for task in tasks:
        nearest_other = store.nearest(task, k=2)[1]
        assert nearest_other.similarity < 0.75, (task.instruction, nearest_other.text)


def test_duplicates_within_one_batch_are_rejected(store, validation):
    first = validation["world-validation-0002"]
    paraphrase = reworded(first, "Buy a backpack from the store.")
    same_id = first.model_copy(deep=True)
    unrelated = validation["world-validation-0017"]

    result = store.add_if_novel([first, paraphrase, same_id, unrelated])

    assert [t.id for t in result.accepted] == [first.id, unrelated.id]
    by_id = {(d.task.id, d.similarity < 1.0): d for d in result.duplicates}
    batch_paraphrase = by_id[(paraphrase.id, True)]
    assert batch_paraphrase.against == "batch" and batch_paraphrase.matched_id == first.id
    repeated = by_id[(first.id, False)]
    assert repeated.against == "batch" and repeated.similarity == 1.0
    assert store.count() == 2


def test_readding_stored_ids_is_a_noop_without_embedding(store, validation, monkeypatch):
    tasks = list(validation.values())[:12]
    first = store.add_if_novel(tasks)
    count = store.count()
    assert count == len(first.accepted)

    embedded: list[int] = []
    real_embed = store._embed
    monkeypatch.setattr(
        store, "_embed", lambda texts: embedded.append(len(texts)) or real_embed(texts)
    )
    again = store.add_if_novel(tasks)

    assert again.accepted == []
    # Accepted ones match themselves in the store; the batch's duplicates do too,
    # or (never stored) match whatever they matched the first time.
    self_matches = {d.task.id for d in again.duplicates if d.matched_id == d.task.id}
    assert self_matches == {t.id for t in first.accepted}
    assert all(
        d.similarity == 1.0 and d.against == "store"
        for d in again.duplicates
        if d.task.id in self_matches
    )
    assert store.count() == count
    assert embedded == [len(first.duplicates)]  # only the never-stored ones were embedded
    assert store.add(tasks) == len(first.duplicates) and store.add(tasks) == 0


def test_embedding_the_batch_is_one_call(store, validation, monkeypatch):
    calls: list[int] = []
    real_call = type(store.embedding).__call__

    def spy(self, input):  # Chroma insists on the parameter name
        calls.append(len(input))
        return real_call(self, input)

    monkeypatch.setattr(type(store.embedding), "__call__", spy)
    store.add_if_novel(list(validation.values())[:40])
    assert calls == [40]


def test_provenance_and_task_round_trip(store, validation):
    parent = validation["world-validation-0005"]
    child = reworded(parent, "Send Sue the time of my doctor appointment.", "child").model_copy(
        update={"source": "synthesized", "signal": "rare", "cycle": 3, "parent_task_id": parent.id}
    )
    store.add([parent, child])
    assert store.get(child.id) == child
    assert store.get("missing") is None
    assert child.id in store and "missing" not in store
    assert {t.id for t in store.all_tasks()} == {parent.id, child.id}
    hits = store.nearest(parent, k=5, where={"source": "synthesized"})
    assert [h.id for h in hits] == [child.id] and hits[0].task == child
    # Dedup only against synthesized tasks: the seed parent is not a neighbour.
    copy_of_parent = parent.model_copy(update={"id": "parent-copy"})
    result = store.add_if_novel([copy_of_parent], where={"signal": "forgetting"})
    assert [t.id for t in result.accepted] == ["parent-copy"]


def test_nearest_lists_most_similar_first(store, validation):
    assert store.nearest("anything") == []
    tasks = one_per_family(list(validation.values()))
    store.add(tasks)
    query = "Order a backpack from the store.\nsearch_products > add_to_cart > checkout"
    hits = store.nearest(query, k=4)
    assert len(hits) == 4
    assert hits[0].task is not None and hits[0].task.family == "buy_item"
    assert hits[0].text == task_text(hits[0].task)
    similarities = [h.similarity for h in hits]
    assert similarities == sorted(similarities, reverse=True)
    assert hits[0].similarity > 0.9 > hits[1].similarity
    assert len(store.nearest(query, k=100)) == len(tasks)


def test_chunks_writes_and_reads_to_chromas_batch_size(store, validation):
    store._max_batch = 7
    tasks = list(validation.values())[:30]
    assert store.add(tasks) == 30
    assert store.count() == 30
    assert [t.id for t in store.all_tasks()] == [t.id for t in tasks]
    extra = [
        reworded(t, f"A wholly new errand number {i} about llamas.", "x")
        for i, t in enumerate(tasks[:9])
    ]
    result = store.add_if_novel(extra)
    assert len(result.accepted) + len(result.duplicates) == 9
    assert all(d.against == "batch" for d in result.duplicates)  # near-identical llama errands
    assert store.count() == 30 + len(result.accepted)


def test_in_memory_stores_are_private(minilm, validation):
    with TaskStore(embedding=minilm) as first, TaskStore(embedding=minilm) as second:
        first.add(list(validation.values())[:3])
        assert (first.count(), second.count()) == (3, 0)


def test_bad_arguments_are_refused(minilm, tmp_path):
    with pytest.raises(ValueError, match="either path"):
        TaskStore(tmp_path, server_url="http://127.0.0.1:1", embedding=minilm)
    with pytest.raises(ValueError, match="threshold"):
        TaskStore(embedding=minilm, threshold=1.5)


# --------------------------------------------------------------------------- persistence


def test_store_persists_across_processes(tmp_path, validation):
    path = tmp_path / "store"
    writer = textwrap.dedent(
        f"""
        from coevolve.envs.world import load_split
        from coevolve.memory.store import TaskStore

        store = TaskStore({str(path)!r})
        result = store.add_if_novel(load_split("validation")[:25])
        print(len(result.accepted))
        """
    )
    done = subprocess.run(
        [sys.executable, "-c", writer], capture_output=True, text=True, timeout=120, env=os.environ
    )
    assert done.returncode == 0, done.stderr[-2000:]
    written = int(done.stdout.strip().splitlines()[-1])
    assert written > 15

    reopened = TaskStore(path)
    assert reopened.count() == written
    task = validation["world-validation-0003"]
    assert reopened.get(task.id) == task
    assert reopened.nearest("How much is a bucket in the shop?", k=1)[0].id == task.id
    assert reopened.add_if_novel(load_split("validation")[:25]).accepted == []
    assert reopened.count() == written


def test_reopening_with_another_embedding_function_is_refused(tmp_path, minilm):
    TaskStore(tmp_path, embedding=minilm).add([text_ana("Text Ana: running late.", "ana")])
    other = OpenAIEmbedding("http://127.0.0.1:9/v1", "embedder")
    with pytest.raises(ValueError, match="coevolve-minilm"):
        TaskStore(tmp_path, embedding=other)


def test_importing_the_store_is_cheap():
    code = (
        "import sys, coevolve.memory.store as s; "
        "print(sorted(m for m in ('torch', 'transformers', 'chromadb', 'openai') if m in sys.modules))"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "[]"


# --------------------------------------------------------------------------- Chroma server


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


@pytest.fixture
def chroma_server(tmp_path):
    chroma = Path(sys.executable).with_name("chroma")
    if not chroma.exists():
        pytest.skip(f"no chroma CLI next to {sys.executable}")
    port = _free_port()
    process = subprocess.Popen(
        [
            str(chroma),
            "run",
            "--path",
            str(tmp_path / "server"),
            "--host",
            "127.0.0.1",
            "--port",
            str(port),
        ],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 20
        while True:
            try:
                urllib.request.urlopen(f"{url}/api/v2/heartbeat", timeout=1).read()
                break
            except OSError:
                if process.poll() is not None or time.monotonic() > deadline:
                    pytest.skip("`chroma run` did not start within 20 s on this machine")
                time.sleep(0.1)
        yield url
    finally:
        process.terminate()
        process.wait(timeout=10)


def test_server_mode_shares_one_store_between_clients(chroma_server, minilm, validation):
    writer = TaskStore(server_url=chroma_server, embedding=minilm)
    tasks = one_per_family(list(validation.values()))[:6]
    assert writer.add_if_novel(tasks).accepted == tasks
    reader = TaskStore(server_url=chroma_server, embedding=minilm)
    assert reader.count() == 6
    assert reader.get(tasks[0].id) == tasks[0]
    again = reader.add_if_novel([reworded(tasks[0], tasks[0].instruction + " Thanks!")])
    assert again.accepted == [] and again.duplicates[0].matched_id == tasks[0].id


# --------------------------------------------------------------------------- OpenAI-compatible embeddings


def test_openai_embedding_over_http(scripted_server):
    from coevolve.config import EndpointConfig

    server = scripted_server()
    endpoint = EndpointConfig(base_url=server.base_url, model=server.model, max_retries=1)
    embedding = OpenAIEmbedding.from_endpoint(endpoint)
    assert embedding.get_config()["max_retries"] == 1
    with TaskStore(embedding=embedding) as task_store:
        original = text_ana("Text Ana: running late.", "ana")
        same = original.model_copy(update={"id": "ana-again"})
        different = text_ana("Tell Bo to feed the cat.", "bo")
        result = task_store.add_if_novel([original, same, different])
        assert [t.id for t in result.accepted] == ["ana", "bo"]
        assert result.duplicates[0].matched_id == "ana"
        assert result.duplicates[0].similarity == pytest.approx(1.0, abs=1e-5)
        assert task_store.nearest(original, k=1)[0].id == "ana"
    bodies = [r.body for r in server.requests if r.path == "/v1/embeddings"]
    assert [len(body["input"]) for body in bodies] == [3, 1]  # one call per batch, one per query
    assert bodies[0]["model"] == server.model


def test_a_configured_embedding_endpoint_embeds_the_runs_store(scripted_server, tmp_path):
    from coevolve.config import load_config
    from coevolve.loop.build_runtime import build_store

    server = scripted_server()
    endpoint = {"base_url": server.base_url, "model": server.model, "max_retries": 1}
    config = load_config(
        {
            "run_dir": str(tmp_path / "run"),
            "endpoints": {"embedder": endpoint},
            "synthesis": {"embedding_endpoint": "embedder"},
        }
    )
    with build_store(config) as task_store:
        assert isinstance(task_store.embedding, OpenAIEmbedding)
        ana = text_ana("Text Ana: running late.", "ana")
        task_store.add([ana])
        [nearest] = task_store.nearest(ana, k=1)
    assert nearest.id == "ana" and nearest.similarity == pytest.approx(1.0, abs=1e-5)
    bodies = [r.body for r in server.requests if r.path == "/v1/embeddings"]
    assert [body["input"] for body in bodies] == [[task_text(ana)]] * 2  # the add, the lookup
    assert all(body["model"] == server.model for body in bodies)
    assert (tmp_path / "run" / "task_store").is_dir()

    inline = load_config({"synthesis": {"embedding_endpoint": endpoint, "store_url": None}})
    with build_store(inline, tmp_path / "inline") as task_store:
        assert task_store.embedding.get_config()["base_url"] == server.base_url
    with build_store(load_config({}), tmp_path / "default") as task_store:
        assert isinstance(task_store.embedding, MiniLMEmbedding)


class _FlakyEmbeddings:
    """A stub /v1/embeddings answering ``failures`` times with ``status``, then vectors."""

    def __init__(self, failures: int, status: int = 503, body: bytes | None = None):
        self.failures, self.status, self.body, self.hits = failures, status, body, 0
        stub = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
                stub.hits += 1
                if stub.hits <= stub.failures:
                    code, payload = (
                        stub.status,
                        {"error": {"message": "busy", "type": "server_error"}},
                    )
                else:
                    data = [
                        {"object": "embedding", "index": i, "embedding": [1.0, float(len(text))]}
                        for i, text in enumerate(body["input"])
                    ]
                    code, payload = 200, {"object": "list", "data": data, "model": body["model"]}
                raw = stub.body if stub.body is not None else json.dumps(payload).encode()
                self.send_response(code)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(raw)))
                self.end_headers()
                self.wfile.write(raw)

            def log_message(self, *args: object) -> None:
                pass

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        threading.Thread(target=self.httpd.serve_forever, daemon=True).start()
        self.base_url = f"http://127.0.0.1:{self.httpd.server_address[1]}/v1"

    def close(self) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()


@pytest.fixture
def flaky():
    stubs: list[_FlakyEmbeddings] = []

    def start(failures: int, status: int = 503, body: bytes | None = None) -> _FlakyEmbeddings:
        stubs.append(_FlakyEmbeddings(failures, status, body))
        return stubs[-1]

    yield start
    for stub in stubs:
        stub.close()


def test_openai_embedding_retries_5xx_then_succeeds(flaky):
    stub = flaky(failures=2)
    embedding = OpenAIEmbedding(stub.base_url, "m", max_retries=2)
    vectors = embedding(["ab", "abcd"])
    assert stub.hits == 3
    assert len(vectors) == 2 and abs(float((vectors[0] ** 2).sum()) - 1.0) < 1e-6


def test_openai_embedding_fails_clearly_after_retries(flaky):
    stub = flaky(failures=10)
    embedding = OpenAIEmbedding(stub.base_url, "m", max_retries=2)
    with pytest.raises(EmbeddingError, match=r"failed after 3 attempts") as caught:
        embedding(["x"])
    assert stub.base_url in str(caught.value)
    assert stub.hits == 3


def test_openai_embedding_does_not_retry_client_errors(flaky):
    stub = flaky(failures=10, status=400)
    embedding = OpenAIEmbedding(stub.base_url, "m", max_retries=3)
    with pytest.raises(EmbeddingError, match="HTTP 400"):
        embedding(["x"])
    assert stub.hits == 1


@pytest.mark.parametrize(
    ("body", "message"),
    [
        (b"not json", "bad response"),
        (b'{"object": "list"}', "not an embeddings response"),
        (b'{"data": [{"index": 0, "embedding": [0.0, 0.0]}]}', "all-zero"),
    ],
)
def test_openai_embedding_rejects_a_malformed_body(flaky, body, message):
    stub = flaky(failures=0, body=body)
    with pytest.raises(EmbeddingError, match=message):
        OpenAIEmbedding(stub.base_url, "m")(["x"])


def test_openai_embedding_reads_the_key_from_the_named_variable(scripted_server, monkeypatch):
    server = scripted_server(api_key="sekrit")
    monkeypatch.delenv("COEVOLVE_TEST_EMBED_KEY", raising=False)
    embedding = OpenAIEmbedding(server.base_url, server.model, "COEVOLVE_TEST_EMBED_KEY")
    with pytest.raises(EmbeddingError, match="COEVOLVE_TEST_EMBED_KEY"):
        embedding(["x"])
    monkeypatch.setenv("COEVOLVE_TEST_EMBED_KEY", "sekrit")
    embedding = OpenAIEmbedding.build_from_config(embedding.get_config())
    assert "sekrit" not in json.dumps(embedding.get_config())
    assert len(embedding(["x", "y"])) == 2


def test_minilm_config_round_trip(minilm):
    import torch

    threads = torch.get_num_threads()
    MiniLMEmbedding(threads=threads + 1)(["one text"])
    assert torch.get_num_threads() == threads  # restored after the call
    rebuilt = MiniLMEmbedding.build_from_config(minilm.get_config())
    assert rebuilt.get_config() == minilm.get_config()
    assert MiniLMEmbedding.name() == "coevolve-minilm" and minilm.default_space() == "cosine"
    vectors = rebuilt(["hello world", "hello world"])
    assert len(vectors) == 2 and float(vectors[0] @ vectors[1]) == pytest.approx(1.0, abs=1e-5)


def test_a_seed_pools_vectors_are_read_back_bit_for_bit_by_the_next_run(
    minilm, validation, tmp_path, monkeypatch
):
    """A long list of texts (a run's seed pool) is encoded once: the next call with the same
    texts and settings reads the saved vectors, equal to a fresh encoding in every bit; other
    texts, or another thread count (it orders the sums), are another file."""
    import numpy as np

    from coevolve.memory.saved_vectors import SAVED_MIN_TEXTS

    monkeypatch.setenv("COEVOLVE_CACHE", str(tmp_path))
    texts = [task_text(task) for task in validation.values()][: SAVED_MIN_TEXTS + 10]
    first = np.stack(MiniLMEmbedding(threads=1)(texts))
    [saved] = (tmp_path / "embeddings").glob("*.npy")
    encoded = np.stack(MiniLMEmbedding(threads=1)._encode(texts, *minilm._model()))
    assert np.array_equal(first, encoded)

    def no_encoding(*args):
        raise AssertionError("encoded again")

    monkeypatch.setattr(MiniLMEmbedding, "_encode", no_encoding)
    assert np.array_equal(np.stack(MiniLMEmbedding(threads=1)(texts)), first)
    with pytest.raises(AssertionError, match="encoded again"):
        MiniLMEmbedding(threads=2)(texts)
    with pytest.raises(AssertionError, match="encoded again"):
        MiniLMEmbedding(threads=1)(texts[1:])
    with pytest.raises(AssertionError, match="encoded again"):  # too few to be worth a file
        MiniLMEmbedding(threads=1)(texts[: SAVED_MIN_TEXTS - 1])
    saved.write_bytes(b"not an array")  # unreadable: encoded again, not an error
    with pytest.raises(AssertionError, match="encoded again"):
        MiniLMEmbedding(threads=1)(texts)


def test_openai_embedding_from_a_server_that_is_not_there_fails_clearly():
    import socket

    with socket.socket() as probe:  # a port nothing listens on
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    embedding = OpenAIEmbedding(f"http://127.0.0.1:{port}/v1", "m", max_retries=1)
    with pytest.raises(EmbeddingError, match=r"failed after 2 attempts; last error TransportError"):
        embedding(["x"])
