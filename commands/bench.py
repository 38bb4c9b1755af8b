"""``coevolve bench``: benchmarks of the method itself (the learning ablation)."""

from __future__ import annotations

from typing import Annotated, Any

import typer
from rich.console import Console

from .common import PACKAGE_DIR, DebugOption, SetOption, console, display_path, fail

bench_app = typer.Typer(help="Benchmarks of the method itself.", no_args_is_help=True)


def sections_by_arm(items: list[str], arms: list[str]) -> dict[str, dict[str, Any]]:
    """``--arm-set`` items as the sections each arm's config gets over its own changes:
    ``KEY=VALUE`` for every arm of ``arms``, ``ARM:KEY=VALUE`` for one. An item for a bench
    arm that is not in ``arms`` sets nothing, so one set of options serves every piece of a
    bench run in pieces; ConfigError names an item whose arm is no bench arm or whose key is
    not a config key."""
    from ..bench.learning import ARMS
    from ..common.config_base import merged
    from ..config import ConfigError, apply_overrides

    sections: dict[str, dict[str, Any]] = {arm: {} for arm in arms}
    for item in items:
        key = item.split("=", 1)[0]
        arm, setting = item.split(":", 1) if ":" in key else ("", item)
        if arm and arm not in ARMS:
            raise ConfigError(f"--arm-set {item}: {arm!r} is not a bench arm ({', '.join(ARMS)})")
        try:  # the key is checked whether or not an arm here takes it
            section = apply_overrides({}, [setting])
        except ConfigError as err:
            raise ConfigError(str(err).replace("--set", "--arm-set", 1)) from None
        for name in ([arm] if arm in arms else []) if arm else arms:
            sections[name] = merged(sections[name], section)
    return sections


# The options of `bench learning` (its own, beside common.py's shared ones).
BenchConfigOption = Annotated[
    str | None,
    typer.Option("--config", help="Base config (default: configs/bench-learning.yaml)."),
]

SeedListOption = Annotated[
    str | None,
    typer.Option(
        help="Comma-separated seeds instead of 0..N-1, e.g. 1 for a tuning unit of seed 1 "
        "without seed 0's; the report covers these seeds."
    ),
]

ArmsOption = Annotated[
    str | None,
    typer.Option(
        help="Comma-separated arms (default: all): static, random, coevolve-oracle "
        "(synthesis by the environment's own task generator: the reference), coevolve-paper, "
        "oracle-targeted (reads validation: a reference ceiling), no-forgetting, no-boundary, "
        "no-rare, no-unsolved, grpo, grpo-spread, grpo-demonstrations, grpo-reference, seal, "
        "seal-no-reweighting, seal-no-adaptation, hard-negatives, own-negatives, "
        "coevolve-variation, random-variation (variations of the flagged / random tasks: "
        "no model, no generator). "
        "Finished (arm, seed) units are skipped on a rerun."
    ),
]

QuickOption = Annotated[
    bool,
    typer.Option(
        "--quick",
        help="Seconds-long settings (the tiny test model, one cycle, a few tasks): checks "
        "the bench runs end to end; its numbers mean nothing.",
    ),
]

SeedSetsOption = Annotated[
    str,
    typer.Option(
        help="fixed: every seed learns from the config's seed set, from one bootstrap "
        "agent, measured on one held-out set (intervals cover training seeds only); "
        "per-seed: seed s draws its tasks from the environment's generator seed s (env.seed "
        "and bootstrap.world_seed), so each seed has its own seed subset, bootstrap agent "
        "and held-out draw, and the intervals cover them too."
    ),
]

ReportOnlyOption = Annotated[
    bool,
    typer.Option(
        "--report-only",
        help="Run nothing: write the report from the units finished so far (a bench run "
        "in pieces, read between them).",
    ),
]

AcceptCodeOption = Annotated[
    list[str] | None,
    typer.Option(
        "--accept-code",
        metavar="FINGERPRINT",
        help="Also count finished units that ran at this code fingerprint (the report "
        "and the skipped units name theirs; repeat it, or comma-separate). By default a "
        "unit counts only at today's code: one verdict, one code.",
    ),
]

