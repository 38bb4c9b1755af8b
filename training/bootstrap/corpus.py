"""The bootstrap's training corpus: the training split's verified reference demonstrations,
and copies of them with entity values replaced by made-up ones (``ValueAugmenter``)."""

from __future__ import annotations

import random
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # pragma: no cover
    from ...agents.policy.policy_interface import Message
    from .bootstrap_config import BootstrapConfig


def build_corpus(config: BootstrapConfig) -> list[list[Message]]:
    """Reference demonstrations of the training split as conversations (verified ones only)."""
    from ...agents.policy.conversation import reference_conversation
    from ...envs.world import WorldEnvironment, load_split
    from ...records import is_success

    tasks = load_split(config.train_split, seed=config.world_seed)
    if config.num_train_tasks is not None:
        tasks = tasks[: config.num_train_tasks]
    conversations = []
    for task in tasks:
        messages, score = reference_conversation(WorldEnvironment(), task)
        if is_success(score):
            conversations.append(messages)
    if not conversations:
        raise RuntimeError(f"no reference solution of split {config.train_split!r} verified")
    return conversations


_CONSONANTS = "bcdfghjklmnprstvwz"
_VOWELS = "aeiouy"


def _made_up_word(rng: random.Random, low: int, high: int) -> str:
    """A pronounceable made-up word of ``low``-``high`` letters."""
    length = rng.randint(low, high)
    start_with_vowel = rng.random() < 0.3
    letters = [
        rng.choice(_VOWELS if (i % 2 == 0) == start_with_vowel else _CONSONANTS)
        for i in range(length)
    ]
    return "".join(letters)


class ValueAugmenter:
    """Copies of a demonstration with its entity values replaced by made-up ones.

    The training split draws names, products, event titles and message texts
    from small pools, which a small model memorises instead of learning to copy
    them from the request and the tool results; held-out tasks use other pools.
    Replacing every pool value (as a whole word, consistently across the
    request, the calls, the tool results and the answer) with a fresh made-up
    value leaves memorising nothing to gain. Values of the other splits' pools
    are never produced.
    """

    def __init__(self, split: str, seed: int) -> None:
        import re

        from ...envs.world import pools_for
        from ...envs.world.states import SPLITS

        pools = pools_for(split)
        self.kinds: dict[str, str] = {}
        for kind, values in (
            ("message", pools.messages),
            ("product", pools.products),
            ("title", pools.titles),
            ("name", pools.names),
        ):
            for value in values:
                self.kinds.setdefault(value, kind)
        ordered = sorted(self.kinds, key=len, reverse=True)  # "call me back" before "call"
        self.pattern = re.compile(
            r"(?<![\w-])(" + "|".join(re.escape(value) for value in ordered) + r")(?![\w-])"
        )
        self.forbidden = {
            value.lower()
            for other in map(pools_for, SPLITS)
            for value in (*other.names, *other.products, *other.titles, *other.messages)
        }
        self.rng = random.Random(f"bootstrap-augment:{seed}")
        # Phone numbers, dates and times are redrawn too (prices stay: totals add up).
        self.numbers = re.compile(r"(?<![\w-])(555-\d{4}|\d\d-\d\d|\d\d:\d\d)(?![\w-])")

    def _fresh(self, kind: str, taken: set[str]) -> str:
        while True:
            if kind == "name":
                value = _made_up_word(self.rng, 2, 5).capitalize()
            elif kind == "message":
                words = self.rng.randint(2, 4)
                value = " ".join(_made_up_word(self.rng, 2, 6) for _ in range(words))
            elif kind == "product" and self.rng.random() < 0.15:
                value = f"{_made_up_word(self.rng, 3, 5)}-{_made_up_word(self.rng, 2, 4)}"
            else:
                value = _made_up_word(self.rng, 3, 8)
            if value.lower() not in self.forbidden and value not in taken:
                return value

    def _fresh_number(self, value: str, taken: set[str]) -> str:
        while True:
            if value.startswith("555-"):
                fresh = f"555-{self.rng.randrange(10000):04d}"
            elif "-" in value:
                fresh = f"{self.rng.randint(1, 12):02d}-{self.rng.randint(1, 28):02d}"
            else:
                fresh = f"{self.rng.randint(7, 20):02d}:{self.rng.choice(['00', '30'])}"
            if fresh not in taken:
                return fresh

    def __call__(self, messages: list[Message]) -> list[Message]:
        mapping: dict[str, str] = {}

        def substitute(text: str) -> str:
            def replace(match: Any) -> str:
                value = match.group(1)
                if value not in mapping:
                    mapping[value] = self._fresh(self.kinds[value], set(mapping.values()))
                return mapping[value]

            def renumber(match: Any) -> str:
                value = match.group(1)
                if value not in mapping:
                    mapping[value] = self._fresh_number(value, set(mapping.values()))
                return mapping[value]

            return self.numbers.sub(renumber, self.pattern.sub(replace, text))

        out = []
        for message in messages:
            message = dict(message)
            if isinstance(message.get("content"), str):
                message["content"] = substitute(message["content"])
            if message.get("tool_calls"):
                calls = []
                for call in message["tool_calls"]:
                    function = dict(call["function"])
                    if isinstance(function.get("arguments"), str):
                        function["arguments"] = substitute(function["arguments"])
                    calls.append({**call, "function": function})
                message["tool_calls"] = calls
            out.append(message)
        return out


def augment_corpus(
    conversations: list[list[Message]], config: BootstrapConfig
) -> list[list[Message]]:
    """The corpus and ``config.augment_copies`` value-replaced copies of every demonstration."""
    if config.augment_copies == 0:
        return list(conversations)
    augmenter = ValueAugmenter(config.train_split, config.seed)
    out = list(conversations)
    for _ in range(config.augment_copies):
        out.extend(augmenter(messages) for messages in conversations)
    return out
