"""Running the closed loop: `coevolve run` and ``coevolve.run(config)``.

The runner builds what the cycle graph's nodes use (policy, pool, history,
pattern counts, task store, synthesis roles) from a CoevolveConfig
(``loop/build_runtime.py``), compiles
graph/cycle/graph.py's ``builder`` with a SQLite checkpointer in the run directory,
and runs it. ``resume=True`` continues a killed run from its last finished
node, with the config saved in the run directory. At the end it writes
metrics.jsonl, report.png and summary.json, and returns a RunResult.
The runtime type and RunError (``graph/cycle/context.py``), the runtime construction
and the cycle's training step (``graph/cycle/training_step.py``) live under loop/ so
the cycle graph never imports the runner; they are re-exported here.

The run directory's files are named, read and written in ``run_files.py``.
"""

from __future__ import annotations

import asyncio
import json
import math
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, cast

from pydantic import BaseModel

from .common.errors import RunError
from .graph.cycle.context import CycleRuntime
from .graph.cycle.training_step import sft_weights, train_cycle, use_adapter
from .loop.build_runtime import (
    build_bootstrap_agent,
    build_policy,
    build_runtime,
    evaluation_tasks,
    local_model_dir,
)
from .loop.run_lock import hold_run_dir
from .outputs.summary import CycleSummary
from .run_files import CHECKPOINTS, LOCK_FILE, RunFiles

if TYPE_CHECKING:  # pragma: no cover
    from .config import CoevolveConfig

__all__ = [
    "CHECKPOINTS",
    "THREAD",
    "RunError",
    "RunResult",
    "build_bootstrap_agent",
    "build_policy",
    "build_runtime",
    "evaluation_tasks",
    "local_model_dir",
    "resume",
    "run",
    "sft_weights",
    "summary_payload",
    "train_cycle",
    "use_adapter",
]

THREAD = {"configurable": {"thread_id": "run"}}


class RunResult(BaseModel):
    run_dir: str
    cycles: list[CycleSummary]  # cycle 0 (the starting policy) first
    adapter: str | None
    metrics: str
    report: str | None
    tasks: str
    pool: dict[str, int]  # tasks by source, synthesized ones by signal
    elapsed_s: float
    resumed: bool = False

    def success_by_cycle(self) -> list[float]:
        return [c.evaluate.success if c.evaluate else math.nan for c in self.cycles]


# --------------------------------------------------------------------------- running


def run(
    config: CoevolveConfig | str | Path | dict[str, Any] | None = None,
    *,
    overwrite: bool = False,
    progress: bool = True,
    console: Any = None,
    overrides: Sequence[str] = (),
    verbose: bool = False,
    baseline_cache: str | Path | None = None,
) -> RunResult:
    """Run the closed loop from a config (a CoevolveConfig, a YAML path, a dict or None).

    Refuses a run directory that already holds a run unless ``overwrite``; use
    ``resume(run_dir)`` to continue one. A directory a live run holds (``run.lock``,
    loop/run_lock.py) is refused either way, naming the holder. ``overrides`` (``--set`` settings already
    applied to ``config``) are listed at the top of the saved config.yaml. What the
    trainers log goes to ``run_dir/run.log``; ``verbose`` shows it on stderr too.
    ``baseline_cache``: a directory where runs of the same local agent share their
    cycle-0 evaluation (the learning bench's arms of one seed).
    """
    from .config import CoevolveConfig, load_config

    if not isinstance(config, CoevolveConfig):
        config = load_config(config)
    if config.policy.kind == "endpoint" and config.policy.train_model is None:
        raise RunError(
            "an endpoint policy is trained on a local copy of its model: set "
            "policy.train_model to the directory of the model the endpoint serves"
        )
    run_dir = Path(config.run_dir)
    # The lock first: a live run's directory is refused (naming it) before anything is
    # checked or deleted there.
    with hold_run_dir(run_dir, say=_teller(console)):
        if (run_dir / CHECKPOINTS).exists():
            if not overwrite:
                raise RunError(
                    f"{run_dir} already holds a run; continue it with `coevolve run --resume "
                    f"{run_dir}`, pick another run_dir, or pass --overwrite to start over"
                )
            _clear(run_dir)
        header = "".join(f"# --set {item}\n" for item in overrides)
        RunFiles(run_dir).config.write_text(header + _yaml(config))
        return _execute(config, progress, console, verbose, baseline_cache, resuming=False)


def resume(
    run_dir: str | Path,
    *,
    progress: bool = True,
    console: Any = None,
    verbose: bool = False,
    baseline_cache: str | Path | None = None,
) -> RunResult:
    """Continue a killed or stopped run from its last finished node, with the config saved
    in ``run_dir`` (refused while a live run holds the directory)."""
    from .config import load_config

    run_dir = Path(run_dir)
    saved = RunFiles(run_dir).config
    if not saved.is_file():
        raise RunError(f"{run_dir} holds no run to resume ({saved} is missing)")
    config = load_config(saved)
    if Path(config.run_dir).resolve() != run_dir.resolve():
        config = config.model_copy(update={"run_dir": str(run_dir)})
    with hold_run_dir(run_dir, say=_teller(console)):
        return _execute(config, progress, console, verbose, baseline_cache, resuming=True)


