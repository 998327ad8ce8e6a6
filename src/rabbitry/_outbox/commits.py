"""What an outbox publisher writes: the row changes of each loop iteration, gathered into
one batch for the writer thread, and what each commit means for the rows in memory.

Changes are gathered on the loop (the rows of every ``publish()`` waiting, the deletes of
every ack, resends, failures, deaths) and handed to the writer thread once per loop
iteration; the writer applies everything queued since its last commit as one
transaction (group commit), so many concurrent publishes share one sync to disk. Only
after that commit does ``publish()`` return, and only then is the row queued for the
sender: a message is never on the wire before it is on disk. A row leaves memory and the
bound when its delete (or its move to the dead table) is committed.
"""

from __future__ import annotations

import asyncio
import logging
from typing import TYPE_CHECKING

from .._support.failure_log import RateLimitedLog
from ..exceptions import InvalidStateError, OutboxError
from ..outbox import OutboxBatch
from .rows import DEAD, READY, RETRY_WRITE_DELAY, STORING, Writer

if TYPE_CHECKING:
    from ..outbox import Outbox
    from .room import OutboxRoom
    from .rows import Entry, ReadyRows

__all__ = ["CommitQueue"]

logger = logging.getLogger("rabbitry.outbox")

_Waiters = list[tuple[asyncio.Future[None], list["Entry"]]]


class CommitQueue:
    """Gathers the row changes of one loop iteration into one batch for the writer
    thread, and applies each commit's outcome to the rows held in memory.

    Args:
        outbox: the store the writer thread owns.
        loop: the event loop the publisher runs on.
        table: the rows stored or being stored, by id (shared with the publisher).
        ready: where committed rows are queued for sending.
        room: the bound, given back the room of rows that leave.
    """

    def __init__(
        self,
        outbox: Outbox,
        loop: asyncio.AbstractEventLoop,
        table: dict[int, Entry],
        ready: ReadyRows,
        room: OutboxRoom,
    ) -> None:
        self._outbox = outbox
        self._loop = loop
        self._table = table
        self._ready = ready
        self._room = room
        self.writer = Writer(outbox, loop)
        self.writer.on_commit = self._committed
        #: The changes gathered during this loop iteration.
        self.batch = OutboxBatch()
        self._waiters: _Waiters = []
        self._handle: asyncio.Handle | None = None
        #: Set by the publisher's ``close()``: no more rows, no more retried writes.
        self.closing = False
        #: The id the next stored row gets.
        self.next_id = 1
        #: Rows stored and acked since the start; rows in the dead table.
        self.stored = self.acked = self.dead = 0
        self._dead_log = RateLimitedLog(
            logger,
            f"outbox {outbox.name}",
            "messages moved to the dead table",
            note="each is in the dead table with its reason",
        )
        self._errors = RateLimitedLog(
            logger, f"outbox {outbox.name}", "failed commits", note="each raised to its caller"
        )

    async def store(self, entries: list[Entry]) -> None:
        """Give ``entries`` their ids and return once they are committed.

        Raises:
            InvalidStateError: the publisher is closed; nothing was stored.
            OutboxError: the commit failed; nothing was stored.
        """
        rows = len(entries)
        table = self._table
        next_id = self.next_id
        for entry in entries:
            entry.record.id = next_id
            table[next_id] = entry
            next_id += 1
        self.next_id = next_id
        if self.closing:
            self.forget(entries)
            raise InvalidStateError("the publisher is closed")
        waiter: asyncio.Future[None] = self._loop.create_future()
        self.batch.inserts += [e.record for e in entries]
        self._waiters.append((waiter, entries))
        self.schedule()
        # Once queued the rows are committed (and then sent) even if the caller is
        # cancelled meanwhile (that cancels only this waiter): at-least-once, no half batch.
        await waiter
        self.stored += rows

    def forget(self, entries: list[Entry]) -> None:
        """Drop rows that were not stored, giving back their room."""
        size = 0
        for entry in entries:
            self._table.pop(entry.record.id, None)
            size += entry.size
        self._room.release(len(entries), size)

    def schedule(self) -> None:
        """Hand :attr:`batch` to the writer at the end of this loop iteration."""
        if self._handle is None:
            self._handle = self._loop.call_soon(self.flush)

    def flush(self) -> None:
        """Hand what this loop iteration gathered to the writer thread (one lock round)."""
        self._handle = None
        batch, waiters = self.batch, self._waiters
        if not batch and not waiters:
            return
        self.batch, self._waiters = OutboxBatch(), []
        if self.writer.thread.is_alive():
            self.writer.submit(batch, waiters)
            return
        for waiter, _entries in waiters:  # closed: the writer is gone
            if not waiter.done():
                waiter.set_exception(InvalidStateError("the publisher is closed"))

    def failed(self, entry: Entry, exc: BaseException) -> None:
        """Count a failed send of ``entry`` and store why it failed."""
        record = entry.record
        record.attempts += 1
        record.last_error = f"{type(exc).__name__}: {exc}"
        self.batch.failures.append((record.id, record.attempts, record.last_error))
        self.schedule()

    def kill(self, entry: Entry, reason: str, kind: str) -> None:
        """Move ``entry`` to the dead table with ``reason`` (logged at ERROR, rate-limited
        by ``kind``)."""
        entry.state = DEAD
        self._dead_log.log(
            kind,
            "outbox %s: message %s moved to the dead table (rabbitry outbox status shows "
            "it; retry-dead sends it again): %s",
            self._outbox.name,
            entry.record.message_id,
            reason,
        )
        self.batch.deaths.append((entry.record.id, reason))
        self.schedule()

    def close_logs(self) -> None:
        """Log the summaries of the rate-limited logs, if any."""
        self._dead_log.close()
        self._errors.close()

    def _committed(
        self, batch: OutboxBatch, waiters: _Waiters, error: BaseException | None
    ) -> None:
        """Loop thread: the writer applied ``batch`` (or failed to: nothing of it)."""
        if error is not None:
            self._errors.log("failed", "outbox %s: commit failed: %s", self._outbox.name, error)
            if not isinstance(error, OutboxError):
                wrapped = OutboxError(self._outbox.name, f"write failed: {error!r}")
                wrapped.__cause__ = error
                error = wrapped
            for waiter, entries in waiters:
                self.forget(entries)
                if not waiter.done():
                    waiter.set_exception(error)
            # Acks, failures and deaths are not lost: they are tried again shortly.
            batch.inserts = []
            if batch and not self.closing:
                self._loop.call_later(RETRY_WRITE_DELAY, self._requeue, batch)
            return
        ready = self._ready
        for waiter, entries in waiters:
            for entry in entries:
                if entry.state == STORING:
                    entry.state = READY
                    ready.rows.append(entry)
            if not waiter.done():
                waiter.set_result(None)
        if waiters:
            ready.event.set()
        freed_rows = freed_size = 0
        table = self._table
        for row_id in batch.deletes:
            gone = table.pop(row_id, None)
            if gone is not None:
                freed_rows += 1
                freed_size += gone.size
                self.acked += 1
        for row_id, _reason in batch.deaths:
            gone = table.pop(row_id, None)
            if gone is not None:
                freed_rows += 1
                freed_size += gone.size
                self.dead += 1
        if freed_rows:
            self._room.release(freed_rows, freed_size)

    def _requeue(self, batch: OutboxBatch) -> None:
        if self.closing:
            return
        mine = self.batch
        mine.deletes += batch.deletes
        mine.failures += batch.failures
        mine.deaths += batch.deaths
        mine.resent += batch.resent
        self.schedule()
