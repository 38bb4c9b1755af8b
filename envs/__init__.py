"""Executable environments: the built-in world and BFCL multi-turn (``envs/registry.py``
lists them: ``get_environment(name)``)."""

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
from .parsing import ToolCallParseError, check_arguments, parse_tool_calls, render_call

__all__ = [
    "CheckReport",
    "Environment",
    "ToolCallParseError",
    "ToolEnvironment",
    "ToolError",
    "check_arguments",
    "check_references",
    "default_action_pattern",
    "parse_tool_calls",
    "render_call",
    "replay_reference",
]
