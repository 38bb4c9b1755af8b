"""What offline synthesis makes for each signal kind, with and without steering.

    .venv/bin/python bench/candidate_kinds.py

One task per world family fails at its last call (a value not copied); the
same failing trajectory is flagged once per signal kind and goes through the
offline summarizer, explorer (random walks), abstractor and judge, with
``steer`` off (explored action windows only, the earlier behaviour) and on.
Accepted candidates are counted by kind: structure_variant / prefix /
transition (steered), and for windows value_variant (the parent's tool
sequence), sub_skill (a shorter subset of its tools), reordering, composition
(tools the parent does not use). No model is involved; it runs in seconds.
"""

import asyncio
import collections
import json

from coevolve.agents.roles.abstractor import OfflineAbstractor
from coevolve.agents.roles.explorer import OfflineExplorer
from coevolve.agents.roles.judge import ExecutableJudge
from coevolve.agents.roles.role_interfaces import AbstractionInput
from coevolve.agents.roles.summarizer import OfflineSummarizer
from coevolve.envs.world import FAMILIES, WorldEnvironment, make_task
from coevolve.records import FlaggedTrajectory, Signal, Step, ToolCall, Trajectory


def failing(task):
    env = WorldEnvironment()
    env.reset(task)
    steps = []
    calls = task.reference_calls
    for i, c in enumerate(calls):
        if i == len(calls) - 1:
            k = next(iter(c.arguments), None)
            c = ToolCall(name=c.name, arguments={**c.arguments, k: "zz9"} if k else {})
        steps.append(Step(call=c, observation=env.step(c)))
    return Trajectory(
        id=f"{task.id}/c1/r0",
        task_id=task.id,
        env="world",
        family=task.family,
        score=0.0,
        steps=steps,
        cycle=1,
    )


def classify(cand, parent):
    names = [c.name for c in cand.minimal_actions]
    pnames = [c.name for c in parent.reference_calls]
    if cand.kind != "window":
        return cand.kind
    if names == pnames:
        return "value_variant"
    if set(names) <= set(pnames):
        return "sub_skill" if len(names) < len(pnames) else "reordering"
    return "composition"


async def main():
    out: dict[str, dict] = {}
    for steer in (False, True):
        counts: dict[str, collections.Counter[str]] = collections.defaultdict(collections.Counter)
        keep: dict[str, int] = collections.defaultdict(int)
        for i, fam in enumerate(FAMILIES):
            task = make_task("train", 950 + i, fam)
            for kind in ("forgetting", "boundary", "rare", "unsolved"):
                tr = failing(task)
                item = FlaggedTrajectory(
                    trajectory=tr,
                    signals=[
                        Signal(
                            kind=kind,
                            trajectory_id=tr.id,
                            task_id=task.id,
                            family=fam,
                            cycle=1,
                            evidence={},
                        )
                    ],
                )
                ctx = await OfflineSummarizer().summarize(item, task)
                rounds = await OfflineExplorer().explore(item, task, ctx, WorldEnvironment)
                abstraction = await OfflineAbstractor(steer=steer).abstract(
                    AbstractionInput(item, task, ctx, rounds, [], WorldEnvironment)
                )
                for c in abstraction.candidates:
                    v = await ExecutableJudge().judge(c, WorldEnvironment)
                    if not v.vetoed_accepted:
                        continue
                    counts[kind][classify(c, task)] += 1
                    keep[kind] += [x.name for x in c.minimal_actions] == [
                        x.name for x in task.reference_calls
                    ]
        out["after" if steer else "before"] = {k: dict(v) for k, v in counts.items()}
        out[("after" if steer else "before") + "_keeps_parent_structure"] = dict(keep)
    print(json.dumps(out, indent=1))


if __name__ == "__main__":
    asyncio.run(main())
