"""``MultiTurnGRPOTrainer``: TRL's GRPOTrainer for ``MultiTurnRollout`` (training/grpo/multiturn_rollout.py).

Three changes to TRL 1.16's trainer, each because of where a CPU step's time went
(``bench/grpo_step.py``, quickstart shape: a round of 4 tasks x 8 episodes feeding
4 steps of 8; SmolLM2, one thread beside a bench unit; docs/benchmarks.md):

- **The batch's rows on the trainer** (``batch_rows``): TRL's ``rollout_func``
  receives only the prompts, and the rollout needs each prompt's task.
- **The old policy's log-probs from the rollout.** When a round feeds several
  optimisation steps, TRL runs a no-grad forward pass over the whole round for
  them (91 s of a 228 s step). The rollout sampled those very tokens from that
  policy and kept their log-probs (after temperature, as TRL scales its own), so
  they are taken from its episodes; only rows without them (reference episodes,
  whose replies were scripted) go through the pass. ``old_logps_from_rollout =
  False`` restores TRL's pass.
- **No forward over padding.** TRL pads every row of a round to the round's
  longest prompt (left) and completion (right), then runs the model over each
  micro-batch at that width: micro-batches of 2 episodes of ~270 tokens ran at
  the width of the round's longest (up to 384 completion tokens). Columns that no
  row of a chunk attends to are cut before the forward pass and the log-probs are
  padded back with zeros (masked out of the loss, as TRL's padding is). Rotary
  positions are relative, so cutting left padding shifts nothing a row attends to.
"""

from __future__ import annotations

from collections.abc import Sequence
from functools import cache
from typing import Any


def trimmed_columns(attention_mask: Any, logits_to_keep: int) -> tuple[int, int]:
    """The first and last+1 column any row attends to, never cutting into the last
    ``logits_to_keep`` columns from the left (the completion starts there)."""
    import torch

    attended = torch.nonzero(attention_mask.any(dim=0)).flatten()
    width = attention_mask.size(1)
    if attended.numel() == 0:
        return 0, width
    first = min(int(attended[0]), width - logits_to_keep)
    last = max(int(attended[-1]) + 1, width - logits_to_keep + 1)
    return first, last


@cache
def multi_turn_trainer_class() -> type:
    """``MultiTurnGRPOTrainer`` (module docstring)."""
    import torch
    from trl import GRPOTrainer

    class MultiTurnGRPOTrainer(GRPOTrainer):
        batch_rows: list[dict[str, Any]] | None = None
        old_logps_from_rollout = True
        _old_logps_pending = False

        def _generate_and_score_completions(self, inputs: list[dict[str, Any]]) -> dict[str, Any]:
            self.batch_rows = inputs
            self._old_logps_pending = self.old_logps_from_rollout and runs_old_policy_pass(self)
            try:
                return super()._generate_and_score_completions(inputs)
            finally:
                self.batch_rows = None
                self._old_logps_pending = False

        def _get_per_token_logps_and_entropies(
            self,
            model: Any,
            input_ids: Any,
            attention_mask: Any,
            logits_to_keep: int,
            batch_size: int | None = None,
            compute_entropy: bool = False,
            **kwargs: Any,
        ) -> tuple[Any, Any, Any]:
            """TRL's pass, chunk by chunk, over the columns each chunk attends to; the round's
            first no-grad pass (the old policy's) from the rollout (``_old_logps``)."""
            if self._old_logps_pending and not torch.is_grad_enabled() and not compute_entropy:
                # The round's first no-grad pass is the old policy's; later ones are TRL's.
                self._old_logps_pending = False
                return self._old_logps(model, input_ids, attention_mask, logits_to_keep, batch_size)
            own = super()._get_per_token_logps_and_entropies
            if any(value is not None and value is not False for value in kwargs.values()):
                # Images or MoE losses are laid out per row of the full width: TRL's own.
                return own(
                    model,
                    input_ids,
                    attention_mask,
                    logits_to_keep,
                    batch_size,
                    compute_entropy,
                    **kwargs,
                )
            return trimmed_logps(
                own, model, input_ids, attention_mask, logits_to_keep, batch_size, compute_entropy
            )

        # The same pass under the name _old_logps calls it by (its pending flag is already
        # cleared there), so that a test can count the rows it computes.
        _unpadded_logps = _get_per_token_logps_and_entropies

        def _old_logps(
            self,
            model: Any,
            input_ids: Any,
            attention_mask: Any,
            logits_to_keep: int,
            batch_size: int | None,
        ) -> tuple[Any, Any, Any]:
            """The round's old-policy log-probs: the rollout's where it sampled every reply."""
            episodes = getattr(self.rollout_func, "last_episodes", [])
            rows = input_ids.size(0)
            old, missing = rollout_logps(episodes, input_ids, logits_to_keep)
            if missing:
                index = torch.tensor(missing, device=input_ids.device)
                computed, _, _ = self._unpadded_logps(
                    model, input_ids[index], attention_mask[index], logits_to_keep, batch_size
                )
                old[index.cpu()] = computed.float().cpu()
            self._metrics["train"]["old_logps/from_rollout"].append(1 - len(missing) / max(rows, 1))
            return old.to(input_ids.device), None, None

    return MultiTurnGRPOTrainer


