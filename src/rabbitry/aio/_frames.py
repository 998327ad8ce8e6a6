"""AsyncChannel's methods that queue frames and wait for no reply.

:class:`FrameMethods` is a base of :class:`~rabbitry.aio.channel.AsyncChannel` with its
own state: publishes go through the channel's pipe, acks, nacks and rejects through its
protocol object, and a delivery tag of a connection that died is dropped.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import asyncio

    from ..protocol import spec
    from ..publishing.pipe import PublishPipe
    from ._confirm_book import ConfirmBook
    from ._link import ChannelLink

__all__ = ["FrameMethods"]

logger = logging.getLogger("rabbitry.channel")


class FrameMethods:
    """The publish, ack, nack and reject methods of
    :class:`~rabbitry.aio.channel.AsyncChannel`: each queues frames and returns without
    waiting for the broker.

    Args:
        link: the channel's shared state.
        pipe: the channel's publishing side.
        book: the channel's confirm book.
        loop: the connection's event loop.
    """

    def __init__(
        self,
        link: ChannelLink,
        pipe: PublishPipe,
        book: ConfirmBook,
        loop: asyncio.AbstractEventLoop,
    ) -> None:
        self._link = link
        self._pipe = pipe
        self._book = book
        self._loop = loop

    async def basic_publish(
        self,
        exchange: str,
        routing_key: str,
        body: bytes | bytearray | memoryview | str,
        *,
        properties: spec.BasicProperties | None = None,
        mandatory: bool = False,
    ) -> asyncio.Future[None] | None:
        """Publish a message.

        Waits only while the socket's write buffer is full, and while the connection
        recovers. Returned (unroutable mandatory) messages go to the return callbacks.

        Args:
            exchange: the exchange (``""``: the default exchange, routing by queue name).
            routing_key: the routing key.
            body: the body; a ``str`` is sent as UTF-8.
            properties: the message's properties.
            mandatory: an unroutable message comes back to the return callbacks.

        Returns:
            In confirm mode a future that resolves when the broker acks the message and
            fails with :class:`Nacked`, :class:`PublishRefused` (the broker closed the
            channel because of this message) or :class:`PublishOutcomeUnknown`;
            otherwise ``None``.

        Raises:
            LocalProtocolError: a field, a property or the body is invalid; nothing sent.
            InvalidStateError: the channel is closed, or the connection closed while
                recovering.
            ConnectionRecovering: the connection is recovering and the recovery policy
                says to fail.
        """
        pipe = self._pipe
        link = self._link
        if link.suspended:
            await pipe.await_recovery(None, "basic.publish")
        if pipe.writes.paused:
            await pipe.writes.wait_writable()
        proto = link.protocol
        frames = proto.encode_publish(exchange, routing_key, body, properties, mandatory)  # type: ignore[arg-type]
        future: asyncio.Future[None] | None = (
            self._loop.create_future() if proto.confirm_mode else None
        )
        seq = proto.send_publish(frames, future)  # registers the future in confirm mode
        pipe.kick()
        if not seq:
            return None
        self._book.keep_head(seq, frames)
        return future

    def basic_ack(self, delivery_tag: int = 0, multiple: bool = False) -> None:
        """Acknowledge a delivery (``multiple``: and every earlier one).

        Contiguous acks made before the next write leave as one ``multiple`` ack: the
        acks consumer callbacks make while one read of deliveries is handled, or the
        acks after the first in one loop iteration. The broker settles the same
        deliveries either way. A tag
        handed out before the connection recovered is dropped with a warning (the
        broker redelivers that message); ``multiple`` never reaches across a recovery.

        Args:
            delivery_tag: the delivery's tag (0 with ``multiple``: every delivery so far).
            multiple: and every earlier unacknowledged delivery of this channel.

        Raises:
            InvalidStateError: the channel is closed.
            LocalProtocolError: the tag is not an unsigned 64-bit integer.
        """
        link = self._link
        wire = link.tags.wire_tag(delivery_tag, connected=not link.suspended)
        if wire is None:
            self._drop_stale("basic.ack", delivery_tag)
            return
        link.protocol.send_ack(wire, multiple)
        self._pipe.kick()

    def basic_nack(
        self, delivery_tag: int = 0, multiple: bool = False, requeue: bool = True
    ) -> None:
        """Reject one or (``multiple``) many deliveries; requeue or dead-letter them.

        A stale tag (from before a recovery) is dropped like in :meth:`basic_ack`.

        Args:
            delivery_tag: the delivery's tag (0 with ``multiple``: every delivery so far).
            multiple: and every earlier unacknowledged delivery of this channel.
            requeue: put them back in the queue; ``False`` dead-letters or drops them.

        Raises:
            InvalidStateError: the channel is closed.
            LocalProtocolError: the tag is not an unsigned 64-bit integer.
        """
        link = self._link
        wire = link.tags.wire_tag(delivery_tag, connected=not link.suspended)
        if wire is None:
            self._drop_stale("basic.nack", delivery_tag)
            return
        link.protocol.send_nack(wire, multiple, requeue)
        self._pipe.kick()

    def basic_reject(self, delivery_tag: int, requeue: bool = True) -> None:
        """Reject one delivery; requeue or dead-letter it (a stale tag is dropped).

        Args:
            delivery_tag: the delivery's tag.
            requeue: put it back in the queue; ``False`` dead-letters or drops it.

        Raises:
            InvalidStateError: the channel is closed.
            LocalProtocolError: the tag is not an unsigned 64-bit integer.
        """
        link = self._link
        wire = link.tags.wire_tag(delivery_tag, connected=not link.suspended)
        if wire is None:
            self._drop_stale("basic.reject", delivery_tag)
            return
        link.protocol.send_reject(wire, requeue)
        self._pipe.kick()

    def _drop_stale(self, what: str, delivery_tag: int) -> None:
        """Log a settlement of a delivery of a connection that died (not sent)."""
        logger.warning(
            "channel %s: not sending %s for delivery %s: it arrived before the connection "
            "recovered, and the broker redelivers it",
            self._link.channel_id,
            what,
            delivery_tag,
        )
