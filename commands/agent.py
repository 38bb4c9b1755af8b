"""``coevolve bootstrap`` and ``coevolve eval``: build the bootstrap agent, evaluate a policy."""

from __future__ import annotations

import json
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import typer
from rich.table import Table

from .common import (
    ENV_HELP,
    MAIN_CONFIG,
    CacheDirOption,
    DebugOption,
    bootstrap_recipe,
    console,
    env_scopes,
    env_spec,
    err_console,
    fail,
    load_env_tasks,
    load_policy,
    note_skipped_lines,
    run_of_policy,
    split_help,
)

if TYPE_CHECKING:  # pragma: no cover
    from ..agents.policy.eval_report import EvalReport
    from ..agents.policy.policy_interface import Policy
    from ..config import CoevolveConfig
    from ..envs.registry import EnvironmentSpec
    from ..records import Task, Trajectory


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
            help="smollm2: LoRA SFT of SmolLM2-135M-Instruct (the default agent); a Hugging "
            "Face model id or a local model directory: LoRA SFT of that model; tiny: the "
            "seconds-long from-scratch test preset (learns nothing useful).",
        ),
    ] = None,
    tiny: Annotated[bool, typer.Option("--tiny", help="Same as --base tiny.")] = False,
    cache_dir: CacheDirOption = None,
    as_json: Annotated[
        bool, typer.Option("--json", help="Print the build's metadata as JSON.")
    ] = False,
    debug: DebugOption = False,
) -> None:
    """Build the bootstrap agent: SmolLM2-135M-Instruct (or --base: any Hugging Face model)
    after LoRA SFT on the seed split. Cached."""
    from ..config import load_config
    from ..training.bootstrap.build import (
        bootstrap,
        bootstrap_dir,
        evaluate_cached_build,
        is_complete,
        load_metadata,
    )

    config = bootstrap_recipe(config_path, "tiny" if tiny else base)
    cached = is_complete(bootstrap_dir(config, cache_dir)) and not force
    path = bootstrap(config, cache_dir=cache_dir, force=force, progress=not as_json)
    metadata = load_metadata(path)
    wanted = config.eval_split
    if wanted is not None and (metadata.get("eval") or {}).get("split") != wanted:
        # A cached build made without this evaluation (the loop builds its agent with
        # eval_split null): the command promises the figure, so measure it now.
        metadata = evaluate_cached_build(path, config, progress=not as_json)
    if as_json:
        print(json.dumps({"path": str(path), "cached": cached, **metadata}, default=str))
        return
    main = load_config(MAIN_CONFIG).bootstrap.cache_key()
    which = (
        "the main job's agent"
        if config.cache_key() == main
        else f"recipe {config.cache_key()}, not the main job's {main}"
    )
    console.print(f"bootstrap model: {path}{'  (cached)' if cached else ''} ({which})")
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


