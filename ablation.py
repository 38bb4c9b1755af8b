"""The learning-efficiency ablation: does signal-guided synthesis beat static or random data?

``coevolve bench learning`` runs the closed loop once per (arm, seed) from the
same bootstrap model with the same compute: the same cycles, the same gradient
steps per cycle (``training.max_steps``) and, for every arm that synthesizes,
the same number of accepted synthetic tasks per cycle (``synthesis.max_accepted``).
The arms differ only in where the new data comes from:

- ``static``: no synthesis; the pool stays the seed tasks;
- ``random``: synthesis from trajectories picked at random;
- ``coevolve``: synthesis from the trajectories the detectors flag (the paper's
  three plus unsolved), the budget split by each family's failure rate;
- ``coevolve-paper``: the paper's three detectors only, budget by kind priority;
- ``oracle-targeted``: trajectories of the families the current agent solves less
  than half of on the validation split (a reference ceiling, never a product arm:
  it reads validation each cycle);
- ``no-forgetting`` / ``no-boundary`` / ``no-rare`` / ``no-unsolved``: coevolve
  without one detector;
- ``grpo``, ``seal``, ``seal-no-reweighting``, ``seal-no-adaptation``: coevolve
  trained by GRPO instead of SFT (the same optimisation steps): plain, with
  SEAL's diagnosis-weighted advantages and training-only interface, and
  without each of the two;
- ``hard-negatives`` / ``own-negatives``: the target agent trained by DPO + SFT
  on expert vs failure pairs, with and without the failure agent's negatives.

Every (arm, seed) run is a finished unit: its result is written to
``<out>/units/<arm>-seed<N>.json`` when it ends, and a rerun with the same
config skips it, so a long bench can run in pieces. A unit whose run was killed
before it finished (its run directory holds the same config and a checkpoint)
continues from that run's last finished stage.

Each run is evaluated on the held-out split after every cycle. The report
gives, per arm, the mean final held-out success with a 95% t-interval over
seeds (and per family), paired differences between arms (paired by seed: the
same seed means the same rollout sampling and training order), and learning
curves (learning_curves.png), per family (family_curves.png) and the paired
differences per family (family_differences.png).
"""

from __future__ import annotations

import json
import math
from collections import Counter
from pathlib import Path
from typing import Any

from pydantic import BaseModel

from .paired_stats import (
    MAX_SEEDS,
    TARGET_POWER,
    mean_interval,
    paired_power,
    sample_sd,
    seeds_for_power,
)


def _seal(reweight: bool, adaptation: bool) -> dict[str, Any]:
    """training.seal of a SEAL arm: the released code's full setting, less what it drops."""
    return {
        "reweight": {"enable": reweight, "dynamic": {"enable": reweight}},
        "adaptation": {"enable": adaptation},
    }


# The DPO + SFT arms' learning rate, tuned on validation (docs/hard-negatives.md: own-negatives,
# seed 0, one cycle, 108 validation tasks from 22.2%: 5e-4 -> 14.8%, 1e-4 -> 19.4%, 2e-5 ->
# 22.2%). The SFT arms' 5e-4 breaks the target's tool-call format within a cycle.
HARD_NEGATIVES_LEARNING_RATE = 2e-5

