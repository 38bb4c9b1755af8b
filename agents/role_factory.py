"""Building the four synthesis roles from configuration: ``build_roles``.

LLM roles on their endpoints, offline (environment-grounded) ones elsewhere.
The role interfaces, ``Roles`` and ``RolesConfig`` are in ``coevolve.agents.roles``;
this module imports the concrete roles, and nothing below it imports it.
"""

from __future__ import annotations

import asyncio
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from ..envs.base import environment_brief
from .abstractor import OfflineAbstractor
from .explorer import LLMExplorer, OfflineExplorer
from .judge import ExecutableJudge, LLMJudge
from .llm import chat_model
from .llm_abstractor import LLMAbstractor
from .roles import (
    OFFLINE,
    ROLE_NAMES,
    Abstractor,
    EnvFactory,
    Explorer,
    Judge,
    Roles,
    RolesConfig,
    Summarizer,
)
from .summarizer import LLMSummarizer, OfflineSummarizer
from .writer import TaskWriter

if TYPE_CHECKING:
    from .config import EndpointConfig
    from .policy import Policy


def build_roles(
    config: RolesConfig,
    endpoints: Mapping[str, EndpointConfig],
    policy: Policy | None = None,
    make_env: EnvFactory | None = None,
) -> Roles:
    """Build the roles: LLM ones on their endpoints, offline ones elsewhere.

    One semaphore bounds the LLM requests of all roles together. ``policy`` (the
    current policy) drives some offline exploration rounds. The LLM roles' prompts say
    what ``make_env``'s environment is (its ``EnvironmentBrief``). An endpoint name not
    in ``endpoints`` is a ValueError naming the known ones.
    """
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
    limiter = asyncio.Semaphore(config.llm_concurrency) if any(chosen.values()) else None
    brief = environment_brief(make_env()) if make_env is not None and any(chosen.values()) else None

    def model(role: str) -> Any:
        name = chosen[role]
        assert name is not None
        return chat_model(endpoints[name], temperature=getattr(config, f"{role}_temperature"))

    rounds, steps = config.explorer_rounds, config.explorer_steps
    summarizer: Summarizer = (
        LLMSummarizer(model("summarizer"), limiter, prompt=config.prompt_for("summarizer", brief))
        if chosen["summarizer"]
        else OfflineSummarizer()
    )
    explorer: Explorer = (
        LLMExplorer(
            model("explorer"),
            limiter,
            rounds=rounds or 2,
            steps=steps or 5,
            prompt=config.prompt_for("explorer", brief),
        )
        if chosen["explorer"]
        else OfflineExplorer(
            rounds=rounds or 3,
            steps=steps or 4,
            seed=config.explorer_seed,
            policy=policy,
            policy_temperature=config.policy_temperature,
            policy_rounds=config.explorer_policy_rounds,
        )
    )
    writer = None if config.writer == OFFLINE else config.writer
    if writer is not None and writer not in endpoints:
        known = ", ".join(sorted(endpoints)) or "none defined"
        raise ValueError(
            f"synthesis.roles.writer uses endpoint {writer!r}, which is not in `endpoints` "
            f"(known: {known})"
        )
    if writer is not None and limiter is None:
        limiter = asyncio.Semaphore(config.llm_concurrency)
    abstractor: Abstractor = (
        TaskWriter(
            chat_model(endpoints[writer], temperature=config.writer_temperature),
            limiter,
            prompt=config.writer_prompt,
            max_candidates=config.max_candidates,
            material=config.writer_material,
            grounding=config.writer_grounding,
        )
        if writer is not None
        else LLMAbstractor(
            model("abstractor"),
            limiter,
            prompt=config.prompt_for("abstractor", brief),
            max_candidates=config.max_candidates,
        )
        if chosen["abstractor"]
        else OfflineAbstractor(max_candidates=config.max_candidates, steer=config.steer)
    )
    judge: Judge = (
        LLMJudge(model("judge"), limiter, prompt=config.prompt_for("judge", brief))
        if chosen["judge"]
        else ExecutableJudge()
    )
    return Roles(summarizer, explorer, abstractor, judge, limiter)
