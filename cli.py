"""The ``coevolve`` command.

Heavy libraries are imported inside the commands that need them, so
``coevolve --help`` stays fast.
"""

from __future__ import annotations

import json
import os
import sys
from collections.abc import Iterable
from pathlib import Path
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
bench_app = typer.Typer(help="Benchmarks of the method itself.", no_args_is_help=True)
app.add_typer(env_app, name="env")
app.add_typer(config_app, name="config")
app.add_typer(bench_app, name="bench")

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


def _fail(message: str, code: int = 2) -> typer.Exit:
    """Print ``error: message`` on one line (not wrapped, not read as markup); the exit to raise."""
    from rich.markup import escape

    err_console.print(f"[red]error:[/red] {escape(message)}", soft_wrap=True)
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


def _scopes(env: str, split: str | None, category: str | None) -> tuple[list[str], str]:
    """The task sets named by --split / --category, and which of the two it was."""
    if env == "world":
        if category is not None:
            raise _fail("--category is for bfcl; the world has --split")
        return _world_scopes(split), "split"
    if env == "bfcl":
        if split is not None:
            raise _fail("--split is for the world; bfcl has --category")
        return _bfcl_scopes(category), "category"
    raise _fail(f"unknown environment {env!r}; allowed: world, bfcl")


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

    scopes, key = _scopes(env, split, category)

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
    from .runner import build_policy

    return build_policy(config)


@app.command("bootstrap")
def bootstrap_command(
    config_path: Annotated[
        str | None, typer.Option("--config", help="YAML config with a bootstrap section.")
    ] = None,
    force: Annotated[
        bool, typer.Option("--force", help="Rebuild even if a cached build exists.")
    ] = False,
    base: Annotated[
        str | None,
        typer.Option(
            "--base",
            help="smollm2: LoRA SFT of SmolLM2-135M-Instruct (the default agent); tiny: the "
            "seconds-long from-scratch test preset (learns nothing useful).",
        ),
    ] = None,
    tiny: Annotated[bool, typer.Option("--tiny", help="Same as --base tiny.")] = False,
    cache_dir: Annotated[
        str | None,
        typer.Option(help="Cache directory (default: $COEVOLVE_CACHE or ~/.cache/coevolve)."),
    ] = None,
    as_json: Annotated[
        bool, typer.Option("--json", help="Print the build's metadata as JSON.")
    ] = False,
) -> None:
    """Build the bootstrap agent: SmolLM2-135M-Instruct after LoRA SFT on the seed split. Cached."""
    from .config import ConfigError, load_config
    from .training.bootstrap import (
        BootstrapConfig,
        bootstrap,
        bootstrap_dir,
        is_complete,
        load_metadata,
    )

    if base not in (None, "smollm2", "tiny"):
        raise _fail(f"--base {base!r} is not a base model; use smollm2 or tiny")
    try:
        if tiny or base == "tiny":
            config = BootstrapConfig.tiny()
        else:
            config = load_config(config_path).bootstrap
            if base == "smollm2" and config.base != "smollm2":
                config = BootstrapConfig()
    except ConfigError as err:
        raise _fail(str(err)) from None
    cached = is_complete(bootstrap_dir(config, cache_dir)) and not force
    path = bootstrap(config, cache_dir=cache_dir, force=force, progress=not as_json)
    metadata = load_metadata(path)
    if as_json:
        print(json.dumps({"path": str(path), "cached": cached, **metadata}, default=str))
        return
    console.print(f"bootstrap model: {path}{'  (cached)' if cached else ''}")
    for key in ("base", "parameters", "steps", "train_time_s", "build_time_s", "final_loss"):
        if key in metadata:
            console.print(f"  {key}: {metadata[key]}")
    evaluation = metadata.get("eval") or {}
    if evaluation:
        overall = evaluation.get("overall", {})
        console.print(
            f"  {evaluation.get('split', 'validation')} success: "
            f"{overall.get('success_rate', 0):.1%} of {overall.get('episodes', '?')} tasks"
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
        int | None, typer.Option(help="Steps per user turn (world 12, bfcl 20 as BFCL).")
    ] = None,
    limit: Annotated[int | None, typer.Option(help="Only the first N tasks of each set.")] = None,
    save: Annotated[
        str | None, typer.Option(help="Write the trajectories to this JSONL file.")
    ] = None,
    as_json: Annotated[bool, typer.Option("--json", help="Print the report as JSON.")] = False,
    report_path: Annotated[
        str | None, typer.Option("--report", help="Also write the JSON report to this file.")
    ] = None,
) -> None:
    """Roll out a policy on a task set and report success overall and per family/category."""
    from .agents.evaluation import evaluate
    from .agents.policy import PolicyError
    from .agents.rollout import run_rollouts
    from .config import ConfigError

    scopes, key = _scopes(env, split or ("heldout" if env == "world" else None), category)
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
    if report_path:
        from pathlib import Path

        Path(report_path).parent.mkdir(parents=True, exist_ok=True)
        Path(report_path).write_text(json.dumps(report.as_json(), indent=2) + "\n")
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


