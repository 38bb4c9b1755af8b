"""What a finished run leaves for a person: metrics.jsonl, summary.json, report.png, tables.

``cycles`` are the per-cycle summaries the cycle graph accumulates
(``coevolve.outputs.summary.CycleSummary``): cycle 0 is the starting policy's
evaluation; cycle n >= 1 has the figures of every stage (rollout, signals,
synthesize, pool, train, evaluate), each with its seconds.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from ..records import SIGNAL_KINDS
from ..run_files import RunFiles
from .report_figure import plot_report
from .summary import CycleSummary, RunSummary

# The keys of a cycle summary, in the order the cycle graph runs them.
CYCLE_STAGES = ("rollout", "signals", "synthesize", "pool", "train", "evaluate")
GENERATION_STAGES = ("rollout", "evaluate")


def overhead_share(summary: CycleSummary) -> float | None:
    """Share of a cycle spent outside generation (rollouts, evaluation) and training steps."""
    times = summary.stage_seconds()
    total = sum(times.values())
    if not total or summary.train is None:
        return None
    busy = sum(times.get(stage, 0.0) for stage in GENERATION_STAGES) + summary.train.train_time_s
    return max(total - busy, 0.0) / total


def metrics_rows(cycles: list[CycleSummary]) -> list[dict[str, Any]]:
    """One metrics.jsonl row per cycle: the figures a person plots, flattened."""
    rows = []
    for summary in cycles:
        evaluation = summary.evaluate
        rollout = summary.rollout
        signals = summary.signals
        synthesis = summary.synthesize
        pool = summary.pool
        train = summary.train
        rows.append(
            {
                "cycle": summary.cycle,
                # None for a cycle not evaluated (evaluation.every)
                "heldout_success": evaluation.success if evaluation else None,
                "heldout_tool_sequence": evaluation.tool_sequence if evaluation else None,
                "heldout_by_family": evaluation.by_family if evaluation else None,
                "rollout_success": rollout.success if rollout else None,
                "rollout_episodes": rollout.episodes if rollout else None,
                # episodes the endpoint gave no reply for, in neither figure above or below
                "rollout_left_out": rollout.left_out if rollout else None,
                "heldout_episodes": evaluation.episodes if evaluation else None,
                "heldout_left_out": evaluation.left_out if evaluation else None,
                "diagnosis": rollout.diagnosis if rollout else {},
                "signals": signals.by_kind if signals else {},
                "signals_kept": signals.kept_by_kind if signals else {},
                "flagged_kept": signals.kept if signals else None,
                "flag_precision": signals.flag_precision if signals else None,
                "flags_by_family": (
                    {f: flags.model_dump() for f, flags in signals.by_family.items()}
                    if signals
                    else {}
                ),
                # oracle selection only (the ablation's reference arm): what it targeted by
                "oracle_validation_by_family": signals.oracle_validation if signals else None,
                "accepted_by_family": synthesis.by_family if synthesis else {},
                # by the family of the seed task they descend from (runs since issue 88)
                "accepted_by_parent_family": (
                    {f: sum(seqs.values()) for f, seqs in synthesis.by_parent_family.items()}
                    if synthesis
                    else {}
                ),
                "accepted_by_parent_and_sequence": synthesis.by_parent_family if synthesis else {},
                "candidates": synthesis.candidates if synthesis else None,
                "duplicates": synthesis.duplicates if synthesis else None,
                "accepted": synthesis.accepted if synthesis else None,
                "pool_size": pool.size if pool else None,
                "pool_synthesized": pool.synthesized if pool else None,
                "train_examples": train.examples if train else None,
                "train_steps": train.steps if train else None,
                "train_loss": train.final_loss if train else None,
                "stage_time_s": summary.stage_seconds(),
                "overhead_share": overhead_share(summary),
            }
        )
    return rows


def write_report(run_dir: str | Path, cycles: list[CycleSummary], pool: Any) -> dict[str, Path]:
    """metrics.jsonl, summary.json and report.png in the run directory; returns their paths."""
    run_dir = Path(run_dir)
    rows = metrics_rows(cycles)
    files = RunFiles(run_dir)
    metrics = files.metrics
    metrics.write_text("".join(json.dumps(row) + "\n" for row in rows))
    summary = files.summary
    summary.write_text(
        RunSummary(cycles=cycles, pool=pool.counts() if pool else {}).model_dump_json(indent=2)
    )
    paths = {"metrics": metrics, "summary": summary}
    from .model_card import write_model_cards

    # Each cycle's adapter with a model card carrying its figures (outputs/model_card.py).
    write_model_cards(run_dir, rows)
    if rows:
        paths["report"] = plot_report(rows, files.report)
    return paths


# A terminal is often 100 columns wide: the per-cycle figures are split over two tables
# whose headers fit without being cut, and the per-family table keeps as many cycle
# columns as fit (cycle 0 and the latest ones), saying which it left out.
SIGNAL_HEADERS = {
    "forgetting": "forgot",
    "boundary": "bound.",
    "rare": "rare",
    "unsolved": "unsolv.",
}
FAMILY_FIXED_WIDTH = 6 + 7 + 4 + 5  # change, flagged, kept, synth: their widest text
SUMMARY_WIDTH = 100


def print_summary(
    console: Any, cycles: list[CycleSummary], pool: dict[str, int] | None = None
) -> None:
    """The tables `coevolve run` ends with, each fitting a 100-column terminal."""
    rows = metrics_rows(cycles)
    _print_cycle_table(console, rows)
    _print_signals_table(console, rows)
    families = sorted({f for row in rows for f in (row["heldout_by_family"] or {})})
    if families:
        _print_family_table(console, rows, families)
    synthesized = _synthesized_by_sequence(rows)
    if synthesized:
        console.print(synthesized)
    _print_stage_times(console, rows)
    _print_rollout_diagnosis(console, rows)
    line = synthesizer_line(cycles)
    if line is not None:
        console.print(line)
    if pool is not None:
        signals = ", ".join(f"{k.split(':')[1]} {v}" for k, v in pool.items() if ":" in k)
        console.print(
            f"pool: {pool.get('seed', 0)} seed + {pool.get('synthesized', 0)} synthesized "
            f"tasks ({signals or 'none'})"
        )


def _print_cycle_table(console: Any, rows: list[dict[str, Any]]) -> None:
    """Per cycle: held-out and rollout success, flag precision, synthesis, pool, loss and
    overhead, with the episodes left out of the rates."""
    from rich.table import Table

    table = Table(title="coevolve run: per cycle")
    for column in (
        "cycle",
        "held-out",
        "tool seq",
        "rollout",
        "flag prec.",
        "synth/acc/dup",
        "pool",
        "loss",
        "overhead",
    ):
        table.add_column(column, justify="right", no_wrap=True)
    for row in rows:
        table.add_row(
            str(row["cycle"]),
            _pct(row["heldout_success"]),
            _pct(row["heldout_tool_sequence"]),
            _pct(row["rollout_success"]),
            _pct(row["flag_precision"]) if row["cycle"] else "",
            f"{row['candidates'] or 0}/{row['accepted'] or 0}/{row['duplicates'] or 0}"
            if row["cycle"]
            else "",
            str(row["pool_size"] or ""),
            f"{row['train_loss']:.3f}" if row["train_loss"] is not None else "",
            _pct(row["overhead_share"]),
        )
    console.print(table)
    console.print(
        "held-out: greedy success on the held-out tasks; tool seq: right tool sequence; "
        "rollout: success of the cycle's rollouts; flag prec.: share of the flagged budget on "
        "families under 50% rollout success; synth/acc/dup: candidates synthesized / accepted "
        "/ dropped as duplicates; loss: final train loss; overhead: share of the cycle outside "
        "generation and optimiser steps"
    )
    lost = [
        f"cycle {row['cycle']}: {', '.join(parts)}"
        for row in rows
        if (
            parts := [
                f"{count} {stage}"
                for stage, count in (
                    ("rollout", row["rollout_left_out"]),
                    ("held-out", row["heldout_left_out"]),
                )
                if count
            ]
        )
    ]
    if lost:
        console.print(
            "episodes left out (no reply from the endpoint; in no rate above): " + "; ".join(lost)
        )


def _print_signals_table(console: Any, rows: list[dict[str, Any]]) -> None:
    """The signals flagged per cycle, by kind (no table before the first cycle)."""
    from rich.table import Table

    signals_table = Table(title="signals flagged per cycle, by kind")
    signals_table.add_column("cycle", justify="right", no_wrap=True)
    for kind in SIGNAL_KINDS:
        signals_table.add_column(SIGNAL_HEADERS.get(kind, kind), justify="right", no_wrap=True)
    signals_table.add_column("flagged / kept", justify="right", no_wrap=True)
    for row in rows:
        if not row["cycle"]:
            continue
        signals = row["signals"] or {}
        signals_table.add_row(
            str(row["cycle"]),
            *(str(signals.get(kind, "")) for kind in SIGNAL_KINDS),
            f"{sum(signals.values())} / {row['flagged_kept'] or 0}",
        )
    if signals_table.row_count:
        console.print(signals_table)
        console.print(
            "forgot: forgetting; bound.: boundary (mixed outcomes among the K rollouts); "
            "rare: rare families; unsolv.: unsolved"
        )


def _print_family_table(console: Any, rows: list[dict[str, Any]], families: list[str]) -> None:
    """Held-out success per family by cycle (the cycles that fit the terminal), with what
    the signals did about each family."""
    from rich.table import Table

    evaluated = [row for row in rows if row["heldout_by_family"]]
    shown = _cycle_columns_that_fit(evaluated, families, console)
    by_family = Table(
        title="held-out success per family by cycle, and what the signals did about it "
        "(flagged / kept items, accepted synthesized tasks, summed over cycles)"
    )
    by_family.add_column("family", no_wrap=True)
    for row in shown:
        by_family.add_column(f"c{row['cycle']}", justify="right", no_wrap=True)
    for column in ("change", "flagged", "kept", "synth"):
        by_family.add_column(column, justify="right", no_wrap=True)
    for family in families:
        scores = [(row["heldout_by_family"] or {}).get(family) for row in evaluated]
        change = (
            f"{100 * (scores[-1] - scores[0]):+.1f}"
            if len(scores) > 1 and scores[0] is not None and scores[-1] is not None
            else ""
        )
        flags = [((row["flags_by_family"] or {}).get(family) or {}) for row in rows]
        by_family.add_row(
            family,
            *(_pct((row["heldout_by_family"] or {}).get(family)) for row in shown),
            change,
            str(sum(f.get("flagged_items", 0) for f in flags)),
            str(sum(f.get("kept_items", 0) for f in flags)),
            str(sum(_synthesized_of(row).get(family, 0) for row in rows)),
        )
    console.print(by_family)
    left_out = [row["cycle"] for row in evaluated if row not in shown]
    console.print(
        "cN: held-out success after cycle N; change: last evaluated cycle minus cycle 0, "
        "in points; synth: accepted synthesized tasks descended from the family's tasks"
        + (
            f"; cycles {', '.join(map(str, left_out))} left out to fit (metrics.jsonl has them)"
            if left_out
            else ""
        )
    )


def _print_stage_times(console: Any, rows: list[dict[str, Any]]) -> None:
    """Seconds per stage of each cycle, with their share of the cycle."""
    from rich.table import Table

    times = Table(title="seconds per stage (share of the cycle)")
    times.add_column("cycle", justify="right", no_wrap=True)
    for stage in (*CYCLE_STAGES, "total"):
        times.add_column(stage, justify="right", no_wrap=True)
    for row in rows:
        seconds = row["stage_time_s"]
        total = sum(seconds.values())
        times.add_row(
            str(row["cycle"]),
            *(
                f"{_seconds(seconds[s])} ({100 * seconds[s] / total:.0f}%)" if s in seconds else ""
                for s in CYCLE_STAGES
            ),
            _seconds(total),
        )
    console.print(times)


def _print_rollout_diagnosis(console: Any, rows: list[dict[str, Any]]) -> None:
    """Each cycle's most frequent SEAL labels of its rollouts (up to six)."""
    for row in rows:
        if row["diagnosis"]:
            labels = ", ".join(
                f"{label} {count}" for label, count in list(row["diagnosis"].items())[:6]
            )
            console.print(f"cycle {row['cycle']} rollout diagnosis (SEAL labels): {labels}")


