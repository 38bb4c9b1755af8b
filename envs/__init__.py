"""Executable environments: the built-in world and BFCL multi-turn (``envs/registry.py``
lists them: ``get_environment(name)``), and a user's own from plain Python
(``FunctionEnvironment``: tools as typed functions, tasks as JSONL; docs/environments.md)."""

from __future__ import annotations

from .base import (
    CheckReport,
    Environment,
    ToolEnvironment,
    ToolError,
    check_references,
    default_action_pattern,
    replay_reference,
)
from .function_tools import FunctionEnvironment, function_schema
from .parsing import ToolCallParseError, check_arguments, parse_tool_calls, render_call

__all__ = [
    "CheckReport",
    "Environment",
    "FunctionEnvironment",
    "ToolCallParseError",
    "ToolEnvironment",
    "ToolError",
    "check_arguments",
    "check_references",
    "default_action_pattern",
    "function_schema",
    "parse_tool_calls",
    "render_call",
    "replay_reference",
]