def runs_old_policy_pass(trainer: Any) -> bool:
    """TRL's own condition for the old-policy pass of a round (with vLLM it always runs, for
    its importance-sampling correction, and the rollout has vLLM's log-probs)."""
    arguments: Any = trainer.args  # GRPOConfig (typed as TrainingArguments)
    generate_every = arguments.steps_per_generation * trainer.num_iterations
    return bool(
        trainer.model is not None
        and trainer.model.training
        and not trainer.use_vllm
        and arguments.gradient_accumulation_steps % generate_every != 0
    )


def trimmed_logps(
    own: Any,
    model: Any,
    input_ids: Any,
    attention_mask: Any,
    logits_to_keep: int,
    batch_size: int | None,
    compute_entropy: bool,
) -> tuple[Any, Any, Any]:
    """TRL's per-token pass ``own``, chunk by chunk of ``batch_size`` rows, over only the
    columns each chunk attends to (``trimmed_columns``), padded back to the full width."""
    import torch

    size = batch_size or input_ids.size(0)
    logps, entropies = [], []
    for start in range(0, input_ids.size(0), size):
        ids, mask = input_ids[start : start + size], attention_mask[start : start + size]
        first, last = trimmed_columns(mask, logits_to_keep)
        right = ids.size(1) - last
        chunk_logps, chunk_entropies, _ = own(
            model,
            ids[:, first:last],
            mask[:, first:last],
            logits_to_keep - right,
            size,
            compute_entropy,
        )
        logps.append(torch.nn.functional.pad(chunk_logps, (0, right)))
        if compute_entropy:
            entropies.append(torch.nn.functional.pad(chunk_entropies, (0, right)))
    return torch.cat(logps), torch.cat(entropies) if compute_entropy else None, None


def rollout_logps(
    episodes: Sequence[Any], input_ids: Any, logits_to_keep: int
) -> tuple[Any, list[int]]:
    """The old policy's log-probs of each row's completion as the rollout sampled them
    (zeros elsewhere), and the rows it cannot give: no episode of its own, no log-prob of
    every reply, or tokens other than the row's."""
    import torch

    rows = input_ids.size(0)
    old = torch.zeros((rows, logits_to_keep), dtype=torch.float32)
    completions = input_ids[:, input_ids.size(1) - logits_to_keep :].tolist()
    missing = []
    for row in range(rows):
        episode = episodes[row] if len(episodes) == rows else None
        values = episode.old_policy_logprobs() if episode is not None else None
        if (
            episode is None
            or values is None
            or len(values) > logits_to_keep
            or completions[row][: len(values)] != episode.completion_ids
        ):
            missing.append(row)
            continue
        old[row, : len(values)] = torch.tensor(values, dtype=torch.float32)
    return old, missing
