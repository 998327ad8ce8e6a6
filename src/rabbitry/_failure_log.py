"""Rate-limited ERROR logging of handler failures, one limiter per consumer.

Every handler failure is logged at ERROR with what happened to the message ("sent for a
retry in 10 s via jobs.retry.10s", "parked in jobs.parking-lot", "dropped: ..."). The first
``burst`` failures of each ``interval`` carry the handler's traceback; later ones in the
same interval are only counted, by action, and reported as one summary line when the
interval ends (or the consumer stops). A handler that fails on every message therefore
costs ``burst + 1`` log records per interval, never silence.
"""

from __future__ import annotations

import time
from collections import Counter
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import logging
    from collections.abc import Callable

__all__ = ["FailureLog"]


class FailureLog:
    """Logs handler failures for one consumer (event loop only; no lock needed).

    Args:
        logger: where the records go.
        name: how the consumer is named in the records.
        burst: failures logged with a traceback per interval.
        interval: seconds per interval.
        clock: monotonic time source (tests pass a fake one).
        schedule: ``schedule(delay, callback)`` runs ``callback`` later (the event
            loop's ``call_later``), so that a summary is logged when its interval ends
            even if no failure follows; without it the summary waits for the next
            failure or :meth:`flush`.
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
        self._logger = logger
        self.name = name
        self.burst = burst
        self.interval = interval
        self._clock = clock
        self._schedule = schedule
        self._armed = False
        self._started = clock()
        self._logged = 0
        self._suppressed: Counter[str] = Counter()
        #: Failures logged with a traceback, and summarised without one (for tests).
        self.detailed = 0
        self.summarised = 0

    def failure(self, delivery_tag: int | str, exc: BaseException, action: str, kind: str) -> None:
        """Record one failure of the handler on ``delivery_tag`` and what was done.

        Args:
            delivery_tag: the failed delivery.
            exc: what the handler raised.
            action: what happened to the message, in words.
            kind: the action's category for summaries ("retried", "parked"...).
        """
        now = self._clock()
        if now - self._started >= self.interval:
            self.flush()
            self._started = now
            self._logged = 0
        if self._logged < self.burst:
            self._logged += 1
            self.detailed += 1
            self._logger.error(
                "consumer %s: handler failed on delivery %s (%s: %s); the message was %s",
                self.name,
                delivery_tag,
                type(exc).__name__,
                exc,
                action,
                exc_info=(type(exc), exc, exc.__traceback__),
            )
            if self._logged == self.burst:
                self._logger.error(
                    "consumer %s: %d handler failures within %g s; further ones in this "
                    "interval are counted and summarised without a traceback",
                    self.name,
                    self.burst,
                    self.interval,
                )
            return
        self._suppressed[kind] += 1
        if self._schedule is not None and not self._armed:
            self._armed = True
            self._schedule(max(0.0, self._started + self.interval - now), self._interval_over)

    def _interval_over(self) -> None:
        self._armed = False
        self.flush()

    def flush(self) -> None:
        """Log the summary of the failures counted since the last one, if any."""
        if not self._suppressed:
            return
        counts, self._suppressed = self._suppressed, Counter()
        total = sum(counts.values())
        self.summarised += total
        detail = ", ".join(f"{n} {kind}" for kind, n in counts.most_common())
        self._logger.error(
            "consumer %s: %d more handler failures (without traceback): %s",
            self.name,
            total,
            detail,
        )
