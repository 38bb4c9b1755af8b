"""Running the bench in units: one (arm, seed) run each, saved when it ends, skipped on a
rerun with the same config, and resumed when it was killed part-way."""

from __future__ import annotations

import json
import math
import shutil
from collections import Counter
from pathlib import Path
from typing import TYPE_CHECKING, Any

from pydantic import BaseModel, ConfigDict

from ...agents.policy.eval_report import split_label
from ...agents.roles.role_interfaces import FIELDS_READ_BY
from ...common.files import load_jsonl
from .arms import arm_config, check_arms
from .code import CodeAcceptance, code_fingerprint, code_label, package_commit
from .figures import plot_curves, plot_family_curves, plot_family_differences
from .report import (
    AblationReport,
    ArmRun,
    CycleSynthesis,
    CycleTraining,
    family_pairs,
    seed_families,
    summarize,
)
from .tables import curve_text

if TYPE_CHECKING:  # pragma: no cover
    from ...records import Task
    from ...runner import RunResult

# Where a unit that no longer counts goes when the bench reruns it: kept, not overwritten.
REPLACED_FOLDER = "replaced"
ACCEPTED_TASKS_SUFFIX = ".tasks.jsonl"


class AcceptedTask(BaseModel):
    """One synthesized task a unit's run accepted, as its unit keeps it (one JSON line in
    ``<arm>-seed<N>.tasks.jsonl`` beside the unit): enough to read what the arm learned
    from after its run directory is gone, not enough to replay it (no setup)."""

    model_config = ConfigDict(extra="forbid")

    id: str
    cycle: int | None
    family: str
    signal: str | None  # the signal kind of the trajectory it answers
    parent_task_id: str | None
    requests: list[str]  # the user's request of each turn (one for a single-turn task)
    calls: list[dict[str, Any]]  # its reference solution's calls, in order
    call_count: int

    @classmethod
    def of(cls, task: Task) -> AcceptedTask:
        calls = task.reference_calls
        return cls(
            id=task.id,
            cycle=task.cycle,
            family=task.family,
            signal=task.signal,
            parent_task_id=task.parent_task_id,
            requests=[turn.query for turn in task.turns],
            calls=[call.model_dump(mode="json", exclude={"id"}) for call in calls],
            call_count=len(calls),
        )


def accepted_tasks_of(unit: Path) -> list[AcceptedTask]:
    """The accepted tasks a unit file keeps beside it (``ArmRun.accepted_tasks_file``);
    FileNotFoundError for a unit saved before they were kept, naming the unit."""
    run = ArmRun.model_validate(json.loads(unit.read_text())["run"])
    if run.accepted_tasks_file is None:
        raise FileNotFoundError(
            f"{unit} keeps no accepted tasks: it was saved before units kept them (issue 71); "
            "its run directory's synthesized_tasks.jsonl has them, if it is still there"
        )
    path = unit.parent / run.accepted_tasks_file
    return load_jsonl(path, AcceptedTask)


def training_by_cycle(result: RunResult) -> list[CycleTraining]:
    """Each cycle's training step as a unit keeps it: rows by source and optimiser steps."""
    return [
        CycleTraining(
            cycle=cycle.cycle,
            algorithm=cycle.train.algorithm,
            steps=cycle.train.steps,
            rows_by_source=cycle.train.rows_by_source,
            skipped=cycle.train.skipped,
        )
        for cycle in result.cycles[1:]
        if cycle.train is not None
    ]


def synthesis_by_cycle(result: RunResult) -> list[CycleSynthesis]:
    """Each cycle's synthesize stage as a unit keeps it: the funnel, seconds and tokens."""
    return [
        CycleSynthesis.model_validate({"cycle": cycle.cycle, **cycle.synthesize.model_dump()})
        for cycle in result.cycles[1:]
        if cycle.synthesize is not None
    ]


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


def unit_still_counts(saved_config: str | None, config_now: str) -> bool:
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

    from ...agents.roles.role_interfaces import ROLE_NAMES
    from ...config import CoevolveConfig

    if saved_config is None:
        return False
    if saved_config == config_now:
        return True
    read = _as_read_today(json.loads(saved_config))
    if read is None:
        return False
    try:
        saved = CoevolveConfig.model_validate(read)
    except ValidationError:
        return False
    compared = []
    for config in (saved, CoevolveConfig.model_validate_json(config_now)):
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


# The settings of the synthesizers removed with issue 86 (the task writer, the teacher,
# composed exploration) at the values that left them off, as units saved before then hold them.
_REMOVED_ROLES_OFF = {"writer": None, "teacher": None, "composer": False}
_REMOVED_ROLES_KNOBS = (
    "writer_material",
    "writer_grounding",
    "writer_temperature",
    "writer_prompt",
    "teacher_examples",
    "teacher_temperature",
    "teacher_prompt",
)


