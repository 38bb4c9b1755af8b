"""SFT's own knobs: ``training.sft``, as TRL's ``SFTConfig``.

Every field with its help. ``TrainingConfig`` (``training/config.py``) holds what the
algorithms share and checks the combinations across sections.
"""

from __future__ import annotations

from typing import Literal

from pydantic import Field

from ..common.config_base import Section

SftBatching = Literal["random", "length_grouped"]


class SftConfig(Section):
    """``training.sft``: which rollouts and demonstrations an SFT step trains on, and how."""

    max_per_task: int = Field(
        default=2,
        gt=0,
        description="At most this many successful trajectories per task enter SFT, so easy tasks "
        "with K successes do not crowd out the rest.",
    )
    micro_batch_size: int | None = Field(
        default=None,
        gt=0,
        description="Conversations per forward/backward pass; the step still averages "
        "batch_size x gradient_accumulation_steps conversations by accumulating, so the "
        "update is the same. Activations grow with it: a step of 8 conversations of the "
        "low-resource bench peaked at 13-16 GB resident. Uses the largest "
        "divisor of batch_size up to this; None: batch_size at once. GRPO's "
        "demonstration steps use grpo.micro_batch_size.",
    )
    batching: SftBatching = Field(
        default="length_grouped",
        description="How SFT conversations form batches. random: shuffled, each batch padded to "
        "its longest conversation (a third of a cycle's batch was padding); length_grouped: "
        "shuffled, then each window of 4 batches sorted by length and cut, and the batches "
        "shuffled again, so a batch holds similar lengths but the run still meets every "
        "length throughout (unlike transformers' group_by_length, which puts each window's "
        "longest batch first).",
    )
    min_score: float = Field(
        default=1.0,
        ge=0.0,
        le=1.0,
        description="A trajectory counts as a success for SFT from this verifier score on.",
    )
    token_ids: bool = Field(
        default=False,
        description="SFT on a successful rollout trains on the token ids the model read and "
        "generated (Trajectory.model_turns), as DPO and GRPO do, instead of the canonical "
        "tokenisation of its messages, which is how the policy re-reads its past turns. Off by "
        "default: on the quickstart (seed 0) it ended at 28.7% held-out against 35.2% off "
        "(docs/benchmarks.md, one seed); SmolLM2 often spells names in tokens the tokenizer "
        "would not choose.",
    )
