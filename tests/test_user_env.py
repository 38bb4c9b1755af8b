"""Environments users bring: tools as typed Python, tasks as JSONL, found by import path or
entry point, checked by replay, and trained through the loop (the support desk example)."""

from __future__ import annotations

import dataclasses
import importlib.metadata
import json
import re
import textwrap
import uuid
from pathlib import Path
from typing import Literal

import pytest
from pydantic import BaseModel
from typer.testing import CliRunner

from coevolve.cli import app
from coevolve.config import ConfigError, load_config
from coevolve.envs import FunctionEnvironment, ToolError, function_schema
from coevolve.envs.registry import ENVIRONMENTS, get_environment
from coevolve.envs.task_file import assign_splits, read_task_file
from coevolve.records import Observation, Step, ToolCall, Trajectory

ROOT = Path(__file__).resolve().parents[1]
EXAMPLE = "examples.support_desk.env:make_env"
EXAMPLE_TASKS = ROOT / "examples" / "support_desk" / "tasks.jsonl"


@pytest.fixture(autouse=True)
def _from_the_repository_root(monkeypatch):
    monkeypatch.chdir(ROOT)  # the example's import path is relative to it, as in the docs


def write_module(tmp_path: Path, monkeypatch, source: str) -> str:
    """A module of the user's in a directory on sys.path; its (unique) name."""
    name = f"user_tools_{uuid.uuid4().hex[:8]}"
    (tmp_path / f"{name}.py").write_text(textwrap.dedent(source))
    monkeypatch.syspath_prepend(str(tmp_path))
    return name


BANK = """
    from pathlib import Path
    from coevolve.envs import FunctionEnvironment, ToolError

    def balance(state: dict, account: str) -> str:
        \"\"\"The balance of an account.

        Args:
            account: The account's id.
        \"\"\"
        if account not in state["accounts"]:
            raise ToolError("not_found", f"no account {account}")
        return f"balance={state['accounts'][account]}"

    def transfer(state: dict, source: str, target: str, amount: int) -> str:
        \"\"\"Move money between accounts.

        Args:
            source: The account paying.
            target: The account paid.
            amount: How much.
        \"\"\"
        if state["accounts"][source] < amount:  # a KeyError for an unknown account: a bug
            raise ToolError("insufficient_funds", f"{source} has too little")
        state["accounts"][source] -= amount
        state["accounts"][target] += amount
        return f"moved {amount}"

    def make_env():
        return FunctionEnvironment([balance, transfer], tasks=Path(__file__).with_name("bank.jsonl"),
                                   name="bank")
"""

STATE = {"accounts": {"a": 50, "b": 5}}


def bank_line(task_id: str, calls: list[dict], **extra) -> str:
    line = {"id": task_id, "family": "transfer", "state": STATE, "user": "Pay b 20 from a."}
    return json.dumps({**line, "calls": calls, **extra})


GOOD_CALL = {"name": "transfer", "arguments": {"source": "a", "target": "b", "amount": 20}}


# --------------------------------------------------------------------------- schemas


def test_schemas_come_from_signatures_and_docstrings():
    def book(state: dict, room: str, seats: int, kind: Literal["desk", "hall"] = "desk",
             note: str | None = None, tags: list[str] | None = None) -> str:  # fmt: skip
        """Book a room.

        Some more words.

        Args:
            room: The room's name.
            seats: How many seats,
                at least one.
        """
        return "ok"

    schema = function_schema(book, skip=("state",))["function"]
    assert schema["name"] == "book" and schema["description"] == "Book a room. Some more words."
    parameters = schema["parameters"]
    assert parameters["required"] == ["room", "seats"]
    assert parameters["properties"]["room"] == {"type": "string", "description": "The room's name."}
    assert parameters["properties"]["seats"]["description"] == "How many seats, at least one."
    assert parameters["properties"]["kind"]["enum"] == ["desk", "hall"]
    assert parameters["properties"]["note"] == {"type": ["string", "null"]}
    assert parameters["properties"]["tags"]["items"] == {"type": "string"}

    def untyped(state: dict, room) -> str:
        return "ok"

    with pytest.raises(ValueError, match="tool untyped: argument 'room' has no type hint"):
        function_schema(untyped, skip=("state",))


