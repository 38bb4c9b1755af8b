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

import functools
import json
import re
from collections.abc import Callable, Sequence
from typing import Any, NamedTuple, Protocol, runtime_checkable

from pydantic import BaseModel, ConfigDict, Field

from ...envs.parsing import UNREADABLE_CALL, ToolCallParseError, parse_tool_calls
from ...records import CallForm, ToolCall

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
    error: str = Field(
        description="Error kind: parse_error, bad_json, bad_arguments, or unreadable_call "
        "(text that looks like a call in no form the policy reads)."
    )
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
    call_form: CallForm | None = Field(
        default=None,
        description="How the model wrote its calls (the server's tool_calls field, a "
        "<tool_call> tag, bare or fenced JSON, call lines); None without calls, or for a "
        "policy that hands calls over without a reply to read (the oracle).",
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
# A reply in the plain-calls format starts with a line like ``find_contact(name="Ana")``.
_CALL_LINE = re.compile(r"^[A-Za-z_][\w.]*\(.*\)?\s*$")
# A fenced block (```json, ```, ...); one the reply's token budget cut off runs to the end.
_FENCED_BLOCK = re.compile(r"```[\w-]*[ \t]*\n?(.*?)(?:```|\Z)", re.DOTALL)
# JSON text that names a tool, as a call object does: ``"name": ...`` or ``"function": ...``.
_NAMES_A_TOOL = re.compile(r'"(?:name|function)"\s*:')
# The same as the start of an object, for a call written inside prose.
_OBJECT_NAMING_A_TOOL = re.compile(r'\{\s*"(?:name|function)"\s*:')
# Keys a call object may hold besides its arguments (OpenAI's and Qwen's shapes).
_CALL_OBJECT_KEYS = frozenset({"name", "id", "type"})
# Reads one piece of text into calls (None: the piece is no call); raises
# ToolCallParseError for a call it cannot read.
_Reader = Callable[[str], "list[ToolCall] | None"]


class ParsedReply(NamedTuple):
    """Generated text split into the answer text, the calls read and the unreadable ones."""

    content: str
    tool_calls: list[ToolCall]
    invalid_tool_calls: list[InvalidToolCall]
    form: CallForm | None  # how the calls were written; None when the text holds no call


def parse_assistant_text(
    text: str, call_id_prefix: str = "call", *, read_json_calls: bool
) -> ParsedReply:
    """Split generated text into content, parsed tool calls and unreadable ones.

    Calls are read, in this order, from ``<tool_call>{json}</tool_call>`` blocks (the
    Qwen2.5 format TRL's templates use), from lines of Python call syntax
    (``find_contact(name="Ana")``, the plain-calls format), and, with
    ``read_json_calls``, from a JSON call object ``{"name": ..., "arguments": ...}``
    (or a list of them) that is the whole reply or sits in fenced blocks (```json);
    each is parsed on its own (``envs.parsing.parse_tool_calls``), so one bad call does
    not hide the good ones.

    Text that looks like a call but is in none of these forms (JSON naming a tool that
    does not parse, an unclosed ``<tool_call>`` whose body does not parse, a call
    object in prose, or a JSON call with ``read_json_calls`` off) is an
    ``unreadable_call``: a failed call the episode counts, never the answer.
    """
    if _TOOL_CALL_BLOCK.search(text):
        blocks = [
            (block.group(1).strip(), _tag_reader(closed=block.group(0).endswith("</tool_call>")))
            for block in _TOOL_CALL_BLOCK.finditer(text)
        ]
        content = _TOOL_CALL_BLOCK.sub("", text).strip()
        return ParsedReply(content, *_read_each(blocks, call_id_prefix), "tool_call_tag")
    if _CALL_LINE.match(text.strip().split("\n")[0]):
        lines = [
            (line.strip(), parse_tool_calls) for line in text.strip().split("\n") if line.strip()
        ]
        return ParsedReply("", *_read_each(lines, call_id_prefix), "call_line")
    return _json_calls(text, call_id_prefix, read_json_calls)


def _tag_reader(closed: bool) -> _Reader:
    """How a ``<tool_call>`` block is read. An unclosed one (the token budget cut the reply)
    is read when what it holds parses; when not, the call was never finished: an
    ``unreadable_call``, where a closed block keeps the parser's kind (bad_json, ...)."""
    if closed:
        return parse_tool_calls

    def read_unclosed(body: str) -> list[ToolCall]:
        try:
            return parse_tool_calls(body)
        except ToolCallParseError as err:
            raise ToolCallParseError(
                UNREADABLE_CALL, f"the <tool_call> is not closed and cannot be read: {err}"
            ) from None

    return read_unclosed


def _json_calls(text: str, call_id_prefix: str, read_json_calls: bool) -> ParsedReply:
    """The JSON forms: the whole reply one call object (or list), or fenced blocks of them."""
    whole = text.strip()
    form: CallForm
    if whole.startswith(("{", "[")):
        pieces, form, rest = [whole], "bare_json", ""
    else:
        fenced = [
            block
            for block in _FENCED_BLOCK.finditer(text)
            if block.group(1).strip().startswith(("{", "["))
        ]
        pieces = [block.group(1).strip() for block in fenced]
        form = "fenced_json"
        rest = "".join(
            text[start:end] for start, end in _gaps(len(text), [b.span() for b in fenced])
        ).strip()
    read = functools.partial(_read_json_call, read_json_calls=read_json_calls)
    calls, invalid = _read_each([(piece, read) for piece in pieces], call_id_prefix)
    if calls or invalid:
        return ParsedReply(rest, calls, invalid, form)
    if not pieces and _OBJECT_NAMING_A_TOOL.search(text):
        problem = ToolCallParseError(
            UNREADABLE_CALL,
            "the reply holds a tool call inside other text; write the call alone, in a "
            'fenced block, or as <tool_call>{"name": ..., "arguments": {...}}</tool_call>',
        )
        return ParsedReply("", [], [_unreadable(f"{call_id_prefix}_0", text, problem)], None)
    return ParsedReply(text.strip(), [], [], None)


def _gaps(length: int, spans: Sequence[tuple[int, int]]) -> list[tuple[int, int]]:
    """The stretches of ``range(length)`` between the sorted, disjoint ``spans``."""
    gaps, start = [], 0
    for begin, end in spans:
        gaps.append((start, begin))
        start = end
    return [*gaps, (start, length)]


def _read_json_call(piece: str, *, read_json_calls: bool) -> list[ToolCall] | None:
    """The calls of one JSON piece; None when it is JSON but no call (data in an answer).

    Raises ToolCallParseError(``unreadable_call``) for a piece that names a tool and
    cannot be read, or is a call while JSON calls are not read."""
    try:
        data = json.loads(piece)
    except json.JSONDecodeError as err:
        if not _NAMES_A_TOOL.search(piece):
            return None
        raise ToolCallParseError(
            UNREADABLE_CALL,
            f"the tool call is not valid JSON: {err.msg} at char {err.pos}",
        ) from None
    if not _is_call_object(data):
        return None
    if not read_json_calls:
        raise ToolCallParseError(
            UNREADABLE_CALL,
            "a tool call written as a JSON object is not read by this policy "
            "(policy.read_json_calls is off); write it as <tool_call>{...}</tool_call>",
        )
    try:
        return parse_tool_calls(data)
    except ToolCallParseError as err:
        raise ToolCallParseError(UNREADABLE_CALL, f"the tool call cannot be read: {err}") from None


def _is_call_object(data: Any) -> bool:
    """Whether parsed JSON is shaped as a call: ``{"name", "arguments"}``, OpenAI's
    ``{"function": {...}}``, a bare ``{"name"}``, or a list of those. An object with a
    "name" and other keys (``{"name": "Ana", "phone": ...}``) is data, not a call."""
    if isinstance(data, list):
        return bool(data) and all(_is_call_object(item) for item in data)
    if not isinstance(data, dict):
        return False
    if isinstance(data.get("function"), dict):
        return True
    if "name" not in data:
        return False
    return "arguments" in data or "parameters" in data or set(data) <= _CALL_OBJECT_KEYS


def _unreadable(call_id: str, raw: str, err: ToolCallParseError) -> InvalidToolCall:
    return InvalidToolCall(id=call_id, raw=raw, error=err.kind, message=str(err))


def _read_each(
    pieces: Sequence[tuple[str, _Reader]], call_id_prefix: str
) -> tuple[list[ToolCall], list[InvalidToolCall]]:
    """Read each piece (a tag block, a call line, a JSON call) with its reader, on its own:
    one bad call hides no good one. A reader returns None for a piece that is no call."""
    calls: list[ToolCall] = []
    invalid: list[InvalidToolCall] = []
    for index, (piece, read) in enumerate(pieces):
        call_id = f"{call_id_prefix}_{index}"
        try:
            parsed = read(piece)
        except ToolCallParseError as err:
            invalid.append(_unreadable(call_id, piece, err))
            continue
        for offset, call in enumerate(parsed or []):
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
