"""``coevolve env``: list the environments, check their reference solutions, show a task,
say how many of its tasks synthesis can vary, and print the prompts a run on it sends."""

from __future__ import annotations

import json
from typing import TYPE_CHECKING, Annotated, Any

import typer
from rich.table import Table

from .common import (
    ENV_HELP,
    console,
    env_scopes,
    env_spec,
    fail,
    load_env_tasks,
    note_skipped_lines,
    split_help,
    task_progress,
)

if TYPE_CHECKING:
    from ..envs.base import CheckReport

env_app = typer.Typer(help="Inspect and check environments.", no_args_is_help=True)

# env's commands also take a module of tool functions, whose task file --tasks names.
ENV_ARGUMENT_HELP = f"{ENV_HELP}, or a module of tool functions with --tasks."
TasksOption = Annotated[
    str | None,
    typer.Option(
        "--tasks",
        help="A user's environment: its task file (env.tasks), e.g. for a module of tool functions.",
    ),
]


@env_app.command("list")
def env_list(
    env: Annotated[
        str | None,
        typer.Argument(
            help="Show this environment's task sets, families and tools. " + ENV_ARGUMENT_HELP
        ),
    ] = None,
    as_json: Annotated[bool, typer.Option("--json", help="Print JSON.")] = False,
    tasks_file: TasksOption = None,
) -> None:
    """List the environments and their task sets, or show one environment's inventory."""
    from ..envs.registry import ENVIRONMENTS

    if env is not None:
        _register_tasks(env, tasks_file)
        _show_inventory(env, as_json)
        return
    if tasks_file is not None:
        raise fail("--tasks goes with an environment: coevolve env list mytools.tools --tasks FILE")
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
    # An environment named by import path exists once it is named, so no list can hold it.
    console.print(
        "Show one, yours too: coevolve env list ENV, e.g. coevolve env list "
        "examples.support_desk.env:make_env (an import path module:make_env, an entry point, "
        "or a module of tool functions with --tasks FILE).",
        soft_wrap=True,
    )


def _show_inventory(env: str, as_json: bool) -> None:
    """One environment's inventory: its task sets, its families in each, and its tools."""
    from rich.markup import escape

    from ..envs.base import TASK_ERRORS
    from ..envs.registry import ENVIRONMENTS
    from ..envs.user_env import find_user_environment

    spec = env_spec(env)
    user = None if env in ENVIRONMENTS else find_user_environment(env)
    try:
        schemas = spec.environment().tools()
    except TASK_ERRORS:  # BFCL's tools come with a task
        schemas = []
    tools = {
        schema["function"]["name"]: schema["function"].get("description", "").split("\n")[0]
        for schema in schemas
    }
    families: dict[str, dict[str, int]] = {}
    for task in user.tasks("all") if user is not None else []:
        sizes = families.setdefault(task.family, dict.fromkeys(spec.task_sets, 0))
        sizes[task.split] += 1
    inventory = spec.inventory()
    if as_json:
        row = {"env": env, "title": spec.title, "description": spec.description, **inventory}
        row |= {"tool_descriptions": tools, "families_by_split": families}
        print(json.dumps(row, indent=2))
        note_skipped_lines(env)
        return
    title = f"[bold]{escape(spec.title)}[/bold] ({escape(env)}): {escape(spec.description)}"
    console.print(title, soft_wrap=True)
    console.print(f"  {escape(str(inventory['status']))}", soft_wrap=True)
    sets = ", ".join(f"{name} {size}" for name, size in inventory["task_sets"].items())
    console.print(f"  task sets (--{spec.task_set_option}): {sets}", soft_wrap=True)
    if families:
        table = Table(title=f"{len(families)} families")
        table.add_column(spec.family_label)
        for name in spec.task_sets:
            table.add_column(name, justify="right")
        for family, sizes in sorted(families.items()):
            table.add_row(family, *(str(sizes[name]) for name in spec.task_sets))
        console.print(table)
    elif "families" in inventory:
        console.print(f"  families: {inventory['families']}")
    if tools:
        table = Table(title=f"{len(tools)} tools")
        table.add_column("tool", no_wrap=True)
        table.add_column("description")
        for name, description in tools.items():
            table.add_row(name, description)
        console.print(table)
    note_skipped_lines(env)


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
    env: Annotated[str, typer.Argument(help=ENV_ARGUMENT_HELP)],
    split: Annotated[str | None, typer.Option(help=split_help("all"))] = None,
    category: Annotated[str | None, typer.Option(help="BFCL category (default: all four).")] = None,
    as_json: Annotated[bool, typer.Option("--json", help="One JSON object per line.")] = False,
    show_failures: Annotated[int, typer.Option(help="Failures to print per task set.")] = 5,
    tasks_file: TasksOption = None,
    tool_timeout: Annotated[
        float | None,
        typer.Option(
            "--tool-timeout",
            min=0.001,
            help="Seconds a tool call may take (default: env.tool_timeout_s's default; "
            "`coevolve config show` prints it).",
        ),
    ] = None,
) -> None:
    """Replay every reference solution through the environment and its verifier.

    Exit code 2 when a user's task file is refused (a bad line, a reference that does not
    replay, a split with no task), as `coevolve run` and `coevolve eval` refuse it; 1 when
    a built-in environment's reference fails."""
    from contextlib import nullcontext

    from ..envs.limits import limits_set

    bounded = limits_set(timeout_s=tool_timeout) if tool_timeout is not None else nullcontext()
    with bounded:
        _check(env, split, category, as_json, show_failures, tasks_file)


