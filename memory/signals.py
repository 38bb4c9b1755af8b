"""The three failure-prone-trajectory detectors: forgetting, boundary, rare.

Definitions (DESIGN.md):

* forgetting — a task (or family) scored >= 0.5 somewhere in the window of its
  last W cycle scores and now scores < 0.5: its failing trajectories of this
  cycle are flagged.
* boundary — among the K rollouts of one task in this cycle, at least one
  scored > 0.5 and at least one < 0.5: all K are flagged.
* rare — once N >= N_min patterns have been observed, a trajectory whose
  pattern p has 0 < c_p / N < theta / 100 is flagged.
* unsolved — all K rollouts of a task failed this cycle and the task's history
  has never seen it solved. Not one of the paper's three: a probe on SmolLM2
  (DESIGN.md, "Which failures the signals see") found the weakest families fail
  on all K rollouts, which none of the three flags on a first encounter.

A trajectory may carry several signals; all are kept. A per-cycle budget then
keeps the items where the failures are (``allocation``).
"""

from __future__ import annotations

import random
from collections import defaultdict
from collections.abc import Sequence
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

from ..records import (
    PAPER_SIGNAL_KINDS,
    SIGNAL_KINDS,
    FlaggedTrajectory,
    Signal,
    SignalKind,
    Trajectory,
    is_success,
)
from .history import OutcomeHistory
from .patterns import EXTRACTORS, PatternCounts, PatternKind


class SignalConfig(BaseModel):
    """How the detectors decide and how many flagged trajectories a cycle keeps."""

    model_config = ConfigDict(extra="forbid", validate_assignment=True)

    kinds: list[SignalKind] | Literal["paper"] = Field(
        default=list(SIGNAL_KINDS),
        description="Detectors to run: forgetting, boundary, rare, unsolved (drop one for an "
        "ablation), or 'paper' for exactly the paper's three (no unsolved).",
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
        default=["unsolved", "forgetting", "rare", "boundary"],
        description="Order in which kinds claim the budget (allocation per_kind), and which "
        "kind names an item flagged by several.",
    )
    allocation: Literal["failure_rate", "per_kind", "uniform"] = Field(
        default="failure_rate",
        description="How the budget is split over flagged items. failure_rate: each structure "
        "key (family) gets a share proportional to its failure rate over the cycle's rollouts, "
        "after a floor per kind; per_kind: kinds claim it in priority order; uniform: every "
        "structure key gets an equal share.",
    )
    kind_floor: int = Field(
        default=2,
        ge=0,
        description="failure_rate and uniform: items of each flagged kind kept before the "
        "split, so no kind starves.",
    )
    selection: Literal["signals", "random", "oracle"] = Field(
        default="signals",
        description="signals: synthesize from the flagged trajectories; random: from `budget` "
        "trajectories picked at random (the control arm of the learning ablation); oracle: "
        "from `budget` trajectories of the families the current agent solves less than half "
        "of on the validation split (the ablation's reference ceiling: it reads validation, "
        "so never use it to train a product agent). The detectors always run, for the record.",
    )
    oracle_threshold: float = Field(
        default=0.5,
        gt=0.0,
        le=1.0,
        description="oracle selection: a family is weak when its validation success is below this.",
    )

    @property
    def detector_kinds(self) -> list[SignalKind]:
        """The detectors to run, 'paper' spelled out (validation already does it)."""
        return list(PAPER_SIGNAL_KINDS) if self.kinds == "paper" else self.kinds

    @model_validator(mode="after")
    def _consistent(self) -> SignalConfig:
        if self.kinds == "paper":
            self.kinds = list(PAPER_SIGNAL_KINDS)
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


