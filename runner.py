"""Running the closed loop: `coevolve run` and ``coevolve.run(config)``.

The runner builds what the cycle graph's nodes use (policy, pool, history,
pattern counts, task store, synthesis roles) from a CoevolveConfig, compiles
graph/cycle.py's ``builder`` with a SQLite checkpointer in the run directory,
and runs it. ``resume=True`` continues a killed run from its last finished
node, with the config saved in the run directory. At the end it writes
metrics.jsonl, report.png and summary.json, and returns a RunResult.

Run directory:
    config.yaml               the config the run uses (a resume reads it back)
    checkpoints.sqlite        LangGraph checkpoints (thread "run")
    history.jsonl             scores per task and cycle (forgetting)
    patterns.json             action-pattern counts (rare)
    task_store/               the Chroma task store (dedup, nearest tasks)
    synthesized_tasks.jsonl   accepted synthesized tasks with provenance (the pool's file)
    adapters/cycle-N/         the LoRA adapter trained in cycle N
    cycles/NNN/               rollouts, flagged items, synthesized tasks, train and eval files
    metrics.jsonl, summary.json, report.png
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, cast

from pydantic import BaseModel

if TYPE_CHECKING:  # pragma: no cover
    from .config import CoevolveConfig
    from .graph.cycle import CycleRuntime
    from .training.trainers import TrainResult

CHECKPOINTS = "checkpoints.sqlite"
THREAD = {"configurable": {"thread_id": "run"}}


class RunError(RuntimeError):
    """A run that cannot start or continue; the message says what to do."""


class RunResult(BaseModel):
    run_dir: str
    cycles: list[dict[str, Any]]  # cycle 0 (the starting policy) first
    adapter: str | None
    metrics: str
    report: str | None
    tasks: str
    pool: dict[str, int]  # tasks by source, synthesized ones by signal
    elapsed_s: float
    resumed: bool = False

    def success_by_cycle(self) -> list[float]:
        return [c["evaluate"]["success"] for c in self.cycles]


# --------------------------------------------------------------------------- building


def build_policy(
    config: CoevolveConfig, progress: bool = True, model_dir: Path | None = None
) -> Any:
    """The policy a config names: an endpoint, or a local model (the bootstrap built if missing)."""
    policy = config.policy
    if policy.kind == "endpoint":
        from .agents.endpoint_policy import EndpointPolicy

        assert policy.endpoint is not None  # the config validator guarantees it
        return EndpointPolicy(config.endpoint(policy.endpoint))
    from .agents.local_policy import LocalPolicy

    model_dir = model_dir or local_model_dir(config, progress)
    assert model_dir is not None  # a local policy always has a model directory
    return LocalPolicy(
        model_dir,
        adapter_path=policy.adapter,
        device=policy.device,
        max_new_tokens=policy.max_new_tokens,
        batch_size=policy.batch_size,
    )


def local_model_dir(config: CoevolveConfig, progress: bool = True) -> Path | None:
    """The base model that LoRA training runs on (None: nothing local to train)."""
    policy = config.policy
    if policy.kind == "endpoint":
        return Path(policy.train_model) if policy.train_model else None
    if policy.model == "bootstrap":
        from .training.bootstrap import bootstrap

        return bootstrap(config.bootstrap, progress=progress)
    return Path(policy.model)


def evaluation_tasks(config: CoevolveConfig) -> list[Any]:
    from .envs.catalog import first_per_family, load_tasks

    tasks = load_tasks(
        config.env.name,
        split=config.evaluation.split,
        category=config.env.category,
        seed=config.env.seed,
    )
    return first_per_family(tasks, config.evaluation.per_family)


def build_runtime(
    config: CoevolveConfig, console: Any = None, progress: bool = True
) -> CycleRuntime:
    from .agents.role_factory import build_roles
    from .envs.catalog import load_tasks
    from .graph.cycle import CycleRuntime
    from .graph.synthesis import env_factory
    from .memory.history import OutcomeHistory
    from .memory.patterns import PatternCounts
    from .memory.pool import TaskPool
    from .memory.store import TaskStore

    run_dir = Path(config.run_dir)
    run_dir.mkdir(parents=True, exist_ok=True)
    model_dir = local_model_dir(config, progress)
    policy = build_policy(config, progress, model_dir)
    seeds = load_tasks(
        config.env.name, split=config.env.split, category=config.env.category, seed=config.env.seed
    )
    if config.pool.seed_tasks is not None:
        seeds = seeds[: config.pool.seed_tasks]
    store = TaskStore(
        None if config.synthesis.store_url else config.store_path(),
        server_url=config.synthesis.store_url,
        threshold=config.synthesis.dedup_threshold,
    )
    if store.count() == 0:
        store.add(seeds)  # synthesized tasks are compared with the seed pool too
    return CycleRuntime(
        config=config,
        run_dir=run_dir,
        policy=policy,
        make_env=env_factory(config.env.name),
        pool=TaskPool(seeds, run_dir / "synthesized_tasks.jsonl"),
        history=OutcomeHistory(run_dir / "history.jsonl"),
        patterns=PatternCounts(run_dir / "patterns.json"),
        store=store,
        roles=build_roles(config.synthesis.roles, config.endpoints, policy=policy),
        eval_tasks=evaluation_tasks(config),
        model_dir=model_dir,
        console=console,
        progress=progress,
    )


async def use_adapter(rt: CycleRuntime, adapter: str | None) -> None:
    """Make the policy serve ``adapter``: reload in-process, or hot-load into vLLM.

    vLLM serves it as ``<model>-coevolve-<adapter directory>``, e.g. ``...-coevolve-cycle-2``.
    """
    if adapter is None:
        return
    if rt.config.policy.kind == "endpoint":
        base = rt.config.endpoint(rt.config.policy.endpoint).model
        path = Path(adapter).resolve()
        await rt.policy.load_adapter(f"{base}-coevolve-{path.name}", str(path))
    else:
        rt.policy.reload_adapter(adapter)


async def train_cycle(rt: CycleRuntime, cycle: int, previous_adapter: str | None) -> TrainResult:
    """The cycle's training data, the TRL step, and the policy update."""
    from .export import TRAIN_DATA_FILE
    from .files import dump_jsonl, load_jsonl, write_atomically
    from .graph.cycle import seed_everything
    from .records import Task, Trajectory
    from .tracking import for_training
    from .training.datasets import (
        demonstrations_by_task,
        json_arguments,
        preference_pairs,
        successful_conversations,
    )
    from .training.trainers import (
        TrainResult,
        is_adapter_complete,
        load_train_result,
        train_adapter,
    )

    config = rt.config
    if config.hard_negatives.enabled:  # failure agent + DPO + SFT target (graph/hard_negatives.py)
        from .graph.hard_negatives import train_with_hard_negatives

        coevolved = await train_with_hard_negatives(rt, cycle, previous_adapter)
        await use_adapter(rt, coevolved.adapter_dir)
        return coevolved
    cycle_dir = rt.cycle_dir(cycle)
    record = cycle_dir / "train.json"
    output_dir = rt.run_dir / "adapters" / f"cycle-{cycle}"
    if record.exists():  # trained before a kill; the adapter is complete (saved atomically)
        result = TrainResult.model_validate_json(record.read_text())
    elif is_adapter_complete(output_dir):  # killed between saving the adapter and the record
        result = load_train_result(output_dir)
        write_atomically(record, result.model_dump_json(indent=2))
    else:
        if rt.model_dir is None:
            raise RunError(
                "training needs the base model locally: set policy.train_model to the "
                "directory of the model the endpoint serves"
            )
        trajectories = load_jsonl(cycle_dir / "rollouts.jsonl", Trajectory)
        accepted = load_jsonl(cycle_dir / "synthesized.jsonl", Task)
        replay = rt.pool.replay_sample(
            cycle, config.pool.replay_demonstrations, {t.id for t in accepted}, config.pool.seed
        )
        training = config.training
        conversations = successful_conversations(
            trajectories, max_per_task=training.sft_max_per_task, min_score=training.sft_min_score
        )
        successes = len(conversations)
        demonstrated = demonstrations_by_task(
            accepted + replay, rt.make_env, config.policy.system_prompt
        )
        conversations += [messages for _, messages in demonstrated]
        example_weights = None
        if training.algorithm == "sft" and training.seal.reweight.enable:
            example_weights = [1.0] * successes + sft_weights(
                [task for task, _ in demonstrated], cycle_dir, training.seal.reweight
            )
        task_ids = {t.task_id for t in trajectories}
        tasks = [task for task in rt.pool.tasks if task.id in task_ids] + accepted
        pairs = preference_pairs(trajectories, max_per_task=training.dpo_max_pairs_per_task)
        # What this cycle's step trains on, for `coevolve export` (sft: conversations, dpo: pairs).
        if training.algorithm == "sft":
            dump_jsonl(
                cycle_dir / TRAIN_DATA_FILE,
                [
                    {"messages": json_arguments(c), "weight": w}
                    for c, w in zip(
                        conversations, example_weights or [1.0] * len(conversations), strict=True
                    )
                ],
            )
        elif training.algorithm == "dpo":
            dump_jsonl(cycle_dir / TRAIN_DATA_FILE, pairs)
        seed_everything(config.seed, cycle, "train")
        result = await asyncio.to_thread(
            train_adapter,
            training,
            model_dir=rt.model_dir,
            output_dir=output_dir,
            previous_adapter=previous_adapter,
            conversations=conversations,
            pairs=pairs,
            tasks=tasks,
            make_env=rt.make_env,
            system_prompt=config.policy.system_prompt,
            progress=rt.progress,
            tracking=for_training(config, rt.run_dir, cycle),
            capability_state_path=rt.run_dir / "capability_state.json",
            example_weights=example_weights,
        )
        write_atomically(record, result.model_dump_json(indent=2))
    await use_adapter(rt, result.adapter_dir)
    return result


