"""Rate-limited ERROR logging with counts: the library's one mechanism for a log record
that can repeat per message, envelope, row or reply.

:class:`RateLimitedLog` logs the first ``burst`` events of each ``interval`` in full
(with their traceback, if given), then one line saying that further ones are counted,
then counts the rest by kind and logs them as one summary line when the interval ends
(or at :meth:`~RateLimitedLog.flush`, e.g. when its owner stops). An event that fires on
every message therefore costs at most ``burst + 2`` records per interval, never silence,
and the summary carries the counts::

    late = RateLimitedLog(logger, "RPC client", "late replies")
    late.log("dropped", "RPC reply %r matches no waiting call: dropped", correlation_id)
    ...
    late.close()  # on stop: logs the summary of what was only counted

It is thread-safe. The summary at the end of an interval needs a timer: the event loop
passed as ``loop`` (or the running loop of the thread that logs, if any) provides it;
without one, the summary waits for the next event after the interval, or ``flush()``.

:class:`FailureLog` is the consumer's use of it (handler failures, with the action
taken on the message).
"""

from __future__ import annotations

import asyncio
import logging
import threading
import time
from collections import Counter
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from collections.abc import Callable

__all__ = ["FailureLog", "RateLimitedLog"]

ExcInfo = BaseException | tuple[Any, ...] | None


class RateLimitedLog:
    """One kind of repeating log record, rate-limited with counts.

    Args:
        logger: where the records go.
        subject: who logs, the start of every record (e.g. ``"consumer 'orders'"``).
        what: the events, plural, for the lines this class writes (e.g. ``"late
            replies"``): ``"<subject>: 523 more <what> (<note>): 500 dropped, 23 parked"``.
        burst: events logged in full per interval.
        interval: seconds per interval.
        level: the records' level.
        note: the summary's parenthesis: what its events lack.
        loop: the event loop that times the summary (``None``: the running loop of the
            thread that logs, if any). Events may come from any thread.
        clock: monotonic time source (tests pass a fake one).
        schedule: ``schedule(delay, callback)`` instead of ``loop``: runs ``callback``
            later, on the thread that logs.
    """

    def __init__(
        self,
        logger: logging.Logger,
        subject: str,
        what: str,
        *,
        burst: int = 10,
        interval: float = 60.0,
        level: int = logging.ERROR,
        note: str = "without traceback",
        loop: asyncio.AbstractEventLoop | None = None,
        clock: Callable[[], float] = time.monotonic,
        schedule: Callable[[float, Callable[[], None]], object] | None = None,
    ) -> None:
        self._logger = logger
        self.subject = subject
        self.what = what
        self.burst = burst
        self.interval = interval
        self.level = level
        self.note = note
        self._loop = loop
        self._clock = clock
        self._schedule = schedule
        self._lock = threading.Lock()
        self._armed = False
        self._timer: asyncio.TimerHandle | None = None
        self._closed = False
        self._started = clock()
        self._logged = 0
        self._suppressed: Counter[str] = Counter()
        #: Events logged in full, and only counted (then summarised).
        self.detailed = 0
        self.summarised = 0
        #: Every event, by kind.
        self.counts: Counter[str] = Counter()

    @property
    def total(self) -> int:
        """Every event so far."""
        return self.detailed + self.summarised + sum(self._suppressed.values())

    def log(self, kind: str, msg: str, *args: object, exc_info: ExcInfo = None) -> bool:
        """Record one event: log ``msg % args`` in full, or count it under ``kind``.

        Args:
            kind: the event's category in summaries ("dropped", "parked"...).
            msg: the full record's format string (``logging`` style).
            *args: its arguments.
            exc_info: the traceback of the full record (an exception or a
                ``sys.exc_info()`` tuple), if any.

        Returns:
            ``True`` if it was logged in full, ``False`` if only counted.
        """
        summary = None
        notice = False
        with self._lock:
            self.counts[kind] += 1
            now = self._clock()
            if now - self._started >= self.interval:
                summary = self._take()
                self._started = now
                self._logged = 0
            if self._logged < self.burst:
                self._logged += 1
                self.detailed += 1
                notice = self._logged == self.burst
                full = True
            else:
                self._suppressed[kind] += 1
                full = False
                arm = not self._armed
                self._armed = True
        if summary is not None:
            self._write_summary(*summary)
        if full:
            if isinstance(exc_info, BaseException):
                exc_info = (type(exc_info), exc_info, exc_info.__traceback__)
            self._logger.log(self.level, msg, *args, exc_info=exc_info, stacklevel=2)
            if notice:
                self._logger.log(
                    self.level,
                    "%s: %d %s within %g s; further ones in this interval are counted and "
                    "summarised (%s)",
                    self.subject,
                    self.burst,
                    self.what,
                    self.interval,
                    self.note,
                )
            return True
        if arm:
            self._arm(max(0.0, self._started + self.interval - now))
        return False

    def flush(self) -> None:
        """Log the summary of the events counted since the last one, if any."""
        with self._lock:
            summary = self._take()
        if summary is not None:
            self._write_summary(*summary)

    def close(self) -> None:
        """Flush and cancel the pending timer (when the owner stops). Idempotent."""
        with self._lock:
            self._closed = True
            timer, self._timer = self._timer, None
        if timer is not None:
            timer.cancel()
        self.flush()

    # ------------------------------------------------------------------ internals

    def _take(self) -> tuple[int, str] | None:
        if not self._suppressed:
            return None
        counts, self._suppressed = self._suppressed, Counter()
        total = sum(counts.values())
        self.summarised += total
        return total, ", ".join(f"{n} {kind}" for kind, n in counts.most_common())

    def _write_summary(self, total: int, detail: str) -> None:
        self._logger.log(
            self.level, "%s: %d more %s (%s): %s", self.subject, total, self.what, self.note, detail
        )

    def _arm(self, delay: float) -> None:
        if self._schedule is not None:
            self._schedule(delay, self._interval_over)
            return
        try:
            running: asyncio.AbstractEventLoop | None = asyncio.get_running_loop()
        except RuntimeError:
            running = None
        loop = self._loop or running
        if loop is None:
            with self._lock:
                self._armed = False  # the next event after the interval logs the summary
            return
        if loop is running:
            self._set_timer(loop, delay)
            return
        try:
            loop.call_soon_threadsafe(self._set_timer, loop, delay)
        except RuntimeError:  # the loop is closed: flush() or the next event reports
            with self._lock:
                self._armed = False

    def _set_timer(self, loop: asyncio.AbstractEventLoop, delay: float) -> None:
        with self._lock:
            if self._closed:
                return
            self._timer = loop.call_later(delay, self._interval_over)

    def _interval_over(self) -> None:
        with self._lock:
            self._armed = False
            self._timer = None
        self.flush()


