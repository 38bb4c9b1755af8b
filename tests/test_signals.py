"""Signals fire on constructed histories and stay silent otherwise; memory persists."""

import pytest
from pydantic import ValidationError

from coevolve.memory.history import OutcomeHistory
from coevolve.memory.patterns import PatternCounts, tool_errors, tool_sequence
from coevolve.memory.signals import SignalConfig, apply_budget, detect_signals
from coevolve.records import Observation, Step, ToolCall, Trajectory


def traj(task, score, cycle=0, index=0, family=None, tools=("a",), error=None):
    steps = [
        Step(
            call=ToolCall(name=name),
            observation=Observation(text="x", error=error if i == len(tools) - 1 else None),
        )
        for i, name in enumerate(tools)
    ]
    return Trajectory(
        id=f"{task}/c{cycle}/r{index}",
        task_id=task,
        env="world",
        family=family or f"fam-{task}",
        score=score,
        steps=steps,
        cycle=cycle,
    )


def run(cycles, config=None, history=None, patterns=None):
    """Feed cycles of (task, score) lists; return the flagged items of the last cycle."""
    config = config or SignalConfig(kinds=["forgetting"], forgetting_level="task")
    history = history or OutcomeHistory()
    patterns = patterns or PatternCounts()
    flagged = []
    for cycle, rows in enumerate(cycles):
        trajectories = [traj(task, score, cycle, i) for i, (task, score) in enumerate(rows)]
        flagged = detect_signals(trajectories, history, patterns, config, cycle)
    return flagged


def test_forgetting_fires_when_a_mastered_task_fails():
    flagged = run([[("t", 1.0)], [("t", 0.0)]])
    assert [item.kinds for item in flagged] == [["forgetting"]]
    assert flagged[0].signals[0].evidence["window"] == [1.0]


@pytest.mark.parametrize(
    "cycles",
    [
        [[("t", 0.0)], [("t", 0.0)]],  # never learned
        [[("t", 1.0)], [("t", 1.0)]],  # still fine
        [[("t", 1.0)], [("t", 0.0)], [("t", 0.0)], [("t", 0.0)]],  # learned too long ago (W=2)
        [[("t", 0.0)]],  # no history
    ],
)
def test_forgetting_stays_silent(cycles):
    assert run(cycles, SignalConfig(kinds=["forgetting"], forgetting_level="task", window=2)) == []


def test_forgetting_by_family_flags_only_failures():
    config = SignalConfig(kinds=["forgetting"], forgetting_level="family")
    history = OutcomeHistory()
    patterns = PatternCounts()
    detect_signals(
        [traj("a", 1.0, 0, family="f"), traj("b", 1.0, 0, family="f")], history, patterns, config, 0
    )
    now = [
        traj("a", 0.0, 1, family="f"),
        traj("b", 0.0, 1, family="f"),
        traj("c", 1.0, 1, family="f", index=1),
    ]
    flagged = detect_signals(now, history, patterns, config, 1)
    assert sorted(item.trajectory.task_id for item in flagged) == ["a", "b"]


def test_boundary():
    config = SignalConfig(kinds=["boundary"])
    assert (
        len(run([[("t", 1.0), ("t", 0.0), ("t", 1.0)]], config)) == 2
    )  # per_task_limit=2 of the 3 flagged
    unlimited = SignalConfig(kinds=["boundary"], per_task_limit=8)
    assert len(run([[("t", 1.0), ("t", 0.0), ("t", 1.0)]], unlimited)) == 3
    for scores in ([1.0, 1.0], [0.0, 0.0], [0.5, 0.5], [0.5, 1.0]):
        assert run([[("t", s) for s in scores]], unlimited) == []


def test_rare_needs_enough_observations_and_a_rare_pattern():
    config = SignalConfig(
        kinds=["rare"], rare_min_observations=40, rare_theta_percent=5, per_task_limit=8
    )
    common = [traj(f"t{i}", 1.0, 0, i, tools=("a", "b")) for i in range(30)]
    odd = traj("odd", 1.0, 0, 99, tools=("a", "z"))
    patterns = PatternCounts()
    assert (
        detect_signals([*common, odd], OutcomeHistory(), patterns, config, 0) == []
    )  # N = 31 < 40
    more = [traj(f"t{i}", 1.0, 1, i, tools=("a", "b")) for i in range(30)] + [
        traj("odd", 1.0, 1, 99, tools=("a", "z"))
    ]
    flagged = detect_signals(more, OutcomeHistory(), patterns, config, 1)
    assert [item.trajectory.task_id for item in flagged] == ["odd"]
    evidence = flagged[0].signals[0].evidence
    assert evidence["count"] == 2 and evidence["total"] == 62 and evidence["pattern"] == "a>z"


