"""The Chroma task store: near-duplicate rejection and nearest-task lookup.

What represents a task
----------------------
``task_text`` is what gets embedded: the user queries of every turn, one line
each, then one line with the reference tool-call names in order, e.g.::

    Tell Mina 'running early' by text.
    find_contact > send_message

The queries carry the goal and its values (who, what, when); the tool line
carries the structure the agent must produce. With all-MiniLM-L6-v2 at the
default threshold 0.8, measured on the built-in world:

* paraphrases of one task come out at 0.84-0.95: all of 20 hand-written
  rewordings and of the 21 rewordings inside the validation and held-out
  splits ("Text Ana: running late." vs "Send Ana a message saying 'running
  late'" 0.93). The queries alone catch only 65% and 48% of them: the tool
  line is what makes paraphrases reliably duplicates;
* the same family with other values ("Tell Ana 'running late' by text." vs
  "Tell Bo 'call me back' by text.") ~0.6, and one task per family with no
  shared values at most 0.61 apart: distinct;
* tasks that differ only in a date, time or phone number score ~0.97 and count
  as duplicates: the model barely reads digits, and such tasks teach the same
  thing. Store seed pools with ``add`` (no dedup) rather than ``add_if_novel``.
* the same template with other names sits near the threshold: 8% of such
  pairs reach 0.8 ("Copy Sue's latest text into a new note called Sue." vs
  the same with Cora: 0.82), so against a big store of one family a new
  instance often finds one such neighbour: of held-out tasks (names never
  seen), 47% were rejected against 2,000 train tasks, 78% against 10,000
  (queries alone: 5%, but then only 65% of paraphrases are caught). Compare
  with synthesized tasks only (``where={"source": "synthesized"}``), raise
  the threshold (0.85: 20% rejected) or pass another ``text_fn`` if value
  variants must get through.
* 0.02-0.06% of pairs of different families reach 0.8, those sharing an
  entity (e.g. "I need Amy's number." vs "Save Amy's number 555-8835.").

Reference answers and call arguments are left out: they repeat the query's
values or are state-specific ids.

Clients
-------
``TaskStore(path)`` opens an embedded ``PersistentClient`` (one writing process
at a time: Chroma's embedded store is not multi-process safe); ``path=None``
an in-memory store private to this object; ``server_url`` a Chroma server
(``chroma run --path DIR --port P``) through ``HttpClient``, for several
writers. Vectors are computed here, by the store's embedding function, and
handed to Chroma; the function is also attached to the collection (cosine
space) so its name and config are persisted with it.
"""

from __future__ import annotations

import uuid
from collections.abc import Callable, Iterable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal
from urllib.parse import urlparse

import numpy as np
from pydantic import BaseModel, ConfigDict, Field

from ..records import CandidateTask, Neighbour, Task

if TYPE_CHECKING:
    from chromadb.api.types import EmbeddingFunction, Where

TASK_JSON_KEY = "task_json"


def task_text(task: Task | CandidateTask) -> str:
    """The text that represents a task for dedup and lookup (see the module docstring)."""
    if isinstance(task, CandidateTask):
        queries = [task.query]
        names = [call.name for call in task.minimal_actions]
    else:
        queries = [turn.query for turn in task.turns]
        names = [call.name for call in task.reference_calls]
    lines = [" ".join(query.split()) for query in queries]
    if names:
        lines.append(" > ".join(names))
    return "\n".join(lines)


class _Model(BaseModel):
    model_config = ConfigDict(extra="forbid")


class Duplicate(_Model):
    """A task rejected as a near-duplicate, and what it duplicates."""

    task: Task
    matched_id: str = Field(description="Id of the stored or earlier-in-batch task it matches.")
    similarity: float = Field(description="Cosine similarity to that task (1.0: same id).")
    against: Literal["store", "batch"]


class DedupResult(_Model):
    """What ``add_if_novel`` did with a batch: stored these, rejected those."""

    accepted: list[Task] = Field(default_factory=list)
    duplicates: list[Duplicate] = Field(default_factory=list)


