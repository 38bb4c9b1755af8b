"""Per-cycle figures of the learning bench's runs, beyond held-out success.

    .venv/bin/python bench/arm_figures.py runs/bench-quickstart --arms hard-negatives,seal
    .venv/bin/python bench/arm_figures.py runs/bench-quickstart --json > figures.json

Reads each ``<out>/<arm>-seed<N>`` run directory that ``coevolve bench learning``
left (its ``metrics.jsonl`` and ``cycles/NNN/hard_negatives.json``) and prints,
per run and cycle: held-out success, training seconds and steps (seconds per
step), the diagnosis labels of the cycle's rollouts, and for the hard-negative
arms the share of failures at or above the hard threshold for the target and
the failure agent and what the failure agent cost (its rollouts and its DPO
step). The bench's units keep only success; these figures live in the run
directories, which are not committed.
"""

from __future__ import annotations

import argparse
import json
import re
from pathlib import Path
from typing import Any

from coevolve.common.files import read_jsonl
from coevolve.run_files import CycleFiles, RunFiles

RUN = re.compile(r"^(?P<arm>.+)-seed(?P<seed>\d+)$")


def cycle_figures(run_dir: Path) -> list[dict[str, Any]]:
    """One row per cycle of a finished (or running) run directory."""
    metrics = RunFiles(run_dir).metrics
    if not metrics.exists():
        return []
    rows = []
    for record in read_jsonl(metrics):
        cycle = record["cycle"]
        stage = record.get("stage_time_s") or {}
        steps = record.get("train_steps") or 0
        row: dict[str, Any] = {
            "cycle": cycle,
            "heldout": record.get("heldout_success"),
            "train_s": stage.get("train"),
            "train_steps": steps,
            "s_per_step": round(stage["train"] / steps, 1)
            if steps and stage.get("train")
            else None,
            "cycle_s": round(sum(v for v in stage.values() if v), 1) if stage else None,
            "diagnosis": record.get("diagnosis") or {},
        }
        figures = CycleFiles(run_dir, cycle).hard_negative_figures()
        if figures is not None:
            row["hard_negatives"] = {
                key: figures.get(key)
                for key in (
                    "threshold",
                    "target",
                    "failure_agent",
                    "failure_pairs",
                    "failure_pairs_with_success",
                    "target_pairs",
                    "target_pairs_by_source",
                    "failure_rollout_time_s",
                    "failure_train_time_s",
                    "failure_time_s",
                )
            }
        rows.append(row)
    return rows


def _share(value: Any) -> str:
    if isinstance(value, dict):  # {"share": ..., "hard": ..., "failures": ...}
        share, success = value.get("share"), value.get("success")
        hard = "-" if share is None else f"{100 * share:.0f}%"
        won = "" if success is None else f", {100 * success:.0f}% of its episodes succeed"
        return f"{hard} ({value.get('hard')}/{value.get('failures')} failures{won})"
    return "-" if value is None else f"{100 * value:.0f}%"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("out", type=Path, help="The bench's --out directory.")
    parser.add_argument("--arms", default=None, help="Comma-separated arms (default: all found).")
    parser.add_argument("--json", action="store_true", help="Print JSON instead of lines.")
    args = parser.parse_args()
    wanted = set(args.arms.split(",")) if args.arms else None
    runs: dict[str, dict[str, Any]] = {}
    for run_dir in sorted(p for p in args.out.iterdir() if p.is_dir()):
        match = RUN.match(run_dir.name)
        if not match or (wanted and match["arm"] not in wanted):
            continue
        rows = cycle_figures(run_dir)
        if rows:
            runs[run_dir.name] = {"arm": match["arm"], "seed": int(match["seed"]), "cycles": rows}
    if args.json:
        print(json.dumps(runs, indent=2))
        return
    for name, run in runs.items():
        print(name)
        for row in run["cycles"]:
            labels = ", ".join(
                f"{k} {v}" for k, v in sorted(row["diagnosis"].items(), key=lambda kv: -kv[1])
            )
            line = f"  cycle {row['cycle']}: held-out {100 * (row['heldout'] or 0):.1f}%"
            if row["train_steps"]:
                line += f", train {row['train_s']:.0f} s / {row['train_steps']} steps ({row['s_per_step']} s/step)"
            if row["cycle_s"]:
                line += f", cycle {row['cycle_s']:.0f} s"
            print(line)
            if labels:
                print(f"    labels: {labels}")
            hard = row.get("hard_negatives")
            if hard:
                print(
                    f"    hard-negative share: target {_share(hard['target'])}, failure agent "
                    f"{_share(hard['failure_agent'])}; failure agent {hard['failure_time_s']} s "
                    f"(rollouts {hard['failure_rollout_time_s']}, DPO {hard['failure_train_time_s']}); "
                    f"failure pairs {hard['failure_pairs']} ({hard['failure_pairs_with_success']} with a "
                    f"success), target pairs {hard['target_pairs']} {hard['target_pairs_by_source']}"
                )


if __name__ == "__main__":
    main()
