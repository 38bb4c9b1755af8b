"""The chat format of coevolve's own small models: TRL's bundled Qwen2.5 template.

The bootstrap model's tokenizer carries TRL's ``qwen2_5`` template verbatim, so
TRL recognises it (``add_response_schema``, ``get_training_chat_template``,
GRPO's tool handling). Training renders with its ``qwen2_5_training`` variant,
whose ``{% generation %}`` markers enclose each assistant turn *including* its
``<|im_end|>``: the assistant-only loss then teaches the model to stop.

Conversations are OpenAI messages with tool-call arguments as JSON strings; the
template does ``arguments | tojson``, so they are decoded to dicts
(``arguments_as_dicts``) before rendering. Tool schemas are not rendered: the
bootstrap model learns the tools from demonstrations, and 31 schemas would cost
thousands of prompt tokens.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from ..agents.policy.policy_interface import Message, prepare_messages
from ..agents.policy.rendering import render_conversation

if TYPE_CHECKING:  # pragma: no cover
    from transformers import PreTrainedTokenizerBase

PAD_TOKEN = "<|endoftext|>"
IM_START = "<|im_start|>"
IM_END = "<|im_end|>"
# Special tokens: single tokens, dropped by ``decode(skip_special_tokens=True)``.
SPECIAL_TOKENS = (PAD_TOKEN, IM_START, IM_END)
# Tags of the Qwen2.5 format: single tokens too, but *not* special, so they
# survive decoding and the tool-call parser sees them (as in Qwen's own tokenizer).
TAG_TOKENS = ("<tool_call>", "</tool_call>", "<tool_response>", "</tool_response>")


def chat_template() -> str:
    """TRL's bundled Qwen2.5 chat template (the one stored with the tokenizer)."""
    from trl.chat_template_utils import qwen2_5_chat_template

    return qwen2_5_chat_template


def _plain_calls_template(training: bool) -> str:
    open_, close = ("{%- generation %}", "{%- endgeneration %}") if training else ("", "")
    return (
        "{#- ChatML with tool calls as Python call lines (coevolve's plain-calls format) -#}\n"
        "{%- for message in messages %}"
        "{%- if message.role == 'assistant' %}"
        "{{- '<|im_start|>assistant\\n' }}"
        + open_
        + "{%- if message.content %}{{- message.content }}"
        "{%- if message.tool_calls %}{{- '\\n' }}{%- endif %}{%- endif %}"
        "{%- for call in message.tool_calls or [] %}"
        "{%- if call.function is defined %}{%- set call = call.function %}{%- endif %}"
        "{{- call.name + '(' }}"
        "{%- for key, value in call.arguments.items() %}"
        "{{- key + '=' + (value | tojson) }}{%- if not loop.last %}{{- ', ' }}{%- endif %}"
        "{%- endfor %}{{- ')' }}{%- if not loop.last %}{{- '\\n' }}{%- endif %}"
        "{%- endfor %}{{- '<|im_end|>' }}" + close + "{{- '\\n' }}"
        "{%- else %}"
        "{{- '<|im_start|>' + message.role + '\\n' + (message.content or '') + '<|im_end|>\\n' }}"
        "{%- endif %}"
        "{%- endfor %}"
        "{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}{%- endif %}"
    )


# SmolLM2's format: calls as ``find_contact(name="Ana")`` lines, results as ``tool``
# turns, no tool list in the prompt. On SmolLM2 it gave 50% held-out after 32 LoRA steps
# where Qwen2.5 <tool_call> JSON blocks gave 34% (DESIGN.md), in fewer tokens.
PLAIN_CALLS_TEMPLATE = _plain_calls_template(training=False)
PLAIN_CALLS_TRAINING_TEMPLATE = _plain_calls_template(training=True)


