"""AsyncOutboxPublisher: publishing through a durable outbox (nothing lost if we crash).

Get one with ``await connection.publisher(outbox=SQLiteOutbox(path))``.

Theory of operation
-------------------
``publish()`` encodes and validates the message with the inner :class:`AsyncPublisher`'s
encoder, reserves room in the outbox's bound (rows and bytes; waiting up to the publish
timeout, then :class:`OutboxFull`: ``_outbox_room.OutboxRoom``), and queues the row for
the writer thread, which commits the rows of every ``publish()`` waiting as one
transaction (``_outbox_commits.CommitQueue``). Only after that commit does ``publish()``
return, and only then is the row handed to the sender: a message is never on the wire
before it is on disk.

The sender task sends rows with confirms through the inner publisher's window; the rows
in flight are settled by ``_outbox_sends.InFlight``: deleted on ack, resent with backoff
after a nack, a lost channel or ``confirm_timeout``, moved to the dead table with the
broker's reason when returned or refused (logged at ERROR, rate-limited with counts).

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
import logging
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from ._outbox.commits import CommitQueue
from ._outbox.room import OutboxRoom
from ._outbox.rows import (
    IN_FLIGHT,
    READY,
    Entry,
    ExchangeCheck,
    ReadyRows,
    Send,
    open_store,
)
from ._outbox.sends import InFlight, RetrySchedule
from .exceptions import (
    AMQPError,
    ConfigurationError,
    InvalidStateError,
    LocalProtocolError,
    PublishTimeout,
)
from .observability import _state as _obs
from .outbox import Outbox, OutboxRecord
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


class AsyncOutboxPublisher:
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
        self._closing = False
        self._tasks: list[asyncio.Task[None]] = []
        self._resent = 0
        # The rows stored or being stored, by id; the collaborators below share it.
        self._entries: dict[int, Entry] = {}
        self._ready = ReadyRows()
        self._room = OutboxRoom(outbox, self._timeout)
        self._commits = CommitQueue(outbox, self._loop, self._entries, self._ready, self._room)
        self._retries = RetrySchedule(outbox, self._loop, self._commits, self._ready)
        self._exchanges = ExchangeCheck(
            connection, outbox, self._ready.add, self._commits.kill, self._retries.later
        )
        self._in_flight = InFlight(
            outbox, self._loop, self._commits, self._retries, self._exchanges
        )

    def _start(self, next_id: int, dead: int, records: list[OutboxRecord]) -> None:
        """Take over the stored state (``records``: rows to send); start the tasks."""
        self._commits.next_id = next_id
        self._commits.dead = dead
        room = self._room
        for record in records:
            entry = Entry(record, None, 1)
            entry.state = READY
            self._entries[record.id] = entry
            room.rows += 1
            room.bytes += entry.size
            self._ready.rows.append(entry)
        if records:
            logger.info("outbox %s: resending %d stored messages", self._outbox.name, len(records))
        self._commits.writer.thread.start()
        self._ready.event.set()
        self._tasks = [
            self._loop.create_task(self._sender()),
            self._loop.create_task(self._in_flight.sweep()),
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
                self._room.rows,
            )

    def __repr__(self) -> str:
        return (
            f"<AsyncOutboxPublisher {self._outbox.name!r} pending={self._room.rows} "
            f"in_flight={len(self._in_flight.rows)}>"
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
        commits = self._commits
        return OutboxStats(
            pending=self._room.rows,
            pending_bytes=self._room.bytes,
            oldest_age=oldest,
            in_flight=len(self._in_flight.rows),
            stored=commits.stored,
            acked=commits.acked,
            resent=self._resent,
            dead=commits.dead,
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
        await self._room.reserve(1, entry.size, timeout)
        await self._commits.store([entry])
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
        await self._room.reserve(rows, size, timeout)
        await self._commits.store(entries)
        return [e.record.message_id for e in entries]

    async def flush(self, *, timeout: float | None = None) -> None:
        """Wait until the outbox is empty: every message confirmed or moved to dead.

        Args:
            timeout: seconds to wait (``None``: no limit).

        Raises:
            PublishTimeout: messages were still pending after ``timeout`` seconds.
        """
        if not self._room.rows:
            return
        try:
            async with asyncio.timeout(timeout):
                await self._room.wait_idle()
        except TimeoutError:
            raise PublishTimeout(
                f"{self._room.rows} messages still in the outbox after {timeout} s"
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
        self._closing = self._commits.closing = self._in_flight.closing = True
        self._room.close(InvalidStateError("the publisher is closed"))
        try:
            deadline = None if timeout is None else self._loop.time() + timeout
            pub = self._pub
            while (self._in_flight.rows or pub.in_flight) and self._conn.is_open:
                if deadline is not None and self._loop.time() >= deadline:
                    break
                await asyncio.sleep(0.01)
        finally:
            for task in self._tasks:
                task.cancel()
            for task in self._tasks:
                with contextlib.suppress(asyncio.CancelledError, AMQPError):
                    await task
            self._retries.cancel()
            await self._exchanges.close()
            self._commits.close_logs()
            with contextlib.suppress(AMQPError):
                await self._pub.close(timeout=0)
            commits = self._commits
            commits.flush()
            commits.writer.stop()
            await asyncio.to_thread(commits.writer.thread.join)
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

    # ------------------------------------------------------------------ sending (loop)

    async def _sender(self) -> None:
        pub = self._port
        ready = self._ready.rows
        event = self._ready.event
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
                self._commits.kill(entry, f"cannot be encoded: {exc}", "not encodable")
                return
        if entry.sends:
            self._resent += 1
            commits = self._commits
            commits.batch.resent += 1
            commits.schedule()
        entry.sends += 1
        entry.gen += 1
        entry.state = IN_FLIGHT
        entry.sent_at = self._loop.time()
        self._in_flight.rows[record.id] = entry
        pub.send_reserved(
            frames, Send(self._in_flight, entry, entry.gen), record.message_id, record.mandatory
        )

    def _frames(self, record: OutboxRecord) -> list[bytes]:
        return self._port.frames(
            record.exchange, record.routing_key, record.mandatory, record.properties, record.body
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
    publisher._closing = publisher._commits.closing = True
    writer = publisher._commits.writer
    writer.stop()
    if writer.thread.is_alive():
        writer.thread.join()
    publisher._outbox.close()
