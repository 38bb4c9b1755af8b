"""The DPO step's trainer: TRL's DPOTrainer on (success, failure) pairs of one task.

The prompt is the opening (system + request) rendered with a generation prompt;
chosen and rejected are the rest of each conversation as the chat template
renders it. ``training.dpo.micro_batch_size`` pairs go through a forward pass
at a time, accumulated to ``batch_size`` pairs per step. Hard negatives
(``training/hard_negatives/agents.py``) train through the same step, with their own
beta and an SFT term (``dpo.loss_type``, ``dpo.loss_weights``).
"""

from __future__ import annotations

import warnings
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from .adapters import model_and_peft
from .config import TrainingConfig
from .datasets import PreferencePair
from .tokenized_datasets import dpo_dataset, token_exact_dpo_trainer_class
from .trainer_common import common_arguments, micro_batches

if TYPE_CHECKING:  # pragma: no cover
    from ..outputs.tracking import TrainTracking


def dpo_arguments(
    config: TrainingConfig,
    device: str,
    output_dir: Path,
    progress: bool,
    tracking: TrainTracking | None = None,
) -> dict[str, Any]:
    """``common_arguments`` for a DPO step: ``dpo.micro_batch_size`` pairs per forward pass
    (the largest divisor of ``batch_size`` up to it), accumulated to ``batch_size`` pairs per
    optimisation step; sequences cut at ``max_length``; reference log-probs computed per
    batch, not precomputed."""
    return {
        **common_arguments(config, device, output_dir, progress, tracking),
        **micro_batches(config, config.dpo.micro_batch_size),
        "max_length": config.max_length,
        "precompute_ref_log_probs": False,
    }


def dpo_trainer(
    config: TrainingConfig,
    model_dir: str | Path,
    previous_adapter: str | Path | None,
    tokenizer: Any,
    pairs: Sequence[PreferencePair],
    device: str,
    work: Path,
    progress: bool,
    tracking: TrainTracking | None = None,
) -> tuple[Any, int, str | None]:
    """TRL's DPOTrainer on ``pairs`` (token-exact: the ids the model read and wrote) with
    ``training.dpo``'s beta and losses, and the pairs it trains on; or None and the reason
    when no pair renders."""
    import transformers
    from trl import DPOConfig

    dataset = dpo_dataset(tokenizer, pairs)
    if dataset is None:
        return None, 0, "no preference pair renders as prompt + completion"
    args = DPOConfig(
        **dpo_arguments(config, device, work, progress, tracking),
        beta=config.dpo.beta,
        loss_type=list(config.dpo.loss_type),
        loss_weights=config.dpo.loss_weights,
    )
    model, peft_config = model_and_peft(config, model_dir, previous_adapter)
    transformers.logging.set_verbosity_error()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)
        trainer = token_exact_dpo_trainer_class()(
            model=model,
            args=args,
            train_dataset=dataset,
            processing_class=tokenizer,
            peft_config=peft_config,
        )
    return trainer, len(dataset), None