def detect_signals(
    trajectories: Sequence[Trajectory],
    history: OutcomeHistory,
    patterns: PatternCounts,
    config: SignalConfig,
    cycle: int,
    budgeted: bool = True,
) -> list[FlaggedTrajectory]:
    """Flag this cycle's trajectories, then record them in history and pattern counts.

    ``budgeted=False`` returns every flagged item (what the detectors found);
    ``apply_budget`` then keeps the cycle's share.

    Forgetting compares against history *before* this cycle; rare counts this
    cycle's patterns first, so a pattern seen for the first time has c_p = 1.
    Recording is idempotent per cycle, so a resumed run may call this again.
    """
    found: dict[str, list[Signal]] = defaultdict(list)
    by_task: dict[str, list[Trajectory]] = defaultdict(list)
    by_family: dict[str, list[Trajectory]] = defaultdict(list)
    for trajectory in trajectories:
        by_task[trajectory.task_id].append(trajectory)
        by_family[trajectory.family].append(trajectory)

    detected: list[tuple[SignalKind, list[tuple[Trajectory, dict]]]] = []
    if "forgetting" in config.kinds:
        detected.append(("forgetting", _forgetting(by_task, by_family, history, config, cycle)))
    if "boundary" in config.kinds:
        detected.append(("boundary", _boundary(by_task, config.success_threshold)))
    if "unsolved" in config.kinds:
        detected.append(
            ("unsolved", _unsolved(by_task, by_family, history, config.success_threshold, cycle))
        )
    extract = EXTRACTORS[config.pattern]
    observed = [extract(t) for t in trajectories]
    patterns.update(cycle, observed)
    if "rare" in config.kinds and patterns.total >= config.rare_min_observations:
        detected.append(("rare", _rare(trajectories, observed, patterns, config)))
    for kind, items in detected:
        for trajectory, evidence in items:
            found[trajectory.id].append(_signal(trajectory, kind, cycle, evidence))

    history.record(cycle, trajectories)
    flagged = [
        FlaggedTrajectory(trajectory=t, signals=found[t.id]) for t in trajectories if t.id in found
    ]
    return apply_budget(flagged, config, trajectories) if budgeted else flagged


def _forgetting(
    by_task: dict[str, list[Trajectory]],
    by_family: dict[str, list[Trajectory]],
    history: OutcomeHistory,
    config: SignalConfig,
    cycle: int,
) -> list[tuple[Trajectory, dict]]:
    """Forgetting: the failed trajectories of a task or family (``forgetting_level``) that
    reached the threshold within the history's window and is under it now."""
    threshold = config.success_threshold
    levels = (
        ("task", by_task, history.task_window),
        ("family", by_family, history.family_window),
    )
    items = []
    for level, groups, window_of in levels:
        if config.forgetting_level not in (level, "both"):
            continue
        for key, group in groups.items():
            window = window_of(key, cycle, config.window)
            now = sum(t.score for t in group) / len(group)
            if window and max(window) >= threshold and now < threshold:
                evidence = {"level": level, "key": key, "window": window, "now": now}
                items += [(t, evidence) for t in group if t.score < threshold]
    return items


def _boundary(
    by_task: dict[str, list[Trajectory]], threshold: float
) -> list[tuple[Trajectory, dict]]:
    """Boundary: every trajectory of a task whose rollouts both succeeded and failed."""
    items = []
    for task_id, group in by_task.items():
        scores = [t.score for t in group]
        if any(s > threshold for s in scores) and any(s < threshold for s in scores):
            items += [(t, {"task_id": task_id, "scores": scores}) for t in group]
    return items


def _unsolved(
    by_task: dict[str, list[Trajectory]],
    by_family: dict[str, list[Trajectory]],
    history: OutcomeHistory,
    threshold: float,
    cycle: int,
) -> list[tuple[Trajectory, dict]]:
    """Unsolved: every trajectory of a task no rollout has ever solved (one solved before
    is forgetting's business), with its family's success this cycle."""
    items = []
    for task_id, group in by_task.items():
        if any(t.score >= threshold for t in group):
            continue
        past = history.task_window(task_id, cycle, 10**6)
        if past and max(past) >= threshold:
            continue  # solved before: forgetting's business
        family = by_family[group[0].family]
        family_success = sum(t.score >= threshold for t in family) / len(family)
        evidence = {
            "task_id": task_id,
            "scores": [t.score for t in group],
            "history": past,
            # the synthesizer's step toward the task grows with this
            "family_success": family_success,
        }
        items += [(t, evidence) for t in group]
    return items


