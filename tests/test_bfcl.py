"""BFCL multi-turn environment: protocol, safety, and agreement with the official checker.

Tests that need bfcl-eval skip without it; the import and the install message
are tested without it.
"""

from __future__ import annotations

import ast
import importlib.util
import sys
import time
from typing import Any

import pytest

from coevolve.envs import bfcl as bfcl_module
from coevolve.envs.base import Environment, ToolError, replay_reference
from coevolve.envs.bfcl import (
    CATEGORIES,
    INSTALL_COMMAND,
    BfclEnvironment,
    BfclNotInstalledError,
    bfcl_call_string,
    load_tasks,
    require_bfcl,
)
from coevolve.records import Task, ToolCall

SAMPLE = 10
JSON_TYPES = {"string", "integer", "number", "boolean", "array", "object", "null"}


@pytest.fixture(scope="module")
def tasks() -> dict[str, list[Task]]:
    pytest.importorskip("bfcl_eval")
    return {category: load_tasks(category) for category in CATEGORIES}


def _started(task: Task) -> BfclEnvironment:
    env = BfclEnvironment()
    env.reset(task)
    return env


def _score_with_turns(task: Task, edit: Any) -> float:
    """Replay a copy of the task whose reference calls ``edit`` changed.

    The copy keeps the seed task's stored ground truth, so the official checker
    still compares against BFCL's own answer.
    """
    corrupted = task.model_copy(deep=True)
    edit(corrupted.turns)
    return replay_reference(BfclEnvironment(), corrupted)[0]


# --------------------------------------------------------------------------- without the package


def test_missing_package_explains_how_to_install(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "bfcl_eval", None)
    with pytest.raises(BfclNotInstalledError) as info:
        require_bfcl()
    message = str(info.value)
    assert "pip install --no-deps bfcl-eval==2026.3.23 mpmath" in message
    assert INSTALL_COMMAND in message
    assert "make test" in message
    with pytest.raises(BfclNotInstalledError):
        load_tasks("multi_turn_base")
    with pytest.raises(BfclNotInstalledError):
        BfclEnvironment().reset(Task(id="t", env="bfcl", family="f", turns=[{"query": "q"}]))


def test_module_imports_without_package(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "bfcl_eval", None)
    spec = importlib.util.spec_from_file_location(
        "coevolve.envs._bfcl_without_package", bfcl_module.__file__
    )
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)  # must not import bfcl_eval
    assert module.CATEGORIES == CATEGORIES
    with pytest.raises(module.BfclNotInstalledError):
        module.require_bfcl()


def test_unknown_category_names_the_allowed_ones() -> None:
    with pytest.raises(ValueError) as info:
        load_tasks("multi_turn_nope")
    assert all(category in str(info.value) for category in CATEGORIES)


# --------------------------------------------------------------------------- tasks


def test_tasks_are_well_formed(tasks: dict[str, list[Task]]) -> None:
    for category, items in tasks.items():
        assert len(items) == 200
        for task in items:
            assert (task.env, task.family, task.split) == ("bfcl", category, category)
            assert task.setup["entry_id"] == task.id
            assert len(task.setup["ground_truth"]) == len(task.turns)
            assert task.setup["long_context"] == (category == "multi_turn_long_context")
            assert all(turn.query for turn in task.turns)
    # Positional ground truth (``sort('final_report.pdf')``) gets parameter names.
    first = tasks["multi_turn_base"][0]
    assert (
        ToolCall(name="sort", arguments={"file_name": "final_report.pdf"}) in first.reference_calls
    )
    assert Task.model_validate_json(first.model_dump_json()) == first


def test_miss_func_adds_tools_on_their_turn(tasks: dict[str, list[Task]]) -> None:
    task = tasks["multi_turn_miss_func"][0]
    assert [turn.added_tools for turn in task.turns] == [[], [], [], ["sort"], []]
    env = BfclEnvironment()
    query = env.reset(task)
    assert query == task.turns[0].query
    names = lambda: {schema["function"]["name"] for schema in env.tools()}  # noqa: E731
    assert "sort" not in names() and "cd" in names()
    assert env.step(ToolCall(name="sort", arguments={"file_name": "x"})).error == "unknown_tool"
    for index in (1, 2, 3):
        assert env.end_turn() == task.turns[index].query
    assert "sort" in names()
    assert env.step(ToolCall(name="sort", arguments={"file_name": "x"})).error != "unknown_tool"


def test_held_out_tool_arrives_at_first_ground_truth_use(tasks: dict[str, list[Task]]) -> None:
    # BFCL's data holds out ``tail`` until turn 3 but its answer calls it in turn 1.
    task = next(t for t in tasks["multi_turn_miss_func"] if t.id == "multi_turn_miss_func_49")
    assert [turn.added_tools for turn in task.turns] == [[], ["tail"], [], ["wc", "cat"], []]