AnyCodeOption = Annotated[
    bool,
    typer.Option(
        "--any-code",
        help="Count finished units whatever code ran them, units that record none "
        "(saved before fingerprints were kept) included; the report warns when they mix.",
    ),
]

ArmSetOption = Annotated[
    list[str] | None,
    typer.Option(
        "--arm-set",
        metavar="KEY=VALUE",
        help="Override one config value over the arms' own changes (--set changes the "
        "base beneath them): KEY=VALUE in every arm, ARM:KEY=VALUE in one, e.g. "
        "--arm-set coevolve-variation:pool.synthesized_weight=1.0 to tune a value of one "
        "arm; repeatable, the value is YAML. Each unit's config records it.",
    ),
]


@bench_app.command("learning")
def bench_learning(
    config_path: BenchConfigOption = None,
    seeds: Annotated[int, typer.Option(help="Seeds per arm (0..N-1).")] = 3,
    seed_list: SeedListOption = None,
    arms: ArmsOption = None,
    quick: QuickOption = False,
    out: Annotated[
        str | None, typer.Option(help="Output directory (default: runs/bench-learning).")
    ] = None,
    seed_sets: SeedSetsOption = "fixed",
    as_json: Annotated[bool, typer.Option("--json", help="Print the report as JSON.")] = False,
    report_only: ReportOnlyOption = False,
    accept_code: AcceptCodeOption = None,
    any_code: AnyCodeOption = False,
    overrides: SetOption = None,
    arm_overrides: ArmSetOption = None,
    debug: DebugOption = False,
) -> None:
    """The learning ablation: static vs random vs signal-guided synthesis, same compute, over seeds."""
    from pathlib import Path

    import yaml

    from ..bench.learning import CodeAcceptance, print_report, run_ablation
    from ..bench.learning.code import parse_fingerprints
    from ..config import ConfigError

    base, source = _bench_base_config(config_path, quick, overrides)
    chosen, over_arms = _bench_arms(arms, arm_overrides)
    source += "".join(f" --arm-set {item}" for item in arm_overrides or [])
    chosen_seeds = _bench_seeds(seeds, seed_list, seed_sets)
    try:
        accepted = parse_fingerprints(accept_code or [])
    except ValueError as err:
        raise fail(f"--accept-code: {err}") from None
    out_dir = Path(out or ("runs/bench-learning-quick" if quick else "runs/bench-learning"))
    if report_only and not any((out_dir / "units").glob("*.json")):
        raise fail(f"--report-only: no finished units in {out_dir / 'units'}")
    out_dir.mkdir(parents=True, exist_ok=True)
    (out_dir / "base-config.yaml").write_text(yaml.safe_dump(base, sort_keys=False))
    quiet = Console(stderr=True) if as_json else console
    try:
        report = run_ablation(
            base,
            seeds=chosen_seeds,
            arms=chosen,
            out_dir=out_dir,
            config_name=display_path(source),
            console=quiet,
            run_missing=not report_only,
            # --quick trains a step or two a cycle: the arms' own step counts shrink with it.
            scale_arm_steps=quick,
            seed_sets=seed_sets,
            accept_code=CodeAcceptance(fingerprints=accepted, any_code=any_code),
            over_arms=over_arms,
        )
    except (ConfigError, ValueError) as err:
        raise fail(str(err)) from None
    print_report(quiet, report)
    quiet.print(f"curves: {report.plot}  report: {out_dir / 'report.json'}")
    if as_json:
        print(report.model_dump_json(indent=2))


def _bench_base_config(
    config_path: str | None, quick: bool, overrides: list[str] | None
) -> tuple[dict[str, Any], str]:
    """The bench's base config (``--config``, then ``--quick``'s settings, then ``--set``)
    and the description of where it came from, for the report."""
    from .common import load_config_or_fail

    source = config_path or str(PACKAGE_DIR / "configs" / "bench-learning.yaml")
    base = load_config_or_fail(source).model_dump(mode="json")
    if quick:
        from ..training.tiny_presets import quick_bench

        base.update(quick_bench())
        source += " (--quick)"
    if overrides:  # after --quick: what the command line sets wins
        base = load_config_or_fail(base, overrides).model_dump(mode="json")
        source += "".join(f" --set {item}" for item in overrides)
    return base, source