def _read_trajectories(path: str) -> list[Any]:
    from pathlib import Path

    from pydantic import ValidationError

    from .records import Trajectory

    file = Path(path)
    if not file.is_file():
        raise _fail(f"{path} does not exist (write rollouts with `coevolve eval --save FILE`)")
    trajectories = []
    for number, line in enumerate(file.read_text(encoding="utf-8").splitlines(), start=1):
        if not line.strip():
            continue
        try:
            trajectories.append(Trajectory.model_validate_json(line))
        except ValidationError as err:
            raise _fail(f"{path}:{number} is not a trajectory: {err.errors()[0]['msg']}") from None
    if not trajectories:
        raise _fail(f"{path} holds no trajectories")
    return trajectories


@app.command("synthesize")
def synthesize_command(
    rollouts: Annotated[
        str, typer.Argument(help="Trajectories as JSON lines (coevolve eval --save).")
    ],
    config_path: Annotated[
        str | None, typer.Option("--config", help="YAML config (signals, synthesis, endpoints).")
    ] = None,
    store: Annotated[
        str | None, typer.Option(help="Chroma store directory (default: <run_dir>/task_store).")
    ] = None,
    cycle: Annotated[int, typer.Option(help="Cycle number recorded as provenance.")] = 0,
    out: Annotated[
        str | None,
        typer.Option(help="Where to write accepted tasks (default: ROLLOUTS.synthesized.jsonl)."),
    ] = None,
    as_json: Annotated[
        bool, typer.Option("--json", help="Print counts and roles as JSON.")
    ] = False,
) -> None:
    """One synthesis pass from saved trajectories: signals, the synthesis graph, dedup."""
    import asyncio
    import logging
    from collections import Counter
    from pathlib import Path

    from .agents.roles import build_roles
    from .config import ConfigError, load_config
    from .envs.catalog import seed_tasks_by_id
    from .graph.synthesis import SynthesisRuntime, env_factory, synthesize
    from .memory.history import OutcomeHistory
    from .memory.patterns import PatternCounts
    from .memory.signals import detect_signals
    from .memory.store import TaskStore

    try:
        config = load_config(config_path)
    except ConfigError as err:
        raise _fail(str(err)) from None
    trajectories = _read_trajectories(rollouts)
    envs = {t.env for t in trajectories}
    if len(envs) != 1:
        raise _fail(
            f"{rollouts} mixes environments ({', '.join(sorted(envs))}); synthesize one at a time"
        )
    env_name = envs.pop()
    parents = seed_tasks_by_id(env_name, {t.task_id for t in trajectories})
    missing = {t.task_id for t in trajectories} - set(parents)
    if missing:
        err_console.print(
            f"[yellow]{len(missing)} trajectories name tasks that are not seed tasks; skipped[/yellow]"
        )
    trajectories = [t for t in trajectories if t.task_id in parents]
    flagged = detect_signals(trajectories, OutcomeHistory(), PatternCounts(), config.signals, cycle)
    kinds = Counter(kind for item in flagged for kind in item.kinds)
    if not as_json:
        console.print(
            f"{len(trajectories)} trajectories of {len(parents)} tasks; flagged {len(flagged)} "
            f"({', '.join(f'{k} {n}' for k, n in sorted(kinds.items())) or 'none'})"
        )
    logging.basicConfig(level=logging.WARNING)
    try:
        roles = build_roles(config.synthesis.roles, config.endpoints)
    except ValueError as err:
        raise _fail(str(err)) from None
    store_path = store or config.store_path()
    task_store = TaskStore(
        None if config.synthesis.store_url else store_path,
        server_url=config.synthesis.store_url,
        threshold=config.synthesis.dedup_threshold,
    )
    runtime = SynthesisRuntime(
        roles=roles,
        make_env=env_factory(env_name),
        store=task_store,
        neighbours=config.synthesis.neighbours,
    )
    result = asyncio.run(
        synthesize(
            flagged, list(parents.values()), runtime, cycle, config.synthesis.max_concurrency
        )
    )
    target = Path(out or f"{Path(rollouts).with_suffix('')}.synthesized.jsonl")
    target.parent.mkdir(parents=True, exist_ok=True)
    target.write_text(
        "".join(task.model_dump_json() + "\n" for task in result.accepted), encoding="utf-8"
    )
    if as_json:
        print(
            json.dumps(
                {
                    "counts": result.counts,
                    "signals": dict(kinds),
                    "roles": result.roles,
                    "out": str(target),
                }
            )
        )
        return
    table = Table(title="synthesis stages")
    table.add_column("stage")
    table.add_column("count", justify="right")
    for stage, count in result.counts.items():
        table.add_row(stage, str(count))
    console.print(table)
    console.print("roles: " + ", ".join(f"{k}={v}" for k, v in result.roles.items()))
    reasons = Counter(f"{r.stage}: {r.reason.split(' (')[0][:70]}" for r in result.rejections)
    for reason, count in reasons.most_common(5):
        console.print(f"  [dim]{count:4d} × {reason}[/dim]")
    console.print(
        f"accepted tasks → {target}  (store: {store_path if not config.synthesis.store_url else config.synthesis.store_url})"
    )


