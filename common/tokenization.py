"""The one way coevolve loads a tokenizer saved beside a model."""

from __future__ import annotations

from pathlib import Path
from typing import Any


def load_tokenizer(model_dir: str | Path) -> Any:
    """The tokenizer beside the model, left padding (batched generation), with a pad token.

    A ``tokenizer.json`` is loaded with ``PreTrainedTokenizerFast`` exactly as
    saved: ``AutoTokenizer`` beside a qwen2 ``config.json`` would rebuild the
    pre-tokenizer as Qwen's and silently change how our own tokenizers split
    text. Other directories go through ``AutoTokenizer``. Without a pad token,
    the end-of-sequence token pads.
    """
    from transformers import AutoTokenizer, PreTrainedTokenizerFast

    path = Path(model_dir)
    if (path / "tokenizer.json").exists():
        tokenizer: Any = PreTrainedTokenizerFast.from_pretrained(str(path))
    else:
        tokenizer = AutoTokenizer.from_pretrained(str(path))
    tokenizer.padding_side = "left"
    if tokenizer.pad_token is None:
        tokenizer.pad_token = tokenizer.eos_token
    return tokenizer
