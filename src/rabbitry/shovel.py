"""Move messages from a queue to an exchange, on the same broker or another, losing none.

Usage::

    from rabbitry.shovel import AsyncShovel

    stats = await AsyncShovel(
        "amqp://guest:guest@old-host/", "orders",
        "amqp://guest:guest@new-host/", exchange="", routing_key="orders",
    ).run()
    print(stats.moved, stats.possible_duplicates)

:class:`Shovel` is the same for threads (``Shovel(...).run()`` blocks).

How nothing is lost
-------------------
The shovel opens two connections of its own (named ``<connection_name>-source`` and
``-destination``, so an operator can find them). It takes messages from the source
with manual acknowledgement and publishes each copy to the destination with publisher
confirms and ``mandatory``. A source message is acknowledged **only after** the broker
confirmed its copy. So at every instant each message is in the source queue (ready or
unacknowledged), or confirmed at the destination, or both -- never in neither:

* interrupted (Ctrl-C, crash, kill) anywhere: the unacknowledged messages go back to
  the source queue when its connection ends; running again moves them. Those whose
  copy was already confirmed are then at both places: duplicates, never losses.
* a connection is lost while running: automatic recovery (on by default) reconnects.
  Deliveries from before the loss are redelivered by the broker; copies whose confirm
  never came (``PublishOutcomeUnknown``) are requeued at the source and sent again.
  A redelivered message whose copy *was* confirmed and which has a ``message_id`` is
  recognised and only acknowledged (``deduplicated``); without a ``message_id`` it is
  sent again and counted in ``possible_duplicates``.
* the destination refuses a copy (nack) or cannot route it (returned): the source
  message is requeued and the run stops with the error after settling what is in
  flight, rather than dropping it.

``possible_duplicates`` is an upper bound of the extra copies this run made at the
destination (a copy sent again after an unknown outcome may have arrived once only).

Which messages
--------------
Without ``count`` the shovel moves the messages the source queue holds when it starts
(its depth then), so messages published meanwhile, or copies routed back into the
same queue, are not taken again; with ``count`` at most that many. It also stops when
no message arrived for ``idle_timeout`` seconds while nothing is in flight and the
connection is up (another consumer drained the queue).

With a ``filter``, messages it rejects stay in the source queue, in their order:
they are fetched one by one (``basic.get``, slower) and held unacknowledged until the
run ends, then given back. Without one, messages are streamed with ``basic.consume``
and a prefetch of ``window``.
"""

from __future__ import annotations

import asyncio
import contextlib
import threading
from collections.abc import Sequence
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any

from ._shovel.endpoints import Endpoint, parse_destination, parse_source
from ._shovel.ledger import ShovelLedger, key_of
from .exceptions import (
    AMQPError,
    ConfigurationError,
    InvalidStateError,
    PublishError,
    PublishOutcomeUnknown,
    PublishTimeout,
)

if TYPE_CHECKING:
    from collections.abc import Callable

    from .aio.channel import AsyncChannel
    from .aio.connection import AsyncConnection
    from .protocol.message import Message
    from .publisher import AsyncPublisher

__all__ = [
    "AsyncShovel",
    "Endpoint",
    "Shovel",
    "ShovelStats",
    "parse_destination",
    "parse_source",
]


@dataclass(frozen=True)
class ShovelStats:
    """Counters of a shovel run (a snapshot).

    Attributes:
        target: how many messages the run means to move (the start depth or ``count``).
        moved: messages whose copy the destination confirmed and that were then
            acknowledged at the source.
        skipped: messages the filter left in the source queue.
        deduplicated: redelivered messages whose confirmed copy was recognised by
            ``message_id``: acknowledged without sending them again (included in
            ``moved`` once).
        possible_duplicates: copies sent again after an earlier copy was confirmed or
            its outcome was unknown: an upper bound of the duplicates this run made.
        redelivered: deliveries the broker flagged as redelivered.
        requeued: source messages given back after an unknown or failed publish.
        in_flight: copies sent and not yet confirmed.
    """

    target: int = 0
    moved: int = 0
    skipped: int = 0
    deduplicated: int = 0
    possible_duplicates: int = 0
    redelivered: int = 0
    requeued: int = 0
    in_flight: int = 0

    def as_dict(self) -> dict[str, int]:
        """The counters as a plain dict (for JSON)."""
        return {
            "target": self.target,
            "moved": self.moved,
            "skipped": self.skipped,
            "deduplicated": self.deduplicated,
            "possible_duplicates": self.possible_duplicates,
            "redelivered": self.redelivered,
            "requeued": self.requeued,
            "in_flight": self.in_flight,
        }


