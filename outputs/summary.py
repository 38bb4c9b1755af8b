"""The figures a cycle records, stage by stage: one model per stage and the cycle's summary.

The cycle graph (graph/cycle/graph.py) builds one figures model per stage it runs and
keeps them in its state as plain dicts (``model_dump``), because the state is
checkpointed as JSON-friendly values. Everything that reads them (the runner's
``RunResult``, report.py, tracking.py, bench/learning/) parses a finished cycle
into a ``CycleSummary`` once and reads attributes.

The field names are the keys summary.json, the checkpoints and the ``coevolve
run --json`` output have always had, so run directories written before these
models existed load unchanged. Unknown keys are ignored on reading: a file from
a newer or older version still loads, with the figures this version knows.
"""

from __future__ import annotations

from collections import Counter, defaultdict
from collections.abc import Iterable, Sequence
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, model_serializer

from ..records import Task, TrainResult


class RolloutFigures(BaseModel):
    """The rollout stage: the cycle's tasks sampled from the pool, K episodes each."""

    tasks: int = Field(description="Tasks sampled from the pool this cycle.")
    seed_tasks: int = Field(description="Of them, seed tasks.")
    synthesized_tasks: int = Field(description="Of them, tasks synthesized in earlier cycles.")
    episodes: int = Field(description="Episodes that ran (tasks × rollout.k, less those left out).")
    left_out: int = Field(
        default=0,
        description="Episodes the endpoint gave no usable reply for: in no figure, signal, "
        "history or training set (cycles/NNN/unreachable.jsonl).",
    )
    success: float = Field(description="Share of the episodes that ran that succeeded.")
    diagnosis: dict[str, int] = Field(
        default_factory=dict, description="SEAL diagnosis labels over the episodes, most first."
    )
    tokens: int = Field(default=0, description="Completion tokens generated.")
    time_s: float = Field(description="Seconds the stage took.")


class FamilyFlags(BaseModel):
    """Where the flags of one task family land, before and after the synthesis budget."""

    rollout_success: float = Field(description="The family's success over this cycle's rollouts.")
    flagged: dict[str, int] = Field(
        default_factory=dict, description="Flagged items by signal kind (kinds with none left out)."
    )
    flagged_items: int = Field(default=0, description="Flagged items of the family.")
    kept: dict[str, int] = Field(
        default_factory=dict,
        description="Kept items (the budget) by kind, kinds with none left out.",
    )
    kept_items: int = Field(default=0, description="Kept items of the family.")


class SignalFigures(BaseModel):
    """The signals stage: trajectories flagged by the detectors, and those kept for synthesis."""

    flagged: int = Field(description="Items the detectors flagged.")
    kept: int = Field(description="Items kept for synthesis (the budget).")
    by_kind: dict[str, int] = Field(description="Flagged items by signal kind.")
    # Recorded since 2026-11-23: absent from runs written before.
    kept_by_kind: dict[str, int] = Field(
        default_factory=dict, description="Kept items by signal kind."
    )
    by_family: dict[str, FamilyFlags] = Field(
        default_factory=dict, description="Flags per task family."
    )
    flag_precision: float | None = Field(
        default=None,
        description="Share of kept items whose family is under 50% rollout success.",
    )
    nearest_misses: int = Field(default=0, description="Kept items with a nearest miss attached.")
    oracle_validation: dict[str, float] | None = Field(
        default=None,
        description="Oracle selection only: validation success per family it selected by.",
    )
    # graph.cycle.stages.flag_map builds the figures before the stage ends; the stage sets the time.
    time_s: float = Field(default=0.0, description="Seconds the stage took.")


class SynthesisFigures(BaseModel):
    """The synthesize stage: the synthesis graph's counts, what it accepted and why it rejected."""

    flagged: int = Field(default=0, description="Flagged items the pass read.")
    explored: int = Field(default=0, description="Items explored.")
    candidates: int = Field(default=0, description="Candidate tasks the abstractor proposed.")
    judged_ok: int = Field(default=0, description="Candidates the judge accepted.")
    at_frontier: int | None = Field(
        default=None,
        description="Judged candidates the current policy does not already solve (the "
        "frontier check, synthesis.frontier_samples); None: no check ran.",
    )
    duplicates: int = Field(default=0, description="Judged candidates dropped as duplicates.")
    accepted: int = Field(default=0, description="Tasks accepted into the store.")
    crashed: int = Field(default=0, description="Items whose branch ended in an exception.")
    by_signal: dict[str, int] = Field(default_factory=dict, description="Accepted tasks by signal.")
    by_family: dict[str, int] = Field(
        default_factory=dict,
        description="Accepted tasks by their own family: the environment's structure key (the "
        "world's family names), else their tool sequence.",
    )
    # Recorded since issue 88: absent from runs written before.
    by_parent_family: dict[str, dict[str, int]] = Field(
        default_factory=dict,
        description="Accepted tasks by the family of the seed task they descend from, then by "
        "their tool sequence (synthesized_by_parent_family).",
    )
    by_calls: dict[str, int] = Field(
        default_factory=dict, description="Accepted tasks by their number of reference calls."
    )
    candidate_kinds: dict[str, int] = Field(
        default_factory=dict, description="Candidates by 'signal:kind'."
    )
    reply_errors: dict[str, int] = Field(
        default_factory=dict,
        description="Endpoint replies the roles could not read, by kind (transport, status, "
        "body, too_long); each was retried under the endpoint's retry policy, and an item "
        "whose retries ran out is a rejection.",
    )
    tokens: dict[str, int] = Field(
        default_factory=dict,
        description="Tokens the synthesis roles' endpoints reported for their replies: "
        "'prompt' and 'completion' (empty: no role asked an endpoint, or none reported "
        "usage). The frontier check's in-process policy is not counted.",
    )
    top_rejections: dict[str, int] = Field(
        default_factory=dict, description="The three most common rejection reasons."
    )
    rejections: int = Field(default=0, description="Rejections, all stages.")
    roles: dict[str, str] = Field(default_factory=dict, description="The roles that ran.")
    removed_on_resume: int = Field(
        default=0, description="Tasks of a half-finished pass taken out of the store first."
    )
    time_s: float = Field(description="Seconds the stage took.")


