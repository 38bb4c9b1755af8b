"""The policy interface: conversations in, next assistant messages out.

Conversations are OpenAI chat messages (plain dicts), the one format every
backend speaks::

    {"role": "system" | "user", "content": "..."}
    {"role": "assistant", "content": "...", "tool_calls": [
        {"id": "call_0", "type": "function", "function": {"name": "...", "arguments": "<JSON string>"}}]}
    {"role": "tool", "tool_call_id": "call_0", "content": "..."}

Tool-call arguments are JSON *strings* here, as the OpenAI API has them; an
in-process chat template that wants dicts converts on its own side.

``generate`` takes a batch so that an in-process model can answer every live
episode in one padded ``generate`` call and an endpoint can have many requests
in flight; a failure for one conversation comes back on that message
(``error``), not as an exception that would end the whole batch.
"""

from __future__ import annotations

import json
import re
from collections.abc import Sequence
from typing import Any, Protocol, runtime_checkable

from pydantic import BaseModel, ConfigDict, Field

from ..envs.parsing import ToolCallParseError, parse_tool_calls
from ..records import ToolCall

Message = dict[str, Any]


class PolicyError(RuntimeError):
    """The policy cannot produce messages at all (model missing, endpoint refused every try)."""


class EndpointUnreachable(PolicyError):
    """Too many of a stage's episodes got no usable reply from the endpoint: the run stops
    rather than learn from failures that are not the agent's."""


class LoraApiMissing(PolicyError):
    """The server has no runtime LoRA API (404, 405 or 501 on /v1/load_lora_adapter)."""


class InvalidToolCall(BaseModel):
    """A tool call the model tried to make but that could not be read."""

    model_config = ConfigDict(extra="forbid")

    id: str
    name: str | None = Field(
        default=None, description="Tool name, when the server could read that much."
    )
    raw: str = Field(
        description="The text of the attempted call (or of its arguments, with a name)."
    )
    error: str = Field(description="Error kind: parse_error, bad_json, bad_arguments.")
    message: str


class AssistantMessage(BaseModel):
    """One assistant turn: tool calls, or a final answer in ``content``."""

    model_config = ConfigDict(extra="forbid")

    content: str = ""
    tool_calls: list[ToolCall] = Field(default_factory=list)
    invalid_tool_calls: list[InvalidToolCall] = Field(default_factory=list)
    raw: str | None = Field(
        default=None, description="Generated text before parsing, when there is any."
    )
    prompt_tokens: int = 0
    completion_tokens: int = 0
    finish_reason: str | None = None
    error: str | None = Field(
        default=None, description="Set when the policy failed for this conversation."
    )
    transport_failure: bool = Field(
        default=False,
        description="With ``error``: the endpoint gave no usable reply (connection, timeout, "
        "5xx or unreadable body after every retry), as opposed to refusing the request.",
    )
    prompt_token_ids: list[int] | None = Field(
        default=None,
        description="The prompt exactly as the model read it, in token ids; None when the "
        "policy cannot tell (an endpoint that does not return them).",
    )
    completion_token_ids: list[int] | None = Field(
        default=None,
        description="The tokens the model generated, exactly, its end-of-turn token included "
        "when it stopped; None when the policy cannot tell.",
    )
    completion_logprobs: list[float] | None = Field(
        default=None,
        description="Log-probability of each generated token under the model (one per "
        "completion token); None when the policy does not give them.",
    )

    @property
    def is_final(self) -> bool:
        """No calls, valid or not: the model answered."""
        return not self.tool_calls and not self.invalid_tool_calls

    def to_openai(self) -> Message:
        """The message as it goes back into the conversation.

        Generated text that held an unreadable call goes back verbatim, so the
        model sees exactly what it wrote next to the error it caused.
        """
        if self.raw is not None and any(bad.name is None for bad in self.invalid_tool_calls):
            return {"role": "assistant", "content": self.raw}
        message: Message = {"role": "assistant", "content": self.content}
        calls = [
            tool_call_message(call, call.id or f"call_{i}")
            for i, call in enumerate(self.tool_calls)
        ]
        calls += [function_call(bad.id, bad.name, bad.raw) for bad in self.invalid_tool_calls]
        if calls:
            message["tool_calls"] = calls
        return message