# --------------------------------------------------------------------------- the run


def _display_urls(urls: str | Sequence[str], field: str) -> str:
    """Validate one URL or a list of URLs; return them for display, passwords masked."""
    from .config import parse_urls

    if not isinstance(urls, str) and not (
        isinstance(urls, Sequence) and all(isinstance(url, str) for url in urls)
    ):
        raise ConfigurationError(
            f"{field}: must be an amqp:// URL or a list of them, got {type(urls).__name__}"
        )
    try:
        shown = [params.display_url() for params in parse_urls(urls)]
    except ConfigurationError as exc:
        raise ConfigurationError(f"{field}: {exc}") from None
    return shown[0] if len(shown) == 1 else "[" + ", ".join(shown) + "]"


class AsyncShovel:
    """Move messages from a source queue to a destination exchange (asyncio).

    Args:
        source: the source broker's ``amqp://`` URL (its path is the vhost), or a list
            of URLs (the nodes of a cluster, tried in order).
        queue: the source queue.
        destination: the destination broker's URL or list of URLs (may equal
            ``source``).
        exchange: the destination exchange (``""``: the default exchange, with
            ``routing_key`` naming the target queue).
        routing_key: the routing key of the copies (``None``: each message's own).
        count: move at most this many (default: the source depth at the start).
        filter: ``filter(message) -> bool``; messages it rejects stay in the source.
        window: unconfirmed copies at most, and the consumer prefetch.
        idle_timeout: stop after this many seconds without a message (nothing in
            flight, connections up).
        timeout: seconds for connecting and for each broker operation and confirm.
        on_progress: called with a :class:`ShovelStats` after each message moved
            or skipped (on the event loop: keep it quick).
        connection_name: prefix of the two connections' names.

    Raises:
        ConfigurationError: a bad option or URL (when built); the message names the
            field and never shows a password.
    """

    def __init__(
        self,
        source: str | Sequence[str],
        queue: str,
        destination: str | Sequence[str],
        exchange: str = "",
        routing_key: str | None = None,
        *,
        count: int | None = None,
        filter: Callable[[Message], bool] | None = None,
        window: int = 500,
        idle_timeout: float = 5.0,
        timeout: float = 30.0,
        on_progress: Callable[[ShovelStats], Any] | None = None,
        connection_name: str = "rabbitry-shovel",
    ) -> None:
        for name, value, low in (("count", count, 1), ("window", window, 1)):
            if value is None and name == "count":
                continue
            if isinstance(value, bool) or not isinstance(value, int) or value < low:
                raise ConfigurationError(f"{name}: must be an integer >= {low}, got {value!r}")
        for name, seconds in (("idle_timeout", idle_timeout), ("timeout", timeout)):
            if isinstance(seconds, bool) or not isinstance(seconds, int | float) or seconds <= 0:
                raise ConfigurationError(f"{name}: must be a positive number, got {seconds!r}")
        if not isinstance(queue, str) or not queue:
            raise ConfigurationError(f"queue: must be a non-empty str, got {queue!r}")
        if not isinstance(exchange, str):
            raise ConfigurationError(f"exchange: must be a str, got {exchange!r}")
        if exchange == "" and routing_key is None:
            raise ConfigurationError(
                "routing_key: the default exchange '' needs one (the target queue's name)"
            )
        self._source_shown = _display_urls(source, "source")
        self._destination_shown = _display_urls(destination, "destination")
        self.source = source
        self.queue = queue
        self.destination = destination
        self.exchange = exchange
        self.routing_key = routing_key
        self.count = count
        self.filter = filter
        self.window = window
        self.idle_timeout = float(idle_timeout)
        self.timeout = float(timeout)
        self.on_progress = on_progress
        self.connection_name = connection_name
        self._stats = ShovelStats()
        # A plain flag: set from any thread, read on the loop between messages.
        self._stopping = False
        self._started = False
        self._failure: BaseException | None = None
        self._ledger = ShovelLedger()
        self._in_flight: set[asyncio.Future[None]] = set()
        self._settled: asyncio.Event | None = None
        self._depth = 0

    def __repr__(self) -> str:
        src, dst = self._source_shown, self._destination_shown
        return f"<AsyncShovel {src} {self.queue!r} -> {dst} {self.exchange!r}>"

    @property
    def stats(self) -> ShovelStats:
        """The counters so far."""
        return replace(self._stats, in_flight=len(self._in_flight))

    def stop(self) -> None:
        """Ask a running shovel to stop taking messages (thread-safe); ``run`` then
        settles what is in flight and returns (within ``idle_timeout`` when it was
        waiting for a message)."""
        self._stopping = True

    def _count(self, **changes: int) -> None:
        values = {k: getattr(self._stats, k) + v for k, v in changes.items()}
        self._stats = replace(self._stats, **values)

    def _progress(self) -> None:
        if self.on_progress is None:
            return
        try:
            self.on_progress(self.stats)
        except Exception as exc:
            # It runs in a confirm callback, where an exception would only be logged:
            # stop the run and raise it from run() instead.
            if self._failure is None:
                self._failure = exc

    async def run(self) -> ShovelStats:
        """Move the messages; returns the final counters.

        Raises:
            Nacked / Unroutable / PublishRefused: the destination refused a copy (its
                source message is back in the source queue; the run stopped).
            AMQPConnectionError: a connection could not be made or recovered.
            NotFound: the source queue or destination exchange does not exist.
        """
        from ._connection import AsyncConnection

        if self._started:
            raise InvalidStateError("a shovel runs once; create a new one to run again")
        self._started = True
        self._settled = asyncio.Event()
        src = AsyncConnection(
            self.source,
            connection_name=f"{self.connection_name}-source",
            connection_timeout=min(self.timeout, 60.0),
        )
        dst = AsyncConnection(
            self.destination,
            connection_name=f"{self.connection_name}-destination",
            connection_timeout=min(self.timeout, 60.0),
        )
        try:
            await src.connect(timeout=self.timeout)
            await dst.connect(timeout=self.timeout)
            channel = await src.channel(timeout=self.timeout)
            depth = (
                await channel.queue_declare(self.queue, passive=True, timeout=self.timeout)
            ).message_count
            target = depth if self.count is None else self.count
            self._depth = depth
            self._stats = replace(self._stats, target=target)
            if target == 0:
                return self.stats
            if self.exchange:
                # A missing exchange would close the publisher's channel on the first
                # publish; fail first, with nothing taken.
                probe = await dst.channel(timeout=self.timeout)
                await probe.exchange_declare(self.exchange, passive=True, timeout=self.timeout)
                await probe.close()
            publisher = await dst.publisher(
                confirm=True, mandatory=True, max_in_flight=self.window, timeout=self.timeout
            )
            try:
                if self.filter is None:
                    await self._stream(src, channel, publisher, target)
                else:
                    await self._fetch(src, channel, publisher, target)
            finally:
                await self._drain()
                with contextlib.suppress(AMQPError):
                    await publisher.close(timeout=self.timeout)
            if self._failure is not None:
                raise self._failure
            return self.stats
        finally:
            # Closing the source connection gives every unacknowledged message back.
            for conn in (src, dst):
                with contextlib.suppress(AMQPError, OSError):
                    await conn.close()

    # -- taking messages

    def _room(self, target: int) -> bool:
        """Another message may be sent without overshooting the goal."""
        if self.count is not None:  # at most count moved; skipped ones do not count
            return self._stats.moved + len(self._in_flight) < self.count
        # Every message present at the start handled once (moved or skipped).
        return self._stats.moved + self._stats.skipped + len(self._in_flight) < target

    def _done(self, target: int) -> bool:
        if self._stopping or self._failure is not None:
            return True
        if self.count is not None:
            return self._stats.moved >= self.count
        return self._stats.moved + self._stats.skipped >= target

    async def _wait_room(self, target: int) -> None:
        while self._in_flight and not self._room(target) and not self._done(target):
            assert self._settled is not None
            self._settled.clear()
            await self._settled.wait()

    async def _stream(
        self, src: AsyncConnection, channel: AsyncChannel, publisher: AsyncPublisher, target: int
    ) -> None:
        while not self._done(target):
            deliveries = channel.consume(
                self.queue,
                prefetch=self.window,
                timeout=self.idle_timeout,
                unpack_batches=False,  # batch envelopes move as they are
            )
            async with contextlib.aclosing(deliveries) as stream:  # type: ignore[type-var]
                async for message in stream:
                    if self._stopping or self._failure is not None:
                        break
                    if message.epoch != channel.epoch:
                        continue  # arrived before a recovery: the broker redelivers it
                    await self._forward(message, channel, publisher)
                    # With the whole target in flight, wait here for the confirms
                    # rather than for a next message that may never come.
                    await self._wait_room(target)
                    if self._done(target):
                        break
            if self._done(target):
                return
            # The iteration ended: no message for idle_timeout seconds.
            if self._in_flight:
                await self._drain()
            elif src.is_open:
                return  # drained: nothing came, nothing pending
            else:
                await src.wait_recovered(timeout=self.timeout)

    async def _fetch(
        self, src: AsyncConnection, channel: AsyncChannel, publisher: AsyncPublisher, target: int
    ) -> None:
        assert self.filter is not None
        seen = 0
        # Each message present at the start is looked at once (those given back after a
        # failed publish come again).
        while not self._done(target) and seen < self._depth + self._stats.requeued:
            await self._wait_room(target)
            if self._done(target):
                return
            message = await channel.basic_get(self.queue, timeout=self.timeout)
            if message is None:
                if not self._in_flight:
                    return
                await self._drain()
                continue
            seen += 1
            if not self.filter(message):
                # Held without an ack: the queue keeps it, and gives it back (in its
                # place) when the channel closes at the end of the run.
                self._count(skipped=1)
                self._progress()
                continue
            await self._forward(message, channel, publisher)

    # -- moving one

    async def _forward(
        self, message: Message, channel: AsyncChannel, publisher: AsyncPublisher
    ) -> None:
        message_id, digest = key_of(message)
        if message.redelivered:
            self._count(redelivered=1)
            if message_id is not None and self._ledger.was_confirmed(message_id):
                # Its copy was confirmed but the ack was lost with the old connection.
                message.ack()
                self._count(deduplicated=1)
                self._acknowledged(message_id)
                return
        if self._ledger.was_sent(digest):
            self._count(possible_duplicates=1)
        try:
            future = await publisher.send(
                message.body,
                exchange=self.exchange,
                routing_key=self.routing_key
                if self.routing_key is not None
                else message.routing_key,
                properties=message.properties,
            )
        except PublishError as exc:
            # Nothing was sent (the window or a block outlasted the timeout).
            self._requeue(message, channel)
            self._failure = exc
            return
        self._ledger.sent(digest)
        self._in_flight.add(future)
        future.add_done_callback(
            lambda done: self._settle(done, message, channel, message_id, digest)
        )

    def _acknowledged(self, key: str) -> None:
        """Count a source message as moved, once, however often it was delivered."""
        if self._ledger.acknowledged(key):
            self._count(moved=1)
            self._progress()

    def _settle(
        self,
        future: asyncio.Future[None],
        message: Message,
        channel: AsyncChannel,
        message_id: str | None,
        digest: str,
    ) -> None:
        self._in_flight.discard(future)
        if self._settled is not None:
            self._settled.set()
        exc = future.exception() if not future.cancelled() else PublishOutcomeUnknown(0)
        if exc is None:
            if message_id is not None:
                self._ledger.confirmed(message_id)
            if message.epoch == channel.epoch and channel.is_open:
                # Confirmed at the destination: only now may the source let it go.
                message.ack()
                self._acknowledged(message_id if message_id is not None else digest)
            # else: its delivery tag died with the old connection; the broker redelivers
            # it and _forward recognises it (by message_id) or counts the duplicate.
            return
        self._requeue(message, channel)
        if isinstance(exc, PublishOutcomeUnknown | PublishTimeout):
            return  # requeued, sent again later (counted as a possible duplicate)
        # Nacked, Unroutable, or PublishRefused (the destination closed the channel
        # because of this copy, e.g. 404 no such exchange): sending it again would fail
        # the same way, so stop.
        if self._failure is None:
            self._failure = exc

    def _requeue(self, message: Message, channel: AsyncChannel) -> None:
        if message.epoch == channel.epoch and channel.is_open:
            message.nack(requeue=True)
            self._count(requeued=1)

    async def _drain(self) -> None:
        """Wait until every copy in flight is settled (confirm, nack or unknown)."""
        while self._in_flight:
            await asyncio.wait(set(self._in_flight))


