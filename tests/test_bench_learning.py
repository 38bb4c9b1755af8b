"""The learning ablation: its statistics, its arms, and the bench end to end (--quick)."""

from __future__ import annotations

import json
import math
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from coevolve.bench.learning import (
    ARMS,
    REFERENCE_EFFECT,
    AblationReport,
    ArmRun,
    CodeAcceptance,
    arm_config,
    family_pairs,
    interval,
    package_commit,
    run_ablation,
    summarize,
    unit_still_counts,
)
from coevolve.config import ConfigError, EndpointConfig, load_config
from coevolve.training.grpo_config import GrpoConfig


def test_interval_is_a_t_interval():
    exact = interval([0.1, 0.2, 0.3])
    assert exact.mean == pytest.approx(0.2)
    # sd 0.1, n 3: half width = t(0.975, 2) * 0.1 / sqrt(3) = 4.303 * 0.0577
    assert exact.high - exact.mean == pytest.approx(4.303 * 0.1 / math.sqrt(3), rel=1e-3)
    single = interval([0.4])
    assert single.mean == 0.4 and math.isnan(single.low)


def _run(arm: str, seed: int, final: float) -> ArmRun:
    return ArmRun(
        arm=arm,
        seed=seed,
        success_by_cycle=[0.1, final],
        by_family={"a": final},
        accepted_by_cycle=[4],
        run_dir="x",
        elapsed_s=1.0,
    )


def test_paired_differences_pair_by_seed():
    runs = [
        _run("static", 0, 0.10),
        _run("static", 1, 0.30),
        _run("static", 2, 0.50),
        _run("coevolve-oracle", 0, 0.15),
        _run("coevolve-oracle", 1, 0.36),
        _run("coevolve-oracle", 2, 0.55),
        _run("random", 0, 0.12),
    ]
    report = summarize(runs, ["static", "random", "coevolve-oracle"], [0, 1, 2], "test")
    # Unpaired the arms' intervals overlap; paired by seed coevolve is ahead by 5-6 points.
    assert report.final["coevolve-oracle"].low < report.final["static"].high
    assert report.paired["coevolve-oracle - static"].mean == pytest.approx(0.0533, abs=1e-3)
    assert report.paired["coevolve-oracle - static"].low > 0
    assert report.paired["coevolve-oracle - random"].n == 1  # random has seed 0 only
    assert "static - random" not in report.paired
    assert report.final["coevolve-oracle"].mean == pytest.approx(0.3533, abs=1e-3)
    assert report.curves["static"][0].mean == pytest.approx(0.1)
    # per family, paired the same way (here family "a" is the whole score)
    family = report.paired_by_family["coevolve-oracle - static"]["a"]
    assert family.mean == pytest.approx(0.0533, abs=1e-3) and family.n == 3
    assert family.low == pytest.approx(report.paired["coevolve-oracle - static"].low)


def test_power_is_a_paired_t_tests_from_scipy():
    from coevolve.bench.learning.stats import paired_power, seeds_for_power, t_quantile

    # G*Power's one-sample t-test, d = 1, two-sided alpha 0.05, n = 10: power 0.8031.
    assert paired_power(1.0, 1.0, 10) == pytest.approx(0.8031, abs=1e-4)
    assert seeds_for_power(1.0, 1.0) == 10 and paired_power(1.0, 1.0, 9) < 0.8
    assert t_quantile(4) == pytest.approx(2.776, abs=1e-3)
    # The bench's measured spreads (6.7 and 3.0 points) at the paper's +6 and +4: 80% power
    # needs 12 and 7 seeds; 8 and 5, where the interval would only just exclude 0 if the
    # mean came out exactly at the effect, have about 60%.
    assert seeds_for_power(0.067, 0.06) == 12 and seeds_for_power(0.03, 0.04) == 7
    assert 0.55 < paired_power(0.067, 0.06, 8) < 0.65
    assert seeds_for_power(0.04, -0.06) == seeds_for_power(0.04, 0.06)  # the sign does not matter
    assert seeds_for_power(0.04, 0.0) is None and seeds_for_power(0.0, 0.05) is None
    assert seeds_for_power(0.5, 0.001) is None  # more than MAX_SEEDS

    runs = [_run("static", s, 0.3) for s in range(4)]
    runs += [_run("coevolve-oracle", s, 0.3 + d) for s, d in enumerate([0.05, 0.01, -0.01, 0.08])]
    runs += [_run("random", s, 0.3 + d) for s, d in enumerate([0.02, 0.0, -0.02, 0.01])]
    report = summarize(runs, ["static", "random", "coevolve-oracle"], [0, 1, 2, 3], "test")
    power = report.power["coevolve-oracle - static"]
    differences = [0.05, 0.01, -0.01, 0.08]
    mean = sum(differences) / 4
    sd = math.sqrt(sum((d - mean) ** 2 for d in differences) / 3)
    assert power.n == 4 and power.sd == pytest.approx(sd)
    assert power.seeds_for_observed == seeds_for_power(sd, mean)
    assert power.paper_effect == 0.06 and power.seeds_for_paper_effect == seeds_for_power(sd, 0.06)
    assert power.effect == 0.06 and power.power == pytest.approx(paired_power(sd, 0.06, 4))
    # a difference no paper effect is about is stated at the reference effect
    other = report.power["random - static"]
    assert other.paper_effect is None and other.effect == REFERENCE_EFFECT
    assert other.power == pytest.approx(paired_power(other.sd, REFERENCE_EFFECT, 4))
    # every difference is also stated at the +5 goal, which the stopping rule reads
    assert power.goal_power == pytest.approx(paired_power(sd, 0.05, 4))
    assert power.seeds_for_goal == seeds_for_power(sd, 0.05)


def test_the_report_says_which_differences_are_short_of_the_stopping_rule():
    from rich.console import Console

    from coevolve.bench.learning import print_report
    from coevolve.bench.learning.tables import stopping_rule_text

    # paired SD 2 points at 4 seeds: +5 has 80% power from 4 seeds on (met); SD 8 points
    # needs far more
    runs = [_run("static", s, 0.3) for s in range(4)]
    runs += [_run("coevolve-oracle", s, 0.3 + d) for s, d in enumerate([0.05, 0.03, 0.07, 0.05])]
    runs += [_run("random", s, 0.3 + d) for s, d in enumerate([0.1, -0.05, 0.08, -0.06])]
    runs[5] = runs[5].model_copy(update={"resumed": True})  # coevolve seed 1
    report = summarize(runs, ["static", "random", "coevolve-oracle"], [0, 1, 2, 3], "test")
    text = stopping_rule_text(report)
    assert text.startswith("stopping rule: 80% power at +5 points decides the seeds, never")
    needed = report.power["random - static"].seeds_for_goal
    assert needed is not None and needed > 4
    assert f"random - static (4 of {needed})" in text
    assert "coevolve-oracle - static (" not in text
    assert report.resumed == ["coevolve-oracle-seed1"]
    console = Console(record=True, width=200)
    print_report(console, report)
    printed = console.export_text()
    assert "stopping rule: 80% power at +5 points" in printed and "short of it" in printed
    assert "units resumed after a kill (r): 1 of 12 (coevolve-oracle-seed1)" in printed
    assert "(r)" in printed


def test_equal_paired_differences_give_no_interval():
    """Two seeds that each moved by the same number of tasks measure no spread: the report
    gives the mean alone, not a zero-width interval that would read as excluding 0."""
    runs = [_run("static", 0, 0.30), _run("static", 1, 0.25)]
    runs += [_run("coevolve-oracle", 0, 0.35), _run("coevolve-oracle", 1, 0.30)]
    report = summarize(runs, ["static", "coevolve-oracle"], [0, 1], "test")
    paired = report.paired["coevolve-oracle - static"]
    assert paired.mean == pytest.approx(0.05) and paired.n == 2
    assert math.isnan(paired.low) and math.isnan(paired.high)
    assert math.isnan(report.paired_by_family["coevolve-oracle - static"]["a"].low)
    assert "coevolve-oracle - static" not in report.power
    # differences of 0 on both seeds stay [0, 0]: the arms did the same
    same = summarize(
        [_run("static", s, 0.3) for s in (0, 1)]
        + [_run("coevolve-oracle", s, 0.3) for s in (0, 1)],
        ["static", "coevolve-oracle"],
        [0, 1],
        "test",
    )
    assert (
        same.paired["coevolve-oracle - static"].low
        == 0.0
        == same.paired["coevolve-oracle - static"].high
    )


