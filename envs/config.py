"""Configuration of the environment a run uses: which environment, and which of its task sets."""

from __future__ import annotations

from typing import Literal

from pydantic import Field, model_validator

from ..config_base import Section
from .bfcl import CATEGORIES as BFCL_CATEGORIES
from .bfcl import SPLITS as BFCL_SPLITS
from .world.families import SPLITS as WORLD_SPLITS


class EnvConfig(Section):
    """Which environment to run, and which of its task sets."""

    name: Literal["world", "bfcl"] = Field(
        default="world", description="Environment: the built-in world or BFCL."
    )
    split: str = Field(
        default="train",
        description=f"Task split the loop rolls out and trains on: world {', '.join(WORLD_SPLITS)}; "
        f"BFCL {', '.join(BFCL_SPLITS)} (half of the category each, or all of it).",
    )
    category: str = Field(
        default="multi_turn_base", description=f"BFCL category: {', '.join(BFCL_CATEGORIES)}."
    )
    seed: int = Field(default=0, description="Seed of the world's task generator.")

    @model_validator(mode="after")
    def _known_task_set(self) -> EnvConfig:
        if self.name == "world" and self.split not in WORLD_SPLITS:
            raise ValueError(
                f"split {self.split!r} is not a world split; allowed values: {', '.join(WORLD_SPLITS)}"
            )
        if self.name == "bfcl" and self.category not in BFCL_CATEGORIES:
            raise ValueError(
                f"category {self.category!r} is not a BFCL category; allowed values: {', '.join(BFCL_CATEGORIES)}"
            )
        if self.name == "bfcl" and self.split not in BFCL_SPLITS:
            raise ValueError(
                f"split {self.split!r} is not a BFCL split; allowed values: {', '.join(BFCL_SPLITS)}"
            )
        return self
