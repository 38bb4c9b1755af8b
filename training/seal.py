"""SEAL's diagnosis-guided advantage reweighting ("A-Patch"), static or closed-loop (dynamic).

After GRPO's group-normalised advantage ``A_j``, each trajectory's advantage is
multiplied by ``w_j = clip(mean over its labels of rho(label), min_scale,
max_scale)``; labels in ``EXCLUDED_LABELS`` (checker_error, gt_error) leave both
numerator and denominator, and a trajectory with no label left keeps ``w = 1``.
Because ``w > 0`` the advantage's sign never changes, and a group whose episodes
all score the same (``A = 0``) stays at 0.

rho defaults to SEAL's Table 6 (= ``_DEFAULT_TAG_WEIGHTS`` of the released
``apatch.py``): spurious 2.0, abstention 1.8, empty 1.5, state 1.0, response
0.9, instance 0.6, pass 1.0, any other label 1.0. The world's labels that SEAL's
code never emits get invalid_tool_call 2.0, argument_mismatch 1.5,
recovery_failure 1.2 (our choice; the paper gives no value).

**Dynamic weights** (the released full-SEAL config; the paper calls rho fixed):
once per training step, after observing that step's rollouts, every label moves
toward ``target = base * (1 + prevalence_alpha * prevalence * (1 - mean reward)
* min(1, count / confidence_samples))``, clipped to [min_scale, max_scale], by an
EMA ``w <- (1 - ema_beta) * w + ema_beta * target`` (SEAL: 0.75 old + 0.25
target). ``pass`` targets its base; excluded labels target 1. The statistics
come from the current window (reset each cycle, SEAL's epoch), or the running
totals when the window is empty.

The same weights serve SFT as per-example loss weights (``example_weights``).
"""

from __future__ import annotations

import json
from collections import Counter
from collections.abc import Sequence
from pathlib import Path
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from ..envs.adaptation import AdaptationConfig
from ..envs.diagnosis import ALL_LABELS, EXCLUDED_LABELS, PASS

SEAL_TAG_WEIGHTS: dict[str, float] = {
    "spurious_tool_call": 2.0,
    "correct_abstention": 1.8,
    "empty_turn_model_response": 1.5,
    "state_mismatch": 1.0,
    "response_mismatch": 0.9,
    "instance_mismatch": 0.6,
    "pass": 1.0,
    # Not in SEAL's released weighting path (the world's step labels): ours.
    "invalid_tool_call": 2.0,
    "argument_mismatch": 1.5,
    "recovery_failure": 1.2,
}

ApplyTo = Literal["all", "positive_advantage", "negative_advantage"]


class DynamicWeightConfig(BaseModel):
    """SEAL's closed-loop update of the label weights (``apatch.dynamic`` in exp/SEAL.yaml)."""

    model_config = ConfigDict(extra="forbid")

    enable: bool = Field(
        default=False,
        description="Move each label's weight every training step toward base x (1 + alpha x "
        "prevalence x (1 - mean reward) x confidence) by an EMA. On in SEAL's full config; off "
        "is the 'w/o closed-loop update' ablation (static weights).",
    )
    ema_beta: float = Field(
        default=0.25,
        gt=0.0,
        le=1.0,
        description="Share of the target in each update (SEAL: 0.25, i.e. 0.75 old + 0.25 target).",
    )
    prevalence_alpha: float = Field(
        default=1.0, ge=0.0, description="Strength of the prevalence x stagnation term (SEAL: 1.0)."
    )
    confidence_samples: int = Field(
        default=32,
        gt=0,
        description="A label seen this many times gets full confidence; fewer scale the change "
        "down linearly (SEAL: 32).",
    )


