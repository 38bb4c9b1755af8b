"""``coevolve synthesize``: one synthesis pass from saved trajectories."""

from __future__ import annotations

import json
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import typer
from rich.table import Table

from .common import DebugOption, console, err_console, fail, load_config_or_fail

if TYPE_CHECKING:  # pragma: no cover
    from ..graph.synthesis.state import SynthesisResult
    from ..records import Task, Trajectory


def _read_trajectories(path: str) -> list[Any]:
    from pathlib import Path

    from pydantic import ValidationError

    from ..common.files import jsonl_lines
    from ..records import Trajectory, split_transport_failures

    file = Path(path)
    if not file.is_file():
        raise fail(f"{path} does not exist (write rollouts with `coevolve eval --save FILE`)")
    trajectories = []
    for number, line in enumerate(jsonl_lines(file.read_text(encoding="utf-8")), start=1):
        if not line.strip():
            continue
        try:
            trajectories.append(Trajectory.model_validate_json(line))
        except ValidationError as err:
            raise fail(f"{path}:{number} is not a trajectory: {err.errors()[0]['msg']}") from None
    if not trajectories:
        raise fail(f"{path} holds no trajectories")
    # Episodes the endpoint gave no reply for (`coevolve eval --save` keeps them) are no
    # outcomes of the agent: no signal may flag them.
    trajectories, lost = split_transport_failures(trajectories)
    if lost:
        err_console.print(
            f"[yellow]{len(lost)} trajectories got no reply from the endpoint; left out[/yellow]"
        )
    if not trajectories:
        raise fail(f"{path}: no trajectory got a reply from the endpoint", code=1)
    return trajectories


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
    debug: DebugOption = False,
) -> None:
    """One synthesis pass from saved trajectories: signals, the synthesis graph, dedup."""
    import asyncio
    import logging
    from collections import Counter

    from ..graph.synthesis.graph import run_synthesis
    from ..loop.build_runtime import build_synthesis_runtime
    from ..memory.history import OutcomeHistory
    from ..memory.patterns import PatternCounts
    from ..memory.signals import detect_signals

    config = load_config_or_fail(config_path)
    env_name, parents, trajectories = _trajectories_of_seed_tasks(rollouts)
    flagged = detect_signals(trajectories, OutcomeHistory(), PatternCounts(), config.signals, cycle)
    kinds = Counter(kind for item in flagged for kind in item.kinds)
    if not as_json:
        console.print(
            f"{len(trajectories)} trajectories of {len(parents)} tasks; flagged {len(flagged)} "
            f"({', '.join(f'{k} {n}' for k, n in sorted(kinds.items())) or 'none'})"
        )
    logging.basicConfig(level=logging.WARNING)
    try:
        store_path = store or config.store_path()
        runtime = build_synthesis_runtime(config, env_name, store_path)
    except ValueError as err:
        raise fail(str(err)) from None
    result = asyncio.run(
        run_synthesis(
            flagged, list(parents.values()), runtime, cycle, config.synthesis.max_concurrency
        )
    )
    target, rejected = _write_synthesis(result, rollouts, out)
    if as_json:
        print(
            json.dumps(
                {
                    "counts": result.counts,
                    "signals": dict(kinds),
                    "roles": result.roles,
                    "out": str(target),
                    "rejections": str(rejected),
                }
            )
        )
        return
    _print_synthesis(result, rejected)
    console.print(
        f"accepted tasks → {target}  (store: {store_path if not config.synthesis.store_url else config.synthesis.store_url})"
    )


def _trajectories_of_seed_tasks(rollouts: str) -> tuple[str, dict[str, Task], list[Trajectory]]:
    """The environment of the trajectories in ``rollouts`` (one, or the error exit), their
    seed tasks by id, and the trajectories of seed tasks (the others are skipped, with a
    warning)."""
    from ..envs.catalog import seed_tasks_by_id

    trajectories = _read_trajectories(rollouts)
    envs = {t.env for t in trajectories}
    if len(envs) != 1:
        raise fail(
            f"{rollouts} mixes environments ({', '.join(sorted(envs))}); synthesize one at a time"
        )
    env_name = envs.pop()
    parents = seed_tasks_by_id(env_name, {t.task_id for t in trajectories})
    missing = {t.task_id for t in trajectories} - set(parents)
    if missing:
        err_console.print(
            f"[yellow]{len(missing)} trajectories name tasks that are not seed tasks; skipped[/yellow]"
        )
    return env_name, parents, [t for t in trajectories if t.task_id in parents]


def _write_synthesis(result: SynthesisResult, rollouts: str, out: str | None) -> tuple[Path, Path]:
    """Write the accepted tasks (``out``, default ROLLOUTS.synthesized.jsonl) and, beside
    them, every rejection with its stage and reason, as a run's cycle keeps them."""
    target = Path(out or f"{Path(rollouts).with_suffix('')}.synthesized.jsonl")
    target.parent.mkdir(parents=True, exist_ok=True)
    target.write_text(
        "".join(task.model_dump_json() + "\n" for task in result.accepted), encoding="utf-8"
    )
    rejected = target.with_name(
        target.name.removesuffix(".synthesized.jsonl") + ".rejections.jsonl"
    )
    rejected.write_text(
        "".join(r.model_dump_json() + "\n" for r in result.rejections), encoding="utf-8"
    )
    return target, rejected


def _print_synthesis(result: SynthesisResult, rejected: Path) -> None:
    """The pass's count per stage, its roles, and its five most frequent rejections."""
    from collections import Counter

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
    console.print(f"rejections with their reasons → {rejected}")