ARMS: dict[str, dict[str, Any]] = {
    "static": {"synthesis": {"enabled": False}},
    "random": {"signals": {"selection": "random"}},
    "coevolve": {},
    "coevolve-paper": {"signals": {"kinds": "paper", "allocation": "per_kind"}},
    "oracle-targeted": {"signals": {"selection": "oracle"}},
    "no-forgetting": {"signals": {"kinds": ["boundary", "rare", "unsolved"]}},
    "no-boundary": {"signals": {"kinds": ["forgetting", "rare", "unsolved"]}},
    "no-rare": {"signals": {"kinds": ["forgetting", "boundary", "unsolved"]}},
    "no-unsolved": {"signals": {"kinds": ["forgetting", "boundary", "rare"]}},
    # SEAL (training/seal.py, envs/adaptation.py): GRPO with the same optimisation steps;
    # grpo is the vanilla-RL baseline SEAL is compared with.
    "grpo": {"training": {"algorithm": "grpo"}},
    "seal": {"training": {"algorithm": "grpo", "seal": _seal(reweight=True, adaptation=True)}},
    "seal-no-reweighting": {
        "training": {"algorithm": "grpo", "seal": _seal(reweight=False, adaptation=True)}
    },
    "seal-no-adaptation": {
        "training": {"algorithm": "grpo", "seal": _seal(reweight=True, adaptation=False)}
    },
    # Co-Evolving Agents (training/hard_negatives.py): DPO + SFT target with failure-agent negatives,
    "hard-negatives": {
        "hard_negatives": {
            "enabled": True,
            "learning_rate": HARD_NEGATIVES_LEARNING_RATE,
            "failure_learning_rate": HARD_NEGATIVES_LEARNING_RATE,
        }
    },
    # and the same objective on the target's own failures only.
    "own-negatives": {
        "hard_negatives": {
            "enabled": True,
            "failure_agent": False,
            "failure_share": 0.0,
            "learning_rate": HARD_NEGATIVES_LEARNING_RATE,
        }
    },
}
# Differences a reader asks about first: each arm against static and random,
BASELINES = ("static", "random")
# and the pairs each method's question is about, when both arms ran.
REFERENCE_PAIRS = (
    ("coevolve", "coevolve-paper"),  # does the unsolved signal + failure-rate budget help?
    ("oracle-targeted", "coevolve"),  # how far the detectors stay from the ceiling
    ("oracle-targeted", "coevolve-paper"),
    ("coevolve", "no-forgetting"),
    ("coevolve", "no-boundary"),
    ("coevolve", "no-rare"),
    ("coevolve", "no-unsolved"),
    ("seal", "grpo"),
    ("seal", "seal-no-reweighting"),
    ("seal", "seal-no-adaptation"),
    ("hard-negatives", "own-negatives"),
    # The two methods' arms against the loop's own SFT training at the same compute.
    ("seal", "coevolve"),
    ("grpo", "coevolve"),
    ("hard-negatives", "coevolve"),
    ("own-negatives", "coevolve"),
)

# The paper's effects (points of success), for the power of the differences that test them;
# a difference that tests none is stated at REFERENCE_EFFECT.
PAPER_EFFECTS = {"coevolve - static": 0.06, "coevolve - random": 0.04}
REFERENCE_EFFECT = 0.05
NO_SPREAD = 1e-9  # a paired SD below this is no measured spread (floating-point noise)
MIN_SEEDS_FOR_BAND = 3  # the learning-curve figure shades an arm's CI from this many seeds


class ArmRun(BaseModel):
    arm: str
    seed: int
    success_by_cycle: list[float]  # held-out success, cycle 0 first
    by_family: dict[str, float]  # held-out success per family after the last cycle
    # held-out success per family, cycle 0 first (empty in units saved before it was kept)
    family_curves: dict[str, list[float]] = {}
    accepted_by_cycle: list[int]
    # synthesized tasks accepted over the run, by the family of their own calls: where the
    # synthesis budget went (empty in units saved before it was kept)
    accepted_by_family: dict[str, int] = {}
    run_dir: str
    elapsed_s: float  # of the last process only, when the run was resumed
    resumed: bool = False  # continued from a killed run's last finished stage


class Interval(BaseModel):
    mean: float
    low: float
    high: float
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


