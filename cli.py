"""The ``coevolve`` command.

Heavy libraries are imported inside the commands that need them, so
``coevolve --help`` stays fast.
"""

from __future__ import annotations

import json
import sys
from collections.abc import Iterable
from typing import TYPE_CHECKING, Annotated, Any

import typer
from rich.console import Console
from rich.table import Table

if TYPE_CHECKING:
    from .envs.base import CheckReport, Environment
    from .records import Task

app = typer.Typer(
    help="Train LLM agents by agent-data mutual evolution.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)
env_app = typer.Typer(help="Inspect and check environments.", no_args_is_help=True)
config_app = typer.Typer(help="Inspect configuration.", no_args_is_help=True)
app.add_typer(env_app, name="env")
app.add_typer(config_app, name="config")

# Piped output (CI logs, `| tee`) would otherwise wrap tables at 80 columns.
console = Console() if sys.stdout.isatty() else Console(width=120)
err_console = Console(stderr=True)

ENV_DESCRIPTIONS = {
    "world": "built-in world: contacts, messages, calendar, notes, shop, wallet, reminders",
    "bfcl": "BFCL multi-turn (from the bfcl-eval package), scored by its official checker",
}


def _fail(message: str, code: int = 2) -> typer.Exit:
    err_console.print(f"[red]error:[/red] {message}")
    return typer.Exit(code)


def _world_scopes(split: str | None) -> list[str]:
    from .envs.world import SPLITS

    if split is None:
        return list(SPLITS)
    if split not in SPLITS:
        raise _fail(f"unknown world split {split!r}; allowed: {', '.join(SPLITS)}")
    return [split]


def _bfcl_scopes(category: str | None) -> list[str]:
    from .envs.bfcl import CATEGORIES

    if category is None:
        return list(CATEGORIES)
    if category not in CATEGORIES:
        raise _fail(f"unknown BFCL category {category!r}; allowed: {', '.join(CATEGORIES)}")
    return [category]


def load_env_tasks(env: str, scope: str) -> tuple[type[Environment] | Any, list[Task]]:
    """The environment class and the tasks of one split (world) or category (BFCL)."""
    if env == "world":
        from .envs.world import WorldEnvironment, load_split

        return WorldEnvironment, load_split(scope)
    from .envs.bfcl import BfclEnvironment, load_tasks, require_bfcl

    require_bfcl()
    return BfclEnvironment, load_tasks(scope)


def _progress(description: str, enabled: bool):
    def wrap(items: list[Task]) -> Iterable[Task]:
        if not enabled:
            return items
        from rich.progress import track

        return track(items, description=description, console=err_console, transient=True)

    return wrap


@env_app.command("list")
def env_list(as_json: Annotated[bool, typer.Option("--json", help="Print JSON.")] = False) -> None:
    """List the environments and their task sets."""
    from .envs.bfcl import CATEGORIES
    from .envs.world import DEFAULT_SIZES, FAMILIES, TOOL_NAMES

    try:
        import bfcl_eval  # noqa: F401

        bfcl_status = "installed"
    except ImportError:
        bfcl_status = "not installed: pip install --no-deps bfcl-eval==2026.3.23 mpmath"
    rows: list[dict[str, Any]] = [
        {
            "env": "world",
            "description": ENV_DESCRIPTIONS["world"],
            "task_sets": {split: size for split, size in DEFAULT_SIZES.items()},
            "tools": len(TOOL_NAMES),
            "families": len(FAMILIES),
            "status": "built in",
        },
        {
            "env": "bfcl",
            "description": ENV_DESCRIPTIONS["bfcl"],
            "task_sets": {category: 200 for category in CATEGORIES},
            "status": bfcl_status,
        },
    ]
    if as_json:
        print(json.dumps(rows, indent=2))
        return
    table = Table(title="environments")
    for column in ("env", "description", "task sets (--split / --category)", "status"):
        table.add_column(column)
    for row in rows:
        sets = "\n".join(f"{name} ({size})" for name, size in row["task_sets"].items())
        table.add_row(row["env"], row["description"], sets, row["status"])
    console.print(table)


@env_app.command("check")
def env_check(
    env: Annotated[str, typer.Argument(help="Environment: world or bfcl.")],
    split: Annotated[str | None, typer.Option(help="World split (default: all).")] = None,
    category: Annotated[str | None, typer.Option(help="BFCL category (default: all four).")] = None,
    as_json: Annotated[bool, typer.Option("--json", help="One JSON object per line.")] = False,
    show_failures: Annotated[int, typer.Option(help="Failures to print per task set.")] = 5,
) -> None:
    """Replay every reference solution through the environment and its verifier."""
    from .envs.base import check_references

    if env == "world":
        if category is not None:
            raise _fail("--category is for bfcl; the world has --split")
        scopes, key = _world_scopes(split), "split"
    elif env == "bfcl":
        if split is not None:
            raise _fail("--split is for the world; bfcl has --category")
        scopes, key = _bfcl_scopes(category), "category"
    else:
        raise _fail(f"unknown environment {env!r}; allowed: world, bfcl")

    all_verified = True
    for scope in scopes:
        try:
            env_class, tasks = load_env_tasks(env, scope)
        except RuntimeError as err:  # e.g. bfcl-eval missing
            raise _fail(str(err)) from None
        report: CheckReport = check_references(
            env_class, tasks, env, {key: scope}, progress=_progress(f"{env} {scope}", not as_json)
        )
        all_verified &= report.verified == report.total
        if as_json:
            print(json.dumps(report.as_json()), flush=True)
            continue
        colour = "green" if report.verified == report.total else "red"
        console.print(
            f"{env} {key}={scope}: [{colour}]verified {report.verified}/{report.total}[/{colour}]"
        )
        for failure in report.failures[:show_failures]:
            console.print(f"  [red]failed[/red] {failure}")
    if not all_verified:
        raise typer.Exit(1)


@env_app.command("show")
def env_show(
    env: Annotated[str, typer.Argument(help="Environment: world or bfcl.")],
    split: Annotated[str | None, typer.Option(help="World split.")] = None,
    category: Annotated[str | None, typer.Option(help="BFCL category.")] = None,
    index: Annotated[int, typer.Option(help="Which task of the set.")] = 0,
) -> None:
    """Show one task and replay its reference solution step by step."""
    from .envs.parsing import render_call

    scope = (
        _world_scopes(split or "train")
        if env == "world"
        else _bfcl_scopes(category or "multi_turn_base")
    )[0]
    if env not in ENV_DESCRIPTIONS:
        raise _fail(f"unknown environment {env!r}; allowed: world, bfcl")
    try:
        env_class, tasks = load_env_tasks(env, scope)
    except RuntimeError as err:
        raise _fail(str(err)) from None
    if not 0 <= index < len(tasks):
        raise _fail(f"--index must be in 0..{len(tasks) - 1}")
    task = tasks[index]
    environment = env_class()
    query: str | None = environment.reset(task)
    console.print(f"[bold]{task.id}[/bold]  family={task.family}  tools={len(environment.tools())}")
    for turn in task.turns:
        console.print(f"[cyan]user:[/cyan] {query}")
        for call in turn.reference_calls:
            observation = environment.step(call)
            console.print(f"  [yellow]call:[/yellow] {render_call(call)}")
            style = "red" if observation.error else "dim"
            console.print(f"  [{style}]→ {observation.text}[/{style}]")
        is_last = turn is task.turns[-1]
        query = environment.end_turn(task.reference_answer if is_last else None)
    if task.reference_answer is not None:
        console.print(f"[cyan]answer:[/cyan] {task.reference_answer}")
    console.print(f"verifier score: [bold]{environment.score():.2f}[/bold]")


def _load_policy(spec: str, config_path: str | None = None) -> Any:
    """A policy from --policy: 'oracle', 'bootstrap', a model directory, or a YAML config."""
    from pathlib import Path

    from .config import CoevolveConfig, load_config

    if spec == "oracle":
        from .agents.oracle import OraclePolicy

        return OraclePolicy()
    config = CoevolveConfig()
    if spec.endswith((".yaml", ".yml")):
        config = load_config(spec)
    elif spec != "bootstrap":
        if not Path(spec).is_dir():
            raise _fail(
                f"--policy {spec!r} is not 'oracle', 'bootstrap', a model directory or a YAML config"
            )
        config = config.model_copy(
            update={"policy": config.policy.model_copy(update={"model": spec})}
        )
    policy = config.policy
    if policy.kind == "endpoint":
        from .agents.endpoint_policy import EndpointPolicy

        assert policy.endpoint is not None  # the config validator guarantees it
        return EndpointPolicy(config.endpoint(policy.endpoint))
    from .agents.local_policy import LocalPolicy

    model_path = policy.model
    if model_path == "bootstrap":
        from .training.bootstrap import BootstrapConfig, bootstrap

        model_path = str(bootstrap(BootstrapConfig()))
    return LocalPolicy(
        model_path,
        adapter_path=policy.adapter,
        device=policy.device,
        max_new_tokens=policy.max_new_tokens,
        batch_size=policy.batch_size,
    )


@app.command("eval")
def eval_command(
    env: Annotated[str, typer.Option("--env", help="Environment: world or bfcl.")] = "world",
    split: Annotated[str | None, typer.Option(help="World split (default: heldout).")] = None,
    category: Annotated[str | None, typer.Option(help="BFCL category (default: all four).")] = None,
    policy: Annotated[
        str,
        typer.Option(
            help="oracle, bootstrap, a model directory, or a YAML config with a policy section."
        ),
    ] = "bootstrap",
    k: Annotated[int, typer.Option(help="Episodes per task.")] = 1,
    temperature: Annotated[float, typer.Option(help="Sampling temperature (0: greedy).")] = 0.0,
    max_steps: Annotated[
        int | None, typer.Option(help="Tool calls per user turn (world 12, bfcl 20).")
    ] = None,
    limit: Annotated[int | None, typer.Option(help="Only the first N tasks of each set.")] = None,
    save: Annotated[
        str | None, typer.Option(help="Write the trajectories to this JSONL file.")
    ] = None,
    as_json: Annotated[bool, typer.Option("--json", help="Print the report as JSON.")] = False,
) -> None:
    """Roll out a policy on a task set and report success overall and per family/category."""
    from .agents.evaluation import evaluate
    from .agents.policy import PolicyError
    from .agents.rollout import run_rollouts
    from .config import ConfigError

    if env == "world":
        if category is not None:
            raise _fail("--category is for bfcl; the world has --split")
        scopes, key = _world_scopes(split or "heldout"), "split"
    elif env == "bfcl":
        if split is not None:
            raise _fail("--split is for the world; bfcl has --category")
        scopes, key = _bfcl_scopes(category), "category"
    else:
        raise _fail(f"unknown environment {env!r}; allowed: world, bfcl")
    tasks = []
    env_class: Any = None
    for scope in scopes:
        try:
            env_class, scope_tasks = load_env_tasks(env, scope)
        except RuntimeError as err:
            raise _fail(str(err)) from None
        tasks += scope_tasks[:limit] if limit is not None else scope_tasks
    try:
        agent = _load_policy(policy)
    except (ConfigError, PolicyError, FileNotFoundError, OSError) as err:
        raise _fail(str(err)) from None
    try:
        trajectories = run_rollouts(
            agent,
            env_class,
            tasks,
            k=k,
            temperature=temperature,
            max_steps=max_steps or (20 if env == "bfcl" else 12),
            progress=not as_json,
            description=f"eval {env} {','.join(scopes)}",
        )
    except PolicyError as err:
        raise _fail(str(err)) from None
    if save:
        from pathlib import Path

        Path(save).parent.mkdir(parents=True, exist_ok=True)
        with open(save, "w", encoding="utf-8") as handle:
            for trajectory in trajectories:
                handle.write(trajectory.model_dump_json() + "\n")
    report = evaluate(trajectories, tasks, env, {key: ",".join(scopes)}, agent.version)
    if as_json:
        print(json.dumps(report.as_json(), indent=2))
        return
    console.print(f"[bold]{env}[/bold] {key}={','.join(scopes)}  policy={agent.version}")
    table = Table()
    name_column = "family" if env == "world" else "category"
    table.add_column(name_column, no_wrap=True)
    for column in ("episodes", "success", "tool seq", "calls", "errors", "cut off"):
        table.add_column(column, justify="right", no_wrap=True)
    rows = [*report.by_family.items(), ("overall", report.overall)]
    for name, stats in rows:
        table.add_row(
            f"[bold]{name}[/bold]" if name == "overall" else name,
            str(stats.episodes),
            f"{stats.success_rate:.1%} ({stats.successes})",
            f"{stats.tool_sequence_accuracy:.1%}",
            f"{stats.call_accuracy:.1%}",
            str(stats.errors),
            str(stats.cut_off),
        )
    console.print(table)
    if report.overall.errors:
        err_console.print(
            f"[yellow]{report.overall.errors} episodes ended on a policy error; see --save[/yellow]"
        )


@config_app.command("show")
def config_show(
    path: Annotated[
        str | None, typer.Argument(help="YAML config (default: built-in defaults).")
    ] = None,
) -> None:
    """Validate a config and print it with every default filled in."""
    import yaml

    from .config import ConfigError, load_config

    try:
        config = load_config(path)
    except ConfigError as err:
        raise _fail(str(err)) from None
    print(yaml.safe_dump(config.model_dump(mode="json"), sort_keys=False), end="")


def main() -> None:
    try:
        app()
    except KeyboardInterrupt:
        err_console.print("interrupted")
        sys.exit(130)


if __name__ == "__main__":
    main()
