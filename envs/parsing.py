"""Turn model output into tool calls, safely, and check arguments against a schema.

Every environment goes through this one parser. It accepts the shapes models
actually emit:

* OpenAI tool-call objects: ``{"function": {"name": ..., "arguments": "<json>"}}``
  or ``{"name": ..., "arguments": {...}}``;
* the same as JSON text, optionally inside ``<tool_call>...</tool_call>`` tags,
  one object or a list;
* Python call syntax, one call or a list: ``find_contact(name="Ana")``,
  ``[cd(folder='a'), ls()]`` (the compact rendering and BFCL's format).

Model output is data: Python syntax is read with ``ast.parse`` and each argument
with ``ast.literal_eval`` (literals only), never executed.
"""

from __future__ import annotations

import ast
import json
import re
from collections.abc import Mapping, Sequence
from typing import Any

from ..records import ToolCall

# The error kind of model text that looks like a tool call (a JSON object naming a tool,
# a fenced block holding one) but that no form the reader accepts could read: a failed
# call, never the answer (agents/policy/policy_interface.py, ``parse_assistant_text``).
UNREADABLE_CALL = "unreadable_call"

_TOOL_CALL_TAG = re.compile(r"<tool_call>\s*(.*?)\s*(?:</tool_call>|$)", re.DOTALL)
_FENCE = re.compile(r"^```(?:json|python|tool_code)?\s*(.*?)\s*```$", re.DOTALL)


class ToolCallParseError(ValueError):
    """Model output that is not a tool call. ``kind`` names what was wrong."""

    def __init__(self, kind: str, message: str):
        super().__init__(message)
        self.kind = kind


def parse_tool_calls(output: str | Mapping[str, Any] | Sequence[Any]) -> list[ToolCall]:
    """Parse model output into tool calls, or raise ToolCallParseError."""
    if isinstance(output, Mapping):
        return [_call_from_mapping(output)]
    if not isinstance(output, str):
        if isinstance(output, Sequence):
            return [call for item in output for call in parse_tool_calls(item)]
        raise ToolCallParseError(
            "parse_error", f"cannot read a tool call from {type(output).__name__}"
        )

    text = output.strip()
    if not text:
        raise ToolCallParseError("parse_error", "empty output: expected a tool call")
    fenced = _FENCE.match(text)
    if fenced:
        text = fenced.group(1).strip()
    try:
        return _parse_text(text)
    except ToolCallParseError:
        # Only text that is not itself a call is searched for <tool_call> blocks: an
        # argument value may contain the tag's characters.
        tagged = _TOOL_CALL_TAG.findall(text)
        if not tagged:
            raise
    return [call for body in tagged for call in _parse_text(body.strip())]


def _parse_text(text: str) -> list[ToolCall]:
    if text.startswith(("{", "[{")) or text == "[]":
        try:
            data = json.loads(text)
        except json.JSONDecodeError as err:
            raise ToolCallParseError(
                "bad_json", f"tool call is not valid JSON: {err.msg} at char {err.pos}"
            ) from None
        if isinstance(data, list):
            return [_call_from_mapping(item) for item in data]
        return [_call_from_mapping(data)]
    return _parse_python_calls(text)


def _call_from_mapping(data: Any) -> ToolCall:
    if not isinstance(data, Mapping):
        raise ToolCallParseError(
            "parse_error", f"expected a tool call object, got {type(data).__name__}"
        )
    function = data.get("function", data)
    if not isinstance(function, Mapping):
        raise ToolCallParseError(
            "parse_error", "'function' must be an object with 'name' and 'arguments'"
        )
    name = function.get("name")
    if not isinstance(name, str) or not name:
        raise ToolCallParseError("parse_error", "tool call has no 'name'")
    arguments = function.get("arguments", function.get("parameters", {}))
    if arguments is None:
        arguments = {}
    if isinstance(arguments, str):
        try:
            arguments = json.loads(arguments) if arguments.strip() else {}
        except json.JSONDecodeError as err:
            raise ToolCallParseError(
                "bad_json", f"arguments of '{name}' are not valid JSON: {err.msg} at char {err.pos}"
            ) from None
    if not isinstance(arguments, dict):
        raise ToolCallParseError("bad_arguments", f"arguments of '{name}' must be an object")
    call_id = data.get("id")
    return ToolCall(
        name=name, arguments=arguments, id=call_id if isinstance(call_id, str) else None
    )


def _parse_python_calls(text: str) -> list[ToolCall]:
    try:
        tree = ast.parse(text, mode="eval")
    except SyntaxError as err:
        raise ToolCallParseError("parse_error", f"not a tool call: {err.msg}") from None
    node = tree.body
    nodes = node.elts if isinstance(node, ast.List | ast.Tuple) else [node]
    return [_call_from_ast(item) for item in nodes]