def test_several_signals_on_one_trajectory_are_kept():
    config = SignalConfig(
        kinds=["forgetting", "boundary"], forgetting_level="task", per_task_limit=8
    )
    flagged = run([[("t", 1.0), ("t", 1.0)], [("t", 0.0), ("t", 0.0), ("t", 1.0)]], config)
    kinds = {item.trajectory.id: sorted(item.kinds) for item in flagged}
    assert sorted(kinds["t/c1/r0"]) == ["boundary", "forgetting"]
    assert kinds["t/c1/r2"] == ["boundary"]


def test_budget_respects_priority():
    config = SignalConfig(
        budget=2, priority=["rare", "boundary", "forgetting", "unsolved"], allocation="per_kind"
    )
    items = run(
        [[("x", 1.0), ("x", 0.0), ("y", 1.0), ("y", 0.0)]],
        SignalConfig(kinds=["boundary"], per_task_limit=8),
    )
    assert len(apply_budget(items, config)) == 2
    assert {i.trajectory.score for i in apply_budget(items, config)} == {
        0.0
    }  # clearer failures first


def test_history_and_patterns_persist_and_do_not_double_count(tmp_path):
    history = OutcomeHistory(tmp_path / "outcomes.jsonl")
    patterns = PatternCounts(tmp_path / "patterns.json")
    config = SignalConfig()
    batch = [traj("t", 1.0, 0)]
    detect_signals(batch, history, patterns, config, 0)
    detect_signals(batch, history, patterns, config, 0)  # a resumed run repeats cycle 0
    reopened = OutcomeHistory(tmp_path / "outcomes.jsonl")
    assert reopened.task_window("t", 1, 3) == [1.0]
    assert PatternCounts(tmp_path / "patterns.json").total == 1
    with open(tmp_path / "outcomes.jsonl", "a") as handle:
        handle.write('{"cycle": 1, "traj')  # a line cut short by a kill
    assert OutcomeHistory(tmp_path / "outcomes.jsonl").task_window("t", 2, 3) == [1.0]


def test_pattern_extractors():
    t = traj("t", 0.0, tools=("find_contact", "send_message"), error="not_found")
    assert tool_sequence(t) == "find_contact>send_message"
    assert tool_errors(t) == "send_message!not_found"
    assert tool_errors(traj("u", 1.0)) == "(no errors)"


def test_config_rejects_bad_priority():
    with pytest.raises(ValidationError, match="exactly once"):
        SignalConfig(priority=["rare", "rare", "boundary"])


def test_random_selection_is_reproducible_and_bounded():
    from coevolve.memory.signals import select_random

    trajectories = [traj(f"t{i % 5}", 0.0, index=i) for i in range(40)]
    config = SignalConfig(budget=6, per_task_limit=2, selection="random")
    picked = select_random(trajectories, config, cycle=2, seed=0)
    assert len(picked) == 6
    assert all(item.kinds == ["random"] for item in picked)
    per_task = {}
    for item in picked:
        per_task[item.trajectory.task_id] = per_task.get(item.trajectory.task_id, 0) + 1
    assert max(per_task.values()) <= 2
    again = select_random(trajectories, config, cycle=2, seed=0)
    assert [i.trajectory.id for i in again] == [i.trajectory.id for i in picked]
    other = select_random(trajectories, config, cycle=3, seed=0)
    assert [i.trajectory.id for i in other] != [i.trajectory.id for i in picked]


def test_random_is_not_a_detector():
    with pytest.raises(ValidationError, match=r"not detectors.*selection: random"):
        SignalConfig(kinds=["rare", "random"])


