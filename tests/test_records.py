"""Records survive a JSON round-trip and reject bad input."""

import pytest
from pydantic import ValidationError

from coevolve.records import (
    CandidateTask,
    Observation,
    Signal,
    Step,
    SynthesisContext,
    Task,
    ToolCall,
    Trajectory,
    Turn,
    Verdict,
)

CALL = ToolCall(
    name="find_contact", arguments={"name": "Ana", "nested": {"a": [1, 2.5, None]}}, id="call_0"
)
TASK = Task(
    id="t1",
    env="world",
    family="send_message",
    turns=[Turn(query="Text Ana hi", reference_calls=[CALL])],
    reference_answer=None,
    setup={"state": {"contacts": {"c1": {"name": "Ana"}}}},
    source="synthesized",
    parent_task_id="t0",
    signal="rare",
    cycle=2,
)
RECORDS = [
    CALL,
    Observation(text="error: nope", error="not_found"),
    TASK,
    Step(turn=0, call=CALL, raw='find_contact(name="Ana")', observation=Observation(text="id=c1")),
    Trajectory(
        id="tr1",
        task_id="t1",
        env="world",
        family="send_message",
        messages=[{"role": "user", "content": "hi"}],
        steps=[
            Step(
                call=None, raw="garbage", observation=Observation(text="error", error="parse_error")
            )
        ],
        final_answer="done",
        score=0.5,
        prompt_tokens=10,
        completion_tokens=5,
        policy_version="cycle-1",
    ),
    Signal(
        kind="boundary",
        trajectory_id="tr1",
        task_id="t1",
        family="send_message",
        evidence={"scores": [1, 0]},
    ),
    SynthesisContext(summary="s", failure_cause="c", focus_patterns=["find_contact>send_message"]),
    CandidateTask(description="d", query="q", minimal_actions=[CALL], signal="forgetting"),
    Verdict(success=False, reason="wrong id", execution_reward=1.0),
]


@pytest.mark.parametrize("record", RECORDS, ids=lambda r: type(r).__name__)
def test_json_round_trip(record):
    assert type(record).model_validate_json(record.model_dump_json()) == record


def test_task_helpers():
    assert TASK.instruction == "Text Ana hi"
    assert TASK.reference_calls == [CALL]


def test_verdict_acceptance_rule():
    assert Verdict(success=True, reason="ok").accepted
    assert Verdict(
        success=False, reason="judge said no, env rewarded", execution_reward=1.0
    ).accepted
    assert not Verdict(success=False, reason="no", execution_reward=0.0).accepted


def test_bad_records_are_rejected():
    with pytest.raises(ValidationError):
        Signal(kind="surprise", trajectory_id="x", task_id="t", family="f")
    with pytest.raises(ValidationError):
        Trajectory(id="x", task_id="t", env="world", family="f", score=1.5)
    with pytest.raises(ValidationError):
        Task(id="x", env="world", family="f", turns=[])
    with pytest.raises(ValidationError):
        ToolCall(name="x", arguments={}, surprise=1)
