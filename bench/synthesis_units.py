"""What each bench unit's synthesis made and cost, cycle by cycle, read from the units.

    python bench/synthesis_units.py runs/bench-70-validation/units [--json OUT]

For every unit in the folder (``<arm>-seed<N>.json`` with its ``.tasks.jsonl``), one row
a cycle: the measured success after it, the funnel (flagged, candidates, judged,
at the frontier, accepted), the accepted tasks by number of calls, the whole compound
tasks among them (a family of the seed tasks with three calls or more, written whole),
the tasks in families the seed tasks lack, seconds and endpoint tokens, and ``next``: the
share of the next cycle's rollouts on the cycle's accepted tasks that succeeded, after the
cycle trained on them (read from the unit's run directory, ``<arm>-seed<N>`` beside the
units folder, when it is still there; the last cycle has none). The seed
families are the world's train split's first ``--seed-tasks`` (the bench's
``pool.seed_tasks``). Units saved before ``synthesis_by_cycle`` was kept show only
their accepted tasks.
"""

from __future__ import annotations

import argparse
import json
from collections import Counter
from pathlib import Path
from typing import Any


def seed_families(seed_tasks: int) -> dict[str, int]:
    """The seed tasks' families and their number of calls."""
    from coevolve.envs.world import load_split

    return {task.family: len(task.reference_calls) for task in load_split("train")[:seed_tasks]}


def solved_share(run_dir: Path, cycle: int, task_ids: set[str]) -> float | None:
    """Of the next cycle's rollouts on ``task_ids``, the share that succeeded (None when the
    run directory or that cycle's rollouts are gone, or none of them was rolled out)."""
    from coevolve.records import is_success
    from coevolve.run_files import CycleFiles

    episodes = [t for t in CycleFiles(run_dir, cycle + 1).rollouts() if t.task_id in task_ids]
    return sum(is_success(t.score) for t in episodes) / len(episodes) if episodes else None


def unit_rows(unit: Path, families: dict[str, int]) -> list[dict[str, Any]]:
    from coevolve.bench.learning import ArmRun, accepted_tasks_of

    run = ArmRun.model_validate(json.loads(unit.read_text())["run"])
    tasks = accepted_tasks_of(unit) if run.accepted_tasks_file else []
    synthesis = {c.cycle: c for c in run.synthesis_by_cycle}
    rows = []
    for cycle, success in enumerate(run.success_by_cycle[1:], 1):
        mine = [t for t in tasks if t.cycle == cycle]
        figures = synthesis.get(cycle)
        rows.append(
            {
                "arm": run.arm,
                "seed": run.seed,
                "cycle": cycle,
                "success": success,
                "flagged": figures.flagged if figures else None,
                "candidates": figures.candidates if figures else None,
                "judged_ok": figures.judged_ok if figures else None,
                "at_frontier": figures.at_frontier if figures else None,
                "accepted": len(mine),
                "by_calls": dict(sorted(Counter(str(t.call_count) for t in mine).items())),
                "of_seed_family": sum(t.family in families for t in mine),
                "whole_compound": sum(families.get(t.family, 0) >= 3 for t in mine),
                "next_success": solved_share(
                    unit.parent.parent / f"{run.arm}-seed{run.seed}", cycle, {t.id for t in mine}
                ),
                "absent_families": dict(
                    Counter(
                        t.family
                        for t in mine
                        if t.family not in families and not t.family.startswith("other:")
                    )
                ),
                "time_s": figures.time_s if figures else None,
                "tokens": figures.tokens if figures else {},
                "commit": run.commit,
            }
        )
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("units", type=Path, help="A bench's units folder.")
    parser.add_argument("--seed-tasks", type=int, default=100, help="pool.seed_tasks (100).")
    parser.add_argument("--json", type=Path, default=None, help="Write the rows here too.")
    args = parser.parse_args()
    families = seed_families(args.seed_tasks)
    rows = [
        row for unit in sorted(args.units.glob("*-seed*.json")) for row in unit_rows(unit, families)
    ]
    header = (
        f"{'arm':18} {'seed':>4} {'cyc':>3} {'success':>7} {'flag':>4} {'cand':>4} "
        f"{'judged':>6} {'front':>5} {'acc':>4} {'fam':>4} {'whole':>5} {'next':>6} "
        f"{'time s':>7} {'tokens':>9}  "
        "by calls / absent families"
    )
    print(header)
    for r in rows:
        tokens = sum(r["tokens"].values()) if r["tokens"] else 0
        front = "-" if r["at_frontier"] is None else r["at_frontier"]
        solved = "-" if r["next_success"] is None else f"{r['next_success']:.0%}"
        print(
            f"{r['arm']:18} {r['seed']:>4} {r['cycle']:>3} {r['success']:>7.1%} "
            f"{r['flagged'] if r['flagged'] is not None else '-':>4} "
            f"{r['candidates'] if r['candidates'] is not None else '-':>4} "
            f"{r['judged_ok'] if r['judged_ok'] is not None else '-':>6} {front:>5} "
            f"{r['accepted']:>4} {r['of_seed_family']:>4} {r['whole_compound']:>5} {solved:>6} "
            f"{r['time_s'] if r['time_s'] is not None else float('nan'):>7.0f} {tokens:>9}  "
            f"{r['by_calls']} {r['absent_families'] or ''}"
        )
    if args.json:
        args.json.write_text(json.dumps(rows, indent=2) + "\n")


if __name__ == "__main__":
    main()
