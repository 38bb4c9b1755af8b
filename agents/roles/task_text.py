"""What the roles compare task texts and calls with: when two texts are the same task
(``similar``, ``repeats``), when two solutions are the same calls (``actions_key``), and
which argument values a call passes and whether a text states them (``call_values``,
``mentions``).

The offline abstractor, the LLM abstractor, the variation roles and the explorer share
them; none of them is a role's own.
"""

from __future__ import annotations

import difflib
import json
import re
from collections import Counter
from collections.abc import Mapping, Sequence
from functools import cached_property
from typing import Any

from ...records import ToolCall
from .role_interfaces import AbstractionInput

# Texts this similar (difflib ratio on normalised text) count as the same task.
REPEAT_SIMILARITY = 0.95

_WORDS = re.compile(r"[a-z0-9]+(?:[-:.'][a-z0-9]+)*")


def normalise(text: str) -> str:
    return " ".join(_WORDS.findall(text.lower()))


def text_similarity(a: str, b: str) -> float:
    """How alike two task texts are, 0..1 (case, spacing and punctuation ignored)."""
    left, right = normalise(a), normalise(b)
    if left == right:
        return 1.0
    return difflib.SequenceMatcher(None, left, right, autojunk=False).ratio()


def similar(a: str, b: str, threshold: float = REPEAT_SIMILARITY) -> bool:
    """``text_similarity(a, b) >= threshold``, decided from difflib's cheap upper bounds
    when they already fall short: most pairs differ in length or letters, and the full
    ratio is quadratic in the text."""
    return _Text(a).similar(_Text(b), threshold)


class _Text:
    """A text normalised once, with its letter counts: ``repeats`` compares each against
    many. The bounds are difflib's ``real_quick_ratio`` and ``quick_ratio``, computed
    without building a ``SequenceMatcher``, which indexes its second text up front."""

    def __init__(self, text: str):
        self.normal = normalise(text)

    @cached_property
    def counts(self) -> Counter[str]:
        return Counter(self.normal)

    def similar(self, other: _Text, threshold: float) -> bool:
        left, right = self.normal, other.normal
        if left == right:
            return True
        length = len(left) + len(right)
        if 2.0 * min(len(left), len(right)) / length < threshold:
            return False
        shared = (self.counts & other.counts).total()
        if 2.0 * shared / length < threshold:
            return False
        matcher = difflib.SequenceMatcher(None, left, right, autojunk=False)
        return matcher.ratio() >= threshold


def repeats(texts: Sequence[str], given: AbstractionInput) -> str | None:
    """Why a candidate repeats an existing task (its texts vs. neighbours and do-not-repeat), or None."""
    near = [(_Text(n.text), n) for n in given.neighbours]
    others = [(_Text(text), text) for text in given.context.do_not_repeat]
    for text in map(_Text, texts):
        for normal, neighbour in near:
            if text.similar(normal, REPEAT_SIMILARITY):
                return f"repeats existing task {neighbour.id}: {neighbour.text!r}"
        for normal, other in others:
            if text.similar(normal, REPEAT_SIMILARITY):
                return f"repeats a do-not-repeat task: {other!r}"
    return None


def actions_key(calls: Sequence[ToolCall], setup: Mapping[str, Any] | None = None) -> str:
    """The same key for the same calls on the same setup (a candidate's identity)."""
    payload = [[c.name, c.arguments] for c in calls]
    return json.dumps([payload, setup or {}], sort_keys=True, default=str)


def call_values(call: ToolCall) -> list[str]:
    """The string values a call passes that a text could state (two characters or more)."""
    return [v for v in call.arguments.values() if isinstance(v, str) and len(v.strip()) >= 2]


def mentions(text: str, value: str) -> bool:
    """``value`` appears in ``text`` as a whole token (``c3`` is not found in ``c31``)."""
    pattern = rf"(?<![\w-]){re.escape(value.strip())}(?![\w-])"
    return re.search(pattern, text, flags=re.IGNORECASE) is not None
