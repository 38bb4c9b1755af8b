"""What the loop's stages and the cycle graph's nodes share: the runtime and the run's seeding.

``CycleRuntime`` holds the heavy objects a node uses (policy, environment
factory, pool, history, pattern counts, task store, roles); it is the cycle
graph's ``context_schema``, built by ``coevolve.loop.build_runtime`` (the one
place runtimes are built). The cycle hands its synthesis pass the synthesis
graph's context (``CycleRuntime.synthesis_runtime``, a
``graph.synthesis.context.SynthesisRuntime``). ``seed_everything`` seeds Python, NumPy and
torch per (seed, cycle, stage). ``CycleRuntime.play`` stops a
stage whose endpoint gave no reply (``agents.policy.eval_report.stop_if_unreachable``).
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from ...records import Task, Trajectory
from ...run_files import CycleFiles, RunFiles
from ..synthesis.context import SynthesisRuntime

if TYPE_CHECKING:  # pragma: no cover
    from rich.console import Console

    from ...agents.policy.policy_interface import Policy
    from ...agents.roles.role_interfaces import EnvFactory, Roles
    from ...config import CoevolveConfig
    from ...memory.history import OutcomeHistory
    from ...memory.patterns import PatternCounts
    from ...memory.pool import TaskPool
    from ...memory.store import TaskStore


@dataclass
class CycleRuntime:
    """What the nodes use; built by coevolve.loop.build_runtime from a CoevolveConfig."""

    config: CoevolveConfig
    run_dir: Path
    policy: Policy  # LocalPolicy or EndpointPolicy
    make_env: EnvFactory
    pool: TaskPool
    history: OutcomeHistory
    patterns: PatternCounts
    store: TaskStore
    roles: Roles
    eval_tasks: list[Task]
    model_dir: Path | None  # the local base model, for training
    console: Console | None = None  # None: silence
    progress: bool = True
    # Where runs that start from the same local agent share their cycle-0 evaluation (the
    # bench's arms of one seed: the same model, tasks, seed and sampling); None: evaluate.
    baseline_cache: Path | None = None

    def say(self, text: str) -> None:
        if self.console is not None:
            self.console.print(text)

    def synthesis_runtime(self) -> SynthesisRuntime:
        """The context of this cycle's synthesis pass.

        A pass of the cycle may run again after a kill, so it replaces its cycle's
        stored tasks and seeds the random generators per (seed, cycle) as it starts."""
        settings = self.config.synthesis
        seed = self.config.seed
        return SynthesisRuntime(
            roles=self.roles,
            make_env=self.make_env,
            store=self.store,
            neighbours=settings.neighbours,
            max_accepted=settings.max_accepted,
            judge_veto=settings.judge_veto,
            dedup_where=(
                {"source": "synthesized"} if settings.dedup_against == "synthesized" else None
            ),
            replace_cycle=True,
            on_start=lambda cycle: seed_everything(seed, cycle, "synthesize"),
            student_success=self.student_success if settings.frontier_samples else None,
            frontier_max_solved=settings.frontier_max_solved,
        )

    async def student_success(self, tasks: Sequence[Task]) -> list[float]:
        """The share of ``synthesis.frontier_samples`` episodes, at the rollout temperature,
        in which the current policy solves each task (the frontier check). Episodes the
        endpoint gave no reply for count as not solved."""
        from ...records import is_success

        k = self.config.synthesis.frontier_samples
        played = await self.play(
            tasks,
            k=k,
            temperature=self.config.rollout.temperature,
            cycle=0,
            description="synthesis · frontier check",
        )
        # play returns each task's k episodes together, in task order.
        return [
            sum(is_success(t.score) for t in played[start : start + k]) / k
            for start in range(0, len(played), k)
        ]

    async def play(
        self,
        tasks: Sequence[Task],
        *,
        k: int,
        temperature: float | None,
        cycle: int,
        description: str,
        policy: Policy | None = None,
    ) -> list[Trajectory]:
        """``k`` episodes of every task, as every stage plays them: the run's environment,
        tool-call bound (``rollout.max_tool_calls``) and system prompt; by the run's policy,
        or ``policy`` (the hard-negatives failure agent)."""
        from ...agents.policy.rollout import play_rollouts

        trajectories = await play_rollouts(
            policy or self.policy,
            self.make_env,
            tasks,
            k=k,
            temperature=temperature,
            max_tool_calls=self.config.rollout.max_tool_calls,
            system_prompt=self.config.policy.system_prompt,
            progress=self.progress,
            cycle=cycle,
            description=description,
        )
        from ...agents.policy.eval_report import stop_if_unreachable

        stop_if_unreachable(trajectories, self.config.rollout.max_unreachable_share, description)
        return trajectories

    @property
    def run_files(self) -> RunFiles:
        """This run's files (run_files.py names them all)."""
        return RunFiles(self.run_dir)

    def files(self, cycle: int) -> CycleFiles:
        """Cycle ``cycle``'s files in this run."""
        return CycleFiles(self.run_dir, cycle)


def seed_everything(*parts: object) -> int:
    """Seed Python, NumPy and torch from the parts; returns the seed (so a rerun samples alike)."""
    from ...training.trainer_common import seed_all

    digest = hashlib.sha256(":".join(map(str, parts)).encode()).digest()
    seed = int.from_bytes(digest[:4], "big")
    seed_all(seed)
    return seed
