from __future__ import annotations

from collections import Counter

import pytest

from coevolve.common.files import load_jsonl
from coevolve.envs.world import load_split
from coevolve.memory.history import OutcomeHistory
from coevolve.memory.pool import PoolConfig, TaskPool
from coevolve.records import Task, Trajectory


@pytest.fixture(scope="module")
def seeds():
    return load_split("train")[:200]


def synthesized(task, cycle, number):
    return task.model_copy(
        update={
            "id": f"synth-{cycle}-{number}",
            "source": "synthesized",
            "parent_task_id": task.id,
            "signal": "rare",
            "cycle": cycle,
        }
    )


def test_adding_is_idempotent_and_persisted(seeds, tmp_path):
    path = tmp_path / "pool.jsonl"
    pool = TaskPool(seeds, path)
    new = [synthesized(seeds[i], 1, i) for i in range(5)]
    assert pool.add(new) == 5
    assert pool.add([*new, synthesized(seeds[9], 1, 9)]) == 1  # a resumed cycle re-adds
    assert [t.id for t in load_jsonl(path, Task)] == [t.id for t in pool.synthesized()]
    with path.open("a") as handle:
        handle.write('{"id": "cut sho')  # a line cut short by a kill
    reopened = TaskPool(seeds, path)
    assert len(reopened) == len(seeds) + 6
    assert reopened.counts() == {"seed": len(seeds), "synthesized": 6, "signal:rare": 6}
    assert reopened.get("synth-1-9").parent_task_id == seeds[9].id


def test_sampling_is_reproducible_and_weighted(seeds):
    pool = TaskPool(seeds)
    pool.add([synthesized(seeds[i], 1, i) for i in range(20)])
    config = PoolConfig(rollout_tasks=40, synthesized_weight=5.0, seed=3)
    history = OutcomeHistory()
    first = pool.sample(2, history, config)
    assert len(first) == 40 and len({t.id for t in first}) == 40
    assert [t.id for t in pool.sample(2, history, config)] == [t.id for t in first]
    assert [t.id for t in pool.sample(3, history, config)] != [t.id for t in first]
    # 20 of 220 tasks are synthesized; at 5x weight they make up far more than 9% of draws.
    share = Counter(
        t.source for cycle in range(1, 21) for t in pool.sample(cycle, history, config)
    )["synthesized"] / (20 * 40)
    assert share > 0.25
    equal = PoolConfig(rollout_tasks=40, synthesized_weight=1.0, seed=3)
    share_equal = Counter(
        t.source for cycle in range(1, 21) for t in pool.sample(cycle, history, equal)
    )["synthesized"] / (20 * 40)
    assert share_equal < share


def test_mastered_tasks_are_replayed_less_or_never(seeds):
    pool = TaskPool(seeds[:50])
    history = OutcomeHistory()
    mastered = {t.id for t in seeds[:25]}
    history.record(
        1,
        [
            Trajectory(
                id=f"{t.id}-r0",
                task_id=t.id,
                env="world",
                family=t.family,
                score=1.0 if t.id in mastered else 0.0,
            )
            for t in seeds[:50]
        ],
    )
    never = PoolConfig(rollout_tasks=20, replay_mastered=0.0)
    assert not mastered & {t.id for t in pool.sample(2, history, never)}
    all_of_them = PoolConfig(rollout_tasks=None, replay_mastered=0.0)
    assert {t.id for t in pool.sample(2, history, all_of_them)} == {t.id for t in seeds[25:50]}
    some = PoolConfig(rollout_tasks=20, replay_mastered=0.25)
    drawn = Counter(
        t.id in mastered for cycle in range(2, 22) for t in pool.sample(cycle, history, some)
    )
    assert 0 < drawn[True] < drawn[False]


def test_replay_sample_takes_earlier_tasks_only(seeds):
    pool = TaskPool(seeds[:30])
    pool.add([synthesized(seeds[0], 1, 0), synthesized(seeds[1], 2, 1)])
    picked = pool.replay_sample(2, count=100, exclude={seeds[2].id}, seed=0)
    ids = {t.id for t in picked}
    assert "synth-1-0" in ids and "synth-2-1" not in ids and seeds[2].id not in ids
    assert pool.replay_sample(2, 5, set(), 0) == pool.replay_sample(2, 5, set(), 0)


def test_pool_config_rejects_bad_values():
    with pytest.raises(ValueError, match="replay_mastered"):
        PoolConfig(replay_mastered=1.5)
    with pytest.raises(ValueError, match="rollout_tasks"):
        PoolConfig(rollout_tasks=0)
