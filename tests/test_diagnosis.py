"""SEAL's failure diagnosis and the graded progress score, on hand-made trajectories.

Every trajectory here is played through the real environment (real observations,
real BFCL executors and checkers); only the model's actions are scripted.
"""

from __future__ import annotations

import pytest

from coevolve.envs import diagnosis as dx
from coevolve.envs.base import replay_reference
from coevolve.envs.registry import annotate, get_environment
from coevolve.envs.world import WorldEnvironment, load_split, world_diagnosis
from coevolve.records import Step, Task, ToolCall, Trajectory, Turn


def _call(tool: str, **arguments) -> ToolCall:
    return ToolCall(name=tool, arguments=arguments)


def _world_task(family: str) -> Task:
    return next(t for t in load_split("heldout") if t.family == family)


def _play_world(task: Task, actions, answer: str | None = "Done.") -> tuple[Trajectory, float]:
    env = WorldEnvironment()
    env.reset(task)
    steps = []
    for action in actions:
        observation = env.step(action)
        call = action if isinstance(action, ToolCall) else None
        steps.append(Step(call=call, raw=None if call else str(action), observation=observation))
    env.end_turn(answer)
    trajectory = Trajectory(
        id=f"{task.id}/t",
        task_id=task.id,
        env="world",
        family=task.family,
        steps=steps,
        final_answer=answer,
        score=env.score(),
    )
    labels = env.diagnose(trajectory)
    # the stored-trajectory path gives the same labels, and progress agrees with the live env
    assert get_environment(task.env).diagnose(task, trajectory) == (labels, env.progress())
    return trajectory.model_copy(update={"diagnosis": labels}), env.progress()


# --------------------------------------------------------------------------- world


def test_world_every_step_label_in_priority_order():
    task = _world_task("update_phone")  # find_contact(Yves) -> update_phone(c1, ...)
    contact_id = task.reference_calls[1].arguments["contact_id"]
    other = next(c for c in task.setup["state"]["contacts"] if c != contact_id)
    trajectory, progress = _play_world(
        task,
        [
            "this is not a call",  # parse error
            _call("no_such_tool"),  # unknown tool
            _call("update_phone", contact_id=contact_id),  # schema: phone missing
            _call("update_phone", contact_id=contact_id, phone="12"),  # invalid value
            _call("find_contact", name="Nobody Here"),  # not_found, never recovered
            _call("get_balance"),  # an app the reference never uses
            _call("update_phone", contact_id=other, phone="555-0000"),  # the wrong contact
            _call("find_contact", name=task.reference_calls[0].arguments["name"]),
        ],
    )
    assert trajectory.diagnosis == [
        "invalid_tool_call",
        "invalid_tool_call",
        "argument_mismatch",
        "argument_mismatch",
        "pass",  # find_contact fails, but a later find_contact succeeds: recovered
        "instance_mismatch",
        "state_mismatch",
        "pass",
        "state_mismatch",  # outcome: the right phone was never changed
    ]
    assert trajectory.score == 0.0
    # expected change (Yves's phone) missed, one unexpected change (the other contact): 0 / 2
    assert progress == 0.0


def test_world_recovery_failure_and_planned_errors():
    task = _world_task("update_phone")
    trajectory, _ = _play_world(task, [_call("find_contact", name="Nobody Here")])
    assert trajectory.diagnosis == ["recovery_failure", "state_mismatch"]
    # message_new_contact's reference looks the contact up first and fails on purpose
    task = _world_task("message_new_contact")
    env = WorldEnvironment()
    score, steps = replay_reference(env, task)
    assert score == 1.0 and any(step.observation.error == "not_found" for step in steps)
    assert set(world_diagnosis.diagnose_world(task, steps, "Done.")) == {"pass"}


