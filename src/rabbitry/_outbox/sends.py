"""The sends of an outbox publisher's rows that are not settled yet: confirms, failures,
the confirm timeout, and the resends after a backoff.

The confirm of a row is a small :class:`~rabbitry._outbox.rows.Send` object in the
channel's confirm table (no asyncio future per message), which reports to
:class:`InFlight`. An ack queues the row's delete. A nack, a lost channel or no confirm
within ``confirm_timeout`` (a sweep over the rows in flight, oldest first) schedules a
resend with exponential backoff (:class:`RetrySchedule`); a return (mandatory,
unroutable) or a refusal (:class:`PublishRefused`: the broker closed the channel because
of this message, e.g. 406 too large) moves the row to the dead table with the broker's
reason instead of retrying it forever. An ack that arrives late, after a resend was
scheduled, still settles the row.
"""

from __future__ import annotations

import asyncio
import heapq
import random
from typing import TYPE_CHECKING

from ..exceptions import PublishRefused, PublishTimeout, Unroutable
from .rows import ACKED, DEAD, IN_FLIGHT, READY, STORING, WAITING

if TYPE_CHECKING:
    from ..outbox import Outbox
    from .commits import CommitQueue
    from .rows import Entry, ExchangeCheck, ReadyRows

__all__ = ["InFlight", "RetrySchedule"]


class RetrySchedule:
    """Holds rows whose send failed for an exponential backoff, then queues them for
    sending again.

    Args:
        outbox: the store, whose ``retry_delay`` and ``max_retry_delay`` set the backoff.
        loop: the event loop the publisher runs on.
        commits: where each failure is stored.
        ready: where due rows are queued.
    """

    def __init__(
        self,
        outbox: Outbox,
        loop: asyncio.AbstractEventLoop,
        commits: CommitQueue,
        ready: ReadyRows,
    ) -> None:
        self._outbox = outbox
        self._loop = loop
        self._commits = commits
        self._ready = ready
        self._heap: list[tuple[float, Entry]] = []
        self._timer: asyncio.TimerHandle | None = None
        self._rng = random.Random()

    def later(self, entry: Entry, exc: BaseException) -> None:
        """Store the failure ``exc`` of ``entry`` and send it again after the backoff."""
        self._commits.failed(entry, exc)
        outbox = self._outbox
        attempts = entry.record.attempts
        delay = min(outbox.max_retry_delay, outbox.retry_delay * 2 ** (attempts - 1))
        delay *= self._rng.uniform(0.75, 1.25)
        entry.state = WAITING
        entry.due = self._loop.time() + delay
        heapq.heappush(self._heap, (entry.due, entry))
        self._arm()

    def cancel(self) -> None:
        """Stop the timer (the rows waiting stay stored)."""
        if self._timer is not None:
            self._timer.cancel()

    def _arm(self) -> None:
        if not self._heap:
            return
        due = self._heap[0][0]
        timer = self._timer
        if timer is not None:
            if timer.when() <= due:
                return
            timer.cancel()
        self._timer = self._loop.call_at(due, self._due)

    def _due(self) -> None:
        self._timer = None
        now = self._loop.time()
        heap = self._heap
        ready = self._ready
        moved = False
        while heap and heap[0][0] <= now:
            _due, entry = heapq.heappop(heap)
            if entry.state == WAITING:
                entry.state = READY
                ready.rows.append(entry)
                moved = True
        if moved:
            ready.event.set()
        self._arm()


class InFlight:
    """Settles the rows sent and not yet confirmed: on ack, nack, return, refusal, channel
    end, or when ``confirm_timeout`` passes without a confirm.

    Args:
        outbox: the store (its ``confirm_timeout``).
        loop: the event loop the publisher runs on.
        commits: where acks (deletes) and deaths are stored.
        retries: where failed sends wait to be sent again.
        exchanges: told when a publish to a checked exchange was refused with 404.
    """

    def __init__(
        self,
        outbox: Outbox,
        loop: asyncio.AbstractEventLoop,
        commits: CommitQueue,
        retries: RetrySchedule,
        exchanges: ExchangeCheck,
    ) -> None:
        self._outbox = outbox
        self._loop = loop
        self._commits = commits
        self._retries = retries
        self._exchanges = exchanges
        #: The rows sent and waiting for their confirm, by id, in send order.
        self.rows: dict[int, Entry] = {}
        #: Set by the publisher's ``close()``: failed rows stay stored, unsent.
        self.closing = False

    def acked(self, entry: Entry) -> None:
        """The broker confirmed a send of ``entry`` (a late ack of an earlier send too)."""
        if entry.state in (ACKED, DEAD, STORING):
            return
        if entry.state == IN_FLIGHT:
            self.rows.pop(entry.record.id, None)
        entry.state = ACKED  # also a late ack of an earlier send: the broker has it
        commits = self._commits
        commits.batch.deletes.append(entry.record.id)
        commits.schedule()

    def send_failed(self, entry: Entry, gen: int, exc: BaseException) -> None:
        """Send number ``gen`` of ``entry`` failed with ``exc``: resend it, or move it to
        the dead table when sending it again would fail the same way."""
        if entry.gen != gen or entry.state != IN_FLIGHT:
            return  # an earlier send, already given up on
        self.rows.pop(entry.record.id, None)
        if isinstance(exc, Unroutable):
            message = exc.message
            self._commits.kill(entry, f"{message.reply_code} {message.reply_text}", "unroutable")
            return
        if isinstance(exc, PublishRefused):
            # A definite refusal (404 no such exchange, 406 too large...): sending it
            # again unchanged fails the same way, so it is not retried.
            self._commits.failed(entry, exc)
            if exc.reply_code == 404:  # it was there when checked: check it again
                self._exchanges.forget(entry.record.exchange)
            self._commits.kill(
                entry, f"refused by the broker: {exc.reply_code} {exc.reply_text}", "refused"
            )
            return
        if self.closing:
            entry.state = WAITING  # stays stored; the next publisher sends it
            return
        self._retries.later(entry, exc)

    async def sweep(self) -> None:
        """Treat rows unconfirmed for ``confirm_timeout`` as failed sends (resend)."""
        limit = self._outbox.confirm_timeout
        period = min(1.0, limit / 4)
        while True:
            await asyncio.sleep(period)
            now = self._loop.time()
            expired = []
            for entry in self.rows.values():
                if now - entry.sent_at < limit:
                    break  # in send order: the rest are younger
                expired.append(entry)
            for entry in expired:
                self.send_failed(
                    entry,
                    entry.gen,
                    PublishTimeout(f"not confirmed within {limit:g} s (confirm_timeout)"),
                )