# Candidate kinds the environment's own task generator makes (OfflineAbstractor, steered):
# a figure learnt from them rests on that generator, which a user's environment lacks.
GENERATOR_KINDS = frozenset({"structure_variant", "prefix", "transition"})


def _synthesized_of(row: dict[str, Any]) -> dict[str, int]:
    """A cycle's accepted tasks per family of their parent; a run written before that was
    recorded gives them by their own family (a tool sequence, outside the world)."""
    return row.get("accepted_by_parent_family") or row["accepted_by_family"] or {}


def _synthesized_by_sequence(rows: list[dict[str, Any]]) -> Any:
    """The accepted synthesized tasks, summed over cycles, by their parent's family and their
    own tool sequence: a rich Table, or None when the run recorded none."""
    from rich.table import Table

    counts: dict[tuple[str, str], int] = {}
    for row in rows:
        for family, sequences in (row.get("accepted_by_parent_and_sequence") or {}).items():
            for sequence, count in sequences.items():
                counts[(family, sequence)] = counts.get((family, sequence), 0) + count
    if not counts:
        return None
    table = Table(title="synthesized tasks by the family of their parent, and their tool sequence")
    for column in ("family", "tool sequence"):
        table.add_column(column, no_wrap=column == "family")
    table.add_column("tasks", justify="right", no_wrap=True)
    for (family, sequence), count in sorted(
        counts.items(), key=lambda item: (item[0][0], -item[1])
    ):
        table.add_row(family, sequence, str(count))
    return table


