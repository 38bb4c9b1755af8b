"""The LLM synthesis roles' prompts say what the run's environment is: the support desk's
roles read the desk's docstrings and tools, the world's read the world's own text, and a
config's prompt still replaces the default."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from coevolve.agents.roles.role_interfaces import ROLE_NAMES, RolesConfig
from coevolve.envs.brief import environment_brief
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


# The world's examples and tool names: none may reach a prompt on a user's environment.
WORLD_EXAMPLES = (
    "find_contact > send_message",
    "a phone number, a price, a time",
    "names, titles, product names, dates",
    "other people, items, dates, quantities",
    "find/list/search/read",
    "the user's apps",
)
# The world's policy prompt, pinned byte for byte: a published verdict depends on it.
WORLD_POLICY_PROMPT = (
    "You operate the user's apps by calling tools. Call one tool at a time, read its result, "
    "and when the request is done reply with a short final answer."
)


def world_things_in(prompt: str) -> list[str]:
    from coevolve.envs.world.apps import TOOL_NAMES

    world_only = [name for name in TOOL_NAMES if name not in DESK_TOOLS]  # both list_orders
    return [text for text in (*WORLD_EXAMPLES, *world_only) if text in prompt]


def desk_policy_prompt() -> str | None:
    from coevolve.config import load_config
    from coevolve.loop.build_runtime import with_environment_policy_prompt

    config = load_config(str(ROOT / "examples/support_desk/config.yaml"))
    return with_environment_policy_prompt(config).policy.system_prompt


def test_the_support_desks_prompts_name_none_of_the_worlds_things():
    for role, prompt in llm_role_prompts(EXAMPLE).items():
        assert world_things_in(prompt) == [], role
    prompts = llm_role_prompts(EXAMPLE)
    # Its own examples instead: its tools in a pattern, its lookups, its arguments.
    assert 'action patterns (e.g. "find_customer > list_orders")' in prompts["summarizer"]
    assert "using lookups (find_customer, list_orders)" in prompts["explorer"]
    assert "realistic variations (other values of email, plan," in prompts["explorer"]
    assert "what a person knows (email, plan, new email, reason, topic)" in prompts["abstractor"]


def test_the_support_desks_policy_prompt_is_its_own_and_the_worlds_is_unchanged():
    from coevolve.agents.prompts import POLICY_SYSTEM_PROMPT, environment_policy_prompt
    from coevolve.config import load_config
    from coevolve.loop.build_runtime import with_environment_policy_prompt

    desk = desk_policy_prompt()
    assert desk is not None and world_things_in(desk) == []
    assert "A support desk: customers, their orders and support tickets." in desk
    assert all(tool in desk for tool in DESK_TOOLS)
    assert "customer_id: The customer's id, e.g. C-101" in desk
    assert desk.endswith("when the request is done reply with a short final answer.")
    # The world (and BFCL) keep the prompt their agents were trained with, byte for byte.
    assert POLICY_SYSTEM_PROMPT == WORLD_POLICY_PROMPT
    world = load_config({"env": {"name": "world"}})
    assert with_environment_policy_prompt(world) is world
    assert environment_policy_prompt(POLICY_SYSTEM_PROMPT, "bfcl") == WORLD_POLICY_PROMPT
    # A config's own text is used as written, on a user's environment too.
    assert environment_policy_prompt("Be brief.", EXAMPLE) == "Be brief."
    assert environment_policy_prompt(None, EXAMPLE) is None


def test_the_worlds_role_prompts_keep_the_worlds_examples():
    prompts = llm_role_prompts("world")
    assert '(e.g. "find_contact > send_message")' in prompts["summarizer"]
    assert "using lookups (find/list/search/read)" in prompts["explorer"]
    assert "(names, titles, product names, dates)" in prompts["abstractor"]
    assert "(a phone number, a price, a time)" in prompts["abstractor"]


def test_env_prompts_prints_every_roles_prompt_and_the_policys():
    from typer.testing import CliRunner

    from coevolve.cli import app

    result = CliRunner().invoke(app, ["env", "prompts", EXAMPLE, "--json"])
    assert result.exit_code == 0, result.output
    shown = json.loads(result.output)["prompts"]
    assert set(shown) == {*ROLE_NAMES, "policy"}
    for role, prompt in shown.items():
        assert world_things_in(prompt) == [], role
        assert "A support desk: customers, their orders and support tickets." in prompt, role
    assert shown["policy"] == desk_policy_prompt()
    # The example pattern is a seed task's tool sequence.
    assert '(e.g. "find_customer > ' in shown["summarizer"]
    result = CliRunner().invoke(app, ["env", "prompts", EXAMPLE])
    assert result.exit_code == 0, result.output
    for heading in (
        "summarizer (synthesis.roles.summarizer_prompt)",
        "policy (policy.system_prompt)",
    ):
        assert heading in result.output
    world = CliRunner().invoke(app, ["env", "prompts", "world", "--json"])
    assert json.loads(world.output)["prompts"]["policy"] == WORLD_POLICY_PROMPT


def add_payee(state: dict, account_id: str, target_account_id: str) -> str:
    """Add another account as a payee of an account.

    Args:
        account_id: The account's id, e.g. A-100.
        target_account_id: The account to add as a payee.
    """
    return "ok"


def transfer(state: dict, account_id: str, target_account_id: str, amount: float) -> str:
    """Move money to a payee.

    Args:
        account_id: The account's id, e.g. A-100.
        target_account_id: The payee's account that receives the money.
        amount: How much to move.
    """
    return "ok"


def test_an_id_several_tools_take_is_described_per_tool():
    from coevolve.envs import FunctionEnvironment

    ids = FunctionEnvironment([add_payee, transfer], name="bank").brief().ids
    # Described alike everywhere: once.
    assert "account_id: The account's id, e.g. A-100;" in ids
    assert ids.count("The account's id, e.g. A-100") == 1
    # Described differently: each tool's text, named by its tool.
    assert "target_account_id in add_payee: The account to add as a payee" in ids
    assert "in transfer: The payee's account that receives the money" in ids
