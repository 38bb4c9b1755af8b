"""Re-grade a run's saved failures with the current failure grade: hard-negative shares
and how many failure pairs are not ties.

    .venv/bin/python bench/regrade_failures.py runs/bench-quickstart/hard-negatives-seed0

Reads ``cycles/NNN/rollouts.jsonl`` (the target's episodes) and, where the run had
a failure agent, ``cycles/NNN/failure_rollouts.jsonl``, recomputes every episode's
failure grade from its task (``coevolve.envs.registry``'s ``failure_grade``), and
prints per cycle and agent: failures, their mean grade, how many are at or above the
hard threshold (the share the Co-Evolving Agents step records), how many score 0,
and the failure pairs ``failure_pairs`` draws from both agents' episodes (a pair
needs a strict grade gap: ties are dropped). Use it to see what a change of the
failure grade does to runs that already exist, without rerunning them.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

from coevolve.envs.registry import ENVIRONMENTS
from coevolve.records import Task, Trajectory
from coevolve.run_files import CycleFiles, RunFiles
from coevolve.training.hard_negatives.pairs import (
    failure_pairs,
    hard_negative_share,
    is_failure,
    with_failure_grades,
)


def regraded(episodes: list[Trajectory], tasks: dict[str, Task]) -> list[Trajectory]:
    fresh = [t.model_copy(update={"failure_grade": None}) for t in episodes]
    return with_failure_grades(fresh, tasks)


def run_tasks(run_dir: Path, task_ids: set[str]) -> dict[str, Task]:
    """The seed tasks of these ids and every task the run synthesized."""
    tasks: dict[str, Task] = {}
    for spec in ENVIRONMENTS.values():
        try:
            tasks.update(spec.seed_tasks(task_ids))
        except ImportError:  # an environment whose package is not installed
            continue
    tasks.update({task.id: task for task in RunFiles(run_dir).read_synthesized_tasks()})
    return tasks


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("run_dir", type=Path)
    parser.add_argument("--threshold", type=float, default=0.6, help="hard-negative threshold")
    parser.add_argument("--pairs-per-task", type=int, default=4)
    parser.add_argument("--json", action="store_true", help="print the figures as JSON")
    args = parser.parse_args()

    rows = []
    for files in CycleFiles.of_run(args.run_dir):
        saved_target = files.rollouts()
        if not saved_target:
            continue
        saved_failure = files.failure_rollouts()
        ids = {t.task_id for t in saved_target + saved_failure}
        tasks = run_tasks(args.run_dir, ids)
        target, failure = regraded(saved_target, tasks), regraded(saved_failure, tasks)
        row: dict[str, Any] = {"cycle": files.cycle}
        for agent, episodes in (("target", target), ("failure_agent", failure)):
            if episodes:
                zero = sum(is_failure(t) and not t.failure_grade for t in episodes)
                row[agent] = {**hard_negative_share(episodes, args.threshold), "zero": zero}
        row["failure_pairs"] = len(
            failure_pairs(target, failure, args.pairs_per_task, args.threshold)
        )
        rows.append(row)

    if args.json:
        print(json.dumps(rows, indent=2))
        return
    print(
        f"{args.run_dir.name}: failures re-graded with the current failure grade (hard >= {args.threshold})"
    )
    for row in rows:
        parts = [f"cycle {row['cycle']}:"]
        for agent in ("target", "failure_agent"):
            shares = row.get(agent)
            if shares and shares["failures"]:
                parts.append(
                    f"{agent} {shares['hard']}/{shares['failures']} hard ({shares['share']:.0%}), "
                    f"mean {shares['mean_failure_grade']:.3f}, {shares['zero']} at 0;"
                )
        parts.append(f"failure pairs {row['failure_pairs']}")
        print(" ".join(parts))


if __name__ == "__main__":
    main()
