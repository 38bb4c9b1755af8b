"""The bench's report: per-arm intervals, paired differences with their power, and the
tables a person reads (``print_report``)."""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Sequence
from typing import Annotated, Any

from pydantic import BaseModel, BeforeValidator, field_validator, model_validator

from ...agents.evaluation import split_label
from .arms import RENAMED_ARMS, renamed_arm
from .code import UNRECORDED, code_label
from .stats import MAX_SEEDS, TARGET_POWER, mean_interval, paired_power, sample_sd, seeds_for_power

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
    # The LLM path (issue 55): do the signals matter with the task writer, and how far is
    # the writer from the environment's own generator?
    ("coevolve-llm", "random-llm"),
    ("coevolve-llm", "coevolve-oracle"),
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
    # the file beside the unit that lists its accepted synthesized tasks, one a line
    # (units.AcceptedTask; None in older units)
    accepted_tasks_file: str | None = None

    @field_validator("arm", mode="before")
    @classmethod
    def _todays_arm(cls, name: Any) -> Any:
        """A unit saved under an arm's old name (RENAMED_ARMS) counts as today's arm."""
        return renamed_arm(name) if isinstance(name, str) else name


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

    @model_validator(mode="before")
    @classmethod
    def _renamed_arms(cls, data: Any) -> Any:
        """A report written under an arm's old name (RENAMED_ARMS) reads under today's."""
        if not isinstance(data, dict) or not set(data.get("arms") or []) & set(RENAMED_ARMS):
            return data
        data = dict(data)
        data["arms"] = [renamed_arm(arm) for arm in data["arms"]]

        def arm(name: str) -> str:
            return RENAMED_ARMS.get(name, name)

        for key in ("final", "by_family", "curves", "family_curves"):
            if isinstance(data.get(key), dict):
                data[key] = {arm(name): value for name, value in data[key].items()}
        for key in ("paired", "paired_by_family", "power"):
            if isinstance(data.get(key), dict):
                data[key] = {
                    " - ".join(arm(part) for part in name.split(" - ")): value
                    for name, value in data[key].items()
                }

        def unit(name: str) -> str:
            arm_name, seed_mark, seed = name.rpartition("-seed")
            return f"{arm(arm_name)}{seed_mark}{seed}" if seed_mark else name

        data["resumed"] = [unit(name) for name in data.get("resumed") or []]
        return data


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


def mixed_code_warning(report: AblationReport) -> str | None:
    """A warning when the report's units ran at more than one code (or some recorded none):
    then a paired difference may be the code's, not the arms' (issue 71). None when they
    all ran at one fingerprint."""
    if len(report.codes) <= 1 and UNRECORDED not in report.codes:
        return None
    codes = ", ".join(f"{label} ({count})" for label, count in report.codes.items())
    if len(report.codes) == 1:
        return (
            f"warning: no unit of this report records the code that ran it ({codes}): its "
            "arms may have run at different commits; rerun them at one to draw a verdict"
        )
    return (
        f"warning: this report's units ran at {len(report.codes)} codes ({codes}): a paired "
        "difference may be the code's, not the arms'; rerun them at one commit to draw a verdict"
    )


def seed_families(config: Any) -> dict[str, int]:
    """The seed set's tasks per family: the first ``pool.seed_tasks`` of the training split."""
    from ...loop.compose import seed_tasks

    return dict(sorted(Counter(task.family for task in seed_tasks(config)).items()))


def family_pairs(report: AblationReport) -> list[str]:
    """The paired differences the per-family table and figure show: coevolve-oracle's
    against static and random when it ran (the reader's first question), else every arm's
    against them. report.json keeps every pair."""
    against = [name for name in report.paired_by_family if name.split(" - ")[1] in BASELINES]
    product = [name for name in against if name.split(" - ")[0] == "coevolve-oracle"]
    return product or against


def curve_text(values: Sequence[float], percent: bool = False) -> str:
    """Success by cycle as text, cycle 0 first; a cycle not evaluated
    (``evaluation.every``) shows as "–"."""
    return " → ".join(
        "–" if math.isnan(v) else (f"{v:.1%}" if percent else f"{100 * v:.1f}") for v in values
    )


