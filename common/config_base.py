"""What every config section shares: its base model and the error a bad config raises.

The section models live beside the code they configure (``envs/config.py``,
``agents/config.py``, ``graph/synthesis/config.py``, ``training/config.py``, ...);
``coevolve.config`` composes them into ``CoevolveConfig`` and loads YAML. This
module sits below all of them, so a section never imports the composition.
"""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, ConfigDict


class ConfigError(ValueError):
    """A configuration that cannot be used; the message says what to change."""


class Section(BaseModel):
    model_config = ConfigDict(extra="forbid", validate_assignment=True)


def merged(base: dict[str, Any], changes: dict[str, Any]) -> dict[str, Any]:
    """``base`` with ``changes`` laid over it, section by section at every depth."""
    out = dict(base)
    for key, value in changes.items():
        inner = out.get(key)
        out[key] = (
            merged(inner, value) if isinstance(value, dict) and isinstance(inner, dict) else value
        )
    return out