def test_a_state_class_is_reset_stepped_and_verified():
    class Counter:
        """A counter."""

        def __init__(self, value: int) -> None:
            self.value = value

        def add(self, amount: int) -> str:
            """Add to the counter.

            Args:
                amount: How much.
            """
            if amount < 0:
                raise ToolError("invalid_value", "amounts are positive")
            self.value += amount
            return f"value={self.value}"

        def crash(self) -> str:
            """A tool with a bug."""
            raise KeyError("oops")

    env = FunctionEnvironment(Counter)
    assert [tool["function"]["name"] for tool in env.tools()] == ["add", "crash"]
    task = read_task_file_from_lines(
        [json.dumps({"id": "t", "state": {"value": 1}, "user": "Add 2.",
                     "calls": [{"name": "add", "arguments": {"amount": 2}}], "answer": "3"})]
    ).tasks[0]  # fmt: skip
    assert env.reset(task) == "Add 2."
    assert env.step(ToolCall(name="add", arguments={"amount": -1})).error == "invalid_value"
    assert env.step(ToolCall(name="crash")).error == "tool_failed"  # never raised out of step
    assert env.step('add(amount="x")').error == "bad_arguments"
    assert env.step("add(amount=2)") == Observation(text="value=3")
    assert env.end_turn("it is 3 now") is None
    assert env.score() == 1.0 and env.current_state() == {"value": 3}
    env.reset(task)
    env.step("add(amount=1)")
    env.end_turn("3")
    assert env.score() == 0.0


class Stock(BaseModel):
    """A pydantic state: its own methods are the tools, not model_dump and the like."""

    items: dict[str, int]

    def take(self, item: str) -> str:
        """Take one of an item.

        Args:
            item: The item's name.
        """
        self.items[item] -= 1
        return f"{item}={self.items[item]}"


@dataclasses.dataclass
class StockRecord:
    """The same state as a dataclass."""

    items: dict[str, int] = dataclasses.field(default_factory=dict)

    def take(self, item: str) -> str:
        """Take one of an item.

        Args:
            item: The item's name.
        """
        self.items[item] -= 1
        return f"{item}={self.items[item]}"


@pytest.mark.parametrize("state_class", [Stock, StockRecord])
def test_pydantic_and_dataclass_states(state_class):
    env = FunctionEnvironment(state_class)
    assert [tool["function"]["name"] for tool in env.tools()] == ["take"]
    line = {"id": "s", "state": {"items": {"pen": 2}}, "user": "Take a pen.",
            "calls": [{"name": "take", "arguments": {"item": "pen"}}]}  # fmt: skip
    task = read_task_file_from_lines([json.dumps(line)]).tasks[0]
    env.reset(task)
    assert env.step('take(item="pen")').text == "pen=1"
    env.end_turn(None)
    assert env.current_state() == {"items": {"pen": 1}} and env.score() == 1.0


def read_task_file_from_lines(lines: list[str], tmp: Path | None = None):
    path = (tmp or Path(f"/tmp/coevolve-tasks-{uuid.uuid4().hex}")).with_suffix(".jsonl")
    path.write_text("\n".join(lines) + "\n")
    return read_task_file(path, "test-env")


# --------------------------------------------------------------------------- the example


def test_the_example_is_found_by_import_path_and_derives_its_spec():
    assert EXAMPLE not in ENVIRONMENTS  # nothing in the package names it
    spec = get_environment(EXAMPLE)
    assert spec.name == EXAMPLE and spec.title == "support desk"
    assert spec.max_tool_calls == 6  # twice the longest reference turn (3 calls)
    assert spec.environment().name == EXAMPLE  # tasks and synthesized tasks find it again
    inventory = spec.inventory()
    assert inventory["task_sets"] == {"train": 33, "validation": 10, "heldout": 13}
    assert inventory["tools"] == 7 and inventory["families"] == 7
    train, heldout = spec.load_tasks("train", "", 0), spec.load_tasks("heldout", "", 0)
    assert {t.family for t in train} == {t.family for t in heldout}  # every family in both
    assert not {t.id for t in train} & {t.id for t in heldout}
    assert [t.id for t in spec.load_tasks("heldout", "", 0)] == [t.id for t in heldout]
    assert [t.id for t in spec.load_tasks("heldout", "", 1)] != [t.id for t in heldout]
    multi_call = [t for t in train if len(t.reference_calls) >= 2]
    assert len(multi_call) >= 10 and any(len(t.turns) == 2 for t in train)
    config = load_config({"env": {"name": EXAMPLE}})
    assert config.env.name == EXAMPLE


