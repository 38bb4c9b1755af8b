"""``coevolve env``: list the environments, check their reference solutions, show a task."""

from __future__ import annotations

import json
from typing import TYPE_CHECKING, Annotated, Any

import typer
from rich.table import Table

from .common import console, env_scopes, env_spec, fail, load_env_tasks, task_progress

if TYPE_CHECKING:
    from ..envs.base import CheckReport

env_app = typer.Typer(help="Inspect and check environments.", no_args_is_help=True)


@env_app.command("list")
def env_list(as_json: Annotated[bool, typer.Option("--json", help="Print JSON.")] = False) -> None:
    """List the environments and their task sets."""
    from ..envs.registry import ENVIRONMENTS

    rows: list[dict[str, Any]] = [
        {"env": spec.name, "description": spec.description, **spec.inventory()}
        for spec in ENVIRONMENTS.values()
    ]
    rows += _entry_point_rows()
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


def _entry_point_rows() -> list[dict[str, Any]]:
    """Rows of the environments installed packages declare (``coevolve.environments``);
    one that cannot be loaded says why in its status."""
    from ..envs.user_env import find_user_environment, user_environment_names

    rows: list[dict[str, Any]] = []
    for name in user_environment_names():
        try:
            found = find_user_environment(name)
        except ValueError as err:
            rows.append({"env": name, "description": "", "task_sets": {}, "status": str(err)})
            continue
        if found is not None:
            spec = found.spec
            rows.append({"env": name, "description": spec.description, **spec.inventory()})
    return rows


ENV_HELP = "Environment: world, bfcl, or a user's (import path module:make_env, or entry point)."
TasksOption = Annotated[
    str | None,
    typer.Option(
        "--tasks",
        help="A user's environment: its task file (env.tasks), e.g. for a module of tool functions.",
    ),
]


def _register_tasks(env: str, tasks: str | None) -> None:
    """Pair ``env`` with the task file --tasks names, as a config's env.tasks does."""
    if tasks is None:
        return
    from ..envs.registry import ENVIRONMENTS
    from ..envs.user_env import register_user_environment

    if env in ENVIRONMENTS:
        raise fail(f"--tasks is for a user's environment, not {env!r}")
    try:
        register_user_environment(env, tasks)
    except ValueError as err:
        raise fail(str(err)) from None


@env_app.command("check")
def env_check(
    env: Annotated[str, typer.Argument(help=ENV_HELP)],
    split: Annotated[str | None, typer.Option(help="World split (default: all).")] = None,
    category: Annotated[str | None, typer.Option(help="BFCL category (default: all four).")] = None,
    as_json: Annotated[bool, typer.Option("--json", help="One JSON object per line.")] = False,
    show_failures: Annotated[int, typer.Option(help="Failures to print per task set.")] = 5,
    tasks_file: TasksOption = None,
) -> None:
    """Replay every reference solution through the environment and its verifier."""
    from rich.markup import escape

    from ..envs.base import check_references
    from ..envs.registry import ENVIRONMENTS
    from ..envs.user_env import find_user_environment

    _register_tasks(env, tasks_file)
    scopes, key = env_scopes(env, split, category)
    # A user's task file: its bad lines and broken references, each on one line with its
    # task id and line number (the splits below replay only the tasks that can be used).
    user = None if env in ENVIRONMENTS else find_user_environment(env)
    problems = user.problems if user is not None else []
    for problem in problems:
        if as_json:
            print(json.dumps({"env": env, "problem": str(problem)}), flush=True)
        else:
            console.print(f"[red]problem[/red] {escape(str(problem))}", soft_wrap=True)

    all_verified = True
    for scope in scopes:
        env_class, tasks = load_env_tasks(env, scope)
        report: CheckReport = check_references(
            env_class,
            tasks,
            env,
            {key: scope},
            progress=task_progress(f"{env} {scope}", not as_json),
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
    if problems and not as_json:
        console.print(
            f"{env}: [red]{len(problems)} task(s) cannot be used[/red]; `coevolve run` refuses "
            "the environment until they are fixed"
        )
    if not all_verified or problems:
        raise typer.Exit(1)


@env_app.command("show")
def env_show(
    env: Annotated[str, typer.Argument(help=ENV_HELP)],
    split: Annotated[str | None, typer.Option(help="World split.")] = None,
    category: Annotated[str | None, typer.Option(help="BFCL category.")] = None,
    index: Annotated[int, typer.Option(help="Which task of the set.")] = 0,
    tasks_file: TasksOption = None,
) -> None:
    """Show one task and replay its reference solution step by step."""
    from ..envs.parsing import render_call

    _register_tasks(env, tasks_file)
    scopes, _ = env_scopes(env, split, category, default=env_spec(env).task_sets[:1])
    scope = scopes[0]
    env_class, tasks = load_env_tasks(env, scope)
    if not 0 <= index < len(tasks):
        raise fail(f"--index must be in 0..{len(tasks) - 1}")
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