@app.command("run")
def run_command(
    config_path: Annotated[
        str | None,
        typer.Argument(help="YAML config (default: configs/quickstart.yaml, the CPU quickstart)."),
    ] = None,
    resume: Annotated[
        str | None,
        typer.Option("--resume", help="Continue the killed run in this run directory."),
    ] = None,
    cycles: Annotated[int | None, typer.Option(help="Override the config's cycles.")] = None,
    run_dir: Annotated[str | None, typer.Option(help="Override the config's run_dir.")] = None,
    overwrite: Annotated[
        bool, typer.Option("--overwrite", help="Delete a finished or killed run in run_dir first.")
    ] = False,
    as_json: Annotated[
        bool, typer.Option("--json", help="Print the per-cycle summaries as JSON at the end.")
    ] = False,
    overrides: SetOption = None,
    debug: Annotated[
        bool,
        typer.Option("--debug", help="On an error that stops the run, show the full traceback."),
    ] = False,
) -> None:
    """The main job: the closed loop (rollout, signals, synthesis, pool, TRL+LoRA training, eval).

    An error that stops a run (an endpoint that refuses an adapter or is gone
    for longer than its retries) prints one line: what failed and the
    `coevolve run --resume` command that continues; --debug shows the traceback.
    """
    from pathlib import Path

    from .config import ConfigError, load_config
    from .report import print_summary
    from .runner import RunError, run, summary_payload
    from .runner import resume as resume_run

    quiet = Console(stderr=True) if as_json else console
    target = resume or run_dir or "RUN_DIR"  # the run directory, once known
    try:
        if resume is not None:
            if config_path is not None or cycles is not None or run_dir is not None or overrides:
                raise _fail(
                    "--resume takes the run's saved config; give no CONFIG, --cycles, --run-dir "
                    "or --set"
                )
            target = resume
            result = resume_run(resume, console=quiet)
        else:
            source = config_path or str(
                Path(__file__).resolve().parent / "configs" / "quickstart.yaml"
            )
            sets = list(overrides or [])
            if cycles is not None:
                sets.append(f"cycles={cycles}")
            if run_dir is not None:
                sets.append(f"run_dir={json.dumps(run_dir)}")
            config = load_config(source, sets)
            try:
                from .tracking import require_backends

                require_backends(config.tracking)
            except RuntimeError as err:
                raise _fail(str(err)) from None
            quiet.print(
                f"[bold]coevolve run[/bold] {source}: {config.cycles} cycles on {config.env.name}, "
                f"policy {config.policy.model if config.policy.kind == 'local' else config.policy.endpoint}, "
                f"training {config.training.algorithm} → {config.run_dir}"
            )
            target = config.run_dir
            result = run(config, overwrite=overwrite, console=quiet, overrides=sets)
    except (ConfigError, RunError) as err:
        raise _fail(str(err)) from None
    except typer.Exit:  # an error already reported (it is a RuntimeError too)
        raise
    except Exception as err:
        if debug:
            raise
        raise _fail(stop_message(err, target), code=1) from None
    print_summary(quiet, result.cycles, result.pool)
    quiet.print(
        f"report: {result.report}  metrics: {result.metrics}  tasks: {result.tasks}  "
        f"({result.elapsed_s / 60:.1f} min)"
    )
    if as_json:
        print(json.dumps(summary_payload(result), indent=2))


