"""Failed publishes nobody looked at: :class:`UnobservedLedger`.

A publisher hands out one future per message. When the broker refuses a message, returns
it or the channel dies under it, the future fails; if the application never looks at that
future the failure would be invisible. Every publisher therefore keeps a ledger: the code
that fails a future calls :meth:`UnobservedLedger.fail` instead of ``set_exception``, and
the publisher's end (``close()``, the ``with`` / ``async with`` exit) calls
:meth:`UnobservedLedger.report`, which logs the failures still unobserved at ERROR and
raises :class:`~rabbitry.exceptions.UnobservedPublishFailures`.

What counts as observed:

* a done-callback on the future when it fails (an awaiting task registers one, so an
  awaited future is never recorded), except those of :mod:`rabbitry.observability`,
  which only record the outcome in a span;
* for an asyncio future, ``result()`` or ``exception()`` called later: CPython clears the
  future's ``_log_traceback`` flag then (the flag behind "Future exception was never
  retrieved");
* for a future that derives from :class:`Observable` (the sync API's
  ``ConfirmFuture``), ``result()``, ``exception()`` or ``add_done_callback``: it sets
  ``_observed`` then.

Only the failure path pays: the ledger holds failed futures, never the successful ones.
It keeps at most :data:`KEEP` of them (dropping those observed meanwhile when it is
full); failures past that are counted, not kept. Thread-safe: the sync twin fails
futures on its IO thread and reports from the closing thread.
"""

from __future__ import annotations

import asyncio
import logging
import threading
import time
from typing import TYPE_CHECKING, Any

from ..exceptions import UnobservedPublishFailures

if TYPE_CHECKING:
    import concurrent.futures

__all__ = ["KEEP", "Observable", "UnobservedLedger", "looks", "peek"]

logger = logging.getLogger("rabbitry.publisher")

#: Failed futures a ledger keeps to re-check later; more are only counted.
KEEP = 1000
#: Failures named in the ERROR line.
_NAMED = 3
#: Reports logged per interval (all publishers of the process); later ones are counted.
_BURST = 10
_INTERVAL = 60.0


