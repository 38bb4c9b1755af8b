"""Reading an OpenAI-compatible chat-completions reply for the endpoint policy.

What is wrong with a body (``completion_problem``), the assistant message it
holds with its token ids and log-probabilities (``message_from_completion``),
and the start of a body for an error message (``shown``). Request bodies are
encoded once, with orjson (``encode_request``). An error body's message is read by
``common/http.py`` (``error_detail``), a Retry-After header by ``common/retry.py``.
"""

from __future__ import annotations

import json
from typing import Any

import orjson

from ...envs.parsing import ToolCallParseError, parse_tool_calls
from .policy_interface import AssistantMessage, InvalidToolCall, parse_assistant_text


def encode_request(request: dict[str, Any] | list[Any]) -> bytes:
    """The request body (or a part of it). orjson is 5-10x cheaper than json; a value it refuses (an
    integer beyond 64 bits) goes through json, which writes it as the SDK did."""
    try:
        return orjson.dumps(request, option=orjson.OPT_NON_STR_KEYS)
    except TypeError:
        return json.dumps(request).encode()


def shown(data: bytes) -> str:
    """The start of a body, for an error message."""
    return repr(data[:200].decode("utf-8", "replace"))


def _count(value: Any) -> int:
    return value if isinstance(value, int) and value >= 0 else 0


def completion_problem(body: Any) -> str | None:
    """Why ``body`` is not a usable chat completion, or None when it is."""
    if not isinstance(body, dict):
        return "not a JSON object"
    choices = body.get("choices")
    if not isinstance(choices, list) or not choices:
        return "no choices"
    choice = choices[0]
    if not isinstance(choice, dict) or not isinstance(choice.get("message"), dict):
        return "choice without a message"
    message = choice["message"]
    if not isinstance(message.get("content"), str | None):
        return "content is not text"
    calls = message.get("tool_calls")
    if calls is not None and not (
        isinstance(calls, list) and all(isinstance(c, dict) for c in calls)
    ):
        return "tool_calls is not a list of objects"
    return None


def message_from_completion(body: dict[str, Any], *, read_json_calls: bool) -> AssistantMessage:
    """The assistant message of a chat completion: the server's ``tool_calls``, or, when
    it gave none, the calls written in the text (``parse_assistant_text``; JSON call
    objects only with ``read_json_calls``)."""
    choice = body["choices"][0]
    message = choice["message"]
    text: str = message.get("content") or ""
    usage = body.get("usage")
    if not isinstance(usage, dict):
        usage = {}
    finish = choice.get("finish_reason")
    common: dict[str, Any] = {
        "prompt_tokens": _count(usage.get("prompt_tokens")),
        "completion_tokens": _count(usage.get("completion_tokens")),
        "finish_reason": finish if isinstance(finish, str) else None,
    }
    if "token_ids" in choice or "prompt_token_ids" in body or choice.get("logprobs"):
        common.update(_token_fields(body, choice))
    structured = message.get("tool_calls") or []
    if not structured and text:
        # A server without a tool-call parser for this model (transformers serve, vLLM
        # without --tool-call-parser) hands back the raw text: <tool_call> blocks, or
        # the plain call lines the bootstrap agent writes, or JSON (llama-server's Qwen2.5
        # Coder writes a fenced ```json call). Text with no call is the answer.
        parsed = parse_assistant_text(text, read_json_calls=read_json_calls)
        if parsed.tool_calls or parsed.invalid_tool_calls:
            return AssistantMessage(
                content=parsed.content,
                tool_calls=parsed.tool_calls,
                invalid_tool_calls=parsed.invalid_tool_calls,
                raw=text,
                call_form=parsed.form,
                **common,
            )

    calls = []
    invalid = []
    unnamed_raw: list[str] = []
    for index, item in enumerate(structured):
        call_id = item.get("id") if isinstance(item.get("id"), str) else f"call_{index}"
        function = item.get("function")
        function = function if isinstance(function, dict) else {}
        name = function.get("name") if isinstance(function.get("name"), str) else None
        arguments = function.get("arguments", "")
        raw = arguments if isinstance(arguments, str) else json.dumps(arguments)
        try:
            read = parse_tool_calls({"function": function})
        except ToolCallParseError as err:
            if not name:
                raw = json.dumps({**function, "arguments": _decoded(arguments)}, ensure_ascii=False)
                unnamed_raw.append(f"<tool_call>{raw}</tool_call>")
            invalid.append(
                InvalidToolCall(
                    id=call_id, name=name or None, raw=raw, error=err.kind, message=str(err)
                )
            )
            continue
        calls += [call.model_copy(update={"id": call_id}) for call in read]
    # A call without a name cannot be sent back as a tool call; AssistantMessage
    # then replays ``raw`` as text, so keep the attempted call in it.
    raw_text = "\n".join([text, *unnamed_raw]).strip() if unnamed_raw else (text or None)
    return AssistantMessage(
        content=text,
        tool_calls=calls,
        invalid_tool_calls=invalid,
        raw=raw_text,
        call_form="tool_calls_field" if structured else None,
        **common,
    )


def _token_fields(body: dict[str, Any], choice: dict[str, Any]) -> dict[str, Any]:
    """Token ids and log-probs, where the server gave them (vLLM with
    ``return_token_ids`` and ``logprobs``): the prompt's ids on the response (vLLM's
    chat completions; its text completions put them on the choice), the completion's on
    the choice, a log-prob per sampled token in ``choice.logprobs.content``. A field
    that is missing or not a list of numbers stays None: ids are data to train on,
    so a wrong one is worse than none."""
    prompt_ids = body.get("prompt_token_ids")
    if prompt_ids is None:
        prompt_ids = choice.get("prompt_token_ids")
    logprobs = choice.get("logprobs")
    entries = logprobs.get("content") if isinstance(logprobs, dict) else None
    values = None
    if isinstance(entries, list):
        values = [e.get("logprob") if isinstance(e, dict) else None for e in entries]
    return {
        "prompt_token_ids": _ints(prompt_ids),
        "completion_token_ids": _ints(choice.get("token_ids")),
        "completion_logprobs": _floats(values),
    }


def _ints(value: Any) -> list[int] | None:
    if isinstance(value, list) and all(type(v) is int for v in value):
        return value
    return None


def _floats(value: Any) -> list[float] | None:
    if isinstance(value, list) and all(
        isinstance(v, int | float) and not isinstance(v, bool) for v in value
    ):
        return [float(v) for v in value]
    return None


def _decoded(arguments: Any) -> Any:
    """Arguments as the model meant them, for showing an attempted call as text."""
    if isinstance(arguments, str):
        try:
            return json.loads(arguments)
        except json.JSONDecodeError:
            return arguments
    return arguments
