"""The LLM synthesis roles' prompts say what the run's environment is: the support desk's
roles read the desk's docstrings and tools, the world's read the world's own text, and a
config's prompt still replaces the default."""

from __future__ import annotations

from pathlib import Path

import pytest

from coevolve.agents.roles.role_interfaces import ROLE_NAMES, RolesConfig
from coevolve.envs.base import environment_brief
from coevolve.envs.registry import get_environment
from coevolve.loop.build_runtime import spec_synthesis_runtime

ROOT = Path(__file__).resolve().parents[1]
EXAMPLE = "examples.support_desk.env:make_env"
DESK_TOOLS = (
    *("find_customer", "list_orders", "change_plan", "update_email"),
    *("refund_order", "cancel_order", "open_ticket"),
)
WORLD_ONLY = ("c3, e2", "a person's apps", "contacts, messages, calendar", "BFCL")


@pytest.fixture(autouse=True)
def _from_the_repository_root(monkeypatch):
    monkeypatch.chdir(ROOT)  # the example's import path is relative to it


def llm_role_prompts(env: str, roles: dict | None = None) -> dict[str, str]:
    """Each LLM role's system prompt as a synthesis pass on ``env`` builds it (Studio's and
    ``coevolve synthesize``'s composition); the endpoint is never called."""
    endpoint = {"base_url": "http://127.0.0.1:9/v1", "model": "m", "max_retries": 0}
    runtime = spec_synthesis_runtime(
        env=env,
        roles={"default_endpoint": "main", **(roles or {})},
        endpoints={"main": endpoint},
        synthesizer="llm",
    )
    return {role: getattr(runtime.roles, role).prompt for role in ROLE_NAMES}


def test_every_roles_prompt_speaks_of_the_support_desk_not_the_world():
    prompts = llm_role_prompts(EXAMPLE)
    for role, prompt in prompts.items():
        for text in WORLD_ONLY:
            assert text not in prompt, (role, text)
        assert "{environment}" not in prompt, role
        # The state class's docstring, every tool, and the id convention its docstrings give.
        assert "A support desk: customers, their orders and support tickets." in prompt, role
        assert all(tool in prompt for tool in DESK_TOOLS), role
        assert "customer_id: The customer's id, e.g. C-101" in prompt, role
        assert "order_id: The order's id, e.g. O-5001" in prompt, role


def test_the_worlds_and_bfcls_own_descriptions_fill_the_same_slot():
    world = llm_role_prompts("world")["summarizer"]
    assert (
        "The agent works in an executable environment: a simulated set of a person's apps "
        "(contacts, messages, calendar, notes, a shop with a cart and orders, a wallet, "
        "reminders)." in world
    )
    assert "Ids look like c3, e2, p5, o1." in world and "find_contact, list_contacts" in world
    assert "BFCL" not in world
    bfcl = environment_brief(get_environment("bfcl").environment())
    summarizer = RolesConfig().prompt_for("summarizer", bfcl)
    assert "BFCL multi-turn function calling" in summarizer
    assert not any(text in summarizer for text in WORLD_ONLY[:3])


def test_a_configs_prompt_replaces_the_default_and_may_use_the_slot():
    prompts = llm_role_prompts(
        EXAMPLE,
        roles={
            "summarizer_prompt": 'Summarize a rollout in {environment} Reply {"summary": ...}.',
            "judge_prompt": "Judge the task.",
        },
    )
    assert prompts["summarizer"].startswith(
        "Summarize a rollout in A support desk: customers, their orders and support tickets."
    )
    assert prompts["summarizer"].endswith('Reply {"summary": ...}.')
    assert prompts["judge"] == "Judge the task."  # no slot: as written
