"""What every config section shares: its base model and the error a bad config raises.

The section models live beside the code they configure (``envs/config.py``,
``agents/config.py``, ``graph/synthesis/config.py``, ``training/config.py``, ...);
``coevolve.config`` composes them into ``CoevolveConfig`` and loads YAML. This
module sits below all of them, so a section never imports the composition.
"""

from __future__ import annotations

import warnings
from typing import Any, ClassVar, TypeVar

from pydantic import BaseModel, ConfigDict, model_validator


class ConfigError(ValueError):
    """A configuration that cannot be used; the message says what to change."""


class Section(BaseModel):
    model_config = ConfigDict(extra="forbid", validate_assignment=True)

    # Old key -> new key of a renamed field ("section.key" when it moved into a section): the
    # old one still works for one release, with a FutureWarning that says how to migrate.
    renamed: ClassVar[dict[str, str]] = {}

    @model_validator(mode="before")
    @classmethod
    def _renamed_keys(cls, data: Any) -> Any:
        if not cls.renamed or not isinstance(data, dict):
            return data
        data = dict(data)
        for old, new in cls.renamed.items():
            if old not in data:
                continue
            section, _, key = new.rpartition(".")
            target = data
            if section:
                inner = data.get(section) or {}
                if isinstance(inner, BaseModel):
                    inner = inner.model_dump(exclude_unset=True)
                target = data[section] = dict(inner)
            if (key or new) in target:
                raise ValueError(f"{old!r} is the old name of {new!r}: give {new!r} only")
            warnings.warn(
                f"config key {old!r} of {cls.__name__} is now {new!r}: rename it (the old name "
                "still works for one release)",
                FutureWarning,
                stacklevel=2,
            )
            target[key or new] = data.pop(old)
        return data


Value = TypeVar("Value")


def renamed_keyword(owner: str, **given: Value | None) -> Value:
    """A keyword argument of ``owner`` given by its name or, for one release, by its old
    name, with a FutureWarning that says how to migrate (as a renamed config key).
    ``given`` holds the two, the new name first: ``renamed_keyword("F", new=n, old=o)``."""
    (new, value), (old, old_value) = given.items()
    if old_value is None:
        if value is None:
            raise TypeError(f"{owner}() needs {new}")
        return value
    if value is not None:
        raise TypeError(f"{old!r} is the old name of {new!r}: give {new} only")
    warnings.warn(
        f"{owner}({old}=) is now {new}: rename it (the old name still works for one release)",
        FutureWarning,
        stacklevel=3,
    )
    return old_value


def merged(base: dict[str, Any], changes: dict[str, Any]) -> dict[str, Any]:
    """``base`` with ``changes`` laid over it, section by section at every depth."""
    out = dict(base)
    for key, value in changes.items():
        inner = out.get(key)
        out[key] = (
            merged(inner, value) if isinstance(value, dict) and isinstance(inner, dict) else value
        )
    return out