@runtime_checkable
class Policy(Protocol):
    """Anything that continues conversations with tool calls or answers."""

    version: str

    async def generate(
        self,
        conversations: Sequence[Sequence[Message]],
        tools: Sequence[Sequence[dict[str, Any]]],
        temperature: float | None = None,
    ) -> list[AssistantMessage]:
        """The next assistant message of each conversation (``tools[i]`` for ``conversations[i]``)."""
        ...

    async def aclose(self) -> None:
        """Release connections or memory."""
        ...


_TOOL_CALL_BLOCK = re.compile(r"<tool_call>(.*?)(?:</tool_call>|$)", re.DOTALL)


def parse_assistant_text(
    text: str, call_id_prefix: str = "call"
) -> tuple[str, list[ToolCall], list[InvalidToolCall]]:
    """Split generated text into content, parsed tool calls and unreadable ones.

    Calls are ``<tool_call>{json}</tool_call>`` blocks (the Qwen2.5 format TRL's
    templates use) or, in the plain-calls format, lines of Python call syntax
    (``find_contact(name="Ana")``); each is parsed on its own, so one bad call
    does not hide the good ones.
    """
    if not _TOOL_CALL_BLOCK.search(text) and _CALL_LINE.match(text.strip().split("\n")[0]):
        lines = [line.strip() for line in text.strip().split("\n") if line.strip()]
        return ("", *_parse_each(lines, call_id_prefix))
    blocks = [block.strip() for block in _TOOL_CALL_BLOCK.findall(text)]
    return (_TOOL_CALL_BLOCK.sub("", text).strip(), *_parse_each(blocks, call_id_prefix))


# A reply in the plain-calls format starts with a line like ``find_contact(name="Ana")``.
_CALL_LINE = re.compile(r"^[A-Za-z_][\w.]*\(.*\)?\s*$")


def _parse_each(
    pieces: Sequence[str], call_id_prefix: str
) -> tuple[list[ToolCall], list[InvalidToolCall]]:
    """Parse each piece (a tag block or a call line) on its own: one bad call hides no good one."""
    calls: list[ToolCall] = []
    invalid: list[InvalidToolCall] = []
    for index, piece in enumerate(pieces):
        call_id = f"{call_id_prefix}_{index}"
        try:
            parsed = parse_tool_calls(piece)
        except ToolCallParseError as err:
            invalid.append(InvalidToolCall(id=call_id, raw=piece, error=err.kind, message=str(err)))
            continue
        for offset, call in enumerate(parsed):
            calls.append(
                call.model_copy(update={"id": call_id if offset == 0 else f"{call_id}_{offset}"})
            )
    return calls, invalid


# json.dumps builds a new encoder for every call with non-default options; one encoder
# serves every tool call of a rollout (the same text as json.dumps(..., ensure_ascii=False)).
_ARGUMENTS_ENCODER = json.JSONEncoder(ensure_ascii=False)


def tool_call_message(call: ToolCall, call_id: str) -> dict[str, Any]:
    """A ToolCall as an OpenAI ``tool_calls`` entry."""
    return function_call(call_id, call.name, _ARGUMENTS_ENCODER.encode(call.arguments))


def function_call(call_id: str | None, name: str | None, arguments: str | None) -> dict[str, Any]:
    """An OpenAI ``tool_calls`` entry, its arguments a JSON string (or the raw text)."""
    return {"id": call_id, "type": "function", "function": {"name": name, "arguments": arguments}}


def arguments_as_dicts(messages: Sequence[Message]) -> list[Message]:
    """Copies of the messages with tool-call arguments decoded to dicts (what chat templates expect)."""
    return [
        {**message, "tool_calls": [_decoded(call) for call in message["tool_calls"]]}
        if message.get("tool_calls")
        else message
        for message in messages
    ]


def prepare_messages(messages: Sequence[Message]) -> list[Message]:
    """Messages as chat templates want them: arguments as dicts, content never None."""
    return [
        {**message, "content": ""} if message.get("content") is None else message
        for message in arguments_as_dicts(messages)
    ]


def _decoded(call: dict[str, Any]) -> dict[str, Any]:
    function = call.get("function", call)
    arguments = function.get("arguments", {})
    if isinstance(arguments, str):
        try:
            arguments = json.loads(arguments)
        except json.JSONDecodeError:
            arguments = {"_unparsed": arguments}
    return {**call, "function": {**function, "arguments": arguments}}
