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


def replay_micro_batches(
    rows: Sequence[dict[str, Any]], size: int, pad_id: int, seed: int
) -> Iterator[dict[str, Any]]:
    """Endless micro-batches of ``size`` rows (``input_ids``, ``assistant_masks``): each pass
    over the rows in a new shuffled order, padded on the right, labels only on the
    assistant's tokens."""
    import torch

    if not rows:
        raise ValueError("no replay rows: the anchor needs at least one conversation")
    generator = random.Random(seed)
    order: list[int] = []
    while True:
        if len(order) < size:
            fresh = list(range(len(rows)))
            generator.shuffle(fresh)
            order.extend(fresh)
        chosen = [rows[index] for index in order[:size]]
        del order[:size]
        width = max(len(row["input_ids"]) for row in chosen)
        ids = torch.full((len(chosen), width), pad_id, dtype=torch.long)
        labels = torch.full((len(chosen), width), -100, dtype=torch.long)
        attention = torch.zeros((len(chosen), width), dtype=torch.long)
        for position, row in enumerate(chosen):
            tokens = torch.tensor(row["input_ids"], dtype=torch.long)
            mask = torch.tensor(row["assistant_masks"], dtype=torch.bool)
            ids[position, : len(tokens)] = tokens
            attention[position, : len(tokens)] = 1
            labels[position, : len(tokens)] = torch.where(
                mask, tokens, torch.full_like(tokens, -100)
            )
        yield {"input_ids": ids, "attention_mask": attention, "labels": labels}


def token_mean_nll(model: Any, batch: dict[str, Any]) -> Any:
    """The mean negative log-likelihood of the labelled tokens (TRL's SFT loss)."""
    import torch

    device = next(model.parameters()).device
    logits = model(
        input_ids=batch["input_ids"].to(device),
        attention_mask=batch["attention_mask"].to(device),
        use_cache=False,
    ).logits[:, :-1]
    target = batch["labels"][:, 1:].to(device)
    return torch.nn.functional.cross_entropy(
        logits.float().transpose(1, 2), target, ignore_index=-100
    )


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
            replay_micro_batch: int,
            **kwargs: Any,
        ) -> None:
            super().__init__(*args, **kwargs)
            self.replay_coefficient = replay_coefficient
            tokenizer = self.processing_class
            pad_id = tokenizer.pad_token_id
            if pad_id is None:
                pad_id = tokenizer.eos_token_id
            self.replay_batches = replay_micro_batches(
                replay_rows, replay_micro_batch, int(pad_id), self.args.seed
            )

        def compute_loss(
            self,
            model: Any,
            inputs: Any,
            return_outputs: bool = False,
            num_items_in_batch: Any = None,
        ) -> Any:
            loss = super().compute_loss(model, inputs, return_outputs, num_items_in_batch)
            if not self.model.training or not self.replay_coefficient:
                return loss
            nll = token_mean_nll(model, next(self.replay_batches))
            self._metrics["train"]["replay/nll"].append(nll.item())
            return loss + self.replay_coefficient * nll / self.current_gradient_accumulation_steps

    return ReplayAnchorTrainer
