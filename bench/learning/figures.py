"""The bench's figures: learning curves, per-family curves and paired differences."""

from __future__ import annotations

import math
from pathlib import Path

from ...agents.policy.eval_report import split_label
from .report import MIN_SEEDS_FOR_BAND, AblationReport, family_pairs


def _seeds(count: int) -> str:
    return "1 seed" if count == 1 else f"{count} seeds"


def plot_curves(report: AblationReport, path: Path) -> Path:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    figure, (curves, bars) = plt.subplots(1, 2, figsize=(13, 5))
    # Beyond ten arms the default colour cycle repeats; tab20 keeps every arm its own colour.
    colours = plt.get_cmap("tab20" if len(report.arms) > 10 else "tab10")
    for index, arm in enumerate(report.arms):
        # Cycles not evaluated (evaluation.every) are left out, so the line joins the rest.
        evaluated = [(x, p) for x, p in enumerate(report.curves[arm]) if not math.isnan(p.mean)]
        if not evaluated:
            continue  # an arm with no finished unit yet: no line, no legend entry
        xs = [x for x, _ in evaluated]
        points = [p for _, p in evaluated]
        colour = colours(index % colours.N)
        curves.plot(xs, [100 * p.mean for p in points], marker="o", label=arm, color=colour)
        lows = [100 * p.low for p in points]
        # A two-seed t-interval (t = 12.7) spans the whole axis and hides the other arms.
        if report.final[arm].n >= MIN_SEEDS_FOR_BAND and not any(math.isnan(v) for v in lows):
            curves.fill_between(xs, lows, [100 * p.high for p in points], alpha=0.12, color=colour)
    curves.set_title(
        f"{split_label(report.split)} success by cycle (mean; 95% CI band for arms with "
        f"≥ {MIN_SEEDS_FOR_BAND} of {_seeds(len(report.seeds))})",
        fontsize=10,
    )
    curves.set_xlabel("cycle")
    curves.set_xticks(range(max((len(report.curves[a]) for a in report.arms), default=1)))
    curves.set_ylabel("success %")
    curves.legend()
    names = list(report.paired)
    means = [100 * report.paired[n].mean for n in names]
    errors = [
        0.0
        if math.isnan(report.paired[n].low)
        else 100 * (report.paired[n].mean - report.paired[n].low)
        for n in names
    ]
    bars.barh(names, means, xerr=errors, color="tab:blue", alpha=0.7)
    bars.axvline(0, color="black", linewidth=0.8)
    bars.set_title(
        f"paired difference of final {split_label(report.split)} success (points, 95% CI)"
    )
    figure.tight_layout()
    figure.savefig(path, dpi=100)
    plt.close(figure)
    return path


def plot_family_curves(report: AblationReport, path: Path) -> Path:
    """One small panel per family: held-out success by cycle, one line per arm (seed means)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    families = sorted({f for curves in report.family_curves.values() for f in curves})
    columns = 6
    rows = max(1, math.ceil(len(families) / columns))
    figure, axes = plt.subplots(rows, columns, figsize=(3 * columns, 2.4 * rows), squeeze=False)
    for index, family in enumerate(families):
        panel = axes[index // columns][index % columns]
        for arm, curves in report.family_curves.items():
            points = curves.get(family, [])
            panel.plot(range(len(points)), [100 * p.mean for p in points], marker=".", label=arm)
            panel.set_xticks(range(len(points)))  # cycles are whole numbers
        panel.set_title(family, fontsize=9)
        panel.set_ylim(-5, 105)
        panel.tick_params(labelsize=7)
    for index in range(len(families), rows * columns):
        axes[index // columns][index % columns].axis("off")
    handles, labels = axes[0][0].get_legend_handles_labels()
    figure.legend(handles, labels, loc="lower center", ncol=len(labels), fontsize=9)
    figure.suptitle(
        f"{split_label(report.split)} success per family by cycle "
        f"(mean over {_seeds(len(report.seeds))})",
        fontsize=11,
    )
    figure.tight_layout(rect=(0, 0.05, 1, 0.96))
    figure.savefig(path, dpi=90)
    plt.close(figure)
    return path


def plot_family_differences(report: AblationReport, path: Path) -> Path:
    """Per family, the paired differences of ``family_pairs`` (points, 95% CI)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    names = family_pairs(report)
    families = sorted({f for name in names for f in report.paired_by_family[name]})
    figure, axis = plt.subplots(figsize=(8, 0.38 * len(families) * max(1, len(names) / 2) + 1.5))
    height = 0.8 / max(1, len(names))
    for offset, name in enumerate(names):
        values = [report.paired_by_family[name][f] for f in families]
        ys = [i + (offset - (len(names) - 1) / 2) * height for i in range(len(families))]
        errors = [0.0 if math.isnan(v.low) else 100 * (v.mean - v.low) for v in values]
        axis.errorbar(
            [100 * v.mean for v in values], ys, xerr=errors, fmt="o", capsize=2, label=name
        )
    axis.axvline(0, color="black", linewidth=0.8)
    axis.set_yticks(range(len(families)), families, fontsize=8)
    axis.invert_yaxis()
    axis.set_xlabel(f"paired difference of final {split_label(report.split)} success (points)")
    axis.set_title(f"per family, 95% CI over {_seeds(len(report.seeds))}", fontsize=10)
    figure.legend(fontsize=8, loc="lower center", ncol=len(names))
    figure.tight_layout(rect=(0, 0.04, 1, 1))
    figure.savefig(path, dpi=90)
    plt.close(figure)
    return path


# The differences the low-resource verdict is about.
VERDICT_PAIRS = ("coevolve-oracle - static", "coevolve-oracle - random")


def plot_by_seed_tasks(reports: dict[int, AblationReport], path: Path) -> Path:
    """coevolve-oracle − static and − random against the number of seed tasks N: the mean
    paired difference with its 95% interval, one report (one N) per point."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    sizes = sorted(reports)
    figure, axis = plt.subplots(figsize=(7, 4.5))
    for offset, name in enumerate(VERDICT_PAIRS):
        xs, means, below, above, labels = [], [], [], [], []
        for size in sizes:
            value = reports[size].paired.get(name)
            if value is None:
                continue
            # side by side on the log axis, so the two intervals at one N do not overlap
            xs.append(size * (1.06 if offset else 1 / 1.06))
            means.append(100 * value.mean)
            known = not math.isnan(value.low)
            below.append(100 * (value.mean - value.low) if known else 0.0)
            above.append(100 * (value.high - value.mean) if known else 0.0)
            labels.append(f"n={value.n}")
        if not xs:
            continue
        axis.errorbar(xs, means, yerr=[below, above], fmt="o-", capsize=3, label=name)
        for x, y, label in zip(xs, means, labels, strict=True):
            axis.annotate(label, (x, y), textcoords="offset points", xytext=(4, 4), fontsize=7)
    axis.axhline(0, color="black", linewidth=0.8)
    axis.set_xscale("log")
    axis.set_xticks(sizes, [str(size) for size in sizes])
    axis.set_xlabel("seed tasks N (log scale)")
    axis.set_ylabel("paired difference of final held-out success (points)")
    axis.set_title("the verdict against the number of seed tasks (95% CI over seeds)", fontsize=10)
    axis.legend(fontsize=8)
    figure.tight_layout()
    figure.savefig(path, dpi=100)
    plt.close(figure)
    return path
