"""Running the bench in units: one (arm, seed) run each, saved when it ends, skipped on a
rerun with the same config, and resumed when it was killed part-way."""

from __future__ import annotations

import json
import math
import subprocess
import warnings
from collections import Counter
from pathlib import Path
from typing import Any

from .arms import RENAMED_ARMS, arm_config, check_arms
from .figures import plot_curves, plot_family_curves, plot_family_differences
from .report import (
    AblationReport,
    ArmRun,
    curve_text,
    family_pairs,
    seed_families,
    split_label,
    summarize,
)


def family_curves_of(run_dir: str | Path) -> dict[str, list[float]]:
    """Held-out success per family, cycle 0 first, from a run's metrics.jsonl ({} if missing)."""
    from ...common.files import read_jsonl
    from ...run_files import RunFiles

    metrics = RunFiles(run_dir).metrics
    if not metrics.exists():
        return {}
    rows = sorted(read_jsonl(metrics), key=lambda row: row.get("cycle", 0))
    families = sorted({f for row in rows for f in row.get("heldout_by_family") or {}})
    return {f: [(row.get("heldout_by_family") or {}).get(f, 0.0) for row in rows] for f in families}


def package_commit(root: Path | None = None) -> str | None:
    """The git commit of the coevolve checkout at ``root`` (default: this package), with
    ``+modified`` when tracked files differ from it; None outside a git checkout.

    A unit's config says what it ran, not which code ran it: benches run for hours from a
    worktree of a fixed commit, and the docs cite the commit beside each figure.
    """
    root = root or Path(__file__).resolve().parents[2]

    def git(*args: str) -> str | None:
        try:
            done = subprocess.run(
                ["git", "-C", str(root), *args], capture_output=True, text=True, timeout=30
            )
        except (OSError, subprocess.TimeoutExpired):
            return None
        return done.stdout.strip() if done.returncode == 0 else None

    commit = git("rev-parse", "HEAD")
    if not commit:
        return None
    changed = git("status", "--porcelain", "--untracked-files=no")
    return f"{commit}+modified" if changed else commit


def unit_still_counts(saved_config: str | None, fingerprint: str) -> bool:
    """Whether a finished unit was run with the config the bench would run now.

    The saved config is read again under today's config model: a field added
    since, at its default, then reads back as today's config and the unit still
    counts; any changed value (or a config that no longer parses) makes it stale.
    Where the run directory is does not count (it changes no result), so units
    copied to another ``--out`` still count there; nor do the GRPO settings of a
    unit that did not train with GRPO (the quickstart carries its tuned GRPO recipe),
    nor endpoints that nothing in the unit's config names (the writer's endpoint,
    given to a bench of the LLM arms, changes nothing for static's units), nor the
    prompts of synthesis roles that ran offline (no model read them).
    """
    from pydantic import ValidationError

    from ...agents.roles import ROLE_NAMES
    from ...config import CoevolveConfig

    if saved_config is None:
        return False
    if saved_config == fingerprint:
        return True
    try:
        with warnings.catch_warnings():  # a renamed key of an old unit is not the user's
            warnings.simplefilter("ignore", FutureWarning)
            saved = CoevolveConfig.model_validate_json(saved_config)
    except ValidationError:
        return False
    compared = []
    for config in (saved, CoevolveConfig.model_validate_json(fingerprint)):
        named = set(config.endpoint_references().values())
        plain = json.loads(config.model_dump_json())
        plain.pop("run_dir", None)
        training = plain.get("training", {})
        if training.get("algorithm") != "grpo":
            training.pop("grpo", None)
        plain["endpoints"] = {
            name: value for name, value in plain.get("endpoints", {}).items() if name in named
        }
        roles = plain.get("synthesis", {}).get("roles", {})
        for role in ROLE_NAMES:
            if config.synthesis.roles.endpoint_for(role) is None:
                roles.pop(f"{role}_prompt", None)
        compared.append(plain)
    return compared[0] == compared[1]


def was_killed(run_dir: Path, fingerprint: str) -> bool:
    """Whether ``run_dir`` holds a run of this unit's config that ended before its unit was saved.

    Such a run (killed by the OOM killer, a closed session) continues from its last
    finished stage instead of starting over: a GRPO unit costs half an hour here.
    """
    from ...config import ConfigError, load_config
    from ...run_files import RunFiles

    files = RunFiles(run_dir)
    saved = files.config
    if not (files.checkpoints.exists() and saved.is_file()):
        return False
    try:
        saved_config = load_config(saved).model_dump_json()
    except ConfigError:
        return False
    return unit_still_counts(saved_config, fingerprint)


