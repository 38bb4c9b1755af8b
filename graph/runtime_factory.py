"""Building a cycle graph's runtime (``CycleRuntime``) from a CoevolveConfig.

The policy a config names (``build_policy``, on the base model of
``local_model_dir``), the held-out evaluation tasks (``evaluation_tasks``), and
the task store with the embedding the config names (``build_store``), and the
whole runtime: seed pool, history, pattern counts, task store and synthesis
roles (``build_runtime``). ``studio_runtime`` builds one for LangGraph Studio from
its JSON context, once per config path. ``coevolve.runner`` re-exports these.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

from .runtime import CycleRuntime

if TYPE_CHECKING:  # pragma: no cover
    from ..config import CoevolveConfig
    from ..memory.store import TaskStore


def build_policy(
    config: CoevolveConfig, progress: bool = True, model_dir: Path | None = None
) -> Any:
    """The policy a config names: an endpoint, or a local model (the bootstrap built if missing)."""
    policy = config.policy
    if policy.kind == "endpoint":
        from ..agents.endpoint_policy import EndpointPolicy

        assert policy.endpoint is not None  # the config validator guarantees it
        return EndpointPolicy(
            config.endpoint(policy.endpoint), tools_in_request=policy.renders_tools
        )
    from ..agents.local_policy import LocalPolicy

    model_dir = model_dir or local_model_dir(config, progress)
    assert model_dir is not None  # a local policy always has a model directory
    return LocalPolicy(
        model_dir,
        adapter_path=policy.adapter,
        device=policy.device,
        max_new_tokens=policy.max_new_tokens,
        batch_size=policy.batch_size,
        tools_in_prompt=policy.renders_tools,
    )


def local_model_dir(config: CoevolveConfig, progress: bool = True) -> Path | None:
    """The base model that LoRA training runs on (None: nothing local to train)."""
    policy = config.policy
    if policy.kind == "endpoint":
        return Path(policy.train_model) if policy.train_model else None
    if policy.model == "bootstrap":
        from ..training.bootstrap import bootstrap

        return bootstrap(config.bootstrap, progress=progress)
    return Path(policy.model)


def evaluation_tasks(config: CoevolveConfig) -> list[Any]:
    from ..envs.catalog import first_per_family, load_tasks

    tasks = load_tasks(
        config.env.name,
        split=config.evaluation.split,
        category=config.env.category,
        seed=config.env.seed,
    )
    return first_per_family(tasks, config.evaluation.per_family)


def build_store(config: CoevolveConfig, path: str | Path | None = None) -> TaskStore:
    """The task store a config names: the Chroma server at ``synthesis.store_url``, else the
    embedded store at ``path`` (default ``config.store_path()``); its embeddings from
    ``synthesis.embedding_endpoint``, else the local MiniLM."""
    from ..memory.embeddings import OpenAIEmbedding
    from ..memory.store import TaskStore

    synthesis = config.synthesis
    embedding = None
    if synthesis.embedding_endpoint is not None:
        embedding = OpenAIEmbedding.from_endpoint(config.endpoint(synthesis.embedding_endpoint))
    return TaskStore(
        None if synthesis.store_url else (path or config.store_path()),
        server_url=synthesis.store_url,
        threshold=synthesis.dedup_threshold,
        embedding=embedding,
    )


def build_runtime(
    config: CoevolveConfig, console: Any = None, progress: bool = True
) -> CycleRuntime:
    from ..agents.role_factory import build_roles
    from ..envs.catalog import load_tasks
    from ..envs.registry import get_environment
    from ..memory.history import OutcomeHistory
    from ..memory.patterns import PatternCounts
    from ..memory.pool import TaskPool

    run_dir = Path(config.run_dir)
    run_dir.mkdir(parents=True, exist_ok=True)
    model_dir = local_model_dir(config, progress)
    policy = build_policy(config, progress, model_dir)
    seeds = load_tasks(
        config.env.name, split=config.env.split, category=config.env.category, seed=config.env.seed
    )
    if config.pool.seed_tasks is not None:
        seeds = seeds[: config.pool.seed_tasks]
    store = build_store(config)
    if store.count() == 0:
        store.add(seeds)  # synthesized tasks are compared with the seed pool too
    return CycleRuntime(
        config=config,
        run_dir=run_dir,
        policy=policy,
        make_env=get_environment(config.env.name).environment,
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


def studio_runtime(context: dict[str, Any] | None) -> CycleRuntime:
    """A runtime for LangGraph Studio, from a JSON context {"config": "path.yaml"}."""
    from ..config import load_config

    source = (context or {}).get("config")
    key = str(source)
    if key not in _studio_runtimes:
        _studio_runtimes[key] = build_runtime(load_config(source), progress=False)
    return _studio_runtimes[key]


_studio_runtimes: dict[str, CycleRuntime] = {}
