"""The bench's report: per-arm intervals and paired differences with their power
(``summarize``); the tables a person reads are in tables.py."""

from __future__ import annotations

import math
from collections import Counter
from typing import Annotated, Any

from pydantic import BaseModel, BeforeValidator

from .code import code_label
from .stats import mean_interval, paired_power, sample_sd, seeds_for_power

# Differences a reader asks about first: each arm against static and random,
BASELINES = ("static", "random")
# and the pairs each method's question is about, when both arms ran.
REFERENCE_PAIRS = (
    ("coevolve-oracle", "coevolve-paper"),  # does the unsolved signal + failure-rate budget help?
    ("oracle-targeted", "coevolve-oracle"),  # how far the detectors stay from the ceiling
    ("oracle-targeted", "coevolve-paper"),
    ("coevolve-oracle", "no-forgetting"),
    ("coevolve-oracle", "no-boundary"),
    ("coevolve-oracle", "no-rare"),
    ("coevolve-oracle", "no-unsolved"),
    ("seal", "grpo"),
    ("seal", "seal-no-reweighting"),
    ("seal", "seal-no-adaptation"),
    # Each half of SEAL alone against the GRPO it is built on.
    ("seal-no-reweighting", "grpo"),
    ("seal-no-adaptation", "grpo"),
    ("hard-negatives", "own-negatives"),
    # The two methods' arms against the loop's own SFT training at the same compute.
    ("seal", "coevolve-oracle"),
    ("grpo", "coevolve-oracle"),
    ("hard-negatives", "coevolve-oracle"),
    ("own-negatives", "coevolve-oracle"),
    # Variations of the flagged task (issue 85): the user's path, no model and no generator.
    ("coevolve-variation", "random-variation"),
    ("coevolve-variation", "coevolve-oracle"),
    # The committed verdicts of synthesizers since removed (the task writer, the teacher,
    # composed exploration; last run at e25c3f0, docs/compose.md): their reports are read
    # and checked again with these pairs.
    ("coevolve-llm", "random-llm"),
    ("coevolve-llm", "coevolve-oracle"),
    ("coevolve-teacher", "random-teacher"),
    ("coevolve-teacher", "coevolve-oracle"),
    ("coevolve-compose", "random-compose"),
    ("coevolve-compose", "coevolve-oracle"),
)

# The paper's effects (points of success), for the power of the differences that test them;
# a difference that tests none is stated at REFERENCE_EFFECT.
PAPER_EFFECTS = {"coevolve-oracle - static": 0.06, "coevolve-oracle - random": 0.04}
REFERENCE_EFFECT = 0.05
# The goal effect every difference is also stated at, and the stopping rule: 80% power at
# it decides a bench's seeds, never fewer than MIN_SEEDS (docs/benchmarks.md).
GOAL_EFFECT = 0.05
MIN_SEEDS = 4
NO_SPREAD = 1e-9  # a paired SD below this is no measured spread (floating-point noise)
MIN_SEEDS_FOR_BAND = 3  # the learning-curve figure shades an arm's CI from this many seeds


# JSON has no NaN: a report writes an unbounded interval's ends as null; read them back as nan.
MaybeNan = Annotated[float, BeforeValidator(lambda value: math.nan if value is None else value)]


class CycleTraining(BaseModel):
    """What one cycle's training step learned from: its rows by source (the cycle's
    train_data.jsonl: seed and synthesized tasks' demonstrations, rollout successes; see
    TrainResult.rows_by_source) and the optimiser steps it took."""

    cycle: int
    algorithm: str
    steps: int
    rows_by_source: dict[str, int] = {}
    skipped: str | None = None  # why nothing was trained (no data)


class CycleSynthesis(BaseModel):
    """What one cycle's synthesize stage made and what it cost (its SynthesisFigures): the
    funnel, accepted tasks by number of calls, seconds, and the tokens the roles'
    endpoints reported."""

    cycle: int
    flagged: int
    candidates: int
    judged_ok: int
    at_frontier: int | None = None  # None: no frontier check ran
    duplicates: int
    accepted: int
    by_calls: dict[str, int] = {}
    rejections: int = 0
    top_rejections: dict[str, int] = {}
    time_s: float
    tokens: dict[str, int] = {}