def _as_read_today(config: dict[str, Any]) -> dict[str, Any] | None:
    """A saved config as today's config model reads it. Its synthesis roles keep only the
    settings its synthesizer reads (an offline unit's prompts changed nothing it did, and
    today's refuses them); one saved before ``synthesis.synthesizer`` existed ran the
    environment's generator unless a role named an endpoint (then the LLM roles), and
    drops the removed synthesizers' settings; a unit that ran one of those no longer
    counts (None)."""
    synthesis = dict(config.get("synthesis") or {})
    roles = dict(synthesis.get("roles") or {})
    if "synthesizer" not in synthesis:
        if any(roles.get(name, off) != off for name, off in _REMOVED_ROLES_OFF.items()):
            return None
        for name in (*_REMOVED_ROLES_OFF, *_REMOVED_ROLES_KNOBS):
            roles.pop(name, None)
        endpoint_roles = ("default_endpoint", "summarizer", "explorer", "abstractor", "judge")
        served = any(roles.get(name) not in (None, "offline") for name in endpoint_roles)
        synthesis["synthesizer"] = "llm" if served else "generator"
        config = {key: value for key, value in config.items() if key != "writer"}
    synthesizer = synthesis["synthesizer"]
    synthesis["roles"] = {
        name: value
        for name, value in roles.items()
        if synthesizer in FIELDS_READ_BY.get(name, (synthesizer,))
    }
    return {**config, "synthesis": synthesis}


def was_killed(run_dir: Path, config_now: str) -> bool:
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
    return unit_still_counts(saved_config, config_now)


def _mean_families(per_seed: list[dict[str, int]]) -> dict[str, int]:
    """Seed tasks per family, the mean over the seeds' own seed sets (rounded)."""
    families = sorted({family for counts in per_seed for family in counts})
    return {f: round(sum(c.get(f, 0) for c in per_seed) / len(per_seed)) for f in families}


def _move_aside(unit: Path, run: ArmRun | None) -> Path:
    """Move a unit that no longer counts (and its accepted tasks) to ``units/replaced/``
    before the bench reruns it: a rerun must not lose the unit it replaces."""
    folder = unit.parent / REPLACED_FOLDER
    folder.mkdir(exist_ok=True)
    mark = (run.code_fingerprint if run else None) or "unrecorded"
    target = folder / f"{unit.stem}.{mark}.json"
    number = 1
    while target.exists():
        number += 1
        target = folder / f"{unit.stem}.{mark}.{number}.json"
    if run is not None and run.accepted_tasks_file:
        tasks = unit.parent / run.accepted_tasks_file
        if tasks.exists():
            shutil.move(tasks, target.with_name(target.stem + ACCEPTED_TASKS_SUFFIX))
    shutil.move(unit, target)
    return target


