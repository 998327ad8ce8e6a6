"""The window of the thread-safe publisher: slots taken in any thread, given back on
the IO thread when confirms settle the messages."""

from __future__ import annotations

import threading
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import asyncio

__all__ = ["Releaser", "Window"]


class Window:
    """The window of unconfirmed messages: a counting semaphore on a plain lock.

    ``threading.Semaphore`` takes a ``Condition`` (Python-level enter and exit) for every
    slot; here the common case, a free slot, is one C-level lock round, and a batch
    takes all the free slots it needs in one round (:meth:`take`).
    """

    __slots__ = ("_closed", "_cond", "_free", "_lock")

    def __init__(self, size: int) -> None:
        self._lock = threading.Lock()
        self._cond = threading.Condition(self._lock)
        self._free = size
        self._closed = False

    def acquire(self, blocking: bool = True, timeout: float | None = None) -> bool:
        """Take one slot, waiting up to ``timeout`` (forever if ``None``) when blocking.

        Returns False at once, and to every waiter, once the window is closed.
        """
        with self._lock:
            if self._free > 0 and not self._closed:
                self._free -= 1
                return True
            if not blocking or not self._cond.wait_for(self._has_room, timeout):
                return False
            if self._closed:
                return False
            self._free -= 1
            return True

    def close(self) -> None:
        """The publisher closed: wake every waiter; no slot is handed out any more."""
        with self._lock:
            self._closed = True
            self._cond.notify_all()

    def take(self, most: int) -> int:
        """Take up to ``most`` free slots without waiting; returns how many."""
        if most <= 0 or self._closed:
            return 0
        with self._lock:
            got = min(most, self._free)
            self._free -= got
            return got

    def release(self, n: int = 1) -> None:
        with self._lock:
            self._free += n
            self._cond.notify(n)

    def _has_room(self) -> bool:
        return self._free > 0 or self._closed


class Releaser:
    """Gives window slots back, once per loop iteration (IO thread).

    A multiple-ack settles many messages at once; releasing the semaphore once for all
    of them costs one lock round instead of one per message.
    """

    __slots__ = ("_count", "_handle", "_loop", "_semaphore")

    def __init__(self, loop: asyncio.AbstractEventLoop, semaphore: Window) -> None:
        self._loop = loop
        self._semaphore = semaphore
        self._count = 0
        self._handle: asyncio.Handle | None = None

    def __call__(self) -> None:
        self._count += 1
        if self._handle is None:
            self._handle = self._loop.call_soon(self._flush)

    def _flush(self) -> None:
        count, self._count, self._handle = self._count, 0, None
        if count:
            self._semaphore.release(count)