def test_env_check_passes_on_the_example_and_names_a_broken_task(tmp_path, monkeypatch):
    result = CliRunner().invoke(app, ["env", "check", EXAMPLE])
    assert result.exit_code == 0, result.output
    assert "verified 33/33" in result.output and "verified 13/13" in result.output

    lines = EXAMPLE_TASKS.read_text().splitlines()
    broken = json.loads(lines[9])
    broken["turns"][0]["calls"][-1]["arguments"]["customer_id"] = "C-000"
    lines[9] = json.dumps(broken)
    (tmp_path / "tasks.jsonl").write_text("\n".join(lines) + "\n")
    name = write_module(tmp_path, monkeypatch, """
        from pathlib import Path
        from examples.support_desk.env import SupportDesk
        from coevolve.envs import FunctionEnvironment

        def make_env():
            return FunctionEnvironment(SupportDesk, tasks=Path(__file__).with_name("tasks.jsonl"))
    """)  # fmt: skip
    result = CliRunner().invoke(app, ["env", "check", f"{name}:make_env"])
    assert result.exit_code == 2
    assert f"tasks.jsonl line 10 (task {broken['id']}): reference" in result.output
    assert "1 task(s) cannot be used" in result.output
    # and a run refuses it, naming the task
    with pytest.raises(ConfigError, match=rf"line 10 \(task {broken['id']}\)"):
        load_config({"env": {"name": f"{name}:make_env"}})


# --------------------------------------------------------------------------- bad input


def test_each_bad_line_gets_one_line_and_the_rest_load(tmp_path, monkeypatch):
    lines = [
        bank_line("good-1", [GOOD_CALL]),
        '{"id": "torn", "user": "Pay b", ',  # malformed JSON
        bank_line("unknown-tool", [{"name": "wire", "arguments": {"to": "b"}}]),
        bank_line("wrong-args", [{"name": "transfer", "arguments": {"source": "a", "amount": "20"}}]),
        bank_line("tool-crash", [{"name": "transfer", "arguments": {**GOOD_CALL["arguments"], "target": "zz"}}]),
        json.dumps({"id": "no-turns", "state": STATE}),
        bank_line("good-2", [GOOD_CALL], answer="moved"),
    ]  # fmt: skip
    (tmp_path / "bank.jsonl").write_text("\n".join(lines) + "\n")
    name = f"{write_module(tmp_path, monkeypatch, BANK)}:make_env"
    spec = get_environment(name)
    assert [t.id for t in spec.load_task_set("train")] != []
    from coevolve.envs.user_env import find_user_environment

    found = find_user_environment(name)
    assert found is not None
    assert {t.id for t in found.good_tasks} == {"good-1", "good-2"}
    problems = [str(problem) for problem in found.problems]
    assert problems == [
        "bank.jsonl line 2 (task torn): not valid JSON: Expecting property name enclosed in "
        "double quotes at column 33",
        'bank.jsonl line 3 (task unknown-tool): reference call 1 wire(to="b") is refused: '
        "unknown tool 'wire'; 2 tools are available",
        'bank.jsonl line 4 (task wrong-args): reference call 1 transfer(source="a", amount="20") '
        "is refused: transfer: missing required argument 'target'",
        'bank.jsonl line 5 (task tool-crash): reference call 1 transfer(source="a", target="zz", '
        "amount=20): transfer raised KeyError: 'zz' (not a ToolError)",
        "bank.jsonl line 6 (task no-turns): turns: Field required",
    ]
    assert all("\n" not in problem for problem in problems)
    result = CliRunner().invoke(app, ["env", "check", name])
    assert result.exit_code == 2
    for problem in problems:
        assert f"problem {problem}\n" in result.output  # one line each, its text as it is
    with pytest.raises(
        ConfigError, match=r"5 of the tasks in .* cannot be used: bank.jsonl line 2"
    ):
        load_config({"env": {"name": name}})


def bank_env(tmp_path: Path, monkeypatch, lines: list[str]) -> str:
    """The BANK tools with these task lines as their file; the environment's import path."""
    (tmp_path / "bank.jsonl").write_text("\n".join(lines) + "\n")
    return f"{write_module(tmp_path, monkeypatch, BANK)}:make_env"


def test_a_duplicate_id_is_one_problem_naming_both_lines_and_the_first_task_stays(
    tmp_path, monkeypatch
):
    from coevolve.envs.user_env import find_user_environment

    first = bank_line("pay", [GOOD_CALL])
    second = bank_line("pay", [{"name": "balance", "arguments": {"account": "a"}}])
    name = bank_env(tmp_path, monkeypatch, [first, bank_line("other", [GOOD_CALL]), second])
    found = find_user_environment(name)
    assert found is not None
    assert [str(problem) for problem in found.problems] == [
        "bank.jsonl line 3 (task pay): duplicate id: lines 1 and 3 both have it; line 1's "
        "task is used, give this one an id of its own"
    ]
    [kept] = [task for task in found.good_tasks if task.id == "pay"]
    assert kept.reference_calls[0].name == "transfer"  # line 1's, not line 3's
    assert {task.id for task in found.good_tasks} == {"pay", "other"}


