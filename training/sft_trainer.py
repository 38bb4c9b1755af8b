"""The SFT step's trainer: TRL's SFTTrainer on pre-tokenized conversations.

Conversations are tokenized with the training chat template, so the loss falls
on assistant tokens only; ``training.sft.batching`` orders the rows (shuffled,
or length-grouped in our own order); SEAL's weights go through a weighted
trainer and collator. The step itself (load, train, save) is
``trainers.train_adapter``.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ..agents.policy.policy_interface import Message
from .adapters import model_and_peft
from .config import TrainingConfig
from .datasets import TrainingConversation
from .tokenized_datasets import (
    WeightedCollator,
    length_grouped_order,
    sft_dataset,
    weighted_sft_trainer_class,
)
from .trainer_common import common_arguments, micro_batches

if TYPE_CHECKING:  # pragma: no cover
    from ..outputs.tracking import TrainTracking


def sft_trainer(
    config: TrainingConfig,
    model_dir: str | Path,
    previous_adapter: str | Path | None,
    tokenizer: Any,
    conversations: Sequence[list[Message] | TrainingConversation],
    device: str,
    work: Path,
    progress: bool,
    tracking: TrainTracking | None = None,
    example_weights: Sequence[float] | None = None,
) -> tuple[Any, int, str | None]:
    """TRL's SFTTrainer on ``conversations`` (weighted when ``example_weights``), with the
    examples it trains on, or None and the reason when none can teach anything."""
    import transformers
    from trl import SFTConfig, SFTTrainer

    dataset = sft_dataset(tokenizer, conversations, example_weights)
    # A row whose first trained token lies past max_length teaches nothing once truncated
    # (TRL drops it); when every row is such, say why instead of training zero steps.
    starts = [mask.index(1) if 1 in mask else len(mask) for mask in dataset["assistant_masks"]]
    if starts and min(starts) >= config.max_length:
        return (
            None,
            0,
            f"every example's first trained token lies past training.max_length "
            f"({config.max_length}); the shortest prompt is {min(starts)} tokens (tool schemas "
            "in the prompt cost thousands): raise training.max_length, or set "
            "policy.tools_in_prompt: false",
        )
    weighted = example_weights is not None
    grouped = config.sft.batching == "length_grouped"
    if grouped:
        # Every process reads its own share of the batches (DDP): order enough rows for all.
        processes = int(os.environ.get("WORLD_SIZE", "1"))
        rows = config.max_steps * config.batch_size * config.gradient_accumulation_steps * processes
        lengths = [len(ids) for ids in dataset["input_ids"]]
        dataset = dataset.select(
            length_grouped_order(lengths, config.batch_size, rows, config.seed)
        )
    args = SFTConfig(
        **{
            **common_arguments(config, device, work, progress, tracking),
            **micro_batches(config, config.sft.micro_batch_size),
        },
        # The weight column is no model input; keep it for the collator.
        remove_unused_columns=not weighted,
        max_length=config.max_length,
        # Pre-tokenized with the assistant mask of the training template; SFTTrainer
        # turns the mask into labels (assistant_only_loss itself needs messages).
        assistant_only_loss=False,
        completion_only_loss=False,
        packing=False,
        # Shuffled batches, either plain or length-grouped in our own order (read in
        # sequence). Not transformers' group_by_length: it sorts each window of up to 50
        # batches longest first, so a short run (32 bootstrap steps) met the long chains
        # at the full learning rate and the short families only in the schedule's tail:
        # 18% on validation against 33% shuffled (docs/benchmarks.md).
        train_sampling_strategy="sequential" if grouped else "random",
    )
    model, peft_config = model_and_peft(config, model_dir, previous_adapter)
    transformers.logging.set_verbosity_error()
    trainer_class: Any = weighted_sft_trainer_class() if weighted else SFTTrainer
    trainer = trainer_class(
        model=model,
        args=args,
        train_dataset=dataset,
        processing_class=tokenizer,
        peft_config=peft_config,
    )
    if weighted:
        trainer.data_collator = WeightedCollator(trainer.data_collator)
    return trainer, len(conversations), None
