"""What the ``coevolve`` subcommands share: consoles, the error exit, the --set option,
task sets by environment, loading a policy from --policy, paths as reports record them."""

from __future__ import annotations

import sys
from collections.abc import Iterable
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import typer
from rich.console import Console

if TYPE_CHECKING:
    from ..envs.base import Environment
    from ..records import Task

# The package's directory (configs/, langgraph.json).
PACKAGE_DIR = Path(__file__).resolve().parent.parent

# Piped output (CI logs, `| tee`) would otherwise wrap tables at 80 columns.
console = Console() if sys.stdout.isatty() else Console(width=120)
err_console = Console(stderr=True)

ENV_DESCRIPTIONS = {
    "world": "built-in world: contacts, messages, calendar, notes, shop, wallet, reminders",
    "bfcl": "BFCL multi-turn (from the bfcl-eval package), scored by its official checker",
}


SetOption = Annotated[
    list[str] | None,
    typer.Option(
        "--set",
        metavar="KEY=VALUE",
        help="Override one config value, e.g. --set training.max_steps=10 --set rollout.k=8 "
        "(repeatable; the value is YAML: 10, 0.5, true, [tensorboard]).",
    ),
]


def fail(message: str, code: int = 2) -> typer.Exit:
    """Print ``error: message`` on one line (not wrapped, not read as markup); the exit to raise."""
    from rich.markup import escape

    err_console.print(f"[red]error:[/red] {escape(message)}", soft_wrap=True)
    return typer.Exit(code)


def world_scopes(split: str | None) -> list[str]:
    from ..envs.world import SPLITS

    if split is None:
        return list(SPLITS)
    if split not in SPLITS:
        raise fail(f"unknown world split {split!r}; allowed: {', '.join(SPLITS)}")
    return [split]


def bfcl_scopes(category: str | None) -> list[str]:
    from ..envs.bfcl import CATEGORIES

    if category is None:
        return list(CATEGORIES)
    if category not in CATEGORIES:
        raise fail(f"unknown BFCL category {category!r}; allowed: {', '.join(CATEGORIES)}")
    return [category]


def env_scopes(env: str, split: str | None, category: str | None) -> tuple[list[str], str]:
    """The task sets named by --split / --category, and which of the two it was."""
    if env == "world":
        if category is not None:
            raise fail("--category is for bfcl; the world has --split")
        return world_scopes(split), "split"
    if env == "bfcl":
        if split is not None:
            raise fail("--split is for the world; bfcl has --category")
        return bfcl_scopes(category), "category"
    raise fail(f"unknown environment {env!r}; allowed: world, bfcl")


def load_env_tasks(env: str, scope: str) -> tuple[type[Environment] | Any, list[Task]]:
    """The environment class and the tasks of one split (world) or category (BFCL)."""
    if env == "world":
        from ..envs.world import WorldEnvironment, load_split

        return WorldEnvironment, load_split(scope)
    from ..envs.bfcl import BfclEnvironment, load_tasks, require_bfcl

    require_bfcl()
    return BfclEnvironment, load_tasks(scope)


def task_progress(description: str, enabled: bool):
    def wrap(items: list[Task]) -> Iterable[Task]:
        if not enabled:
            return items
        from rich.progress import track

        return track(items, description=description, console=err_console, transient=True)

    return wrap


def load_policy(spec: str, config_path: str | None = None) -> Any:
    """A policy from --policy: 'oracle', 'bootstrap', a model directory, or a YAML config."""
    from pathlib import Path

    from ..config import CoevolveConfig, load_config

    if spec == "oracle":
        from ..agents.oracle import OraclePolicy

        return OraclePolicy()
    config = CoevolveConfig()
    if spec.endswith((".yaml", ".yml")):
        config = load_config(spec)
    elif spec != "bootstrap":
        if not Path(spec).is_dir():
            raise fail(
                f"--policy {spec!r} is not 'oracle', 'bootstrap', a model directory or a YAML config"
            )
        config = config.model_copy(
            update={"policy": config.policy.model_copy(update={"model": spec})}
        )
    from ..runner import build_policy

    return build_policy(config)


def display_path(path: str) -> str:
    """A path as a report should record it: relative to the working directory (or to the
    package) when it lies inside, so committed reports carry no machine's absolute paths."""
    resolved = Path(path.split(" ", 1)[0]).resolve()
    rest = path[len(path.split(" ", 1)[0]) :]
    for root in (Path.cwd(), PACKAGE_DIR):
        try:
            return str(resolved.relative_to(root)) + rest
        except ValueError:
            continue
    return path
