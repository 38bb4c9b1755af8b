"""Reading JSON from model text in linear time, tolerantly.

``parse_json_reply`` reads an instance of a pydantic schema from a reply:
code fences, prose around the object, a bare list where an object holding one
list was asked for, unknown top-level keys. One scan finds the balanced
``{...}``/``[...]`` spans (``balanced_spans``), and each is handed to
``json.loads`` once (``iter_json_values``), so a long reply costs time in
proportion to its length. Model text is data: it is read with ``json``, never
evaluated.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from typing import Any, TypeVar

from pydantic import BaseModel, ValidationError

SchemaT = TypeVar("SchemaT", bound=BaseModel)


def parse_json_reply(text: str, schema: type[SchemaT]) -> SchemaT:
    """Read an instance of ``schema`` from model text; ValueError says why not."""
    if not text or not text.strip():
        raise ValueError("the reply is empty")
    errors: list[str] = []
    for data in iter_json_values(text):
        try:
            return schema.model_validate(_fit(data, schema))
        except ValidationError as err:
            errors.append(_short_validation(err))
    if errors:
        raise ValueError(f"JSON does not fit {schema.__name__}: {errors[0]}")
    raise ValueError("no JSON object in the reply")


_FENCE = re.compile(r"```[a-zA-Z0-9_-]*\s*\n?(.*?)```", re.DOTALL)
_CLOSERS = {"{": "}", "[": "]"}
# How many values iter_json_values returns at most.
_MAX_VALUES = 8
# How many nested objects and lists of one parsed value are offered.
_NESTED_VISITS = 64


@dataclass
class _Span:
    """A balanced ``{...}`` or ``[...]`` in the text, and the balanced spans directly inside."""

    start: int
    end: int = -1
    children: list[_Span] = field(default_factory=list)


def balanced_spans(text: str) -> list[_Span]:
    """The outermost balanced bracket spans of ``text``, in order, in one pass.

    Brackets inside JSON strings (with escapes) do not count; quotes outside
    any bracket are prose and do not start strings. A closing bracket that
    does not match, or the end of the text, abandons the open brackets and
    promotes their finished inner spans to outermost ones, so JSON after prose
    such as "{ not json" is still found.
    """
    top: list[_Span] = []
    stack: list[tuple[str, _Span]] = []  # (expected closer, span)

    def abandon_open() -> None:
        for _closer, span in stack:  # bottom first: their finished children are in order
            top.extend(span.children)
        stack.clear()

    in_string = escaped = False
    for index, char in enumerate(text):
        if in_string:
            if escaped:
                escaped = False
            elif char == "\\":
                escaped = True
            elif char == '"':
                in_string = False
        elif char in _CLOSERS:
            stack.append((_CLOSERS[char], _Span(index)))
        elif not stack:
            continue
        elif char == '"':
            in_string = True
        elif char in "}]":
            closer, span = stack[-1]
            if char != closer:
                abandon_open()
                continue
            stack.pop()
            span.end = index + 1
            (stack[-1][1].children if stack else top).append(span)
    abandon_open()
    return top


def iter_json_values(text: str) -> list[Any]:
    """JSON objects and lists found in model text, in linear time: fenced blocks first, then
    the text; for each, its outermost balanced spans in order.

    A span that parses gives its value and then the objects and lists nested in
    it (without parsing again); a span that does not gives what its inner spans
    hold. The characters handed to ``json.loads`` are bounded by a small
    multiple of the text's length, so a long reply costs time in proportion to
    its length (langchain-core's partial-JSON parser takes time in its square).
    """
    sources = [block for block in _FENCE.findall(text) if block.strip()] + [text]
    found: list[Any] = []
    seen: set[str] = set()
    budget = 4 * sum(len(source) for source in sources)

    def add(value: Any) -> bool:
        """Record a value; True when enough were found."""
        try:
            key = json.dumps(value, sort_keys=True, default=str)
        except (ValueError, RecursionError):
            return False
        if key not in seen:
            seen.add(key)
            found.append(value)
        return len(found) >= _MAX_VALUES

    def add_nested(value: Any) -> bool:
        # Depth first, in text order, as the spans would be; two levels deep and
        # _NESTED_VISITS values at most, so the serialising in add() stays linear.
        pending = [(value, 0)]
        visits = 0
        while pending and visits < _NESTED_VISITS:
            item, depth = pending.pop()
            visits += 1
            if add(item):
                return True
            if depth < 2:
                children = list(item.values() if isinstance(item, dict) else item)
                pending += [
                    (c, depth + 1) for c in reversed(children) if isinstance(c, dict | list)
                ]
        return False

    def visit(source: str, spans: list[_Span]) -> bool:
        nonlocal budget
        for span in spans:
            if budget <= 0:
                return True
            budget -= span.end - span.start
            try:
                value = json.loads(source[span.start : span.end])
            except (ValueError, RecursionError):
                if visit(source, span.children):
                    return True
                continue
            if add_nested(value):
                return True
        return False

    for source in sources:
        if visit(source, balanced_spans(source)):
            break
    return found


def _fit(data: Any, schema: type[BaseModel]) -> Any:
    """Tolerate the usual near-misses: a bare list for a one-list schema, unknown keys."""
    fields = schema.model_fields
    if isinstance(data, list):
        lists = [name for name, field in fields.items() if _is_list(field.annotation)]
        if len(lists) == 1:
            return {lists[0]: data}
        return data
    if isinstance(data, dict) and len(data) == 1:
        [(only_key, only_value)] = data.items()
        if only_key not in fields:
            if isinstance(only_value, dict):
                data = only_value  # {"SynthesisContext": {...}}
            elif isinstance(only_value, list):
                return _fit(only_value, schema)  # {"tasks": [...]} for {"candidates": [...]}
    if not isinstance(data, dict):
        return data
    if schema.model_config.get("extra") == "forbid":
        data = {key: value for key, value in data.items() if key in fields}
    # A lone string where a list of strings belongs: ["that string"].
    return {
        key: [value]
        if isinstance(value, str) and key in fields and _is_list(fields[key].annotation)
        else value
        for key, value in data.items()
    }


def _is_list(annotation: Any) -> bool:
    return getattr(annotation, "__origin__", None) is list or annotation is list


def _short_validation(err: ValidationError) -> str:
    first = err.errors()[0]
    where = ".".join(str(part) for part in first["loc"]) or "(top level)"
    return f"{where}: {first['msg']} ({len(err.errors())} problem(s))"