class ArmRun(BaseModel):
    arm: str
    seed: int
    # held-out success, cycle 0 first (nan: a cycle not evaluated, evaluation.every)
    success_by_cycle: list[MaybeNan]
    by_family: dict[str, float]  # held-out success per family after the last cycle
    # held-out success per family, cycle 0 first (empty in units saved before it was kept)
    family_curves: dict[str, list[MaybeNan]] = {}
    accepted_by_cycle: list[int]
    # synthesized tasks accepted over the run, by the family of their own calls: where the
    # synthesis budget went (empty in units saved before it was kept)
    accepted_by_family: dict[str, int] = {}
    run_dir: str
    elapsed_s: float  # of the last process only, when the run was resumed
    resumed: bool = False  # continued from a killed run's last finished stage
    # the git commit of the code that ran it (package_commit, "+modified" for a dirty tree;
    # None: not a git checkout, or a unit saved before it was kept)
    commit: str | None = None
    # the fingerprint of that code (code.code_fingerprint), which decides whether the unit
    # still counts; None: a unit saved before fingerprints were kept (issue 71)
    code_fingerprint: str | None = None
    # per cycle from 1, what its training step learned from (empty in older units)
    training_by_cycle: list[CycleTraining] = []
    # each cycle's synthesis funnel and cost (empty in units saved before it was kept)
    synthesis_by_cycle: list[CycleSynthesis] = []
    # the file beside the unit that lists its accepted synthesized tasks, one a line
    # (units.AcceptedTask; None in older units)
    accepted_tasks_file: str | None = None


class Interval(BaseModel):
    mean: MaybeNan
    low: MaybeNan
    high: MaybeNan
    n: int


class Power(BaseModel):
    """The power of a paired difference (paired_stats: a paired t-test, from scipy)."""

    sd: float  # standard deviation of the per-seed paired differences
    n: int  # seeds it was measured on
    # seeds for TARGET_POWER (80%) if the observed mean were the true difference (None: more
    # than MAX_SEEDS, or no spread measured)
    seeds_for_observed: int | None
    # the paper's effect, where the difference tests one (PAPER_EFFECTS), and the seeds for
    # 80% power at it
    paper_effect: float | None = None
    seeds_for_paper_effect: int | None = None
    # the effect this difference's power is stated for (the paper's, else REFERENCE_EFFECT),
    # the power the n seeds have to find it, and the seeds 80% power needs
    effect: float | None = None
    power: float | None = None
    seeds_for_effect: int | None = None
    # the same at the goal effect (GOAL_EFFECT, +5 points), which the stopping rule reads:
    # a bench runs max(seeds_for_goal, MIN_SEEDS) seeds
    goal_power: float | None = None
    seeds_for_goal: int | None = None


class AblationReport(BaseModel):
    config: str
    seeds: list[int]
    arms: list[str]
    runs: list[ArmRun]
    final: dict[str, Interval]  # arm -> final held-out success
    by_family: dict[str, dict[str, Interval]]  # arm -> family -> success
    curves: dict[str, list[Interval]]  # arm -> success per cycle
    family_curves: dict[str, dict[str, list[Interval]]] = {}  # arm -> family -> per cycle
    paired: dict[str, Interval]  # "coevolve-oracle - static" -> difference of final success
    # "coevolve-oracle - static" -> family -> paired difference of the family's final success
    paired_by_family: dict[str, dict[str, Interval]] = {}
    power: dict[str, Power] = {}  # "coevolve-oracle - static" -> the seeds it needs
    # the split the runs were evaluated on (tuning runs: validation), which every title names
    split: str = "heldout"
    # the seed set's tasks per family (pool.seed_tasks bounds it): which families a run
    # could learn from demonstrations, and which it meets only through synthesis
    seed_families: dict[str, int] = {}
    # what a seed varies besides training: "fixed" (one seed set, bootstrap agent and
    # held-out set for every seed: the intervals cover training seeds only) or "per-seed"
    # (each seed its own seed subset, bootstrap agent and held-out draw; seed_families is
    # then the mean over the seeds' sets)
    seed_sets: str = "fixed"
    # units continued from a killed run's last finished stage ("coevolve-oracle-seed3"): a resumed
    # unit gives the figures an uninterrupted one gives (test_a_killed_unit_resumes_to_the_
    # same_figures), and the report says which they were
    resumed: list[str] = []
    # units by the code that ran them ("code 3f9a0c1d2e4b5a67" or UNRECORDED -> units), and
    # the fingerprint of the code that wrote the report: one entry, today's, unless the user
    # accepted other code (--accept-code, --any-code)
    codes: dict[str, int] = {}
    code_now: str | None = None
    plot: str | None = None


def interval(values: list[float]) -> Interval:
    """Mean and 95% t-interval (a single value has an unbounded interval: nan)."""
    mean, low, high = mean_interval(values)
    return Interval(mean=mean, low=low, high=high, n=len(values))


