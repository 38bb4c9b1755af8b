"""The tiny bootstrap model's tokenizer: a byte-level BPE trained on the corpus, with
fixed phrases as single tokens and the Qwen2.5 chat template."""

from __future__ import annotations

from typing import TYPE_CHECKING

from ..chat_template import (
    IM_END,
    PAD_TOKEN,
    SPECIAL_TOKENS,
    TAG_TOKENS,
    chat_template,
    phrase_tokens,
)

if TYPE_CHECKING:  # pragma: no cover
    from transformers import PreTrainedTokenizerFast

    from ...agents.policy.policy_interface import Message
    from .bootstrap_config import BootstrapConfig


def _template_texts(conversations: list[list[Message]]) -> list[str]:
    """Conversations rendered with the chat template, without a tokenizer yet."""
    from transformers.utils.chat_template_utils import render_jinja_template

    from ...agents.policy.policy_interface import prepare_messages

    rendered, _ = render_jinja_template(  # type: ignore[str-unpack]
        conversations=[prepare_messages(messages) for messages in conversations],
        chat_template=chat_template(),
    )
    return list(rendered)


def _without_values(texts: list[str], split: str) -> list[str]:
    """``texts`` with the entity values of ``split``'s pools cut out (for tokenizer training)."""
    import re

    from ...envs.world import pools_for

    pools = pools_for(split)
    values = sorted(
        {*pools.names, *pools.products, *pools.titles, *pools.messages}, key=len, reverse=True
    )
    pattern = re.compile(r"\b(?:" + "|".join(re.escape(value) for value in values) + r")\b")
    return [pattern.sub("", text) for text in texts]


def train_tokenizer(texts: list[str], config: BootstrapConfig) -> PreTrainedTokenizerFast:
    """A byte-level BPE tokenizer trained on ``texts``, with the Qwen2.5 chat template."""
    from tokenizers import AddedToken, Regex, Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    phrases = phrase_tokens() if config.phrase_tokens else []
    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.Sequence(
        [
            # A space is a token of its own, so a value reads the same after a space (a
            # query, an observation) and after a quote (a call's JSON): copying is exact.
            pre_tokenizers.Split(Regex(r"\s"), behavior="isolated"),
            # Numbers in fixed chunks of digits ("555-99|77", "03-28", "15:30"): every chunk is
            # a trained token, and a copied number is less ambiguous than with single digits.
            pre_tokenizers.Split(Regex(rf"\d{{1,{config.digits_per_token}}}"), behavior="isolated"),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True),
        ]
    )
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=config.vocab_size - len(TAG_TOKENS) - len(phrases),
        min_frequency=config.min_frequency,
        special_tokens=list(SPECIAL_TOKENS),
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    # Added before training so the trainer never splits them (and learns no merges inside them).
    tokenizer.add_special_tokens(
        [AddedToken(t, special=True, normalized=False) for t in SPECIAL_TOKENS]
    )
    tokenizer.add_tokens([AddedToken(t, special=False, normalized=False) for t in TAG_TOKENS])
    tokenizer.add_tokens([AddedToken(t, special=False, normalized=False) for t in phrases])
    if config.tokenizer_skip_values:
        texts = _without_values(texts, config.train_split)
    tokenizer.train_from_iterator(texts, trainer=trainer)
    wrapped = PreTrainedTokenizerFast(
        tokenizer_object=tokenizer,
        eos_token=IM_END,
        pad_token=PAD_TOKEN,
        model_max_length=config.max_position_embeddings,
        padding_side="left",
        clean_up_tokenization_spaces=False,
    )
    wrapped.chat_template = chat_template()
    return wrapped