def test_an_empty_task_file_or_split_stops_every_command(tmp_path, monkeypatch):
    """Nothing runs on zero tasks: env check, eval, run and the Python API refuse a file
    with no task (blank lines only) and a split with none, in one line naming both."""
    import coevolve

    name = bank_env(tmp_path, monkeypatch, ["", "   ", ""])
    result = CliRunner().invoke(app, ["env", "check", name])
    assert result.exit_code == 2  # a refused task file: as run and eval refuse it
    assert (
        f"problem environment {name}: splits train, validation, heldout have no task in "
        f"{tmp_path}/bank.jsonl: the file holds no task (a task is one JSON object a line)\n"
    ) in result.output
    result = CliRunner().invoke(app, ["eval", "--env", name, "--policy", "oracle"])
    assert result.exit_code == 2
    assert result.stderr.startswith(f"error: environment {name}: split heldout has no task in")
    assert result.stderr.count("\n") == 1
    with pytest.raises(ConfigError, match=r"splits train, heldout have no task in .*bank\.jsonl"):
        coevolve.run({"env": {"name": name}, "run_dir": str(tmp_path / "run")})
    config = tmp_path / "run.yaml"
    config.write_text(f"env: {{name: '{name}'}}\nrun_dir: {tmp_path / 'run'}\n")
    result = CliRunner().invoke(app, ["run", str(config)])
    assert result.exit_code != 0 and not (tmp_path / "run").exists()
    assert f"splits train, heldout have no task in {tmp_path}/bank.jsonl" in result.output

    # Two tasks whose ids both fall in train, so the held-out split a run evaluates is empty.
    (tmp_path / "two").mkdir()
    lines = [bank_line(task_id, [GOOD_CALL]) for task_id in ("t0", "t3")]
    two = bank_env(tmp_path / "two", monkeypatch, lines)
    message = (
        f"environment {two}: split heldout has no task in {tmp_path}/two/bank.jsonl: its 2 usable "
        "tasks are all in train (2). A line that names no split goes to heldout or validation "
        "with a chance of a quarter each, by its id and env.seed; name the split on a line "
        '("split": "heldout")'
    )
    with pytest.raises(ConfigError) as caught:
        load_config({"env": {"name": two}})
    assert str(caught.value) == f"config: {message}"
    result = CliRunner().invoke(app, ["eval", "--env", two, "--policy", "oracle"])
    assert result.exit_code == 2 and result.stderr == f"error: {message}\n"
    result = CliRunner().invoke(app, ["env", "check", two, "--split", "train"])
    assert result.exit_code == 0 and "verified 2/2" in result.output


def test_a_reference_answer_no_observation_shows_is_refused(tmp_path, monkeypatch):
    """The judge's rule for synthesized tasks (agents/roles/judge.py) holds for the task file:
    an answer the reference replay never shows would teach an agent to make it up."""
    balance = {"name": "balance", "arguments": {"account": "a"}}
    name = bank_env(
        tmp_path,
        monkeypatch,
        [
            bank_line("shown", [balance], answer="50"),
            bank_line("made-up", [balance], answer="99"),
        ],
    )
    result = CliRunner().invoke(app, ["env", "check", name])
    assert result.exit_code == 2
    assert (
        "problem bank.jsonl line 2 (task made-up): the expected answer '99' appears in no "
        "observation of the reference replay, so an agent could only make it up\n"
    ) in result.output
    with pytest.raises(ConfigError, match=r"line 2 \(task made-up\): the expected answer"):
        load_config({"env": {"name": name}})
    # The example (its plan_lookup and order_status tasks ask questions) loads whole.
    from coevolve.envs.user_env import find_user_environment

    example = find_user_environment(EXAMPLE)
    assert example is not None and not example.problems
    assert sum(task.reference_answer is not None for task in example.good_tasks) == 16


def test_unknown_fields_are_named_at_once_with_the_nearest_known_field():
    lines = [
        json.dumps({"id": "typos", "famliy": "transfer", "state": STATE, "user": "Pay b.",
                    "calls": [{"nme": "transfer", "arguments": GOOD_CALL["arguments"]}],
                    "anwser": "moved"}),
        json.dumps({"id": "turns-typo", "state": STATE,
                    "tunrs": [{"user": "Pay b.", "calls": [GOOD_CALL]}], "colour": "red"}),
    ]  # fmt: skip
    problems = [str(problem) for problem in read_task_file_from_lines(lines).problems]
    assert [problem.split(": ", 1)[1] for problem in problems] == [
        "unknown field 'famliy' (did you mean 'family'?); unknown field 'anwser' (did you "
        "mean 'answer'?); unknown field 'nme' in calls[0] (did you mean 'name'?)",
        "unknown field 'tunrs' (did you mean 'turns'?); unknown field 'colour' (known: id, "
        "family, split, state, turns, user, calls, answer)",
    ]