def eval_command(
    env: Annotated[
        str | None,
        typer.Option("--env", help=f"{ENV_HELP} (default: the run's, else world)."),
    ] = None,
    split: Annotated[
        str | None,
        typer.Option(help=split_help("the run's evaluation.split, else heldout")),
    ] = None,
    category: Annotated[str | None, typer.Option(help="BFCL category (default: all four).")] = None,
    policy: Annotated[
        str,
        typer.Option(
            help="oracle, bootstrap, a model directory, a YAML config with a policy section, "
            "or a run's adapter: RUN_DIR/adapters/cycle-N, or RUN_DIR for its last one (with "
            "the run's bootstrap agent, environment, evaluation split and tasks per family)."
        ),
    ] = "bootstrap",
    k: Annotated[int, typer.Option(help="Episodes per task.")] = 1,
    temperature: Annotated[float, typer.Option(help="Sampling temperature (0: greedy).")] = 0.0,
    max_tool_calls: Annotated[
        int | None,
        typer.Option(
            help="Tool-calling replies per user turn (world 12, bfcl 20 as BFCL, yours twice "
            "its longest reference turn; a run's adapter: the run's rollout.max_tool_calls)."
        ),
    ] = None,
    max_steps: Annotated[
        int | None, typer.Option("--max-steps", hidden=True, help="Old name of --max-tool-calls.")
    ] = None,
    limit: Annotated[int | None, typer.Option(help="Only the first N tasks of each set.")] = None,
    save: Annotated[
        str | None, typer.Option(help="Write the trajectories to this JSONL file.")
    ] = None,
    as_json: Annotated[bool, typer.Option("--json", help="Print the report as JSON.")] = False,
    report_path: Annotated[
        str | None, typer.Option("--report", help="Also write the JSON report to this file.")
    ] = None,
    debug: DebugOption = False,
) -> None:
    """Roll out a policy on a task set and report success overall and per family/category.

    Episodes an endpoint gave no usable reply for are left out of every rate and counted
    apart (left_out); when none got one, the command ends in one line, with exit code 1."""
    from ..agents.policy.eval_report import evaluation_report

    if max_steps is not None:
        err_console.print("--max-steps is now --max-tool-calls (the old name goes in a release)")
        max_tool_calls = max_tool_calls or max_steps
    run, env, max_tool_calls = _run_of_adapter(policy, env, max_tool_calls)
    spec = env_spec(env)
    scopes, key, env_class, tasks = _eval_tasks(run, env, spec, split, category, limit)
    note_skipped_lines(env)
    agent = _load_eval_policy(run or policy)
    trajectories = _eval_rollouts(
        agent,
        env_class,
        tasks,
        k=k,
        temperature=temperature,
        max_tool_calls=max_tool_calls or spec.max_tool_calls,
        progress=not as_json,
        description=f"eval {env} {','.join(scopes)}",
        save=save,
    )
    report = evaluation_report(trajectories, tasks, env, {key: ",".join(scopes)}, agent.version)
    if report_path:
        Path(report_path).parent.mkdir(parents=True, exist_ok=True)
        Path(report_path).write_text(json.dumps(report.as_json(), indent=2) + "\n")
    if as_json:
        print(json.dumps(report.as_json(), indent=2))
        return
    console.print(f"[bold]{env}[/bold] {key}={','.join(scopes)}  policy={agent.version}")
    _print_eval_table(report, spec.family_label)
    _print_eval_notes(report)


def _run_of_adapter(
    policy: str, env: str | None, max_tool_calls: int | None
) -> tuple[CoevolveConfig | None, str, int | None]:
    """The run whose adapter --policy names (None: not a run's adapter), the environment
    to measure on (--env, else the run's, else world) and the tool-call bound (the run's
    when --max-tool-calls is not given).

    A run's adapter is measured as the run measures it (loop.build_runtime.evaluation_tasks:
    its environment, evaluation split, env.seed's cut and tasks per family, and its
    tool-call bound), unless --env, --split, --category or --limit say otherwise."""
    run = run_of_policy(policy)
    if run is not None:
        err_console.print(
            f"{run.policy.adapter}: on the run's bootstrap agent, environment and evaluation",
            soft_wrap=True,
        )
        env = env or run.env.name
        max_tool_calls = max_tool_calls or run.rollout.max_tool_calls
    return run, env or "world", max_tool_calls


def _load_eval_policy(spec: str | CoevolveConfig) -> Any:
    """The policy --policy names (``load_policy``), or the error exit."""
    from ..agents.policy.policy_interface import PolicyError
    from ..config import ConfigError

    try:
        return load_policy(spec)
    except (ConfigError, PolicyError, FileNotFoundError, OSError) as err:
        raise fail(str(err)) from None


def _eval_rollouts(
    agent: Policy,
    env_class: Any,
    tasks: list[Task],
    *,
    description: str,
    save: str | None,
    **rollout: Any,
) -> list[Trajectory]:
    """The episodes of eval (``rollout``: ``run_rollouts``' options), written to --save when
    given; the error exit when the policy fails, with exit code 1 when no episode got a reply
    (there is nothing to report but the endpoint's failure)."""
    from ..agents.policy.eval_report import stop_if_unreachable
    from ..agents.policy.policy_interface import EndpointUnreachable, PolicyError
    from ..agents.policy.rollout import run_rollouts

    try:
        trajectories = run_rollouts(agent, env_class, tasks, description=description, **rollout)
        stop_if_unreachable(trajectories, 1.0, description)
    except EndpointUnreachable as err:
        raise fail(str(err), code=1) from None
    except PolicyError as err:
        raise fail(str(err)) from None
    if save:
        Path(save).parent.mkdir(parents=True, exist_ok=True)
        Path(save).write_text(
            "".join(t.model_dump_json() + "\n" for t in trajectories), encoding="utf-8"
        )
    return trajectories