def test_paired_differences_per_family_read_each_family():
    def run(arm: str, seed: int, a: float, b: float) -> ArmRun:
        return _run(arm, seed, 0.0).model_copy(update={"by_family": {"a": a, "b": b}})

    runs = [run("static", 0, 0.2, 0.5), run("static", 1, 0.4, 0.5)]
    runs += [run("coevolve-oracle", 0, 0.6, 0.25), run("coevolve-oracle", 1, 0.6, 0.75)]
    report = summarize(runs, ["static", "coevolve-oracle"], [0, 1], "test")
    by_family = report.paired_by_family["coevolve-oracle - static"]
    assert by_family["a"].mean == pytest.approx(0.3)  # +0.4 and +0.2
    assert by_family["b"].mean == pytest.approx(0.0)  # -0.25 and +0.25
    assert by_family["b"].low < 0 < by_family["b"].high
    # the per-family table and figure show coevolve's differences when it ran, else all
    assert family_pairs(report) == ["coevolve-oracle - static"]
    seal_only = summarize(
        [run("static", 0, 0.2, 0.5), run("seal", 0, 0.3, 0.5)], ["static", "seal"], [0], "test"
    )
    assert family_pairs(seal_only) == ["seal - static"]


def test_reference_pairs_and_family_curves_without_static_or_random(tmp_path):
    """The signals bench has no static or random arm: its own pairs are still reported."""
    from coevolve.bench.learning import family_curves_of, plot_family_curves

    runs = []
    for arm, finals in (
        ("coevolve-oracle", (0.4, 0.5)),
        ("coevolve-paper", (0.3, 0.45)),
        ("oracle-targeted", (0.5, 0.6)),
    ):
        for seed, final in enumerate(finals):
            run = _run(arm, seed, final)
            run.family_curves = {"a": [0.0, final], "b": [0.5, 0.5]}
            runs.append(run)
    report = summarize(
        runs, ["coevolve-oracle", "coevolve-paper", "oracle-targeted"], [0, 1], "test"
    )
    assert set(report.paired) == {
        "coevolve-oracle - coevolve-paper",
        "oracle-targeted - coevolve-oracle",
        "oracle-targeted - coevolve-paper",
    }
    assert report.paired["coevolve-oracle - coevolve-paper"].mean == pytest.approx(0.075)
    assert [p.mean for p in report.family_curves["coevolve-oracle"]["a"]] == pytest.approx(
        [0.0, 0.45]
    )
    assert plot_family_curves(report, tmp_path / "f.png").stat().st_size > 10_000
    # Units saved before family curves were kept get them from the run's metrics.jsonl.
    (tmp_path / "run").mkdir()
    (tmp_path / "run" / "metrics.jsonl").write_text(
        '{"cycle": 1, "heldout_by_family": {"a": 0.5}}\n{"cycle": 0, "heldout_by_family": {"a": 0.25}}\n'
    )
    assert family_curves_of(tmp_path / "run") == {"a": [0.25, 0.5]}
    assert family_curves_of(tmp_path / "none") == {}


def test_method_arms_pair_with_coevolve_and_with_each_other():
    """SEAL and hard-negative arms are read against coevolve and their own ablations."""
    runs = [
        _run(arm, seed, final)
        for arm, finals in (
            ("coevolve-oracle", (0.30, 0.35)),
            ("seal", (0.20, 0.20)),
            ("grpo", (0.25, 0.15)),
            ("hard-negatives", (0.20, 0.25)),
            ("own-negatives", (0.10, 0.30)),
        )
        for seed, final in enumerate(finals)
    ]
    arms = ["coevolve-oracle", "seal", "grpo", "hard-negatives", "own-negatives"]
    report = summarize(runs, arms, [0, 1], "test")
    assert set(report.paired) == {
        "seal - grpo",
        "hard-negatives - own-negatives",
        "seal - coevolve-oracle",
        "grpo - coevolve-oracle",
        "hard-negatives - coevolve-oracle",
        "own-negatives - coevolve-oracle",
    }
    assert report.paired["seal - coevolve-oracle"].mean == pytest.approx(-0.125)
    assert report.paired["hard-negatives - own-negatives"].mean == pytest.approx(0.025)


def test_each_seal_arm_pairs_with_grpo():
    """seal, and each of its halves alone, are read against the vanilla GRPO they build on."""
    finals = {
        "grpo": (0.30, 0.20, 0.25),
        "seal": (0.35, 0.20, 0.30),
        "seal-no-reweighting": (0.30, 0.25, 0.25),
        "seal-no-adaptation": (0.25, 0.20, 0.20),
    }
    runs = [
        _run(arm, seed, final)
        for arm, values in finals.items()
        for seed, final in enumerate(values)
    ]
    report = summarize(runs, list(finals), [0, 1, 2], "test")
    assert set(report.paired) == {
        "seal - grpo",
        "seal - seal-no-reweighting",
        "seal - seal-no-adaptation",
        "seal-no-reweighting - grpo",
        "seal-no-adaptation - grpo",
    }
    assert report.paired["seal-no-reweighting - grpo"].mean == pytest.approx(0.05 / 3)
    assert report.paired["seal-no-adaptation - grpo"].mean == pytest.approx(-0.10 / 3)
    assert (
        report.paired["seal-no-adaptation - grpo"].low
        < report.paired["seal-no-adaptation - grpo"].mean
    )


def test_arm_configs_differ_only_where_the_arm_says(tmp_path):
    base = load_config("configs/bench-learning.yaml").model_dump(mode="json")
    configs = {arm: load_config(arm_config(base, arm, 2, tmp_path)) for arm in ARMS}
    assert not configs["static"].synthesis.enabled
    assert configs["random"].signals.selection == "random"
    assert configs["coevolve-oracle"].synthesis.synthesizer == "generator"
    for arm in ("coevolve-variation", "random-variation"):  # no model, no task generator
        assert configs[arm].synthesis.synthesizer == "variation"
    assert configs["random-variation"].signals.selection == "random"
    assert configs["coevolve-variation"].signals == configs["coevolve-oracle"].signals
    assert configs["oracle-targeted"].signals.selection == "oracle"
    seal = {arm: configs[arm].training.seal for arm in ARMS if arm.startswith("seal")}
    assert {arm: (s.reweight.enable, s.adaptation.enable) for arm, s in seal.items()} == {
        "seal": (True, True),
        "seal-no-reweighting": (False, True),
        "seal-no-adaptation": (True, False),
    }
    assert configs["seal"].training.seal.reweight.dynamic.enable
    for arm in ("grpo", *seal):
        assert configs[arm].training.algorithm == "grpo"
    assert not configs["grpo"].training.seal.reweight.enable
    assert configs["no-rare"].signals.kinds == ["forgetting", "boundary", "unsolved"]
    assert configs["coevolve-paper"].signals.kinds == ["forgetting", "boundary", "rare"]
    assert configs["coevolve-paper"].signals.allocation == "per_kind"
    assert "unsolved" in configs["coevolve-oracle"].signals.kinds
    for config in configs.values():
        assert config.seed == config.pool.seed == config.training.seed == 2
        # same compute in every arm
        assert config.training.max_steps == base["training"]["max_steps"]
        assert config.synthesis.max_accepted == base["synthesis"]["max_accepted"]
        assert config.bootstrap == configs["coevolve-oracle"].bootstrap
    assert len({c.run_dir for c in configs.values()}) == len(ARMS)