class FailureLog:
    """Logs handler failures for one consumer: a :class:`RateLimitedLog` whose full
    records carry the handler's traceback and what was done with the message.

    Args:
        logger: where the records go.
        name: how the consumer is named in the records.
        burst: failures logged with a traceback per interval.
        interval: seconds per interval.
        clock: monotonic time source (tests pass a fake one).
        schedule: ``schedule(delay, callback)`` runs ``callback`` later (the event
            loop's ``call_later``), so that a summary is logged when its interval ends
            even if no failure follows; without it the running loop of the failure, if
            any, times it.
    """

    def __init__(
        self,
        logger: logging.Logger,
        name: str,
        *,
        burst: int = 10,
        interval: float = 60.0,
        clock: Callable[[], float] = time.monotonic,
        schedule: Callable[[float, Callable[[], None]], object] | None = None,
    ) -> None:
        self.name = name
        self._log = RateLimitedLog(
            logger,
            f"consumer {name}",
            "handler failures",
            burst=burst,
            interval=interval,
            clock=clock,
            schedule=schedule,
        )

    @property
    def burst(self) -> int:
        """Failures logged with a traceback per interval."""
        return self._log.burst

    @property
    def interval(self) -> float:
        """Seconds per interval."""
        return self._log.interval

    @property
    def detailed(self) -> int:
        """Failures logged with a traceback."""
        return self._log.detailed

    @property
    def summarised(self) -> int:
        """Failures counted and summarised without one."""
        return self._log.summarised

    def failure(self, delivery_tag: int | str, exc: BaseException, action: str, kind: str) -> None:
        """Record one failure of the handler on ``delivery_tag`` and what was done.

        Args:
            delivery_tag: the failed delivery.
            exc: what the handler raised.
            action: what happened to the message, in words.
            kind: the action's category for summaries ("retried", "parked"...).
        """
        self._log.log(
            kind,
            "consumer %s: handler failed on delivery %s (%s: %s); the message was %s",
            self.name,
            delivery_tag,
            type(exc).__name__,
            exc,
            action,
            exc_info=exc,
        )

    def flush(self) -> None:
        """Log the summary of the failures counted since the last one, if any."""
        self._log.flush()
