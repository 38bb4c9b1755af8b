"""Errors that stay errors: a bug in our code propagates, a bad call or task becomes data,
and a batch in which every item raised raises instead of reporting zero."""

from __future__ import annotations

import httpx
import pytest

from coevolve.common.errors import PROGRAMMING_ERRORS
from coevolve.envs.base import check_references
from coevolve.envs.world import WorldEnvironment, load_split
from coevolve.records import Task, ToolCall, Trajectory
from coevolve.training.datasets import ReplayError, demonstrations_by_task
from coevolve.training.hard_negatives.pairs import expert_conversations, with_failure_grades


def world_task() -> Task:
    return load_split("validation")[0]


def stateless(task: Task) -> Task:
    """A task the world cannot start: reset() raises ValueError (no setup['state'])."""
    return task.model_copy(update={"id": f"{task.id}-stateless", "setup": {}})


class BuggyWorldEnvironment(WorldEnvironment):
    """The world with a bug in its own tool code (a str added to an int)."""

    def _execute(self, call: ToolCall) -> str:
        return self.world.run(call.name, dict(call.arguments)) + len(call.name)  # type: ignore[operator, union-attr]


def test_programming_errors_are_the_bug_types():
    assert set(PROGRAMMING_ERRORS) == {
        TypeError,
        AttributeError,
        NameError,
        AssertionError,
        NotImplementedError,
    }


# --------------------------------------------------------------------------- tool calls


def test_a_bug_in_our_tool_code_propagates_instead_of_becoming_an_observation():
    env = BuggyWorldEnvironment()
    env.reset(world_task())
    with pytest.raises(TypeError):
        env.step(ToolCall(name="list_contacts", arguments={}))


def test_bad_model_arguments_still_become_error_observations():
    env = WorldEnvironment()
    env.reset(world_task())
    before = repr(env.world.state)  # type: ignore[union-attr]
    cases: dict[str, ToolCall | str] = {
        "bad_arguments": ToolCall(name="top_up", arguments={"amount": "ten"}),
        "unknown_tool": ToolCall(name="top_upp", arguments={"amount": 10}),
        "invalid_value": ToolCall(name="top_up", arguments={"amount": 10_000}),
        "not_found": ToolCall(name="delete_note", arguments={"note_id": "n999"}),
        "bad_json": "<tool_call>{not json</tool_call>",
    }
    for kind, action in cases.items():
        observation = env.step(action)
        assert observation.error == kind, (kind, observation)
        assert observation.text.startswith("error: ")
    assert repr(env.world.state) == before  # type: ignore[union-attr]


def test_bfcl_tool_code_failing_on_model_arguments_is_an_observation():
    pytest.importorskip("bfcl_eval")
    from coevolve.envs.bfcl import BfclEnvironment, load_tasks

    task = next(t for t in load_tasks("multi_turn_base", limit=16) if t.id.endswith("_15"))
    env = BfclEnvironment()
    env.reset(task)
    # Schema-valid arguments that BFCL's MathAPI rejects with a ValueError of its own.
    observation = env.step(ToolCall(name="square_root", arguments={"number": 0.0, "precision": 0}))
    assert observation.error == "tool_error"
    assert observation.text.startswith("error: square_root failed: ValueError: ")


# --------------------------------------------------------------------------- reference replays


def test_check_references_reports_a_task_the_environment_cannot_run():
    good = world_task()
    report = check_references(WorldEnvironment, [good, stateless(good)], "world", {})
    assert (report.verified, report.total) == (1, 2)
    assert report.failures[0]["task"] == f"{good.id}-stateless"
    assert report.failures[0]["error"].startswith("ValueError: ")


def test_check_references_lets_a_bug_propagate():
    with pytest.raises(TypeError):
        check_references(BuggyWorldEnvironment, [world_task()], "world", {})


def test_demonstrations_leave_out_a_broken_task_but_raise_when_every_one_is_broken():
    good = world_task()
    kept = demonstrations_by_task([good, stateless(good)], WorldEnvironment)
    assert [task.id for task, _ in kept] == [good.id]
    with pytest.raises(ReplayError, match="every one of the 2 reference replays raised"):
        demonstrations_by_task([stateless(good), stateless(good)], WorldEnvironment)
    assert demonstrations_by_task([], WorldEnvironment) == []


def test_experts_raise_when_every_reference_replay_raises():
    good = world_task()
    assert list(expert_conversations([good, stateless(good)], WorldEnvironment, None)) == [good.id]
    with pytest.raises(ReplayError, match="every one of the 1 reference replays raised"):
        expert_conversations([stateless(good)], WorldEnvironment, None)


def test_progress_raises_when_every_diagnosis_raises():
    broken = stateless(world_task())
    trajectory = Trajectory(
        id="t/c0/r0",
        task_id=broken.id,
        env="world",
        family=broken.family,
        messages=[],
        steps=[],
        score=0.0,
    )
    with pytest.raises(ReplayError, match="every one of the 1 failure grades raised"):
        with_failure_grades([trajectory], {broken.id: broken})
    # A trajectory whose task is unknown is not tried, so nothing failed.
    assert with_failure_grades([trajectory], {})[0].failure_grade is None


# --------------------------------------------------------------------------- the test server


def test_a_bug_in_a_script_callable_answers_500_and_stop_raises_it(scripted_server):
    def script(body):
        assert body["model"] == "another-model", "the test's own check failed"

    server = scripted_server(script)
    payload = {"model": server.model, "messages": [{"role": "user", "content": "hi"}]}
    response = httpx.post(f"{server.base_url}/chat/completions", json=payload, timeout=5.0)
    assert response.status_code == 500
    assert "AssertionError" in response.json()["error"]["message"]
    with pytest.raises(AssertionError, match="the test's own check failed"):
        server.stop()
    server.stop()  # stopped and reported once: teardown stops it again quietly


# --------------------------------------------------------------------------- trackers


def test_a_tracker_failing_is_logged_but_a_bug_in_our_logger_propagates(
    tmp_path, monkeypatch, caplog
):
    from types import SimpleNamespace

    from coevolve.outputs import tracking
    from coevolve.outputs.summary import CycleSummary, EvaluationFigures

    config = SimpleNamespace(tracking=tracking.TrackingConfig(report_to=["tensorboard"]))
    figures = EvaluationFigures(success=0.5, tool_sequence=0.5, calls=0.5, episodes=2, time_s=1.0)
    summary = CycleSummary(cycle=1, evaluate=figures)

    def unreachable(*args):
        raise ConnectionError("tracking server unreachable")

    monkeypatch.setitem(tracking._LOGGERS, "tensorboard", unreachable)
    tracking.log_cycle(config, tmp_path, summary)
    assert "tracking server unreachable" in caplog.text

    def buggy(*args):
        raise TypeError("log_metrics() got an unexpected keyword argument 'stepp'")

    monkeypatch.setitem(tracking._LOGGERS, "tensorboard", buggy)
    with pytest.raises(TypeError, match="stepp"):
        tracking.log_cycle(config, tmp_path, summary)


def test_every_known_error_names_a_class_that_exists() -> None:
    # The names are strings (their modules are heavy): a moved module must fail here.
    import importlib

    from coevolve.common.errors import KNOWN_ERRORS

    for module, name in KNOWN_ERRORS:
        error_class = getattr(importlib.import_module(f"coevolve.{module}"), name)
        assert isinstance(error_class, type) and issubclass(error_class, Exception)
