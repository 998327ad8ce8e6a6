"""The rows of an outbox publisher: their states, the queue of rows ready to send, the
confirm of one send, the writer thread that owns the store (group commit), the check
that a row's exchange exists (:class:`ExchangeCheck`) and the writer-side start."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import threading
from collections import deque
from typing import TYPE_CHECKING, Any, Protocol

from ..exceptions import AMQPError, NotFound
from ..outbox import Outbox, OutboxBatch, OutboxRecord, OutboxStatus

if TYPE_CHECKING:
    from collections.abc import Callable

    from ..aio.channel import AsyncChannel
    from ..aio.connection import AsyncConnection

logger = logging.getLogger("rabbitry.outbox")

# Entry states (_CHECKING: held until its exchange is known to exist).
STORING, READY, IN_FLIGHT, WAITING, ACKED, DEAD, _CHECKING = range(7)
RETRY_WRITE_DELAY = 1.0


class SendOwner(Protocol):
    """Where a :class:`Send` reports: the handlers of an ack and of a failed send (nack,
    return, channel end) of one row."""

    def acked(self, entry: Entry) -> None:
        """The broker confirmed the send of ``entry``."""

    def send_failed(self, entry: Entry, gen: int, exc: BaseException) -> None:
        """Send number ``gen`` of ``entry`` failed with ``exc``."""


class Entry:
    """A stored row and what the publisher knows about it (loop thread)."""

    __slots__ = ("due", "frames", "gen", "record", "sends", "sent_at", "size", "state")

    def __init__(self, record: OutboxRecord, frames: list[bytes] | None, sends: int) -> None:
        self.record = record
        self.size = len(record.body) + len(record.properties)
        self.frames = frames
        self.state = STORING
        self.gen = 0
        self.sends = sends
        self.sent_at = 0.0
        self.due = 0.0

    def __lt__(self, other: Entry) -> bool:  # heap order among equal due times
        return self.record.id < other.record.id


class ReadyRows:
    """The rows ready to be sent, in order, and the event that wakes the sender."""

    __slots__ = ("event", "rows")

    def __init__(self) -> None:
        self.rows: deque[Entry] = deque()
        self.event = asyncio.Event()

    def add(self, entries: list[Entry]) -> None:
        """Mark ``entries`` ready and queue them, waking the sender when there are any."""
        for entry in entries:
            entry.state = READY
            self.rows.append(entry)
        if entries:
            self.event.set()


class Send:
    """One send of a row: the channel settles it on ack / nack / return / channel end."""

    __slots__ = ("entry", "gen", "owner", "settled")

    def __init__(self, owner: SendOwner, entry: Entry, gen: int) -> None:
        self.owner = owner
        self.entry = entry
        self.gen = gen
        self.settled = False

    def done(self) -> bool:
        return self.settled

    def set_result(self, _result: None, /) -> None:
        self.settled = True
        self.owner.acked(self.entry)

    def set_exception(self, exception: BaseException, /) -> None:
        self.settled = True
        self.owner.send_failed(self.entry, self.gen, exception)


class Writer:
    """The thread that owns the store and commits batches (group commit)."""

    def __init__(self, store: Outbox, loop: asyncio.AbstractEventLoop) -> None:
        self.store = store
        self.loop = loop
        self.cond = threading.Condition(threading.Lock())
        self.batch = OutboxBatch()
        self.waiters: list[tuple[asyncio.Future[None], list[Entry]]] = []
        self.stopping = False
        self.on_commit: Any = None
        self.thread = threading.Thread(
            target=self._run, name=f"rabbitry-outbox {store.name}", daemon=True
        )

    def submit(
        self, batch: OutboxBatch, waiters: list[tuple[asyncio.Future[None], list[Entry]]]
    ) -> None:
        with self.cond:
            mine = self.batch
            mine.inserts += batch.inserts
            mine.deletes += batch.deletes
            mine.failures += batch.failures
            mine.deaths += batch.deaths
            mine.resent += batch.resent
            self.waiters += waiters
            self.cond.notify()

    def stop(self) -> None:
        with self.cond:
            self.stopping = True
            self.cond.notify()

    def _run(self) -> None:
        while True:
            with self.cond:
                while not self.batch and not self.stopping:
                    self.cond.wait()
                if not self.batch:
                    return
                batch, self.batch = self.batch, OutboxBatch()
                waiters, self.waiters = self.waiters, []
            error: BaseException | None = None
            try:
                self.store.apply(batch)
            except BaseException as exc:  # reported to the loop, never lost
                error = exc
            try:
                self.loop.call_soon_threadsafe(self.on_commit, batch, waiters, error)
            except RuntimeError:  # the loop is closed: nobody is left to tell
                return


class ExchangeCheck:
    """Which exchanges the rows go to exist, learned without risking the channel that
    publishes (loop thread).

    A publish to a missing exchange makes the broker close the publishing channel
    (404), and with it go the confirms of every row sent before it on that channel:
    those rows would be sent again, and delivered twice. So before the first row for an
    exchange is sent, the exchange is checked with a passive declare on a side channel
    of its own, once per name: a name that exists is remembered (until a publish to it
    is refused with 404 anyway: :meth:`forget`); the rows for a missing one are handed
    to ``missing`` with the broker's error (nothing of them was sent). Rows that arrive
    for a name while it is being checked wait for the same answer, in order. The
    default exchange ("") always exists.

    Args:
        connection: the connection the side channel is opened on.
        outbox: the store (its name for the logs, its ``confirm_timeout`` bounds the
            opening of the side channel and each declare).
        known: ``known(entries)``: their exchange exists; send them.
        kill: ``kill(entry, reason, kind)``: move a row for a missing exchange to the
            dead table.
        retry: ``retry(entry, exc)``: the check could not be made (the connection is
            down, no answer...): try the row again later.
    """

    def __init__(
        self,
        connection: AsyncConnection,
        outbox: Outbox,
        known: Callable[[list[Entry]], None],
        kill: Callable[[Entry, str, str], None],
        retry: Callable[[Entry, BaseException], None],
    ) -> None:
        self._conn = connection
        self._outbox = outbox
        self._known_cb = known
        self._kill = kill
        self._retry = retry
        #: Exchange names known to exist (checked, or the default exchange).
        self.known: set[str] = {""}
        self._waiting: dict[str, list[Entry]] = {}
        self._tasks: set[asyncio.Task[None]] = set()
        self._channel: AsyncChannel | None = None
        self._turn = asyncio.Lock()  # one declare at a time on the side channel
        #: Passive declares made, and the names found missing (for stats and tests).
        self.checks = 0
        self.missing = 0

    def hold(self, entry: Entry) -> None:
        """Keep ``entry`` until its exchange (not in :attr:`known`) has been checked."""
        entry.state = _CHECKING
        name = entry.record.exchange
        waiting = self._waiting.get(name)
        if waiting is not None:
            waiting.append(entry)
            return
        self._waiting[name] = [entry]
        task = asyncio.get_running_loop().create_task(self._check(name))
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    def forget(self, name: str) -> None:
        """A publish to ``name`` was refused (404): check it again before the next row."""
        if name:
            self.known.discard(name)

    async def close(self) -> None:
        """Stop checking (held rows stay stored) and close the side channel."""
        for task in list(self._tasks):
            task.cancel()
        for task in list(self._tasks):
            with contextlib.suppress(asyncio.CancelledError):
                await task
        self._waiting.clear()
        channel, self._channel = self._channel, None
        if channel is not None and channel.is_open:
            with contextlib.suppress(AMQPError):
                await channel.close()

    async def _check(self, name: str) -> None:
        timeout = self._outbox.confirm_timeout
        try:
            async with self._turn:
                channel = self._channel
                if channel is None or channel.is_closed:
                    channel = self._channel = await self._conn.channel(timeout=timeout)
                self.checks += 1
                await channel.exchange_declare(name, passive=True, timeout=timeout)
        except NotFound as exc:  # the broker closed the side channel, only that one
            self._channel = None
            self.missing += 1
            reason = f"exchange not found: {exc.reply_code} {exc.reply_text}"
            for entry in self._take(name):
                self._kill(entry, reason, "no exchange")
            return
        except AMQPError as exc:
            # No answer, or the connection failed: the next check starts on a new
            # channel (a request left unanswered would hold up every later one).
            stale, self._channel = self._channel, None
            if stale is not None and stale.is_open:
                closing = asyncio.get_running_loop().create_task(stale.close(timeout=timeout))
                closing.add_done_callback(_quiet)
            entries = self._take(name)
            logger.warning(
                "outbox %s: cannot check that exchange %r exists yet (%r); its %d "
                "messages are tried again later",
                self._outbox.name,
                name,
                exc,
                len(entries),
            )
            for entry in entries:
                self._retry(entry, exc)
            return
        self.known.add(name)
        self._known_cb(self._take(name))

    def _take(self, name: str) -> list[Entry]:
        return [e for e in self._waiting.pop(name, []) if e.state == _CHECKING]


def _quiet(task: asyncio.Task[None]) -> None:
    """Retrieve the outcome of a best-effort close (it may fail: nothing to do)."""
    if not task.cancelled():
        task.exception()


def open_store(outbox: Outbox) -> tuple[OutboxStatus, list[OutboxRecord]]:
    """Writer-side start: claim the store and read what it still holds."""
    status = outbox.open()
    try:
        records = list(outbox.pending())
    except BaseException:
        outbox.close()
        raise
    return status, records