def test_unsolved_flags_a_task_whose_k_rollouts_all_fail_and_never_succeeded():
    config = SignalConfig(kinds=["unsolved"], per_task_limit=8)
    flagged = run([[("t", 0.0), ("t", 0.0), ("u", 0.0), ("u", 1.0)]], config)
    assert {item.trajectory.task_id for item in flagged} == {"t"}
    assert all(item.kinds == ["unsolved"] for item in flagged)
    assert flagged[0].signals[0].evidence["scores"] == [0.0, 0.0]


def test_unsolved_stays_silent_once_a_task_was_solved_before():
    config = SignalConfig(kinds=["unsolved"], per_task_limit=8)
    assert run([[("t", 1.0)], [("t", 0.0), ("t", 0.0)]], config) == []


def test_the_paper_preset_drops_unsolved():
    assert "unsolved" in SignalConfig().kinds
    assert SignalConfig(kinds="paper").kinds == ["forgetting", "boundary", "rare"]
    assert run([[("t", 0.0), ("t", 0.0)]], SignalConfig(kinds="paper")) == []


def test_failure_rate_allocation_spends_the_budget_where_failures_are():
    """Family a fails 3 of 4 rollouts, family b 1 of 4: a gets about three times b's share."""
    rows = []
    for task, family, scores in [
        *[(f"a{i}", "a", (0.0, 0.0, 0.0, 1.0)) for i in range(4)],
        *[(f"b{i}", "b", (0.0, 1.0, 1.0, 1.0)) for i in range(4)],
    ]:
        rows += [(task, family, score) for score in scores]
    trajectories = [
        traj(task, score, 0, index, family=family)
        for index, (task, family, score) in enumerate(rows)
    ]
    config = SignalConfig(kinds=["boundary"], budget=8, per_task_limit=4, kind_floor=0)
    everything = detect_signals(
        trajectories, OutcomeHistory(), PatternCounts(), config, 0, budgeted=False
    )
    assert len(everything) == 32  # every rollout of a mixed task, before the budget
    kept = apply_budget(everything, config, trajectories)
    families = [item.trajectory.family for item in kept]
    assert len(kept) == 8
    assert families.count("a") == 6 and families.count("b") == 2
    uniform = apply_budget(
        everything, config.model_copy(update={"allocation": "uniform"}), trajectories
    )
    assert [i.trajectory.family for i in uniform].count("a") == 4


def test_oracle_selection_spends_the_budget_on_families_weak_on_validation():
    from coevolve.memory.signals import select_oracle

    trajectories = [
        traj(f"{family}{i % 4}", score, index=i, family=family)
        for family, score in (("weak_a", 0.0), ("weak_b", 1.0), ("easy", 0.0))
        for i in range(8)
    ]
    trajectories[8] = traj("weak_b9", 0.0, index=99, family="weak_b")  # one failure in weak_b
    validation = {"weak_a": 0.25, "weak_b": 0.0, "easy": 0.75}
    config = SignalConfig(budget=6, per_task_limit=1, selection="oracle")
    picked = select_oracle(trajectories, validation, config, cycle=1, seed=0)
    assert all(item.kinds == ["oracle"] for item in picked)
    families = [item.trajectory.family for item in picked]
    assert "easy" not in families  # easy on validation, however often it fails rollouts
    assert families.count("weak_a") == 3 and families.count("weak_b") == 3  # round-robin
    # Failures first within a family, and one item per task.
    assert picked[families.index("weak_b")].trajectory.task_id == "weak_b9"
    assert len({item.trajectory.task_id for item in picked}) == len(picked)
    assert picked[0].signals[0].evidence["validation_success"] in (0.25, 0.0)
    again = select_oracle(trajectories, validation, config, cycle=1, seed=0)
    assert [i.trajectory.id for i in again] == [i.trajectory.id for i in picked]
    assert select_oracle(trajectories, {"weak_a": 0.9}, config, cycle=1, seed=0) == []


def test_oracle_selection_needs_the_world_and_a_held_out_evaluation():
    from coevolve.config import ConfigError, load_config

    assert load_config({"signals": {"selection": "oracle"}}).signals.selection == "oracle"
    with pytest.raises(ConfigError, match="reads the validation split"):
        load_config({"signals": {"selection": "oracle"}, "evaluation": {"split": "validation"}})
    with pytest.raises(ConfigError, match="has none"):
        load_config({"signals": {"selection": "oracle"}, "env": {"name": "bfcl"}})