def test_world_outcome_labels():
    lookup = _world_task("price_check")
    right, _ = _play_world(lookup, lookup.reference_calls, answer=lookup.reference_answer)
    assert right.diagnosis == ["pass", "pass"] and right.score == 1.0
    wrong, progress = _play_world(lookup, lookup.reference_calls, answer="no idea")
    assert wrong.diagnosis == ["pass", "response_mismatch"] and progress == 0.0
    nothing, _ = _play_world(lookup, [], answer=lookup.reference_answer)
    assert nothing.diagnosis == ["empty_turn_model_response"]
    # a task whose reference makes no call: abstaining is right, calling is spurious
    chat = lookup.model_copy(
        update={"turns": [Turn(query="Just say hi.")], "reference_answer": None, "id": "w-chat"}
    )
    quiet, _ = _play_world(chat, [])
    assert quiet.diagnosis == ["correct_abstention"] and quiet.score == 1.0
    busy, _ = _play_world(chat, [_call("get_balance")])
    assert busy.diagnosis == ["instance_mismatch", "spurious_tool_call"]


def test_world_progress_counts_expected_changes():
    # move the event, text Oz, text Wim: three expected changes
    task = _world_task("move_and_tell_two")
    calls = task.reference_calls
    part, progress = _play_world(task, calls[:4])  # moved and told Oz only
    assert part.score == 0.0 and part.diagnosis == ["pass"] * 4 + ["state_mismatch"]
    assert progress == pytest.approx(2 / 3)
    full, progress = _play_world(task, calls)
    assert full.score == 1.0 and progress == 1.0
    # an unexpected change is an extra unit never achieved: 3 of 4
    extra, progress = _play_world(task, [*calls, _call("top_up", amount=5)])
    assert extra.diagnosis[-2:] == ["instance_mismatch", "state_mismatch"]
    assert progress == pytest.approx(3 / 4)


def _grade(task: Task, trajectory: Trajectory) -> float:
    return get_environment("world").failure_grade(task, trajectory)


def test_world_failure_grade_counts_reference_calls_in_order():
    # move the event, text Oz, text Wim: three expected changes, six reference calls
    task = _world_task("move_and_tell_two")
    calls = task.reference_calls
    assert len(calls) == 6
    part, progress = _play_world(task, calls[:4])  # moved and told Oz only
    assert progress == pytest.approx(2 / 3) and _grade(task, part) == pytest.approx(6 / 9)
    full, _ = _play_world(task, calls)
    assert _grade(task, full) == 1.0
    extra, _ = _play_world(task, [*calls, _call("top_up", amount=5)])
    assert _grade(task, extra) == pytest.approx((3 + 6) / (4 + 6))
    # in order: a stray call in between does not undo the calls around it, a swap loses one
    between, _ = _play_world(task, [calls[0], _call("get_balance"), calls[1]])
    assert _grade(task, between) == pytest.approx((1 + 2) / (3 + 6))
    swapped, _ = _play_world(task, [calls[1], calls[0]])
    assert _grade(task, swapped) == pytest.approx((1 + 1) / (3 + 6))


def test_world_failure_grade_ranks_failures_the_state_alone_ties():
    # looked up the right contact, then changed the wrong one, against calling nothing useful:
    # both progress 0 by state changes, the grade puts the near miss first
    task = _world_task("update_phone")
    find, update = task.reference_calls
    other = next(c for c in task.setup["state"]["contacts"] if c != update.arguments["contact_id"])
    wrong_contact = _call("update_phone", contact_id=other, phone=update.arguments["phone"])
    near, near_progress = _play_world(task, [find, wrong_contact])
    far, far_progress = _play_world(task, [_call("get_balance")])
    assert near.score == far.score == 0.0 and near_progress == far_progress == 0.0
    assert _grade(task, near) > _grade(task, far) == 0.0
    # a success by another path still grades 1.0: once the outcome is right, calls do not count
    detour, _ = _play_world(task, [_call("get_balance"), update])
    assert detour.score == 1.0 and _grade(task, detour) == 1.0


def test_world_progress_is_one_exactly_when_verified():
    for task in load_split("validation")[:40]:
        env = WorldEnvironment()
        score, _ = replay_reference(env, task)
        assert score == 1.0 and env.progress() == 1.0
        truncated, progress = _play_world(task, task.reference_calls[:-1], answer=None)
        assert truncated.score < 1.0 and progress < 1.0, task.id
        assert _grade(task, truncated) < 1.0, task.id


