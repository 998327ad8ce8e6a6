"""AsyncOutboxPublisher: publishing through a durable outbox (nothing lost if we crash).

Get one with ``await connection.publisher(outbox=SQLiteOutbox(path))``.

Theory of operation
-------------------
``publish()`` encodes and validates the message with the inner :class:`AsyncPublisher`'s
encoder, reserves room in the outbox's bound (rows and bytes; waiting up to the publish
timeout, then :class:`OutboxFull`), and queues the row for the writer thread. The writer
thread owns the store: it takes everything queued since its last commit (the rows of
every ``publish()`` waiting, the deletes of every ack, resends, deaths) and applies it as
one transaction (group commit), so many concurrent publishes share one sync to disk.
Only after that commit does ``publish()`` return, and only then is the row handed to the
sender: a message is never on the wire before it is on disk.

The sender task sends rows with confirms through the inner publisher's window. The
confirm of a row is a small :class:`Send` object in the channel's confirm table (no
asyncio future per message). An ack queues the row's delete; the row leaves memory and
the bound when that delete is committed. A nack, a lost channel or no confirm within
``confirm_timeout`` (a sweep over the rows in flight, oldest first) schedules a resend
with exponential backoff; a return (mandatory, unroutable) or a refusal
(:class:`PublishRefused`: the broker closed the channel because of this message, e.g.
406 too large) moves the row to the dead table with the broker's reason, logged at
ERROR (rate-limited with counts: a few rows in full per minute, then one summary line),
instead of retrying it forever. An ack that arrives late, after a resend was scheduled,
still settles the row.

A row's exchange is known to exist before the row is sent (a passive declare on a side
channel, once per name: ``_outbox_rows.ExchangeCheck``): a 404 would close the
publishing channel and take the confirms of the rows sent before, which would be
delivered twice. Rows for a missing exchange go to the dead table unsent, with the
reason ``exchange not found: 404 NOT_FOUND - ...``.

On start every row still in the store is loaded and sent again (at-least-once: the
stored ``message_id`` goes out unchanged, so consumers can de-duplicate). Rows are kept
in memory while stored, which the bound (``max_bytes``) limits.
"""

from __future__ import annotations

import asyncio
import contextlib
import heapq
import logging
import random
import time
from collections import deque
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from ._failure_log import RateLimitedLog
from ._outbox_rows import (
    ACKED,
    DEAD,
    IN_FLIGHT,
    READY,
    RETRY_WRITE_DELAY,
    STORING,
    WAITING,
    Entry,
    ExchangeCheck,
    OutboxRoom,
    Send,
    SendOutcomes,
    Writer,
    open_store,
)
from ._waiters import Waiters
from .exceptions import (
    AMQPError,
    ConfigurationError,
    InvalidStateError,
    LocalProtocolError,
    OutboxError,
    PublishRefused,
    PublishTimeout,
    Unroutable,
)
from .observability import _state as _obs
from .outbox import Outbox, OutboxBatch, OutboxRecord
from .protocol.publish import publish_key, publish_parts
from .publisher import AsyncPublisher, open_publisher, port_of

if TYPE_CHECKING:
    from collections.abc import Iterable
    from datetime import timedelta

    from .aio.connection import AsyncConnection
    from .protocol import spec
    from .publisher import Body, OutgoingMessage

__all__ = ["AsyncOutboxPublisher", "OutboxStats"]

logger = logging.getLogger("rabbitry.outbox")


@dataclass(frozen=True, slots=True)
class OutboxStats:
    """A snapshot of an outbox publisher's metrics.

    Attributes:
        pending: messages stored and not yet confirmed (or moved to the dead table).
        pending_bytes: their size (bodies + properties), counted against ``max_bytes``.
        oldest_age: seconds since the oldest pending message was stored (``None``: empty).
        in_flight: messages sent and waiting for their confirm.
        stored: messages stored by this publisher since it started.
        acked: messages confirmed (and deleted) since it started.
        resent: sends that were resends since it started (failed sends, and the rows
            found in the outbox at start).
        dead: messages in the dead table (returned as unroutable, or refused).
    """

    pending: int
    pending_bytes: int
    oldest_age: float | None
    in_flight: int
    stored: int
    acked: int
    resent: int
    dead: int