class TaskStore:
    """Tasks in a Chroma collection (cosine space), with near-duplicate rejection.

    ``threshold``: cosine similarity at or above which a task is a duplicate.
    ``embedding``: a Chroma embedding function (default ``MiniLMEmbedding()``);
    reopen a store with the same kind of function it was built with.
    ``text_fn``: what represents a task (default ``task_text``); it is not
    persisted, so reopen a store with the same one.
    """

    def __init__(
        self,
        path: str | Path | None = None,
        *,
        server_url: str | None = None,
        collection: str = "tasks",
        embedding: EmbeddingFunction[Any] | None = None,
        threshold: float = 0.8,
        text_fn: Callable[[Task | CandidateTask], str] = task_text,
    ) -> None:
        if path is not None and server_url is not None:
            raise ValueError("give either path (embedded store) or server_url (Chroma server)")
        if not 0.0 < threshold <= 1.0:
            raise ValueError(f"threshold must be in (0, 1], got {threshold}")
        import chromadb
        from chromadb.config import Settings

        from .embeddings import MiniLMEmbedding  # registers the embedding functions

        self.threshold = threshold
        self.text_fn = text_fn
        self.embedding = embedding if embedding is not None else MiniLMEmbedding()
        self.path = Path(path) if path is not None else None
        self.server_url = server_url
        self._database: str | None = None
        settings = Settings(anonymized_telemetry=False)
        if server_url is not None:
            url = urlparse(server_url if "://" in server_url else f"http://{server_url}")
            if not url.hostname:
                raise ValueError(
                    f"server_url {server_url!r} has no host; e.g. http://127.0.0.1:8000"
                )
            ssl = url.scheme == "https"
            port = url.port or (443 if ssl else 8000)
            self._client = chromadb.HttpClient(
                host=url.hostname, port=port, ssl=ssl, settings=settings
            )
            location = server_url
        elif path is not None:
            Path(path).mkdir(parents=True, exist_ok=True)
            try:
                self._client = chromadb.PersistentClient(path=str(path), settings=settings)
            except ValueError:
                # Another client of this process opened the path with other
                # settings (Chroma allows one set per path): share theirs.
                self._client = chromadb.PersistentClient(path=str(path))
            location = str(path)
        else:
            # Ephemeral clients of one process share one in-memory system: a
            # database of its own keeps this store private.
            self._database = f"coevolve-{uuid.uuid4().hex}"
            chromadb.AdminClient(settings).create_database(self._database)
            self._client = chromadb.EphemeralClient(settings=settings, database=self._database)
            location = "memory"
        try:
            self._collection = self._client.get_or_create_collection(
                collection,
                embedding_function=self.embedding,  # type: ignore[arg-type]
                configuration={"hnsw": {"space": "cosine"}},
            )
        except ValueError as err:
            raise ValueError(
                f"task store {location}: collection {collection!r} cannot be opened with "
                f"embedding function {self.embedding.name()!r}: {err}"
            ) from err
        space = (self._collection.configuration.get("hnsw") or {}).get("space")
        if space not in (None, "cosine"):
            raise ValueError(
                f"task store {location}: collection {collection!r} uses {space!r} distance, not cosine"
            )
        self.collection_name = collection
        self._max_batch = max(1, int(self._client.get_max_batch_size()))

    # ---------------------------------------------------------------- lifecycle

    def close(self) -> None:
        """Drop an in-memory store's data (persistent and server stores keep theirs)."""
        if self._database is not None:
            import chromadb
            from chromadb.config import Settings

            chromadb.AdminClient(Settings(anonymized_telemetry=False)).delete_database(
                self._database
            )
            self._database = None

    def __enter__(self) -> TaskStore:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    def __repr__(self) -> str:
        where = self.server_url or (str(self.path) if self.path else "memory")
        return (
            f"TaskStore({where!r}, collection={self.collection_name!r}, threshold={self.threshold})"
        )

    # ---------------------------------------------------------------- writing

    def add_if_novel(self, tasks: Sequence[Task], where: Where | None = None) -> DedupResult:
        """Store the tasks that are not near-duplicates; report the others.

        The batch is embedded in one call. Each task is compared with its
        nearest stored task and with the tasks accepted before it in this
        batch; at ``similarity >= threshold`` it is a duplicate of the closer
        one. A task whose id is already stored (or accepted earlier in the
        batch) is a duplicate of itself, similarity 1.0, and is not embedded:
        a resumed run never stores a task twice.

        ``where`` (a Chroma metadata filter, e.g. ``{"source": "synthesized"}``)
        limits which stored tasks count as neighbours; the id check and the
        in-batch comparison always apply.
        """
        tasks = list(tasks)
        result = DedupResult()
        if not tasks:
            return result
        stored = self._stored_ids([task.id for task in tasks])
        fresh = [task for task in tasks if task.id not in stored]
        texts = [self.text_fn(task) for task in fresh]
        vectors = self._embed(texts)
        store_match = self._nearest_ids(vectors, where)

        accepted_rows: list[int] = []
        accepted_ids: dict[str, int] = {}
        fresh_row = 0
        for task in tasks:
            if task.id in stored:
                result.duplicates.append(
                    Duplicate(task=task, matched_id=task.id, similarity=1.0, against="store")
                )
                continue
            row, fresh_row = fresh_row, fresh_row + 1
            if task.id in accepted_ids:
                result.duplicates.append(
                    Duplicate(task=task, matched_id=task.id, similarity=1.0, against="batch")
                )
                continue
            best_id: str | None = None
            best_sim = -1.0
            against: Literal["store", "batch"] = "store"
            match = store_match[row]
            if match is not None:
                best_id, best_sim = match
            if accepted_rows:
                sims = vectors[accepted_rows] @ vectors[row]
                top = int(np.argmax(sims))
                if float(sims[top]) > best_sim:
                    best_id, best_sim = fresh[accepted_rows[top]].id, float(sims[top])
                    against = "batch"
            if best_id is not None and best_sim >= self.threshold:
                result.duplicates.append(
                    Duplicate(
                        task=task,
                        matched_id=best_id,
                        similarity=min(best_sim, 1.0),
                        against=against,
                    )
                )
                continue
            accepted_rows.append(row)
            accepted_ids[task.id] = row
            result.accepted.append(task)

        self._write(
            [fresh[row] for row in accepted_rows],
            [texts[row] for row in accepted_rows],
            vectors[accepted_rows] if accepted_rows else vectors[:0],
        )
        return result

    def add(self, tasks: Iterable[Task]) -> int:
        """Store tasks without any similarity check (e.g. the seed pool); returns how many.

        Ids already stored, and repeated ids, are skipped.
        """
        unique = list({task.id: task for task in tasks}.values())
        if not unique:
            return 0
        stored = self._stored_ids([task.id for task in unique])
        fresh = [task for task in unique if task.id not in stored]
        texts = [self.text_fn(task) for task in fresh]
        self._write(fresh, texts, self._embed(texts))
        return len(fresh)

    # ---------------------------------------------------------------- reading

    def nearest(
        self, query: str | Task | CandidateTask, k: int = 5, where: Where | None = None
    ) -> list[Neighbour]:
        """The ``k`` stored tasks most similar to ``query``, most similar first.

        A task (or candidate) is represented by ``task_text``; a string is used
        as it is. ``where`` is a Chroma metadata filter, e.g. ``{"env": "world"}``.
        """
        return self.nearest_many([query], k, where)[0]

    def nearest_many(
        self,
        queries: Sequence[str | Task | CandidateTask],
        k: int = 5,
        where: Where | None = None,
    ) -> list[list[Neighbour]]:
        """``nearest`` for many queries at once: one embedding pass and one Chroma query."""
        if k <= 0 or not queries:
            return [[] for _ in queries]
        total = self.count()
        if total == 0:
            return [[] for _ in queries]
        texts = [query if isinstance(query, str) else self.text_fn(query) for query in queries]
        found = self._collection.query(
            query_embeddings=self._embed(texts),
            n_results=min(k, total),
            where=where,
            include=["documents", "metadatas", "distances"],
        )
        results = []
        for row, ids in enumerate(found["ids"]):
            documents: list[Any] = (found.get("documents") or [])[row] or [""] * len(ids)
            metadatas: list[Any] = (found.get("metadatas") or [])[row] or [None] * len(ids)
            distances = (found.get("distances") or [])[row] or []
            neighbours = [
                Neighbour(
                    id=task_id,
                    text=document or "",
                    similarity=1.0 - float(distance),
                    task=_task_from(metadata),
                )
                for task_id, document, metadata, distance in zip(
                    ids, documents, metadatas, distances, strict=True
                )
            ]
            results.append(sorted(neighbours, key=lambda n: -n.similarity))
        return results

    def remove(self, where: dict[str, Any]) -> int:
        """Delete the stored tasks matching a Chroma metadata filter; returns how many.

        A resumed run uses it to undo a synthesis pass that was killed before it
        finished (``{"$and": [{"source": "synthesized"}, {"cycle": 3}]}``), so the
        pass can run again from the same store.
        """
        found = self._collection.get(where=where, include=[])
        ids = list(found["ids"])
        for start in range(0, len(ids), self._max_batch):
            self._collection.delete(ids=ids[start : start + self._max_batch])
        return len(ids)

    def count(self) -> int:
        return int(self._collection.count())

    def __len__(self) -> int:
        return self.count()

    def __contains__(self, task_id: object) -> bool:
        return isinstance(task_id, str) and bool(self._stored_ids([task_id]))

    def get(self, task_id: str) -> Task | None:
        """The stored task with this id, or None."""
        found = self._collection.get(ids=[task_id], include=["metadatas"])
        metadatas = found.get("metadatas") or []
        return _task_from(metadatas[0]) if found["ids"] else None

    def all_tasks(self) -> list[Task]:
        """Every stored task, in pages of Chroma's batch size."""
        tasks: list[Task] = []
        offset = 0
        while True:
            page = self._collection.get(include=["metadatas"], limit=self._max_batch, offset=offset)
            for metadata in page.get("metadatas") or []:
                task = _task_from(metadata)
                if task is not None:
                    tasks.append(task)
            if len(page["ids"]) < self._max_batch:
                return tasks
            offset += len(page["ids"])

    # ---------------------------------------------------------------- internals

    def _embed(self, texts: list[str]) -> np.ndarray:
        if not texts:
            return np.zeros((0, 0), dtype=np.float32)
        vectors = np.asarray(self.embedding(texts), dtype=np.float32)
        norms = np.linalg.norm(vectors, axis=1, keepdims=True)
        return vectors / np.where(norms > 0, norms, 1.0)

    def _stored_ids(self, ids: list[str]) -> set[str]:
        found: set[str] = set()
        unique = list(dict.fromkeys(ids))
        for start in range(0, len(unique), self._max_batch):
            chunk = unique[start : start + self._max_batch]
            found.update(self._collection.get(ids=chunk, include=[])["ids"])
        return found

    def _nearest_ids(
        self, vectors: np.ndarray, where: Where | None = None
    ) -> list[tuple[str, float] | None]:
        """For each vector, the nearest stored (id, similarity), or None if the store is empty."""
        if len(vectors) == 0 or self.count() == 0:
            return [None] * len(vectors)
        matches: list[tuple[str, float] | None] = []
        for start in range(0, len(vectors), self._max_batch):
            found = self._collection.query(
                query_embeddings=vectors[start : start + self._max_batch],
                n_results=1,
                where=where,
                include=["distances"],
            )
            for ids, distances in zip(found["ids"], found["distances"] or [], strict=True):
                matches.append((ids[0], 1.0 - float(distances[0])) if ids else None)
        return matches

    def _write(self, tasks: list[Task], texts: list[str], vectors: np.ndarray) -> None:
        for start in range(0, len(tasks), self._max_batch):
            chunk = tasks[start : start + self._max_batch]
            self._collection.add(
                ids=[task.id for task in chunk],
                embeddings=vectors[start : start + self._max_batch],
                documents=texts[start : start + self._max_batch],
                metadatas=[_metadata(task) for task in chunk],
            )


def _metadata(task: Task) -> dict[str, str | int | float | bool]:
    """Filterable provenance fields plus the whole task as JSON (None fields left out)."""
    fields: dict[str, Any] = {
        "env": task.env,
        "family": task.family,
        "split": task.split,
        "source": task.source,
        "signal": task.signal,
        "cycle": task.cycle,
        "parent_task_id": task.parent_task_id,
        TASK_JSON_KEY: task.model_dump_json(),
    }
    return {key: value for key, value in fields.items() if value is not None}


def _task_from(metadata: Any) -> Task | None:
    if not metadata or TASK_JSON_KEY not in metadata:
        return None
    return Task.model_validate_json(metadata[TASK_JSON_KEY])
