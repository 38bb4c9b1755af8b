"""The one place the graphs' runtimes are built.

From a CoevolveConfig: the policy it names (``build_policy``, on the base model
of ``local_model_dir``), the held-out evaluation tasks (``evaluation_tasks``),
the task store with the embedding it names (``build_store``), and the cycle
graph's whole runtime: seed pool, history, pattern counts, task store and
synthesis roles (``build_runtime``). Building a runtime never trains: the
bootstrap agent a local policy starts from is built by its own step,
``build_bootstrap_agent``, which ``coevolve run`` (and the eval command, and
Studio's cycle) call first; without it a missing agent is a ``RunError`` that says
so. A synthesis pass outside a run gets ``build_synthesis_runtime`` (a run's cycle:
``CycleRuntime.synthesis_runtime()``); LangGraph Studio's synthesis graph gets
``spec_synthesis_runtime`` from a small JSON spec (``loop/studio.py``).
``coevolve.runner`` re-exports the config builders.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from pathlib import Path
from typing import TYPE_CHECKING

from ..common.errors import RunError
from ..graph.cycle.context import CycleRuntime
from ..graph.synthesis.context import SynthesisRuntime

if TYPE_CHECKING:  # pragma: no cover
    from rich.console import Console

    from ..agents.policy.policy_interface import Policy
    from ..agents.roles.role_interfaces import Synthesizer
    from ..config import CoevolveConfig
    from ..memory.store import TaskStore
    from ..records import Task


def build_bootstrap_agent(
    config: CoevolveConfig, say: Callable[[str], None] | None = None, progress: bool = True
) -> Path | None:
    """The step that builds the bootstrap agent a config's local policy starts from, when
    the cache lacks it (``say`` hears a stage line first; it trains for minutes on a
    CPU); returns its directory, or None when the policy is not the bootstrap agent."""
    if config.policy.kind != "local" or config.policy.model != "bootstrap":
        return None
    from ..training.bootstrap.bootstrap_config import bootstrap_dir, is_complete
    from ..training.bootstrap.build import bootstrap

    target = bootstrap_dir(config.bootstrap)
    if not is_complete(target) and say is not None:
        say(
            f"bootstrap: building the agent the run starts from (base {config.bootstrap.base}, "
            f"{config.bootstrap.max_steps} steps), cached in {target} for later runs"
        )
    return bootstrap(config.bootstrap, progress=progress)


def build_policy(config: CoevolveConfig, model_dir: Path | None = None) -> Policy:
    """The policy a config names: an endpoint, or a local model (the bootstrap agent must
    be built: ``build_bootstrap_agent``)."""
    policy = config.policy
    if policy.kind == "endpoint":
        from ..agents.policy.endpoint_policy import EndpointPolicy

        assert policy.endpoint is not None  # the config validator guarantees it
        return EndpointPolicy(
            config.endpoint(policy.endpoint),
            tools_in_request=policy.renders_tools,
            read_json_calls=policy.read_json_calls,
        )
    from ..agents.policy.local_policy import LocalPolicy

    model_dir = model_dir or local_model_dir(config)
    assert model_dir is not None  # a local policy always has a model directory
    return LocalPolicy(
        model_dir,
        adapter_path=policy.adapter,
        device=policy.device,
        max_new_tokens=policy.max_new_tokens,
        batch_size=policy.batch_size,
        tools_in_prompt=policy.renders_tools,
        max_live_episodes=policy.max_live_episodes,
        read_json_calls=policy.read_json_calls,
    )


def local_model_dir(config: CoevolveConfig) -> Path | None:
    """The base model that LoRA training runs on (None: nothing local to train); it never
    builds one (a missing bootstrap agent is a RunError: ``build_bootstrap_agent``)."""
    policy = config.policy
    if policy.kind == "endpoint":
        if policy.train_model is None:
            return None
        from ..common.hf_models import resolve_model

        # A local directory, or a Hugging Face model id (its snapshot in the Hub cache).
        return resolve_model(policy.train_model)
    if policy.model == "bootstrap":
        from ..training.bootstrap.bootstrap_config import bootstrap_dir, is_complete

        target = bootstrap_dir(config.bootstrap)
        if not is_complete(target):
            raise RunError(
                f"the bootstrap agent this config starts from is not built yet ({target}): "
                "build it with `coevolve bootstrap --config CONFIG` (or "
                "coevolve.loop.build_runtime.build_bootstrap_agent); `coevolve run` builds "
                "it itself"
            )
        return target
    return Path(policy.model)


def evaluation_tasks(config: CoevolveConfig) -> list[Task]:
    from ..envs.catalog import first_per_family, load_tasks

    tasks = load_tasks(
        config.env.name,
        split=config.evaluation.split,
        category=config.env.category,
        seed=config.env.seed,
    )
    return first_per_family(tasks, config.evaluation.per_family)


def seed_tasks(config: CoevolveConfig) -> list[Task]:
    """The run's seed tasks: those of ``env.split``, the first ``pool.seed_tasks`` of them."""
    from ..envs.catalog import load_tasks

    env = config.env
    seeds = load_tasks(env.name, split=env.split, category=env.category, seed=env.seed)
    return seeds if config.pool.seed_tasks is None else seeds[: config.pool.seed_tasks]


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
    config: CoevolveConfig, console: Console | None = None, progress: bool = True
) -> CycleRuntime:
    from ..agents.roles.role_factory import build_roles
    from ..envs.registry import get_environment
    from ..memory.history import OutcomeHistory
    from ..memory.patterns import PatternCounts
    from ..memory.pool import TaskPool
    from ..run_files import RunFiles

    config = with_environment_policy_prompt(config)
    run_dir = Path(config.run_dir)
    run_dir.mkdir(parents=True, exist_ok=True)
    model_dir = local_model_dir(config)
    policy = build_policy(config, model_dir)
    seeds = seed_tasks(config)
    store = build_store(config)
    files = RunFiles(run_dir)
    if store.count() == 0:
        store.add(seeds)  # synthesized tasks are compared with the seed pool too
    make_env = get_environment(config.env.name).environment
    return CycleRuntime(
        config=config,
        run_dir=run_dir,
        policy=policy,
        make_env=make_env,
        pool=TaskPool(seeds, files.synthesized_tasks),
        history=OutcomeHistory(files.history),
        patterns=PatternCounts(files.patterns),
        store=store,
        roles=build_roles(
            config.synthesis.roles,
            config.endpoints,
            policy,
            make_env,
            seed_tasks=seeds,
            synthesizer=config.synthesis.synthesizer,
        ),
        eval_tasks=evaluation_tasks(config),
        model_dir=model_dir,
        console=console,
        progress=progress,
    )


