"""What the ``coevolve`` subcommands share: consoles, the error exit, the --set option,
task sets by environment, loading a policy from --policy, paths as reports record them."""

from __future__ import annotations

import sys
from collections.abc import Callable, Iterable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import typer
from rich.console import Console

if TYPE_CHECKING:
    from ..config import CoevolveConfig
    from ..envs.base import Environment
    from ..envs.registry import EnvironmentSpec
    from ..records import Task

# The package's directory (configs/, langgraph.json).
PACKAGE_DIR = Path(__file__).resolve().parent.parent

# Piped output (CI logs, `| tee`) would otherwise wrap tables at 80 columns.
console = Console() if sys.stdout.isatty() else Console(width=120)
err_console = Console(stderr=True)

SetOption = Annotated[
    list[str] | None,
    typer.Option(
        "--set",
        metavar="KEY=VALUE",
        help="Override one config value, e.g. --set training.max_steps=10 --set rollout.k=8 "
        "(repeatable; the value is YAML: 10, 0.5, true, [tensorboard]).",
    ),
]

CacheDirOption = Annotated[
    str | None,
    typer.Option(help="Cache directory (default: $COEVOLVE_CACHE or ~/.cache/coevolve)."),
]

# Every command that can fail on a known error (errors.KNOWN_ERRORS) takes --debug; cli.main
# prints such an error on one line unless it is given.
DebugOption = Annotated[
    bool,
    typer.Option("--debug", help="On an error that stops the command, show the full traceback."),
]


def fail(message: str, code: int = 2) -> typer.Exit:
    """Print ``error: message`` on one line (not wrapped, not read as markup); the exit to raise."""
    from rich.markup import escape

    err_console.print(f"[red]error:[/red] {escape(message)}", soft_wrap=True)
    return typer.Exit(code)


def load_config_or_fail(
    source: str | dict[str, Any] | None, overrides: Sequence[str] = ()
) -> CoevolveConfig:
    """The config at ``source`` with ``overrides`` (``load_config``), or the error exit."""
    from ..config import ConfigError, load_config

    try:
        return load_config(source, overrides)
    except ConfigError as err:
        raise fail(str(err)) from None


def env_spec(env: str) -> EnvironmentSpec:
    """The registry's spec of --env / ENV, or the error exit naming the known ones."""
    from ..envs.registry import get_environment

    try:
        return get_environment(env)
    except ValueError as err:
        raise fail(str(err)) from None


def env_scopes(
    env: str, split: str | None, category: str | None, default: Sequence[str] | None = None
) -> tuple[list[str], str]:
    """The task sets named by --split / --category (the one the environment uses; ``default``,
    or all of them, when it is not given), and which of the two it was."""
    from ..envs.registry import ENVIRONMENTS

    spec = env_spec(env)
    given = {"split": split, "category": category}
    option = spec.task_set_option
    for other, value in given.items():
        if other != option and value is not None:
            users = [s.name for s in ENVIRONMENTS.values() if s.task_set_option == other]
            raise fail(
                f"--{other} is for {', '.join(users) or 'no environment'}; "
                f"{spec.name} has --{option}"
            )
    chosen = given[option]
    if chosen is None:
        return list(spec.task_sets if default is None else default), option
    if chosen not in spec.task_sets:
        raise fail(
            f"unknown {spec.title} {option} {chosen!r}; allowed: {', '.join(spec.task_sets)}"
        )
    return [chosen], option


def load_env_tasks(env: str, scope: str) -> tuple[Callable[[], Environment], list[Task]]:
    """The environment class and the tasks of one of its task sets (a world split, a BFCL
    category), or the error exit (e.g. bfcl-eval missing)."""
    spec = env_spec(env)
    try:
        return spec.environment, spec.load_task_set(scope)
    except RuntimeError as err:
        raise fail(str(err)) from None


def task_progress(description: str, enabled: bool):
    def wrap(items: list[Task]) -> Iterable[Task]:
        if not enabled:
            return items
        from rich.progress import track

        return track(items, description=description, console=err_console, transient=True)

    return wrap


def load_policy(spec: str) -> Any:
    """A policy from --policy: 'oracle', 'bootstrap', a model directory, or a YAML config."""
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
    from ..runner import build_bootstrap_agent, build_policy

    build_bootstrap_agent(config, say=err_console.print)  # when the cache lacks it
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
