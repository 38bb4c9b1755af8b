"""The datasets TRL trains on, per algorithm: tokenized SFT rows (in a length-grouped order,
with per-example weights) and DPO pairs, as the ids a rollout recorded or rendered with the
policy's rendering (``agents/policy/rendering.py``)."""

from __future__ import annotations

import logging
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from ..agents.policy.policy_interface import Message
from ..agents.policy.rendering import full_prompts, token_sequences
from .datasets import PreferencePair, TrainingConversation

if TYPE_CHECKING:  # pragma: no cover
    from transformers import PreTrainedTokenizerBase

logger = logging.getLogger(__name__)


def sft_dataset(
    tokenizer: PreTrainedTokenizerBase,
    conversations: Sequence[list[Message] | TrainingConversation],
    example_weights: Sequence[float] | None = None,
) -> Any:
    """``input_ids`` and ``assistant_masks`` per conversation, and ``example_weight`` when
    weights are given.

    A conversation with token ids (a rollout's ``model_turns``) gives its rows from those
    ids exactly (``token_sequences``: more than one row where a prompt did not continue
    the previous turn); any other is rendered with the policy's rendering and its tools
    (``tokenize_for_training``, as the bootstrap does). A conversation's weight goes to
    each of its rows.
    """
    from datasets import Dataset

    from .chat_template import tokenize_for_training

    if example_weights is not None and len(example_weights) != len(conversations):
        raise ValueError(
            f"{len(example_weights)} example weights for {len(conversations)} conversations"
        )
    rows: list[dict[str, Any]] = []
    exact = 0
    for index, conversation in enumerate(conversations):
        found: list[dict[str, Any]]
        if isinstance(conversation, TrainingConversation):
            if conversation.model_turns:
                found = [seq.as_row() for seq in token_sequences(conversation.model_turns)]
                exact += 1
            else:
                found = [
                    tokenize_for_training(tokenizer, conversation.messages, conversation.tools)
                ]
        else:
            found = [tokenize_for_training(tokenizer, list(conversation))]
        if example_weights is not None:
            found = [{**row, "example_weight": float(example_weights[index])} for row in found]
        rows.extend(found)
    if exact:
        logger.info(
            "%d of %d SFT conversations train on their own token ids", exact, len(conversations)
        )
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


def token_losses(logits: Any, labels: Any) -> tuple[Any, Any]:
    """Each position's next-token loss (float32) and the mask of the labelled ones (-100:
    not trained on), both one column shorter than ``labels``."""
    import torch

    shifted = logits[:, :-1].float()
    target = labels[:, 1:].to(shifted.device)
    per_token = torch.nn.functional.cross_entropy(
        shifted.transpose(1, 2), target, ignore_index=-100, reduction="none"
    )
    return per_token, (target != -100).float()


def weighted_sft_trainer_class() -> Any:
    """An SFTTrainer whose loss is mean over examples of weight x the example's token-mean loss.

    SEAL's per-example weights (``coevolve.training.seal.trajectory_weight``) for SFT.
    Each example's loss is its own token mean, so a long conversation counts as one
    example, not by its length (TRL's unweighted loss is a token mean over the batch).
    """
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
            per_token, mask = token_losses(outputs.logits, labels)
            per_example = (per_token * mask).sum(1) / mask.sum(1).clamp(min=1.0)
            loss = (per_example * weights.to(per_example.device)).mean()
            return (loss, outputs) if return_outputs else loss

    return WeightedSFTTrainer


def dpo_dataset(tokenizer: PreTrainedTokenizerBase, pairs: Sequence[PreferencePair]) -> Any:
    """The DPO rows as token ids (``prompt_ids``/``chosen_ids``/``rejected_ids``), one per
    pair, for ``token_exact_dpo_trainer_class``.

    Each side is taken exactly as the model read and wrote it where the pair carries
    its ids (rolled out by a policy that gave them: one unbroken sequence from the
    pair's prompt), else rendered with the policy's rendering and encoded as TRL
    would encode the text (prompt and completion apart, no special tokens added): the
    prompt ends with the generation prompt; a completion is what the template renders
    after it, ending at the last ``<|im_end|>``. So a hard negative's recorded ids meet
    an expert's rendered ones in one pair. A side whose ids were read from another
    prompt than the pair's is rendered too; a pair whose rendering does not start with
    its rendered prompt is dropped with a warning.
    """
    from datasets import Dataset

    rows = []
    for pair in pairs:
        row = _pair_ids(tokenizer, pair)
        if row is None:
            logger.warning(
                "preference pair of %s does not render as prompt + completion", pair.task_id
            )
            continue
        rows.append(row)
    return Dataset.from_list(rows) if rows else None


def _recorded(turns: Sequence[Any]) -> tuple[list[int], list[int]] | None:
    """(prompt ids, completion ids) of a side's recorded turns when they are one sequence."""
    if not turns:
        return None
    sequences = token_sequences(turns)
    if len(sequences) != 1:
        return None
    prompt = list(full_prompts(turns)[0])
    return prompt, list(sequences[0].input_ids[len(prompt) :])


def _pair_ids(
    tokenizer: PreTrainedTokenizerBase, pair: PreferencePair
) -> dict[str, list[int]] | None:
    """One pair as ids: recorded where a side has them, rendered and encoded where not."""
    from ..agents.policy.rendering import encode
    from .chat_template import render

    recorded = [_recorded(pair.chosen_turns), _recorded(pair.rejected_turns)]
    if all(side is not None for side in recorded):
        (chosen_prompt, chosen), (rejected_prompt, rejected) = recorded  # type: ignore[misc]
        if chosen_prompt == rejected_prompt:
            return {"prompt_ids": chosen_prompt, "chosen_ids": chosen, "rejected_ids": rejected}
    prompt_text = render(tokenizer, pair.prompt, add_generation_prompt=True, tools=pair.tools)
    prompt = encode(tokenizer, prompt_text)
    eos = tokenizer.eos_token or ""
    sides: list[list[int]] = []
    for rest, side in zip((pair.chosen, pair.rejected), recorded, strict=True):
        if side is not None and side[0] == prompt:  # read from the same prompt: keep the ids
            sides.append(side[1])
            continue
        full = render(tokenizer, [*pair.prompt, *rest], tools=pair.tools)
        if not full.startswith(prompt_text):
            return None
        text = full[len(prompt_text) :].rstrip()
        if eos and eos in text:
            text = text[: text.rindex(eos) + len(eos)]
        if not text:
            return None
        sides.append(encode(tokenizer, text))
    return {"prompt_ids": prompt, "chosen_ids": sides[0], "rejected_ids": sides[1]}


def token_exact_dpo_trainer_class() -> Any:
    """A DPOTrainer that trains a dataset of ids as it is (TRL would tokenize text again)."""
    from trl import DPOTrainer

    class TokenExactDPOTrainer(DPOTrainer):
        def _prepare_dataset(
            self, dataset: Any, processing_class: Any, args: Any, dataset_name: str
        ) -> Any:
            if "prompt_ids" not in dataset.column_names:  # a text dataset of the caller's
                return super()._prepare_dataset(dataset, processing_class, args, dataset_name)
            # TRL's own last step: a prompt that fills max_length leaves nothing to learn.
            if args.max_length is not None and args.truncation_mode == "keep_start":
                dataset = dataset.filter(lambda row: len(row["prompt_ids"]) < args.max_length)
            return dataset

    return TokenExactDPOTrainer