class AsyncOutboxPublisher(OutboxRoom):
    """Publishes through a durable outbox: ``publish()`` returns once the message is stored.

    Get one with ``await connection.publisher(outbox=SQLiteOutbox(path))``; usable as
    ``async with``. The other options of ``publisher()`` apply to the inner confirmed
    publisher that delivers the stored rows (``confirm`` must stay ``True``); ``timeout``
    bounds how long ``publish()`` waits for room in a full outbox.

    Delivery is at-least-once: rows are deleted only after the broker's ack, resent after
    a nack, a lost channel or ``confirm_timeout``, and resent when a publisher starts on
    the same outbox after a crash. Returned (unroutable, with ``mandatory=True``) and
    refused (:class:`PublishRefused`) messages go to the outbox's dead table with the
    broker's reason, logged at ERROR (see ``rabbitry outbox``).
    """

    def __init__(
        self, connection: AsyncConnection, publisher: AsyncPublisher, outbox: Outbox
    ) -> None:
        self._conn = connection
        self._pub = publisher
        self._port = port_of(publisher)
        self._outbox = outbox
        self._loop = self._port.loop
        self._timeout = publisher.timeout
        self._writer = Writer(outbox, self._loop)
        self._writer.on_commit = self._committed
        self._entries: dict[int, Entry] = {}
        self._rows = 0
        self._bytes = 0
        self._next_id = 1
        self._ready: deque[Entry] = deque()
        self._ready_event = asyncio.Event()
        self._in_flight: dict[int, Entry] = {}
        self._retry_heap: list[tuple[float, Entry]] = []
        self._retry_timer: asyncio.TimerHandle | None = None
        self._room_waiters: Waiters[tuple[int, int]] = Waiters(self._give_back_room)
        self._idle_waiters: Waiters[None] = Waiters()
        # Changes gathered on the loop during one iteration, handed to the writer at once.
        self._batch = OutboxBatch()
        self._batch_waiters: list[tuple[asyncio.Future[None], list[Entry]]] = []
        self._flush_handle: asyncio.Handle | None = None
        self._closing = False
        self._tasks: list[asyncio.Task[None]] = []
        self._stored = self._acked_count = self._resent = self._dead = 0
        self._rng = random.Random()
        self._outcomes = SendOutcomes(self._acked, self._send_failed)
        self._exchanges = ExchangeCheck(
            connection, outbox, self._exchange_exists, self._kill, self._retry_later
        )
        self._dead_log = RateLimitedLog(
            logger,
            f"outbox {outbox.name}",
            "messages moved to the dead table",
            note="each is in the dead table with its reason",
        )
        self._commit_errors = RateLimitedLog(
            logger, f"outbox {outbox.name}", "failed commits", note="each raised to its caller"
        )

    def _start(self, next_id: int, dead: int, records: list[OutboxRecord]) -> None:
        """Take over the stored state (``records``: rows to send); start the tasks."""
        self._next_id = next_id
        self._dead = dead
        for record in records:
            entry = Entry(record, None, 1)
            entry.state = READY
            self._entries[record.id] = entry
            self._rows += 1
            self._bytes += entry.size
            self._ready.append(entry)
        if records:
            logger.info("outbox %s: resending %d stored messages", self._outbox.name, len(records))
        self._writer.thread.start()
        self._ready_event.set()
        self._tasks = [
            self._loop.create_task(self._sender()),
            self._loop.create_task(self._sweeper()),
        ]
        for task in self._tasks:
            task.add_done_callback(self._task_done)
        if _obs.active is not None:  # rabbitry.observability: the rabbitry.outbox.* metrics
            _obs.active.outbox_started(self)

    def _task_done(self, task: asyncio.Task[None]) -> None:
        # A background task that ends by itself stops delivery: never silently.
        if task.cancelled():
            return
        exc = task.exception()
        if exc is not None:
            logger.error(
                "outbox %s: %s failed; stored messages stay in the outbox until the next start",
                self._outbox.name,
                task.get_coro().__qualname__,  # type: ignore[union-attr]
                exc_info=exc,
            )
        elif not self._closing:
            logger.warning(
                "outbox %s: sending stopped (the connection is closed); %d messages stay "
                "in the outbox until the next start",
                self._outbox.name,
                self._rows,
            )

    def __repr__(self) -> str:
        return (
            f"<AsyncOutboxPublisher {self._outbox.name!r} pending={self._rows} "
            f"in_flight={len(self._in_flight)}>"
        )

    async def __aenter__(self) -> AsyncOutboxPublisher:
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.close()

    # ------------------------------------------------------------------ state

    @property
    def outbox(self) -> Outbox:
        """The store (and its policy: bound, confirm timeout, backoff)."""
        return self._outbox

    @property
    def publisher(self) -> AsyncPublisher:
        """The inner confirmed publisher that delivers the stored rows."""
        return self._pub

    @property
    def timeout(self) -> float | None:
        """The default deadline of ``publish()`` for room in a full outbox."""
        return self._timeout

    @property
    def is_closed(self) -> bool:
        """``close()`` was called."""
        return self._closing

    def stats(self) -> OutboxStats:
        """Metrics: pending rows and bytes, oldest age, in flight, resent, dead."""
        oldest = None
        for entry in self._entries.values():
            oldest = max(0.0, time.time() - entry.record.created_at)
            break
        return OutboxStats(
            pending=self._rows,
            pending_bytes=self._bytes,
            oldest_age=oldest,
            in_flight=len(self._in_flight),
            stored=self._stored,
            acked=self._acked_count,
            resent=self._resent,
            dead=self._dead,
        )

    # ------------------------------------------------------------------ publishing

    async def publish(
        self,
        body: Body,
        *,
        exchange: str = "",
        routing_key: str = "",
        properties: spec.BasicProperties | None = None,
        mandatory: bool | None = None,
        persistent: bool | None = None,
        expiration: int | timedelta | None = None,
        timeout: float | None = None,
    ) -> str:
        """Store one message durably; it is delivered in the background.

        Returns once the message is committed to the outbox (shared commits with
        concurrent publishes).

        Args:
            body: the payload; ``str`` is sent as UTF-8.
            exchange: the exchange ("" is the default exchange).
            routing_key: the routing key (the queue name on the default exchange).
            properties: the basic properties (``message_id`` is generated when absent).
            mandatory: ask the broker to return the message when no queue gets it: it
                then goes to the dead table (``None``: the publisher's default).
            persistent: ``True`` sets delivery mode 2 (persistent), ``False`` mode 1.
            expiration: per-message TTL, int milliseconds or a ``timedelta``.
            timeout: how long to wait for room while the outbox is at its bound
                (``None``: the publisher's default; ``None`` there waits without limit).

        Returns:
            The message's ``message_id`` (generated when ``properties`` has none); every
            send of it carries the same one.

        Raises:
            LocalProtocolError: an invalid argument, or a message larger than the
                outbox's ``max_bytes``; nothing was stored.
            OutboxFull: the outbox stayed full until the deadline; nothing was stored.
            OutboxError: the store failed to write; nothing was stored.
            InvalidStateError: the publisher is closed.
        """
        pub = self._pub
        if mandatory is None:
            mandatory = pub.mandatory
        frames, message_id = self._port.encode(
            body, exchange, routing_key, properties, mandatory, persistent, expiration
        )
        entry = self._entry(frames, message_id, exchange, routing_key, mandatory, time.time())
        await self._reserve(1, entry.size, timeout)
        await self._store([entry])
        return entry.record.message_id

    async def publish_many(
        self,
        messages: Iterable[OutgoingMessage | Body],
        *,
        exchange: str = "",
        routing_key: str = "",
        properties: spec.BasicProperties | None = None,
        mandatory: bool | None = None,
        persistent: bool | None = None,
        expiration: int | timedelta | None = None,
        timeout: float | None = None,
    ) -> list[str]:
        """Store many messages in one transaction (all or none).

        Every message is validated before anything is stored.

        Args:
            messages: :class:`OutgoingMessage` objects, or bodies that use the arguments
                below; ``None`` fields of an ``OutgoingMessage`` use them too.
            exchange: as for :meth:`publish`, for the messages that do not set their own.
            routing_key: likewise.
            properties: likewise.
            mandatory: likewise (``None``: the publisher's default).
            persistent: likewise.
            expiration: likewise.
            timeout: how long to wait for room for the whole batch, as for
                :meth:`publish`.

        Returns:
            The messages' ``message_id``, in order.

        Raises:
            LocalProtocolError: a message is invalid, or the batch can never fit the
                outbox's bound; nothing was stored.
            OutboxFull: no room for the whole batch before the deadline.
            OutboxError: the store failed to write; nothing was stored.
            InvalidStateError: the publisher is closed.
        """
        encoded = self._port.encode_batch(
            messages, exchange, routing_key, properties, mandatory, persistent, expiration
        )
        if not encoded:
            return []
        keys: dict[bytes, tuple[str, str, bool]] = {}
        entries = []
        make = self._entry
        now = time.time()
        for frames, message_id, flag in encoded:
            key = keys.get(frames[0])
            if key is None:  # the message's own exchange and routing key, from its head
                key = keys[frames[0]] = publish_key(frames[0])
            entries.append(make(frames, message_id, key[0], key[1], flag, now))
        rows = len(entries)
        size = sum(e.size for e in entries)
        await self._reserve(rows, size, timeout)
        await self._store(entries)
        return [e.record.message_id for e in entries]

    async def flush(self, *, timeout: float | None = None) -> None:
        """Wait until the outbox is empty: every message confirmed or moved to dead.

        Args:
            timeout: seconds to wait (``None``: no limit).

        Raises:
            PublishTimeout: messages were still pending after ``timeout`` seconds.
        """
        if not self._rows:
            return
        try:
            async with asyncio.timeout(timeout):
                await self._idle_waiters.wait()
        except TimeoutError:
            raise PublishTimeout(
                f"{self._rows} messages still in the outbox after {timeout} s"
            ) from None

    async def close(self, *, timeout: float | None = None) -> None:
        """Stop sending, wait for the confirms of what is in flight, release the outbox.

        Idempotent. Waits up to ``timeout`` seconds (``None``: without limit) for the
        messages in flight, but not while the connection is down. Whatever is not
        confirmed stays in the outbox and is sent by the next publisher on it.

        Args:
            timeout: seconds to wait for the confirms of the messages in flight.
        """
        if self._closing:
            return
        self._closing = True
        self._wake_room_waiters(InvalidStateError("the publisher is closed"))
        try:
            deadline = None if timeout is None else self._loop.time() + timeout
            pub = self._pub
            while (self._in_flight or pub.in_flight) and self._conn.is_open:
                if deadline is not None and self._loop.time() >= deadline:
                    break
                await asyncio.sleep(0.01)
        finally:
            for task in self._tasks:
                task.cancel()
            for task in self._tasks:
                with contextlib.suppress(asyncio.CancelledError, AMQPError):
                    await task
            if self._retry_timer is not None:
                self._retry_timer.cancel()
            await self._exchanges.close()
            self._dead_log.close()
            self._commit_errors.close()
            with contextlib.suppress(AMQPError):
                await self._pub.close(timeout=0)
            self._flush_batch()
            self._writer.stop()
            await asyncio.to_thread(self._writer.thread.join)
            await asyncio.to_thread(self._outbox.close)

    # ------------------------------------------------------------------ storing (loop)

    def _entry(
        self,
        frames: list[bytes],
        message_id: str | None,
        exchange: str,
        routing_key: str,
        mandatory: bool,
        now: float,
    ) -> Entry:
        properties, body = publish_parts(frames)
        size = len(body) + len(properties)
        if size > self._outbox.max_bytes:
            raise LocalProtocolError(
                f"basic.publish.body: {size} bytes exceeds the outbox's max_bytes "
                f"{self._outbox.max_bytes}"
            )
        assert message_id is not None  # _encode always sets one
        record = OutboxRecord(
            0, message_id, exchange, routing_key, mandatory, properties, body, now
        )
        return Entry(record, frames, 0)

    async def _store(self, entries: list[Entry]) -> None:
        rows = len(entries)
        table = self._entries
        next_id = self._next_id
        for entry in entries:
            entry.record.id = next_id
            table[next_id] = entry
            next_id += 1
        self._next_id = next_id
        if self._closing:
            self._forget(entries)
            raise InvalidStateError("the publisher is closed")
        waiter: asyncio.Future[None] = self._loop.create_future()
        self._batch.inserts += [e.record for e in entries]
        self._batch_waiters.append((waiter, entries))
        self._schedule_flush()
        # Once queued the rows are committed (and then sent) even if the caller is
        # cancelled meanwhile (that cancels only this waiter): at-least-once, no half batch.
        await waiter
        self._stored += rows

    def _forget(self, entries: list[Entry]) -> None:
        size = 0
        for entry in entries:
            self._entries.pop(entry.record.id, None)
            size += entry.size
        self._release(len(entries), size)

    def _schedule_flush(self) -> None:
        if self._flush_handle is None:
            self._flush_handle = self._loop.call_soon(self._flush_batch)

    def _flush_batch(self) -> None:
        """Hand what this loop iteration gathered to the writer thread (one lock round)."""
        self._flush_handle = None
        batch, waiters = self._batch, self._batch_waiters
        if not batch and not waiters:
            return
        self._batch, self._batch_waiters = OutboxBatch(), []
        if self._writer.thread.is_alive():
            self._writer.submit(batch, waiters)
            return
        for waiter, _entries in waiters:  # closed: the writer is gone
            if not waiter.done():
                waiter.set_exception(InvalidStateError("the publisher is closed"))

    def _committed(
        self,
        batch: OutboxBatch,
        waiters: list[tuple[asyncio.Future[None], list[Entry]]],
        error: BaseException | None,
    ) -> None:
        """Loop thread: the writer applied ``batch`` (or failed to: nothing of it)."""
        if error is not None:
            self._commit_errors.log(
                "failed", "outbox %s: commit failed: %s", self._outbox.name, error
            )
            if not isinstance(error, OutboxError):
                wrapped = OutboxError(self._outbox.name, f"write failed: {error!r}")
                wrapped.__cause__ = error
                error = wrapped
            for waiter, entries in waiters:
                self._forget(entries)
                if not waiter.done():
                    waiter.set_exception(error)
            # Acks, failures and deaths are not lost: they are tried again shortly.
            batch.inserts = []
            if batch and not self._closing:
                self._loop.call_later(RETRY_WRITE_DELAY, self._requeue, batch)
            return
        for waiter, entries in waiters:
            for entry in entries:
                if entry.state == STORING:
                    entry.state = READY
                    self._ready.append(entry)
            if not waiter.done():
                waiter.set_result(None)
        if waiters:
            self._ready_event.set()
        freed_rows = freed_size = 0
        table = self._entries
        for row_id in batch.deletes:
            gone = table.pop(row_id, None)
            if gone is not None:
                freed_rows += 1
                freed_size += gone.size
                self._acked_count += 1
        for row_id, _reason in batch.deaths:
            gone = table.pop(row_id, None)
            if gone is not None:
                freed_rows += 1
                freed_size += gone.size
                self._dead += 1
        if freed_rows:
            self._release(freed_rows, freed_size)

    def _requeue(self, batch: OutboxBatch) -> None:
        if self._closing:
            return
        mine = self._batch
        mine.deletes += batch.deletes
        mine.failures += batch.failures
        mine.deaths += batch.deaths
        mine.resent += batch.resent
        self._schedule_flush()

    # ------------------------------------------------------------------ sending (loop)

    async def _sender(self) -> None:
        pub = self._port
        ready = self._ready
        event = self._ready_event
        while True:
            if not ready:
                event.clear()
                await event.wait()
                continue
            if not pub.reserve_now():
                try:
                    await pub.acquire(None, None)
                except InvalidStateError:
                    if pub.closing or self._conn.is_closed:
                        return  # rows stay stored for the next publisher
                    await asyncio.sleep(self._outbox.retry_delay or 0.1)
                    continue
                except AMQPError as exc:
                    logger.warning("outbox %s: cannot send yet: %r", self._outbox.name, exc)
                    await asyncio.sleep(self._outbox.retry_delay or 0.1)
                    continue
            # Send every ready row the window has room for, then one flush.
            send = self._send_one
            send(ready.popleft())
            while ready and pub.reserve_more():
                send(ready.popleft())
            pub.kick()

    def _send_one(self, entry: Entry) -> None:
        """Send one row; its window slot is reserved by the caller."""
        pub = self._port
        if entry.state != READY:  # acked late while waiting: nothing to send
            pub.release_slot()
            return
        record = entry.record
        if record.exchange not in self._exchanges.known:
            pub.release_slot()
            self._exchanges.hold(entry)  # sent once the exchange is known to exist
            return
        frames = entry.frames
        entry.frames = None
        if frames is None:
            try:
                frames = self._frames(record)
            except LocalProtocolError as exc:
                pub.release_slot()
                self._kill(entry, f"cannot be encoded: {exc}", "not encodable")
                return
        if entry.sends:
            self._resent += 1
            self._batch.resent += 1
            self._schedule_flush()
        entry.sends += 1
        entry.gen += 1
        entry.state = IN_FLIGHT
        entry.sent_at = self._loop.time()
        self._in_flight[record.id] = entry
        pub.send_reserved(
            frames, Send(self._outcomes, entry, entry.gen), record.message_id, record.mandatory
        )

    def _frames(self, record: OutboxRecord) -> list[bytes]:
        return self._port.frames(
            record.exchange, record.routing_key, record.mandatory, record.properties, record.body
        )

    def _acked(self, entry: Entry) -> None:
        if entry.state in (ACKED, DEAD, STORING):
            return
        if entry.state == IN_FLIGHT:
            self._in_flight.pop(entry.record.id, None)
        entry.state = ACKED  # also a late ack of an earlier send: the broker has it
        self._batch.deletes.append(entry.record.id)
        self._schedule_flush()

    def _send_failed(self, entry: Entry, gen: int, exc: BaseException) -> None:
        if entry.gen != gen or entry.state != IN_FLIGHT:
            return  # an earlier send, already given up on
        self._in_flight.pop(entry.record.id, None)
        if isinstance(exc, Unroutable):
            message = exc.message
            self._kill(entry, f"{message.reply_code} {message.reply_text}", "unroutable")
            return
        if isinstance(exc, PublishRefused):
            # A definite refusal (404 no such exchange, 406 too large...): sending it
            # again unchanged fails the same way, so it is not retried.
            record = entry.record
            record.attempts += 1
            record.last_error = f"{type(exc).__name__}: {exc}"
            self._batch.failures.append((record.id, record.attempts, record.last_error))
            if exc.reply_code == 404:  # it was there when checked: check it again
                self._exchanges.forget(record.exchange)
            self._kill(
                entry, f"refused by the broker: {exc.reply_code} {exc.reply_text}", "refused"
            )
            return
        if self._closing:
            entry.state = WAITING  # stays stored; the next publisher sends it
            return
        self._retry_later(entry, exc)

    def _exchange_exists(self, entries: list[Entry]) -> None:
        for entry in entries:
            entry.state = READY
            self._ready.append(entry)
        if entries:
            self._ready_event.set()

    def _kill(self, entry: Entry, reason: str, kind: str) -> None:
        entry.state = DEAD
        self._dead_log.log(
            kind,
            "outbox %s: message %s moved to the dead table (rabbitry outbox status shows "
            "it; retry-dead sends it again): %s",
            self._outbox.name,
            entry.record.message_id,
            reason,
        )
        self._batch.deaths.append((entry.record.id, reason))
        self._schedule_flush()

    def _retry_later(self, entry: Entry, exc: BaseException) -> None:
        record = entry.record
        record.attempts += 1
        record.last_error = f"{type(exc).__name__}: {exc}"
        self._batch.failures.append((record.id, record.attempts, record.last_error))
        self._schedule_flush()
        outbox = self._outbox
        delay = min(outbox.max_retry_delay, outbox.retry_delay * 2 ** (record.attempts - 1))
        delay *= self._rng.uniform(0.75, 1.25)
        entry.state = WAITING
        entry.due = self._loop.time() + delay
        heapq.heappush(self._retry_heap, (entry.due, entry))
        self._arm_retry_timer()

    def _arm_retry_timer(self) -> None:
        if not self._retry_heap:
            return
        due = self._retry_heap[0][0]
        timer = self._retry_timer
        if timer is not None:
            if timer.when() <= due:
                return
            timer.cancel()
        self._retry_timer = self._loop.call_at(due, self._retry_due)

    def _retry_due(self) -> None:
        self._retry_timer = None
        now = self._loop.time()
        heap = self._retry_heap
        moved = False
        while heap and heap[0][0] <= now:
            _due, entry = heapq.heappop(heap)
            if entry.state == WAITING:
                entry.state = READY
                self._ready.append(entry)
                moved = True
        if moved:
            self._ready_event.set()
        self._arm_retry_timer()

    async def _sweeper(self) -> None:
        """Treat rows unconfirmed for ``confirm_timeout`` as failed sends (resend)."""
        limit = self._outbox.confirm_timeout
        period = min(1.0, limit / 4)
        while True:
            await asyncio.sleep(period)
            now = self._loop.time()
            expired = []
            for entry in self._in_flight.values():
                if now - entry.sent_at < limit:
                    break  # in send order: the rest are younger
                expired.append(entry)
            for entry in expired:
                self._send_failed(
                    entry,
                    entry.gen,
                    PublishTimeout(f"not confirmed within {limit:g} s (confirm_timeout)"),
                )


