"""A consumer's subscription: the channel it consumes on, and resubscribing.

:class:`Subscriber` opens the consumer's channel, sets its QoS and starts the broker
consumer with the consumer's delivery and event callbacks; after a broker cancel or a
channel error it subscribes again with backoff, declaring the queue again first (from
the connection's topology record) when it was deleted.
"""

from __future__ import annotations

import asyncio
import logging
from typing import TYPE_CHECKING, Any, Protocol

from ..aio._recovery import redeclare_queue
from ..aio.channel import Subscription
from ..exceptions import AMQPError, NotFound

if TYPE_CHECKING:
    from collections.abc import Callable

    from ..aio.channel import AsyncChannel
    from ..aio.connection import AsyncConnection
    from ..protocol.message import Message
    from .stores import ConsumerStats

__all__ = ["Subscriber"]

logger = logging.getLogger("rabbitry.consumer")

_RESUBSCRIBE_BACKOFF = (0.1, 0.5, 1.0, 2.0, 5.0, 10.0, 30.0)


class _Owner(Protocol):
    """What :class:`Subscriber` reads and sets of its consumer (it also names it in its
    logs)."""

    queue: str
    consumer_tag: str | None

    @property
    def prefetch(self) -> int: ...

    @property
    def exclusive(self) -> bool: ...

    @property
    def arguments(self) -> dict[str, Any] | None: ...

    @property
    def is_running(self) -> bool: ...

    @property
    def stats(self) -> ConsumerStats: ...


class Subscriber:
    """Keeps a consumer subscribed: subscribes on a fresh channel, and again (with
    backoff, re-declaring a deleted queue) after a broker cancel or a channel error.

    Args:
        connection: the consumer's connection.
        owner: the consumer (queue, QoS and consumer options; it gets the tag).
        manual: manual acks.
        deliver: called with each delivery.
        cancelled: called with the tag when the broker cancels the subscription.
        closed: called with the reason when the channel closes under it.
    """

    __slots__ = (
        "attempt",
        "cancelled",
        "channel",
        "closed",
        "connection",
        "deliver",
        "manual",
        "owner",
        "queue_gone",
        "task",
    )

    def __init__(
        self,
        connection: AsyncConnection,
        owner: _Owner,
        *,
        manual: bool,
        deliver: Callable[[Message], None],
        cancelled: Callable[[str], None],
        closed: Callable[[AMQPError], None],
    ) -> None:
        self.connection = connection
        self.owner = owner
        self.manual = manual
        self.deliver = deliver
        self.cancelled = cancelled
        self.closed = closed
        #: The channel consumed on (it changes after a resubscribe).
        self.channel: AsyncChannel | None = None
        #: Resubscribe attempts since the last delivery (the backoff's index).
        self.attempt = 0
        #: Declare the queue again before the next subscribe (after a broker cancel).
        self.queue_gone = False
        #: The running resubscribe loop, if any.
        self.task: asyncio.Task[None] | None = None

    async def subscribe(self, timeout: float | None) -> None:
        """Open a channel, set its QoS (manual acks) and start consuming on it.

        Args:
            timeout: seconds for each broker request (``None``: no limit).
        """
        owner = self.owner
        channel = await self.connection.channel(timeout=timeout)
        self.channel = channel
        try:
            if self.manual and owner.prefetch:
                await channel.basic_qos(owner.prefetch, timeout=timeout)
            subscription = Subscription(
                owner.queue,
                self.deliver,
                no_ack=not self.manual,
                exclusive=owner.exclusive,
                arguments=owner.arguments,
                on_cancel=self.cancelled,
                on_close=self.closed,
            )
            owner.consumer_tag = await channel.start_consumer(subscription, timeout=timeout)
        except BaseException:
            if not channel.is_closed:
                await channel.close()
            raise

    def schedule(self) -> None:
        """Start the resubscribe loop, unless it runs."""
        if self.task is None or self.task.done():
            self.task = asyncio.ensure_future(self._loop())

    def cancel(self) -> None:
        """Stop the resubscribe loop, if any (the consumer stops)."""
        if self.task is not None:
            self.task.cancel()

    async def _loop(self) -> None:
        owner = self.owner
        old = self.channel
        if old is not None and old.is_open:
            try:
                await old.close()
            except AMQPError:
                pass
        while owner.is_running and self.connection.is_open:
            delay = _RESUBSCRIBE_BACKOFF[min(self.attempt, len(_RESUBSCRIBE_BACKOFF) - 1)]
            self.attempt += 1
            await asyncio.sleep(delay)
            if not owner.is_running:
                return
            try:
                if self.queue_gone:
                    await self._redeclare()
                    self.queue_gone = False
                await self.subscribe(timeout=30.0)
            except NotFound as exc:
                # The queue does not exist (any more): declare it from the record first.
                self.queue_gone = True
                logger.warning("consumer %s: resubscribe attempt %d: %r", owner, self.attempt, exc)
                continue
            except AMQPError as exc:
                logger.warning(
                    "consumer %s: resubscribe attempt %d failed: %r", owner, self.attempt, exc
                )
                continue
            owner.stats.resubscribed += 1
            logger.info("consumer %s: subscribed again", owner)
            return

    async def _redeclare(self) -> None:
        """Declare the queue again from the connection's topology record, if it has it."""
        owner = self.owner
        record = self.connection.topology_record
        if record.queue(owner.queue) is None:
            return
        channel = await self.connection.channel()
        try:
            name = await redeclare_queue(record, channel, owner.queue)
            if isinstance(name, str) and name and name != owner.queue:
                logger.info("consumer %s: queue re-declared as %r", owner, name)
                owner.queue = name  # a server-named queue got a new name
        finally:
            if channel.is_open:
                await channel.close()
