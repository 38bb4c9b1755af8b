"""Curation's self-reference rule (agents/roles/judge.py, ``self_reference``): a question task whose
answer is the request's own value read back, or does not answer the request, is rejected
with its reason; no seed task of the world or of the support desk is."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from coevolve.agents.roles.judge import ExecutableJudge, self_reference
from coevolve.agents.roles.role_interfaces import candidate_setup
from coevolve.envs import FunctionEnvironment
from coevolve.envs.catalog import load_tasks
from coevolve.envs.registry import get_environment
from coevolve.envs.world import WorldEnvironment
from coevolve.records import CandidateTask, Task, ToolCall

ROOT = Path(__file__).resolve().parents[1]
EXAMPLE = "examples.support_desk.env:make_env"


@pytest.fixture(autouse=True)
def _from_the_repository_root(monkeypatch):
    monkeypatch.chdir(ROOT)  # the example's import path is relative to it


class Library:
    """Books and the members who borrow them (the issue's environment, cut down)."""

    def __init__(self, members: dict, books: dict) -> None:
        self.members = members
        self.books = books

    def find_member(self, email: str) -> str:
        """Find a member by email address.

        Args:
            email: The member's email address.
        """
        for member_id, member in self.members.items():
            if member["email"] == email.lower():
                return f"member_id={member_id} name={member['name']} loans={member['loans']}"
        return "no member"


def judged(candidate: CandidateTask, make_env) -> tuple[bool, str]:
    verdict = asyncio.run(ExecutableJudge().judge(candidate, make_env))
    return verdict.accepted, verdict.reason


def question(query: str, call: ToolCall, answer: str, setup: dict) -> CandidateTask:
    return CandidateTask(
        description="a look-up", query=query, minimal_actions=[call], reference_answer=answer,
        setup=setup,
    )  # fmt: skip


def test_the_task_the_writer_accepted_on_a_library_is_rejected_with_its_reason():
    setup = {
        "state": {
            "members": {"M-7": {"email": "cleo.park@mail.com", "name": "Cleo", "loans": 0}},
            "books": {"B-1": {"title": "Dune", "copies": 2}},
        }
    }
    call = ToolCall(name="find_member", arguments={"email": "Cleo.Park@mail.com"})
    library = lambda: FunctionEnvironment(Library)  # noqa: E731
    written = "I'm Cleo.Park@mail.com. How many copies of Cleo.Park@mail.com are available?"
    accepted, reason = judged(question(written, call, "0", setup), library)
    assert not accepted
    assert reason == (
        "self-referential: the request names 'Cleo.Park@mail.com' twice, as the value it "
        "gives and as what it asks about"
    )
    # The same call asked a real question is a look-up, and stays.
    asked = "How many loans does Cleo.Park@mail.com have?"
    assert judged(question(asked, call, "0", setup), library) == (
        True,
        "replayed 1 call(s) without errors; verifier score 1.00",
    )


def test_an_answer_read_back_or_off_the_question_is_rejected():
    desk = get_environment(EXAMPLE)
    seed = next(t for t in desk.load_tasks("all", "", 0) if t.family == "plan_lookup")
    call = seed.reference_calls[0]
    email = call.arguments["email"]
    setup = candidate_setup(seed.setup)
    accepted, reason = judged(question(f"What plan does {email} have?", call, email, setup),
                              desk.environment)  # fmt: skip
    assert not accepted
    assert reason == f"self-referential: the answer {email!r} is a value the request itself gives"
    plan = seed.reference_answer
    accepted, reason = judged(
        question(f"How many orders has {email} made?", call, plan, setup), desk.environment
    )
    assert not accepted and reason == (
        f"self-referential: the answer {plan!r} does not answer the request, which asks how "
        "many or how much"
    )


def test_a_lookup_of_a_new_value_is_no_self_reference():
    task = next(t for t in load_tasks("world", split="train") if t.family == "phone_lookup")
    name = task.reference_calls[0].arguments["name"]
    candidate = question(
        f"What is {name}'s phone number?",
        task.reference_calls[0],
        task.reference_answer,
        candidate_setup(task.setup),
    )
    assert self_reference(candidate) is None
    assert judged(candidate, WorldEnvironment)[0]


def as_candidate(task: Task) -> CandidateTask:
    return CandidateTask(
        description=task.family,
        query=" ".join(turn.query for turn in task.turns),
        minimal_actions=task.reference_calls,
        reference_answer=task.reference_answer,
        setup=candidate_setup(task.setup),
    )


@pytest.mark.parametrize(("env", "split"), [("world", "train"), (EXAMPLE, "all")])
def test_no_seed_task_is_self_referential(env, split):
    tasks = load_tasks(env, split=split)
    assert len(tasks) == {"world": 1000, EXAMPLE: 56}[env]
    assert [t.id for t in tasks if self_reference(as_candidate(t)) is not None] == []
    questions = [t for t in tasks if t.reference_answer is not None]
    assert questions  # and the judge accepts every question seed as a candidate
    make_env = get_environment(env).environment
    verdicts = {t.id: judged(as_candidate(t), make_env) for t in questions}
    assert {task_id: reason for task_id, (ok, reason) in verdicts.items() if not ok} == {}