def _other_code_text(run: ArmRun, today: str) -> str:
    """Why a unit of the right config does not count: the code it ran at, and the option
    that counts it."""
    commit = f", commit {run.commit[:12]}" if run.commit else ""
    if run.code_fingerprint is None:
        return (
            f"its unit records no code fingerprint (saved before they were kept{commit}): "
            "rerun it, or pass --any-code to count it"
        )
    return (
        f"its unit ran at other code ({code_label(run.code_fingerprint)}{commit}; today's is "
        f"code {today}): rerun it, or pass --accept-code {run.code_fingerprint} to count it"
    )


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
    accept_code: CodeAcceptance | None = None,
    over_arms: dict[str, dict[str, Any]] | None = None,
) -> AblationReport:
    """Run every (arm, seed) unit not finished before, then write the report.

    A finished unit counts (is skipped, and enters the report) when its config is the one
    the bench would run now (``unit_still_counts``) and it ran at today's code fingerprint
    (``code.code_fingerprint``), or at code ``accept_code`` accepts. A unit that does not
    count is rerun, the old one moved to ``units/replaced/``.

    ``run_missing=False`` runs nothing: the report covers the finished units only
    (a bench run in pieces, read between them). ``scale_arm_steps``: the arms' own step
    counts follow the base's ``training.max_steps`` (``--quick``; see ``arm_config``).
    ``seed_sets``: ``per-seed`` gives each seed its own seed subset, bootstrap agent and
    held-out draw (``arm_config``), so the report's intervals cover them too.
    ``over_arms``: by arm, sections laid over its own changes (``arm_config``).
    """
    from ...config import load_config
    from ...run_files import RunFiles
    from ...runner import resume, run

    check_arms(arms)
    accept_code = accept_code or CodeAcceptance()
    over_arms = over_arms or {}
    commit = package_commit()
    today = code_fingerprint()
    runs: list[ArmRun] = []
    stale: list[str] = []  # units of these arms and seeds run with another config
    other_code: list[ArmRun] = []  # units of the right config run at code that does not count
    total = len(arms) * len(seeds)
    units = out_dir / "units"

    def say(text: str) -> None:
        if console is not None:
            console.print(f"[bold]bench learning[/bold] {text}")

    for seed in seeds:  # seed-major: an interrupted bench still has complete pairs
        for arm in arms:
            config = load_config(
                arm_config(base, arm, seed, out_dir, scale_arm_steps, seed_sets, over_arms.get(arm))
            )
            unit = units / f"{arm}-seed{seed}.json"
            config_json = config.model_dump_json()
            why = ""  # why the saved unit, if any, does not count
            saved_run: ArmRun | None = None
            if unit.exists():
                saved = json.loads(unit.read_text())
                if unit_still_counts(saved.get("config"), config_json):
                    saved_run = ArmRun.model_validate(saved["run"])
                    if accept_code.counts(saved_run.code_fingerprint, today):
                        if not saved_run.family_curves:  # a unit saved before they were kept
                            saved_run.family_curves = family_curves_of(saved_run.run_dir)
                        runs.append(saved_run)
                        other = (
                            f", at {code_label(saved_run.code_fingerprint)} ("
                            f"{accept_code.options()})"
                            if saved_run.code_fingerprint != today
                            else ""
                        )
                        say(
                            f"{len(runs)}/{total}: {arm}, seed {seed} finished before{other}, "
                            f"skipped ({unit.name})"
                        )
                        continue
                    other_code.append(saved_run)
                    why = _other_code_text(saved_run, today)
                else:
                    stale.append(unit.name)
                    why = "its unit was run with another config"
            if not run_missing:
                say(f"{arm}, seed {seed}: not run yet" + (f" ({why})" if why else ""))
                continue
            # A saved unit means its run finished: its run directory is the old unit's, never
            # a killed run to resume (resuming would stamp the old run with today's code).
            killed = not unit.exists() and was_killed(Path(config.run_dir), config_json)
            if unit.exists():
                kept = _move_aside(unit, saved_run)
                say(f"{arm}, seed {seed}: {why}; rerunning it (the old unit is now {kept})")
            again = " (resuming its killed run)" if killed else ""
            say(f"{len(runs) + 1}/{total}: {arm}, seed {seed}{again}")
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
            units.mkdir(parents=True, exist_ok=True)
            # The accepted tasks outlive the run directory: one line each beside the unit.
            tasks_file = unit.with_name(unit.stem + ACCEPTED_TASKS_SUFFIX)
            tasks_file.write_text(
                "".join(
                    AcceptedTask.of(task).model_dump_json() + "\n"
                    for task in RunFiles(result.run_dir).read_synthesized_tasks()
                )
            )
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
                    code_fingerprint=today,
                    training_by_cycle=training_by_cycle(result),
                    synthesis_by_cycle=synthesis_by_cycle(result),
                    accepted_tasks_file=tasks_file.name,
                )
            )
            unit.write_text(
                json.dumps({"config": config_json, "run": runs[-1].model_dump()}, indent=2)
            )
            if console is not None:
                curve = curve_text(runs[-1].success_by_cycle, percent=True)
                measure = split_label(config.evaluation.split)
                console.print(f"  {measure} success by cycle: {curve} [{result.elapsed_s:.0f} s]")
    if not runs:
        notes = []
        if stale:
            notes.append(
                f"{len(stale)} unit(s) there ({', '.join(stale[:3])}"
                f"{', ...' if len(stale) > 3 else ''}) were run with another config: "
                "pass the --config and --set of the bench that made them"
            )
        if other_code:
            fingerprints = sorted({r.code_fingerprint for r in other_code if r.code_fingerprint})
            unrecorded = sum(r.code_fingerprint is None for r in other_code)
            options = [f"--accept-code {','.join(fingerprints)}"] if fingerprints else []
            options += ["--any-code"] if unrecorded else []
            notes.append(
                f"{len(other_code)} unit(s) there ran at other code than today's (code {today}"
                + (f"; {unrecorded} record no code fingerprint" if unrecorded else "")
                + f"): rerun them, or pass {' or '.join(options)} to count them"
            )
        note = "; " + "; ".join(notes) if notes else ""
        raise ValueError(f"no finished units in {units} for these arms and seeds{note}")
    report = summarize(runs, arms, seeds, config_name)
    report.code_now = today
    base_config = load_config(base)
    report.seed_sets = seed_sets
    report.seed_families = (
        seed_families(base_config)
        if seed_sets == "fixed"
        else _mean_families(
            [
                seed_families(
                    load_config(
                        arm_config(
                            base,
                            arms[0],
                            seed,
                            out_dir,
                            False,
                            seed_sets,
                            over_arms.get(arms[0]),
                        )
                    )
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