def test_commands_that_load_tasks_say_on_stderr_what_they_skipped(tmp_path, monkeypatch):
    bad = [bank_line(f"crash-{i}", [{"name": "transfer", "arguments": {**GOOD_CALL["arguments"], "target": "zz"}}]) for i in range(5)]  # fmt: skip
    good = [bank_line(f"good-{i}", [GOOD_CALL]) for i in range(8)]
    name = bank_env(tmp_path, monkeypatch, [*good, *bad])
    for command in (
        ["env", "show", name],
        ["eval", "--env", name, "--policy", "oracle"],
        ["env", "list", name],
    ):
        result = CliRunner().invoke(app, command)
        assert result.exit_code == 0, (command, result.output)
        lines = result.stderr.splitlines()
        assert lines[0] == f"skipped 5 of the 13 task lines of {tmp_path}/bank.jsonl:", command
        assert lines[1].startswith("  bank.jsonl line 9 (task crash-0): reference call 1")
        assert [line.split(" (task")[0] for line in lines[2:4]] == [
            "  bank.jsonl line 10",
            "  bank.jsonl line 11",
        ]
        assert lines[4:] == [f"  and 2 more; coevolve env check {name} lists them all"]
        assert "crash" not in result.stdout


def test_an_import_path_that_does_not_resolve_is_one_line(tmp_path, monkeypatch):
    for name, message in [
        ("no_such_module_xyz:make_env", "cannot import module 'no_such_module_xyz'"),
        ("examples.support_desk.env:make_envv", "has no 'make_envv'"),
        (
            "examples.support_desk.env:__name__",
            "is a str, not a callable that makes an environment",
        ),
    ]:
        with pytest.raises(ConfigError, match=message) as caught:
            load_config({"env": {"name": name}})
        assert "\n" not in str(caught.value)
    broken = write_module(tmp_path, monkeypatch, "def make_env(:\n    pass\n")
    with pytest.raises(ConfigError, match=f"importing module '{broken}' raised SyntaxError"):
        load_config({"env": {"name": f"{broken}:make_env"}})
    result = CliRunner().invoke(app, ["env", "check", "no_such_module_xyz:make_env"])
    assert result.exit_code == 2 and "cannot import module 'no_such_module_xyz'" in result.output


def test_a_module_of_tools_with_env_tasks(tmp_path, monkeypatch):
    module = write_module(tmp_path, monkeypatch, BANK)
    (tmp_path / "mine.jsonl").write_text(
        "\n".join(bank_line(f"t{i}", [GOOD_CALL]) for i in range(8)) + "\n"
    )
    config = load_config({"env": {"name": module, "tasks": str(tmp_path / "mine.jsonl")}})
    spec = get_environment(config.env.name)
    env = spec.environment()
    assert [tool["function"]["name"] for tool in env.tools()] == ["balance", "transfer"]
    assert env.name == module and len(spec.load_tasks("train", "", 0)) == 6
    result = CliRunner().invoke(
        app, ["env", "check", module, "--tasks", str(tmp_path / "mine.jsonl"), "--split", "train"]
    )
    assert result.exit_code == 0 and "verified 6/6" in result.output, result.output


def test_an_entry_point_names_an_environment(monkeypatch):
    entry = importlib.metadata.EntryPoint(
        name="desk-ep", value=EXAMPLE, group="coevolve.environments"
    )
    real = importlib.metadata.entry_points

    def entry_points(**selection):
        if selection.get("group") == "coevolve.environments":
            return importlib.metadata.EntryPoints([entry])
        return real(**selection)

    monkeypatch.setattr(importlib.metadata, "entry_points", entry_points)
    spec = get_environment("desk-ep")
    assert spec.title == "support desk" and spec.inventory()["tools"] == 7
    result = CliRunner().invoke(app, ["env", "list", "--json"])
    assert result.exit_code == 0
    assert "desk-ep" in [row["env"] for row in json.loads(result.output)]