class ReweightConfig(BaseModel):
    """Diagnosis-guided advantage reweighting (SEAL's A-Patch)."""

    model_config = ConfigDict(extra="forbid")

    enable: bool = Field(
        default=False,
        description="Multiply each GRPO advantage (and, for SFT, each example's loss) by the "
        "trajectory's label weight. Off: plain GRPO / SFT.",
    )
    tag_weights: dict[str, float] = Field(
        default_factory=lambda: dict(SEAL_TAG_WEIGHTS),
        description="Utility rho of each diagnosis label (SEAL's Table 6 by default). Labels not "
        "listed get default_weight.",
    )
    default_weight: float = Field(
        default=1.0, gt=0.0, description="rho of a label missing from tag_weights (SEAL: 1.0)."
    )
    min_scale: float = Field(
        default=0.5, gt=0.0, description="Lower clamp of a trajectory's weight (SEAL: 0.5)."
    )
    max_scale: float = Field(
        default=2.0, gt=0.0, description="Upper clamp of a trajectory's weight (SEAL: 2.0)."
    )
    apply_to: ApplyTo = Field(
        default="all",
        description="Which advantages are scaled: all (SEAL's setting), or only positive / "
        "only negative ones (A *= 1 + (w - 1) x mask).",
    )
    dynamic: DynamicWeightConfig = Field(
        default_factory=DynamicWeightConfig,
        description="Closed-loop weight update (SEAL full config: on).",
    )

    @field_validator("tag_weights")
    @classmethod
    def _positive_known(cls, weights: dict[str, float]) -> dict[str, float]:
        bad = {label: value for label, value in weights.items() if value <= 0}
        if bad:
            raise ValueError(
                f"tag_weights must be positive (a weight <= 0 would flip or erase an advantage): "
                f"{bad}; use a small positive value such as 0.5 instead"
            )
        unknown = sorted(set(weights) - set(ALL_LABELS))
        if unknown:
            raise ValueError(
                f"unknown diagnosis labels in tag_weights: {unknown}; known labels: "
                f"{', '.join(ALL_LABELS)}"
            )
        excluded = sorted(set(weights) & EXCLUDED_LABELS)
        if excluded:
            raise ValueError(
                f"{excluded} are excluded from weighting (SEAL drops them); remove them from "
                "tag_weights"
            )
        return weights

    @model_validator(mode="after")
    def _clamp_order(self) -> ReweightConfig:
        if self.min_scale > self.max_scale:
            raise ValueError(
                f"min_scale ({self.min_scale}) is above max_scale ({self.max_scale}); set "
                "min_scale <= max_scale (SEAL: 0.5 and 2.0)"
            )
        if self.dynamic.enable and not self.enable:
            raise ValueError(
                "dynamic.enable needs enable: the dynamic update changes weights that are only "
                "used when reweighting is on; set enable: true or dynamic.enable: false"
            )
        return self

    def base(self, label: str) -> float:
        return self.tag_weights.get(label, self.default_weight)


class SealConfig(BaseModel):
    """SEAL (arXiv 2605.24426) in training: reweighting and the training-only interface."""

    model_config = ConfigDict(extra="forbid")

    reweight: ReweightConfig = Field(
        default_factory=ReweightConfig,
        description="Diagnosis-guided advantage (GRPO) / per-example loss (SFT) weights.",
    )
    adaptation: AdaptationConfig = Field(
        default_factory=AdaptationConfig,
        description="The training-only interface (schema annotations, hints, guidelines) of "
        "training episodes; evaluation always sees the raw environment.",
    )


class TagStats(BaseModel):
    """How often a label occurred and the summed verifier reward of its trajectories."""

    model_config = ConfigDict(extra="forbid")

    count: int = Field(default=0, ge=0, description="Occurrences of the label.")
    reward_sum: float = Field(
        default=0.0, description="Sum of the trajectory reward, once per occurrence."
    )

    @property
    def reward_mean(self) -> float:
        return self.reward_sum / self.count if self.count else 0.0