def test_per_seed_seed_sets_give_each_seed_its_own_tasks_and_bootstrap_agent(tmp_path):
    """--seed-sets per-seed: seed s draws from the environment's generator seed s, so its seed
    subset, its bootstrap agent (built on that subset) and its held-out draw are its own;
    fixed (the default) keeps one of each for every seed."""
    from coevolve.envs.catalog import load_tasks
    from coevolve.loop.build_runtime import evaluation_tasks

    root = Path(__file__).resolve().parents[1]
    base = load_config(root / "configs" / "bench-lowresource-n100.yaml").model_dump(mode="json")
    fixed = [load_config(arm_config(base, "coevolve-oracle", s, tmp_path)) for s in (0, 1)]
    varied = [
        load_config(arm_config(base, "coevolve-oracle", s, tmp_path, seed_sets="per-seed"))
        for s in (0, 1)
    ]
    assert [c.env.seed for c in fixed] == [0, 0] and [c.env.seed for c in varied] == [0, 1]
    assert [c.bootstrap.world_seed for c in varied] == [0, 1]
    assert fixed[0].bootstrap.cache_key() == fixed[1].bootstrap.cache_key()
    assert varied[0].bootstrap.cache_key() != varied[1].bootstrap.cache_key()
    # seed 0 of per-seed is the fixed bench's seed 0, unit for unit
    assert varied[0].model_dump() == fixed[0].model_dump()

    def seed_subset(config):
        tasks = load_tasks(config.env.name, split=config.env.split, seed=config.env.seed)
        return [task.id for task in tasks[: config.pool.seed_tasks]]

    assert seed_subset(fixed[0]) == seed_subset(fixed[1])
    assert set(seed_subset(varied[0])).isdisjoint(seed_subset(varied[1]))
    held_out = [[t.id for t in evaluation_tasks(c)] for c in varied]
    assert len(held_out[0]) == len(held_out[1]) == 216 and held_out[0] != held_out[1]
    with pytest.raises(ValueError, match="seed_sets"):
        arm_config(base, "coevolve-oracle", 0, tmp_path, seed_sets="each")


