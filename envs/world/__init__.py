"""The built-in world: the embedded default environment."""

from .apps import APPS, TOOL_NAMES, World, tool_schemas
from .env import WorldEnvironment, verify
from .families import FAMILIES
from .splits import DEFAULT_SIZES, family_counts, load_split, make_task
from .states import SPLITS, pools_for

__all__ = [
    "APPS",
    "DEFAULT_SIZES",
    "FAMILIES",
    "SPLITS",
    "TOOL_NAMES",
    "World",
    "WorldEnvironment",
    "family_counts",
    "load_split",
    "make_task",
    "pools_for",
    "tool_schemas",
    "verify",
]
