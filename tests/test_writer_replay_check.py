"""bench/writer_replay_check.py: a compose unit's accepted tasks written again, clause by
clause, by a served writer (here the tests' scripted server over real HTTP), and compared
with what the unit's writer wrote."""

import re

import pytest

from coevolve.agents.config import EndpointConfig
from coevolve.agents.roles.clause_writer import join_clauses
from coevolve.agents.roles.llm import chat_model
from coevolve.bench.writer_replay_check import rewrite
from coevolve.envs.world import load_split
from coevolve.records import ToolCall
from coevolve.testing.openai_server import Reply, ScriptedOpenAIServer


def clause_of(body: dict) -> Reply:
    """A clause naming the call the material ends with, and the result it read before it."""
    material = body["messages"][-1]["content"]
    name = re.search(r"^1\. (\w+)\(", material.splitlines()[-1]).group(1)
    earlier = "with what it showed " if "Earlier result:" in material else ""
    return Reply.text(f"Request: do {name} {earlier}now.")


def test_a_rewritten_request_is_the_same_or_differs_and_a_cycle_2_parent_is_found():
    seed = next(t for t in load_split("train") if t.family == "save_message_note")
    calls = [{"name": c.name, "arguments": c.arguments} for c in seed.reference_calls]
    expected = join_clauses(
        [
            "do find_contact now.",
            "do read_messages with what it showed now.",  # contact_id is in find_contact's result
            "do create_note with what it showed now.",  # the note's body is in the messages
        ],
        [ToolCall(**call) for call in calls],
    )
    first = {
        "id": "syn-c1-a",
        "cycle": 1,
        "parent_task_id": seed.id,
        "requests": [expected],
        "calls": calls,
    }
    # Its child, composed in the same state; its unit wrote another last clause.
    second = {
        **first,
        "id": "syn-c2-b",
        "cycle": 2,
        "parent_task_id": "syn-c1-a",
        "requests": [expected.replace("do create_note", "write a note")],
    }
    with ScriptedOpenAIServer(clause_of) as server:
        model = chat_model(
            EndpointConfig(base_url=server.base_url, model=server.model, temperature=0.0)
        )
        rows = list(rewrite([first, second], model))
        assert len(server.chat_bodies()) == 6  # one request a clause
    assert [row.same for row in rows] == [True, False]
    assert rows[0].now == expected
    assert (rows[1].clauses, rows[1].same_clauses) == (3, 2)


def test_a_task_whose_parent_is_not_found_is_an_error():
    record = {
        "id": "syn-c2-x",
        "cycle": 2,
        "parent_task_id": "syn-c1-gone",
        "requests": ["Do it."],
        "calls": [],
    }
    with pytest.raises(ValueError, match="syn-c1-gone"):
        list(rewrite([record], model=None))
