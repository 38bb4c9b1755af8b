"""The one rendering: a conversation, with its tools, as text and token ids, exactly as the
policy reads it.

Rollouts and every trainer render through here, so an adapter is trained on the
prompt it is served with:
- the in-process policy renders its prompts with ``render_conversation`` (the
  model's own chat template, the tools included when ``tools_in_prompt``);
- an endpoint's server applies the served model's chat template to the
  ``messages`` and ``tools`` of the request; training renders the same
  conversation with the same template and tools (``policy.train_model`` is the
  served model, its tokenizer carries that template);
- SFT, DPO and GRPO render with the same function and the same tools
  (``PolicyConfig.renders_tools`` decides for all of them).

A training template (``{% generation %}`` markers for the assistant-only loss)
renders the same text as the template it marks; ``chat_template`` picks it.

``TokenSequence`` is the other half: a trajectory whose policy gave token ids
(``Trajectory.model_turns``) trains on those ids, never on a re-tokenisation of
its messages, which can differ from what the model generated.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from ...records import ModelTurn
from .policy_interface import Message, prepare_messages

if TYPE_CHECKING:  # pragma: no cover
    from transformers import PreTrainedTokenizerBase


def render_conversation(
    tokenizer: PreTrainedTokenizerBase,
    messages: Sequence[Message],
    tools: Sequence[dict[str, Any]] | None = None,
    *,
    add_generation_prompt: bool = False,
    chat_template: str | None = None,
) -> str:
    """The conversation as the chat template renders it, with ``tools`` (None or empty: none)."""
    return tokenizer.apply_chat_template(  # type: ignore[return-value]
        prepare_messages(messages),
        tools=list(tools) if tools else None,
        add_generation_prompt=add_generation_prompt,
        tokenize=False,
        chat_template=chat_template,
    )


# Text the parser needs even where a tokenizer marks it special.
_KEEP_TOKENS = ("<tool_call>", "</tool_call>")


def end_of_turn_id(tokenizer: PreTrainedTokenizerBase) -> int:
    """The token a reply ends with: ``<|im_end|>`` where the vocabulary has it, else the
    tokenizer's end-of-sequence token (ValueError when it has neither)."""
    im_end = tokenizer.convert_tokens_to_ids("<|im_end|>")
    if isinstance(im_end, int) and im_end != tokenizer.unk_token_id and im_end >= 0:
        return im_end
    if tokenizer.eos_token_id is None:
        raise ValueError("the tokenizer has no end-of-turn token")
    return int(tokenizer.eos_token_id)


def reply_drop_ids(tokenizer: PreTrainedTokenizerBase) -> set[int]:
    """Special tokens dropped from a reply before it is parsed, except the tool-call tags."""
    return {
        token_id
        for token_id, token in tokenizer.added_tokens_decoder.items()
        if token.special and token.content not in _KEEP_TOKENS
    } | {
        token_id
        for token_id in tokenizer.all_special_ids
        if tokenizer.convert_ids_to_tokens(token_id) not in _KEEP_TOKENS
    }


def encode(tokenizer: PreTrainedTokenizerBase, text: str) -> list[int]:
    """Rendered text as ids: the template wrote every special token, so none are added."""
    return list(tokenizer(text, add_special_tokens=False)["input_ids"])


def turn_from_ids(
    message_index: int,
    prompt_ids: Sequence[int],
    completion_ids: Sequence[int],
    logprobs: Sequence[float] | None,
    previous: Sequence[int],
) -> ModelTurn:
    """A ``ModelTurn``, its prompt stored as the part after what it shares with ``previous``
    (the last turn's prompt and completion)."""
    shared = 0
    for mine, theirs in zip(prompt_ids, previous, strict=False):
        if mine != theirs:
            break
        shared += 1
    return ModelTurn(
        message_index=message_index,
        prompt_shared=shared,
        prompt_new_ids=list(prompt_ids[shared:]),
        completion_ids=list(completion_ids),
        logprobs=list(logprobs) if logprobs is not None else None,
    )


def full_prompts(turns: Sequence[ModelTurn]) -> list[list[int]]:
    """Every turn's whole prompt, rebuilt from the stored deltas."""
    prompts: list[list[int]] = []
    previous: list[int] = []
    for turn in turns:
        if turn.prompt_shared > len(previous):
            raise ValueError(
                f"turn of message {turn.message_index} shares {turn.prompt_shared} ids with a "
                f"previous sequence of {len(previous)}: the turns are not from one trajectory"
            )
        prompt = previous[: turn.prompt_shared] + turn.prompt_new_ids
        prompts.append(prompt)
        previous = prompt + turn.completion_ids
    return prompts


class TokenSequence:
    """Training ids and their loss mask: the prompt tokens masked out, every generated
    token in (``assistant_masks``, the SFT trainer's name for it)."""

    def __init__(self, input_ids: list[int], assistant_masks: list[int]):
        if len(input_ids) != len(assistant_masks):
            raise ValueError(f"{len(input_ids)} ids but {len(assistant_masks)} mask entries")
        self.input_ids = input_ids
        self.assistant_masks = assistant_masks

    def as_row(self) -> dict[str, list[int]]:
        return {"input_ids": self.input_ids, "assistant_masks": self.assistant_masks}


def token_sequences(turns: Sequence[ModelTurn]) -> list[TokenSequence]:
    """The trajectory's model turns as training sequences of exactly the ids the model read
    and generated.

    Turns chain into one sequence while each prompt continues the previous prompt and
    completion id for id (a chat template that renders the model's reply back as it
    was generated). Where a prompt does not continue it (the reply was rendered back
    differently, or it was cut at the token limit), the sequence ends there and the
    next one starts from that prompt: each generated token is trained in the context
    the model actually had.
    """
    sequences: list[TokenSequence] = []
    ids: list[int] = []
    mask: list[int] = []
    for prompt, turn in zip(full_prompts(turns), turns, strict=True):
        if ids and prompt[: len(ids)] != ids:
            sequences.append(TokenSequence(ids, mask))
            ids, mask = [], []
        new = prompt[len(ids) :]
        ids = ids + new + turn.completion_ids
        mask = mask + [0] * len(new) + [1] * len(turn.completion_ids)
    if ids:
        sequences.append(TokenSequence(ids, mask))
    return sequences
