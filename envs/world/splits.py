"""Deterministic task splits of the built-in world.

* ``train``: the seed training split, deliberately uneven across families
  (weights in families.FAMILIES; several families at 2-3%).
* ``validation``: every family evenly, values from the validation pools; make
  design decisions here.
* ``heldout``: every family evenly, values from the held-out pools (names,
  products, titles, phrases never seen in training); report numbers here.
"""

from __future__ import annotations

import hashlib
import random
from collections.abc import Sequence
from functools import lru_cache

from ...records import Task, Turn
from .families import FAMILIES
from .states import SPLITS, make_state, pools_for

DEFAULT_SIZES = {"train": 1000, "validation": 8 * len(FAMILIES), "heldout": 12 * len(FAMILIES)}


def family_counts(split: str, size: int | None = None) -> dict[str, int]:
    """How many tasks of each family a split of ``size`` holds (largest-remainder rounding)."""
    if split not in SPLITS:
        raise ValueError(f"unknown world split {split!r}; allowed: {', '.join(SPLITS)}")
    total = DEFAULT_SIZES[split] if size is None else size
    if total < 0:
        raise ValueError(f"split size must be >= 0, got {total}")
    weights = {name: (weight if split == "train" else 1) for name, (_, weight) in FAMILIES.items()}
    weight_sum = sum(weights.values())
    exact = {name: total * weight / weight_sum for name, weight in weights.items()}
    counts = {name: int(value) for name, value in exact.items()}
    by_remainder = sorted(exact, key=lambda name: (counts[name] - exact[name], name))
    for name in by_remainder[: total - sum(counts.values())]:
        counts[name] += 1
    return counts


def make_task(split: str, index: int, family: str, seed: int = 0) -> Task:
    """Generate one task; the same (split, index, family, seed) always gives the same task."""
    prefix = "world" if seed == 0 else f"world-s{seed}"
    return _generate(
        family, split, f"world:{seed}:{split}:{index}:{family}", f"{prefix}-{split}-{index:04d}"
    )


def _generate(family: str, split: str, rng_key: str, task_id: str) -> Task:
    """A task of ``family`` on a fresh state, values from ``split``'s pools, seeded by ``rng_key``."""
    generator, _ = FAMILIES[family]
    rng = random.Random(rng_key)
    pools = pools_for(split)
    state = make_state(rng, pools)
    draft = generator(rng, pools, state)
    return Task(
        id=task_id,
        env="world",
        family=family,
        split=split,
        turns=[Turn(query=draft.instruction, reference_calls=draft.calls)],
        reference_answer=draft.answer,
        setup={"state": state, "check": draft.check},
    )


@lru_cache(maxsize=16)
def _load_split(split: str, seed: int, size: int | None) -> tuple[Task, ...]:
    counts = family_counts(split, size)
    families = [name for name, count in counts.items() for _ in range(count)]
    random.Random(f"world-order:{seed}:{split}").shuffle(families)
    return tuple(make_task(split, index, family, seed) for index, family in enumerate(families))


def load_split(split: str, seed: int = 0, size: int | None = None) -> list[Task]:
    """All tasks of a split (deep copies, so callers may mutate them)."""
    return [task.model_copy(deep=True) for task in _load_split(split, seed, size)]


@lru_cache(maxsize=1)
def _family_by_tools() -> dict[tuple[str, ...], str]:
    """Each family's tool sequence (every family has exactly one; checked in the tests)."""
    signatures: dict[tuple[str, ...], str] = {}
    for family in FAMILIES:
        task = make_task("train", 0, family)
        signatures[tuple(call.name for call in task.reference_calls)] = family
    return signatures


def structure_key(tool_names: Sequence[str]) -> str:
    """The family whose tool graph these calls follow, or ``other:a>b>c`` for none."""
    names = tuple(tool_names)
    return _family_by_tools().get(names) or "other:" + ">".join(names)


def make_variant(family: str, key: str, split: str = "train") -> Task:
    """A new task of ``family`` on a fresh state; ``key`` seeds it (same key, same task).

    Values come from ``split``'s pools, so variants made for training never use
    validation or held-out names, products, titles or phrases.
    """
    digest = hashlib.sha256(key.encode()).hexdigest()[:10]
    return _generate(
        family, split, f"world-variant:{family}:{key}", f"world-variant-{family}-{digest}"
    )
