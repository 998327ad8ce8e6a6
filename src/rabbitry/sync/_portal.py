"""The IO thread, the hand-off into it, and the callback dispatcher.

Theory of operation
-------------------
Every sync :class:`~rabbitry.sync.Connection` owns one daemon thread running an asyncio
loop: the engine (``rabbitry.aio``) runs there and only there, so protocol state needs
no locks (thread confinement). Other threads reach it through :class:`Portal`:

* ``submit(fn, *args)`` appends to one deque and wakes the loop only if no wake-up is
  already pending, so a burst of publishes from a user thread costs one
  ``call_soon_threadsafe`` (one write to the loop's self-pipe), not one per message.
  The drain that runs the burst corks the engine's writes (``set_batch_hooks``), so it
  leaves in one socket write in the same loop pass.
* ``call(coroutine_function, *args)`` goes through the same deque, so operations keep the
  order in which one thread issued them (``confirm_select`` before ``publish``), and
  waits for the result on a ``concurrent.futures.Future``.
* The deque is bounded in operations (``max_pending``) and in bytes (``max_pending_bytes``,
  counted from the ``size`` each publish declares): a thread that outruns the socket, or
  publishes while the broker has blocked the connection, blocks in ``submit`` instead of
  growing memory, and the drain stops while the transport's write buffer is above its
  high-water mark. One operation larger than the whole budget is still accepted when the
  deque is empty, so the bound is ``max_pending_bytes`` plus one message.
* Stopping settles everything. ``stop`` wakes the threads waiting for room; once the loop
  has stopped, the IO thread calls the ``on_stop`` hook (the connection ends the engine,
  failing its futures), then runs every operation still queued, so each one fails its own
  future against the closed engine instead of being forgotten. An operation queued after
  that sweep is taken back by its submitter, which raises.

User callbacks never run on the IO thread (a slow one would stop heartbeats). They go to
:class:`Dispatcher` (``_portal_dispatch.py``), a worker thread with a bounded queue; when
it is full the IO thread stops reading the socket (TCP back-pressure) until the worker
catches up. :class:`ConfirmFuture` (``_portal_future.py``) is the future of a sync
confirmed publish. Both are re-exported here.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import copy
import logging
import os
import threading
import weakref
from collections import deque
from typing import TYPE_CHECKING, Any, TypeVar

from ..exceptions import AMQPError, InvalidStateError, Timeout
from ._portal_dispatch import Dispatcher
from ._portal_future import IO_THREAD, ConfirmFuture

if TYPE_CHECKING:
    from collections.abc import Callable, Coroutine

__all__ = ["ConfirmFuture", "Dispatcher", "Portal"]

logger = logging.getLogger("rabbitry.sync")

T = TypeVar("T")


#: Bytes of operations queued for the IO thread before ``submit`` blocks (publishes
#: declare their size). With the transport's own write buffer (64 KiB high-water mark)
#: this bounds what a thread can park in memory while the socket is slow or blocked.
MAX_PENDING_BYTES = 16 * 1024 * 1024

# Every live portal, so that a forked child can mark them all unusable (see _after_fork).
_PORTALS: weakref.WeakSet[Portal] = weakref.WeakSet()


class Portal:
    """An asyncio loop on a daemon thread, and the way into it from other threads.

    Args:
        name: the thread's name.
        max_pending: operations queued for the loop before ``submit`` blocks.
        max_pending_bytes: bytes (as declared by ``submit(size=...)``) queued for the
            loop before ``submit`` blocks.
    """

    def __init__(
        self, name: str, max_pending: int = 8192, max_pending_bytes: int = MAX_PENDING_BYTES
    ) -> None:
        self._loop = asyncio.new_event_loop()
        self._ops: deque[tuple[Callable[..., Any], tuple[Any, ...], int]] = deque()
        self._wake_pending = False
        self._max_pending = max_pending
        self._max_bytes = max_pending_bytes
        # Bytes queued: added by submitters and taken off by the drain, under this lock.
        self._bytes = 0
        self._bytes_lock = threading.Lock()
        self._room = threading.Condition()
        self._room_waiters = 0
        self._paused: Callable[[Callable[[], None]], bool] | None = None
        self._batch: tuple[Callable[[], None], Callable[[], None]] | None = None
        #: The loop has stopped for good: nothing submitted runs any more.
        self.stopped = False
        #: Why the portal stopped (the connection's close reason), for what it fails.
        self.stop_reason: BaseException | None = None
        self._pid = os.getpid()
        #: Called on the IO thread once the loop has stopped, before the queued
        #: operations are run for the last time: the connection ends its engine there.
        self.on_stop: Callable[[], None] | None = None
        #: The connection's callback dispatcher (set once it is connected): it runs the
        #: user callbacks, and is told about the blocking calls they make.
        self.dispatcher: Dispatcher | None = None
        _PORTALS.add(self)
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

    def post_callback(self, fn: Callable[..., Any], *args: Any) -> None:
        """Run the user callback ``fn(*args)`` on the dispatcher thread (IO thread only).

        Dropped while there is no :attr:`dispatcher` (before the connection has
        connected).

        Args:
            fn: the callback.
            args: its arguments.
        """
        dispatcher = self.dispatcher
        if dispatcher is not None:
            dispatcher.post(fn, *args)

    def set_batch_hooks(self, begin: Callable[[], None], end: Callable[[], None]) -> None:
        """Call ``begin()`` before a drain runs several queued operations and ``end()``
        after it (IO thread): the engine corks its writes in between, so what one drain
        queues (a burst of publishes or acks) leaves in one write, in this loop pass."""
        self._batch = (begin, end)

    def _run(self, started: threading.Event) -> None:
        IO_THREAD.portal = self
        asyncio.set_event_loop(self._loop)
        self._loop.call_soon(started.set)
        try:
            self._loop.run_forever()
        finally:
            try:
                self.stopped = True
                self._sweep()
                pending = asyncio.all_tasks(self._loop)
                for task in pending:
                    task.cancel()
                if pending:
                    self._loop.run_until_complete(asyncio.gather(*pending, return_exceptions=True))
                self._loop.run_until_complete(self._loop.shutdown_asyncgens())
            finally:
                self._loop.close()
                self._wake_room_waiters()

    def _sweep(self) -> None:
        """IO thread, loop stopped: end the engine, then run what is still queued.

        Each operation then meets a closed engine and fails its own future (a publish its
        confirm future, a ``call`` its result) with the reason, instead of never running.
        """
        hook = self.on_stop
        if hook is not None:
            try:
                hook()
            except Exception:
                logger.exception("ending the connection on the IO thread failed")
        ops = self._ops
        while ops:
            fn, args, _size = ops.popleft()
            try:
                fn(*args)
            except Exception:
                logger.exception("operation %r failed on the IO thread", fn)
        with self._bytes_lock:
            self._bytes = 0
        self._wake_room_waiters()

    def _wake_room_waiters(self) -> None:
        with self._room:
            self._room.notify_all()

    def stopped_error(self) -> InvalidStateError:
        """The error for an operation that comes after the portal stopped."""
        if self._pid != os.getpid():
            return InvalidStateError(
                f"this connection was opened in process {self._pid} and cannot be used "
                "after fork(): its socket and IO thread belong to the parent. Open a new "
                "connection in the child process (see 'Processes and fork' in "
                "docs/connections.md)"
            )
        error = InvalidStateError("the connection is closed (its IO thread has stopped)")
        error.__cause__ = self.stop_reason
        return error

    def failed(self) -> BaseException:
        """What an operation queued before the stop and never run fails with."""
        reason = self.stop_reason
        if isinstance(reason, AMQPError):
            return copy.copy(reason)
        return self.stopped_error()

    # ------------------------------------------------------------------ hand-off

    def submit(
        self,
        fn: Callable[..., Any],
        *args: Any,
        timeout: float | None = None,
        size: int = 0,
    ) -> None:
        """Run ``fn(*args)`` on the IO thread soon, after everything submitted before.

        Blocks while ``max_pending`` operations, or ``max_pending_bytes`` bytes, are
        waiting (at most ``timeout``).

        Args:
            size: the bytes the operation holds (a message's frames), counted against
                ``max_pending_bytes`` until the IO thread has run it.

        Raises:
            InvalidStateError: the portal is stopped (the connection is closed), or this
                process is a fork of the one that opened the connection.
            Timeout: no room within ``timeout``.
        """
        if self.stopped:
            raise self.stopped_error()
        ops = self._ops
        if size:
            # The fast path of _reserve, inlined: this runs once per publish.
            with self._bytes_lock:
                queued = self._bytes
                room = (not queued or queued + size <= self._max_bytes) and len(
                    ops
                ) < self._max_pending
                if room:
                    self._bytes = queued + size
            if not room:
                if self.in_io_thread():
                    with self._bytes_lock:
                        self._bytes += size
                else:
                    self._wait_for_room(timeout, size)
        elif len(ops) >= self._max_pending and not self.in_io_thread():
            self._wait_for_room(timeout, 0)
        item = (fn, args, size)
        try:
            ops.append(item)
            stopped = self.stopped
            # Order matters: append first, then look at the flag. _drain clears the flag
            # before it pops, so an item is always seen by a drain that is still to run.
            if not stopped and not self._wake_pending:
                self._wake_pending = True
                self._loop.call_soon_threadsafe(self._drain)
        except BaseException:
            # An exception raised by a signal handler (rabbitry.run's ServiceStopped,
            # KeyboardInterrupt) can land anywhere here. The caller sees it, so the item
            # must not run; and the flag must not stay set without a drain scheduled, or
            # no later operation would wake the IO thread and they would wait for ever.
            self._wake_pending = False
            self._take_back(item)
            raise
        if stopped and self._take_back(item):
            # The IO thread may have swept the deque already; if the item was still
            # there, it never runs, and the caller learns it here.
            raise self.stopped_error()

    def _take_back(self, item: tuple[Callable[..., Any], tuple[Any, ...], int]) -> bool:
        """Remove a submitted ``item`` that has not run yet, and give back the bytes it
        held; False if a drain took it."""
        try:
            self._ops.remove(item)
        except ValueError:
            return False
        if item[2]:
            with self._bytes_lock:
                self._bytes -= item[2]
            if self._room_waiters:
                with self._room:
                    self._room.notify_all()
        return True

    def _reserve(self, size: int) -> bool:
        """Count ``size`` more bytes as queued if they fit (and an operation does)."""
        if len(self._ops) >= self._max_pending:
            return False
        if not size:
            return True
        with self._bytes_lock:
            queued = self._bytes
            if queued and queued + size > self._max_bytes:
                return False
            self._bytes = queued + size
            return True

    def _has_room(self, size: int) -> bool:
        return self.stopped or self._reserve(size)

    def _wait_for_room(self, timeout: float | None, size: int) -> None:
        with self._room:
            self._room_waiters += 1
            try:
                if not self._room.wait_for(lambda: self._has_room(size), timeout):
                    raise Timeout(
                        f"no room to queue the operation within {timeout} s "
                        f"({len(self._ops)} operations, {self._bytes} bytes queued for "
                        "the IO thread)"
                    )
            finally:
                self._room_waiters -= 1
        if self.stopped:
            raise self.stopped_error()

    def _drain(self) -> None:
        self._wake_pending = False
        ops = self._ops
        gate = self._paused
        drained = 0
        # One operation (a round trip's publish) needs no batch: the engine writes the
        # first frames of a loop pass at once anyway.
        batch = self._batch if len(ops) > 1 else None
        if batch is not None:
            batch[0]()
        resume = self._resume_drain  # one bound method for the whole drain
        try:
            while ops:
                if gate is not None and gate(resume):
                    break
                fn, args, size = ops.popleft()
                drained += size
                try:
                    fn(*args)
                except Exception:
                    logger.exception("operation %r failed on the IO thread", fn)
        finally:
            if batch is not None:
                batch[1]()
        if drained:
            with self._bytes_lock:
                self._bytes -= drained
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
        task_box: list[asyncio.Task[None]] = []

        def cancelled(_task: asyncio.Task[None]) -> None:
            # The task ended without settling ``result``: it was cancelled before its
            # first step (a timeout, or the loop stopping), so ``run`` never ran.
            if not result.done():
                result.set_exception(
                    self.failed() if self.stopped else Timeout("the operation was cancelled")
                )

        async def run() -> None:
            # Settles the caller's future from the coroutine's own last step, not from a
            # done callback of its task: that would run one loop iteration later.
            try:
                value = await fn(*args, **kwargs)
            except asyncio.CancelledError:
                cancelled(task_box[0])
                raise
            except Exception as exc:
                result.set_exception(exc)
            except BaseException as exc:  # KeyboardInterrupt, SystemExit: the loop's to handle
                result.set_exception(exc)
                raise
            else:
                result.set_result(value)
            task_box[0].remove_done_callback(cancelled)

        def start() -> None:
            if not result.set_running_or_notify_cancel():
                return
            if self.stopped:  # run by the final sweep: the engine is gone
                result.set_exception(self.failed())
                return
            task = self._loop.create_task(run())
            task.add_done_callback(cancelled)
            task_box.append(task)

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

    def stop(self, timeout: float = 5.0, reason: BaseException | None = None) -> None:
        """Stop the loop and join the IO thread (idempotent).

        Args:
            timeout: seconds to wait for the IO thread to end.
            reason: why (the connection's close reason): operations still queued, and
                ``call``s still waiting, fail with it.
        """
        if self.stopped:
            return
        if self.stop_reason is None:
            self.stop_reason = reason
        self.stopped = True
        self._wake_room_waiters()
        if self._loop.is_running():
            self._loop.call_soon_threadsafe(self._loop.stop)
        if not self.in_io_thread():
            self._thread.join(timeout)


def _after_fork() -> None:
    """In a forked child: no IO thread came along, so every portal is unusable.

    Marking them stopped makes every later call raise at once (naming the fork), and
    nothing in the child writes to the parent's socket or wakes the parent's loop.
    """
    for portal in list(_PORTALS):
        portal.stopped = True
        portal._ops.clear()


os.register_at_fork(after_in_child=_after_fork)


def caller_timeout(timeout: float | None) -> float | None:
    """How long the calling thread waits for an operation bounded by ``timeout``."""
    # The IO thread enforces ``timeout`` itself; the grace only covers the hand-off.
    return None if timeout is None else timeout + 1.0
