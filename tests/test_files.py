"""Atomic files and directories: a failure half-way leaves the old version, never part of a new one."""

import json

import pytest

from coevolve.commands.synthesis import _read_trajectories
from coevolve.common.files import (
    atomic_directory,
    dump_jsonl,
    load_jsonl,
    read_jsonl,
    write_atomically,
)
from coevolve.envs.task_file import read_task_file
from coevolve.records import Task, Trajectory, Turn


def test_atomic_directory_replaces_the_target_only_when_complete(tmp_path):
    target = tmp_path / "model"
    with atomic_directory(target) as work:
        (work / "weights").write_text("v1")
        assert not target.exists()  # nothing visible until the block ends
    assert (target / "weights").read_text() == "v1"
    with pytest.raises(RuntimeError), atomic_directory(target) as work:
        (work / "weights").write_text("v2, half")
        raise RuntimeError("killed")
    assert (target / "weights").read_text() == "v1"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["model"]  # no partial left
    with atomic_directory(target, hidden=True) as work:
        assert work.name.startswith(".model.partial-")
        (work / "weights").write_text("v2")
    assert (target / "weights").read_text() == "v2"


def test_jsonl_round_trip_and_torn_lines(tmp_path):
    task = Task(id="t1", env="world", family="f", turns=[Turn(query="Do it.")])
    path = tmp_path / "rows.jsonl"
    dump_jsonl(path, [task, {"a": 1}])
    assert read_jsonl(path) == [json.loads(task.model_dump_json()), {"a": 1}]
    dump_jsonl(path, [task])
    assert load_jsonl(path, Task) == [task]
    with path.open("a") as handle:
        handle.write('{"id": "t2", "env"')  # a kill mid-append
    with pytest.raises(json.JSONDecodeError):
        read_jsonl(path)
    assert len(read_jsonl(path, skip_torn=True)) == 1
    write_atomically(path, "")
    assert read_jsonl(path) == [] and sorted(p.name for p in tmp_path.iterdir()) == ["rows.jsonl"]


def test_a_record_holding_unicode_line_separators_stays_one_line(tmp_path):
    """JSON leaves U+0085, U+2028 and U+2029 raw inside strings, and str.splitlines splits
    at them: a tiny model's reply holding one tore `coevolve eval --save`'s file in two."""
    odd = "moved\x85to 08:30\u2028then\u2029done"
    episode = Trajectory(id="e1", task_id="t1", env="world", family="f", score=0.0)
    episode.final_answer = odd
    path = tmp_path / "rollouts.jsonl"
    dump_jsonl(path, [episode, episode.model_copy(update={"id": "e2"})])
    assert [t.final_answer for t in load_jsonl(path, Trajectory)] == [odd, odd]
    assert [row["id"] for row in read_jsonl(path)] == ["e1", "e2"]
    assert [t.id for t in _read_trajectories(str(path))] == ["e1", "e2"]
    tasks = tmp_path / "tasks.jsonl"
    tasks.write_text(
        json.dumps(
            {"id": "t1", "family": "f", "turns": [{"user": odd, "calls": [{"name": "note"}]}]},
            ensure_ascii=False,
        )
        + "\n",
        encoding="utf-8",
    )
    loaded = read_task_file(tasks, "world")
    assert not loaded.problems and loaded.tasks[0].turns[0].query == odd


def test_cycle_files_write_the_files_their_docstring_names_and_read_them_back(tmp_path) -> None:
    import re

    from coevolve.records import FlaggedTrajectory, Signal, Task, Trajectory
    from coevolve.run_files import CycleFiles

    task = Task(id="t1", env="world", family="phone_lookup", turns=[Turn(query="Find Ana.")])
    episode = Trajectory(id="e1", task_id="t1", env="world", family="phone_lookup", score=1.0)
    flagged = FlaggedTrajectory(
        trajectory=episode,
        signals=[Signal(kind="rare", trajectory_id="e1", task_id="t1", family="phone_lookup")],
    )
    files = CycleFiles(tmp_path, 2)
    assert CycleFiles.of_run(tmp_path) == [] and files.rollouts() == [] and files.flagged() == []
    files.write_rollouts([episode])
    files.write_flagged([flagged])
    files.write_synthesized([task])
    files.write_rejections([])
    files.write_train_data([{"messages": [], "tools": None, "weight": 1.0}])
    files.write_evaluation([episode])
    unreached = episode.model_copy(update={"id": "e2", "transport_failure": True})
    files.write_unreachable("rollout", [unreached])
    files.write_failure_rollouts([episode])
    files.write_hard_negative_figures({"failure_pairs": 3})
    files.write_train_record(episode)  # any record: the step's result in a run
    files.train_step_spec.write_text("{}")
    documented = set(re.findall(r"^    (\S+\.jsonl?) ", CycleFiles.__doc__ or "", re.M))
    documented = {name.replace("STAGE", "rollout") for name in documented}  # one per stage
    assert {path.name for path in files.folder.iterdir()} == documented
    assert files.unreachable("rollout") == [unreached] and files.unreachable("evaluate") == []
    assert files.folder == tmp_path / "cycles" / "002"
    assert [f.cycle for f in CycleFiles.of_run(tmp_path)] == [2]
    assert files.rollouts() == [episode] and files.failure_rollouts() == [episode]
    assert files.flagged() == [flagged] and files.synthesized() == [task]
    assert files.train_data()[0]["weight"] == 1.0
    assert files.hard_negative_figures() == {"failure_pairs": 3} and files.train_steps() == 0