def stop_message(err: BaseException, run_dir: str) -> str:
    """One line for an error that stopped a run: what failed, and how to continue."""
    import shlex

    from .agents.policy import PolicyError

    what = _endpoint_error(err)
    hint = ""
    if what is None:
        if isinstance(err, PolicyError):
            what = str(err)  # it names the endpoint
        else:
            what = f"{type(err).__name__}: {err}"
            hint = " (--debug shows the traceback)"
    what = " ".join(what.split())  # one line
    if len(what) > 600:
        what = what[:600] + "..."
    return (
        f"{what}; the run stopped, continue it with: coevolve run --resume "
        f"{shlex.quote(str(run_dir))}{hint}"
    )


def _endpoint_error(err: BaseException) -> str | None:
    """'endpoint URL: error' for an HTTP error that escaped a client (openai, httpx)."""
    import httpx

    request = getattr(err, "request", None)
    if isinstance(err, httpx.HTTPError):
        try:
            request = err.request
        except RuntimeError:  # an httpx error made without its request
            request = None
    elif type(err).__module__.split(".")[0] != "openai":
        return None
    url = getattr(request, "url", None)
    where = f"endpoint {url}" if url is not None else "endpoint"
    return f"{where}: {type(err).__name__}: {err}"


@bench_app.command("learning")
def bench_learning(
    config_path: Annotated[
        str | None,
        typer.Option("--config", help="Base config (default: configs/bench-learning.yaml)."),
    ] = None,
    seeds: Annotated[int, typer.Option(help="Seeds per arm (0..N-1).")] = 3,
    arms: Annotated[
        str | None,
        typer.Option(
            help="Comma-separated arms (default: all): static, random, coevolve, "
            "coevolve-paper, oracle-targeted (reads validation: a reference ceiling), "
            "no-forgetting, no-boundary, no-rare, no-unsolved, grpo, seal, "
            "seal-no-reweighting, seal-no-adaptation, hard-negatives, own-negatives. "
            "Finished (arm, seed) units are skipped on a rerun."
        ),
    ] = None,
    quick: Annotated[
        bool,
        typer.Option(
            "--quick",
            help="Seconds-long settings (the tiny test model, one cycle, a few tasks): checks "
            "the bench runs end to end; its numbers mean nothing.",
        ),
    ] = False,
    out: Annotated[
        str | None, typer.Option(help="Output directory (default: runs/bench-learning).")
    ] = None,
    as_json: Annotated[bool, typer.Option("--json", help="Print the report as JSON.")] = False,
    report_only: Annotated[
        bool,
        typer.Option(
            "--report-only",
            help="Run nothing: write the report from the units finished so far (a bench run "
            "in pieces, read between them).",
        ),
    ] = False,
    overrides: SetOption = None,
) -> None:
    """The learning ablation: static vs random vs signal-guided synthesis, same compute, over seeds."""
    from pathlib import Path

    import yaml

    from .ablation import ARMS, print_report, run_ablation
    from .config import ConfigError, load_config

    source = config_path or str(Path(__file__).resolve().parent / "configs" / "bench-learning.yaml")
    try:
        base = load_config(source).model_dump(mode="json")
    except ConfigError as err:
        raise _fail(str(err)) from None
    if quick:
        from .training.bootstrap import BootstrapConfig

        base.update(QUICK_BENCH)
        base["bootstrap"] = BootstrapConfig.tiny().model_dump(mode="json")
        source += " (--quick)"
    if overrides:  # after --quick: what the command line sets wins
        try:
            base = load_config(base, overrides).model_dump(mode="json")
        except ConfigError as err:
            raise _fail(str(err)) from None
        source += "".join(f" --set {item}" for item in overrides)
    chosen = [a.strip() for a in arms.split(",")] if arms else list(ARMS)
    unknown = [a for a in chosen if a not in ARMS]
    if unknown:
        raise _fail(f"unknown arms {unknown}; allowed: {', '.join(ARMS)}")
    if seeds < 1:
        raise _fail("--seeds must be at least 1 (2 or more for intervals)")
    out_dir = Path(out or ("runs/bench-learning-quick" if quick else "runs/bench-learning"))
    if report_only and not any((out_dir / "units").glob("*.json")):
        raise _fail(f"--report-only: no finished units in {out_dir / 'units'}")
    out_dir.mkdir(parents=True, exist_ok=True)
    (out_dir / "base-config.yaml").write_text(yaml.safe_dump(base, sort_keys=False))
    quiet = Console(stderr=True) if as_json else console
    try:
        report = run_ablation(
            base,
            seeds=list(range(seeds)),
            arms=chosen,
            out_dir=out_dir,
            config_name=_display_path(source),
            console=quiet,
            run_missing=not report_only,
        )
    except ConfigError as err:
        raise _fail(str(err)) from None
    print_report(quiet, report)
    quiet.print(f"curves: {report.plot}  report: {out_dir / 'report.json'}")
    if as_json:
        print(report.model_dump_json(indent=2))


