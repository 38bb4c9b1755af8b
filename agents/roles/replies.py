"""The reply boundary of the synthesis roles: what counts as an endpoint's failure to reply.

Every request a role makes goes through ``ask``: whatever fails between sending
it and holding a chat message (the connection, an error status, a body that is
not a chat completion, the client library's own parsing of it:
``{"choices": null}`` makes the openai SDK raise TypeError) becomes a
``ReplyError`` with its kind and reason. Failed attempts are retried under the
endpoint's retry policy (``max_retries``, backoff from ``retry_base_s``; the
chat model itself asks once, so there is one policy), and counted where the
caller asked (``counting_replies``), with the tokens of the replies that came
(``count_reply_tokens``). The chat model (``chat_endpoint.py``)
marks an attempt answered once a response arrives (``mark_answered``): an exception
raised before that is ours (a bad argument, a bug) and is raised as it is, so a
programming error still ends a pass. Replies are bounded before anything reads
them (``check_reply_length``): a reply longer than the endpoint's limit is a
``ReplyTooLongError`` and is not asked again.
"""

from __future__ import annotations

import asyncio
import contextvars
import logging
from collections import Counter
from collections.abc import Iterator, Sequence
from contextlib import AbstractAsyncContextManager, contextmanager, nullcontext
from dataclasses import dataclass, field
from typing import Any, Literal

from langchain_core.messages import BaseMessage

from ...common.retry import RetryPolicy

log = logging.getLogger(__name__)


ReplyKind = Literal["transport", "status", "body", "too_long"]


class ReplyError(RuntimeError):
    """An endpoint gave no readable reply. ``kind`` says where it failed: ``transport`` (no
    answer: refused, dropped, timed out), ``status`` (an HTTP error status), ``body`` (an
    answer that is no chat completion, the client library's parsing included) or
    ``too_long``; the message says what happened, and ``cause`` is the original error."""

    def __init__(self, kind: ReplyKind, reason: str, cause: BaseException | None = None):
        super().__init__(reason)
        self.kind: ReplyKind = kind
        self.cause = cause


class ReplyTooLongError(ReplyError):
    """A reply longer than the endpoint's limit; it is rejected unread, and not asked again."""

    def __init__(self, length: int, limit: int, model: str):
        super().__init__(
            "too_long",
            f"reply too long: {length} characters from {model}, limit {limit} "
            "(raise endpoints.<name>.max_reply_chars or max_tokens if such replies are expected)",
        )
        self.length = length
        self.limit = limit


def reply_length(response: Any) -> int:
    """Characters of reply text in a chat completion (an SDK object or a dict): every
    choice's content plus its tool calls' arguments."""
    total = 0
    for choice in field_of(response, "choices") or []:
        message = field_of(choice, "message")
        content = field_of(message, "content")
        total += len(content) if isinstance(content, str) else 0
        for call in field_of(message, "tool_calls") or []:
            arguments = field_of(field_of(call, "function"), "arguments")
            total += len(arguments) if isinstance(arguments, str) else 0
    return total


def check_reply_length(response: Any, limit: int | None, model: str) -> None:
    """``ReplyTooLongError`` when a chat completion's reply text is longer than ``limit``."""
    if limit is None:
        return
    length = reply_length(response)
    if length > limit:
        raise ReplyTooLongError(length, limit, model)


def field_of(obj: Any, key: str) -> Any:
    return obj.get(key) if isinstance(obj, dict) else getattr(obj, key, None)


def model_label(model: Any) -> str:
    """The model name a role prints in its ``name`` ("llm(<model>)")."""
    return str(getattr(model, "model_name", None) or getattr(model, "model", None) or "model")


def limited(limiter: asyncio.Semaphore | None) -> AbstractAsyncContextManager[Any]:
    """The limiter as a context manager; no limit when there is none."""
    return limiter if limiter is not None else nullcontext()


class _Attempt:
    """One request in flight through ``ask``: whether any reply came back for it."""

    answered = False


# The attempt ``ask`` is making in this task; the chat models' transport marks it answered.
_ATTEMPT: contextvars.ContextVar[_Attempt | None] = contextvars.ContextVar(
    "coevolve_reply_attempt", default=None
)


@dataclass
class ReplyCounts:
    """What the requests made inside ``counting_replies`` cost and lost: failed attempts by
    kind (each once, retried or not), and the tokens the endpoints reported for the replies
    that came (``usage``; a server that reports none adds nothing)."""

    errors: Counter[str] = field(default_factory=Counter)
    prompt_tokens: int = 0
    completion_tokens: int = 0


# Where replies are counted (``counting_replies``); None: not counted.
_REPLY_COUNTS: contextvars.ContextVar[ReplyCounts | None] = contextvars.ContextVar(
    "coevolve_reply_counts", default=None
)


def mark_answered() -> None:
    """Note that a response came back for the request ``ask`` is making in this task."""
    attempt = _ATTEMPT.get()
    if attempt is not None:
        attempt.answered = True


def count_reply_tokens(prompt_tokens: int, completion_tokens: int) -> None:
    """Add one reply's token usage to the counts of the enclosing ``counting_replies``."""
    counts = _REPLY_COUNTS.get()
    if counts is not None:
        counts.prompt_tokens += prompt_tokens
        counts.completion_tokens += completion_tokens


