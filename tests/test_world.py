"""The built-in world: protocol conformance, splits, verifier, describer, sampler."""

import copy
import random
from collections import Counter

import pytest

from coevolve.envs.base import Environment, check_references, replay_reference
from coevolve.envs.world import (
    APPS,
    FAMILIES,
    SPLITS,
    TOOL_NAMES,
    WorldEnvironment,
    family_counts,
    load_split,
    make_task,
)
from coevolve.envs.world.apps import MUTATING_TOOLS
from coevolve.records import Task, ToolCall


def one_task_per_family(split="validation"):
    seen = {}
    for task in load_split(split):
        seen.setdefault(task.family, task)
    return list(seen.values())


def run(task, calls, answer=None):
    env = WorldEnvironment()
    env.reset(task)
    for call in calls:
        env.step(call)
    env.end_turn(answer)
    return env.score()


def test_conforms_to_the_protocol():
    env = WorldEnvironment()
    assert isinstance(env, Environment)
    assert (len(TOOL_NAMES), len(APPS), len(FAMILIES)) == (31, 7, 18)
    assert sorted(t for tools in APPS.values() for t in tools) == sorted(TOOL_NAMES)
    for schema in env.tools():
        function = schema["function"]
        assert schema["type"] == "function" and function["name"] and function["description"]
        parameters = function["parameters"]
        assert parameters["type"] == "object"
        assert set(parameters["required"]) <= set(parameters["properties"])
        assert all("type" in prop for prop in parameters["properties"].values())
    task = load_split("validation")[0]
    assert env.reset(task) == task.instruction


def test_families_differ_in_length_value_flow_and_recovery():
    lengths, recovering = {}, set()
    for task in one_task_per_family():
        score, steps = replay_reference(WorldEnvironment(), task)
        assert score == 1.0
        lengths[task.family] = len(task.reference_calls)
        if any(step.observation.error for step in steps):
            recovering.add(task.family)
    assert min(lengths.values()) == 1 and max(lengths.values()) == 6
    assert {"message_new_contact", "buy_with_topup"} <= recovering
    # ids flow from an observation into a later call
    task = next(t for t in one_task_per_family() if t.family == "send_message")
    _, steps = replay_reference(WorldEnvironment(), task)
    assert steps[1].call.arguments["contact_id"] in steps[0].observation.text


@pytest.mark.parametrize("split", SPLITS)
def test_every_reference_solution_verifies(split):
    report = check_references(WorldEnvironment, load_split(split), "world", {"split": split})
    assert report.verified == report.total, report.failures[:3]


def test_splits_are_deterministic():
    assert load_split("train", size=50) == load_split("train", size=50)
    assert make_task("heldout", 7, "buy_two") == make_task("heldout", 7, "buy_two")
    assert make_task("heldout", 7, "buy_two", seed=1) != make_task("heldout", 7, "buy_two")


def test_train_is_uneven_and_eval_splits_are_even():
    train = Counter(task.family for task in load_split("train"))
    assert set(train) == set(FAMILIES)
    shares = {family: count / sum(train.values()) for family, count in train.items()}
    assert sum(share <= 0.03 for share in shares.values()) >= 4
    assert max(shares.values()) >= 0.10
    for split in ("validation", "heldout"):
        counts = Counter(task.family for task in load_split(split))
        assert set(counts) == set(FAMILIES) and len(set(counts.values())) == 1
    assert sum(family_counts("train", 37).values()) == 37


def _entity_values(tasks):
    values = set()
    for task in tasks:
        state = task.setup["state"]
        values |= {c["name"] for c in state["contacts"].values()}
        values |= {p["name"] for p in state["products"].values()}
        values |= {e["title"] for e in state["events"].values()}
        values |= {m["text"] for m in state["messages"].values()}
        for call in task.reference_calls:
            values |= {
                v for k, v in call.arguments.items() if k in ("name", "query", "title", "text")
            }
    return values


def test_heldout_values_are_unseen_in_training():
    train = _entity_values(load_split("train"))
    for split in ("validation", "heldout"):
        assert not train & _entity_values(load_split(split))


def _first_mutating_with_args(calls):
    for index, call in enumerate(calls):
        if call.name in MUTATING_TOOLS and call.arguments:
            return index
    return None


