"""The task file's rules (envs/task_file.py, envs/user_env.py), on copies of the support
desk's tasks: a task that asks for nothing is refused like any bad line, a task's split is
its own (removing another line never moves it), hints repeat the options the user gave, and a
refused file has one exit code in every command."""

from __future__ import annotations

import json
import uuid
from pathlib import Path

from typer.testing import CliRunner

from coevolve.cli import app
from coevolve.envs.task_file import assign_splits, read_task_file
from coevolve.envs.user_env import DOING_NOTHING_SCORES, find_user_environment

EXAMPLE_TASKS = Path(__file__).resolve().parents[1] / "examples" / "support_desk" / "tasks.jsonl"

NO_CALLS_MESSAGE = (
    'its reference makes no call ("calls" is empty in every turn), so an agent that does '
    "nothing would score 1.00; give it the calls that answer the request (a question's "
    "answer comes from a call's result: add the lookup that shows it)"
)


def example_lines() -> list[dict]:
    return [json.loads(line) for line in EXAMPLE_TASKS.read_text().splitlines() if line.strip()]


def desk_with(tmp_path: Path, monkeypatch, lines: list[dict]) -> str:
    """A copy of the support desk whose task file holds ``lines``; its import path."""
    (tmp_path / "tasks.jsonl").write_text("".join(json.dumps(line) + "\n" for line in lines))
    name = f"desk_{uuid.uuid4().hex[:8]}"
    (tmp_path / f"{name}.py").write_text(
        "from pathlib import Path\n"
        "from coevolve.envs import FunctionEnvironment\n"
        "from examples.support_desk.env import SupportDesk\n\n"
        "def make_env():\n"
        "    return FunctionEnvironment(SupportDesk, tasks=Path(__file__).with_name('tasks.jsonl'))\n"
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    return f"{name}:make_env"


def test_a_task_whose_reference_makes_no_call_is_refused_naming_its_line_and_the_fix(
    tmp_path, monkeypatch
):
    lines = example_lines()
    lines[2]["turns"][0]["calls"] = []  # plan_lookup-02, with its answer still there
    lines[9]["turns"][0]["calls"] = []  # change_plan-01, no answer
    name = desk_with(tmp_path, monkeypatch, lines)
    found = find_user_environment(name)
    assert found is not None
    assert [str(problem) for problem in found.problems] == [
        f"tasks.jsonl line 3 (task plan_lookup-02): {NO_CALLS_MESSAGE}",
        f"tasks.jsonl line 10 (task change_plan-01): {NO_CALLS_MESSAGE}",
    ]
    result = CliRunner().invoke(app, ["env", "check", name])
    assert result.exit_code == 2
    assert f"problem tasks.jsonl line 10 (task change_plan-01): {NO_CALLS_MESSAGE}\n" in (
        result.output
    )


def test_a_task_that_doing_nothing_solves_is_refused(tmp_path, monkeypatch):
    """Lookups alone with no answer asked: the final state is the initial one, which an agent
    that calls nothing also leaves."""
    lines = example_lines()
    lines[0].pop("answer")  # plan_lookup-00: find_customer, then no answer to check
    name = desk_with(tmp_path, monkeypatch, lines)
    found = find_user_environment(name)
    assert found is not None
    assert [str(problem) for problem in found.problems] == [
        f"tasks.jsonl line 1 (task plan_lookup-00): {DOING_NOTHING_SCORES}"
    ]
    assert DOING_NOTHING_SCORES == (
        "an agent that makes no call scores 1.00 on it: its reference changes nothing and it "
        'asks for no answer; give it the "answer" its lookups show, or the call that changes '
        "the state"
    )


def test_removing_one_line_leaves_every_other_tasks_split_unchanged(tmp_path):
    lines = EXAMPLE_TASKS.read_text().splitlines()
    whole = read_task_file(EXAMPLE_TASKS, "desk")
    before = {t.id: t.split for t in assign_splits(whole.tasks, whole.named_splits, seed=0)}
    for removed in (3, 20, 41):  # a plan lookup, a refund, an order status
        path = tmp_path / f"without-{removed}.jsonl"
        path.write_text("\n".join(lines[:removed] + lines[removed + 1 :]) + "\n")
        fewer = read_task_file(path, "desk")
        after = {t.id: t.split for t in assign_splits(fewer.tasks, fewer.named_splits, seed=0)}
        assert len(after) == len(before) - 1
        assert after == {task_id: before[task_id] for task_id in after}


def test_the_support_desks_held_out_split_has_every_family():
    found = find_user_environment("examples.support_desk.env:make_env")
    assert found is not None
    families = {task.family for task in found.good_tasks}
    assert {task.family for task in found.tasks("heldout")} == families
    assert {task.family for task in found.tasks("validation")} == families


def test_hints_repeat_the_task_file_the_user_named(tmp_path, monkeypatch):
    lines = example_lines()
    lines[9]["turns"][0]["calls"] = []
    name = desk_with(tmp_path, monkeypatch, lines)
    other = tmp_path / "other.jsonl"
    other.write_text((tmp_path / "tasks.jsonl").read_text())
    result = CliRunner().invoke(app, ["env", "show", name, "--tasks", str(other)])
    assert result.exit_code == 0, result.output
    assert result.stderr.splitlines()[-1] == (
        f"  coevolve env check {name} --tasks {other} lists them all"
    )


def test_a_refused_task_file_exits_2_in_env_check_and_in_run(tmp_path, monkeypatch):
    lines = example_lines()
    lines[9]["turns"][0]["calls"] = []
    name = desk_with(tmp_path, monkeypatch, lines)
    check = CliRunner().invoke(app, ["env", "check", name])
    config = tmp_path / "run.yaml"
    config.write_text(f"env: {{name: '{name}'}}\nrun_dir: {tmp_path / 'run'}\n")
    run = CliRunner().invoke(app, ["run", str(config)])
    assert (check.exit_code, run.exit_code) == (2, 2)
    assert "line 10 (task change_plan-01): its reference makes no call" in run.stderr
    assert f"(coevolve env check {name} lists them all)" in run.stderr
    assert not (tmp_path / "run").exists()