def _forwarded(name: str) -> Any:
    """A read-only property of :class:`Shovel` that reads its :class:`AsyncShovel`'s."""

    def get(self: Shovel) -> Any:
        return getattr(self._async, name)

    return property(get, doc=f"``{name}``, as given (see :class:`AsyncShovel`).")


class Shovel:
    """:class:`AsyncShovel` for threads: the same arguments; :meth:`run` blocks.

    ``run`` drives its own event loop in the calling thread; :meth:`stop` may be called
    from another thread (or a signal handler). ``on_progress`` runs in the thread that
    called ``run``.
    """

    def __init__(
        self,
        source: str | Sequence[str],
        queue: str,
        destination: str | Sequence[str],
        exchange: str = "",
        routing_key: str | None = None,
        *,
        count: int | None = None,
        filter: Callable[[Message], bool] | None = None,
        window: int = 500,
        idle_timeout: float = 5.0,
        timeout: float = 30.0,
        on_progress: Callable[[ShovelStats], Any] | None = None,
        connection_name: str = "rabbitry-shovel",
    ) -> None:
        self._async = AsyncShovel(
            source,
            queue,
            destination,
            exchange,
            routing_key,
            count=count,
            filter=filter,
            window=window,
            idle_timeout=idle_timeout,
            timeout=timeout,
            on_progress=on_progress,
            connection_name=connection_name,
        )
        self._lock = threading.Lock()

    # The configuration, read-only: the same members as the AsyncShovel twin.
    source = _forwarded("source")
    queue = _forwarded("queue")
    destination = _forwarded("destination")
    exchange = _forwarded("exchange")
    routing_key = _forwarded("routing_key")
    count = _forwarded("count")
    filter = _forwarded("filter")
    window = _forwarded("window")
    idle_timeout = _forwarded("idle_timeout")
    timeout = _forwarded("timeout")
    on_progress = _forwarded("on_progress")
    connection_name = _forwarded("connection_name")

    def __repr__(self) -> str:
        return repr(self._async).replace("AsyncShovel", "Shovel", 1)

    @property
    def stats(self) -> ShovelStats:
        """The counters so far."""
        return self._async.stats

    def stop(self) -> None:
        """Ask a running shovel to stop taking messages (thread-safe)."""
        self._async.stop()

    def run(self) -> ShovelStats:
        """Move the messages (blocks); see :meth:`AsyncShovel.run`.

        Raises:
            InvalidStateError: called from a thread running an asyncio loop (use
                :class:`AsyncShovel` there), or while already running.
        """
        try:
            asyncio.get_running_loop()
        except RuntimeError:
            pass
        else:
            raise InvalidStateError(
                "Shovel.run() blocks; inside asyncio use `await AsyncShovel(...).run()`"
            )
        if not self._lock.acquire(blocking=False):
            raise InvalidStateError("this Shovel is already running")
        try:
            return asyncio.run(self._async.run())
        finally:
            self._lock.release()
