"""One value per asyncio event loop.

Connections, semaphores and locks belong to the event loop that made them. A
caller that runs ``asyncio.run`` more than once with the same policy (a script, a
test, the cycle runner) would otherwise reuse a dead loop's semaphore and fail with
"Event loop is closed". The endpoint policy keeps its semaphore here; the HTTP
client (``common/http.py``) keeps its sessions per loop itself.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Callable
from typing import Generic, TypeVar

T = TypeVar("T")


class PerLoop(Generic[T]):
    """A value made by ``make`` on first use in each running event loop.

    Values of closed loops are dropped when the next one is made: they hold
    connections of a loop that is gone, which cannot be closed any more. (A
    weak mapping would not free them: a pooled connection or a semaphore refers
    to its loop, so the loop never dies while its value is held.)
    """

    def __init__(self, make: Callable[[], T]) -> None:
        self._make = make
        self._values: dict[asyncio.AbstractEventLoop, T] = {}
        self._lock = threading.Lock()  # loops of several threads may share this holder

    def get(self) -> T:
        """The running loop's value, made now if this loop has none."""
        loop = asyncio.get_running_loop()
        value = self._values.get(loop)
        if value is None:
            with self._lock:
                self._values = {
                    key: held for key, held in self._values.items() if not key.is_closed()
                }
                value = self._values[loop] = self._make()
        return value

    def pop(self) -> T | None:
        """Forget the running loop's value and return it (None if it has none), to be closed."""
        loop = asyncio.get_running_loop()
        with self._lock:
            return self._values.pop(loop, None)

    def clear(self) -> None:
        """Forget every loop's value."""
        with self._lock:
            self._values = {}
