"""Values in text: whole-token matching and rewriting, and where in an observation a
copied value was read (so a variant reads it again at the same place)."""

from __future__ import annotations

import functools
import json
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

# Whole tokens: "c3" is not in "c31", "30" is not in "09:30", "kent" not in "dev.kent@x".
_LEFT, _RIGHT = r"(?<![\w@.:/-])", r"(?![\w@/-]|[.:]\w)"
_FIELD = re.compile(r"(?<!\S)([A-Za-z_][\w.-]*)=")


# --------------------------------------------------------------------------- text


def names(text: str, value: object) -> bool:
    """``value`` appears in ``text`` as a whole token, any case, maybe plural."""
    return _pattern((str(value),)).search(text) is not None


@functools.lru_cache(maxsize=8192)
def _pattern(olds: tuple[str, ...]) -> re.Pattern[str]:
    alternatives = "|".join(re.escape(old.strip()) for old in sorted(olds, key=len, reverse=True))
    article, plural = r"(?:\b(an?) )?", r"((?<=[a-z])(?:es|s))?"
    return re.compile(article + _LEFT + f"({alternatives})" + plural + _RIGHT, re.IGNORECASE)


def replace_values(text: str, mapping: Mapping[str, str]) -> str:
    """Every whole-token occurrence of an old value replaced by its new one, in one pass (so
    a -> b, b -> c swaps), keeping a capital first letter and a plural ending, and
    fitting "a"/"an" before it."""
    if not mapping:
        return text
    lookup = {old.strip().casefold(): new for old, new in mapping.items()}

    def swap(match: re.Match[str]) -> str:
        article, found, plural = match.group(1), match.group(2), match.group(3) or ""
        new = lookup[found.casefold()]
        if found[:1].isupper() and new[:1].islower() and found != found.upper():
            new = new[:1].upper() + new[1:]
        if plural:  # "2 lotions" -> "3 socks", "3 wrenches"
            plural = (
                "" if new.endswith("s") else "es" if new.endswith(("x", "z", "ch", "sh")) else "s"
            )
        if article:  # "a login ticket" -> "an other ticket"
            article = article[0] + ("n" if new[:1].casefold() in "aeiou" else "") + " "
        return (article or "") + new + plural

    return _pattern(tuple(mapping)).sub(swap, text)


def fields(row: str) -> list[tuple[str, str]]:
    """``key=value`` pairs of an observation line; quoted values unquoted, a bare value runs
    to the next ``key=`` (``name=Dev Kent email=...``)."""
    marks = list(_FIELD.finditer(row))
    found = []
    for mark, after in zip(marks, [*marks[1:], None], strict=False):
        raw = row[mark.end() : after.start() if after else len(row)].strip()
        if raw.startswith('"'):
            try:
                raw = str(json.loads(raw))
            except ValueError:
                raw = raw.strip('"')
        found.append((mark.group(1), raw))
    return found


def row_tokens(row: str) -> list[str]:
    return [word.strip(".,;:!?()'\"") for word in row.split()]


# --------------------------------------------------------------------------- places


@dataclass(frozen=True)
class Place:
    """Where in an earlier observation a copied value was read."""

    step: int
    row: int  # the line; -1 for the last of several
    key: str | None  # the field's name; None: the token at ``token``
    token: int = 0
    row_by: str | None = None  # the line is the one holding this slot's (old) value


def find_place(
    value: str, observations: Sequence[str], before: int, slots: Sequence[str]
) -> Place | None:
    """The latest observation before call ``before`` that shows ``value``, and where."""
    for step in range(before - 1, -1, -1):
        rows = observations[step].splitlines()
        for index, row in enumerate(rows):
            key = next((k for k, v in fields(row) if v.casefold() == value.casefold()), None)
            tokens = [t.casefold() for t in row_tokens(row)]
            if key is None and value.casefold() not in tokens:
                continue
            token = tokens.index(value.casefold()) if key is None else 0
            # several lines: the one a slot picks, else the same position (last stays last)
            by = next(
                (s for s in slots if names(row, s) and sum(names(r, s) for r in rows) == 1), None
            )
            last = len(rows) > 1 and index == len(rows) - 1
            return Place(step, -1 if last else index, key, token, by if len(rows) > 1 else None)
    return None


def read_place(
    place: Place, observations: Sequence[str], slot_map: Mapping[str, str]
) -> str | None:
    """The value at ``place`` in the variant's observations; None when it is not there."""
    rows = observations[place.step].splitlines()
    if place.row_by is not None:
        holding = [row for row in rows if names(row, slot_map.get(place.row_by, place.row_by))]
        rows, row_index = holding, 0 if len(holding) == 1 else len(holding)
    else:
        row_index = place.row if place.row >= 0 else len(rows) - 1
    if not 0 <= row_index < len(rows):
        return None
    row = rows[row_index]
    if place.key is not None:
        return next((v for k, v in fields(row) if k == place.key), None)
    tokens = row_tokens(row)
    return tokens[place.token] if place.token < len(tokens) else None
