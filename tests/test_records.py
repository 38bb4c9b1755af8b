"""Records survive a JSON round-trip and reject bad input; success has one definition."""

import ast
from pathlib import Path

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
    is_success,
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


def test_is_success_is_the_papers_reward_one():
    assert is_success(1.0) and is_success(1.0 - 1e-12)
    assert not is_success(0.999) and not is_success(0.0)
    assert not Verdict(success=True, reason="ok", execution_reward=0.99).vetoed_accepted
    assert Verdict(success=True, reason="ok", execution_reward=1.0).vetoed_accepted


PACKAGE_ROOT = Path(__file__).resolve().parents[1]
_COMPARISONS = (ast.Eq, ast.NotEq, ast.Lt, ast.LtE, ast.Gt, ast.GtE)


def _name(node: ast.expr) -> str:
    """The last name of an operand: ``t.score`` -> score, ``env.score()`` -> score."""
    while isinstance(node, ast.Call | ast.Subscript):
        node = node.func if isinstance(node, ast.Call) else node.value
    if isinstance(node, ast.Attribute):
        return node.attr
    return node.id if isinstance(node, ast.Name) else ""


def literal_score_comparisons(source: str) -> list[str]:
    """Comparisons of a score or reward with the literal 1 (``score >= 1.0``), as source text."""
    found = []
    for node in ast.walk(ast.parse(source)):
        if not isinstance(node, ast.Compare):
            continue
        operands = [node.left, *node.comparators]
        for op, left, right in zip(node.ops, operands, operands[1:], strict=False):
            for one, other in ((left, right), (right, left)):
                is_one = (
                    isinstance(one, ast.Constant)
                    and not isinstance(one.value, bool)
                    and one.value == 1
                )
                named = _name(other).lower()
                if (
                    is_one
                    and isinstance(op, _COMPARISONS)
                    and ("score" in named or "reward" in named)
                ):
                    found.append(ast.unparse(node))
    return found


def test_the_detector_finds_literal_score_comparisons():
    source = (
        "a = t.score >= 1.0\nb = 1 <= reward\nc = env.score() < 1\n"
        "d = active.progress(step) >= 1.0\ne = score > 0.5\nf = len(scores) > 1"
    )
    assert literal_score_comparisons(source) == ["t.score >= 1.0", "1 <= reward", "env.score() < 1"]


def test_success_is_decided_by_is_success_only():
    """Every "did it succeed" goes through records.is_success, never a literal ``>= 1.0``."""
    offenders = []
    for path in sorted(PACKAGE_ROOT.rglob("*.py")):
        parts = path.relative_to(PACKAGE_ROOT).parts
        if parts[0] in {"tests", "build", "runs"} or any(p.startswith(".") for p in parts):
            continue
        for text in literal_score_comparisons(path.read_text(encoding="utf-8")):
            offenders.append(f"{path.relative_to(PACKAGE_ROOT)}: {text}")
    assert not offenders, "use coevolve.records.is_success:\n" + "\n".join(offenders)