# The --quick bench: everything small enough for the test suite.
QUICK_BENCH: dict[str, Any] = {
    "cycles": 1,
    "rollout": {"k": 2, "temperature": 0.9, "eval_temperature": 0.0, "max_steps": 2},
    "policy": {"kind": "local", "model": "bootstrap", "max_new_tokens": 16},
    "pool": {"rollout_tasks": 6, "seed_tasks": 60, "replay_demonstrations": 2},
    "signals": {"rare_min_observations": 4, "budget": 4},
    "synthesis": {"max_accepted": 2, "max_concurrency": 2},
    "training": {"max_steps": 1, "batch_size": 2},
    "evaluation": {"split": "heldout", "per_family": 1},
}


@app.command("export")
def export_command(
    run_dir: Annotated[str, typer.Argument(help="A run directory (coevolve run).")],
    out: Annotated[str, typer.Argument(help="Output directory.")],
    format: Annotated[
        str,
        typer.Option(
            "--format",
            help="jsonl: OUT/tasks.jsonl, OUT/sft.jsonl, OUT/dpo.jsonl; hf: a datasets "
            "DatasetDict with those splits (datasets.load_from_disk(OUT)).",
        ),
    ] = "jsonl",
    as_json: Annotated[bool, typer.Option("--json", help="Print the row counts as JSON.")] = False,
) -> None:
    """Export a run's synthesized tasks (with provenance) and each cycle's training examples."""
    from .export import export_run

    if format not in ("jsonl", "hf"):
        raise _fail(f"unknown --format {format!r}; allowed: jsonl, hf")
    try:
        counts = export_run(run_dir, out, format)  # type: ignore[arg-type]
    except (FileNotFoundError, ValueError) as err:
        raise _fail(str(err)) from None
    if as_json:
        print(json.dumps(counts))
    else:
        rows = ", ".join(f"{name} {count}" for name, count in counts.items())
        err_console.print(f"exported {rows} rows to {out} ({format})")