def _mean_families(per_seed: list[dict[str, int]]) -> dict[str, int]:
    """Seed tasks per family, the mean over the seeds' own seed sets (rounded)."""
    families = sorted({family for counts in per_seed for family in counts})
    return {f: round(sum(c.get(f, 0) for c in per_seed) / len(per_seed)) for f in families}


def run_ablation(
    base: dict[str, Any],
    *,
    seeds: list[int],
    arms: list[str],
    out_dir: Path,
    config_name: str,
    console: Any = None,
    run_missing: bool = True,
    scale_arm_steps: bool = False,
    seed_sets: str = "fixed",
) -> AblationReport:
    """Run every (arm, seed) unit not finished before, then write the report.

    ``run_missing=False`` runs nothing: the report covers the finished units only
    (a bench run in pieces, read between them). ``scale_arm_steps``: the arms' own step
    counts follow the base's ``training.max_steps`` (``--quick``; see ``arm_config``).
    ``seed_sets``: ``per-seed`` gives each seed its own seed subset, bootstrap agent and
    held-out draw (``arm_config``), so the report's intervals cover them too.
    """
    from ...config import load_config
    from ...runner import resume, run

    check_arms(arms)
    commit = package_commit()
    runs: list[ArmRun] = []
    stale: list[str] = []  # units of these arms and seeds run with another config
    total = len(arms) * len(seeds)
    units = out_dir / "units"
    for seed in seeds:  # seed-major: an interrupted bench still has complete pairs
        for arm in arms:
            config = load_config(
                arm_config(base, arm, seed, out_dir, scale_arm_steps, seed_sets=seed_sets)
            )
            unit = units / f"{arm}-seed{seed}.json"
            # a unit saved under the arm's old name (RENAMED_ARMS) still counts, read as today's
            old = [
                units / f"{name}-seed{seed}.json"
                for name, new in RENAMED_ARMS.items()
                if new == arm
            ]
            saved_as = next((path for path in [unit, *old] if path.exists()), unit)
            fingerprint = config.model_dump_json()
            if saved_as.exists():
                saved = json.loads(saved_as.read_text())
                if unit_still_counts(saved.get("config"), fingerprint):
                    run_record = ArmRun.model_validate(saved["run"])
                    if not run_record.family_curves:  # a unit saved before they were kept
                        run_record.family_curves = family_curves_of(run_record.run_dir)
                    runs.append(run_record)
                    if console is not None:
                        console.print(
                            f"[bold]bench learning[/bold] {len(runs)}/{total}: {arm}, seed "
                            f"{seed} finished before, skipped ({saved_as.name})"
                        )
                    continue
                stale.append(saved_as.name)
            if not run_missing:
                if console is not None:
                    why = " (its unit was run with another config)" if saved_as.exists() else ""
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
            assert last is not None, "the last cycle is always evaluated"
            runs.append(
                ArmRun(
                    arm=arm,
                    seed=seed,
                    success_by_cycle=result.success_by_cycle(),
                    by_family=last.by_family,
                    family_curves={
                        family: [
                            c.evaluate.by_family.get(family, 0.0) if c.evaluate else math.nan
                            for c in result.cycles
                        ]
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
                    commit=commit,
                )
            )
            units.mkdir(parents=True, exist_ok=True)
            unit.write_text(
                json.dumps({"config": fingerprint, "run": runs[-1].model_dump()}, indent=2)
            )
            if console is not None:
                curve = curve_text(runs[-1].success_by_cycle, percent=True)
                measure = split_label(config.evaluation.split)
                console.print(f"  {measure} success by cycle: {curve} [{result.elapsed_s:.0f} s]")
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
    base_config = load_config(base)
    report.seed_sets = seed_sets
    report.seed_families = (
        seed_families(base_config)
        if seed_sets == "fixed"
        else _mean_families(
            [
                seed_families(
                    load_config(arm_config(base, arms[0], seed, out_dir, False, seed_sets))
                )
                for seed in seeds
            ]
        )
    )
    report.split = base_config.evaluation.split
    report.plot = str(plot_curves(report, out_dir / "learning_curves.png"))
    if report.family_curves:
        plot_family_curves(report, out_dir / "family_curves.png")
    if family_pairs(report):
        plot_family_differences(report, out_dir / "family_differences.png")
    (out_dir / "report.json").write_text(report.model_dump_json(indent=2))
    return report
