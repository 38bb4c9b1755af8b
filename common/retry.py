"""One retry policy for every request to an endpoint: the policy's chat completions, the
synthesis roles' and the embeddings.

What is retried: HTTP 408, 429 and 5xx, and transport failures (refused, reset, timed out;
each caller also counts a reply it cannot read as one). Nothing else: any other 4xx is the
request's fault and asking again cannot help. How long to wait: exponential backoff from
``retry_base_s``, doubled per failed attempt up to ``retry_max_s``, with jitter (x0.5 to
x1.5, so the retries of a batch do not arrive in lockstep); a server's ``Retry-After`` is
honoured up to ``retry_max_s``. How often: ``max_retries`` times after the first attempt.
The settings are the endpoint's (``EndpointConfig``); the loops are tenacity's.
"""

from __future__ import annotations

import random
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from tenacity import (
    AsyncRetrying,
    RetryCallState,
    Retrying,
    retry_if_exception,
    stop_after_attempt,
)

# Besides 5xx: request timeout, too many requests.
RETRIED_STATUSES = (408, 429)


def retryable_status(status: int) -> bool:
    """Whether an HTTP status is worth asking again (408, 429, 5xx)."""
    return status in RETRIED_STATUSES or status >= 500


def retry_after_s(value: str | None) -> float | None:
    """A ``Retry-After`` header in seconds (the HTTP-date form is rare enough to ignore)."""
    if not value:
        return None
    try:
        seconds = float(value)
    except ValueError:
        return None
    return seconds if seconds >= 0 else None


def asked_wait_s(error: BaseException | None) -> float | None:
    """The wait a failed attempt's server asked for: an error's ``retry_after_s``, or the
    ``Retry-After`` header of the HTTP response it carries (openai's, httpx's errors)."""
    if error is None:
        return None
    cause = getattr(error, "cause", None)  # a ReplyError: the error it wraps
    if isinstance(cause, BaseException) and cause is not error:
        asked_by_cause = asked_wait_s(cause)
        if asked_by_cause is not None:
            return asked_by_cause
    asked = getattr(error, "retry_after_s", None)
    if isinstance(asked, int | float):
        return float(asked)
    response = getattr(error, "response", None)
    headers = getattr(response, "headers", None)
    if headers is None:
        return None
    try:
        return retry_after_s(headers.get("retry-after"))
    except AttributeError:
        return None


@dataclass(frozen=True)
class RetryPolicy:
    """``max_retries`` retries, backoff from ``retry_base_s`` to ``retry_max_s``."""

    max_retries: int = 3
    retry_base_s: float = 0.2
    retry_max_s: float = 5.0

    @classmethod
    def of(cls, endpoint: Any) -> RetryPolicy:
        """The policy of an ``EndpointConfig`` (or anything with its three settings)."""
        return cls(
            max_retries=int(getattr(endpoint, "max_retries", cls.max_retries)),
            retry_base_s=float(getattr(endpoint, "retry_base_s", cls.retry_base_s)),
            retry_max_s=float(getattr(endpoint, "retry_max_s", cls.retry_max_s)),
        )

    def delay(self, failed: int, error: BaseException | None = None) -> float:
        """Seconds before the next attempt after ``failed`` failed ones."""
        delay = min(self.retry_max_s, self.retry_base_s * 2 ** (failed - 1))
        delay *= random.uniform(0.5, 1.5)
        asked = asked_wait_s(error)
        if asked is not None:
            delay = max(delay, min(asked, self.retry_max_s))
        return delay

    def _settings(
        self, retryable: Callable[[BaseException], bool], done_before: int
    ) -> dict[str, Any]:
        """tenacity's settings for one request, ``done_before`` attempts made outside it."""

        def wait(state: RetryCallState) -> float:
            error = state.outcome.exception() if state.outcome else None
            return self.delay(state.attempt_number + done_before, error)

        return {
            "retry": retry_if_exception(retryable),
            "stop": stop_after_attempt(max(1, self.max_retries + 1 - done_before)),
            "wait": wait,
            "reraise": True,
        }

    def asynchronous(
        self, retryable: Callable[[BaseException], bool], done_before: int = 0
    ) -> AsyncRetrying:
        """An ``AsyncRetrying`` for one request (tenacity keeps a call's state on it: one
        per request); ``done_before`` attempts were made outside it."""
        return AsyncRetrying(**self._settings(retryable, done_before))

    def synchronous(self, retryable: Callable[[BaseException], bool]) -> Retrying:
        """A ``Retrying`` for one blocking request."""
        return Retrying(**self._settings(retryable, 0))