def quick_bench(out_dir, arms: str, seeds: int, *extra: str):
    """`coevolve bench learning --quick --json`, run as a user runs it; fails on a non-zero exit."""
    out = subprocess.run(
        [
            sys.executable,
            "-m",
            "coevolve",
            "bench",
            "learning",
            "--quick",
            "--json",
            "--seeds",
            str(seeds),
            "--arms",
            arms,
            "--out",
            str(out_dir),
            *extra,
        ],
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert out.returncode == 0, out.stderr[-3000:]
    return out


@pytest.mark.slow
def test_quick_bench_runs_end_to_end(tmp_path, quick_bench_every_arm):
    from coevolve.bench.learning import accepted_tasks_of, code_fingerprint
    from coevolve.run_files import CycleFiles

    # Seed 0 of these arms is the shared quick bench's (the same --quick config): copied
    # here, its units count as finished and only seed 1 runs.
    shared = quick_bench_every_arm.out_dir
    assert quick_bench_every_arm.returncode == 0, quick_bench_every_arm.stderr[-3000:]
    shutil.copytree(shared / "baselines", tmp_path / "baselines")
    (tmp_path / "units").mkdir()
    for arm in ("static", "random", "coevolve-oracle"):
        shutil.copytree(shared / f"{arm}-seed0", tmp_path / f"{arm}-seed0")
        for unit in (shared / "units").glob(f"{arm}-seed0.*"):
            shutil.copy2(unit, tmp_path / "units" / unit.name)
    out = quick_bench(tmp_path, "static,random,coevolve-oracle", seeds=2)
    assert " ".join(out.stderr.split()).count(", seed 0 finished before, skipped") == 3
    report = json.loads(out.stdout)
    assert [(r["arm"], r["seed"]) for r in report["runs"]] == [
        ("static", 0),
        ("random", 0),
        ("coevolve-oracle", 0),
        ("static", 1),
        ("random", 1),
        ("coevolve-oracle", 1),
    ]
    for run in report["runs"]:
        assert len(run["success_by_cycle"]) == 2  # cycle 0 and the one cycle
        if run["arm"] == "static":
            assert run["accepted_by_cycle"] == [0]
        else:
            assert run["accepted_by_cycle"][0] <= 2  # synthesis.max_accepted of --quick
        assert sum(run["accepted_by_family"].values()) == sum(run["accepted_by_cycle"])
        assert run["commit"] == package_commit()  # None only outside a git checkout
        # issue 71: the unit names its code, keeps its accepted tasks and its training rows
        assert run["code_fingerprint"] == code_fingerprint()
        unit = tmp_path / "units" / f"{run['arm']}-seed{run['seed']}.json"
        tasks = accepted_tasks_of(unit)
        assert len(tasks) == sum(run["accepted_by_cycle"])
        assert all(t.cycle == 1 and t.call_count == len(t.calls) >= 1 for t in tasks)
        [trained] = run["training_by_cycle"]
        assert trained["cycle"] == 1 and trained["steps"] == 2  # --quick's training.max_steps
        # and each cycle's synthesis funnel and its seconds (static flags nothing)
        [synthesized] = run["synthesis_by_cycle"]
        assert synthesized["cycle"] == 1 and synthesized["time_s"] >= 0
        assert synthesized["accepted"] == run["accepted_by_cycle"][0]
        assert synthesized["judged_ok"] >= synthesized["accepted"]
        assert (synthesized["flagged"] == 0) == (run["arm"] == "static")
        rows = CycleFiles(run["run_dir"], 1).train_data()
        assert {row["source"] for row in rows} <= {"seed", "synthesized", "rollout"}
        counted = {s: sum(row["source"] == s for row in rows) for s in {r["source"] for r in rows}}
        assert trained["rows_by_source"] == counted and sum(counted.values()) == len(rows)
        if run["arm"] == "static":  # no synthesis: every demonstration is of a seed task
            assert "synthesized" not in counted and counted["seed"] > 0
    assert "units by the commit that ran them" in out.stderr
    assert f"units by the code that ran them: code {code_fingerprint()} (6)" in " ".join(
        out.stderr.split()
    )
    # the seed set the runs learned from: the first pool.seed_tasks (60) training tasks
    assert sum(report["seed_families"].values()) == 60
    assert set(report["paired"]) == {
        "random - static",
        "coevolve-oracle - static",
        "coevolve-oracle - random",
    }
    assert (tmp_path / "learning_curves.png").stat().st_size > 10_000
    assert (tmp_path / "family_differences.png").stat().st_size > 10_000
    assert set(report["paired_by_family"]["coevolve-oracle - static"]) == set(
        report["by_family"]["static"]
    )
    assert "paired differences" in out.stderr and "paired differences per family" in out.stderr
    # The arms of a seed start from one agent: its cycle-0 evaluation ran once per seed.
    assert len(list((tmp_path / "baselines").iterdir())) == 2
    for seed in (0, 1):
        assert len({r["success_by_cycle"][0] for r in report["runs"] if r["seed"] == seed}) == 1
        evaluated = {
            (tmp_path / f"{arm}-seed{seed}" / "cycles" / "000" / "eval.jsonl").read_bytes()
            for arm in ("static", "random", "coevolve-oracle")
        }
        assert len(evaluated) == 1

    # --report-only runs nothing: seed 2 is listed as not run, the report keeps the six units
    out = quick_bench(tmp_path, "static,random,coevolve-oracle", 3, "--report-only")
    assert len(json.loads(out.stdout)["runs"]) == 6
    assert "coevolve-oracle, seed 2: not run yet" in out.stderr
    assert not (tmp_path / "coevolve-oracle-seed2").exists()
    # --seed-list picks seeds (a tuning unit of seed 1 alone): the report holds those.
    out = quick_bench(tmp_path, "static,coevolve-oracle", 1, "--report-only", "--seed-list", "1")
    assert [(r["arm"], r["seed"]) for r in json.loads(out.stdout)["runs"]] == [
        ("static", 1),
        ("coevolve-oracle", 1),
    ]
    bad = subprocess.run(
        [sys.executable, "-m", "coevolve", "bench", "learning", "--quick", "--seed-list", "one"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert bad.returncode != 0 and "--seed-list takes seeds like 1,3" in bad.stderr

    # A unit whose run ended before its unit was saved (killed) resumes its run directory
    # instead of starting over: the runner's resume, not a fresh run (which rewrites config.yaml).
    killed_dir = tmp_path / "coevolve-oracle-seed1"
    written = (killed_dir / "config.yaml").stat().st_mtime_ns
    (tmp_path / "units" / "coevolve-oracle-seed1.json").unlink()
    out = quick_bench(tmp_path, "static,random,coevolve-oracle", 2)
    assert "coevolve-oracle, seed 1 (resuming its killed run)" in out.stderr
    assert (killed_dir / "config.yaml").stat().st_mtime_ns == written
    resumed = json.loads((tmp_path / "units" / "coevolve-oracle-seed1.json").read_text())["run"]
    assert resumed["resumed"] is True
    assert [(r["arm"], r["seed"], r["resumed"]) for r in json.loads(out.stdout)["runs"]][-1] == (
        "coevolve-oracle",
        1,
        True,
    )
    assert json.loads(out.stdout)["resumed"] == ["coevolve-oracle-seed1"]
    assert "units resumed after a kill (r): 1 of 6 (coevolve-oracle-seed1)" in out.stderr

    # Units run with another config are not this bench's: one line says so, no traceback.
    stale = subprocess.run(
        [
            *(sys.executable, "-m", "coevolve", "bench", "learning", "--quick", "--seeds", "2"),
            *("--arms", "static,coevolve-oracle", "--out", str(tmp_path), "--report-only"),
            *("--set", "training.max_steps=7"),
        ],
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert stale.returncode != 0
    assert "were run with another config" in stale.stderr
    assert "Traceback" not in stale.stderr


@pytest.mark.slow
def test_quick_bench_with_per_seed_seed_sets(tmp_path):
    """`--seed-sets per-seed` end to end: each seed's runs learn from their own seed set and
    bootstrap agent, and the report says which variance its intervals cover."""
    out = quick_bench(tmp_path, "static,coevolve-oracle", 2, "--seed-sets", "per-seed")
    report = json.loads(out.stdout)
    assert report["seed_sets"] == "per-seed"
    for seed in (0, 1):
        config = load_config(tmp_path / f"coevolve-oracle-seed{seed}" / "config.yaml")
        assert (config.env.seed, config.bootstrap.world_seed) == (seed, seed)
    # one cycle-0 evaluation per seed, each of its own agent on its own held-out draw
    assert len(list((tmp_path / "baselines").iterdir())) == 2
    printed = " ".join(out.stderr.split())  # the console wraps at its width
    assert "cover training seeds, seed sets, bootstrap agents and held-out draws" in printed
    # the mean over the two seeds' sets of 60 (pool.seed_tasks of --quick), rounded per family
    families = report["seed_families"]
    assert abs(sum(families.values()) - 60) <= len(families) / 2
    bad = subprocess.run(
        [sys.executable, "-m", "coevolve", "bench", "learning", "--quick", "--seed-sets", "x"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert bad.returncode != 0 and "--seed-sets takes fixed or per-seed" in bad.stderr


@pytest.mark.slow
def test_a_killed_unit_resumes_to_the_same_figures(tmp_path, monkeypatch):
    """A bench unit killed part-way (its signals stage raises once, in cycle 2) and resumed by
    the next bench run gives the figures of the same unit run through, and is marked resumed."""
    from coevolve.bench.learning import run_ablation
    from coevolve.graph.cycle import stages
    from coevolve.testing.presets import quick_bench as quick_sections

    base = load_config(Path(__file__).resolve().parents[1] / "configs" / "bench-learning.yaml")
    base_dict = base.model_dump(mode="json")
    base_dict.update(quick_sections())
    base_dict["cycles"] = 2

    def bench(out: Path):
        return run_ablation(
            base_dict,
            seeds=[0],
            arms=["static", "coevolve-oracle"],
            out_dir=out,
            config_name="bench-learning.yaml (--quick)",
            scale_arm_steps=True,
        )

    straight = bench(tmp_path / "straight")
    # static's unit is finished in both benches: the killed one starts from it, and from the
    # seed's cycle-0 evaluation (what a bench killed in its second unit would have).
    (tmp_path / "killed" / "units").mkdir(parents=True)
    for unit in (tmp_path / "straight" / "units").glob("static-seed0.*"):
        shutil.copy2(unit, tmp_path / "killed" / "units" / unit.name)
    shutil.copytree(tmp_path / "straight" / "baselines", tmp_path / "killed" / "baselines")

    signals = stages.signals
    killed = []

    async def dies_once_in_cycle_2(rt, cycle, *args, **kwargs):
        if cycle == 2 and rt.config.run_dir.endswith("coevolve-oracle-seed0") and not killed:
            killed.append(cycle)
            raise RuntimeError("killed in cycle 2's signals stage")
        return await signals(rt, cycle, *args, **kwargs)

    monkeypatch.setattr(stages, "signals", dies_once_in_cycle_2)
    with pytest.raises(RuntimeError, match="killed in cycle 2"):
        bench(tmp_path / "killed")
    assert killed == [2]
    assert not (tmp_path / "killed" / "units" / "coevolve-oracle-seed0.json").exists()
    resumed = bench(tmp_path / "killed")

    assert resumed.resumed == ["coevolve-oracle-seed0"] and straight.resumed == []
    figures = ("success_by_cycle", "by_family", "family_curves", "accepted_by_cycle",
               "accepted_by_family")  # fmt: skip
    for one, other in zip(straight.runs, resumed.runs, strict=True):
        assert (one.arm, one.seed) == (other.arm, other.seed)
        assert {f: getattr(one, f) for f in figures} == {f: getattr(other, f) for f in figures}
    assert resumed.final == straight.final and resumed.paired == straight.paired
    assert resumed.by_family == straight.by_family


@pytest.mark.slow
def test_oracle_targeted_arm_reads_validation_and_targets_its_weak_families(
    quick_bench_every_arm,
):
    run_dir = quick_bench_every_arm.out_dir / "oracle-targeted-seed0"
    cycles = [json.loads(line) for line in (run_dir / "metrics.jsonl").open()]
    validation = cycles[1]["oracle_validation_by_family"]
    assert validation and all(0.0 <= v <= 1.0 for v in validation.values())
    weak = {family for family, success in validation.items() if success < 0.5}
    flagged = [json.loads(line) for line in (run_dir / "cycles" / "001" / "flagged.jsonl").open()]
    assert flagged, "the quick bench's agent is weak everywhere: the oracle must pick something"
    for item in flagged:
        assert [s["kind"] for s in item["signals"]] == ["oracle"]
        assert item["trajectory"]["family"] in weak


@pytest.mark.slow
def test_seal_arm_trains_by_grpo_and_keeps_its_label_statistics_between_cycles(
    quick_bench_every_arm,
):
    run_dir = quick_bench_every_arm.out_dir / "seal-seed0"
    trained = json.loads((run_dir / "cycles" / "001" / "train.json").read_text())
    # two steps: the quick preset's training.max_steps
    assert trained["algorithm"] == "grpo" and trained["steps"] == 2
    state = json.loads((run_dir / "capability_state.json").read_text())
    # Every GRPO episode's labels were counted, and the dynamic update ran.
    assert sum(stats["count"] for stats in state["total"].values()) > 0
    assert state["updates"] >= 1 and state["weights"]


def test_committed_bench_units_still_load():
    """The units under docs/figures continue a bench (docs/benchmarks.md): they must parse."""
    from coevolve.bench.learning import accepted_tasks_of

    figures = Path(__file__).parents[1] / "docs" / "figures"
    units = sorted(figures.glob("*-units/*.json")) + sorted(figures.glob("*/units/*.json"))
    assert units
    for unit in units:
        run = ArmRun.model_validate(json.loads(unit.read_text())["run"])
        assert unit.name == f"{run.arm}-seed{run.seed}.json"
        assert len(run.accepted_by_cycle) == len(run.success_by_cycle) - 1
        assert all(len(curve) == len(run.success_by_cycle) for curve in run.family_curves.values())
        # issue 71: a unit that records its code keeps its accepted tasks, committed beside it
        if run.code_fingerprint is not None:
            assert len(accepted_tasks_of(unit)) == sum(run.accepted_by_cycle), unit
            assert len(run.training_by_cycle) == len(run.accepted_by_cycle), unit


def test_the_compose_verdict_is_drawn_at_one_commit_from_its_committed_units():
    """Issue 71: docs/figures/bench-compose-n100-report.json pairs coevolve-compose with
    static, random-compose and coevolve-oracle over 8 seeds, every unit of one commit and
    one code, and its figures are what the committed units give. That each unit's accepted
    tasks are committed beside it is test_committed_bench_units_still_load's check."""
    figures = Path(__file__).parents[1] / "docs" / "figures"
    report = AblationReport.model_validate_json(
        (figures / "bench-compose-n100-report.json").read_text()
    )
    units = sorted((figures / "bench-compose-n100" / "units").glob("*.json"))
    runs = [ArmRun.model_validate(json.loads(unit.read_text())["run"]) for unit in units]
    assert report.seeds == list(range(8))
    assert {(run.arm, run.seed) for run in runs} == {
        (arm, seed) for arm in report.arms for seed in report.seeds
    }
    assert (
        len({run.commit for run in runs}) == 1 and len({run.code_fingerprint for run in runs}) == 1
    )
    assert all(len(run.success_by_cycle) == 3 for run in runs)  # held-out at every cycle
    again = summarize(runs, report.arms, report.seeds, report.config)
    for pair in (
        "coevolve-compose - static",
        "coevolve-compose - random-compose",
        "coevolve-compose - coevolve-oracle",
    ):
        assert report.paired[pair].n == 8
        assert report.paired[pair].mean == pytest.approx(again.paired[pair].mean)
        assert report.paired[pair].low == pytest.approx(again.paired[pair].low)
        assert pair in report.power


def test_committed_signals_units_still_count_under_todays_config():
    """A later session continues the signals bench from these units (docs/benchmarks.md,
    configs/bench-quickstart.yaml: the quickstart as they ran it):
    a config field added since, at its default, must not make them stale; a changed
    value must. The GRPO units (grpo, seal) ran vanilla GRPO, before the quickstart
    carried its tuned GRPO recipe: they no longer count for those arms."""
    root = Path(__file__).parents[1]
    base = load_config(root / "configs" / "bench-quickstart.yaml").model_dump(mode="json")
    units = sorted((root / "docs" / "figures" / "bench-signals-units").glob("*.json"))
    assert units
    vanilla_grpo = []
    for unit in units:
        saved = json.loads(unit.read_text())
        run = ArmRun.model_validate(saved["run"])
        config = load_config(arm_config(base, run.arm, run.seed, Path("runs/bench-quickstart")))
        if config.training.algorithm == "grpo":
            assert not unit_still_counts(saved["config"], config.model_dump_json()), unit.name
            vanilla_grpo.append(run.arm)
            continue
        assert unit_still_counts(saved["config"], config.model_dump_json()), unit.name
        # Copied to another --out, a unit still counts: the run directory changes no result.
        elsewhere = load_config(arm_config(base, run.arm, run.seed, Path("/tmp/elsewhere")))
        assert unit_still_counts(saved["config"], elsewhere.model_dump_json()), unit.name
        changed = config.model_copy(
            update={"training": config.training.model_copy(update={"max_steps": 11})}
        )
        assert not unit_still_counts(saved["config"], changed.model_dump_json())
    # The quickstart's GRPO recipe does not touch its SFT units; a GRPO unit's own does.
    assert config.training.algorithm == "sft" and config.training.grpo.prompts == "spread"
    grpo = load_config(arm_config(base, "grpo", 0, Path("runs/bench-quickstart")))
    retuned = grpo.model_copy(
        update={"training": grpo.training.model_copy(update={"grpo": GrpoConfig()})}
    )
    assert unit_still_counts(grpo.model_dump_json(), grpo.model_dump_json())
    assert not unit_still_counts(grpo.model_dump_json(), retuned.model_dump_json())
    assert sorted(vanilla_grpo) == ["grpo", "grpo", "seal", "seal"]
    assert not unit_still_counts(None, config.model_dump_json())
    assert not unit_still_counts('{"cycles": -3}', config.model_dump_json())


def test_the_variation_verdict_pairs_it_with_static_random_variation_and_the_oracle():
    arms = ["static", "coevolve-oracle", "coevolve-variation", "random-variation"]
    finals = {"static": 0.5, "coevolve-oracle": 0.56, "coevolve-variation": 0.53,
              "random-variation": 0.49}  # fmt: skip
    runs = [_run(arm, seed, finals[arm] + 0.01 * seed) for arm in arms for seed in range(3)]
    report = summarize(runs, arms, [0, 1, 2], "test")
    assert report.paired["coevolve-variation - static"].mean == pytest.approx(0.03)
    assert report.paired["coevolve-variation - random-variation"].mean == pytest.approx(0.04)
    assert report.paired["coevolve-variation - coevolve-oracle"].mean == pytest.approx(-0.03)


def test_arm_overrides_set_a_value_over_the_arms_own_changes(tmp_path):
    """--set changes the base, which an arm's own setting then replaces;
    --arm-set lands over it (arm_config's over_arms), in every arm or in the one it names,
    and the unit's config records it."""
    from coevolve.commands.bench import sections_by_arm

    root = Path(__file__).parents[1]
    base = load_config(root / "configs" / "bench-lowresource-n100.yaml").model_dump(mode="json")
    base["synthesis"]["synthesizer"] = "llm"  # what --set would do
    plain = load_config(arm_config(base, "coevolve-variation", 0, tmp_path))
    assert plain.synthesis.synthesizer == "variation"  # the arm's own value wins over --set
    base["synthesis"]["synthesizer"] = "generator"
    arms = ["static", "coevolve-variation", "random-variation"]
    items = ["pool.synthesized_weight=0.3", "random-variation:pool.synthesized_weight=0.5"]
    sections = sections_by_arm(items, arms)
    tuned = {
        arm: load_config(arm_config(base, arm, 0, tmp_path, over_arms=sections[arm]))
        for arm in arms
    }
    assert {arm: c.pool.synthesized_weight for arm, c in tuned.items()} == {
        "static": 0.3, "coevolve-variation": 0.3, "random-variation": 0.5
    }  # fmt: skip
    assert tuned["coevolve-variation"].synthesis.synthesizer == "variation"  # the arm's own stays
    assert not unit_still_counts(
        plain.model_dump_json(), tuned["coevolve-variation"].model_dump_json()
    )
    one = sections_by_arm(["coevolve-variation:pool.synthesized_weight=0.3"], arms)
    assert one == {"static": {}, "coevolve-variation": {"pool": {"synthesized_weight": 0.3}},
                   "random-variation": {}}  # fmt: skip
    with pytest.raises(ConfigError, match="synthesized_wieght"):
        sections_by_arm(["pool.synthesized_wieght=1"], arms)
    # an arm of the bench that this piece does not run: nothing set; no arm at all: an error
    assert sections_by_arm(["coevolve-oracle:pool.synthesized_weight=1"], arms) == {
        arm: {} for arm in arms
    }
    with pytest.raises(ConfigError, match="'coevolve-variaton' is not a bench arm"):
        sections_by_arm(["coevolve-variaton:pool.synthesized_weight=1"], arms)
    with pytest.raises(ConfigError, match="synthesized_wieght"):
        sections_by_arm(["coevolve-oracle:pool.synthesized_wieght=1"], arms)


def test_a_bad_arm_override_fails_before_any_unit_runs(tmp_path):
    out = subprocess.run(
        [sys.executable, "-m", "coevolve", "bench", "learning", "--quick", "--arms", "static",
         "--out", str(tmp_path), "--arm-set", "pool.synthesized_wieght=1"],
        capture_output=True,
        text=True,
    )  # fmt: skip
    message = " ".join(out.stderr.split())
    assert out.returncode == 2 and "--arm-set pool.synthesized_wieght=1" in message, message
    assert "synthesized_weight" in message  # the likely spelling
    assert not (tmp_path / "units").exists()


def test_package_commit_names_the_checkouts_commit_and_its_changes(tmp_path):
    def git(*args: str) -> str:
        done = subprocess.run(
            ["git", "-C", str(tmp_path), *args], capture_output=True, text=True, check=True
        )
        return done.stdout.strip()

    assert package_commit(tmp_path) is None  # not a git checkout
    git("init", "-q")
    (tmp_path / "a.py").write_text("x = 1\n")
    git("add", "a.py")
    git("-c", "user.name=t", "-c", "user.email=t@t", "commit", "-q", "-m", "a")
    head = git("rev-parse", "HEAD")
    assert package_commit(tmp_path) == head
    (tmp_path / "runs.txt").write_text("an untracked bench output\n")
    assert package_commit(tmp_path) == head
    (tmp_path / "a.py").write_text("x = 2\n")
    assert package_commit(tmp_path) == f"{head}+modified"
    # the report prints the commits its units ran at, a changed tree marked as such
    from rich.console import Console

    from coevolve.bench.learning import print_report

    runs = [_run("static", 0, 0.2), _run("coevolve-oracle", 0, 0.3)]
    runs[0].commit = f"{head}+modified"
    console = Console(record=True, width=200)
    print_report(console, summarize(runs, ["static", "coevolve-oracle"], [0], "test"))
    assert f"{head[:12]}+modified (1), not recorded (1)" in console.export_text()


def test_an_unknown_arm_is_a_clear_error():
    arms, message = "static,best", "unknown arms ['best']"
    out = subprocess.run(
        [sys.executable, "-m", "coevolve", "bench", "learning", "--quick", "--arms", arms],
        capture_output=True,
        text=True,
    )
    assert out.returncode == 2 and message in " ".join(out.stderr.split())


def test_the_help_names_every_arm():
    out = subprocess.run(
        [sys.executable, "-m", "coevolve", "bench", "learning", "--help"],
        capture_output=True,
        text=True,
        env={**os.environ, "COLUMNS": "400", "NO_COLOR": "1"},
    )
    text = " ".join(out.stdout.split())
    assert [arm for arm in ARMS if arm not in text] == []


def test_the_verdict_by_seed_tasks_reads_reports_back_and_draws_one_figure(tmp_path):
    """`coevolve bench by-seed-tasks N=REPORT ...`: a table and a figure of coevolve-oracle − static
    and − random against N, from report.json files as the bench writes them (NaN as null)."""
    paths = []
    for size, gain in ((100, 0.08), (400, 0.02)):
        runs = [_run("static", s, 0.3) for s in range(3)]
        runs += [_run("random", s, 0.3) for s in range(2)]  # two equal differences: no interval
        runs += [_run("coevolve-oracle", s, 0.3 + gain + 0.01 * s) for s in range(3)]
        report = summarize(runs, ["static", "random", "coevolve-oracle"], [0, 1, 2], f"n{size}")
        path = tmp_path / f"n{size}.json"
        path.write_text(report.model_dump_json())
        paths.append(f"{size}={path}")
    figure = tmp_path / "by-n.png"
    out = subprocess.run(
        [sys.executable, "-m", "coevolve", "bench", "by-seed-tasks", *paths, "--out", str(figure)],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert out.returncode == 0, out.stderr
    assert "+9.0 [" in out.stdout and "power" in out.stdout  # N = 100: +8, +9, +10
    # the units' code, per report (these made-up runs record none)
    assert "N = 100: units by the code that ran them: no code fingerprint recorded (8)" in (
        " ".join(out.stdout.split())
    )
    assert figure.stat().st_size > 10_000
    bad = subprocess.run(
        [sys.executable, "-m", "coevolve", "bench", "by-seed-tasks", "lots=x.json"],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert bad.returncode == 2 and "is not N=REPORT" in bad.stderr


def test_a_tuning_report_names_the_split_it_measured(tmp_path):
    """Tuning runs evaluate validation: the tables and figures say validation, not held-out."""
    from rich.console import Console

    from coevolve.bench.learning import plot_curves, print_report

    runs = [_run("static", 0, 0.3), _run("coevolve-oracle", 0, 0.35)]
    report = summarize(runs, ["static", "coevolve-oracle"], [0], "test")
    report.split = "validation"
    console = Console(record=True, width=120)
    print_report(console, report)
    text = console.export_text()
    assert "final validation success" in text and "held-out" not in text
    assert plot_curves(report, tmp_path / "curves.png").stat().st_size > 10_000


def test_a_cycle_not_evaluated_shows_as_a_dash_not_nan():
    import math

    from coevolve.bench.learning.tables import curve_text

    assert curve_text([0.236, math.nan, 0.491], percent=True) == "23.6% → – → 49.1%"
    assert curve_text([0.236, math.nan, 0.491]) == "23.6 → – → 49.1"


def test_an_arm_with_no_finished_unit_reads_not_run_not_nan(tmp_path):
    """A report written while a bench is under way lists the arms still to run."""
    from rich.console import Console

    from coevolve.bench.learning import plot_curves, print_report

    runs = [_run("static", 0, 0.3), _run("static", 1, 0.35)]
    report = summarize(runs, ["static", "coevolve-oracle"], [0, 1], "test")
    console = Console(record=True, width=200)
    print_report(console, report)
    text = console.export_text()
    assert "not run" in text and "nan" not in text
    assert plot_curves(report, tmp_path / "curves.png").stat().st_size > 10_000


def test_quick_scales_the_arms_step_counts_to_its_steps(tmp_path):
    from coevolve.bench.learning.arms import ARM_STEPS_WRITTEN_FOR, steps_scaled
    from coevolve.testing.presets import quick_bench as quick_sections

    base = load_config(None).model_dump(mode="json")
    base.update(quick_sections())
    quick_steps = base["training"]["max_steps"]
    for arm in ARMS:  # every arm loads at --quick's steps once scaled ...
        config = load_config(arm_config(base, arm, 0, tmp_path, scale_steps=True))
        assert config.training.max_steps == quick_steps
    demonstrations = load_config(
        arm_config(base, "grpo-demonstrations", 0, tmp_path, scale_steps=True)
    ).training.grpo
    assert 0 < demonstrations.demonstration_steps < quick_steps  # still exercised
    # ... and as written at the bench's own steps, so finished units keep their config
    assert (
        steps_scaled(ARMS["grpo-demonstrations"], ARM_STEPS_WRITTEN_FOR)
        == (ARMS["grpo-demonstrations"])
    )
    with pytest.raises(ConfigError, match="demonstration_steps"):
        load_config(arm_config(base, "grpo-demonstrations", 0, tmp_path))


@pytest.mark.slow(first=True)
def test_quick_bench_runs_every_default_arm(quick_bench_every_arm):
    """`coevolve bench learning --quick --seeds 1` with its default arms, as documented
    (tests/conftest.py runs it, once for the tests that read its units)."""
    out = quick_bench_every_arm
    assert out.returncode == 0, out.stderr[-3000:]
    report = json.loads(out.stdout)
    assert [run["arm"] for run in report["runs"]] == list(ARMS)
    for run in report["runs"]:
        assert len(run["success_by_cycle"]) == 2


def test_a_prompt_of_a_role_that_ran_offline_does_not_make_a_unit_stale():
    """The synthesis roles' prompts now say the run's environment: a unit whose roles ran
    offline read none of them, so a changed default prompt keeps it; an LLM role's does not."""
    root = Path(__file__).parents[1]
    offline = load_config(root / "configs" / "bench-quickstart.yaml")
    assert offline.synthesis.synthesizer == "generator"
    today = offline.model_dump_json()
    saved = json.loads(today)  # saved when the default prompt read otherwise
    saved["synthesis"]["roles"]["summarizer_prompt"] = "An older summarizer prompt."
    assert unit_still_counts(json.dumps(saved), today)
    served = offline.model_copy(deep=True)
    served.endpoints = {"big": EndpointConfig(base_url="http://127.0.0.1:9/v1", model="big")}
    served.synthesis.roles.summarizer = "big"
    served.synthesis.roles.explorer_policy_rounds = None  # the generator's, not llm's
    served.synthesis.synthesizer = "llm"
    reworded_served = served.model_copy(deep=True)
    reworded_served.synthesis.roles.summarizer_prompt = "Another summarizer prompt."
    assert unit_still_counts(served.model_dump_json(), served.model_dump_json())
    assert not unit_still_counts(served.model_dump_json(), reworded_served.model_dump_json())


# ----------------------------------------------------------------- issue 71: auditable units


def test_the_code_fingerprint_covers_the_code_a_unit_runs_and_nothing_else(tmp_path):
    """The fingerprint hashes the package's modules and run data; tests, the report's
    modules, the command line, scripts run by hand and folders that are no package (a
    virtual environment, runs/) leave it alone."""
    from coevolve.bench.learning import code_fingerprint, unit_code_files

    files = {
        "__init__.py": "",
        "records.py": "x = 1\n",
        "loop/__init__.py": "",
        "loop/stages.py": "def train(): ...\n",
        "bench/__init__.py": "",
        "bench/rollout.py": "# a script run by hand\n",
        "bench/learning/__init__.py": "",
        "bench/learning/units.py": "# runs the units\n",
        "bench/learning/report.py": "# reads them\n",
        "bench/learning/arms.py": "ARMS = {}\n",
        "commands/__init__.py": "",
        "commands/bench.py": "# options\n",
        "envs/__init__.py": "",
        "envs/data/split.json": "[]\n",
        "tests/test_x.py": "def test(): ...\n",
        ".venv/lib/site.py": "# not a package\n",
        "runs/x/notes.py": "# bench output\n",
        "loop/__pycache__/stages.cpython-312.pyc": "compiled",
        "README.md": "docs\n",
    }
    for name, text in files.items():
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / name).write_text(text)
    covered = sorted(path.as_posix() for path in unit_code_files(tmp_path))
    assert covered == [
        "__init__.py",
        "bench/__init__.py",
        "bench/learning/__init__.py",
        "bench/learning/units.py",
        "envs/__init__.py",
        "envs/data/split.json",
        "loop/__init__.py",
        "loop/stages.py",
        "records.py",
    ]
    before = code_fingerprint(tmp_path)
    assert len(before) == 16 and int(before, 16) >= 0
    for name in ("tests/test_x.py", "bench/learning/report.py", "bench/learning/arms.py",
                 "commands/bench.py", "bench/rollout.py", ".venv/lib/site.py", "README.md"):  # fmt: skip
        (tmp_path / name).write_text("# changed\n")
    assert code_fingerprint(tmp_path) == before
    (tmp_path / "loop" / "stages.py").write_text("def train(): return 1\n")
    changed = code_fingerprint(tmp_path)
    assert changed != before
    (tmp_path / "envs" / "data" / "split.json").write_text("[1]\n")
    assert code_fingerprint(tmp_path) not in (before, changed)
    (tmp_path / "envs" / "data" / "split.json").write_text("[]\n")
    (tmp_path / "loop" / "new.py").write_text("")  # an added module is other code too
    assert code_fingerprint(tmp_path) not in (before, changed)
    # this checkout's fingerprint is stable between calls
    assert code_fingerprint() == code_fingerprint()


def _committed_unit(arm: str = "coevolve-oracle") -> dict:
    root = Path(__file__).parents[1]
    path = root / "docs" / "figures" / "bench-signals-units" / f"{arm}-seed0.json"
    return json.loads(path.read_text())


def _signals_report(out: Path, arms: list[str], **options):
    root = Path(__file__).parents[1]
    base = load_config(root / "configs" / "bench-quickstart.yaml").model_dump(mode="json")
    options = {"run_missing": False, **options}
    return run_ablation(base, seeds=[0], arms=arms, out_dir=out, config_name="test", **options)


def test_a_unit_counts_only_at_todays_code_unless_the_user_accepts_another(tmp_path):
    """A unit of the right config counts only if its code fingerprint is today's, or one
    --accept-code names, or --any-code is given; committed units that predate fingerprints
    read as "no code fingerprint recorded" and count only with --any-code."""
    from rich.console import Console

    from coevolve.bench.learning import code_fingerprint, print_report

    today = code_fingerprint()
    (tmp_path / "units").mkdir()
    unit = tmp_path / "units" / "coevolve-oracle-seed0.json"
    committed = _committed_unit()
    assert "code_fingerprint" not in committed["run"]  # saved before fingerprints were kept
    unit.write_text(json.dumps(committed))
    console = Console(record=True, width=300)
    with pytest.raises(ValueError) as err:
        _signals_report(tmp_path, ["coevolve-oracle"], console=console)
    message = " ".join(str(err.value).split())
    assert "1 unit(s) there ran at other code than today's" in message
    assert "1 record no code fingerprint" in message and "--any-code" in message
    printed = " ".join(console.export_text().split())
    assert "coevolve-oracle, seed 0: not run yet (its unit records no code fingerprint" in printed
    report = _signals_report(
        tmp_path, ["coevolve-oracle"], accept_code=CodeAcceptance(any_code=True)
    )
    assert report.codes == {"no code fingerprint recorded": 1} and report.code_now == today
    console = Console(record=True, width=300)
    print_report(console, report)
    printed = " ".join(console.export_text().split())
    assert "units by the code that ran them: no code fingerprint recorded (1)" in printed
    assert "no unit of this report records the code that ran it" in printed

    # At today's fingerprint it counts with no option, and the report names that code alone.
    committed["run"]["code_fingerprint"] = today
    unit.write_text(json.dumps(committed))
    report = _signals_report(tmp_path, ["coevolve-oracle"])
    assert report.codes == {f"code {today}": 1}
    console = Console(record=True, width=300)
    print_report(console, report)
    assert "warning" not in console.export_text()

    # At another fingerprint it does not, until --accept-code names it.
    other = "0123456789abcdef"
    committed["run"]["code_fingerprint"] = other
    unit.write_text(json.dumps(committed))
    with pytest.raises(ValueError, match=f"pass --accept-code {other} to count them"):
        _signals_report(tmp_path, ["coevolve-oracle"])
    with pytest.raises(ValueError, match="ran at other code"):
        _signals_report(
            tmp_path, ["coevolve-oracle"], accept_code=CodeAcceptance(fingerprints={"f" * 16})
        )
    accepted = CodeAcceptance(fingerprints={other})
    assert _signals_report(tmp_path, ["coevolve-oracle"], accept_code=accepted).codes == {
        f"code {other}": 1
    }

    # A verdict whose units mix codes says so, beside its pairs.
    static = _committed_unit("static")
    static["run"]["code_fingerprint"] = today
    (tmp_path / "units" / "static-seed0.json").write_text(json.dumps(static))
    mixed = _signals_report(tmp_path, ["static", "coevolve-oracle"], accept_code=accepted)
    assert mixed.codes == {f"code {other}": 1, f"code {today}": 1}
    console = Console(record=True, width=300)
    print_report(console, mixed)
    printed = " ".join(console.export_text().split())
    assert "this report's units ran at 2 codes" in printed
    assert "a paired difference may be the code's, not the arms'" in printed
    # Without the option, the unit at other code is left out and static's counts alone.
    alone = _signals_report(tmp_path, ["static", "coevolve-oracle"])
    assert [run.arm for run in alone.runs] == ["static"]
    # The report as written reads back, with its runs' code.
    again = AblationReport.model_validate_json((tmp_path / "report.json").read_text())
    assert again.runs[0].code_fingerprint == today


def test_the_command_line_names_a_stale_units_code_and_checks_accept_code(tmp_path):
    (tmp_path / "units").mkdir()
    committed = _committed_unit()
    committed["run"]["code_fingerprint"] = "0123456789abcdef"
    (tmp_path / "units" / "coevolve-oracle-seed0.json").write_text(json.dumps(committed))

    def bench(*extra: str):
        return subprocess.run(
            [
                *(sys.executable, "-m", "coevolve", "bench", "learning", "--report-only"),
                *("--config", "configs/bench-quickstart.yaml", "--seeds", "1"),
                *("--arms", "coevolve-oracle", "--out", str(tmp_path), *extra),
            ],
            capture_output=True,
            text=True,
            timeout=300,
            cwd=Path(__file__).parents[1],
            env={**os.environ, "COLUMNS": "300"},
        )

    stale = bench()
    assert stale.returncode == 2 and "Traceback" not in stale.stderr
    text = " ".join((stale.stdout + stale.stderr).split())
    assert "its unit ran at other code (code 0123456789abcdef" in text
    assert "pass --accept-code 0123456789abcdef to count it" in text
    counted = bench("--accept-code", "0123456789abcdef")
    assert counted.returncode == 0, counted.stderr[-2000:]
    printed = " ".join((counted.stdout + counted.stderr).split())
    assert "at code 0123456789abcdef (--accept-code 0123456789abcdef), skipped" in printed
    assert "units by the code that ran them: code 0123456789abcdef (1)" in printed
    bad = bench("--accept-code", "d0953bc")
    assert bad.returncode == 2
    assert "--accept-code: a code fingerprint is 16 hex digits" in " ".join(bad.stderr.split())


def _fake_run(calls: list[str]):
    """A stand-in for ``coevolve.runner.run``: writes the run's accepted tasks as the pool
    does and returns a two-cycle result, as a bench unit sees it, with no model."""
    from coevolve.outputs.summary import CycleSummary
    from coevolve.records import Task, ToolCall, Turn
    from coevolve.run_files import RunFiles
    from coevolve.runner import RunResult

    def run(config, **kwargs):
        calls.append(config.run_dir)
        files = RunFiles(config.run_dir)
        files.run_dir.mkdir(parents=True, exist_ok=True)
        accepted = [
            Task(
                id=f"syn-{cycle}",
                env="world",
                family="buy_two",
                turns=[
                    Turn(
                        query=f"Buy two apples (cycle {cycle}).",
                        reference_calls=[
                            ToolCall(name="search", arguments={"q": "apple"}),
                            ToolCall(name="buy", arguments={"item": "apple", "count": 2}),
                        ],
                    )
                ],
                source="synthesized",
                parent_task_id="seed-7",
                signal="unsolved",
                cycle=cycle,
            )
            for cycle in (1, 2)
        ]
        files.synthesized_tasks.write_text("".join(t.model_dump_json() + "\n" for t in accepted))
        evaluation = {"success": 0.5, "tool_sequence": 0.5, "calls": 0.5, "episodes": 4,
                      "by_family": {"buy_two": 0.5}, "time_s": 1.0}  # fmt: skip
        cycles = [CycleSummary(cycle=0, evaluate=evaluation)]
        for cycle, rows in ((1, {"rollout": 3, "seed": 12, "synthesized": 1}), (2, {"seed": 9})):
            train = {"algorithm": "sft", "adapter_dir": "a", "steps": 2, "examples": 16,
                     "rows_by_source": rows, "stage_time_s": 1.0}  # fmt: skip
            synthesize = {"candidates": 3, "duplicates": 0, "accepted": 1, "time_s": 1.0,
                          "by_family": {"buy_two": 1}}  # fmt: skip
            cycles.append(
                CycleSummary(
                    cycle=cycle,
                    synthesize=synthesize,
                    train=train,
                    evaluate=evaluation if cycle == 2 else None,
                )
            )
        return RunResult(
            run_dir=config.run_dir,
            cycles=cycles,
            adapter=None,
            metrics="m",
            report=None,
            tasks=str(files.synthesized_tasks),
            pool={},
            elapsed_s=1.0,
        )

    return run


def test_a_unit_keeps_its_accepted_tasks_training_rows_and_code(tmp_path, monkeypatch):
    """A finished unit names the commit and code fingerprint it ran at, keeps its accepted
    tasks beside it (one line each: request, calls, family, provenance) and, per cycle, its
    training rows by source and optimiser steps; rerun at other code, it runs again and the
    old unit is kept in units/replaced/."""
    from coevolve import runner
    from coevolve.bench.learning import accepted_tasks_of, code_fingerprint
    from coevolve.bench.learning import units as bench_units

    calls: list[str] = []
    monkeypatch.setattr(runner, "run", _fake_run(calls))
    report = _signals_report(tmp_path, ["coevolve-oracle"], run_missing=True)
    assert len(calls) == 1
    unit = tmp_path / "units" / "coevolve-oracle-seed0.json"
    run = ArmRun.model_validate(json.loads(unit.read_text())["run"])
    assert run.commit == package_commit() and run.code_fingerprint == code_fingerprint()
    assert [(c.cycle, c.steps, c.rows_by_source) for c in run.training_by_cycle] == [
        (1, 2, {"rollout": 3, "seed": 12, "synthesized": 1}),
        (2, 2, {"seed": 9}),
    ]
    assert run.accepted_tasks_file == "coevolve-oracle-seed0.tasks.jsonl"
    tasks = accepted_tasks_of(unit)
    assert [(t.id, t.cycle, t.family, t.signal, t.parent_task_id, t.call_count) for t in tasks] == [
        ("syn-1", 1, "buy_two", "unsolved", "seed-7", 2),
        ("syn-2", 2, "buy_two", "unsolved", "seed-7", 2),
    ]
    assert tasks[0].requests == ["Buy two apples (cycle 1)."]
    assert tasks[0].calls[1] == {"name": "buy", "arguments": {"item": "apple", "count": 2}}
    assert len((tmp_path / "units" / run.accepted_tasks_file).read_text().splitlines()) == 2
    assert report.runs[0].training_by_cycle == run.training_by_cycle  # in report.json too
    # The units committed before keep none: reading them says so and where they were.
    old = tmp_path / "old.json"
    old.write_text(json.dumps(_committed_unit()))
    with pytest.raises(FileNotFoundError, match="saved before units kept them"):
        accepted_tasks_of(old)

    # Rerun at the same code: skipped.
    _signals_report(tmp_path, ["coevolve-oracle"], run_missing=True)
    assert len(calls) == 1
    # At other code: run again, the old unit and its tasks moved aside, not overwritten.
    before = unit.read_text()
    monkeypatch.setattr(bench_units, "code_fingerprint", lambda: "fedcba9876543210")
    _signals_report(tmp_path, ["coevolve-oracle"], run_missing=True)
    assert len(calls) == 2
    replaced = tmp_path / "units" / "replaced"
    kept = replaced / f"coevolve-oracle-seed0.{run.code_fingerprint}.json"
    assert kept.read_text() == before
    assert (replaced / f"coevolve-oracle-seed0.{run.code_fingerprint}.tasks.jsonl").exists()
    rerun = ArmRun.model_validate(json.loads(unit.read_text())["run"])
    assert rerun.code_fingerprint == "fedcba9876543210"