def _check(
    env: str,
    split: str | None,
    category: str | None,
    as_json: bool,
    show_failures: int,
    tasks_file: str | None,
) -> None:
    from rich.markup import escape

    from ..envs.base import check_references
    from ..envs.registry import ENVIRONMENTS
    from ..envs.user_env import find_user_environment

    _register_tasks(env, tasks_file)
    scopes, key = env_scopes(env, split, category)
    # A user's task file: its bad lines and broken references, each on one line with its
    # task id and line number (the splits below replay only the tasks that can be used).
    user = None if env in ENVIRONMENTS else find_user_environment(env)
    problems = [str(problem) for problem in user.problems] if user is not None else []
    empty = user.empty_splits(scopes) if user is not None else None
    for problem in [*problems, empty] if empty is not None else problems:
        if as_json:
            print(json.dumps({"env": env, "problem": problem}), flush=True)
        else:
            console.print(f"[red]problem[/red] {escape(problem)}", soft_wrap=True)

    all_verified = empty is None
    for scope in scopes:
        if user is not None and not user.tasks(scope):
            continue  # an empty split: the problem above names it
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
    if user is not None and not as_json:
        _note_families_not_held_out(user)
    if problems and not as_json:
        console.print(
            f"{env}: [red]{len(problems)} task(s) cannot be used[/red]; `coevolve run` refuses "
            "the environment until they are fixed"
        )
    if problems or (user is not None and not all_verified):
        raise typer.Exit(REFUSED_TASK_FILE)
    if not all_verified:
        raise typer.Exit(1)


# The exit code of a refused task file, in env check as in run and eval (commands.common.fail).
REFUSED_TASK_FILE = 2


def _note_families_not_held_out(user: Any) -> None:
    """A family with no held-out task is measured by no evaluation: say which, and how to
    put one there (a task's split comes from its id, so a small family may have none)."""
    from rich.markup import escape

    from ..envs.task_file import families_missing

    missing = families_missing(user.tasks("all"), "heldout")
    if missing:
        console.print(
            f"[yellow]note[/yellow] no held-out task in {len(missing)} families: "
            f"{escape(', '.join(missing))}; name the split on one of their lines "
            '("split": "heldout") to measure them',
            soft_wrap=True,
        )


