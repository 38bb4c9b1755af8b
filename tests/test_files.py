"""Atomic files and directories: a failure half-way leaves the old version, never part of a new one."""

import json

import pytest

from coevolve.files import atomic_directory, dump_jsonl, load_jsonl, read_jsonl, write_atomically
from coevolve.records import Task, Turn


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