# --------------------------------------------------------------------------- protocol


def test_protocol_and_tool_schemas(tasks: dict[str, list[Task]]) -> None:
    env = BfclEnvironment()
    assert isinstance(env, Environment)
    assert env.tools() == []
    seen: set[str] = set()
    for task in tasks["multi_turn_base"]:
        classes = set(task.setup["involved_classes"])
        if classes <= seen:
            continue
        seen |= classes
        assert isinstance(env.reset(task), str)
        schemas = env.tools()
        assert schemas
        for schema in schemas:
            assert schema["type"] == "function"
            function = schema["function"]
            assert function["name"].isidentifier()
            assert isinstance(function["description"], str) and function["description"]
            parameters = function["parameters"]
            assert parameters["type"] == "object"
            assert set(parameters["required"]) <= set(parameters["properties"])
            _assert_json_schema_types(parameters)
    assert len(seen) == 8  # every multi-turn class was covered


def _assert_json_schema_types(schema: dict[str, Any]) -> None:
    kinds = schema.get("type", [])
    for kind in [kinds] if isinstance(kinds, str) else kinds:
        assert kind in JSON_TYPES, kind
    for sub in schema.get("properties", {}).values():
        _assert_json_schema_types(sub)
    if isinstance(schema.get("items"), dict):
        _assert_json_schema_types(schema["items"])


def test_bad_actions_come_back_as_errors(tasks: dict[str, list[Task]]) -> None:
    env = BfclEnvironment()
    assert env.step("cd(folder='a')").error == "episode_over"  # before reset
    env.reset(tasks["multi_turn_base"][0])
    cases = {
        "this is not a tool call": "parse_error",
        "cd(folder=__import__('os').getcwd())": "bad_arguments",
        "cd('document')": "bad_arguments",
        '{"name": "cd", "arguments": "{not json"}': "bad_json",
        "[cd(folder='a'), ls()]": "parse_error",
        "rm_rf(path='/')": "unknown_tool",
        "__import__(name='os')": "unknown_tool",
        "_load_scenario(scenario={})": "unknown_tool",
        "cd(folder=3)": "bad_arguments",
        "cd(dir='document')": "bad_arguments",
        "cd()": "bad_arguments",
        "tail(file_name='x', lines='ten')": "bad_arguments",
        "cd(folder='no_such_folder')": "api_error",
    }
    for action, kind in cases.items():
        observation = env.step(action)
        assert observation.error == kind, (action, observation)
        assert observation.text.startswith("error:")
    # A method that raises: ``mean`` of an empty list divides by zero in BFCL's code.
    math_task = next(
        t for t in tasks["multi_turn_base"] if "MathAPI" in t.setup["involved_classes"]
    )
    env.reset(math_task)
    raised = env.step(ToolCall(name="mean", arguments={"numbers": []}))
    assert raised.error is not None
    good = env.step(ToolCall(name="mean", arguments={"numbers": [1, 2, 3]}))
    assert good.error is None and "2.0" in good.text


def test_episode_flow_and_unfinished_episode_scores_zero(tasks: dict[str, list[Task]]) -> None:
    task = tasks["multi_turn_base"][0]
    env = BfclEnvironment()
    assert env.score() == 0.0  # never reset
    env.reset(task)
    for call in task.turns[0].reference_calls:
        assert env.step(call).error is None
    assert env.end_turn() == task.turns[1].query
    assert env.score() == 0.0  # cut off: BFCL fails force-terminated entries
    for _ in task.turns[1:]:
        env.end_turn()
    assert env.end_turn() is None
    assert env.step(ToolCall(name="ls")).error == "episode_over"


def test_call_strings_hold_only_literals() -> None:
    hostile = "x'); __import__('os').system('echo pwned'); ('"
    source = bfcl_call_string(
        ToolCall(name="echo", arguments={"content": hostile, "n": [1, 2.5, True, None, {"k": "v"}]})
    )
    node = ast.parse(source, mode="eval").body
    assert isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and not node.args
    values = {kw.arg: ast.literal_eval(kw.value) for kw in node.keywords}
    assert values == {"content": hostile, "n": [1, 2.5, True, None, {"k": "v"}]}
    for bad in (object(), float("nan"), b"bytes", {1, 2}):
        with pytest.raises(ToolError):
            bfcl_call_string(ToolCall(name="echo", arguments={"content": bad}))
    with pytest.raises(ToolError):
        bfcl_call_string(ToolCall(name="os.system", arguments={}))
    with pytest.raises(ToolError):
        bfcl_call_string(ToolCall(name="echo", arguments={"a=1,b": 2}))