@env_app.command("show")
def env_show(
    env: Annotated[str, typer.Argument(help=ENV_ARGUMENT_HELP)],
    split: Annotated[str | None, typer.Option(help=split_help("train"))] = None,
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
    note_skipped_lines(env)
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


@env_app.command("vary")
def env_vary(
    env: Annotated[str, typer.Argument(help=ENV_ARGUMENT_HELP)],
    split: Annotated[
        str | None,
        typer.Option(help="The task set to vary, its tasks lending the values (default: train)."),
    ] = None,
    category: Annotated[
        str | None,
        typer.Option(help="BFCL's task set instead of --split (default: multi_turn_base)."),
    ] = None,
    limit: Annotated[
        int | None, typer.Option(min=1, help="Its first N tasks only (the bench's N seed tasks).")
    ] = None,
    variants: Annotated[int, typer.Option(min=1, help="Variants tried per task.")] = 1,
    as_json: Annotated[
        bool, typer.Option("--json", help="The coverage as one JSON object.")
    ] = False,
    tasks_file: TasksOption = None,
) -> None:
    """How many tasks variation (synthesis.synthesizer: variation) can vary: per family, the
    tasks with a replay-verified variant and each reason for those without, and an example.

    Needs only the environment protocol: no task generator, sampler or describer is called,
    and only the named task set is read."""
    from rich.markup import escape

    from ..agents.roles.variation import variation_coverage

    _register_tasks(env, tasks_file)
    [scope], option = env_scopes(env, split, category, default=[env_spec(env).seed_task_set])
    make_env, tasks = load_env_tasks(env, scope)
    tasks = tasks[:limit] if limit is not None else tasks
    coverage = variation_coverage(
        tasks, make_env, tasks, variants, progress=task_progress(f"{env} {scope}", not as_json)
    )
    if as_json:
        print(json.dumps({"env": env, option: scope, **coverage}))
        return
    table = Table(title=f"{env} {scope}: tasks variation can vary ({variants} tried each)")
    for column in ("family", "tasks", "varied", "not varied: why"):
        table.add_column(column, justify="left" if column[0] in "fn" else "right")
    for family, row in coverage["by_family"].items():
        why = ", ".join(f"{reason} {n}" for reason, n in row["not_varied"].items())
        table.add_row(family, str(row["tasks"]), str(row["varied"]), why)
    share = coverage["varied"] / max(coverage["tasks"], 1)
    why = ", ".join(f"{reason} {n}" for reason, n in coverage["not_varied"].items())
    table.add_row(
        "all", str(coverage["tasks"]), f"{coverage['varied']} ({share:.0%})", why, style="bold"
    )
    console.print(table)
    for family, (parent, variant) in list(coverage["examples"].items())[:3]:
        console.print(f"{family}: {escape(parent)!r}\n  -> {escape(variant)!r}", soft_wrap=True)


@env_app.command("prompts")
def env_prompts(
    env: Annotated[str, typer.Argument(help=ENV_ARGUMENT_HELP)],
    config: Annotated[
        str | None,
        typer.Option(
            "--config",
            help="A config whose own prompts (synthesis.roles.*_prompt, policy.system_prompt) "
            "replace the defaults.",
        ),
    ] = None,
    as_json: Annotated[
        bool, typer.Option("--json", help="The prompts as one JSON object, by role.")
    ] = False,
    tasks_file: TasksOption = None,
) -> None:
    """Print every prompt a run on ENV sends: each synthesis role's system prompt filled with
    the environment's brief (what the LLM synthesizer's roles read; the variation and
    generator synthesizers read none) and the policy's system prompt."""
    from ..agents.prompts import POLICY_SYSTEM_PROMPT, environment_policy_prompt
    from ..agents.roles.role_interfaces import ROLE_NAMES, RolesConfig
    from ..config import ConfigError
    from ..envs.brief import environment_brief
    from .common import load_config_or_fail

    _register_tasks(env, tasks_file)
    spec = env_spec(env)
    roles, system_prompt = RolesConfig(), POLICY_SYSTEM_PROMPT
    if config is not None:
        loaded = load_config_or_fail(config)
        roles, system_prompt = loaded.synthesis.roles, loaded.policy.system_prompt
    try:  # a seed task's tool sequence is the roles' example action pattern
        seeds = spec.load_task_set(spec.seed_task_set)
    except (RuntimeError, ConfigError):
        seeds = []
    brief = environment_brief(spec.environment(), seeds)
    prompts = {role: roles.prompt_for(role, brief) for role in ROLE_NAMES}
    prompts["policy"] = environment_policy_prompt(system_prompt, env) or ""
    if as_json:
        print(json.dumps({"env": env, "prompts": prompts}))
        return
    console.print(
        "The synthesis roles' prompts are what synthesis.synthesizer: llm sends (the variation "
        "and generator synthesizers read none); the policy's is every episode's system message.",
        style="dim",
    )
    for role, prompt in prompts.items():
        where = "policy.system_prompt" if role == "policy" else f"synthesis.roles.{role}_prompt"
        console.rule(f"{role} ({where})")
        console.print(prompt or "(none)", markup=False, highlight=False, soft_wrap=True)