def synthesizer_line(cycles: list[CycleSummary]) -> str | None:
    """Which synthesizer made the run's tasks, in one line: every figure says which."""
    ran = [c.synthesize for c in cycles if c.synthesize is not None]
    if not ran:
        return None
    abstractor = ran[-1].roles.get("abstractor", "?")
    kinds: dict[str, int] = {}
    for figures in ran:
        for key, count in figures.candidate_kinds.items():
            kind = key.rsplit(":", 1)[-1]
            kinds[kind] = kinds.get(kind, 0) + count
    generated = sum(count for kind, count in kinds.items() if kind in GENERATOR_KINDS)
    synthesizer = ran[-1].roles.get("synthesizer")
    if synthesizer == "variation":
        how = "variations of the failed tasks (their calls with new values): no model, no task generator"
    elif synthesizer == "llm" or abstractor.startswith("abstractor:llm("):
        how = "the LLM roles on their endpoints: no task generator"
    elif generated:
        how = (
            f"the environment's own task generator ({generated} of "
            f"{sum(kinds.values())} candidates: structure variants, prefixes, transitions), "
            "which a user's environment does not have"
        )
    else:
        how = "explored windows described by the environment: no task generator"
    name = synthesizer or abstractor
    return f"synthesizer: {name}: {how}"


def _cycle_columns_that_fit(
    evaluated: list[dict[str, Any]], families: list[str], console: Any
) -> list[dict[str, Any]]:
    """The evaluated cycles the per-family table shows: all of them if they fit the console
    (at most 100 columns), else cycle 0 and as many of the latest as fit."""
    width = min(getattr(console, "width", SUMMARY_WIDTH) or SUMMARY_WIDTH, SUMMARY_WIDTH)
    # each column takes its text plus 3 (padding and a border); the table one more border
    fixed = max(len(f) for f in families) + 3 + FAMILY_FIXED_WIDTH + 4 * 3 + 1
    fits = max((width - fixed) // (len("100.0%") + 3), 2)
    if len(evaluated) <= fits:
        return evaluated
    return [evaluated[0], *evaluated[len(evaluated) - (fits - 1) :]]


def _seconds(value: float) -> str:
    """Seconds in at most 5 characters below 100,000 s: 20.0, 123, 4567."""
    return f"{value:.1f}" if value < 100 else f"{value:.0f}"


def _pct(value: float | None) -> str:
    return "" if value is None else f"{100 * value:.1f}%"
