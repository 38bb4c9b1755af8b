"""Probe: what the composer proposes on the world, with no model at all.

    .venv/bin/python bench/compose_probe.py [--seeds 100] [--rounds 4] [--steps 6] [--json OUT]

The seed tasks are the train split's first ``--seeds``; each of them is, in turn, the
flagged item (as if it had failed), and ``ComposingExplorer`` (agents/roles/composer.py) composes
its rounds from the tool schemas, earlier results and the seed values. Each chain of two
calls or more is replayed by the executable judge (its query a placeholder: no writer
runs, so the figures are the composer's alone, before the writer's grounding and the
frontier check). Printed per flagged family:

- items, chains (rounds that kept two calls or more), calls per chain;
- replay 1.0: chains the judge accepts (sound replay, verifier score 1.00);
- whole: accepted chains whose structure is the flagged family's own (the world's
  ``structure_key``; the probe reads it to count, the composer never does);
- compound: accepted chains whose structure is a named world family of three calls or
  more (message_new_contact, buy_two, ...), whichever the flagged family.

Reads the train split only. Not run by the tests.
"""

from __future__ import annotations

import argparse
import asyncio
import json
from collections import Counter, defaultdict
from pathlib import Path
from statistics import mean


def main() -> None:
    from coevolve.agents.roles.composer import ComposingExplorer
    from coevolve.agents.roles.judge import execute_candidate
    from coevolve.agents.roles.role_interfaces import candidate_setup
    from coevolve.envs.world import WorldEnvironment, load_split
    from coevolve.envs.world.splits import structure_key
    from coevolve.records import CandidateTask, FlaggedTrajectory, SynthesisContext, Trajectory

    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--seeds", type=int, default=100)
    parser.add_argument("--rounds", type=int, default=4)
    parser.add_argument("--steps", type=int, default=6)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--json", default=None)
    args = parser.parse_args()

    seeds = load_split("train")[: args.seeds]
    composer = ComposingExplorer(seeds, rounds=args.rounds, steps=args.steps, seed=args.seed)
    named = {task.family: len(task.reference_calls) for task in load_split("train")}
    rows: dict[str, Counter] = defaultdict(Counter)
    lengths: dict[str, list[int]] = defaultdict(list)
    shapes: dict[str, Counter] = defaultdict(Counter)
    for task in seeds:
        trajectory = Trajectory(
            id=f"probe-{task.id}", task_id=task.id, env=task.env, family=task.family, score=0.0
        )
        item = FlaggedTrajectory(trajectory=trajectory, signals=[])
        rounds = asyncio.run(
            composer.explore(item, task, SynthesisContext(summary="probe"), WorldEnvironment)
        )
        row = rows[task.family]
        row["items"] += 1
        for exploration in rounds:
            calls = [i.call for i in exploration.interactions]
            if len(calls) < 2:
                row["short"] += 1
                continue
            row["chains"] += 1
            lengths[task.family].append(len(calls))
            candidate = CandidateTask(
                description="probe",
                query="(no writer in the probe)",
                minimal_actions=calls,
                setup=candidate_setup(exploration.setup),
            )
            if not execute_candidate(candidate, WorldEnvironment).verdict().success:
                continue
            row["replay 1.0"] += 1
            key = structure_key([call.name for call in calls])
            shapes[task.family][key] += 1
            row["whole"] += key == task.family
            row["compound"] += named.get(key, 0) >= 3
            row["compound " + key] += named.get(key, 0) >= 3

    header = f"{'flagged family':22} {'items':>5} {'chains':>6} {'calls/chain':>11} "
    header += f"{'replay 1.0':>10} {'whole':>5} {'compound':>8}"
    print(header)
    total: Counter = Counter()
    for family in sorted(rows):
        row = rows[family]
        total.update(row)
        per = f"{mean(lengths[family]):.2f}" if lengths[family] else "-"
        print(
            f"{family:22} {row['items']:5} {row['chains']:6} {per:>11} {row['replay 1.0']:10} "
            f"{row['whole']:5} {row['compound']:8}"
        )
    every = [n for family in lengths for n in lengths[family]]
    print(
        f"{'all':22} {total['items']:5} {total['chains']:6} "
        f"{(f'{mean(every):.2f}' if every else '-'):>11} {total['replay 1.0']:10} "
        f"{total['whole']:5} {total['compound']:8}"
    )
    compound = {k.split(" ", 1)[1]: v for k, v in total.items() if k.startswith("compound ") and v}
    print("accepted compound chains by structure:", dict(sorted(compound.items())))
    print("calls per chain:", dict(sorted(Counter(every).items())))
    if args.json:
        Path(args.json).write_text(
            json.dumps(
                {
                    "seeds": args.seeds,
                    "rounds": args.rounds,
                    "steps": args.steps,
                    "families": {f: dict(r) for f, r in rows.items()},
                    "structures": {f: dict(c) for f, c in shapes.items()},
                },
                indent=2,
            )
        )


if __name__ == "__main__":
    main()
