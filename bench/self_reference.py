"""How many tasks curation's self-reference rule (agents/roles/judge.py, ``self_reference``) removes.

Three task sets, each curated as synthesis curates (the writer's grounding, then the
judge's replay), counted with and without the rule:

- the world's task writer: the requests the N = 100 writer wrote for 144 validation
  tasks' reference calls (docs/figures/writer-n100-validation.json, ``written``), each
  with its task's calls and reference answer (the file keeps the request, not the
  writer's answer line);
- the support desk's offline synthesis pass: every train seed flagged, the docstring
  describer's candidates judged by replay;
- constructed: each question seed of both environments rewritten the two ways the
  writer got wrong (``constructed``), a check that the rule catches them;
- the seed tasks themselves (world train, and every support-desk task), each as a
  candidate: none may be rejected.

    python bench/self_reference.py --json docs/figures/self-reference.json
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
from pathlib import Path

from coevolve.agents.roles.judge import SELF_REFERENTIAL, execute_candidate
from coevolve.agents.roles.role_interfaces import Interaction, candidate_setup
from coevolve.agents.roles.task_writer import ungrounded_values
from coevolve.envs.catalog import load_tasks
from coevolve.envs.registry import get_environment
from coevolve.records import CandidateTask, Task, is_success

ROOT = Path(__file__).resolve().parents[1]
WRITTEN = ROOT / "docs" / "figures" / "writer-n100-validation.json"
EXAMPLE = "examples.support_desk.env:make_env"


def as_candidate(task: Task, query: str | None = None) -> CandidateTask:
    return CandidateTask(
        description=task.family,
        query=query if query is not None else " ".join(turn.query for turn in task.turns),
        minimal_actions=task.reference_calls,
        reference_answer=task.reference_answer,
        parent_task_id=task.id,
        setup=candidate_setup(task.setup),
    )


def curate(candidate: CandidateTask, env: str) -> tuple[bool, list[str]]:
    """(accepted without the rule, the rule's reasons): grounding, then the judge's replay."""
    make_env = get_environment(env).environment
    execution = execute_candidate(candidate, make_env)
    interactions = [
        Interaction(call=s.call, observation=s.observation)
        for s in execution.steps
        if s.call is not None and not s.observation.error
    ]
    grounded = not ungrounded_values(candidate.query, interactions)
    rule = [p for p in execution.problems if p.startswith(SELF_REFERENTIAL)]
    others = [p for p in execution.problems if not p.startswith(SELF_REFERENTIAL)]
    accepted_before = grounded and execution.fatal is None and not others
    accepted_before = accepted_before and is_success(execution.score)
    return accepted_before, rule


def count(candidates: list[CandidateTask], env: str) -> dict[str, object]:
    before = removed = 0
    examples: list[dict[str, str]] = []
    for candidate in candidates:
        accepted, rule = curate(candidate, env)
        before += accepted
        if accepted and rule:
            removed += 1
            examples.append({"query": candidate.query, "reason": rule[0]})
    return {
        "candidates": len(candidates),
        "accepted_without_rule": before,
        "removed_by_rule": removed,
        "removed": examples[:10],
    }


def writer_world() -> dict[str, object]:
    written = json.loads(WRITTEN.read_text())["written"]
    tasks = {task.id: task for task in load_tasks("world", split="validation")}
    candidates = [as_candidate(tasks[row["task"]], row["written"]) for row in written]
    return count(candidates, "world")


def offline_desk() -> dict[str, object]:
    from coevolve.agents.policy.oracle import OraclePolicy
    from coevolve.agents.policy.rollout import run_rollouts
    from coevolve.graph.graph import run_synthesis
    from coevolve.loop.compose import spec_synthesis_runtime
    from coevolve.memory.signals import FlaggedTrajectory
    from coevolve.records import Signal

    spec = get_environment(EXAMPLE)
    seeds = spec.load_tasks("train", "", 0)
    trajectories = run_rollouts(OraclePolicy(), spec.environment, seeds, progress=False)
    flagged = [
        FlaggedTrajectory(
            trajectory=t,
            signals=[Signal(kind="rare", trajectory_id=t.id, task_id=t.task_id, family=t.family)],
        )
        for t in trajectories
    ]
    runtime = spec_synthesis_runtime(env=EXAMPLE, roles={"explorer_policy_rounds": 0})
    result = asyncio.run(run_synthesis(flagged, seeds, runtime, cycle=1))
    removed = [r for r in result.rejections if r.reason.startswith(SELF_REFERENTIAL)]
    return {
        "flagged": len(flagged),
        "accepted": len(result.accepted),
        "removed_by_rule": len(removed),
        "questions_accepted": sum(t.reference_answer is not None for t in result.accepted),
    }


def constructed(env: str, split: str) -> dict[str, object]:
    """Each question seed rewritten the two ways the writer got wrong: its answer the value
    its request gives (read back), and the request of the issue's library task ("I'm V.
    How many copies of V are available?", the seed's own answer kept)."""
    candidates = []
    for task in load_tasks(env, split=split):
        if task.reference_answer is None:
            continue
        given = next(iter(task.reference_calls[0].arguments.values()))
        candidate = as_candidate(task)
        candidates.append(candidate.model_copy(update={"reference_answer": str(given)}))
        query = f"I'm {given}. How many copies of {given} are available?"
        candidates.append(candidate.model_copy(update={"query": query}))
    return count(candidates, env)


def seeds_rejected() -> dict[str, object]:
    found: dict[str, object] = {}
    for env, split in (("world", "train"), (EXAMPLE, "all")):
        tasks = load_tasks(env, split=split)
        # The rule's reasons only: a multi-turn seed is no one-turn candidate otherwise.
        rejected = [t.id for t in tasks if curate(as_candidate(t), env)[1]]
        found[f"{env} {split}"] = {"tasks": len(tasks), "rejected_by_rule": rejected}
    return found


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--json", type=Path, help="write the counts here")
    args = parser.parse_args()
    os.chdir(ROOT)  # the example's import path is relative to the repository root
    report = {
        "writer_world_validation": writer_world(),
        "offline_support_desk": offline_desk(),
        "constructed_world_train": constructed("world", "train"),
        "constructed_support_desk": constructed(EXAMPLE, "all"),
        "seed_tasks": seeds_rejected(),
    }
    text = json.dumps(report, indent=2)
    print(text)
    if args.json:
        args.json.write_text(text + "\n")


if __name__ == "__main__":
    main()
