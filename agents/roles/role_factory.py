"""Building the four synthesis roles from configuration: ``build_roles``.

The synthesizer (``synthesis.synthesizer``) decides which implementation each role
gets; ``RolesConfig`` holds their knobs. The role interfaces, ``Roles`` and
``RolesConfig`` are in ``coevolve.agents.roles.role_interfaces``; this module imports
the concrete roles, and nothing below it imports it.
"""

from __future__ import annotations

import asyncio
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

from ...envs.base import SupportsVariants
from ...envs.brief import environment_brief
from .abstractor import OfflineAbstractor
from .explorer import LLMExplorer, OfflineExplorer
from .judge import ExecutableJudge, LLMJudge
from .llm import chat_model
from .llm_abstractor import LLMAbstractor
from .role_interfaces import ROLE_NAMES, EnvFactory, Roles, RolesConfig, Synthesizer
from .summarizer import LLMSummarizer, OfflineSummarizer
from .variation import VariationAbstractor, VariationExplorer

if TYPE_CHECKING:
    from ...records import Task
    from ..config import EndpointConfig
    from ..policy.policy_interface import Policy


def build_roles(
    config: RolesConfig,
    endpoints: Mapping[str, EndpointConfig],
    policy: Policy | None = None,
    make_env: EnvFactory | None = None,
    seed_tasks: Sequence[Task] = (),
    synthesizer: Synthesizer = "variation",
) -> Roles:
    """The roles of ``synthesizer`` (``role_interfaces.SYNTHESIZERS``).

    ``policy`` (the current policy) drives some of the generator path's exploration
    rounds; ``seed_tasks`` (the run's seed tasks, never validation or held-out ones)
    are where variations take other values from; the LLM roles' prompts say what
    ``make_env``'s environment is (a seed task's tool sequence their example pattern). A synthesizer the environment cannot serve, or an
    endpoint name not in ``endpoints``, is a ValueError that says what to change.
    """
    if synthesizer == "generator":
        return _generator_roles(config, policy, make_env)
    if synthesizer == "variation":
        return Roles(
            "variation",
            OfflineSummarizer(),
            VariationExplorer(
                seed_tasks, variants=config.max_candidates, seed=config.explorer_seed
            ),
            VariationAbstractor(),
            ExecutableJudge(),
        )
    return _llm_roles(config, endpoints, make_env, seed_tasks)


def _generator_roles(
    config: RolesConfig, policy: Policy | None, make_env: EnvFactory | None
) -> Roles:
    if make_env is not None and not isinstance(make_env(), SupportsVariants):
        raise ValueError(
            "synthesis.synthesizer 'generator' needs an environment with its own task "
            "generator (a `variant` method, as the built-in world has); this one has none: "
            "use synthesizer: variation"
        )
    explorer = OfflineExplorer(
        rounds=config.explorer_rounds or 3,
        steps=config.explorer_steps or 4,
        seed=config.explorer_seed,
        policy=policy,
        policy_temperature=config.policy_temperature,
        policy_rounds=config.explorer_policy_rounds,
    )
    abstractor = OfflineAbstractor(max_candidates=config.max_candidates, steer=config.steer)
    return Roles("generator", OfflineSummarizer(), explorer, abstractor, ExecutableJudge())


def _llm_roles(
    config: RolesConfig,
    endpoints: Mapping[str, EndpointConfig],
    make_env: EnvFactory | None,
    seed_tasks: Sequence[Task] = (),
) -> Roles:
    """Each role on its endpoint; a role set to 'offline' runs without a model (never
    the task generator: the offline abstractor relabels explored windows)."""
    chosen: dict[str, str | None] = {}
    for role in ROLE_NAMES:
        name = config.endpoint_for(role)
        if name is not None and name not in endpoints:
            known = ", ".join(sorted(endpoints)) or "none defined"
            source = role if getattr(config, role) is not None else "default_endpoint"
            raise ValueError(
                f"synthesis role {role!r} uses endpoint {name!r} (from {source}), which is not "
                f"in `endpoints` (known: {known}; or use 'offline')"
            )
        chosen[role] = name
    if not any(chosen.values()):
        raise ValueError(
            "synthesis.synthesizer 'llm' needs an endpoint: set synthesis.roles.default_endpoint "
            "(or a role's own) to an entry of `endpoints`"
        )
    limiter = asyncio.Semaphore(config.llm_concurrency)
    brief = environment_brief(make_env(), seed_tasks) if make_env is not None else None

    def model(role: str) -> Any:
        name = chosen[role]
        assert name is not None
        return chat_model(endpoints[name], temperature=getattr(config, f"{role}_temperature"))

    rounds, steps = config.explorer_rounds, config.explorer_steps
    return Roles(
        "llm",
        LLMSummarizer(model("summarizer"), limiter, prompt=config.prompt_for("summarizer", brief))
        if chosen["summarizer"]
        else OfflineSummarizer(),
        LLMExplorer(
            model("explorer"),
            limiter,
            rounds=rounds or 2,
            steps=steps or 5,
            prompt=config.prompt_for("explorer", brief),
        )
        if chosen["explorer"]
        else OfflineExplorer(rounds=rounds or 3, steps=steps or 4, seed=config.explorer_seed),
        LLMAbstractor(
            model("abstractor"),
            limiter,
            prompt=config.prompt_for("abstractor", brief),
            max_candidates=config.max_candidates,
        )
        if chosen["abstractor"]
        else OfflineAbstractor(max_candidates=config.max_candidates, steer=False),
        LLMJudge(model("judge"), limiter, prompt=config.prompt_for("judge", brief))
        if chosen["judge"]
        else ExecutableJudge(),
        limiter,
    )