def test_env_list_shows_an_environment_named_by_import_path():
    result = CliRunner().invoke(app, ["env", "list", EXAMPLE])
    assert result.exit_code == 0, result.output
    out = result.stdout
    assert out.startswith(f"support desk ({EXAMPLE}): ")
    assert (
        "56 tasks from" in out and "task sets (--split): train 33, validation 10, heldout 13" in out
    )
    assert "7 families" in out and re.search(r"plan_lookup\s+│\s+6\s+│\s+1\s+│\s+1", out)
    assert "7 tools" in out and re.search(r"find_customer\s+│ Find a customer by email", out)
    row = json.loads(CliRunner().invoke(app, ["env", "list", EXAMPLE, "--json"]).stdout)
    assert row["task_sets"] == {"train": 33, "validation": 10, "heldout": 13}
    assert list(row["tool_descriptions"])[:2] == ["find_customer", "list_orders"]
    assert row["families_by_split"]["refund"] == {"train": 5, "validation": 2, "heldout": 1}
    world = CliRunner().invoke(app, ["env", "list", "world"])
    assert world.exit_code == 0 and "send_message" in world.stdout  # a tool of the world
    listed = CliRunner().invoke(app, ["env", "list"]).stdout
    assert "coevolve env list examples.support_desk.env:make_env" in " ".join(listed.split())


def test_help_names_user_environments_and_is_whole():
    """Help is rendered by rich: a bracketed word would vanish as a style tag."""

    def help_of(*command: str) -> str:
        result = CliRunner().invoke(app, [*command, "--help"], terminal_width=400)
        assert result.exit_code == 0
        return " ".join(result.output.replace("│", " ").split())

    for command in (["eval"], ["env", "check"], ["env", "show"], ["env", "list"]):
        text = help_of(*command)
        assert "World split" not in text and "world or bfcl" not in text, command
        assert "examples.support_desk.env:make_env" in text, command
    assert "RUN_DIR/adapters/cycle-N" in help_of("eval")
    assert "the value is YAML: 10, 0.5, true, [tensorboard])" in help_of("run")


def test_splits_named_in_the_file_are_kept_and_the_rest_cut_by_id(tmp_path):
    lines = [bank_line(f"t{i}", [GOOD_CALL]) for i in range(8)]
    lines.append(bank_line("fixed", [GOOD_CALL], split="validation"))
    tasks = read_task_file_from_lines(lines, tmp_path / "s")
    cut = assign_splits(tasks.tasks, tasks.named_splits, seed=0)
    by_split = {split: [t.id for t in cut if t.split == split] for split in ("train", "validation", "heldout")}  # fmt: skip
    # Each task's split is its id's (split_of), whatever else the file holds.
    assert by_split == {
        "train": ["t0", "t3", "t4", "t5", "t6", "t7"],
        "validation": ["fixed"],
        "heldout": ["t1", "t2"],
    }
    assert cut == assign_splits(tasks.tasks, tasks.named_splits, seed=0)


# --------------------------------------------------------------------------- diagnosis


def test_diagnosis_and_failure_grade_come_from_the_replay():
    spec = get_environment(EXAMPLE)
    task = next(t for t in spec.load_tasks("train", "", 0) if t.family == "refund")
    env = spec.environment()
    env.reset(task)
    find, _listing, refund = task.reference_calls
    wrong = refund.model_copy(update={"arguments": {**refund.arguments, "reason": "late"}})
    if wrong == refund:
        wrong = refund.model_copy(update={"arguments": {**refund.arguments, "reason": "damaged"}})
    steps = [
        Step(call=find, observation=env.step(find)),
        Step(call=ToolCall(name="refund_order", arguments={"order_id": "O-0"}),
             observation=env.step(ToolCall(name="refund_order", arguments={"order_id": "O-0"}))),
        Step(call=wrong, observation=env.step(wrong)),
    ]  # fmt: skip
    env.end_turn(None)
    trajectory = Trajectory(
        id="x", task_id=task.id, env=EXAMPLE, family=task.family, steps=steps, score=env.score()
    )
    labels, progress = spec.diagnose(task, trajectory)
    assert labels == ["pass", "argument_mismatch", "pass", "state_mismatch"]
    grade = spec.failure_grade(task, trajectory)
    assert trajectory.score == 0.0 and 0.0 < grade < 1.0 and progress < 1.0


def test_offline_synthesis_describes_calls_in_the_tools_words():
    spec = get_environment(EXAMPLE)
    env = spec.environment()
    task = next(t for t in spec.load_tasks("train", "", 0) if t.family == "change_plan")
    find, change = task.reference_calls
    text = env.describe(task.reference_calls, task.setup)
    assert text == (
        f"Find a customer by email address (email: {find.arguments['email']}), then move a "
        f"customer to another plan (plan: {change.arguments['plan']})."
    )  # the customer id is left out: the agent looks it up
    assert change.arguments["customer_id"] not in text