def test_long_context_loads_the_long_scenario(tasks: dict[str, list[Task]]) -> None:
    lengths = []
    for category in ("multi_turn_base", "multi_turn_long_context"):
        env = _started(tasks[category][0])
        env.step(ToolCall(name="cd", arguments={"folder": "document"}))
        lengths.append(len(env.step(ToolCall(name="ls")).text))
    assert lengths[1] > 5 * lengths[0]


# --------------------------------------------------------------------------- checker agreement


@pytest.mark.parametrize("category", CATEGORIES)
def test_reference_sample_scores_one(tasks: dict[str, list[Task]], category: str) -> None:
    for task in tasks[category][:SAMPLE]:
        score, steps = replay_reference(BfclEnvironment(), task)
        assert score == 1.0, task.id
        assert len(steps) == len(task.reference_calls)


def test_checker_cache_is_cleared(tasks: dict[str, list[Task]]) -> None:
    from bfcl_eval.eval_checker.multi_turn_eval import multi_turn_utils

    before = set(vars(multi_turn_utils))
    replay_reference(BfclEnvironment(), tasks["multi_turn_base"][0])
    assert set(vars(multi_turn_utils)) == before


def test_synthesized_task_is_scored_against_its_own_reference(
    tasks: dict[str, list[Task]],
) -> None:
    # A derived task keeps its parent's setup but not its ground truth.
    parent = next(t for t in tasks["multi_turn_base"] if len(t.turns[0].reference_calls) >= 2)
    derived = parent.model_copy(deep=True, update={"id": "derived", "source": "synthesized"})
    derived.turns = derived.turns[:1]
    assert replay_reference(BfclEnvironment(), derived)[0] == 1.0
    derived.turns[0].reference_calls = derived.turns[0].reference_calls[:-1]
    assert replay_reference(BfclEnvironment(), derived)[0] == 1.0  # its own reference again
    lazy = derived.model_copy(deep=True)
    env = BfclEnvironment()
    env.reset(lazy)
    env.end_turn()
    assert env.score() == 0.0


def _first_turn_with_calls(turns: list[Any]) -> int:
    return next(index for index, turn in enumerate(turns) if turn.reference_calls)


def _drop_first_call(turns: list[Any]) -> None:
    turns[_first_turn_with_calls(turns)].reference_calls.pop(0)


def _drop_last_call(turns: list[Any]) -> None:
    last = max(index for index, turn in enumerate(turns) if turn.reference_calls)
    turns[last].reference_calls.pop()


def _change_a_string_argument(turns: list[Any]) -> None:
    for turn in turns:
        for call in turn.reference_calls:
            for key, value in call.arguments.items():
                if isinstance(value, str):
                    call.arguments[key] = value + "_changed"
                    return
    raise AssertionError("no string argument to change")


def _add_a_wrong_call(turns: list[Any]) -> None:
    index = _first_turn_with_calls(turns)
    turns[index].reference_calls.append(
        ToolCall(name="mkdir", arguments={"dir_name": "not_asked_for"})
    )


@pytest.mark.parametrize("category", CATEGORIES)
@pytest.mark.parametrize(
    "corrupt", [_drop_first_call, _drop_last_call, _change_a_string_argument, _add_a_wrong_call]
)
def test_corrupted_reference_scores_zero(
    tasks: dict[str, list[Task]], category: str, corrupt: Any
) -> None:
    # The first tasks all involve the file system, so ``mkdir`` is a real, state-changing call.
    for task in tasks[category][:SAMPLE]:
        assert "GorillaFileSystem" in task.setup["involved_classes"]
        assert _score_with_turns(task, corrupt) == 0.0, task.id


@pytest.mark.slow
@pytest.mark.parametrize("category", CATEGORIES)
def test_every_reference_scores_one(tasks: dict[str, list[Task]], category: str) -> None:
    started = time.perf_counter()
    failed = [
        task.id for task in tasks[category] if replay_reference(BfclEnvironment(), task)[0] != 1.0
    ]
    assert failed == [], failed
    assert time.perf_counter() - started < 30


