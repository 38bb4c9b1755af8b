"""Building the four synthesis roles from configuration: ``build_roles``.

LLM roles on their endpoints, offline (environment-grounded) ones elsewhere.
The role interfaces, ``Roles`` and ``RolesConfig`` are in ``coevolve.agents.roles.role_interfaces``;
this module imports the concrete roles, and nothing below it imports it.
"""

from __future__ import annotations

import asyncio
from collections import defaultdict
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

from ...envs.base import environment_brief
from .abstractor import OfflineAbstractor
from .clause_writer import ClauseWriter
from .composer import ComposingExplorer
from .explorer import LLMExplorer, OfflineExplorer
from .judge import ExecutableJudge, LLMJudge
from .llm import chat_model
from .llm_abstractor import LLMAbstractor
from .role_interfaces import (
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
from .task_writer import TaskWriter
from .teacher import TeacherAbstractor, TeacherExplorer

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
) -> Roles:
    """Build the roles: LLM ones on their endpoints, offline ones elsewhere.

    One semaphore bounds the LLM requests of all roles together. ``policy`` (the
    current policy) drives some offline exploration rounds; ``seed_tasks`` are the
    teacher's worked examples and the composer's values and structures. The LLM roles'
    prompts say what ``make_env``'s environment is (its ``EnvironmentBrief``). An endpoint
    name not in ``endpoints`` is a ValueError naming the known ones.
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
    speaks = any(chosen.values()) or config.teacher not in (None, OFFLINE)
    brief = environment_brief(make_env()) if make_env is not None and speaks else None

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
    writer = _own_endpoint(config, "writer", endpoints)
    teacher = _own_endpoint(config, "teacher", endpoints)
    if (writer is not None or teacher is not None) and limiter is None:
        limiter = asyncio.Semaphore(config.llm_concurrency)
    if teacher is not None:
        examples: dict[str, list[Task]] = defaultdict(list)
        for task in seed_tasks:
            examples[task.family].append(task)
        explorer = TeacherExplorer(
            chat_model(endpoints[teacher], temperature=config.teacher_temperature),
            examples,
            limiter,
            rounds=rounds or 2,
            steps=steps or 8,
            max_examples=config.teacher_examples,
            prompt=config.prompt_for("teacher", brief),
        )
    if config.composer:
        explorer = ComposingExplorer(
            seed_tasks, rounds=rounds or 4, steps=steps or 6, seed=config.explorer_seed
        )
    abstractor: Abstractor = (
        ClauseWriter(
            chat_model(endpoints[writer], temperature=config.writer_temperature),
            limiter,
            prompt=config.writer_prompt,
            max_candidates=config.max_candidates,
            grounding=config.writer_grounding,
        )
        if writer is not None and config.composer
        else TaskWriter(
            chat_model(endpoints[writer], temperature=config.writer_temperature),
            limiter,
            prompt=config.writer_prompt,
            max_candidates=config.max_candidates,
            material=config.writer_material,
            grounding=config.writer_grounding,
        )
        if writer is not None
        else TeacherAbstractor(
            max_candidates=config.max_candidates, grounding=config.writer_grounding
        )
        if teacher is not None
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


def _own_endpoint(config: RolesConfig, role: str, endpoints: Mapping[str, Any]) -> str | None:
    """The endpoint of a role that names its own (``writer``, ``teacher``), or None."""
    name = getattr(config, role)
    if name is None or name == OFFLINE:
        return None
    if name not in endpoints:
        known = ", ".join(sorted(endpoints)) or "none defined"
        raise ValueError(
            f"synthesis.roles.{role} uses endpoint {name!r}, which is not in `endpoints` "
            f"(known: {known})"
        )
    return name
