"""The bench report's tables a person reads (``print_report``), and its texts."""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Sequence
from typing import Any

from ...agents.policy.eval_report import split_label
from .code import UNRECORDED
from .report import (
    GOAL_EFFECT,
    MIN_SEEDS,
    REFERENCE_EFFECT,
    AblationReport,
    Interval,
    family_pairs,
)
from .stats import MAX_SEEDS, TARGET_POWER


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