# --------------------------------------------------------------------------- the loop


def test_the_loop_runs_on_the_example_with_the_tiny_model(tmp_path, cache_dir, tiny_build, monkeypatch):  # fmt: skip
    """The whole loop on a user's environment that has no task generator (no `variant`):
    rollouts, signals, offline synthesis, dedup, SFT and held-out evaluation."""
    from coevolve.config import CoevolveConfig
    from coevolve.envs.base import SupportsVariants
    from coevolve.runner import run
    from coevolve.testing.presets import tiny_bootstrap

    monkeypatch.setenv("COEVOLVE_CACHE", str(cache_dir))
    assert not isinstance(get_environment(EXAMPLE).environment(), SupportsVariants)
    config = CoevolveConfig.model_validate(
        {
            "run_dir": str(tmp_path / "run"),
            "cycles": 1,
            "env": {"name": EXAMPLE},
            "rollout": {"k": 2, "max_tool_calls": 2},
            "policy": {"max_new_tokens": 16},
            "pool": {"rollout_tasks": 6, "replay_demonstrations": 4},
            "signals": {"budget": 4},
            "synthesis": {"max_accepted": 2},  # variations of the failed desk tasks
            "training": {"max_steps": 2, "batch_size": 2},
            "evaluation": {"per_family": 1},
        }
    ).model_copy(update={"bootstrap": tiny_bootstrap()})
    result = run(config, progress=False)
    _baseline, first = result.cycles
    assert first.rollout and first.rollout.episodes == 12
    assert first.signals and first.synthesize and first.train and first.train.steps == 2
    # the explorer worked without a sampler or a task generator, and the judge replayed
    assert first.synthesize.explored > 0 and first.synthesize.candidates > 0
    assert first.evaluate.episodes == 7  # one held-out task of each of the seven families
    trajectories = [
        json.loads(line)
        for line in (Path(result.run_dir) / "cycles" / "001" / "rollouts.jsonl").open()
    ]
    assert {row["env"] for row in trajectories} == {EXAMPLE}
    assert all(row["diagnosis"] for row in trajectories)  # labelled by the derived diagnosis

    # `coevolve eval --policy RUN_DIR/adapters/cycle-N` measures that adapter as the run did:
    # the run's bootstrap agent and environment, its held-out tasks, one a family.
    from coevolve.commands.common import run_of_policy

    adapter = Path(result.run_dir) / "adapters" / "cycle-1"
    assert result.adapter is not None and Path(result.adapter) == adapter
    run = run_of_policy(result.run_dir)  # a run directory means its last adapter
    assert run is not None and run.policy.adapter == str(adapter)
    saved = tmp_path / "eval.jsonl"
    evaluated = CliRunner().invoke(
        app, ["eval", "--policy", str(adapter), "--json", "--save", str(saved)]
    )
    assert evaluated.exit_code == 0, evaluated.output
    report = json.loads(evaluated.stdout)
    assert report["env"] == EXAMPLE and report["split"] == "heldout"
    looped = [
        json.loads(line) for line in (Path(result.run_dir) / "cycles" / "001" / "eval.jsonl").open()
    ]
    episodes = [json.loads(line) for line in saved.open()]
    assert sorted(row["task_id"] for row in episodes) == sorted(row["task_id"] for row in looped)
    assert report["overall"]["success_rate"] == first.evaluate.success