def _eval_tasks(
    run: CoevolveConfig | None,
    env: str,
    spec: EnvironmentSpec,
    split: str | None,
    category: str | None,
    limit: int | None,
) -> tuple[list[str], str, Any, list[Task]]:
    """The task sets eval measures (their names and whether they are splits or categories),
    the environment class and the tasks: a run's evaluation tasks, as the run measured them,
    unless --env, --split, --category or --limit say otherwise."""
    if (
        run is not None
        and env == run.env.name
        and split in (None, run.evaluation.split)
        and (category, limit) == (None, None)
    ):
        from ..loop.build_runtime import evaluation_tasks

        return [run.evaluation.split], "split", spec.environment, evaluation_tasks(run)
    scopes, key = env_scopes(env, split, category, default=spec.eval_task_sets)
    tasks: list[Task] = []
    env_class = None
    for scope in scopes:
        env_class, scope_tasks = load_env_tasks(env, scope)
        tasks += scope_tasks[:limit]
    return scopes, key, env_class, tasks


def _print_eval_table(report: EvalReport, family_label: str) -> None:
    """The eval report's table: each family's rates and counts, then overall (and the calls
    by the form they were written in, when any was written)."""
    table = Table()
    table.add_column(family_label, no_wrap=True)
    # "failed calls" sums the kinds the footer lists; "policy errors" counts episodes.
    columns = ("episodes", "success", "tool seq", "calls", "failed calls", "policy errors")
    for column in (*columns, "cut off"):
        table.add_column(column, justify="right", no_wrap=True)
    rows = [*report.by_family.items(), ("overall", report.overall)]
    for name, stats in rows:
        table.add_row(
            f"[bold]{name}[/bold]" if name == "overall" else name,
            str(stats.episodes),
            f"{stats.success_rate:.1%} ({stats.successes})",
            f"{stats.tool_sequence_accuracy:.1%}",
            f"{stats.call_accuracy:.1%}",
            str(stats.failed_calls),
            str(stats.errors),
            str(stats.cut_off),
        )
    console.print(table)
    if report.overall.unreadable_calls or any(report.overall.calls_by_form.values()):
        # The oracle hands its calls over unwritten: no form to show.
        console.print(_calls_by_form_table(family_label, rows))


def _print_eval_notes(report: EvalReport) -> None:
    """The warnings under the eval table: failed calls by kind, observations cut, episodes
    left out and policy errors."""
    from ..agents.policy.eval_report import left_out_note
    from ..envs.limits import tool_limits

    if report.overall.call_errors:
        kinds = ", ".join(f"{kind} {n}" for kind, n in report.overall.call_errors.items())
        err_console.print(
            f"[yellow]failed tool calls by kind ({report.overall.failed_calls}): {kinds}[/yellow]"
        )
    if report.overall.observations_cut:
        err_console.print(
            f"[yellow]{report.overall.observations_cut} observations reached the agent cut to "
            f"env.max_observation_chars ({tool_limits().max_observation_chars} characters)"
            "[/yellow]"
        )
    if report.overall.left_out:
        # The rates above are over the episodes that ran; say what they leave out.
        err_console.print(
            f"[yellow]success over the {report.overall.episodes} episodes that ran"
            f"{left_out_note(report.overall.left_out)}; see --save[/yellow]"
        )
    if report.overall.errors:
        err_console.print(
            f"[yellow]{report.overall.errors} episodes ended on a policy error; see --save[/yellow]"
        )


# The column of each form (records.CALL_FORMS) in the calls-by-form table.
_FORM_LABELS = {
    "tool_calls_field": "tool_calls field",
    "tool_call_tag": "<tool_call> tag",
    "bare_json": "bare JSON",
    "fenced_json": "fenced JSON",
    "call_line": "call line",
}


def _calls_by_form_table(family_label: str, rows: list[tuple[str, Any]]) -> Table:
    """How the calls read were written, per family, and the replies that looked like a
    call and could not be read (unreadable_call)."""
    from ..records import CALL_FORMS

    table = Table(title="tool calls by form")
    table.add_column(family_label, no_wrap=True)
    for column in [*(_FORM_LABELS[form] for form in CALL_FORMS), "unreadable"]:
        table.add_column(column, justify="right", no_wrap=True)
    for name, stats in rows:
        table.add_row(
            f"[bold]{name}[/bold]" if name == "overall" else name,
            *(str(stats.calls_by_form.get(form, 0)) for form in CALL_FORMS),
            str(stats.unreadable_calls),
        )
    return table