def paired_interval(differences: list[float]) -> Interval:
    """``interval`` of paired differences, except that equal non-zero differences (two seeds
    that moved by the same number of held-out tasks) give no interval (nan): their spread of
    0 is the scores' coarseness, not a measured certainty, and a zero-width interval would
    read as an effect that excludes 0."""
    if (
        len(differences) >= 2
        and sample_sd(differences) < NO_SPREAD
        and abs(differences[0]) > NO_SPREAD
    ):
        return Interval(mean=differences[0], low=math.nan, high=math.nan, n=len(differences))
    return interval(differences)


def summarize(runs: list[ArmRun], arms: list[str], seeds: list[int], config: str) -> AblationReport:
    by_arm = {arm: {run.seed: run for run in runs if run.arm == arm} for arm in arms}
    final = {arm: interval([r.success_by_cycle[-1] for r in by_arm[arm].values()]) for arm in arms}
    families = sorted({f for run in runs for f in run.by_family})
    by_family = {
        arm: {
            family: interval([r.by_family.get(family, 0.0) for r in by_arm[arm].values()])
            for family in families
        }
        for arm in arms
    }
    cycles = max((len(run.success_by_cycle) for run in runs), default=0)
    curves = {
        arm: [
            interval(
                [r.success_by_cycle[c] for r in by_arm[arm].values() if c < len(r.success_by_cycle)]
            )
            for c in range(cycles)
        ]
        for arm in arms
    }
    family_curves = {
        arm: {
            family: [
                interval(
                    [
                        r.family_curves[family][c]
                        for r in by_arm[arm].values()
                        if c < len(r.family_curves.get(family, []))
                    ]
                )
                for c in range(cycles)
            ]
            for family in families
        }
        for arm in arms
        if any(r.family_curves for r in by_arm[arm].values())
    }
    pairs = [
        (arm, base)
        for arm in arms
        for base in BASELINES
        if base != arm and arm != "static" and base in by_arm
    ]
    pairs += [pair for pair in REFERENCE_PAIRS if set(pair) <= set(by_arm) and pair not in pairs]
    paired: dict[str, Interval] = {}
    paired_by_family: dict[str, dict[str, Interval]] = {}
    power: dict[str, Power] = {}
    for arm, base in pairs:
        common = sorted(set(by_arm[arm]) & set(by_arm[base]))
        if common:
            name = f"{arm} - {base}"
            ours, theirs = [by_arm[arm][s] for s in common], [by_arm[base][s] for s in common]
            differences = [
                a.success_by_cycle[-1] - b.success_by_cycle[-1]
                for a, b in zip(ours, theirs, strict=True)
            ]
            paired[name] = paired_interval(differences)
            sd = sample_sd(differences) if len(differences) >= 2 else 0.0
            if sd >= NO_SPREAD:  # without a measured spread there is no power to work out
                paper = PAPER_EFFECTS.get(name)
                effect = paper or REFERENCE_EFFECT
                power[name] = Power(
                    sd=sd,
                    n=len(differences),
                    seeds_for_observed=seeds_for_power(sd, paired[name].mean),
                    paper_effect=paper,
                    seeds_for_paper_effect=seeds_for_power(sd, paper) if paper else None,
                    effect=effect,
                    power=paired_power(sd, effect, len(differences)),
                    seeds_for_effect=seeds_for_power(sd, effect),
                    goal_power=paired_power(sd, GOAL_EFFECT, len(differences)),
                    seeds_for_goal=seeds_for_power(sd, GOAL_EFFECT),
                )
            paired_by_family[name] = {
                family: paired_interval(
                    [
                        a.by_family.get(family, 0.0) - b.by_family.get(family, 0.0)
                        for a, b in zip(ours, theirs, strict=True)
                    ]
                )
                for family in families
            }
    return AblationReport(
        config=config,
        seeds=seeds,
        arms=arms,
        runs=runs,
        final=final,
        by_family=by_family,
        curves=curves,
        family_curves=family_curves,
        paired=paired,
        paired_by_family=paired_by_family,
        power=power,
        resumed=[f"{run.arm}-seed{run.seed}" for run in runs if run.resumed],
        codes=dict(sorted(Counter(code_label(run.code_fingerprint) for run in runs).items())),
    )


def seed_families(config: Any) -> dict[str, int]:
    """The seed set's tasks per family: the first ``pool.seed_tasks`` of the training split."""
    from ...loop.build_runtime import seed_tasks

    return dict(sorted(Counter(task.family for task in seed_tasks(config)).items()))


def family_pairs(report: AblationReport) -> list[str]:
    """The paired differences the per-family table and figure show: coevolve-oracle's
    against static and random when it ran (the reader's first question), else every arm's
    against them. report.json keeps every pair."""
    against = [name for name in report.paired_by_family if name.split(" - ")[1] in BASELINES]
    product = [name for name in against if name.split(" - ")[0] == "coevolve-oracle"]
    return product or against