@pytest.mark.parametrize("task", one_task_per_family(), ids=lambda t: t.family)
def test_wrong_action_sequences_fail(task):
    calls, answer = task.reference_calls, task.reference_answer
    assert run(task, calls, answer) == 1.0
    if answer is not None:
        assert run(task, calls, "I could not find it") == 0.0
        assert run(task, calls, None) == 0.0
    mutating = [i for i, call in enumerate(calls) if call.name in MUTATING_TOOLS]
    if mutating:
        assert run(task, [], answer) == 0.0
        assert run(task, [c for i, c in enumerate(calls) if i != mutating[-1]], answer) == 0.0
        index = _first_mutating_with_args(calls)
        corrupted = copy.deepcopy(calls)
        key = next(k for k, v in corrupted[index].arguments.items() if isinstance(v, str | int))
        value = corrupted[index].arguments[key]
        corrupted[index].arguments[key] = value + 1 if isinstance(value, int) else "zzz"
        assert run(task, corrupted, answer) == 0.0
        # one extra, unrelated change of state also fails
        extra = ToolCall(name="create_note", arguments={"title": "stray", "body": "x"})
        assert run(task, [*calls, extra], answer) == 0.0


def test_free_text_is_judged_by_content():
    task = next(t for t in one_task_per_family() if t.family == "share_event_time")
    send = task.reference_calls[-1]
    event = task.setup["state"]["events"][
        task.reference_calls[0].arguments["title"]
        and next(
            eid
            for eid, e in task.setup["state"]["events"].items()
            if e["title"] == task.reference_calls[0].arguments["title"]
        )
    ]
    reworded = send.model_copy(
        update={
            "arguments": {**send.arguments, "text": f"Hi! It's {event['date']}, {event['time']}."}
        }
    )
    assert run(task, [*task.reference_calls[:-1], reworded]) == 1.0
    missing_time = send.model_copy(
        update={"arguments": {**send.arguments, "text": f"It's on {event['date']}"}}
    )
    assert run(task, [*task.reference_calls[:-1], missing_time]) == 0.0


def test_recovery_with_a_different_top_up_still_counts():
    task = next(t for t in one_task_per_family() if t.family == "buy_with_topup")
    calls = list(task.reference_calls)
    calls[3] = ToolCall(name="top_up", arguments={"amount": calls[3].arguments["amount"] + 50})
    assert run(task, calls) == 1.0


def test_errors_are_observations():
    env = WorldEnvironment()
    env.reset(load_split("validation")[0])
    assert env.step(ToolCall(name="fly", arguments={})).error == "unknown_tool"
    assert env.step(ToolCall(name="top_up", arguments={"amount": "ten"})).error == "bad_arguments"
    assert env.step(ToolCall(name="top_up", arguments={})).error == "bad_arguments"
    assert env.step('{"name": "top_up", "arguments": {').error == "bad_json"
    assert env.step("top_up(amount=1000)").error == "invalid_value"
    assert env.step("update_phone(contact_id='c99', phone='555-0000')").error == "not_found"
    assert env.step("[get_balance(), get_balance()]").error == "parse_error"
    assert env.step("get_balance()").error is None


def test_step_before_reset_is_an_observation():
    assert WorldEnvironment().step("get_balance()").error == "not_started"


def test_describer_and_sampler():
    env = WorldEnvironment()
    rng = random.Random(0)
    for task in one_task_per_family():
        env.reset(task)
        text = env.describe(task.reference_calls, task.setup)
        assert text.endswith(".") and len(text) > 8
        for call in task.reference_calls:
            if call.name == "send_message":
                assert call.arguments["text"] in text
    env.reset(load_split("validation")[0])
    errors = Counter()
    for _ in range(200):
        call = env.sample_action(rng)
        assert call is not None
        errors[env.step(call).error] += 1
    assert errors["unknown_tool"] == errors["bad_arguments"] == errors["parse_error"] == 0
    assert errors[None] > 150
    focused = {env.sample_action(rng, ["top_up", "get_balance"]).name for _ in range(30)}
    assert focused == {"top_up", "get_balance"}


def test_tasks_round_trip_through_json():
    for task in one_task_per_family("heldout"):
        again = Task.model_validate_json(task.model_dump_json())
        assert again == task
        assert run(again, again.reference_calls, again.reference_answer) == 1.0


def test_a_task_without_state_is_refused_clearly():
    task = Task(id="x", env="world", family="f", turns=[{"query": "q"}])
    with pytest.raises(ValueError, match="setup"):
        WorldEnvironment().reset(task)


def test_a_cloned_state_is_the_json_round_trip_and_shares_nothing():
    """The verifier's copy (orjson) must read as the standard library's round trip did:
    keys as strings, tuples as lists, and no object shared with the original."""
    import json

    from coevolve.envs.world.verifier import clone

    state = {"contacts": {"c1": {"name": "Bo", "tags": ("a", "b")}}, 7: [1.5, None, True]}
    copied = clone(state)
    assert copied == json.loads(json.dumps(state))
    copied["contacts"]["c1"]["name"] = "Al"
    assert state["contacts"]["c1"]["name"] == "Bo"
