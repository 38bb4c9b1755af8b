"""Configuration of the environment a run uses: which environment, and which of its task sets."""

from __future__ import annotations

from pydantic import Field, model_validator

from ..common.config_base import Section
from .limits import (
    DEFAULT_MAX_OBSERVATION_CHARS,
    DEFAULT_TOOL_TIMEOUT_S,
    ToolLimits,
    set_tool_limits,
)
from .registry import ENVIRONMENTS, get_environment, per_environment
from .user_env import find_user_environment, register_user_environment


class EnvConfig(Section):
    """Which environment to run, and which of its task sets."""

    # The registry's names (envs/registry.py), or a user's environment it finds.
    name: str = Field(
        default="world",
        description="Environment: world, bfcl, a user's environment by import path "
        "(mytools.env:make_env) or coevolve.environments entry point, or a module of tool "
        "functions with env.tasks (docs/environments.md).",
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
    seed: int = Field(
        default=0,
        description="Seed of the world's task generator, and of the splits cut from a task file.",
    )
    tasks: str | None = Field(
        default=None,
        description="A user's environment: its JSONL task file (relative to the working "
        "directory), replacing the one its factory names; needed with a module of tool "
        "functions.",
    )

    tool_timeout_s: float = Field(
        default=DEFAULT_TOOL_TIMEOUT_S,
        gt=0,
        description="Seconds a tool call may take: one past it is answered with an error "
        "of kind timeout naming the tool and the limit, and the episode goes on "
        "(docs/environments.md, what a tool may do).",
    )
    max_observation_chars: int = Field(
        default=DEFAULT_MAX_OBSERVATION_CHARS,
        ge=100,
        description="Characters of a tool's observation the agent sees; the rest is cut, "
        "marked in the text and counted (observations_cut); the verifier and the replays "
        "see it whole.",
    )

    @model_validator(mode="after")
    def _process_limits(self) -> EnvConfig:
        # Every path that runs a tool reads them at the call (envs/limits.py).
        set_tool_limits(ToolLimits(self.tool_timeout_s, self.max_observation_chars))
        return self

    @model_validator(mode="after")
    def _known_task_set(self) -> EnvConfig:
        if self.tasks is not None:
            if self.name in ENVIRONMENTS:
                raise ValueError(f"env.tasks is for a user's environment, not {self.name!r}")
            register_user_environment(self.name, self.tasks)
        spec = get_environment(self.name)
        user = find_user_environment(self.name) if self.name not in ENVIRONMENTS else None
        if user is not None:  # a run never starts on tasks whose references do not replay
            user.refuse_if_broken()
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
