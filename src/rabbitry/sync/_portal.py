"""The IO thread, the hand-off into it, and the callback dispatcher.

Theory of operation
-------------------
Every sync :class:`~rabbitry.sync.Connection` owns one daemon thread running an asyncio
loop: the engine (``rabbitry.aio``) runs there and only there, so protocol state needs
no locks (thread confinement). Other threads reach it through :class:`Portal`:

* ``submit(fn, *args)`` appends to one deque and wakes the loop only if no wake-up is
  already pending, so a burst of publishes from a user thread costs one
  ``call_soon_threadsafe`` (one write to the loop's self-pipe), not one per message.
* ``call(coroutine_function, *args)`` goes through the same deque, so operations keep the
  order in which one thread issued them (``confirm_select`` before ``publish``), and
  waits for the result on a ``concurrent.futures.Future``.
* The deque is bounded (``max_pending``): a thread that outruns the socket blocks in
  ``submit`` instead of growing memory, and the drain stops while the transport's write
  buffer is above its high-water mark.

User callbacks never run on the IO thread (a slow one would stop heartbeats). They go to
:class:`Dispatcher`, a worker thread with a bounded queue; when it is full the IO thread
stops reading the socket (TCP back-pressure) until the worker catches up.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import logging
import queue
import threading
import time
from collections import deque
from concurrent.futures._base import CANCELLED, CANCELLED_AND_NOTIFIED, FINISHED, PENDING
from typing import TYPE_CHECKING, Any, TypeVar

from ..exceptions import InvalidStateError, Timeout

if TYPE_CHECKING:
    from collections.abc import Callable, Coroutine

__all__ = ["ConfirmFuture", "Dispatcher", "Portal"]

logger = logging.getLogger("rabbitry.sync")

T = TypeVar("T")


# Why private names of concurrent.futures: a ConfirmFuture must stay a real Future
# (isinstance, wait(), as_completed() read a future's _state, _condition and _waiters
# directly), yet skip Future.__init__, which builds a Condition and an RLock per future.
# With only the public API (a plain Future) the sync confirmed publish costs about 15
# more Python calls per message (66.5 instead of 51), past the call budget of
# tests/integration/test_perf_budget.py. tests/unit/sync/test_confirm_future.py checks
# the behaviour against the running Python (wait, as_completed, cancel, callbacks), so
# a change in these internals fails there first.
_DONE = (CANCELLED, CANCELLED_AND_NOTIFIED, FINISHED)
_CANCELLED = (CANCELLED, CANCELLED_AND_NOTIFIED)
# The one lock and condition every ConfirmFuture shares (an RLock, as the standard
# futures use, so concurrent.futures.wait() can take it once per future it watches).
_SHARED_CONDITION = threading.Condition()


class ConfirmFuture(concurrent.futures.Future[T]):
    """A ``concurrent.futures.Future`` that is cheap to create and to settle.

    The sync API returns one per confirmed publish, so its cost is paid per message. A
    standard future builds a ``Condition`` and an ``RLock`` of its own and notifies its
    condition on every settle; this one shares one condition between all instances,
    answers ``done()`` without taking it, and notifies only when a thread is actually
    blocked in :meth:`result` or :meth:`exception` of this future. It is a subclass, so
    ``isinstance``, ``add_done_callback``, ``cancel``, ``concurrent.futures.wait`` and
    ``as_completed`` behave as with any future.
    """

    def __init__(self) -> None:  # no super().__init__(): that builds the private lock
        self._condition = _SHARED_CONDITION
        self._state = PENDING
        self._result: T | None = None
        self._exception: BaseException | None = None
        self._waiters: list[Any] = []
        self._done_callbacks: list[Any] = []
        self._sleepers = 0

    def done(self) -> bool:
        return self._state in _DONE

    def _wait_done(self, timeout: float | None) -> None:
        if self._state in _DONE:
            return
        condition = self._condition
        with condition:
            if self._state in _DONE:
                return
            self._sleepers += 1
            try:
                if timeout is None:
                    while self._state not in _DONE:
                        condition.wait()
                    return
                deadline = time.monotonic() + timeout
                while self._state not in _DONE:
                    remaining = deadline - time.monotonic()
                    if remaining <= 0:
                        raise TimeoutError()
                    condition.wait(remaining)
            finally:
                self._sleepers -= 1

    def result(self, timeout: float | None = None) -> T:
        self._wait_done(timeout)
        if self._state in _CANCELLED:
            raise concurrent.futures.CancelledError()
        exc = self._exception
        if exc is not None:
            try:
                raise exc
            finally:
                del exc  # no reference cycle through the traceback
        return self._result  # type: ignore[return-value]

    def exception(self, timeout: float | None = None) -> BaseException | None:
        self._wait_done(timeout)
        if self._state in _CANCELLED:
            raise concurrent.futures.CancelledError()
        return self._exception

    def set_result(self, result: T) -> None:
        with self._condition:
            if self._state in _DONE:
                raise concurrent.futures.InvalidStateError(f"{self._state}: {self!r}")
            self._result = result
            self._state = FINISHED
            for waiter in self._waiters:
                waiter.add_result(self)
            if self._sleepers:
                self._condition.notify_all()
        if self._done_callbacks:
            self._invoke_callbacks()  # type: ignore[attr-defined]

    def set_exception(self, exception: BaseException | None) -> None:
        with self._condition:
            if self._state in _DONE:
                raise concurrent.futures.InvalidStateError(f"{self._state}: {self!r}")
            self._exception = exception
            self._state = FINISHED
            for waiter in self._waiters:
                waiter.add_exception(self)
            if self._sleepers:
                self._condition.notify_all()
        if self._done_callbacks:
            self._invoke_callbacks()  # type: ignore[attr-defined]


class Portal:
    """An asyncio loop on a daemon thread, and the way into it from other threads.

    Args:
        name: the thread's name.
        max_pending: operations queued for the loop before ``submit`` blocks.
    """

    def __init__(self, name: str, max_pending: int = 8192) -> None:
        self._loop = asyncio.new_event_loop()
        self._ops: deque[tuple[Callable[..., Any], tuple[Any, ...]]] = deque()
        self._wake_pending = False
        self._max_pending = max_pending
        self._room = threading.Condition()
        self._room_waiters = 0
        self._paused: Callable[[Callable[[], None]], bool] | None = None
        self._stopped = False
        #: The connection's callback dispatcher, told about blocking calls it makes.
        self.dispatcher: Dispatcher | None = None
        started = threading.Event()
        self._thread = threading.Thread(target=self._run, args=(started,), name=name, daemon=True)
        self._thread.start()
        started.wait()

    @property
    def loop(self) -> asyncio.AbstractEventLoop:
        """The loop running on the IO thread."""
        return self._loop

    @property
    def thread(self) -> threading.Thread:
        """The IO thread."""
        return self._thread

    def in_io_thread(self) -> bool:
        """True when called from the IO thread itself."""
        return threading.current_thread() is self._thread

    def set_write_gate(self, gate: Callable[[Callable[[], None]], bool]) -> None:
        """Install ``gate(resume) -> paused``: while it says paused, the drain waits.

        ``gate`` is called on the IO thread; when it returns True it must call
        ``resume`` once writing is possible again.
        """
        self._paused = gate

    def _run(self, started: threading.Event) -> None:
        asyncio.set_event_loop(self._loop)
        self._loop.call_soon(started.set)
        try:
            self._loop.run_forever()
        finally:
            try:
                pending = asyncio.all_tasks(self._loop)
                for task in pending:
                    task.cancel()
                if pending:
                    self._loop.run_until_complete(asyncio.gather(*pending, return_exceptions=True))
                self._loop.run_until_complete(self._loop.shutdown_asyncgens())
            finally:
                self._loop.close()

    # ------------------------------------------------------------------ hand-off

    def submit(self, fn: Callable[..., Any], *args: Any, timeout: float | None = None) -> None:
        """Run ``fn(*args)`` on the IO thread soon, after everything submitted before.

        Blocks while ``max_pending`` operations are waiting (at most ``timeout``).

        Raises:
            InvalidStateError: the portal is stopped.
            Timeout: no room within ``timeout``.
        """
        if self._stopped:
            raise InvalidStateError("the connection's IO thread has stopped")
        ops = self._ops
        if len(ops) >= self._max_pending and not self.in_io_thread():
            self._wait_for_room(timeout)
        ops.append((fn, args))
        # Order matters: append first, then look at the flag. _drain clears the flag
        # before it pops, so an item is always seen by a drain that is still to run.
        if not self._wake_pending:
            self._wake_pending = True
            self._loop.call_soon_threadsafe(self._drain)

    def _wait_for_room(self, timeout: float | None) -> None:
        with self._room:
            self._room_waiters += 1
            try:
                if not self._room.wait_for(
                    lambda: len(self._ops) < self._max_pending or self._stopped, timeout
                ):
                    raise Timeout(f"no room to queue the operation within {timeout} s")
            finally:
                self._room_waiters -= 1
        if self._stopped:
            raise InvalidStateError("the connection's IO thread has stopped")

    def _drain(self) -> None:
        self._wake_pending = False
        ops = self._ops
        gate = self._paused
        while ops:
            if gate is not None and gate(self._resume_drain):
                break
            fn, args = ops.popleft()
            try:
                fn(*args)
            except Exception:
                logger.exception("operation %r failed on the IO thread", fn)
        if self._room_waiters:
            with self._room:
                self._room.notify_all()

    def _resume_drain(self) -> None:
        if not self._wake_pending:
            self._wake_pending = True
            self._loop.call_soon(self._drain)

    def call(
        self,
        fn: Callable[..., Coroutine[Any, Any, T]],
        *args: Any,
        wait: float | None = None,
        **kwargs: Any,
    ) -> T:
        """Run coroutine ``fn(*args, **kwargs)`` on the IO thread and wait for its result.

        Args:
            wait: seconds to wait; past it the coroutine is cancelled and
                :class:`rabbitry.Timeout` raised. ``None`` waits until it finishes
                (a lost connection always finishes it).

        Raises:
            InvalidStateError: called from the IO thread (it would deadlock) or stopped.
            Timeout: the deadline passed.
        """
        if self.in_io_thread():
            raise InvalidStateError(
                "a blocking rabbitry call was made from the connection's IO thread "
                "(e.g. inside a callback run there); it would deadlock"
            )
        dispatcher = self.dispatcher
        if dispatcher is not None and dispatcher.blocking_call_started():
            try:
                return self._call(fn, args, kwargs, wait)
            finally:
                dispatcher.blocking_call_finished()
        return self._call(fn, args, kwargs, wait)

    def _call(
        self,
        fn: Callable[..., Coroutine[Any, Any, T]],
        args: tuple[Any, ...],
        kwargs: dict[str, Any],
        wait: float | None,
    ) -> T:
        result: concurrent.futures.Future[T] = concurrent.futures.Future()
        task_box: list[asyncio.Task[T]] = []

        def start() -> None:
            if not result.set_running_or_notify_cancel():
                return
            task = self._loop.create_task(fn(*args, **kwargs))
            task_box.append(task)

            def done(finished: asyncio.Task[T]) -> None:
                if finished.cancelled():
                    result.set_exception(Timeout("the operation was cancelled"))
                elif (exc := finished.exception()) is not None:
                    result.set_exception(exc)
                else:
                    result.set_result(finished.result())

            task.add_done_callback(done)

        self.submit(start, timeout=wait)
        try:
            return result.result(wait)
        except concurrent.futures.TimeoutError:
            if result.done():
                raise  # the coroutine's own TimeoutError (e.g. rabbitry.Timeout): keep it
            if result.cancel():
                raise Timeout(f"not started within {wait} s") from None
            self._loop.call_soon_threadsafe(lambda: task_box and task_box[0].cancel())
            raise Timeout(f"no result within {wait} s") from None

    def stop(self, timeout: float = 5.0) -> None:
        """Stop the loop and join the IO thread (idempotent; not from the IO thread)."""
        if self._stopped:
            return
        self._stopped = True
        with self._room:
            self._room.notify_all()
        if self._loop.is_running():
            self._loop.call_soon_threadsafe(self._loop.stop)
        if not self.in_io_thread():
            self._thread.join(timeout)


class Dispatcher:
    """Runs user callbacks on a worker thread, in order, with a bounded queue.

    ``post`` is called on the IO thread. When the queue is full the item is kept aside
    and ``pause_reading`` is called; the worker calls ``resume_reading`` (through the
    portal) once the queue has drained to half, and the kept items go first.

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
        portal: Portal,
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
        self._overflow: deque[tuple[Callable[..., Any], tuple[Any, ...]]] = deque()
        self._paused = False
        self._resume_asked = False
        self._pause_reading = pause_reading
        self._resume_reading = resume_reading
        self._low_water = max(1, maxsize // 2)
        self._stopping = False
        self._blocking_calls = 0
        self._thread = threading.Thread(target=self._run, name=name, daemon=True)
        self._thread.start()

    @property
    def thread(self) -> threading.Thread:
        """The worker thread."""
        return self._thread

    def post(self, fn: Callable[..., Any], *args: Any) -> None:
        """Queue ``fn(*args)`` for the worker (IO thread only)."""
        if not self._overflow and self._queue.qsize() < self._maxsize:
            self._queue.put((fn, args))
            return
        self._overflow.append((fn, args))
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
                return
            fn, args = item
            try:
                fn(*args)
            except Exception:
                logger.exception("callback %r failed", fn)
            if self._stopping and self._queue.empty():
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

        Items kept aside while reading was paused are dropped: their connection is
        closing. The worker ends even if the queue is full (it checks after each item).
        """
        self._stopping = True
        self._overflow.clear()
        if self._queue.qsize() < self._maxsize:
            self._queue.put(self._STOP)
        # else the worker is busy and sees _stopping once the queue is empty
        if threading.current_thread() is not self._thread:
            self._thread.join(timeout)