def synthesized_by_parent_family(
    accepted: Sequence[Task], known: Iterable[Task]
) -> dict[str, dict[str, int]]:
    """Accepted tasks counted by the family of the seed task they descend from (a parent
    synthesized in an earlier cycle leads to its own parent, in ``known``), then by their
    tool sequence: a synthesized task's own family is its tool sequence where the
    environment has no structure key of its own, which names no seed family."""
    by_id = {task.id: task for task in known}
    counts: dict[str, Counter[str]] = defaultdict(Counter)
    for task in accepted:
        parent = by_id.get(task.parent_task_id or "")
        seen: set[str] = set()
        while parent is not None and parent.source == "synthesized" and parent.id not in seen:
            seen.add(parent.id)
            parent = by_id.get(parent.parent_task_id or "", parent)
        family = parent.family if parent is not None else UNKNOWN_PARENT
        counts[family][">".join(call.name for call in task.reference_calls)] += 1
    return {family: dict(counts[family].most_common()) for family in sorted(counts)}


# The family a synthesized task is counted under when its parent is not among the known tasks.
UNKNOWN_PARENT = "(parent unknown)"


class PoolFigures(BaseModel):
    """The update_pool stage: the training pool after the accepted tasks are added."""

    added: int = Field(description="Tasks added this cycle.")
    seed: int = Field(description="Seed tasks in the pool.")
    synthesized: int = Field(description="Synthesized tasks in the pool.")
    size: int = Field(description="Tasks in the pool.")
    time_s: float = Field(description="Seconds the stage took.")


class TrainFigures(TrainResult):
    """The train stage: the step's ``TrainResult``, the hard-negative shares, the stage's time."""

    # TrainResult forbids unknown keys (it is also the adapter's marker file); figures
    # read back from a run directory tolerate them.
    model_config = ConfigDict(extra="ignore")

    failure: TrainResult | None = Field(
        default=None, description="Hard negatives: the failure agent's step."
    )
    failure_adapter: str | None = Field(
        default=None, description="Hard negatives: the failure agent's adapter after this cycle."
    )
    hard_negatives: dict[str, Any] = Field(
        default_factory=dict,
        description="Hard negatives: shares per agent, pair counts, the failure agent's time.",
    )
    stage_time_s: float = Field(
        description="Seconds the whole stage took (train_time_s is the step alone)."
    )


class EvaluationFigures(BaseModel):
    """The evaluate stage (and the baseline): greedy held-out success."""

    success: float = Field(description="Held-out success rate.")
    tool_sequence: float = Field(description="Held-out tool-sequence accuracy.")
    calls: float = Field(description="Held-out call accuracy.")
    episodes: int = Field(description="Held-out episodes that ran (the rates' denominator).")
    left_out: int = Field(
        default=0,
        description="Held-out episodes the endpoint gave no usable reply for, left out of "
        "every rate.",
    )
    by_family: dict[str, float] = Field(
        default_factory=dict, description="Held-out success per family."
    )
    tokens: int = Field(default=0, description="Completion tokens generated.")
    time_s: float = Field(description="Seconds the stage took.")


class CycleSummary(BaseModel):
    """One finished cycle: cycle 0 is the starting policy's evaluation alone; cycle n >= 1 has
    the figures of every stage, in the order the cycle graph runs them."""

    cycle: int = Field(description="0: the baseline; n >= 1: the n-th cycle.")
    rollout: RolloutFigures | None = None
    signals: SignalFigures | None = None
    synthesize: SynthesisFigures | None = None
    pool: PoolFigures | None = None
    train: TrainFigures | None = None
    evaluate: EvaluationFigures | None = Field(
        default=None,
        description="Held-out figures; None for a cycle not evaluated (evaluation.every).",
    )
    time_s: float | None = Field(default=None, description="The baseline's seconds (cycle 0).")

    @model_serializer(mode="wrap")
    def _leave_out_missing(self, handler: Any) -> dict[str, Any]:
        # A stage that did not run is absent, as in the files written before these models.
        return {key: value for key, value in handler(self).items() if value is not None}

    def stage_seconds(self) -> dict[str, float]:
        """Seconds per stage that ran, in the graph's order (training counts its whole stage)."""
        seconds = {
            "rollout": self.rollout.time_s if self.rollout else None,
            "signals": self.signals.time_s if self.signals else None,
            "synthesize": self.synthesize.time_s if self.synthesize else None,
            "pool": self.pool.time_s if self.pool else None,
            "train": self.train.stage_time_s if self.train else None,
            "evaluate": self.evaluate.time_s if self.evaluate else None,
        }
        return {stage: value for stage, value in seconds.items() if value is not None}


class RunSummary(BaseModel):
    """A run's summary.json: every finished cycle, and the pool's counts at the end."""

    cycles: list[CycleSummary] = Field(description="Cycle 0 (the starting policy) first.")
    pool: dict[str, int] = Field(
        default_factory=dict, description="Tasks by source, synthesized ones by signal."
    )