async def open_outbox_publisher(
    connection: AsyncConnection,
    outbox: Outbox,
    *,
    open_timeout: float | None = None,
    **options: Any,
) -> AsyncOutboxPublisher:
    """An outbox publisher on ``connection`` delivering what ``outbox`` holds, its
    channel open within ``open_timeout`` s: what :meth:`AsyncConnection.publisher`
    returns with ``outbox`` (``options``: those of :class:`AsyncPublisher`)."""
    if not isinstance(outbox, Outbox):
        raise ConfigurationError(
            f"outbox: must be an Outbox (e.g. SQLiteOutbox(path)), got {type(outbox).__name__}"
        )
    if not options.get("confirm", True):
        raise ConfigurationError("outbox: needs confirm=True (rows are deleted on ack)")
    # The store first: a locked or corrupt file fails here, before the broker is used.
    status, records = await asyncio.to_thread(open_store, outbox)
    try:
        publisher = await open_publisher(connection, open_timeout=open_timeout, **options)
    except BaseException:
        await asyncio.to_thread(outbox.close)
        raise
    durable = AsyncOutboxPublisher(connection, publisher, outbox)
    durable._start(status.last_id + 1, status.dead, records)
    return durable


def release_store(publisher: AsyncOutboxPublisher) -> None:
    """Blocking, the loop being gone: stop the writer and close the store (for the
    thread-safe twin, :class:`rabbitry.OutboxPublisher`; not for applications)."""
    publisher._closing = True
    publisher._writer.stop()
    if publisher._writer.thread.is_alive():
        publisher._writer.thread.join()
    publisher._outbox.close()