def _call_from_ast(node: ast.expr) -> ToolCall:
    if not isinstance(node, ast.Call):
        raise ToolCallParseError("parse_error", "expected a call like tool_name(arg=value)")
    name = _dotted_name(node.func)
    if node.args:
        raise ToolCallParseError(
            "bad_arguments", f"'{name}' got positional arguments; pass every argument by name"
        )
    arguments: dict[str, Any] = {}
    for keyword in node.keywords:
        if keyword.arg is None:
            raise ToolCallParseError(
                "bad_arguments", f"'{name}' got **kwargs; pass arguments by name"
            )
        try:
            value = ast.literal_eval(keyword.value)
        except (ValueError, TypeError, SyntaxError, MemoryError, RecursionError):
            raise ToolCallParseError(
                "bad_arguments", f"argument '{keyword.arg}' of '{name}' is not a literal value"
            ) from None
        arguments[keyword.arg] = _jsonable(value)
    return ToolCall(name=name, arguments=arguments)


def _dotted_name(node: ast.expr) -> str:
    if isinstance(node, ast.Name):
        return node.id
    if isinstance(node, ast.Attribute):
        return f"{_dotted_name(node.value)}.{node.attr}"
    raise ToolCallParseError("parse_error", "tool name must be a plain identifier")


def _jsonable(value: Any) -> Any:
    """Tuples and sets become lists so arguments stay JSON-representable."""
    if isinstance(value, list | tuple | set | frozenset):
        return [_jsonable(v) for v in value]
    if isinstance(value, dict):
        return {str(k): _jsonable(v) for k, v in value.items()}
    if isinstance(value, bytes | complex):
        raise ToolCallParseError(
            "bad_arguments", f"unsupported literal type {type(value).__name__}"
        )
    return value


# --------------------------------------------------------------------------- rendering


def render_call(call: ToolCall) -> str:
    """The compact rendering: ``name(key="value", n=3)``; parse_tool_calls reads it back."""
    args = ", ".join(f"{key}={_render_value(value)}" for key, value in call.arguments.items())
    return f"{call.name}({args})"


def _render_value(value: Any) -> str:
    """Python literal syntax (so ast.literal_eval reads it), with JSON-style double quotes."""
    if isinstance(value, str):
        return json.dumps(value, ensure_ascii=False)
    if isinstance(value, list | tuple):
        return "[" + ", ".join(_render_value(v) for v in value) + "]"
    if isinstance(value, dict):
        items = (
            f"{json.dumps(str(k), ensure_ascii=False)}: {_render_value(v)}"
            for k, v in value.items()
        )
        return "{" + ", ".join(items) + "}"
    return repr(value)


# --------------------------------------------------------------------------- validation

_JSON_TYPES: dict[str, tuple[type, ...]] = {
    "string": (str,),
    "integer": (int,),
    "number": (int, float),
    "boolean": (bool,),
    "array": (list,),
    "object": (dict,),
    "null": (type(None),),
}


def check_arguments(arguments: Mapping[str, Any], parameters: Mapping[str, Any]) -> str | None:
    """Check arguments against an OpenAI function ``parameters`` schema.

    Returns a message naming the problem, or None when the arguments fit.
    """
    properties: Mapping[str, Any] = parameters.get("properties", {}) or {}
    unknown = [key for key in arguments if key not in properties]
    if unknown:
        allowed = ", ".join(properties) or "none"
        return f"unknown argument {unknown[0]!r}; allowed: {allowed}"
    missing = [key for key in parameters.get("required", []) if key not in arguments]
    if missing:
        return f"missing required argument {missing[0]!r}"
    for key, value in arguments.items():
        problem = _check_value(value, properties[key])
        if problem:
            return f"argument {key!r} {problem}"
    return None


def _check_value(value: Any, schema: Mapping[str, Any]) -> str | None:
    expected = schema.get("type")
    if expected is not None:
        kinds = [expected] if isinstance(expected, str) else list(expected)
        if not any(_is_type(value, kind) for kind in kinds):
            return f"must be {' or '.join(kinds)}, got {_json_type_name(value)} {value!r:.40}"
    if "enum" in schema and value not in schema["enum"]:
        return f"must be one of {schema['enum']}, got {value!r:.40}"
    if isinstance(value, list) and isinstance(schema.get("items"), Mapping):
        for index, item in enumerate(value):
            problem = _check_value(item, schema["items"])
            if problem:
                return f"item {index} {problem}"
    return None


def _is_type(value: Any, kind: str) -> bool:
    if kind in ("integer", "number") and isinstance(value, bool):
        return False
    if kind == "integer" and isinstance(value, float):
        return value.is_integer()
    python_types = _JSON_TYPES.get(kind)
    return True if python_types is None else isinstance(value, python_types)


def _json_type_name(value: Any) -> str:
    for name, python_types in _JSON_TYPES.items():
        if isinstance(value, python_types) and not (
            name in ("integer", "number") and isinstance(value, bool)
        ):
            return name
    return type(value).__name__
