"""What ``bfcl-eval`` ships for BFCL's tools: their classes and their schemas.

A tool class by name (``tool_class``), its public methods (``class_methods``),
and their func docs turned into OpenAI function schemas (``class_schemas``),
with BFCL's own types mapped to JSON-schema types and the docs' known errata
fixed. ``bfcl_eval`` is imported inside functions only (``require_bfcl``).
"""

from __future__ import annotations

import copy
import importlib
import inspect
from collections.abc import Mapping
from functools import cache
from pathlib import Path
from typing import Any

from ..common.files import read_jsonl
from .bfcl_checking import require_bfcl

# BFCL func-doc types that are not JSON-schema types. "any" maps to no type at
# all, so the argument check accepts every value, as BFCL itself does.
_TYPE_MAP: dict[str, str | None] = {
    "dict": "object",
    "float": "number",
    "tuple": "array",
    "list": "array",
    "bool": "boolean",
    "any": None,
}

# Where BFCL's func docs disagree with BFCL's own data, by (class, parameter):
# some initial configs hold tickets with string ids ("ticket_001") that the
# ground truth closes by that id, while the doc says integer.
_SCHEMA_ERRATA: dict[tuple[str, str], dict[str, Any]] = {
    ("TicketAPI", "ticket_id"): {"type": ["integer", "string"]},
}


def data_dir() -> Path:
    return Path(require_bfcl().__path__[0]) / "data"


@cache
def tool_class(class_name: str) -> type:
    """The BFCL class, imported from the module BFCL's own executor uses."""
    require_bfcl()
    from bfcl_eval.constants.executable_backend_config import CLASS_FILE_PATH_MAPPING

    if class_name not in CLASS_FILE_PATH_MAPPING:
        raise ValueError(f"unknown BFCL class {class_name!r}")
    module = importlib.import_module(CLASS_FILE_PATH_MAPPING[class_name])
    return getattr(module, class_name)


@cache
def class_methods(class_name: str) -> tuple[str, ...]:
    """Public method names, the set BFCL's executor lets calls reach."""
    cls = tool_class(class_name)
    return tuple(
        name for name, _ in inspect.getmembers(cls, inspect.isfunction) if not name.startswith("_")
    )


@cache
def class_schemas(class_name: str) -> tuple[dict[str, Any], ...]:
    """The class's tools in OpenAI format, converted once from BFCL's func doc."""
    require_bfcl()
    from bfcl_eval.constants.executable_backend_config import MULTI_TURN_FUNC_DOC_FILE_MAPPING

    path = data_dir() / "multi_turn_func_doc" / MULTI_TURN_FUNC_DOC_FILE_MAPPING[class_name]
    schemas = tuple(_openai_schema(doc) for doc in read_jsonl(path))
    for schema in schemas:
        properties = schema["function"]["parameters"]["properties"]
        for name, prop in properties.items():
            prop.update(copy.deepcopy(_SCHEMA_ERRATA.get((class_name, name), {})))
    return schemas


def _openai_schema(doc: Mapping[str, Any]) -> dict[str, Any]:
    parameters = _convert_types(doc.get("parameters", {}))
    parameters["type"] = "object"
    parameters.setdefault("properties", {})
    parameters.setdefault("required", [])
    return {
        "type": "function",
        "function": {
            "name": doc["name"],
            "description": doc.get("description", ""),
            "parameters": parameters,
        },
    }


def _convert_types(schema: Mapping[str, Any]) -> dict[str, Any]:
    """BFCL's schema dialect to JSON schema, keeping descriptions, enums, defaults."""
    converted: dict[str, Any] = {}
    for key, value in schema.items():
        if key == "type" and isinstance(value, str):
            mapped = _TYPE_MAP.get(value, value)
            if mapped is not None:
                converted["type"] = mapped
        elif key == "properties" and isinstance(value, Mapping):
            converted[key] = {name: _convert_types(sub) for name, sub in value.items()}
        elif key == "items" and isinstance(value, Mapping):
            converted[key] = _convert_types(value)
        else:
            converted[key] = copy.deepcopy(value)
    return converted


def additional_function_prompt() -> str:
    require_bfcl()
    from bfcl_eval.constants.default_prompts import DEFAULT_USER_PROMPT_FOR_ADDITIONAL_FUNCTION_FC

    return DEFAULT_USER_PROMPT_FOR_ADDITIONAL_FUNCTION_FC