def print_report(console: Any, report: AblationReport) -> None:
    from rich.table import Table

    def fmt(i: Interval) -> str:
        if math.isnan(i.mean):
            return "not run"
        if math.isnan(i.low):
            return f"{100 * i.mean:.1f}%"
        return f"{100 * i.mean:.1f}% [{100 * i.low:.1f}, {100 * i.high:.1f}]"

    measure = split_label(report.split)
    table = Table(title=f"final {measure} success, mean [95% CI] over seeds {report.seeds}")
    table.add_column("arm")
    table.add_column("final", justify="right")
    table.add_column("by cycle (means)", justify="right")
    for seed in report.seeds:
        table.add_column(f"seed {seed}", justify="right")
    for arm in report.arms:
        runs = {r.seed: r for r in report.runs if r.arm == arm}
        table.add_row(
            arm,
            fmt(report.final[arm]),
            curve_text([p.mean for p in report.curves[arm]]),
            *(
                f"{100 * runs[s].success_by_cycle[-1]:.1f}%{' (r)' if runs[s].resumed else ''}"
                if s in runs
                else ""
                for s in report.seeds
            ),
        )
    console.print(table)
    console.print(
        "the intervals cover training seeds only: every seed has the same seed set, "
        f"bootstrap agent and {measure} tasks"
        if report.seed_sets == "fixed"
        else f"the intervals cover training seeds, seed sets, bootstrap agents and {measure} "
        "draws: each seed has its own (--seed-sets per-seed)"
    )
    resumed = [f"{r.arm}-seed{r.seed}" for r in report.runs if r.resumed]
    console.print(
        f"units resumed after a kill (r): {len(resumed)} of {len(report.runs)}"
        + (f" ({', '.join(resumed)})" if resumed else "")
    )
    commits = Counter(
        r.commit[:12] + ("+modified" if r.commit.endswith("+modified") else "")
        if r.commit
        else "not recorded"
        for r in report.runs
    )
    console.print(
        "units by the commit that ran them: "
        + ", ".join(f"{commit} ({count})" for commit, count in sorted(commits.items()))
    )
    console.print(
        "units by the code that ran them: "
        + ", ".join(f"{label} ({count})" for label, count in report.codes.items())
        + (f"; today's is code {report.code_now}" if report.code_now else "")
    )
    warning = mixed_code_warning(report)
    if warning:
        console.print(f"[bold yellow]{warning}[/bold yellow]")
    paired = Table(title=f"paired differences (arm - baseline), points of {measure} success")
    paired.add_column("difference")
    paired.add_column("mean [95% CI]", justify="right")
    for name, value in report.paired.items():
        paired.add_row(name, points_text(value))
    console.print(paired)
    if report.power:
        table = Table(
            title=f"power of each paired difference (paired t-test, 95%; seeds for "
            f"{TARGET_POWER:.0%} power)"
        )
        table.add_column("difference")
        table.add_column("SD (points)", justify="right")
        table.add_column("effect", justify="right")
        table.add_column("power at n", justify="right")
        table.add_column(f"seeds for {TARGET_POWER:.0%}", justify="right")
        table.add_column(f"power at +{100 * GOAL_EFFECT:.0f} (goal); seeds", justify="right")
        table.add_column("seeds, if the mean holds", justify="right")
        for name, power in report.power.items():
            effect = power.effect or REFERENCE_EFFECT
            source = "paper" if power.paper_effect else "reference"
            table.add_row(
                name,
                f"{100 * power.sd:.1f}",
                f"+{100 * effect:.0f} ({source})",
                f"{power.power:.0%} (n={power.n})" if power.power is not None else "",
                _seeds_text(power.seeds_for_effect),
                f"{power.goal_power:.0%}; {_seeds_text(power.seeds_for_goal)}"
                if power.goal_power is not None
                else "",
                _seeds_text(power.seeds_for_observed),
            )
        console.print(table)
        console.print(stopping_rule_text(report))
    families = sorted({f for arm in report.arms for f in report.by_family[arm]})
    if families:
        table = Table(
            title=f"final {measure} success per family (mean over seeds); seed tasks of the "
            "family; synthesized tasks accepted (mean per run)"
        )
        table.add_column("family")
        table.add_column("seed tasks", justify="right")
        for arm in report.arms:
            table.add_column(arm, justify="right")
        for family in families:
            cells = []
            for arm in report.arms:
                arm_runs = [r for r in report.runs if r.arm == arm]
                accepted = sum(r.accepted_by_family.get(family, 0) for r in arm_runs) / max(
                    len(arm_runs), 1
                )
                extra = f" (+{accepted:.0f})" if accepted >= 0.5 else ""
                mean = report.by_family[arm][family].mean
                # an arm none of whose units has finished yet (a report of a bench under way)
                cells.append("–" if math.isnan(mean) else f"{100 * mean:.0f}%{extra}")
            seeds = str(report.seed_families.get(family, 0)) if report.seed_families else ""
            table.add_row(family, seeds, *cells)
        console.print(table)
    against = family_pairs(report)
    if families and against:
        table = Table(title="paired differences per family, points [95% CI]")
        table.add_column("family")
        for name in against:
            table.add_column(name, justify="right")
        for family in families:
            table.add_row(
                family, *(points_text(report.paired_by_family[name][family]) for name in against)
            )
        console.print(table)


def stopping_rule_text(report: AblationReport) -> str:
    """Whether each paired difference has the seeds the stopping rule asks for: 80% power
    at the goal effect (+5 points), never fewer than MIN_SEEDS."""
    short = []
    for name, power in report.power.items():
        needed = max(power.seeds_for_goal or 0, MIN_SEEDS)
        if power.seeds_for_goal is None:
            short.append(f"{name} ({power.n} of more than {MAX_SEEDS})")
        elif power.n < needed:
            short.append(f"{name} ({power.n} of {needed})")
    rule = (
        f"stopping rule: {TARGET_POWER:.0%} power at +{100 * GOAL_EFFECT:.0f} points decides "
        f"the seeds, never fewer than {MIN_SEEDS}"
    )
    if not short:
        return f"{rule}: every difference has its seeds"
    return f"{rule}; short of it, seeds run of seeds needed: " + ", ".join(short)


def _seeds_text(seeds: int | None) -> str:
    return f"> {MAX_SEEDS}" if seeds is None else str(seeds)


def points_text(value: Interval) -> str:
    """A paired difference in points, with its 95% interval where it has one."""
    if math.isnan(value.low):
        return f"{100 * value.mean:+.1f}"
    return f"{100 * value.mean:+.1f} [{100 * value.low:+.1f}, {100 * value.high:+.1f}]"