class AblationReport(BaseModel):
    config: str
    seeds: list[int]
    arms: list[str]
    runs: list[ArmRun]
    final: dict[str, Interval]  # arm -> final held-out success
    by_family: dict[str, dict[str, Interval]]  # arm -> family -> success
    curves: dict[str, list[Interval]]  # arm -> success per cycle
    family_curves: dict[str, dict[str, list[Interval]]] = {}  # arm -> family -> per cycle
    paired: dict[str, Interval]  # "coevolve - static" -> difference of final success
    # "coevolve - static" -> family -> paired difference of the family's final success
    paired_by_family: dict[str, dict[str, Interval]] = {}
    power: dict[str, Power] = {}  # "coevolve - static" -> the seeds it needs
    # the seed set's tasks per family (pool.seed_tasks bounds it): which families a run
    # could learn from demonstrations, and which it meets only through synthesis
    seed_families: dict[str, int] = {}
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
    )


def seed_families(config: Any) -> dict[str, int]:
    """The seed set's tasks per family: the first ``pool.seed_tasks`` of the training split."""
    from .envs.catalog import load_tasks

    seeds = load_tasks(
        config.env.name, split=config.env.split, category=config.env.category, seed=config.env.seed
    )
    if config.pool.seed_tasks is not None:
        seeds = seeds[: config.pool.seed_tasks]
    return dict(sorted(Counter(task.family for task in seeds).items()))


def family_curves_of(run_dir: str | Path) -> dict[str, list[float]]:
    """Held-out success per family, cycle 0 first, from a run's metrics.jsonl ({} if missing)."""
    from .files import read_jsonl

    metrics = Path(run_dir) / "metrics.jsonl"
    if not metrics.exists():
        return {}
    rows = sorted(read_jsonl(metrics), key=lambda row: row.get("cycle", 0))
    families = sorted({f for row in rows for f in row.get("heldout_by_family") or {}})
    return {f: [(row.get("heldout_by_family") or {}).get(f, 0.0) for row in rows] for f in families}


def arm_config(base: dict[str, Any], arm: str, seed: int, out_dir: Path) -> dict[str, Any]:
    """The base config with the arm's changes, the seed and its own run directory."""
    config = json.loads(json.dumps(base))
    for section, changes in ARMS[arm].items():
        config[section] = {**config.get(section, {}), **changes}
    config["seed"] = seed
    config["pool"] = {**config.get("pool", {}), "seed": seed}
    config["training"] = {**config.get("training", {}), "seed": seed}
    config["run_dir"] = str(out_dir / f"{arm}-seed{seed}")
    return config


def unit_still_counts(saved_config: str | None, fingerprint: str) -> bool:
    """Whether a finished unit was run with the config the bench would run now.

    The saved config is read again under today's config model: a field added
    since, at its default, then reads back as today's config and the unit still
    counts; any changed value (or a config that no longer parses) makes it stale.
    Where the run directory is does not count (it changes no result), so units
    copied to another ``--out`` still count there.
    """
    from pydantic import ValidationError

    from .config import CoevolveConfig

    if saved_config is None:
        return False
    if saved_config == fingerprint:
        return True
    try:
        saved = json.loads(CoevolveConfig.model_validate_json(saved_config).model_dump_json())
    except ValidationError:
        return False
    today = json.loads(fingerprint)
    saved.pop("run_dir", None)
    today.pop("run_dir", None)
    return saved == today


def was_killed(run_dir: Path, fingerprint: str) -> bool:
    """Whether ``run_dir`` holds a run of this unit's config that ended before its unit was saved.

    Such a run (killed by the OOM killer, a closed session) continues from its last
    finished stage instead of starting over: a GRPO unit costs half an hour here.
    """
    from .config import ConfigError, load_config
    from .runner import CHECKPOINTS

    saved = run_dir / "config.yaml"
    if not ((run_dir / CHECKPOINTS).exists() and saved.is_file()):
        return False
    try:
        saved_config = load_config(saved).model_dump_json()
    except ConfigError:
        return False
    return unit_still_counts(saved_config, fingerprint)