class _LogLimit:
    """At most ``_BURST`` ERROR lines per ``_INTERVAL`` for the whole process."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._started = time.monotonic()
        self._logged = 0
        self._suppressed = 0
        self._suppressed_failures = 0

    def allow(self, count: int) -> tuple[bool, int, int]:
        """Whether to log a report of ``count`` failures, and the reports and failures
        suppressed since the last logged one."""
        with self._lock:
            now = time.monotonic()
            if now - self._started >= _INTERVAL:
                self._started = now
                self._logged = 0
            if self._logged < _BURST:
                self._logged += 1
                out = (True, self._suppressed, self._suppressed_failures)
                self._suppressed = self._suppressed_failures = 0
                return out
            self._suppressed += 1
            self._suppressed_failures += count
            return False, 0, 0


_LIMIT = _LogLimit()


class Observable:
    """A future that says whether its outcome was looked at (a mixin).

    A subclass sets ``self._observed = True`` where its outcome is read (``result()``,
    ``exception()``) or a done-callback is added; the class default costs nothing on
    the futures nobody reads.
    """

    _observed = False
    # The outcome, as concurrent.futures.Future keeps it (read by :func:`peek`).
    _exception: BaseException | None


def looks(callback: Any) -> bool:
    """Whether adding ``callback`` to a future counts as looking at its outcome: every
    callback but the library's own instrumentation (:mod:`rabbitry.observability`).

    Args:
        callback: the done-callback.

    Returns:
        ``True`` for a callback of the application (or an awaiting task).
    """
    module = getattr(callback, "__module__", None)
    return not (isinstance(module, str) and module.startswith(_INSTRUMENTATION))


_INSTRUMENTATION = "rabbitry.observability"


def peek(future: asyncio.Future[Any] | concurrent.futures.Future[Any]) -> BaseException | None:
    """The exception of a done, not cancelled future, read without counting as looking
    at it (for the library's instrumentation, which records outcomes in spans).

    Args:
        future: an asyncio or ``concurrent.futures`` future.

    Returns:
        Its exception, or ``None``.
    """
    exc: BaseException | None = future._exception
    return exc


def _watched(future: Any) -> bool:
    """The future has a done-callback now (someone awaits it or said what to do)."""
    if isinstance(future, asyncio.Future):
        callbacks = future._callbacks
        return bool(callbacks) and any(looks(callback) for callback, _context in callbacks)
    if isinstance(future, Observable):
        return future._observed
    return True  # not a future of ours (a batch member): its caller gets the outcome


def _observed(future: Any) -> bool:
    if isinstance(future, asyncio.Future):
        return not future._log_traceback
    return not isinstance(future, Observable) or future._observed


def _silence(future: Any) -> None:
    """Mark a reported future as retrieved (asyncio logs it again when collected)."""
    if isinstance(future, asyncio.Future):
        future._log_traceback = False
    elif isinstance(future, Observable):
        future._observed = True


class UnobservedLedger:
    """The failed futures of one publisher that nobody has looked at (yet).

    A batching publisher fails its record futures through the ledger of the publisher
    it sends through: that publisher's ``close()`` waits for the envelopes, so their
    records are all settled by the report.

    Args:
        what: how the publisher is named in the log line and the error.
    """

    __slots__ = ("_futures", "_lock", "_reported", "_untracked", "what")

    def __init__(self, what: str) -> None:
        self.what = what
        self._lock = threading.Lock()
        self._futures: list[Any] = []
        self._untracked = 0
        self._reported = False

    def fail(self, future: Any, exc: BaseException) -> None:
        """``future.set_exception(exc)``, recording the failure unless it is watched.

        Args:
            future: an asyncio or ``concurrent.futures`` future, not done.
            exc: its exception.
        """
        watched = _watched(future)
        future.set_exception(exc)
        if not watched:
            self.note(future)

    def note(self, future: Any) -> None:
        """Record ``future``, failed just now with nobody watching it.

        Args:
            future: the failed future.
        """
        with self._lock:
            if not self._reported:
                futures = self._futures
                if len(futures) >= KEEP and not self._untracked % KEEP:
                    # Full: drop those looked at meanwhile (once per KEEP overflows).
                    futures[:] = [f for f in futures if not _observed(f)]
                if len(futures) < KEEP:
                    futures.append(future)
                else:
                    self._untracked += 1  # counted only: the ledger keeps KEEP at most
                    _silence(future)
                return

    def pending(self) -> int:
        """How many recorded failures are still unobserved (a snapshot)."""
        with self._lock:
            return sum(1 for f in self._futures if not _observed(f)) + self._untracked

    def report(self, *, raise_error: bool = True) -> None:
        """Log the failures nobody looked at, and raise them as one error.

        The ledger is empty afterwards, the reported futures count as observed, and
        it records nothing more (the publisher has ended; asyncio itself still logs a
        later failure nobody retrieves, when the future is collected).

        Args:
            raise_error: raise :class:`UnobservedPublishFailures` (else only log, e.g.
                when the ``with`` block already ends with an exception).

        Raises:
            UnobservedPublishFailures: failures nobody looked at (with ``raise_error``).
        """
        with self._lock:
            self._reported = True
            futures, self._futures = self._futures, []
            untracked, self._untracked = self._untracked, 0
        failures: list[BaseException] = []
        for future in futures:
            if not _observed(future):
                exc = future.exception()
                _silence(future)
                if exc is not None:
                    failures.append(exc)
        count = len(failures) + untracked
        if not count:
            return
        log, skipped, skipped_failures = _LIMIT.allow(count)
        if log:
            named = "; ".join(f"{type(e).__name__}: {e}" for e in failures[:_NAMED])
            more = f" (and {count - _NAMED} more)" if count > _NAMED else ""
            suppressed = (
                f" [{skipped} similar reports with {skipped_failures} failures not logged]"
                if skipped
                else ""
            )
            logger.error(
                "%s ended with %d failed publishes nobody looked at: %s%s%s",
                self.what,
                count,
                named,
                more,
                suppressed,
            )
        if raise_error:
            raise UnobservedPublishFailures(count, failures, self.what)
