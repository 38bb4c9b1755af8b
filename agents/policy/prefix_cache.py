"""The keys and values kept between a conversation's steps, found again by token prefix
(``PrefixCache``): the store ``kv_reuse.generate_batch`` reads and fills."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

# Prompts that agree on this many leading tokens share a lookup bucket. Short, so a
# conversation's first prompt and its later, longer ones always land in the same one.
_BUCKET_TOKENS = 8


@dataclass
class Entry:
    ids: tuple[int, ...]
    keys: list[Any]  # per layer: [kv_heads, tokens, head_dim]
    values: list[Any]
    last_used: int


def entry_bytes(entry: Entry) -> int:
    return sum(t.nbytes for t in entry.keys) + sum(t.nbytes for t in entry.values)


def _common_prefix(left: tuple[int, ...], right: tuple[int, ...]) -> int:
    """Length of the common prefix, by binary search over slices (compared in C)."""
    low, high = 0, min(len(left), len(right))
    while low < high:
        middle = (low + high + 1) // 2
        if left[:middle] == right[:middle]:
            low = middle
        else:
            high = middle - 1
    return low


class PrefixCache:
    """Key/value tensors of recent conversations, looked up by their longest token prefix.

    Entries not used for ``max_idle_calls`` generate calls are dropped: in lockstep
    rollouts every live conversation comes back at the next call.
    """

    def __init__(self, max_idle_calls: int = 2) -> None:
        self.max_idle_calls = max_idle_calls
        self.clock = 0
        self.buckets: dict[tuple[int, ...], list[Entry]] = {}
        self.reused_tokens = 0
        self.encoded_tokens = 0
        # Memory figures (bench/memory.py): bytes of keys and values held in entries, the
        # most held at once, and the largest padded batch of them one forward pass read.
        self.kept_bytes = 0
        self.peak_kept_bytes = 0
        self.peak_batch_bytes = 0

    def __len__(self) -> int:
        return sum(len(entries) for entries in self.buckets.values())

    def clear(self) -> None:
        self.buckets.clear()
        self.kept_bytes = 0

    def reset_peaks(self) -> None:
        """Start the peak figures again from what is held now."""
        self.peak_kept_bytes = self.kept_bytes
        self.peak_batch_bytes = 0

    def note_batch(self, nbytes: int) -> None:
        self.peak_batch_bytes = max(self.peak_batch_bytes, nbytes)

    def tick(self) -> None:
        """Start a generate call; forget entries idle for too long."""
        self.clock += 1
        for key in list(self.buckets):
            kept = []
            for entry in self.buckets[key]:
                if self.clock - entry.last_used <= self.max_idle_calls:
                    kept.append(entry)
                else:
                    self.kept_bytes -= entry_bytes(entry)
            if kept:
                self.buckets[key] = kept
            else:
                del self.buckets[key]

    def _longest(self, wanted: tuple[int, ...]) -> tuple[Entry | None, int]:
        best: Entry | None = None
        best_length = 0
        for entry in self.buckets.get(wanted[:_BUCKET_TOKENS], []):
            length = _common_prefix(entry.ids, wanted)
            if length > best_length:
                best, best_length = entry, length
        return best, best_length

    def cached_length(self, ids: Sequence[int]) -> int:
        """How many leading tokens of ``ids`` the cache holds (nothing is counted or touched)."""
        return self._longest(tuple(ids))[1]

    def lookup(self, ids: Sequence[int]) -> tuple[Entry | None, int]:
        """The entry sharing the longest prefix with ``ids`` and that prefix's length.

        At least one token of ``ids`` is always left to encode (its logits start
        the reply).
        """
        best, best_length = self._longest(tuple(ids))
        best_length = min(best_length, len(ids) - 1)
        if best is not None:
            best.last_used = self.clock
            self.reused_tokens += best_length
        self.encoded_tokens += len(ids) - best_length
        return (best, best_length) if best_length > 0 else (None, 0)

    def discard_extended(
        self, found: Sequence[tuple[Entry | None, int]], prompts: Sequence[Sequence[int]]
    ) -> None:
        """Forget the entries that ``prompts`` extend, once they are copied into a batch.

        Each would be superseded when its row's new entry is added at the end of the
        call (``add``), and every lookup of the call is already made: dropping them now
        only frees their memory for the call's forward passes."""
        for (entry, _), ids in zip(found, prompts, strict=True):
            if entry is None or tuple(ids[: len(entry.ids)]) != entry.ids:
                continue
            bucket = self.buckets.get(entry.ids[:_BUCKET_TOKENS], [])
            if any(held is entry for held in bucket):
                bucket[:] = [held for held in bucket if held is not entry]
                self.kept_bytes -= entry_bytes(entry)

    def add(self, ids: Sequence[int], keys: list[Any], values: list[Any]) -> None:
        key = tuple(ids)
        bucket = self.buckets.setdefault(key[:_BUCKET_TOKENS], [])
        # An entry this one extends is superseded: the episode has moved on.
        kept = []
        for entry in bucket:
            if key[: len(entry.ids)] == entry.ids:
                self.kept_bytes -= entry_bytes(entry)
            else:
                kept.append(entry)
        entry = Entry(key, keys, values, self.clock)
        kept.append(entry)
        bucket[:] = kept
        self.kept_bytes += entry_bytes(entry)
        self.peak_kept_bytes = max(self.peak_kept_bytes, self.kept_bytes)
