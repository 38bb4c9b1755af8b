"""An SFT term in every GRPO step: ``grpo.replay_coefficient`` (InstructGPT's PPO-ptx).

GRPO learns only from groups with reward spread. A family the agent already
solves gives groups whose episodes all succeed, hence no gradient, and the
steps on other families are free to overwrite it: on the quickstart's held-out
units create_event fell from 5 of 6 to 0 in three of four seeds, although the
cycle's demonstration steps had just replayed its successes. InstructGPT met the
same regressions in PPO by adding the log-likelihood of pre-training data to
the objective ("PPO-ptx"); here the data are the demonstration steps' own
conversations (the all-fail tasks' reference solutions and, as configured, the
cycle's successes and the pool's replays), so the term holds what those steps
taught while the GRPO steps run.

Each micro-batch of a GRPO step adds ``replay_coefficient`` x the token-mean
loss of the next micro-batch of replay rows (shuffled, then cycled), scaled by
gradient accumulation as TRL scales its own loss, and logs ``replay/nll``.
"""

from __future__ import annotations

import random
from collections.abc import Iterator, Sequence
from functools import cache
from typing import Any

from ..tokenized_datasets import token_losses


def replay_micro_batches(
    rows: Sequence[dict[str, Any]], size: int, pad_id: int, seed: int
) -> Iterator[dict[str, Any]]:
    """Endless micro-batches of ``size`` rows (``input_ids``, ``assistant_masks``): each pass
    over the rows in a new shuffled order, padded by TRL's SFT collator, labels only on the
    assistant's tokens."""
    from trl.trainer.sft_trainer import DataCollatorForLanguageModeling

    if not rows:
        raise ValueError("no replay rows: the anchor needs at least one conversation")
    collate = DataCollatorForLanguageModeling(pad_token_id=pad_id)
    generator = random.Random(seed)
    order: list[int] = []
    while True:
        if len(order) < size:
            fresh = list(range(len(rows)))
            generator.shuffle(fresh)
            order.extend(fresh)
        chosen = [rows[index] for index in order[:size]]
        del order[:size]
        yield collate(
            [
                {
                    "input_ids": row["input_ids"],
                    "labels": [
                        token if trained else -100
                        for token, trained in zip(
                            row["input_ids"], row["assistant_masks"], strict=True
                        )
                    ],
                }
                for row in chosen
            ]
        )


def token_mean_nll(model: Any, batch: dict[str, Any]) -> Any:
    """The mean negative log-likelihood of the labelled tokens (TRL's SFT loss)."""
    device = next(model.parameters()).device
    logits = model(
        input_ids=batch["input_ids"].to(device),
        attention_mask=batch["attention_mask"].to(device),
        use_cache=False,
    ).logits
    per_token, mask = token_losses(logits, batch["labels"])
    return (per_token * mask).sum() / mask.sum()


@cache
def replay_anchor_trainer_class(base: type) -> type:
    """``base`` (a GRPOTrainer class) whose training loss adds the replay term (module
    docstring)."""

    class ReplayAnchorTrainer(base):
        def __init__(
            self,
            *args: Any,
            replay_rows: Sequence[dict[str, Any]],
            replay_coefficient: float,
            **kwargs: Any,
        ) -> None:
            super().__init__(*args, **kwargs)
            self.replay_coefficient = replay_coefficient
            tokenizer = self.processing_class
            pad_id = tokenizer.pad_token_id
            if pad_id is None:
                pad_id = tokenizer.eos_token_id
            self.replay_batches = replay_micro_batches(
                # One replay micro-batch beside each of the step's own.
                replay_rows,
                self.args.per_device_train_batch_size,
                int(pad_id),
                self.args.seed,
            )

        def compute_loss(self, model: Any, *args: Any, **kwargs: Any) -> Any:
            loss = super().compute_loss(model, *args, **kwargs)
            if not self.model.training or not self.replay_coefficient:
                return loss
            nll = token_mean_nll(model, next(self.replay_batches))
            self._metrics["train"]["replay/nll"].append(nll.item())
            return loss + self.replay_coefficient * nll / self.current_gradient_accumulation_steps

    return ReplayAnchorTrainer
