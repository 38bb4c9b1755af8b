"""Benchmark: the cost of ``TaskStore.add_if_novel`` per task on a 10,000-task store.

    python bench/dedup.py [--store-size 10000] [--batch 64] [--batches 10]
                          [--dtype auto|float32|bfloat16] [--threads N] [--path DIR]

Fills a store with ``--store-size`` distinct tasks of the built-in world (train
pools, several generator seeds, no two with the same task text) using
``TaskStore.add`` (no similarity check), then times ``add_if_novel`` on batches
of new tasks from the held-out pools (values never seen in the store),
embedding included, and prints ms per task against the 5 ms target. The
breakdown times the parts on the same batches separately: embedding alone,
the nearest-neighbour query alone (vectors precomputed), the id check.
Takes a few minutes on 2 CPU cores. Not run by the tests. ``--threads 2`` on
2 cores shows what torch's default does when another process holds a core.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
from collections.abc import Iterator

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("ANONYMIZED_TELEMETRY", "False")

from coevolve.envs.world import load_split
from coevolve.memory.embeddings import MiniLMEmbedding, resolve_dtype
from coevolve.memory.store import TaskStore, task_text
from coevolve.records import Task

TARGET_MS = 5.0


def distinct_tasks(split: str, count: int, skip: set[str], first_seed: int = 0) -> Iterator[Task]:
    """Up to ``count`` world tasks whose texts are new (not in ``skip``, not repeated)."""
    produced, seed = 0, first_seed
    while produced < count:
        for task in load_split(split, seed=seed, size=2000):
            text = task_text(task)
            if text in skip:
                continue
            skip.add(text)
            yield task
            produced += 1
            if produced == count:
                return
        seed += 1
        if seed - first_seed > 200:
            raise SystemExit(f"only {produced} distinct {split} tasks found; ask for fewer")


def ms(seconds: float, tasks: int) -> float:
    return 1000.0 * seconds / max(tasks, 1)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--store-size", type=int, default=10_000)
    parser.add_argument("--batch", type=int, default=64)
    parser.add_argument("--batches", type=int, default=10, help="measured batches")
    parser.add_argument("--dtype", default="auto", help="MiniLM dtype: auto, float32, bfloat16")
    parser.add_argument(
        "--threads",
        type=int,
        default=None,
        help="torch threads while embedding (default: half the cores)",
    )
    parser.add_argument("--path", default=None, help="store directory (default: a temp dir)")
    args = parser.parse_args(argv)

    embedding = MiniLMEmbedding(dtype=args.dtype, threads=args.threads)
    started = time.perf_counter()
    embedding.load()
    load_s = time.perf_counter() - started
    print(
        f"MiniLM ({resolve_dtype(args.dtype, 'cpu')} on cpu, {os.cpu_count()} cores, "
        f"{args.threads or max(1, (os.cpu_count() or 2) // 2)} torch threads) "
        f"loaded in {load_s:.1f} s"
    )

    seen: set[str] = set()
    started = time.perf_counter()
    fill = list(distinct_tasks("train", args.store_size, seen))
    probe = list(distinct_tasks("heldout", args.batch * args.batches, seen))
    print(
        f"generated {len(fill)} store tasks + {len(probe)} new tasks "
        f"in {time.perf_counter() - started:.1f} s"
    )

    with tempfile.TemporaryDirectory(prefix="dedup-bench-") as scratch:
        store = TaskStore(args.path or scratch, embedding=embedding)
        if store.count():
            sys.exit(f"{store.path} already holds {store.count()} tasks; give an empty --path")

        # ---- fill: embedding and writing timed apart, in chunks like a seed pool load
        embed_s = write_s = 0.0
        chunk = 1024
        for start in range(0, len(fill), chunk):
            part = fill[start : start + chunk]
            texts = [task_text(task) for task in part]
            t0 = time.perf_counter()
            vectors = store._embed(texts)
            t1 = time.perf_counter()
            store._write(part, texts, vectors)
            t2 = time.perf_counter()
            embed_s, write_s = embed_s + t1 - t0, write_s + t2 - t1
        total = embed_s + write_s
        print(
            f"\nfill {store.count()} tasks: {total:.1f} s = embedding {embed_s:.1f} s "
            f"({ms(embed_s, len(fill)):.2f} ms/task) + Chroma add {write_s:.1f} s "
            f"({ms(write_s, len(fill)):.2f} ms/task)"
        )

        # ---- measured batches
        per_task: list[float] = []
        parts = {"embed": 0.0, "query": 0.0, "ids": 0.0}
        accepted = duplicates = 0
        batches = [probe[i : i + args.batch] for i in range(0, len(probe), args.batch)]
        store.add_if_novel(batches[0][:4])  # warm-up (first query compiles paths, fills caches)
        for batch in batches:
            texts = [task_text(task) for task in batch]
            # Parts, on the same batch, before it is stored.
            t0 = time.perf_counter()
            vectors = store._embed(texts)
            t1 = time.perf_counter()
            store._nearest_ids(vectors)
            t2 = time.perf_counter()
            store._stored_ids([task.id for task in batch])
            t3 = time.perf_counter()
            parts["embed"] += t1 - t0
            parts["query"] += t2 - t1
            parts["ids"] += t3 - t2
            # The real call, embedding included.
            t4 = time.perf_counter()
            result = store.add_if_novel(batch)
            per_task.append(ms(time.perf_counter() - t4, len(batch)))
            accepted += len(result.accepted)
            duplicates += len(result.duplicates)

        measured = sum(len(b) for b in batches)
        mean = statistics.fmean(per_task)
        print(
            f"\nadd_if_novel, {len(batches)} batches of {args.batch} new tasks "
            f"against {args.store_size} stored ({accepted} accepted, {duplicates} duplicates):"
        )
        print(
            f"  per task: mean {mean:.2f} ms, median {statistics.median(per_task):.2f} ms, "
            f"worst batch {max(per_task):.2f} ms"
        )
        print(
            f"  target <= {TARGET_MS:.0f} ms per task: ratio {mean / TARGET_MS:.2f} "
            f"({'met' if mean <= TARGET_MS else 'missed'})"
        )
        print("  breakdown per task (same batches, timed separately):")
        print(f"    embedding only      {ms(parts['embed'], measured):6.2f} ms")
        print(f"    NN query only       {ms(parts['query'], measured):6.2f} ms")
        print(f"    stored-id check     {ms(parts['ids'], measured):6.2f} ms")
        rest = mean - sum(ms(v, measured) for v in parts.values())
        print(f"    rest (batch compare, Chroma add, records) {rest:6.2f} ms")
        store.close()


if __name__ == "__main__":
    main()