def training_chat_template(tokenizer: PreTrainedTokenizerBase | None = None) -> str:
    """The training variant of ``tokenizer``'s template: ``{% generation %}`` markers around
    each assistant turn (``<|im_end|>`` inside) for assistant-only loss.

    It renders the same text as the template the policy is prompted with (the rendering
    identity test holds them to that): plain-calls tokenizers get
    ``PLAIN_CALLS_TRAINING_TEMPLATE``; others TRL's training variant of their own template
    (Qwen2.5's for the bootstrap's tiny model, or that of a served model such as Llama 3
    or Qwen 3). No tokenizer: TRL's Qwen2.5 training template.
    """
    if tokenizer is not None and tokenizer.chat_template == PLAIN_CALLS_TEMPLATE:
        return PLAIN_CALLS_TRAINING_TEMPLATE
    from trl.chat_template_utils import get_training_chat_template, qwen2_5_training_chat_template

    if tokenizer is None or not tokenizer.chat_template:
        return qwen2_5_training_chat_template
    try:
        patched = get_training_chat_template(tokenizer)
    except ValueError as err:
        raise ValueError(
            "training renders conversations with the policy's own chat template, with "
            "{% generation %} markers for the assistant-only loss, and TRL has no training "
            "variant of this tokenizer's template; give the tokenizer a template with those "
            "markers, or train a model whose template TRL knows (Qwen, Llama 3, Gemma, Phi)"
        ) from err
    return patched if patched is not None else tokenizer.chat_template


def render(
    tokenizer: PreTrainedTokenizerBase,
    messages: Sequence[Message],
    add_generation_prompt: bool = False,
    training: bool = False,
    tools: Sequence[dict[str, Any]] | None = None,
) -> str:
    """One conversation as text, through the policy's rendering (``render_conversation``),
    with ``tools`` in the prompt when the policy's prompts carry them."""
    return render_conversation(
        tokenizer,
        messages,
        tools,
        add_generation_prompt=add_generation_prompt,
        chat_template=training_chat_template(tokenizer) if training else None,
    )


def tokenize_for_training(
    tokenizer: PreTrainedTokenizerBase,
    messages: Sequence[Message],
    tools: Sequence[dict[str, Any]] | None = None,
) -> dict[str, list[int]]:
    """``input_ids`` and ``assistant_masks`` (1 on every assistant token, ``<|im_end|>`` included).

    The same call TRL's SFTTrainer makes for ``assistant_only_loss=True``; done
    here so the dataset can hold token ids instead of messages whose argument
    dicts Arrow would merge into null-filled structs. ``tools``: as the policy's
    prompts carry them (``PolicyConfig.renders_tools``), so the example is the
    prompt the policy is served.
    """
    output = tokenizer.apply_chat_template(
        prepare_messages(messages),
        tools=list(tools) if tools else None,
        tokenize=True,
        return_dict=True,
        return_assistant_tokens_mask=True,
        chat_template=training_chat_template(tokenizer),
    )
    return {
        "input_ids": list(output["input_ids"]),  # type: ignore[call-overload,arg-type,index]
        "assistant_masks": list(output["assistant_masks"]),  # type: ignore[call-overload,arg-type,index]
    }


def observation_mask(tokenizer: PreTrainedTokenizerBase, input_ids: Sequence[int]) -> list[int]:
    """1 on the tokens of every tool result, from its text to ``</tool_response>`` included."""
    opening = tokenizer.convert_tokens_to_ids("<tool_response>")
    closing = tokenizer.convert_tokens_to_ids("</tool_response>")
    mask, inside = [], False
    for token in input_ids:
        if token == opening:
            inside = True
            mask.append(0)
            continue
        mask.append(1 if inside else 0)
        if token == closing:
            inside = False
    return mask


# Pieces of the tool-call JSON the chat template writes ('{"name": "find_contact", "arguments":
# {"name": "Ana"}}'), longest first where one starts another.
_JSON_FRAME = (
    '{"name": "',
    '", "arguments": {}}',
    '", "arguments": {"',
    '": "',
    '", "',
    '"}}',
    '": ',
    ', "',
)


def phrase_tokens() -> list[str]:
    """Fixed phrases that become one token each (``phrase_tokens``): the policy's system
    prompt, the world's tool names and the tool-call JSON frame."""
    from ..agents.prompts import POLICY_SYSTEM_PROMPT
    from ..envs.world.apps import TOOL_NAMES

    return [POLICY_SYSTEM_PROMPT, *TOOL_NAMES, *_JSON_FRAME]
