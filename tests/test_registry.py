"""The environment registry: one spec per environment, and nothing else names them."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest
import typer

from coevolve.commands.common import env_scopes
from coevolve.config import ConfigError, load_config
from coevolve.envs.base import (
    Environment,
    SupportsActionWindows,
    SupportsDescribe,
    SupportsSampleAction,
    SupportsVariants,
)
from coevolve.envs.bfcl import BfclEnvironment
from coevolve.envs.catalog import load_tasks, seed_tasks_by_id
from coevolve.envs.config import EnvConfig
from coevolve.envs.registry import ENVIRONMENTS, annotate, get_environment
from coevolve.envs.world import WorldEnvironment, load_split
from coevolve.records import Observation, ToolCall, Trajectory

PACKAGE_ROOT = Path(__file__).resolve().parents[1]


def test_unknown_environment_names_the_known_ones():
    with pytest.raises(ValueError, match=r"unknown environment 'wrld'; allowed: world, bfcl"):
        get_environment("wrld")
    assert get_environment("bfcl") is ENVIRONMENTS["bfcl"]


def test_config_names_the_registered_environments_or_a_users():
    for name in ENVIRONMENTS:
        assert EnvConfig(name=name).name == name
    # anything else must be a user's environment the registry can find (tests/test_user_env.py)
    with pytest.raises(
        ValueError, match=r"unknown environment 'wrld'; allowed: world, bfcl, an import"
    ):
        EnvConfig(name="wrld")


@pytest.mark.parametrize("name", list(ENVIRONMENTS))
def test_config_accepts_each_specs_task_sets_and_nothing_else(name):
    spec = ENVIRONMENTS[name]
    category = {"category": spec.categories[-1]} if spec.categories else {}
    for split in spec.splits:
        assert EnvConfig.model_validate({"name": name, "split": split, **category}).split == split
    with pytest.raises(ValueError, match=f"is not a {spec.title} split; allowed values"):
        EnvConfig(name=name, split="nonsense")
    if spec.categories:
        with pytest.raises(ValueError, match=f"is not a {spec.title} category"):
            EnvConfig(name=name, category="nonsense")
    trainable = [split for split in spec.splits if split != "all"]
    for evaluated in spec.evaluation_splits:
        trained = next(split for split in trainable if split != evaluated)
        config = load_config(
            {"env": {"name": name, "split": trained}, "evaluation": {"split": evaluated}}
        )
        assert config.evaluation.split == evaluated
    for refused in set(trainable) - set(spec.evaluation_splits):
        with pytest.raises(ConfigError, match=f"not a {spec.title} evaluation split"):
            load_config({"env": {"name": name}, "evaluation": {"split": refused}})


def test_oracle_selection_needs_a_validation_split():
    assert load_config({"signals": {"selection": "oracle"}}).env.name == "world"
    with pytest.raises(ConfigError, match="env 'bfcl' has none"):
        load_config({"env": {"name": "bfcl"}, "signals": {"selection": "oracle"}})


def test_each_spec_makes_its_own_environment():
    assert ENVIRONMENTS["world"].environment is WorldEnvironment
    assert ENVIRONMENTS["bfcl"].environment is BfclEnvironment
    for name, spec in ENVIRONMENTS.items():
        environment = spec.environment()
        assert environment.name == name and isinstance(environment, Environment)
        assert set(spec.eval_task_sets) <= set(spec.task_sets)
        assert set(spec.evaluation_splits) <= set(spec.splits)


def test_world_tasks_by_split_and_seed_and_by_id():
    validation = load_tasks("world", split="validation")
    assert validation == load_split("validation") and {t.env for t in validation} == {"world"}
    other_seed = load_tasks("world", split="heldout", seed=2)
    assert other_seed[0].id.startswith("world-s2-heldout-")
    wanted = [validation[3].id, other_seed[5].id, "world-train-9999", "multi_turn_base_1"]
    found = seed_tasks_by_id("world", wanted)
    assert found == {validation[3].id: validation[3], other_seed[5].id: other_seed[5]}


def test_the_cli_reads_task_sets_from_the_spec():
    assert env_scopes("world", None, None, default=("heldout",)) == (["heldout"], "split")
    assert env_scopes("world", "train", None) == (["train"], "split")
    assert env_scopes("bfcl", None, None) == (list(ENVIRONMENTS["bfcl"].task_sets), "category")
    for arguments in (
        ("world", None, "multi_turn_base"),  # the world has no categories
        ("bfcl", "train", None),  # the CLI names BFCL task sets by category
        ("world", "test", None),
        ("nowhere", None, None),
    ):
        with pytest.raises(typer.Exit):
            env_scopes(*arguments)


def test_synthesis_helpers_are_protocols_the_world_has_and_bfcl_has_not():
    world, bfcl = WorldEnvironment(), BfclEnvironment()
    for protocol in (
        SupportsDescribe,
        SupportsSampleAction,
        SupportsActionWindows,
        SupportsVariants,
    ):
        assert isinstance(world, protocol) and not isinstance(bfcl, protocol), protocol


def test_the_worlds_action_windows():
    world = WorldEnvironment()
    task = load_split("validation")[0]
    lookup = ToolCall(name="find_contact", arguments={"name": "Ana"})
    assert not world.changes_state(lookup)
    assert world.changes_state(ToolCall(name="add_contact", arguments={"name": "X", "phone": "1"}))
    assert world.setup_after(task.setup, []) == {"state": task.setup["state"]}
    added = ToolCall(name="add_contact", arguments={"name": "Zed Q", "phone": "555-0000"})
    after = world.setup_after(task.setup, [added])["state"]
    assert after != task.setup["state"] and "Zed Q" in str(after)
    row = Observation(text="id=c3 name=Ana phone=555-0192")
    assert world.lookup_answer(lookup, row) == "555-0192"
    two_rows = Observation(text="id=c3 name=Ana phone=555-0192\nid=c4 name=Ana phone=555-0100")
    assert world.lookup_answer(lookup, two_rows) is None
    assert world.lookup_answer(lookup, Observation(text="error: no", error="not_found")) is None
    assert world.lookup_answer(ToolCall(name="find_note", arguments={"title": "x"}), row) is None


def test_annotate_leaves_unknown_environments_alone():
    trajectory = Trajectory(id="t", task_id="x", env="elsewhere", family="f", steps=[], score=0.0)
    task = load_split("validation")[0].model_copy(update={"id": "x", "env": "elsewhere"})
    assert annotate([trajectory], {"x": task}) == [trajectory]


def test_no_name_dispatch_outside_the_registry():
    dispatch = re.compile(r"""[=!]=\s*["'](world|bfcl)["']|in \(["'](world|bfcl)["']""")
    found = [
        f"{path.relative_to(PACKAGE_ROOT)}:{number}: {line.strip()}"
        for path in sorted(PACKAGE_ROOT.rglob("*.py"))
        if path.relative_to(PACKAGE_ROOT).parts[0] not in {"tests", "build", "runs"}
        and not any(part.startswith(".") for part in path.relative_to(PACKAGE_ROOT).parts)
        and path.name != "registry.py"
        for number, line in enumerate(path.read_text().splitlines(), 1)
        if dispatch.search(line)
    ]
    assert found == []


def test_help_imports_no_environment():
    code = (
        "import sys, coevolve.cli; "
        "print(sorted(m for m in sys.modules if m.startswith(('coevolve.envs', 'bfcl_eval'))))"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True
    ).stdout
    assert out.strip() == "[]"
