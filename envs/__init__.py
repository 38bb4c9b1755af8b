"""Executable environments: the built-in world and BFCL multi-turn."""

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

ENVIRONMENTS = ("world", "bfcl")

__all__ = [
    "ENVIRONMENTS",
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