def run_ablation(
    base: dict[str, Any],
    *,
    seeds: list[int],
    arms: list[str],
    out_dir: Path,
    config_name: str,
    console: Any = None,
    run_missing: bool = True,
) -> AblationReport:
    """Run every (arm, seed) unit not finished before, then write the report.

    ``run_missing=False`` runs nothing: the report covers the finished units only
    (a bench run in pieces, read between them).
    """
    from .config import load_config
    from .runner import resume, run

    unknown = [arm for arm in arms if arm not in ARMS]
    if unknown:
        raise ValueError(f"unknown arms {unknown}; allowed: {', '.join(ARMS)}")
    runs: list[ArmRun] = []
    stale: list[str] = []  # units of these arms and seeds run with another config
    total = len(arms) * len(seeds)
    units = out_dir / "units"
    for seed in seeds:  # seed-major: an interrupted bench still has complete pairs
        for arm in arms:
            config = load_config(arm_config(base, arm, seed, out_dir))
            unit = units / f"{arm}-seed{seed}.json"
            fingerprint = config.model_dump_json()
            if unit.exists():
                saved = json.loads(unit.read_text())
                if unit_still_counts(saved.get("config"), fingerprint):
                    run_record = ArmRun.model_validate(saved["run"])
                    if not run_record.family_curves:  # a unit saved before they were kept
                        run_record.family_curves = family_curves_of(run_record.run_dir)
                    runs.append(run_record)
                    if console is not None:
                        console.print(
                            f"[bold]bench learning[/bold] {len(runs)}/{total}: {arm}, seed "
                            f"{seed} finished before, skipped ({unit.name})"
                        )
                    continue
                stale.append(unit.name)
            if not run_missing:
                if console is not None:
                    why = " (its unit was run with another config)" if unit.exists() else ""
                    console.print(
                        f"[bold]bench learning[/bold] {arm}, seed {seed}: not run yet{why}"
                    )
                continue
            killed = was_killed(Path(config.run_dir), fingerprint)
            if console is not None:
                again = " (resuming its killed run)" if killed else ""
                console.print(
                    f"[bold]bench learning[/bold] {len(runs) + 1}/{total}: {arm}, seed {seed}{again}"
                )
            # The arms of a seed start from the same agent: cycle 0 is evaluated once.
            shared = out_dir / "baselines"
            if killed:
                result = resume(config.run_dir, progress=False, console=None, baseline_cache=shared)
            else:
                result = run(
                    config, overwrite=True, progress=False, console=None, baseline_cache=shared
                )
            last = result.cycles[-1].evaluate
            runs.append(
                ArmRun(
                    arm=arm,
                    seed=seed,
                    success_by_cycle=result.success_by_cycle(),
                    by_family=last.by_family,
                    family_curves={
                        family: [c.evaluate.by_family.get(family, 0.0) for c in result.cycles]
                        for family in sorted(last.by_family)
                    },
                    accepted_by_cycle=[
                        c.synthesize.accepted if c.synthesize else 0 for c in result.cycles[1:]
                    ],
                    accepted_by_family=dict(
                        sum(
                            (
                                Counter(c.synthesize.by_family)
                                for c in result.cycles
                                if c.synthesize
                            ),
                            Counter(),
                        )
                    ),
                    run_dir=result.run_dir,
                    elapsed_s=result.elapsed_s,
                    resumed=result.resumed,
                )
            )
            units.mkdir(parents=True, exist_ok=True)
            unit.write_text(
                json.dumps({"config": fingerprint, "run": runs[-1].model_dump()}, indent=2)
            )
            if console is not None:
                curve = " → ".join(f"{s:.1%}" for s in runs[-1].success_by_cycle)
                console.print(f"  held-out success by cycle: {curve} [{result.elapsed_s:.0f} s]")
    if not runs:
        note = (
            f"; {len(stale)} unit(s) there ({', '.join(stale[:3])}"
            f"{', ...' if len(stale) > 3 else ''}) were run with another config: "
            "pass the --config and --set of the bench that made them"
            if stale
            else ""
        )
        raise ValueError(f"no finished units in {units} for these arms and seeds{note}")
    report = summarize(runs, arms, seeds, config_name)
    report.seed_families = seed_families(load_config(base))
    report.plot = str(plot_curves(report, out_dir / "learning_curves.png"))
    if report.family_curves:
        plot_family_curves(report, out_dir / "family_curves.png")
    if family_pairs(report):
        plot_family_differences(report, out_dir / "family_differences.png")
    (out_dir / "report.json").write_text(report.model_dump_json(indent=2))
    return report


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
        points = report.curves[arm]
        xs = list(range(len(points)))
        colour = colours(index % colours.N)
        curves.plot(xs, [100 * p.mean for p in points], marker="o", label=arm, color=colour)
        lows = [100 * p.low for p in points]
        # A two-seed t-interval (t = 12.7) spans the whole axis and hides the other arms.
        if report.final[arm].n >= MIN_SEEDS_FOR_BAND and not any(math.isnan(v) for v in lows):
            curves.fill_between(xs, lows, [100 * p.high for p in points], alpha=0.12, color=colour)
    curves.set_title(
        f"held-out success by cycle (mean; 95% CI band for arms with "
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
    bars.set_title("paired difference of final held-out success (points, 95% CI)")
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
        f"held-out success per family by cycle (mean over {_seeds(len(report.seeds))})",
        fontsize=11,
    )
    figure.tight_layout(rect=(0, 0.05, 1, 0.96))
    figure.savefig(path, dpi=90)
    plt.close(figure)
    return path