@contextmanager
def counting_replies() -> Iterator[ReplyCounts]:
    """Count the reply errors and the tokens of every request made inside the block (and
    in the tasks it starts)."""
    counts = ReplyCounts()
    token = _REPLY_COUNTS.set(counts)
    try:
        yield counts
    finally:
        _REPLY_COUNTS.reset(token)


def _as_reply_error(err: Exception, answered: bool, model: str) -> ReplyError | None:
    """The reply error ``err`` stands for, or None when it is not about a reply (a bug of
    ours, or a request refused before it left)."""
    import openai

    if isinstance(err, ReplyError):
        return err
    if isinstance(err, openai.APIStatusError):
        return ReplyError(
            "status", f"HTTP {err.status_code} from {model}: {describe_error(err)}", err
        )
    if isinstance(err, openai.APIConnectionError):  # timeouts included
        return ReplyError("transport", f"no reply from {model}: {describe_error(err)}", err)
    if isinstance(err, openai.APIResponseValidationError) or answered:
        # The server answered and reading the answer failed, wherever: the SDK's parser,
        # langchain's message builder, our length check. That is the reply's fault.
        return ReplyError("body", f"unreadable reply from {model}: {describe_error(err)}", err)
    return None


def _worth_retrying(error: ReplyError) -> bool:
    if error.kind == "too_long" or names_response_format(error.cause):
        return False
    status = getattr(error.cause, "status_code", None)
    return not (isinstance(status, int) and 400 <= status < 500 and status not in (408, 429))


def _retry_policy(model: Any) -> RetryPolicy:
    """The retry policy of the endpoint behind a chat model."""
    retries = getattr(model, "reply_retries", 0)
    base = getattr(model, "retry_base_s", 0.2)
    most = getattr(model, "retry_max_s", 5.0)
    return RetryPolicy(
        retries if isinstance(retries, int) else 0,
        base if isinstance(base, int | float) else 0.2,
        most if isinstance(most, int | float) else 5.0,
    )


async def ask(
    runnable: Any,
    messages: Sequence[BaseMessage],
    limiter: asyncio.Semaphore | None = None,
    *,
    model: Any = None,
    passthrough: tuple[type[BaseException], ...] = (),
) -> Any:
    """``runnable.ainvoke(messages)`` through the reply boundary; ``ReplyError`` when no
    readable reply came.

    ``model`` is the chat model behind ``runnable`` (default: ``runnable`` itself):
    its endpoint's retry policy applies. A failed attempt is asked again up to
    ``max_retries`` times with exponential backoff and jitter, unless retrying
    cannot help: a reply too long (a server that ignores ``max_tokens``), or a 4xx
    other than 408 and 429 (the request itself was refused). Exceptions of
    ``passthrough`` types are raised as they are.
    """
    chat = runnable if model is None else model
    label = model_label(chat)
    policy = _retry_policy(chat)

    async def attempt_once() -> Any:
        attempt = _Attempt()
        token = _ATTEMPT.set(attempt)
        try:
            async with limited(limiter):
                return await runnable.ainvoke(list(messages))
        except passthrough:
            raise
        except Exception as err:
            error = _as_reply_error(err, attempt.answered, label)
            if error is None:
                raise
        finally:
            _ATTEMPT.reset(token)
        counts = _REPLY_COUNTS.get()
        if counts is not None:
            counts.errors[error.kind] += 1
        raise error from error.cause

    def retryable(error: BaseException) -> bool:
        return isinstance(error, ReplyError) and _worth_retrying(error)

    def log_retry(state: Any) -> None:
        error = state.outcome.exception() if state.outcome else None
        log.info("%s; asking again (%d of %d)", error, state.attempt_number, policy.max_retries)

    # The endpoints' one retry policy (common/retry.py): backoff with jitter, a server's
    # Retry-After honoured.
    retrying = policy.asynchronous(retryable)
    retrying.before_sleep = log_retry
    return await retrying(attempt_once)


def raise_unless_one_replied(outcomes: Sequence[object]) -> None:
    """Of the outcomes of requests gathered with ``return_exceptions=True``: raise any that
    is not a ``ReplyError`` (a bug, or a cancellation: not the endpoint's doing), and the
    first ``ReplyError`` when every request failed (nothing readable came: the caller's
    item fails with the endpoint's reason). Some replies and some errors return."""
    failures = [outcome for outcome in outcomes if isinstance(outcome, BaseException)]
    for failure in failures:
        if not isinstance(failure, ReplyError):
            raise failure
    if failures and len(failures) == len(outcomes):
        raise failures[0]


def names_response_format(err: BaseException | None) -> bool:
    """A server error about the request's response_format (a server answered json_schema
    with HTTP 500): asking again cannot help."""
    import openai

    if not isinstance(err, openai.InternalServerError):
        return False
    text = str(err).lower()
    return "response_format" in text or "json_schema" in text


def describe_error(err: BaseException) -> str:
    text = str(err).strip().replace("\n", " ")
    if len(text) > 300:
        text = text[:300] + "..."
    return f"{type(err).__name__}: {text}" if text else type(err).__name__
