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
    from ..training.bootstrap.bootstrap_config import BootstrapConfig

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
        # Typer renders help with rich, which would read a bare [tensorboard] as a style tag.
        "(repeatable; the value is YAML: 10, 0.5, true, \\[tensorboard]).",
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


ENV_HELP = (
    "Environment: world, bfcl, or yours by import path (examples.support_desk.env:make_env) "
    "or coevolve.environments entry point"
)


def split_help(default: str) -> str:
    return f"Split (default: {default}): train, validation or heldout; BFCL has --category."


def load_env_tasks(env: str, scope: str) -> tuple[Callable[[], Environment], list[Task]]:
    """The environment class and the tasks of one of its task sets (a split, a BFCL
    category), or the error exit (e.g. bfcl-eval missing, a user's split with no task)."""
    from ..config import ConfigError

    spec = env_spec(env)
    try:
        return spec.environment, spec.load_task_set(scope)
    except (RuntimeError, ConfigError) as err:
        raise fail(str(err)) from None


SKIPPED_SHOWN = 3  # of a task file's skipped lines, how many a command names


def note_skipped_lines(env: str) -> None:
    """On stderr: how many lines of a user's task file this command leaves out, and why
    (the first few, then a count). ``env check`` lists them all."""
    from rich.markup import escape

    from ..envs.registry import ENVIRONMENTS
    from ..envs.user_env import find_user_environment

    user = None if env in ENVIRONMENTS else find_user_environment(env)
    if user is None or not user.problems:
        return
    lines = len(user.task_file.tasks) + len(user.task_file.problems)
    err_console.print(
        f"[yellow]skipped {len(user.problems)} of the {lines} task lines of "
        f"{escape(str(user.tasks_path))}:[/yellow]",
        soft_wrap=True,
    )
    for problem in user.problems[:SKIPPED_SHOWN]:
        err_console.print(f"  {escape(str(problem))}", soft_wrap=True)
    rest = len(user.problems) - SKIPPED_SHOWN
    more = f"and {rest} more; " if rest > 0 else ""
    err_console.print(f"  {more}{escape(user.check_command)} lists them all", soft_wrap=True)


def task_progress(description: str, enabled: bool):
    def wrap(items: list[Task]) -> Iterable[Task]:
        if not enabled:
            return items
        from rich.progress import track

        return track(items, description=description, console=err_console, transient=True)

    return wrap


def run_of_policy(spec: str) -> CoevolveConfig | None:
    """The saved config of the run whose adapter --policy names, its ``policy.adapter`` set
    to that adapter: ``RUN_DIR/adapters/cycle-N``, or ``RUN_DIR`` for its last finished one.
    None when ``spec`` is neither; the error exit when the run has no such adapter."""
    from ..run_files import ADAPTERS_FOLDER, RunFiles
    from ..training.adapters import is_adapter_complete

    path = Path(spec)
    if RunFiles(path).config.is_file():
        run = RunFiles(path)
        finished = [adapter for adapter in run.adapters() if is_adapter_complete(adapter)]
        if not finished:
            raise fail(
                f"--policy {spec}: that run has no finished adapter yet ({ADAPTERS_FOLDER}/"
                f"cycle-N); --policy {run.config} evaluates the agent it starts from"
            )
        adapter = finished[-1]
    elif path.parent.name == ADAPTERS_FOLDER and RunFiles(path.parent.parent).config.is_file():
        run, adapter = RunFiles(path.parent.parent), path
        if not is_adapter_complete(adapter):
            raise fail(
                f"--policy {spec} is not a finished adapter (its cycle has not finished "
                f"training); the run's finished ones: "
                + (", ".join(a.name for a in run.adapters() if is_adapter_complete(a)) or "none")
            )
    else:
        return None
    config = load_config_or_fail(str(run.config))
    if config.policy.kind != "local":
        raise fail(
            f"--policy {spec}: that run's policy is an endpoint, and an adapter runs on a local "
            "model: serve the adapter there and give --policy a YAML config naming the endpoint"
        )
    policy = config.policy.model_copy(update={"adapter": str(adapter)})
    return config.model_copy(update={"policy": policy})


# The main job's config (`coevolve run` with no argument, `make demo`): a command that needs
# "the bootstrap agent" and names no config means the agent this config builds, so the tour
# after `make demo` evaluates the agent the demo built instead of building another.
MAIN_CONFIG = PACKAGE_DIR / "configs" / "quickstart.yaml"


def bootstrap_recipe(config_path: str | None, base: str | None) -> BootstrapConfig:
    """The agent ``coevolve bootstrap`` builds: the --config's recipe, else the main job's
    (measured on validation, which is not part of its cache key); ``base`` tiny: the
    seconds-long test preset; smollm2: the default recipe unless the config's base is
    smollm2; any other model: the recipe on that base."""
    from ..config import ConfigError, load_config
    from ..training.bootstrap.bootstrap_config import BootstrapConfig

    if base == "tiny":
        from ..training.tiny_presets import tiny_bootstrap

        return tiny_bootstrap()
    try:
        config = load_config(config_path or MAIN_CONFIG).bootstrap
    except ConfigError as err:
        raise fail(str(err)) from None
    if config_path is None:
        config = config.model_copy(update={"eval_split": "validation"})
    if base == "smollm2" and config.base != "smollm2":
        return BootstrapConfig()
    if base is not None and base != config.base:
        recipe = config if config.base != "tiny" else BootstrapConfig()
        return recipe.model_copy(update={"base": base})
    return config


def policy_config(spec: str | CoevolveConfig) -> CoevolveConfig:
    """The config a --policy that is not 'oracle' runs with: 'bootstrap' and a model
    directory on the main job's settings (its bootstrap agent, its policy's batch and reply
    length), a YAML config as it is, or a run's config from ``run_of_policy``."""
    from ..config import CoevolveConfig, load_config

    if isinstance(spec, CoevolveConfig):
        return spec
    if spec.endswith((".yaml", ".yml")):
        return load_config(spec)
    config = load_config(MAIN_CONFIG)
    if spec == "bootstrap":
        return config
    if not Path(spec).is_dir():
        raise fail(
            f"--policy {spec!r} is not 'oracle', 'bootstrap', a model directory, a YAML "
            "config, or a run's directory or adapter (RUN_DIR/adapters/cycle-N)"
        )
    return config.model_copy(update={"policy": config.policy.model_copy(update={"model": spec})})


def load_policy(spec: str | CoevolveConfig) -> Any:
    """A policy from --policy: 'oracle', 'bootstrap', a model directory, a YAML config, or
    a run's config from ``run_of_policy``."""
    if spec == "oracle":
        from ..agents.policy.oracle import OraclePolicy

        return OraclePolicy()
    config = policy_config(spec)
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
