"""DPO's own knobs: ``training.dpo``, as TRL's ``DPOConfig``.

Every field with its help, and the section rejecting the combinations of its own fields
that cannot work. ``TrainingConfig`` (``training/config.py``) holds what the algorithms
share and checks the combinations across sections.
"""

from __future__ import annotations

from pydantic import Field, model_validator

from ..common.config_base import Section


class DpoConfig(Section):
    """``training.dpo``: the preference pairs of a DPO step and its temperature."""

    beta: float = Field(
        default=0.1,
        gt=0,
        description="DPO temperature: how far the policy may move from the reference (the base "
        "model with the adapter disabled). Larger stays closer.",
    )
    max_pairs_per_task: int = Field(
        default=2, gt=0, description="At most this many (success, failure) pairs per task."
    )
    micro_batch_size: int | None = Field(
        default=2,
        gt=0,
        description="Pairs per forward pass of a DPO step; the step still averages batch_size x "
        "gradient_accumulation_steps pairs by accumulating. Each pair keeps two sequences' "
        "full-vocabulary logits for the backward pass (0.4 GB a copy at 1024 tokens on "
        "SmolLM2's 49k vocabulary); 8 pairs at once were killed at 23 GiB on a 24 GB machine. "
        "Uses the largest divisor of batch_size up to this; None: batch_size pairs at once.",
    )
    loss_type: list[str] = Field(
        default_factory=lambda: ["sigmoid"],
        min_length=1,
        description="TRL's DPO losses, summed: sigmoid is DPO's own; add 'sft' for an SFT term "
        "on the chosen completion (what hard negatives' target step trains with).",
    )
    loss_weights: list[float] | None = Field(
        default=None,
        description="One weight per loss_type entry (None: 1.0 each).",
    )

    @model_validator(mode="after")
    def _consistent(self) -> DpoConfig:
        if self.loss_weights is not None and len(self.loss_weights) != len(self.loss_type):
            raise ValueError(
                f"dpo.loss_weights has {len(self.loss_weights)} weights for "
                f"{len(self.loss_type)} loss types {self.loss_type}: give one per loss type"
            )
        return self