def test_label_counts_and_annotate():
    task = _world_task("price_check")
    trajectory, _ = _play_world(task, [], answer="?")
    bare = trajectory.model_copy(update={"diagnosis": []})
    (annotated,) = annotate([bare], {task.id: task})
    assert annotated.diagnosis == ["empty_turn_model_response"] and annotated.progress == 0.0
    assert Trajectory.model_validate_json(annotated.model_dump_json()) == annotated
    assert dx.count_labels([annotated, annotated]) == {"empty_turn_model_response": 2}
    with pytest.raises(ValueError, match="not"):
        get_environment("world").diagnose(_world_task("add_contact"), annotated)


# --------------------------------------------------------------------------- BFCL

bfcl = pytest.importorskip("bfcl_eval")


def _bfcl_task(entry_id: str) -> Task:
    from coevolve.envs.bfcl import load_tasks

    category = entry_id.rsplit("_", 1)[0]
    return next(t for t in load_tasks(category, limit=5) if t.id == entry_id)


def _play_bfcl(task: Task, turns) -> tuple[list[str], float]:
    from coevolve.envs.bfcl import BfclEnvironment

    env = BfclEnvironment()
    env.reset(task)
    for actions in turns:
        for action in actions:
            env.step(action)
        if env.end_turn("ok") is None:
            break
    labels = env.diagnose()
    trajectory = Trajectory(
        id="t", task_id=task.id, env="bfcl", family=task.family, steps=env._steps, score=0.0
    )
    assert get_environment(task.env).diagnose(task, trajectory) == (labels, env.progress())
    return labels, env.progress()


def test_bfcl_reference_passes_every_turn():
    task = _bfcl_task("multi_turn_miss_func_1")
    env_labels, progress = _play_bfcl(task, [t.reference_calls for t in task.turns])
    assert env_labels == ["pass", "correct_abstention", "pass", "pass", "pass"]
    assert progress == 1.0


def test_bfcl_every_turn_label():
    # turns: ls(a=True) | (mv held out: no call) | cd workspace, mv log.txt archive |
    #        cd archive, grep | tail(log.txt, 20)
    task = _bfcl_task("multi_turn_miss_func_1")
    labels, progress = _play_bfcl(
        task,
        [
            [_call("pwd")],  # same state, but ls's result is missing
            [_call("ls", a=True)],  # a call on a turn that needs none
            task.turns[2].reference_calls,
            [_call("launch_rocket", when="now")],  # refused before execution: no instance ran
            [],  # nothing at all
        ],
    )
    assert labels == [
        "response_mismatch",
        "spurious_tool_call",
        "pass",
        "instance_mismatch",
        "empty_turn_model_response",
    ]
    assert progress == pytest.approx(1 / 4)
    wrong_state, _ = _play_bfcl(
        task,
        [
            task.turns[0].reference_calls,
            [],
            [_call("cd", folder="workspace"), _call("mv", source="log.txt", destination="old")],
        ],
    )
    # the episode stopped after turn 2: the remaining turns count as empty
    assert wrong_state == [
        "pass",
        "correct_abstention",
        "state_mismatch",
        "empty_turn_model_response",
        "empty_turn_model_response",
    ]


def test_bfcl_excluded_labels(monkeypatch):
    task = _bfcl_task("multi_turn_base_1")
    broken = task.model_copy(deep=True)
    broken.setup["initial_config"] = {"GorillaFileSystem": {"root": "not a tree"}}
    result = dx.diagnose_bfcl(broken, [dx.ModelTurn() for _ in broken.turns])
    assert set(result.labels) == {"gt_error"} and result.progress == 0.0

    import bfcl_eval.eval_checker.multi_turn_eval.multi_turn_checker as checker

    def explode(*_args, **_kwargs):
        raise AssertionError("checker bug")

    monkeypatch.setattr(checker, "state_checker", explode)
    turns = dx.bfcl_model_turns(
        task,
        [Step(turn=0, call=c, observation={"text": "x"}) for c in task.turns[0].reference_calls],
    )
    result = dx.diagnose_bfcl(task, turns)
    assert result.labels[0] == "checker_error"
    assert result.labels[1:] == ["empty_turn_model_response"] * 3
    assert result.progress == 0.0  # checker_error leaves the denominator: 0 of 3