def sft_weights(tasks: list[Any], cycle_dir: Path, settings: Any) -> list[float]:
    """SEAL's weight per demonstrated task: the diagnosis of the failure it answers.

    A task synthesized this cycle takes the labels of the flagged episode of its
    parent task (``flagged.jsonl``), so the demonstrations answering severe
    failures (a spurious call, an invalid tool) weigh more; replayed tasks and
    tasks whose parent episode is unknown weigh 1.0.
    """
    from .files import load_jsonl
    from .memory.signals import FlaggedTrajectory
    from .training.seal import trajectory_weight

    labels: dict[str, list[str]] = {}
    flagged = cycle_dir / "flagged.jsonl"
    if flagged.exists():
        for item in load_jsonl(flagged, FlaggedTrajectory):
            labels.setdefault(item.trajectory.task_id, list(item.trajectory.diagnosis))
    return [
        trajectory_weight(labels[task.parent_task_id], settings)
        if task.source == "synthesized" and task.parent_task_id in labels
        else 1.0
        for task in tasks
    ]


def studio_runtime(context: dict[str, Any] | None) -> CycleRuntime:
    """A runtime for LangGraph Studio, from a JSON context {"config": "path.yaml"}."""
    from .config import load_config

    source = (context or {}).get("config")
    key = str(source)
    if key not in _studio_runtimes:
        _studio_runtimes[key] = build_runtime(load_config(source), progress=False)
    return _studio_runtimes[key]


