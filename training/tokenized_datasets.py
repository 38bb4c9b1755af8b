"""The datasets TRL trains on, per algorithm: tokenized SFT rows (in a length-grouped order,
with per-example weights) and DPO pairs rendered as prompt and completions."""

from __future__ import annotations

import logging
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from ..agents.policy import Message
from .datasets import PreferencePair

if TYPE_CHECKING:  # pragma: no cover
    from transformers import PreTrainedTokenizerBase

logger = logging.getLogger(__name__)


def sft_dataset(
    tokenizer: PreTrainedTokenizerBase,
    conversations: Sequence[list[Message]],
    example_weights: Sequence[float] | None = None,
) -> Any:
    """``input_ids`` and ``assistant_masks`` per conversation (the bootstrap's tokenization),
    and ``example_weight`` when weights are given."""
    from datasets import Dataset

    from .chat_template import tokenize_for_training

    rows: list[dict[str, Any]] = [tokenize_for_training(tokenizer, list(m)) for m in conversations]
    if example_weights is not None:
        if len(example_weights) != len(rows):
            raise ValueError(
                f"{len(example_weights)} example weights for {len(rows)} conversations"
            )
        rows = [
            {**row, "example_weight": float(w)}
            for row, w in zip(rows, example_weights, strict=True)
        ]
    return Dataset.from_list(rows)


def length_grouped_order(
    lengths: Sequence[int], batch_size: int, rows: int, seed: int, window_batches: int = 4
) -> list[int]:
    """Indices of ``rows`` training rows, in batch order, for sequential sampling.

    Each pass over the data is a fresh shuffle, cut into windows of
    ``window_batches`` batches; a window is sorted by length and cut into
    batches, so a batch pads little, and the batches of a pass are shuffled again,
    so long and short conversations keep meeting the whole learning-rate schedule.
    """
    import random

    if batch_size < 1 or window_batches < 1:
        raise ValueError("batch_size and window_batches must be >= 1")
    if not lengths:
        return []
    generator = random.Random(seed)
    order: list[int] = []
    window = batch_size * window_batches
    while len(order) < rows:
        indices = list(range(len(lengths)))
        generator.shuffle(indices)
        batches: list[list[int]] = []
        for start in range(0, len(indices), window):
            chunk = sorted(indices[start : start + window], key=lambda i: lengths[i])
            batches.extend(chunk[i : i + batch_size] for i in range(0, len(chunk), batch_size))
        generator.shuffle(batches)
        order.extend(index for batch in batches for index in batch)
    return order[:rows]


class WeightedCollator:
    """TRL's collator, plus the batch's ``example_weight`` tensor (TRL drops unknown keys)."""

    def __init__(self, inner: Any):
        self.inner = inner

    def __call__(self, examples: list[dict[str, Any]]) -> dict[str, Any]:
        import torch

        weights = [float(example["example_weight"]) for example in examples]
        stripped = [{k: v for k, v in e.items() if k != "example_weight"} for e in examples]
        batch = self.inner(stripped)
        batch["example_weight"] = torch.tensor(weights, dtype=torch.float32)
        return batch


def weighted_sft_trainer_class() -> Any:
    """An SFTTrainer whose loss is mean over examples of weight x the example's token-mean loss.

    SEAL's per-example weights (``coevolve.training.seal.trajectory_weight``) for SFT.
    Each example's loss is its own token mean, so a long conversation counts as one
    example, not by its length (TRL's unweighted loss is a token mean over the batch).
    """
    import torch
    from trl import SFTTrainer

    class WeightedSFTTrainer(SFTTrainer):
        def compute_loss(
            self,
            model: Any,
            inputs: Any,
            return_outputs: Any = False,
            num_items_in_batch: Any = None,
        ) -> Any:
            weights = inputs.pop("example_weight")
            labels = inputs.pop("labels")
            outputs = model(**inputs, use_cache=False)
            logits = outputs.logits[:, :-1].float()
            target = labels[:, 1:].to(logits.device)
            per_token = torch.nn.functional.cross_entropy(
                logits.transpose(1, 2), target, ignore_index=-100, reduction="none"
            )
            mask = (target != -100).float()
            per_example = (per_token * mask).sum(1) / mask.sum(1).clamp(min=1.0)
            loss = (per_example * weights.to(per_example.device)).mean()
            return (loss, outputs) if return_outputs else loss

    return WeightedSFTTrainer


def dpo_dataset(tokenizer: PreTrainedTokenizerBase, pairs: Sequence[PreferencePair]) -> Any:
    """Text ``prompt``/``chosen``/``rejected`` as the chat template renders the conversations.

    The prompt ends with the generation prompt; chosen and rejected are what the
    template renders after it, ending at the last ``<|im_end|>`` (TRL appends the
    end-of-sequence token only when it is missing). A pair whose rendering does not
    start with its rendered prompt is dropped.
    """
    from datasets import Dataset

    from .chat_template import render

    eos = tokenizer.eos_token or ""
    rows = []
    for pair in pairs:
        prompt = render(tokenizer, pair.prompt, add_generation_prompt=True)
        completions = []
        for rest in (pair.chosen, pair.rejected):
            full = render(tokenizer, [*pair.prompt, *rest])
            if not full.startswith(prompt):
                break
            text = full[len(prompt) :].rstrip()
            if eos and eos in text:
                text = text[: text.rindex(eos) + len(eos)]
            completions.append(text)
        if len(completions) == 2 and all(completions):
            rows.append({"prompt": prompt, "chosen": completions[0], "rejected": completions[1]})
        else:
            logger.warning(
                "preference pair of %s does not render as prompt + completion", pair.task_id
            )
    return Dataset.from_list(rows) if rows else None
