"""Configuration of the environment a run uses: which environment, and which of its task sets."""

from __future__ import annotations

from typing import Literal

from pydantic import Field, model_validator

from ..common.config_base import Section
from .registry import get_environment, per_environment


class EnvConfig(Section):
    """Which environment to run, and which of its task sets."""

    # The registry's names (envs/registry.py); tests/test_registry.py checks they agree.
    name: Literal["world", "bfcl"] = Field(
        default="world", description="Environment: the built-in world or BFCL."
    )
    split: str = Field(
        default="train",
        description="Task split the loop rolls out and trains on: "
        f"{per_environment(lambda spec: (spec.splits, spec.split_note))}.",
    )
    category: str = Field(
        default="multi_turn_base",
        description="Task category, where the environment has them: "
        f"{per_environment(lambda spec: (spec.categories, ''))}.",
    )
    seed: int = Field(default=0, description="Seed of the world's task generator.")

    @model_validator(mode="after")
    def _known_task_set(self) -> EnvConfig:
        spec = get_environment(self.name)
        if spec.categories and self.category not in spec.categories:
            raise ValueError(
                f"category {self.category!r} is not a {spec.title} category; allowed values: "
                f"{', '.join(spec.categories)}"
            )
        if self.split not in spec.splits:
            raise ValueError(
                f"split {self.split!r} is not a {spec.title} split; allowed values: "
                f"{', '.join(spec.splits)}"
            )
        return self