_studio_runtimes: dict[str, CycleRuntime] = {}


# --------------------------------------------------------------------------- running


def run(
    config: CoevolveConfig | str | Path | dict[str, Any] | None = None,
    *,
    overwrite: bool = False,
    progress: bool = True,
    console: Any = None,
    overrides: Sequence[str] = (),
) -> RunResult:
    """Run the closed loop from a config (a CoevolveConfig, a YAML path, a dict or None).

    Refuses a run directory that already holds a run unless ``overwrite``; use
    ``resume(run_dir)`` to continue one. ``overrides`` (``--set`` settings already
    applied to ``config``) are listed at the top of the saved config.yaml.
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
    if (run_dir / CHECKPOINTS).exists():
        if not overwrite:
            raise RunError(
                f"{run_dir} already holds a run; continue it with `coevolve run --resume "
                f"{run_dir}`, pick another run_dir, or pass --overwrite to start over"
            )
        import shutil

        shutil.rmtree(run_dir)
    run_dir.mkdir(parents=True, exist_ok=True)
    header = "".join(f"# --set {item}\n" for item in overrides)
    (run_dir / "config.yaml").write_text(header + _yaml(config))
    return _execute(config, resuming=False, progress=progress, console=console)


def resume(run_dir: str | Path, *, progress: bool = True, console: Any = None) -> RunResult:
    """Continue a killed run from its last finished node, with the config saved in ``run_dir``."""
    from .config import load_config

    run_dir = Path(run_dir)
    saved = run_dir / "config.yaml"
    if not saved.is_file():
        raise RunError(f"{run_dir} holds no run to resume ({saved} is missing)")
    config = load_config(saved)
    if Path(config.run_dir).resolve() != run_dir.resolve():
        config = config.model_copy(update={"run_dir": str(run_dir)})
    return _execute(config, resuming=True, progress=progress, console=console)


def _yaml(config: CoevolveConfig) -> str:
    import yaml

    return yaml.safe_dump(config.model_dump(mode="json"), sort_keys=False)


def _execute(config: CoevolveConfig, *, resuming: bool, progress: bool, console: Any) -> RunResult:
    started = time.perf_counter()
    rt = build_runtime(config, console=console, progress=progress)
    try:
        summaries, adapter = asyncio.run(_drive(rt, resuming))
    finally:
        rt.store.close()
    from .report import write_report

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


async def _drive(rt: CycleRuntime, resuming: bool) -> tuple[list[dict[str, Any]], str | None]:
    from langgraph.checkpoint.sqlite.aio import AsyncSqliteSaver

    from .graph.cycle import builder

    config = rt.config
    thread: Any = {**THREAD, "recursion_limit": 16 + 8 * config.cycles}
    async with AsyncSqliteSaver.from_conn_string(str(rt.run_dir / CHECKPOINTS)) as saver:
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
                return list(snapshot.values.get("finished", [])), adapter
        # durability="sync": a node's checkpoint is on disk before the next node starts,
        # so a kill never loses a finished stage.
        await compiled.ainvoke(graph_input, thread, context=cast(Any, rt), durability="sync")
        final = await compiled.aget_state(thread)
    if hasattr(rt.policy, "aclose"):
        await rt.policy.aclose()
    return list(final.values.get("finished", [])), final.values.get("adapter")


def summary_payload(result: RunResult) -> dict[str, Any]:
    """What `coevolve run --json` prints."""
    return json.loads(result.model_dump_json())
