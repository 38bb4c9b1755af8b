"""The three failure-prone-trajectory detectors: forgetting, boundary, rare.

Definitions (DESIGN.md):

* forgetting — a task (or family) scored >= 0.5 somewhere in the window of its
  last W cycle scores and now scores < 0.5: its failing trajectories of this
  cycle are flagged.
* boundary — among the K rollouts of one task in this cycle, at least one
  scored > 0.5 and at least one < 0.5: all K are flagged.
* rare — once N >= N_min patterns have been observed, a trajectory whose
  pattern p has 0 < c_p / N < theta / 100 is flagged.

A trajectory may carry several signals; all are kept. A per-cycle budget then
keeps the highest-priority items.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Sequence
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

from ..records import SIGNAL_KINDS, Signal, SignalKind, Trajectory
from .history import OutcomeHistory
from .patterns import EXTRACTORS, PatternCounts, PatternKind


class SignalConfig(BaseModel):
    """How the detectors decide and how many flagged trajectories a cycle keeps."""

    model_config = ConfigDict(extra="forbid", validate_assignment=True)

    kinds: list[SignalKind] = Field(
        default=list(SIGNAL_KINDS), description="Detectors to run (drop one for an ablation)."
    )
    success_threshold: float = Field(
        default=0.5, gt=0.0, lt=1.0, description="Score separating success from failure."
    )
    window: int = Field(
        default=3, gt=0, description="W: past cycle scores the forgetting detector looks back on."
    )
    forgetting_level: Literal["task", "family", "both"] = Field(
        default="both", description="Detect forgetting per task, per family, or both."
    )
    rare_min_observations: int = Field(
        default=50, gt=0, description="N_min: patterns observed before the rare detector fires."
    )
    rare_theta_percent: float = Field(
        default=5.0,
        gt=0.0,
        le=100.0,
        description="theta: a pattern below theta% of all observed is rare.",
    )
    pattern: PatternKind = Field(
        default="tool_sequence", description="Pattern extractor: tool_sequence or tool_errors."
    )
    budget: int = Field(default=64, gt=0, description="Most flagged trajectories kept per cycle.")
    per_task_limit: int = Field(
        default=2,
        gt=0,
        description="Most flagged trajectories of one task kept per cycle (K would crowd the budget).",
    )
    priority: list[SignalKind] = Field(
        default=["forgetting", "rare", "boundary"],
        description="Order in which kinds claim the budget; an item counts by its best kind.",
    )
    selection: Literal["signals", "random"] = Field(
        default="signals",
        description="signals: synthesize from the flagged trajectories; random: from `budget` "
        "trajectories picked at random (the control arm of the learning ablation; the "
        "detectors still run, for the record).",
    )

    @model_validator(mode="after")
    def _consistent(self) -> SignalConfig:
        if len(set(self.priority)) != len(self.priority) or set(self.priority) != set(SIGNAL_KINDS):
            raise ValueError(f"priority must list each of {', '.join(SIGNAL_KINDS)} exactly once")
        if len(set(self.kinds)) != len(self.kinds):
            raise ValueError("kinds lists a detector twice")
        unknown = [kind for kind in self.kinds if kind not in SIGNAL_KINDS]
        if unknown:
            raise ValueError(
                f"kinds {unknown} are not detectors; allowed: {', '.join(SIGNAL_KINDS)} "
                "(for random selection set selection: random)"
            )
        return self


class FlaggedTrajectory(BaseModel):
    """A trajectory with every signal that flagged it."""

    model_config = ConfigDict(extra="forbid")

    trajectory: Trajectory
    signals: list[Signal]

    @property
    def kinds(self) -> list[SignalKind]:
        return [s.kind for s in self.signals]


def detect_signals(
    trajectories: Sequence[Trajectory],
    history: OutcomeHistory,
    patterns: PatternCounts,
    config: SignalConfig,
    cycle: int,
) -> list[FlaggedTrajectory]:
    """Flag this cycle's trajectories, then record them in history and pattern counts.

    Forgetting compares against history *before* this cycle; rare counts this
    cycle's patterns first, so a pattern seen for the first time has c_p = 1.
    Recording is idempotent per cycle, so a resumed run may call this again.
    """
    found: dict[str, list[Signal]] = defaultdict(list)
    threshold = config.success_threshold

    def flag(trajectory: Trajectory, kind: SignalKind, evidence: dict) -> None:
        found[trajectory.id].append(
            Signal(
                kind=kind,
                trajectory_id=trajectory.id,
                task_id=trajectory.task_id,
                family=trajectory.family,
                cycle=cycle,
                evidence=evidence,
            )
        )

    by_task: dict[str, list[Trajectory]] = defaultdict(list)
    by_family: dict[str, list[Trajectory]] = defaultdict(list)
    for trajectory in trajectories:
        by_task[trajectory.task_id].append(trajectory)
        by_family[trajectory.family].append(trajectory)

    if "forgetting" in config.kinds:
        groups: list[tuple[str, str, list[Trajectory], list[float]]] = []
        if config.forgetting_level in ("task", "both"):
            groups += [
                ("task", key, group, history.task_window(key, cycle, config.window))
                for key, group in by_task.items()
            ]
        if config.forgetting_level in ("family", "both"):
            groups += [
                ("family", key, group, history.family_window(key, cycle, config.window))
                for key, group in by_family.items()
            ]
        for level, key, group, window in groups:
            now = sum(t.score for t in group) / len(group)
            if window and max(window) >= threshold and now < threshold:
                for trajectory in group:
                    if trajectory.score < threshold:
                        flag(
                            trajectory,
                            "forgetting",
                            {"level": level, "key": key, "window": window, "now": now},
                        )

    if "boundary" in config.kinds:
        for task_id, group in by_task.items():
            scores = [t.score for t in group]
            if any(s > threshold for s in scores) and any(s < threshold for s in scores):
                for trajectory in group:
                    flag(trajectory, "boundary", {"task_id": task_id, "scores": scores})

    extract = EXTRACTORS[config.pattern]
    observed = [extract(t) for t in trajectories]
    patterns.update(cycle, observed)
    if "rare" in config.kinds and patterns.total >= config.rare_min_observations:
        limit = config.rare_theta_percent / 100
        for trajectory, pattern in zip(trajectories, observed, strict=True):
            frequency = patterns.frequency(pattern)
            if 0 < frequency < limit:
                flag(
                    trajectory,
                    "rare",
                    {
                        "pattern": pattern,
                        "count": patterns.counts[pattern],
                        "total": patterns.total,
                        "frequency": frequency,
                    },
                )

    history.record(cycle, trajectories)
    flagged = [
        FlaggedTrajectory(trajectory=t, signals=found[t.id]) for t in trajectories if t.id in found
    ]
    return apply_budget(flagged, config)


def apply_budget(
    flagged: Sequence[FlaggedTrajectory], config: SignalConfig
) -> list[FlaggedTrajectory]:
    """Keep at most ``budget`` items (``per_task_limit`` per task), best priority first.

    Within a kind, lower scores come first (clearer failures), then ids, so the
    choice is deterministic.
    """
    rank = {kind: index for index, kind in enumerate(config.priority)}
    ordered = sorted(
        flagged,
        key=lambda item: (
            min(rank[k] for k in item.kinds),
            item.trajectory.score,
            item.trajectory.id,
        ),
    )
    kept: list[FlaggedTrajectory] = []
    per_task: dict[str, int] = defaultdict(int)
    for item in ordered:
        if len(kept) == config.budget:
            break
        if per_task[item.trajectory.task_id] >= config.per_task_limit:
            continue
        per_task[item.trajectory.task_id] += 1
        kept.append(item)
    return kept


def select_random(
    trajectories: Sequence[Trajectory], config: SignalConfig, cycle: int, seed: int
) -> list[FlaggedTrajectory]:
    """``budget`` trajectories picked at random (``per_task_limit`` per task), reproducibly.

    The control of the learning ablation: synthesis from trajectories no
    detector chose. Each carries one signal of kind "random".
    """
    import random

    order = sorted(trajectories, key=lambda t: t.id)
    random.Random(f"random-selection:{seed}:{cycle}").shuffle(order)
    kept: list[FlaggedTrajectory] = []
    per_task: dict[str, int] = defaultdict(int)
    for trajectory in order:
        if len(kept) == config.budget:
            break
        if per_task[trajectory.task_id] >= config.per_task_limit:
            continue
        per_task[trajectory.task_id] += 1
        signal = Signal(
            kind="random",
            trajectory_id=trajectory.id,
            task_id=trajectory.task_id,
            family=trajectory.family,
            cycle=cycle,
            evidence={"selected": "at random (ablation control)", "score": trajectory.score},
        )
        kept.append(FlaggedTrajectory(trajectory=trajectory, signals=[signal]))
    return kept