@pytest.mark.slow
def test_endpoint_eval_per_category_against_the_test_server(tmp_path: Any) -> None:
    """`coevolve eval --env bfcl --policy CONFIG` over real HTTP, scored by the official checker.

    The server plays the reference solution (coevolve.testing.reference_agent),
    wrong on every other task: the report must say exactly which succeeded.
    """
    pytest.importorskip("bfcl_eval")
    import json
    import subprocess

    import yaml

    from coevolve.testing.openai_server import ScriptedOpenAIServer
    from coevolve.testing.reference_agent import reference_replies

    categories = ("multi_turn_base", "multi_turn_miss_param")
    tasks = [t for c in categories for t in load_tasks(c)[:4]]
    wrong = {t.id for t in tasks[1::2]}
    server = ScriptedOpenAIServer(reference_replies(tasks, wrong=wrong.__contains__)).start()
    try:
        config = tmp_path / "bfcl.yaml"
        config.write_text(
            yaml.safe_dump(
                {
                    "endpoints": {
                        "local": {
                            "base_url": server.base_url,
                            "model": server.model,
                            "temperature": 0.0,
                        }
                    },
                    "policy": {"kind": "endpoint", "endpoint": "local"},
                }
            )
        )
        reports = {}
        for category in categories:
            report_path = tmp_path / f"{category}.json"
            out = subprocess.run(
                [
                    sys.executable, "-m", "coevolve", "eval", "--env", "bfcl", "--category", category,
                    "--policy", str(config), "--limit", "4", "--report", str(report_path),
                ],
                capture_output=True, text=True, timeout=300,
            )  # fmt: skip
            assert out.returncode == 0, out.stderr[-2000:]
            assert category in out.stdout and "overall" in out.stdout
            reports[category] = json.loads(report_path.read_text())
    finally:
        server.stop()
    for category, report in reports.items():
        expected = sum(t.id not in wrong for t in tasks if t.family == category)
        assert report["category"] == category
        assert report["overall"]["episodes"] == 4
        assert report["overall"]["successes"] == expected
        assert report["by_family"][category]["success_rate"] == expected / 4
        assert report["overall"]["errors"] == 0


def test_oracle_fits_long_turns_into_the_step_limit(tasks: dict[str, list[Task]]) -> None:
    """34 calls in one turn: the oracle sends them as parallel calls within BFCL's 20 steps."""
    from coevolve.agents.policy.oracle import OraclePolicy
    from coevolve.agents.policy.rollout import run_rollouts

    long_turns = [
        t
        for t in tasks["multi_turn_long_context"]
        if max(len(u.reference_calls) for u in t.turns) > 20
    ]
    assert long_turns, "BFCL's long-context category has turns of more than 20 calls"
    trajectories = run_rollouts(
        OraclePolicy(), BfclEnvironment, long_turns, max_tool_calls=20, progress=False
    )
    assert [t.score for t in trajectories] == [1.0] * len(long_turns)
    assert all(t.finished for t in trajectories)


def test_each_category_splits_in_two_disjoint_halves_for_train_and_heldout():
    """SEAL's shape: 100 + 100 of each category's 200, fixed by the ids alone."""
    for category in CATEGORIES:
        everything = load_tasks(category)
        train = load_tasks(category, split="train")
        heldout = load_tasks(category, split="heldout")
        assert len(train) == len(heldout) == len(everything) // 2 == 100
        assert {t.id for t in train}.isdisjoint(t.id for t in heldout)
        assert {t.id for t in train} | {t.id for t in heldout} == {t.id for t in everything}
    assert [t.id for t in load_tasks(CATEGORIES[0], split="train", limit=3)] == [
        t.id for t in load_tasks(CATEGORIES[0], split="train")[:3]
    ]
    with pytest.raises(ValueError, match="unknown BFCL split"):
        load_tasks(CATEGORIES[0], split="validation")


def test_all_four_categories_make_seals_400_and_400_split():
    """category multi_turn: SEAL's 400 training and 400 test tasks, each labelled with its
    own category, and the loop refuses to evaluate on the half it trains on."""
    from coevolve.config import CoevolveConfig
    from coevolve.envs.bfcl import ALL_CATEGORIES

    train = load_tasks(ALL_CATEGORIES, split="train")
    heldout = load_tasks(ALL_CATEGORIES, split="heldout")
    assert len(train) == len(heldout) == 400
    assert {t.id for t in train}.isdisjoint(t.id for t in heldout)
    # exactly the ids of SEAL's published split (envs/data/bfcl_400_split.json)
    import json

    from coevolve.envs.bfcl import SEAL_SPLIT_FILE

    published = json.loads(SEAL_SPLIT_FILE.read_text())
    assert {t.id for t in train} == set(published["train"])
    assert {t.id for t in heldout} == set(published["test"])
    for category in CATEGORIES:
        assert [t.id for t in train if t.family == category] == [
            t.id for t in load_tasks(category, split="train")
        ]
    config = CoevolveConfig.model_validate(
        {"env": {"name": "bfcl", "category": "multi_turn", "split": "train"}}
    )
    assert config.env.category == ALL_CATEGORIES
    with pytest.raises(ValueError, match=r"overlaps env\.split"):
        CoevolveConfig.model_validate(
            {
                "env": {"name": "bfcl", "category": "multi_turn", "split": "all"},
                "evaluation": {"split": "heldout"},
            }
        )
