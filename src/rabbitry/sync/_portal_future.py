"""The future of a sync confirmed publish: a real ``concurrent.futures.Future``, made cheap.

:class:`~rabbitry.sync._portal.Portal` settles these on its IO thread; their
done-callbacks go to the connection's callback thread
(:class:`~rabbitry.sync._portal_dispatch.Dispatcher`), found through :data:`IO_THREAD`.
"""

from __future__ import annotations

import concurrent.futures
import logging
import threading
import time
from concurrent.futures._base import CANCELLED, CANCELLED_AND_NOTIFIED, FINISHED, PENDING
from typing import TYPE_CHECKING, Any, TypeVar

from ..publishing.unobserved import Observable, looks

if TYPE_CHECKING:
    from collections.abc import Callable

logger = logging.getLogger("rabbitry.sync")

T = TypeVar("T")

#: On each IO thread, ``IO_THREAD.portal`` is the portal whose loop runs there (its
#: ``dispatcher`` runs the done-callbacks of the futures settled there).
IO_THREAD = threading.local()


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


class ConfirmFuture(concurrent.futures.Future[T], Observable):
    """A ``concurrent.futures.Future`` that is cheap to create and to settle.

    The sync API returns one per confirmed publish, so its cost is paid per message. A
    standard future builds a ``Condition`` and an ``RLock`` of its own and notifies its
    condition on every settle; this one shares one condition between all instances,
    answers ``done()`` without taking it, and notifies only when a thread is actually
    blocked in :meth:`result` or :meth:`exception` of this future. It is a subclass, so
    ``isinstance``, ``add_done_callback``, ``cancel``, ``concurrent.futures.wait`` and
    ``as_completed`` behave as with any future.

    Done-callbacks never run on the IO thread, where the future is settled: they go to
    the connection's callback thread (:class:`Dispatcher`), in order, so a slow one
    cannot hold up heartbeats and other confirms. Without a callback the settle costs
    nothing more. Once the dispatcher has stopped (the connection is closing), the
    last settles run their callbacks where they are.

    ``_observed`` says that someone looked at the outcome (``result()``,
    ``exception()`` or a done-callback): :mod:`rabbitry.publishing.unobserved` reports
    the failures nobody looked at.
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
        self._observed = True
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
        self._observed = True
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
            self._invoke_callbacks()

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
            self._invoke_callbacks()

    def add_done_callback(self, fn: Callable[[concurrent.futures.Future[T]], object]) -> None:
        if looks(fn):
            self._observed = True
        super().add_done_callback(fn)

    def _invoke_callbacks(self) -> None:
        """Run the done-callbacks; from the IO thread, on the callback thread."""
        portal = getattr(IO_THREAD, "portal", None)
        dispatcher = portal.dispatcher if portal is not None else None
        if dispatcher is None or dispatcher.stopping:
            super()._invoke_callbacks()  # type: ignore[misc]
            return
        for callback in self._done_callbacks:
            dispatcher.post(_run_done_callback, callback, self)


def _run_done_callback(callback: Callable[[Any], object], future: Any) -> None:
    try:
        callback(future)
    except Exception:
        logger.exception("exception calling callback for %r", future)