def _rare(
    trajectories: Sequence[Trajectory],
    observed: list[str],
    patterns: PatternCounts,
    config: SignalConfig,
) -> list[tuple[Trajectory, dict]]:
    """Rare: the trajectories whose pattern (``observed``, counted already) is seen in under
    ``rare_theta_percent`` of all the patterns counted."""
    limit = config.rare_theta_percent / 100
    items = []
    for trajectory, pattern in zip(trajectories, observed, strict=True):
        frequency = patterns.frequency(pattern)
        if 0 < frequency < limit:
            evidence = {
                "pattern": pattern,
                "count": patterns.counts[pattern],
                "total": patterns.total,
                "frequency": frequency,
            }
            items.append((trajectory, evidence))
    return items


def failure_rates(trajectories: Sequence[Trajectory], threshold: float = 0.5) -> dict[str, float]:
    """Share of failed rollouts per family (structure key) this cycle."""
    totals: dict[str, int] = defaultdict(int)
    failed: dict[str, int] = defaultdict(int)
    for trajectory in trajectories:
        totals[trajectory.family] += 1
        failed[trajectory.family] += trajectory.score < threshold
    return {family: failed[family] / totals[family] for family in totals}


def apply_budget(
    flagged: Sequence[FlaggedTrajectory],
    config: SignalConfig,
    trajectories: Sequence[Trajectory] = (),
) -> list[FlaggedTrajectory]:
    """Keep at most ``budget`` items (``per_task_limit`` per task), split by ``config.allocation``.

    per_kind: best priority kind first. failure_rate / uniform: ``kind_floor`` items
    of each kind first, then each family's share of the rest in proportion to its
    failure rate over ``trajectories`` (uniform: equal shares). Within a share,
    lower scores come first (clearer failures), then ids, so the choice is
    deterministic.
    """
    rank = {kind: index for index, kind in enumerate(config.priority)}

    def order(items: Sequence[FlaggedTrajectory]) -> list[FlaggedTrajectory]:
        return sorted(
            items,
            key=lambda item: (
                min(rank[k] for k in item.kinds),
                item.trajectory.score,
                item.trajectory.id,
            ),
        )

    kept: list[FlaggedTrajectory] = []
    kept_ids: set[str] = set()
    per_task: dict[str, int] = defaultdict(int)

    def take(item: FlaggedTrajectory) -> bool:
        if len(kept) >= config.budget or item.trajectory.id in kept_ids:
            return False
        if per_task[item.trajectory.task_id] >= config.per_task_limit:
            return False
        per_task[item.trajectory.task_id] += 1
        kept.append(item)
        kept_ids.add(item.trajectory.id)
        return True

    if config.allocation == "per_kind":
        for item in order(flagged):
            take(item)
        return kept

    for kind in config.priority:
        taken = 0
        for item in order([i for i in flagged if kind in i.kinds]):
            if taken >= config.kind_floor:
                break
            taken += take(item)
    rates = failure_rates(trajectories or [i.trajectory for i in flagged])
    by_family: dict[str, list[FlaggedTrajectory]] = defaultdict(list)
    for item in order(flagged):
        by_family[item.trajectory.family].append(item)
    weights = {
        family: (rates.get(family, 0.0) if config.allocation == "failure_rate" else 1.0)
        for family in by_family
    }
    # Largest-remainder shares; what a family cannot use goes to the others in later rounds.
    while len(kept) < config.budget:
        open_families = [f for f in by_family if weights[f] > 0 and by_family[f]]
        if not open_families:
            break
        room = config.budget - len(kept)
        total = sum(weights[f] for f in open_families)
        exact = {f: room * weights[f] / total for f in open_families}
        shares = {f: int(exact[f]) for f in open_families}
        for family in sorted(open_families, key=lambda f: (shares[f] - exact[f], f))[
            : room - sum(shares.values())
        ]:
            shares[family] += 1
        # Each round takes an item or empties a queue with a share, so this ends.
        for family in sorted(open_families):
            queue = by_family[family]
            taken = 0
            while queue and taken < shares[family]:
                taken += take(queue.pop(0))
    return kept