@app.command("studio")
def studio(
    port: Annotated[int, typer.Option(help="Port of the local LangGraph server.")] = 2024,
    browser: Annotated[bool, typer.Option(help="Open Studio in a browser.")] = False,
) -> None:
    """Serve the graphs to LangGraph Studio (langgraph dev on 127.0.0.1, offline-safe)."""
    import os
    import shutil
    import subprocess
    from pathlib import Path

    executable = shutil.which("langgraph") or str(Path(sys.executable).parent / "langgraph")
    if not Path(executable).exists():
        raise _fail(
            "the langgraph CLI is missing; install the studio extra: pip install 'coevolve[studio]'"
        )
    config = Path(__file__).resolve().parent / "langgraph.json"
    env = {**os.environ, "LANGGRAPH_CLI_NO_ANALYTICS": "1", "LANGGRAPH_NO_VERSION_CHECK": "true"}
    api = f"http://127.0.0.1:{port}"
    console.print(f"API:    {api}  (health: {api}/ok)")
    console.print(f"Studio: https://smith.langchain.com/studio/?baseUrl={api}")
    command = [
        executable,
        "dev",
        "--host",
        "127.0.0.1",
        "--port",
        str(port),
        "--config",
        str(config),
        "--allow-blocking",
    ]
    if not browser:
        command.append("--no-browser")
    try:
        raise typer.Exit(subprocess.call(command, cwd=config.parent, env=env))
    except KeyboardInterrupt:
        raise typer.Exit(0) from None


@config_app.command("show")
def config_show(
    path: Annotated[
        str | None, typer.Argument(help="YAML config (default: built-in defaults).")
    ] = None,
    overrides: SetOption = None,
) -> None:
    """Validate a config and print it with every default filled in (and --set applied)."""
    import yaml

    from .config import ConfigError, load_config

    try:
        config = load_config(path, overrides or [])
    except ConfigError as err:
        raise _fail(str(err)) from None
    print(yaml.safe_dump(config.model_dump(mode="json"), sort_keys=False), end="")


def _display_path(path: str) -> str:
    """A path as a report should record it: relative to the working directory (or to the
    package) when it lies inside, so committed reports carry no machine's absolute paths."""
    resolved = Path(path.split(" ", 1)[0]).resolve()
    rest = path[len(path.split(" ", 1)[0]) :]
    for root in (Path.cwd(), Path(__file__).resolve().parent):
        try:
            return str(resolved.relative_to(root)) + rest
        except ValueError:
            continue
    return path


def main() -> None:
    # A person sees coevolve's stage lines and one bar per stage; the libraries' own
    # bars (weight loading, dataset maps, GGUF dequantisation) would interleave with them.
    os.environ.setdefault("HF_HUB_DISABLE_PROGRESS_BARS", "1")
    os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")
    os.environ.setdefault("HF_DATASETS_DISABLE_PROGRESS_BARS", "1")
    os.environ.setdefault("TQDM_DISABLE", "1")  # read by tqdm at import: GGUF dequantisation
    try:
        app()
    except KeyboardInterrupt:
        err_console.print("interrupted")
        sys.exit(130)


if __name__ == "__main__":
    main()