class CapabilityState(BaseModel):
    """SEAL's failure profile: per-label statistics (window and totals) and the current weights.

    Persisted as ``capability_state.json`` in the run directory; the window is reset
    each cycle (SEAL resets it each epoch).
    """

    model_config = ConfigDict(extra="forbid")

    window: dict[str, TagStats] = Field(
        default_factory=dict, description="Statistics since the last reset_window()."
    )
    total: dict[str, TagStats] = Field(
        default_factory=dict, description="Statistics since the state was created."
    )
    weights: dict[str, float] = Field(
        default_factory=dict,
        description="Current dynamic weight per label; a label not here uses its base weight.",
    )
    updates: int = Field(default=0, ge=0, description="Dynamic updates applied so far.")

    def observe(self, labels: Sequence[Sequence[str]], rewards: Sequence[float]) -> None:
        """Count each trajectory's labels with its reward (SEAL's TOCFStats.observe)."""
        if len(labels) != len(rewards):
            raise ValueError(f"{len(labels)} label lists but {len(rewards)} rewards")
        for trajectory_labels, reward in zip(labels, rewards, strict=True):
            for label in trajectory_labels:
                for table in (self.window, self.total):
                    stats = table.setdefault(label, TagStats())
                    stats.count += 1
                    stats.reward_sum += float(reward)

    def reset_window(self) -> None:
        self.window = {}

    def weight(self, label: str, settings: ReweightConfig) -> float:
        return self.weights.get(label, settings.base(label))

    def update_dynamic(self, settings: ReweightConfig) -> dict[str, float]:
        """One EMA step of every label's weight toward its target (module docstring)."""
        source = self.window or self.total
        total_count = sum(s.count for label, s in source.items() if label not in EXCLUDED_LABELS)
        dynamic = settings.dynamic
        for label in sorted(set(source) | set(settings.tag_weights)):
            base = settings.base(label)
            if label in EXCLUDED_LABELS:
                target = 1.0
            elif label == PASS:
                target = base
            else:
                stats = source.get(label, TagStats())
                prevalence = stats.count / total_count if total_count else 0.0
                stagnation = 1.0 - stats.reward_mean
                confidence = min(1.0, stats.count / dynamic.confidence_samples)
                target = base * (
                    1.0 + dynamic.prevalence_alpha * prevalence * stagnation * confidence
                )
            target = min(max(target, settings.min_scale), settings.max_scale)
            previous = self.weights.get(label, base)
            self.weights[label] = (1.0 - dynamic.ema_beta) * previous + dynamic.ema_beta * target
        self.updates += 1
        return dict(self.weights)

    def save(self, path: str | Path) -> None:
        from ..common.files import write_atomically

        write_atomically(path, self.model_dump_json(indent=2))

    @classmethod
    def load(cls, path: str | Path) -> CapabilityState:
        """The saved state, or a fresh one when the file does not exist."""
        path = Path(path)
        if not path.exists():
            return cls()
        return cls.model_validate(json.loads(path.read_text(encoding="utf-8")))


def trajectory_weight(
    labels: Sequence[str], settings: ReweightConfig, state: CapabilityState | None = None
) -> float:
    """``clip(mean rho(label), min_scale, max_scale)`` over non-excluded labels; 1.0 when none."""
    kept = [label for label in labels if label not in EXCLUDED_LABELS]
    if not kept:
        return 1.0
    if state is None:
        values = [settings.base(label) for label in kept]
    else:
        values = [state.weight(label, settings) for label in kept]
    mean = sum(values) / len(values)
    return min(max(mean, settings.min_scale), settings.max_scale)


def scale_advantages(
    advantages: Sequence[float], weights: Sequence[float], apply_to: ApplyTo = "all"
) -> list[float]:
    """``A * w`` (all), or ``A * (1 + (w - 1) * mask)`` for positive / negative advantages only."""
    if len(advantages) != len(weights):
        raise ValueError(f"{len(advantages)} advantages but {len(weights)} weights")
    out = []
    for advantage, weight in zip(advantages, weights, strict=True):
        if apply_to == "all":
            mask = 1.0
        elif apply_to == "positive_advantage":
            mask = float(advantage > 0)
        else:
            mask = float(advantage < 0)
        out.append(advantage * (1.0 + (weight - 1.0) * mask))
    return out


def example_weights(
    labels: Sequence[Sequence[str]],
    settings: ReweightConfig,
    state: CapabilityState | None = None,
) -> list[float]:
    """Per-example SFT loss weights: the same w_j, or all 1.0 when reweighting is off."""
    if not settings.enable:
        return [1.0] * len(labels)
    return [trajectory_weight(example, settings, state) for example in labels]


def reweight_step(
    state: CapabilityState,
    settings: ReweightConfig,
    labels: Sequence[Sequence[str]],
    rewards: Sequence[float],
    local: Sequence[Sequence[str]] | None = None,
) -> list[float]:
    """One training step's weights, as SEAL orders it: observe the step's rollouts
    (``labels``, ``rewards``: every process's), update the dynamic weights if on,
    then weigh ``local`` (this process's trajectories; default: ``labels``)."""
    state.observe(labels, rewards)
    if settings.dynamic.enable:
        state.update_dynamic(settings)
    return [trajectory_weight(example, settings, state) for example in (local or labels)]


def label_counts(labels: Sequence[Sequence[str]]) -> dict[str, int]:
    return dict(Counter(label for trajectory_labels in labels for label in trajectory_labels))