def test_llm_roles_synthesize_on_the_example(scripted_server):
    """With LLM roles synthesis needs only the Environment protocol: the explorer's calls run
    in the desk, the abstractor's task is replayed there and verified by its verifier."""
    import asyncio

    from coevolve.agents.roles.role_factory import build_roles
    from coevolve.agents.roles.role_interfaces import (
        AbstractionInput,
        RolesConfig,
        candidate_to_task,
    )
    from coevolve.config import EndpointConfig
    from coevolve.envs.base import replay_reference
    from coevolve.envs.brief import environment_brief
    from coevolve.memory.signals import FlaggedTrajectory
    from coevolve.records import Signal
    from coevolve.testing.openai_server import Reply

    spec = get_environment(EXAMPLE)
    task = next(t for t in spec.load_tasks("train", "", 0) if t.family == "change_plan")
    email = task.reference_calls[0].arguments["email"]
    config = RolesConfig(default_endpoint="main")
    brief = environment_brief(spec.environment())
    EXPLORER_PROMPT, ABSTRACTOR_PROMPT, JUDGE_PROMPT = (  # the desk's, as the roles send them
        config.prompt_for(role, brief) for role in ("explorer", "abstractor", "judge")
    )

    def script(body):
        messages = body["messages"]
        system = messages[0]["content"]
        if system == EXPLORER_PROMPT:
            if not any(m.get("role") == "tool" for m in messages):
                return Reply.tool_calls([("find_customer", {"email": email})])
            return Reply.text("done exploring")
        if system == ABSTRACTOR_PROMPT:
            seen = json.dumps(messages)
            plan = re.search(r"plan=(\w+)", seen).group(1)
            return Reply.json_content(
                [
                    {
                        "description": "look up a customer's plan",
                        "query": f"Which plan is {email} on?",
                        "minimal_actions": [
                            {"name": "find_customer", "arguments": {"email": email}}
                        ],
                        "reference_answer": plan,
                    }
                ]
            )
        if system == JUDGE_PROMPT:
            verdict = {"success": True, "reason": "replays cleanly", "api_match": True,
                       "parameter_usage": True, "logical_flow": True, "final_result": True,
                       "failed_or_skipped_steps": []}  # fmt: skip
            return Reply.json_content(verdict)
        return Reply.json_content({"summary": "stopped early", "failure_cause": "wrong id"})

    server = scripted_server(script)
    main = EndpointConfig(
        base_url=server.base_url, model=server.model, timeout_s=5.0, max_retries=0
    )
    roles = build_roles(config, {"main": main}, make_env=spec.environment, synthesizer="llm")
    trajectory = Trajectory(id="x", task_id=task.id, env=EXAMPLE, family=task.family, score=0.0)
    signal = Signal(kind="unsolved", trajectory_id="x", task_id=task.id, family=task.family)
    item = FlaggedTrajectory(trajectory=trajectory, signals=[signal])
    make_env = spec.environment

    async def pipeline():
        context = await roles.summarizer.summarize(item, task)
        rounds = await roles.explorer.explore(item, task, context, make_env)
        abstraction = await roles.abstractor.abstract(
            AbstractionInput(item, task, context, rounds, [], make_env)
        )
        return (
            rounds,
            abstraction.candidates,
            [await roles.judge.judge(candidate, make_env) for candidate in abstraction.candidates],
        )

    rounds, [candidate], [verdict] = asyncio.run(pipeline())
    assert rounds[0].interactions[0].observation.text.startswith("customer_id=")
    assert verdict.accepted, verdict.reason
    new = candidate_to_task(candidate, task, cycle=1)
    assert new.env == EXAMPLE and replay_reference(make_env(), new)[0] == 1.0


def test_bench_learning_runs_on_the_example(tmp_path, cache_dir, tiny_build, monkeypatch):
    """`coevolve bench learning --config` takes a user's environment like the world."""
    monkeypatch.setenv("COEVOLVE_CACHE", str(cache_dir))
    out = tmp_path / "bench"
    result = CliRunner().invoke(
        app,
        ["bench", "learning", "--config", "examples/support_desk/config.yaml", "--quick",
         "--seeds", "1", "--arms", "coevolve-variation", "--out", str(out)],
    )  # fmt: skip
    assert result.exit_code == 0, result.output
    report = json.loads((out / "report.json").read_text())
    assert set(report["seed_families"]) == {
        *("cancel_order", "change_plan", "login_ticket", "order_status"),
        *("plan_lookup", "refund", "upgrade_and_ticket"),
    }


def test_studios_synthesis_pass_takes_a_users_environment():
    """Studio's synthesis graph builds its runtime from a context naming the environment
    (loop/studio.py): the desk's import path works there as `world` does."""
    import asyncio

    from coevolve.agents.policy.oracle import OraclePolicy
    from coevolve.agents.policy.rollout import run_rollouts
    from coevolve.graph.synthesis.graph import run_synthesis
    from coevolve.loop.build_runtime import spec_synthesis_runtime
    from coevolve.memory.signals import FlaggedTrajectory
    from coevolve.records import Signal

    spec = get_environment(EXAMPLE)
    tasks = [t for t in spec.load_tasks("train", "", 0) if t.family == "upgrade_and_ticket"][:2]
    trajectories = run_rollouts(OraclePolicy(), spec.environment, tasks, progress=False)
    flagged = [
        FlaggedTrajectory(
            trajectory=t,
            signals=[Signal(kind="rare", trajectory_id=t.id, task_id=t.task_id, family=t.family)],
        )
        for t in trajectories
    ]
    runtime = spec_synthesis_runtime(env=EXAMPLE)
    result = asyncio.run(run_synthesis(flagged, tasks, runtime, cycle=1))
    assert result.counts["flagged"] == 2 and result.counts["explored"] == 2, result.counts
    assert all(task.env == EXAMPLE for task in result.accepted)
