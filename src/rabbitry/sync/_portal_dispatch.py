"""The callback dispatcher: user callbacks run on a worker thread, never on the IO thread.

A slow callback on the IO thread would stop heartbeats; :class:`Dispatcher` runs them on
its own thread, in order, with a bounded queue, and stops the socket being read (TCP
back-pressure) while the queue is full.
"""

from __future__ import annotations

import logging
import queue
import threading
from collections import deque
from typing import TYPE_CHECKING, Any, Protocol

from .._support.failure_log import RateLimitedLog
from ..exceptions import InvalidStateError

if TYPE_CHECKING:
    import asyncio
    from collections.abc import Callable

logger = logging.getLogger("rabbitry.sync")


class DispatchPortal(Protocol):
    """What a dispatcher uses of its :class:`~rabbitry.sync._portal.Portal`."""

    @property
    def loop(self) -> asyncio.AbstractEventLoop:
        """The loop running on the IO thread."""
        ...

    def submit(
        self,
        fn: Callable[..., Any],
        *args: Any,
        timeout: float | None = None,
        size: int = 0,
    ) -> None:
        """Run ``fn(*args)`` on the IO thread soon, after everything submitted before."""
        ...


class Dispatcher:
    """Runs user callbacks on a worker thread, in order, with a bounded queue.

    ``post`` is called on the IO thread. When the queue is full the item is kept aside
    and ``pause_reading`` is called; the worker calls ``resume_reading`` (through the
    portal) once the queue has drained to half, and the kept items go first.

    Deliveries are posted with their channel (``post_delivery``): one whose channel has
    closed by the time the worker reaches it is dropped, not run (the broker requeues
    it, and its ack could only fail), so no consumer callback starts after ``close()``.

    Args:
        portal: the connection's portal.
        name: the worker thread's name.
        maxsize: queued callbacks before the socket stops being read.
        pause_reading: called on the IO thread to stop reading the socket.
        resume_reading: called on the IO thread to read again.
    """

    _STOP = object()

    def __init__(
        self,
        portal: DispatchPortal,
        name: str,
        maxsize: int,
        pause_reading: Callable[[], None],
        resume_reading: Callable[[], None],
    ) -> None:
        self._portal = portal
        # A SimpleQueue (C, no lock round trips in Python) bounded by hand: only the IO
        # thread puts, so checking qsize() first keeps it at most ``maxsize`` long.
        self._queue: queue.SimpleQueue[Any] = queue.SimpleQueue()
        self._maxsize = maxsize
        self._overflow: deque[tuple[Callable[..., Any], tuple[Any, ...], Any]] = deque()
        self._paused = False
        self._resume_asked = False
        self._pause_reading = pause_reading
        self._resume_reading = resume_reading
        self._low_water = max(1, maxsize // 2)
        self._stopping = False
        self._blocking_calls = 0
        # Callbacks that raise (a consumer callback may raise on every message): ERROR
        # with the traceback, rate-limited with counts; the IO loop times the summary.
        self._errors = RateLimitedLog(logger, name, "callback failures", loop=portal.loop)
        self._thread = threading.Thread(target=self._run, name=name, daemon=True)
        self._thread.start()

    @property
    def thread(self) -> threading.Thread:
        """The worker thread."""
        return self._thread

    @property
    def stopping(self) -> bool:
        """:meth:`stop` was called: what is posted from now on may never run."""
        return self._stopping

    def post(self, fn: Callable[..., Any], *args: Any) -> None:
        """Queue ``fn(*args)`` for the worker (IO thread only)."""
        item = (fn, args, None)
        if not self._overflow and self._queue.qsize() < self._maxsize:
            self._queue.put(item)
            return
        self._overflow.append(item)
        if not self._paused and not self._blocking_calls:
            self._paused = True
            self._pause_reading()

    def post_delivery(self, channel: Any, fn: Callable[..., Any], *args: Any) -> None:
        """Queue ``fn(*args)``, dropped if ``channel`` has closed before it runs.

        ``channel`` is an :class:`~rabbitry.aio.channel.AsyncChannel` (its ``close_exc``
        is set once it has closed) or ``None`` for a callback that always runs.
        """
        item = (fn, args, channel)
        if not self._overflow and self._queue.qsize() < self._maxsize:
            self._queue.put(item)
            return
        self._overflow.append(item)
        # While a callback waits for a blocking call, its answer must still be read:
        # pausing then would deadlock it, so the overflow grows for that long instead.
        if not self._paused and not self._blocking_calls:
            self._paused = True
            self._pause_reading()

    def blocking_call_started(self) -> bool:
        """A thread is about to block on the IO thread; True if it is this worker."""
        if threading.current_thread() is not self._thread:
            return False
        self._blocking_calls += 1
        if self._paused:
            self._portal.submit(self._unpause)
        return True

    def blocking_call_finished(self) -> None:
        """The worker's blocking call returned."""
        self._blocking_calls -= 1

    def _unpause(self) -> None:
        if self._paused and self._blocking_calls:
            self._paused = False
            self._resume_reading()

    def _refill(self) -> None:
        """IO thread: move kept items into the queue; read the socket again when empty."""
        self._resume_asked = False
        overflow = self._overflow
        put, qsize, maxsize = self._queue.put, self._queue.qsize, self._maxsize
        while overflow:
            if qsize() >= maxsize:
                return
            put(overflow.popleft())
        if self._paused:
            self._paused = False
            self._resume_reading()

    def _run(self) -> None:
        get = self._queue.get
        while True:
            item = get()
            if item is self._STOP:
                self._errors.flush()
                return
            fn, args, channel = item
            if channel is None or channel.close_exc is None:
                try:
                    fn(*args)
                except Exception as exc:
                    self._errors.log("raised", "callback %r failed", fn, exc_info=exc)
            if self._stopping and self._queue.empty():
                self._errors.flush()
                return
            if (
                (self._paused or self._overflow)
                and not self._resume_asked
                and self._queue.qsize() < self._low_water
            ):
                self._resume_asked = True
                try:
                    self._portal.submit(self._refill)
                except InvalidStateError:
                    return

    def stop(self, timeout: float = 5.0) -> None:
        """Run the callbacks already queued, then end the worker (waits ``timeout`` at most).

        Deliveries of closed channels are skipped (the connection closed them all before
        this), and items kept aside while reading was paused are dropped. The worker
        ends even if the queue is full (it checks after each item).
        """
        self._stopping = True
        self._overflow.clear()
        if self._queue.qsize() < self._maxsize:
            self._queue.put(self._STOP)
        # else the worker is busy and sees _stopping once the queue is empty
        if threading.current_thread() is not self._thread:
            self._thread.join(timeout)