def with_environment_policy_prompt(config: CoevolveConfig) -> CoevolveConfig:
    """``config`` with the policy's system prompt its environment gets: on a user's
    environment the default prompt in the environment's words, everywhere else as it is
    (``agents/prompts.py``, ``environment_policy_prompt``). Every stage of a run, training
    included, reads the prompt from the runtime's config, so they all agree."""
    from ..agents.prompts import environment_policy_prompt

    prompt = environment_policy_prompt(config.policy.system_prompt, config.env.name)
    if prompt == config.policy.system_prompt:
        return config
    policy = config.policy.model_copy(update={"system_prompt": prompt})
    return config.model_copy(update={"policy": policy})


def build_synthesis_runtime(
    config: CoevolveConfig, env_name: str | None = None, store_path: str | Path | None = None
) -> SynthesisRuntime:
    """A synthesis pass's runtime outside a run (``coevolve synthesize``): the config's
    roles and task store, on ``env_name``'s environment (default: the config's)."""
    from ..agents.roles.role_factory import build_roles
    from ..envs.registry import get_environment

    make_env = get_environment(env_name or config.env.name).environment
    return SynthesisRuntime(
        roles=build_roles(
            config.synthesis.roles,
            config.endpoints,
            make_env=make_env,
            seed_tasks=seed_tasks(config),
            synthesizer=config.synthesis.synthesizer,
        ),
        make_env=make_env,
        store=build_store(config, store_path),
        neighbours=config.synthesis.neighbours,
    )


def spec_synthesis_runtime(
    env: str = "world",
    roles: Mapping[str, object] | None = None,
    endpoints: Mapping[str, Mapping[str, object]] | None = None,
    store_path: str | None = None,
    threshold: float = 0.8,
    synthesizer: Synthesizer = "variation",
) -> SynthesisRuntime:
    """A synthesis runtime from a JSON spec (LangGraph Studio's context): the
    environment, the synthesizer, the roles config and its endpoints, the store (None:
    in memory). Variations take other values from the environment's train tasks."""
    from ..agents.config import EndpointConfig
    from ..agents.roles.role_factory import build_roles
    from ..agents.roles.role_interfaces import RolesConfig
    from ..envs.catalog import load_tasks
    from ..envs.registry import get_environment
    from ..memory.store import TaskStore

    named = {name: EndpointConfig.model_validate(e) for name, e in (endpoints or {}).items()}
    make_env = get_environment(env).environment
    seeds = load_tasks(env, split="train") if synthesizer == "variation" else []
    return SynthesisRuntime(
        roles=build_roles(
            RolesConfig.model_validate(roles or {}),
            named,
            make_env=make_env,
            seed_tasks=seeds,
            synthesizer=synthesizer,
        ),
        make_env=make_env,
        store=TaskStore(store_path, threshold=threshold),
    )