def select_random(
    trajectories: Sequence[Trajectory], config: SignalConfig, cycle: int, seed: int
) -> list[FlaggedTrajectory]:
    """``budget`` trajectories picked at random (``per_task_limit`` per task), reproducibly.

    The control of the learning ablation: synthesis from trajectories no
    detector chose. Each carries one signal of kind "random".
    """
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
        evidence = {"selected": "at random (ablation control)", "score": trajectory.score}
        kept.append(_selected(trajectory, "random", cycle, evidence))
    return kept


def _signal(trajectory: Trajectory, kind: SignalKind, cycle: int, evidence: dict) -> Signal:
    return Signal(
        kind=kind,
        trajectory_id=trajectory.id,
        task_id=trajectory.task_id,
        family=trajectory.family,
        cycle=cycle,
        evidence=evidence,
    )


def _selected(
    trajectory: Trajectory, kind: SignalKind, cycle: int, evidence: dict
) -> FlaggedTrajectory:
    """An item chosen by an ablation selection (random, oracle), not by a detector."""
    return FlaggedTrajectory(
        trajectory=trajectory, signals=[_signal(trajectory, kind, cycle, evidence)]
    )


def select_oracle(
    trajectories: Sequence[Trajectory],
    validation_success: dict[str, float],
    config: SignalConfig,
    cycle: int,
    seed: int,
) -> list[FlaggedTrajectory]:
    """``budget`` trajectories of the families weak on validation, failures first.

    The reference ceiling of the learning ablation, after the probe in DESIGN.md
    ("fresh tasks of the families under 50% on validation"): it knows which
    families the agent fails where no detector can, because it reads the
    validation split. The budget goes round-robin over the weak families, so each
    gets an equal share; within a family, failed trajectories come before solved
    ones, then a seeded shuffle. Each item carries one signal of kind "oracle".
    """
    weak = sorted(f for f, s in validation_success.items() if s < config.oracle_threshold)
    by_family: dict[str, list[Trajectory]] = defaultdict(list)
    for trajectory in sorted(trajectories, key=lambda t: t.id):
        if trajectory.family in weak:
            by_family[trajectory.family].append(trajectory)
    for family, queue in by_family.items():
        random.Random(f"oracle-selection:{seed}:{cycle}:{family}").shuffle(queue)
        queue.sort(key=lambda t: is_success(t.score))  # stable: failures first, shuffled within
    kept: list[FlaggedTrajectory] = []
    per_task: dict[str, int] = defaultdict(int)
    while len(kept) < config.budget and any(by_family.values()):
        for family in weak:
            queue = by_family.get(family, [])
            while queue and len(kept) < config.budget:
                trajectory = queue.pop(0)
                if per_task[trajectory.task_id] >= config.per_task_limit:
                    continue
                per_task[trajectory.task_id] += 1
                evidence = {
                    "selected": "family weak on validation (ablation reference)",
                    "validation_success": validation_success[family],
                    "score": trajectory.score,
                }
                kept.append(_selected(trajectory, "oracle", cycle, evidence))
                break
    return kept


def _progress(trajectory: Trajectory) -> float:
    return trajectory.progress if trajectory.progress is not None else trajectory.score


def attach_nearest_misses(
    items: Sequence[FlaggedTrajectory],
    episodes: Sequence[Trajectory],
    success_threshold: float = 1.0,
) -> list[FlaggedTrajectory]:
    """Each item with its task's nearest miss among ``episodes``, where there is one.

    The nearest miss is the failed episode (score below ``success_threshold``) of
    the same task with the highest graded progress, strictly above the flagged
    episode's own (ties: the lower id). ``episodes`` are this cycle's rollouts and,
    with hard negatives on, the failure agent's (whose misses are the near ones).
    """
    by_task: dict[str, list[Trajectory]] = defaultdict(list)
    for episode in episodes:
        if episode.score < success_threshold:
            by_task[episode.task_id].append(episode)
    linked = []
    for item in items:
        own = _progress(item.trajectory)
        closer = [
            e
            for e in by_task.get(item.trajectory.task_id, [])
            if e.id != item.trajectory.id and _progress(e) > own
        ]
        miss = min(closer, key=lambda e: (-_progress(e), e.id)) if closer else None
        linked.append(item.model_copy(update={"nearest_miss": miss}))
    return linked