def family_pairs(report: AblationReport) -> list[str]:
    """The paired differences the per-family table and figure show: coevolve's against
    static and random when coevolve ran (the reader's first question), else every arm's
    against them. report.json keeps every pair."""
    against = [name for name in report.paired_by_family if name.split(" - ")[1] in BASELINES]
    product = [name for name in against if name.split(" - ")[0] == "coevolve"]
    return product or against


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
    axis.set_xlabel("paired difference of final held-out success (points)")
    axis.set_title(f"per family, 95% CI over {_seeds(len(report.seeds))}", fontsize=10)
    figure.legend(fontsize=8, loc="lower center", ncol=len(names))
    figure.tight_layout(rect=(0, 0.04, 1, 1))
    figure.savefig(path, dpi=90)
    plt.close(figure)
    return path


def print_report(console: Any, report: AblationReport) -> None:
    from rich.table import Table

    def fmt(i: Interval) -> str:
        if math.isnan(i.low):
            return f"{100 * i.mean:.1f}%"
        return f"{100 * i.mean:.1f}% [{100 * i.low:.1f}, {100 * i.high:.1f}]"

    table = Table(title=f"final held-out success, mean [95% CI] over seeds {report.seeds}")
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
            " → ".join(f"{100 * p.mean:.1f}" for p in report.curves[arm]),
            *(
                f"{100 * runs[s].success_by_cycle[-1]:.1f}%" if s in runs else ""
                for s in report.seeds
            ),
        )
    console.print(table)
    paired = Table(title="paired differences (arm - baseline), points of held-out success")
    paired.add_column("difference")
    paired.add_column("mean [95% CI]", justify="right")
    for name, value in report.paired.items():
        paired.add_row(name, _points(value))
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
                _seeds_text(power.seeds_for_observed),
            )
        console.print(table)
    families = sorted({f for arm in report.arms for f in report.by_family[arm]})
    if families:
        table = Table(
            title="final held-out success per family (mean over seeds); seed tasks of the "
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
                cells.append(f"{100 * report.by_family[arm][family].mean:.0f}%{extra}")
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
                family, *(_points(report.paired_by_family[name][family]) for name in against)
            )
        console.print(table)


def _seeds_text(seeds: int | None) -> str:
    return f"> {MAX_SEEDS}" if seeds is None else str(seeds)


def _points(value: Interval) -> str:
    if math.isnan(value.low):
        return f"{100 * value.mean:+.1f}"
    return f"{100 * value.mean:+.1f} [{100 * value.low:+.1f}, {100 * value.high:+.1f}]"
