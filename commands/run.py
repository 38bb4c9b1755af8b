"""``coevolve run`` (the closed loop, and the one-line message when an error stops it) and
``coevolve export`` (a run's tasks and training examples)."""

from __future__ import annotations

import json
from typing import TYPE_CHECKING, Annotated

import typer
from rich.console import Console

from ..common.errors import PROGRAMMING_ERRORS
from .common import PACKAGE_DIR, SetOption, console, err_console, fail

if TYPE_CHECKING:  # pragma: no cover
    from ..config import CoevolveConfig
    from ..runner import RunResult


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
    verbose: Annotated[
        bool,
        typer.Option(
            "--verbose",
            help="Also show on stderr what goes to RUN_DIR/run.log: the trainers' per-step "
            "log dicts, the roles' log lines.",
        ),
    ] = False,
) -> None:
    """The main job: the closed loop (rollout, signals, synthesis, pool, TRL+LoRA training, eval).

    An error that stops a run (an endpoint that refuses an adapter, or gives no
    reply to more than rollout.max_unreachable_share of a stage's episodes)
    prints one line: what failed and the `coevolve run --resume` command that
    continues, exit code 1; --debug shows the traceback. A run holds its
    directory (RUN_DIR/run.lock): another run, resume or --overwrite there is
    refused while it lives.
    The trainers' per-step logs go to RUN_DIR/run.log; --verbose shows them too.
    """

    from ..config import ConfigError
    from ..runner import RunError, run
    from ..runner import resume as resume_run

    quiet = Console(stderr=True) if as_json else console
    target = resume or run_dir or "RUN_DIR"  # the run directory, once known
    try:
        if resume is not None:
            if config_path is not None or cycles is not None or run_dir is not None or overrides:
                raise fail(
                    "--resume takes the run's saved config; give no CONFIG, --cycles, --run-dir "
                    "or --set"
                )
            target = resume
            result = resume_run(resume, console=quiet, verbose=verbose)
        else:
            config, source, sets = _run_config(config_path, cycles, run_dir, overrides)
            quiet.print(_first_line(config, source))
            target = config.run_dir
            result = run(
                config, overwrite=overwrite, console=quiet, overrides=sets, verbose=verbose
            )
    except (ConfigError, RunError) as err:
        raise fail(str(err)) from None
    except typer.Exit:  # an error already reported (it is a RuntimeError too)
        raise
    except PROGRAMMING_ERRORS:  # a bug: its traceback, not a one-line message
        raise
    except Exception as err:  # boundary: the CLI turns what stopped a run into one line
        if debug:
            raise
        raise fail(stop_message(err, target), code=1) from None
    _print_result(quiet, result, as_json)


def _print_result(quiet: Console, result: RunResult, as_json: bool) -> None:
    """The finished run's tables, where its files are and how long it took, and with
    --json its per-cycle summaries."""
    from ..outputs.report import print_summary
    from ..runner import summary_payload

    print_summary(quiet, result.cycles, result.pool)
    quiet.print(
        f"report: {result.report}  metrics: {result.metrics}  tasks: {result.tasks}  "
        f"({result.elapsed_s / 60:.1f} min)"
    )
    if as_json:
        print(json.dumps(summary_payload(result), indent=2))


def _run_config(
    config_path: str | None, cycles: int | None, run_dir: str | None, overrides: list[str] | None
) -> tuple[CoevolveConfig, str, list[str]]:
    """The run's config (CONFIG, default the quickstart's, with --set, --cycles and
    --run-dir over it; its trackers' packages installed, or the error exit), where it came
    from, and the overrides the run records."""
    from ..config import load_config

    source = config_path or str(PACKAGE_DIR / "configs" / "quickstart.yaml")
    sets = list(overrides or [])
    if cycles is not None:
        sets.append(f"cycles={cycles}")
    if run_dir is not None:
        sets.append(f"run_dir={json.dumps(run_dir)}")
    config = load_config(source, sets)
    try:
        from ..outputs.tracking import require_backends

        require_backends(config.tracking)
    except RuntimeError as err:
        raise fail(str(err)) from None
    return config, source, sets


def _first_line(config: CoevolveConfig, source: str) -> str:
    """A run's first line: its config, cycles, environment, policy, synthesizer, training
    and run directory."""
    return (
        f"[bold]coevolve run[/bold] {source}: {config.cycles} cycles on {config.env.name}, "
        f"policy {config.policy.model if config.policy.kind == 'local' else config.policy.endpoint}, "
        f"synthesizer {config.synthesis.synthesizer if config.synthesis.enabled else 'none'}, "
        f"training {config.training.algorithm} → {config.run_dir}"
    )


def stop_message(err: BaseException, run_dir: str) -> str:
    """One line for an error that stopped a run: what failed, and how to continue."""
    import shlex

    from ..agents.policy.policy_interface import PolicyError

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


def export_command(
    run_dir: Annotated[str, typer.Argument(help="A run directory (coevolve run).")],
    out: Annotated[str, typer.Argument(help="Output directory.")],
    format: Annotated[
        str,
        typer.Option(
            "--format",
            help="jsonl: OUT/tasks.jsonl, OUT/sft.jsonl, OUT/dpo.jsonl, OUT/grpo.jsonl; hf: the same tables as "
            "parquet. Either way one configuration per table in OUT/README.md: "
            "datasets.load_dataset(OUT, 'sft', split='train').",
        ),
    ] = "jsonl",
    as_json: Annotated[bool, typer.Option("--json", help="Print the row counts as JSON.")] = False,
    push_to_hub: Annotated[
        str | None,
        typer.Option(
            "--push-to-hub",
            metavar="REPO",
            help="Also push the tables to the Hub dataset REPO (one configuration per table: "
            "load_dataset(REPO, 'sft')); needs a token (huggingface-cli login) and the network.",
        ),
    ] = None,
    private: Annotated[
        bool, typer.Option("--private", help="--push-to-hub: create the dataset private.")
    ] = False,
) -> None:
    """Export a run's synthesized tasks (with provenance) and each cycle's training examples
    (SFT, DPO, GRPO prompts: tables TRL's trainers take as they are)."""
    from ..outputs.export import HubPushError, export_run, push_tables

    if format not in ("jsonl", "hf"):
        raise fail(f"unknown --format {format!r}; allowed: jsonl, hf")
    try:
        counts = export_run(run_dir, out, format)  # type: ignore[arg-type]
        if push_to_hub is not None:
            push_tables(run_dir, push_to_hub, private)
    except (FileNotFoundError, ValueError, HubPushError) as err:
        raise fail(str(err)) from None
    if as_json:
        print(json.dumps(counts))
    else:
        rows = ", ".join(f"{name} {count}" for name, count in counts.items())
        err_console.print(f"exported {rows} rows to {out} ({format})")
        if push_to_hub is not None:
            err_console.print(f"pushed {', '.join(counts)} to the Hub dataset {push_to_hub}")
