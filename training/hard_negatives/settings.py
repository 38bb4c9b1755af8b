"""The settings of the Co-Evolving Agents step (``HardNegativeConfig``): the failure
agent, the target's DPO + SFT objective and how their preference pairs are drawn.

Both agents train by the DPO step of ``training`` (its ``dpo.beta``, ``learning_rate``
and ``max_steps``); ``hard_negatives.failure`` overrides what differs for the failure
agent."""

from __future__ import annotations

from pydantic import Field, model_validator

from ...common.config_base import Section
from ..config import TrainingConfig


class FailureAgentConfig(Section):
    """``hard_negatives.failure``: what the failure agent's DPO step changes from
    ``training``'s (None: the same as the target's)."""

    beta: float | None = Field(
        default=None, gt=0.0, description="DPO beta of the failure agent (None: training.dpo.beta)."
    )
    learning_rate: float | None = Field(
        default=None,
        gt=0.0,
        description="Learning rate of the failure agent (None: training.learning_rate).",
    )
    max_steps: int | None = Field(
        default=None,
        gt=0,
        description="Optimisation steps of the failure agent per cycle (None: training.max_steps).",
    )


class HardNegativeConfig(Section):
    """Co-Evolving Agents: a failure agent beside the target, and the target trained on
    (expert, hard negative) pairs with DPO + SFT. Off by default."""

    enabled: bool = Field(
        default=False,
        description="Replace the cycle's training step (training.algorithm) by the target's "
        "DPO + SFT step on (expert, failure) pairs, with a failure agent when failure_agent is on.",
    )
    hard_threshold: float = Field(
        default=0.6,
        gt=0.0,
        lt=1.0,
        description="A failure whose failure grade is at least this is a hard negative (0.6 is "
        "the paper's analysis threshold). Used for the shares recorded per cycle.",
    )
    # ------------------------------------------------------------------ the failure agent
    failure_agent: bool = Field(
        default=True,
        description="Roll out and train a failure agent (a second LoRA adapter on the same base). "
        "Off: the target learns from its own failures only (the own-negatives arm).",
    )
    failure_rollouts: int | None = Field(
        default=None,
        gt=0,
        description="Episodes per task for the failure agent (None: rollout.k, as the target).",
    )
    failure_temperature: float | None = Field(
        default=None,
        ge=0.0,
        description="Sampling temperature of the failure agent's episodes (None: rollout.temperature).",
    )
    failure_pairs_per_task: int = Field(
        default=4,
        gt=0,
        description="At most this many (failure, failure) pairs per task for the failure agent; "
        "pairs with the highest-progress chosen side come first.",
    )
    failure: FailureAgentConfig = Field(
        default_factory=FailureAgentConfig,
        description="The failure agent's DPO step where it differs from training's (beta, "
        "learning_rate, max_steps; None: the target's).",
    )
    freeze_failure_after: int | None = Field(
        default=None,
        gt=0,
        description="Stop training the failure agent after this cycle (the paper's 'w/o "
        "co-evolution' ablation freezes it after cycle 1); None: it trains every cycle.",
    )
    # ------------------------------------------------------------------ the target
    sft_weight: float = Field(
        default=1.0,
        ge=0.0,
        description="lambda: weight of TRL's 'sft' term (mean NLL per chosen token) beside the "
        "sigmoid DPO term (weight 1). Not IPR's lambda: IPR sums the NLL over tokens.",
    )
    pairs_per_task: int = Field(
        default=4,
        gt=0,
        description="At most this many (expert, failure) pairs per task for the target.",
    )
    failure_share: float = Field(
        default=0.5,
        ge=0.0,
        le=1.0,
        description="Share of each task's target pairs whose rejected side is a failure-agent "
        "failure; the rest are the target's own. 0: own failures only; when one side has too "
        "few failures the other fills in, unless the share is exactly 0 or 1.",
    )
    min_negative_progress: float = Field(
        default=0.0,
        ge=0.0,
        lt=1.0,
        description="Only failures with at least this failure grade (Trajectory.failure_grade: "
        "graded progress, on the world with the reference's calls counted too) are the target's "
        "negatives (0: every failure, hardest first; hard_threshold: hard negatives only).",
    )
    truncate_extra_turns: int | None = Field(
        default=5,
        ge=0,
        description="Cut a rejected conversation to the expert's length plus this many "
        "(assistant, tool) turns, as ETO does; None: never cut.",
    )

    @model_validator(mode="after")
    def _consistent(self) -> HardNegativeConfig:
        problems = []
        if not self.failure_agent and self.failure_share > 0:
            problems.append(
                f"failure_share is {self.failure_share} but failure_agent is off, so there are "
                "no failure-agent negatives; set failure_share: 0 (own negatives only) or "
                "failure_agent: true"
            )
        if not self.failure_agent and self.freeze_failure_after is not None:
            problems.append(
                "freeze_failure_after needs a failure agent; set failure_agent: true or remove "
                "freeze_failure_after"
            )
        if not self.failure_agent:
            unused = [
                name
                for name in ("failure_rollouts", "failure_temperature")
                if getattr(self, name) is not None
            ] + [
                f"failure.{name}"
                for name in ("learning_rate", "max_steps")
                if getattr(self.failure, name) is not None
            ]
            if unused:
                problems.append(
                    f"{', '.join(unused)} set but failure_agent is off, so they do nothing; "
                    "remove them or set failure_agent: true"
                )
        if problems:
            raise ValueError("; ".join(problems))
        return self

    def target_config(self, training: TrainingConfig) -> TrainingConfig:
        """The training settings of the target's DPO + SFT step: training's own."""
        return training.model_copy(update={"algorithm": "dpo"})

    def failure_config(self, training: TrainingConfig) -> TrainingConfig:
        """The training settings of the failure agent's DPO step: training's, with
        ``failure``'s overrides."""
        failure = self.failure
        return training.model_copy(
            update={
                "algorithm": "dpo",
                "dpo": training.dpo.model_copy(update={"beta": failure.beta or training.dpo.beta}),
                "learning_rate": failure.learning_rate or training.learning_rate,
                "max_steps": failure.max_steps or training.max_steps,
            }
        )

    def trains_failure_agent(self, cycle: int) -> bool:
        return self.failure_agent and (
            self.freeze_failure_after is None or cycle <= self.freeze_failure_after
        )