def _bench_arms(
    arms: str | None, arm_overrides: list[str] | None
) -> tuple[list[str], dict[str, dict[str, Any]]]:
    """The arms ``--arms`` names (default: all) and the sections ``--arm-set`` gives each;
    a bad arm or key fails here, before any unit runs."""
    from ..bench.learning import ARMS, check_arms
    from ..config import ConfigError

    chosen = [a.strip() for a in arms.split(",")] if arms else list(ARMS)
    try:
        check_arms(chosen)
    except ValueError as err:
        raise fail(str(err)) from None
    try:
        over_arms = sections_by_arm(arm_overrides or [], chosen)
    except ConfigError as err:
        raise fail(str(err)) from None
    return chosen, over_arms


def _bench_seeds(seeds: int, seed_list: str | None, seed_sets: str) -> list[int]:
    """The seeds the bench runs: ``--seed-list``, else 0..``--seeds``-1 (``--seed-sets``
    is checked here too)."""
    if seed_sets not in ("fixed", "per-seed"):
        raise fail(f"--seed-sets takes fixed or per-seed; got {seed_sets!r}")
    if seeds < 1:
        raise fail("--seeds must be at least 1 (2 or more for intervals)")
    try:
        chosen_seeds = (
            sorted({int(seed) for seed in seed_list.split(",")})
            if seed_list
            else list(range(seeds))
        )
    except ValueError:
        raise fail(f"--seed-list takes seeds like 1,3; got {seed_list!r}") from None
    if any(seed < 0 for seed in chosen_seeds):
        raise fail(f"--seed-list takes seeds from 0; got {seed_list!r}")
    return chosen_seeds


@bench_app.command("by-seed-tasks")
def bench_by_seed_tasks(
    reports: Annotated[
        list[str],
        typer.Argument(
            help="N=REPORT pairs: the seed tasks of a bench and its report.json, e.g. "
            "100=runs/bench-lowresource-n100/report.json",
            metavar="N=REPORT...",
        ),
    ],
    out: Annotated[
        str, typer.Option(help="Where to write the figure.")
    ] = "runs/bench-by-seed-tasks.png",
) -> None:
    """coevolve-oracle − static and coevolve-oracle − random against the number of seed
    tasks, one finished bench report per N: the low-resource verdict in one figure and one
    table."""
    from collections import Counter
    from pathlib import Path

    from pydantic import ValidationError
    from rich.table import Table

    from ..bench.learning import AblationReport
    from ..bench.learning.code import code_label
    from ..bench.learning.figures import VERDICT_PAIRS, plot_by_seed_tasks
    from ..bench.learning.tables import points_text

    by_size: dict[int, AblationReport] = {}
    for item in reports:
        label, _, path = item.partition("=")
        if not label.isdigit() or not path:
            raise fail(
                f"{item!r} is not N=REPORT (e.g. 100=runs/bench-lowresource-n100/report.json)"
            )
        try:
            by_size[int(label)] = AblationReport.model_validate_json(Path(path).read_text())
        except (OSError, ValidationError) as err:
            raise fail(f"{path}: not a bench report ({type(err).__name__}: {err})") from None
    table = Table(
        title="paired differences by seed tasks N (points, 95% CI; power at the paper's effect)"
    )
    table.add_column("N", justify="right")
    for name in VERDICT_PAIRS:
        table.add_column(name, justify="right")
    for size in sorted(by_size):
        report = by_size[size]
        cells = []
        for name in VERDICT_PAIRS:
            value, power = report.paired.get(name), report.power.get(name)
            if value is None:
                cells.append("")
                continue
            text = points_text(value)
            if power is not None and power.power is not None:
                text += f", power {power.power:.0%}"
            cells.append(f"{text} (n={value.n})")
        table.add_row(str(size), *cells)
    console.print(table)
    # Which code each report's units ran at: a verdict across N compares them too.
    for size in sorted(by_size):
        report = by_size[size]
        codes = report.codes or Counter(code_label(run.code_fingerprint) for run in report.runs)
        console.print(
            f"N = {size}: units by the code that ran them: "
            + ", ".join(f"{label} ({count})" for label, count in codes.items())
        )
    Path(out).parent.mkdir(parents=True, exist_ok=True)
    console.print(f"figure: {plot_by_seed_tasks(by_size, Path(out))}")