def _teller(console: Any) -> Callable[[str], None] | None:
    return console.print if console is not None else None


def _clear(run_dir: Path) -> None:
    """Delete a run directory's contents for --overwrite, all but the lock this run holds."""
    import shutil

    for entry in run_dir.iterdir():
        if entry.name == LOCK_FILE:
            continue
        if entry.is_dir() and not entry.is_symlink():
            shutil.rmtree(entry)
        else:
            entry.unlink()


def _yaml(config: CoevolveConfig) -> str:
    import yaml

    return yaml.safe_dump(config.model_dump(mode="json"), sort_keys=False)


def _execute(
    config: CoevolveConfig,
    progress: bool,
    console: Any,
    verbose: bool,
    baseline_cache: str | Path | None,
    *,
    resuming: bool,
) -> RunResult:
    from .outputs.run_log import run_log

    started = time.perf_counter()
    with run_log(config.run_dir, verbose=verbose):
        # The one step that may train before the loop: the agent it starts from.
        build_bootstrap_agent(config, say=_teller(console), progress=progress)
        rt = build_runtime(config, console=console, progress=progress)
        rt.baseline_cache = Path(baseline_cache) if baseline_cache is not None else None
        try:
            summaries, adapter = asyncio.run(_drive(rt, resuming))
        finally:
            rt.store.close()
    from .outputs.report import write_report

    assert rt.pool.path is not None
    rt.pool.path.touch()  # the synthesized tasks' file exists even when a run accepted none
    paths = write_report(rt.run_dir, summaries, rt.pool)
    return RunResult(
        run_dir=str(rt.run_dir),
        cycles=summaries,
        adapter=adapter,
        metrics=str(paths["metrics"]),
        report=str(paths["report"]) if paths.get("report") else None,
        tasks=str(rt.pool.path),
        pool=rt.pool.counts(),
        elapsed_s=time.perf_counter() - started,
        resumed=resuming,
    )


# The modules whose classes a run's checkpoint holds. langgraph reads an unnamed class
# back with a warning today and refuses it under LANGGRAPH_STRICT_MSGPACK=true (its
# announced default to come): a killed run could then not resume.
CHECKPOINTED_MODULES = (".records", ".graph.synthesis.state", ".agents.roles.role_interfaces")


def checkpoint_serializer() -> Any:
    """langgraph's serializer, with every class of CHECKPOINTED_MODULES allowed by name."""
    import importlib

    from langgraph.checkpoint.serde.jsonplus import JsonPlusSerializer

    allowed = []
    for relative in CHECKPOINTED_MODULES:
        module = importlib.import_module(relative, __package__)
        allowed += [
            (value.__module__, value.__name__)
            for value in vars(module).values()
            if isinstance(value, type) and value.__module__ == module.__name__
        ]
    return JsonPlusSerializer(allowed_msgpack_modules=allowed)


async def _drive(rt: CycleRuntime, resuming: bool) -> tuple[list[CycleSummary], str | None]:
    import aiosqlite
    from langgraph.checkpoint.sqlite.aio import AsyncSqliteSaver

    from .graph.cycle.graph import builder

    config = rt.config
    # The synthesis subgraph inherits the run's config: its branches run max_concurrency
    # at a time (the cycle's own nodes run one at a time).
    thread: Any = {
        **THREAD,
        "recursion_limit": 16 + 8 * config.cycles,
        "max_concurrency": config.synthesis.max_concurrency,
    }
    async with aiosqlite.connect(str(rt.run_dir / CHECKPOINTS)) as connection:
        saver = AsyncSqliteSaver(connection, serde=checkpoint_serializer())
        compiled = builder.compile(checkpointer=saver)
        snapshot = await compiled.aget_state(thread)
        graph_input: Any = {"cycles": config.cycles, "adapter": config.policy.adapter}
        if snapshot.values:
            if not resuming:
                raise RunError(f"{rt.run_dir} already holds a run; resume it instead")
            adapter = snapshot.values.get("adapter")
            cycle = snapshot.values.get("cycle", 0)
            if snapshot.next:
                rt.say(
                    f"resuming {rt.run_dir}: cycle {cycle}, next stage {', '.join(snapshot.next)}"
                )
                if adapter is not None and adapter != config.policy.adapter:
                    await use_adapter(rt, adapter)
                graph_input = None
            else:
                rt.say(f"{rt.run_dir} finished already; reporting")
                return _summaries(snapshot.values), adapter
        # durability="sync": a node's checkpoint is on disk before the next node starts,
        # so a kill never loses a finished stage.
        await compiled.ainvoke(graph_input, thread, context=cast(Any, rt), durability="sync")
        final = await compiled.aget_state(thread)
    if hasattr(rt.policy, "aclose"):
        await rt.policy.aclose()
    return _summaries(final.values), final.values.get("adapter")


def _summaries(values: dict[str, Any]) -> list[CycleSummary]:
    """The finished cycles of the graph's state (kept there as dicts: the checkpoints are JSON)."""
    return [CycleSummary.model_validate(summary) for summary in values.get("finished", [])]


def summary_payload(result: RunResult) -> dict[str, Any]:
    """What `coevolve run --json` prints."""
    return json.loads(result.model_dump_json())
