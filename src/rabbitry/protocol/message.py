"""Messages as they come out of the broker."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Protocol

from .spec import BasicProperties

if TYPE_CHECKING:
    from collections.abc import Generator

__all__ = ["AckTarget", "Message", "Properties", "Settled"]

#: The 14 basic properties; ``Properties(content_type="text/plain", delivery_mode=2)``.
Properties = BasicProperties


class AckTarget(Protocol):
    """What a :class:`Message`'s ``ack()``, ``nack()`` and ``reject()`` go through: the
    channel it arrived on, or a stand-in that settles it another way (a thread-safe
    hand-off to the channel, or a batch envelope's bookkeeping for one of its records).

    The message calls the method with its own ``delivery_tag``.
    """

    def basic_ack(self, delivery_tag: int = 0, multiple: bool = False) -> None:
        """Acknowledge the delivery (``multiple``: and every earlier one).

        Args:
            delivery_tag: the message's delivery tag.
            multiple: and every earlier unacknowledged delivery of the channel.
        """
        ...

    def basic_nack(
        self, delivery_tag: int = 0, multiple: bool = False, requeue: bool = True
    ) -> None:
        """Reject the delivery (``multiple``: and every earlier one).

        Args:
            delivery_tag: the message's delivery tag.
            multiple: and every earlier unacknowledged delivery of the channel.
            requeue: put them back in the queue; ``False`` dead-letters or drops them.
        """
        ...

    def basic_reject(self, delivery_tag: int, requeue: bool = True) -> None:
        """Reject the one delivery.

        Args:
            delivery_tag: the message's delivery tag.
            requeue: put it back in the queue; ``False`` dead-letters or drops it.
        """
        ...


class Settled:
    """What :meth:`Message.ack`, :meth:`~Message.nack` and :meth:`~Message.reject` return.

    The settlement has already been handed to the channel when it is returned, so the
    object is complete from the start: ``await message.ack()`` in asyncio code returns at
    once and does exactly what the plain call ``message.ack()`` does. Threaded code
    ignores it.
    """

    __slots__ = ()

    def __await__(self) -> Generator[None, None, None]:
        return
        yield  # a generator that finishes at once: awaiting never suspends

    def __repr__(self) -> str:
        return "<Settled>"


#: The one instance every settlement returns.
SETTLED = Settled()


class Message:
    """A delivered (basic.deliver), fetched (basic.get-ok) or returned message.

    Attributes:
        body: the payload.
        properties: the 14 basic properties (absent ones are ``None``).
        delivery_tag: the channel-scoped tag to ack with (0 for returned messages).
        redelivered: the broker delivered this message before (possibly not processed).
        exchange: the exchange it was published to.
        routing_key: the routing key it was published with.
        consumer_tag: the consumer it was delivered to (deliveries only).
        message_count: messages left in the queue (basic.get only).
        reply_code: why it was returned (returns only, e.g. 312 NO_ROUTE).
        reply_text: the broker's text for the return.
    """

    __slots__ = (
        "_target",
        "body",
        "consumer_tag",
        "delivery_tag",
        "epoch",
        "exchange",
        "message_count",
        "properties",
        "redelivered",
        "reply_code",
        "reply_text",
        "routing_key",
        "settled",
    )

    def __init__(
        self,
        body: bytes,
        properties: BasicProperties,
        *,
        delivery_tag: int = 0,
        redelivered: bool = False,
        exchange: str = "",
        routing_key: str = "",
        consumer_tag: str = "",
        message_count: int | None = None,
        reply_code: int = 0,
        reply_text: str = "",
    ) -> None:
        self.body = body
        self.properties = properties
        self.delivery_tag = delivery_tag
        self.redelivered = redelivered
        self.exchange = exchange
        self.routing_key = routing_key
        self.consumer_tag = consumer_tag
        self.message_count = message_count
        self.reply_code = reply_code
        self.reply_text = reply_text
        # What ack() and friends go through (see settle_through); None: nothing.
        self._target: AckTarget | None = None
        #: ack(), nack() or reject() was sent for it (a second one is refused: it
        #: would make the broker close the channel with 406).
        self.settled = False
        #: The channel's recovery epoch when it arrived: deliveries of an older epoch
        #: than the channel's died with their connection (the broker redelivers them),
        #: and settling them is dropped.
        self.epoch = 0

    @property
    def channel(self) -> Any:
        """The channel it arrived on; ``ack()`` and friends go through it.

        ``None`` for a returned message. In a thread-safe consumer's handler, and for
        the records of a batch envelope, it is the stand-in that settles the message
        for that channel (see :meth:`settle_through`).
        """
        return self._target

    def settle_through(self, target: AckTarget | None) -> None:
        """Make ``ack()``, ``nack()`` and ``reject()`` go through ``target`` from now on.

        Set by the channel that receives the message; a layer that settles it another
        way (a thread-safe hand-off, a batch envelope's record) puts its stand-in here,
        and may put the channel back afterwards. :attr:`channel` returns it.

        Args:
            target: the channel, or a stand-in with the same three methods (``None``:
                the message cannot be settled).
        """
        self._target = target

    @property
    def headers(self) -> dict[str, Any]:
        """The headers table (empty dict when absent)."""
        return self.properties.headers or {}

    @property
    def stream_offset(self) -> int | None:
        """The offset of a delivery from a stream queue (its ``x-stream-offset`` header);
        None for messages from other queue types."""
        offset = self.headers.get("x-stream-offset")
        return offset if isinstance(offset, int) and not isinstance(offset, bool) else None

    def ack(self, multiple: bool = False) -> Settled:
        """Acknowledge this message (and, with ``multiple``, all earlier ones).

        Safe to call from any thread for messages of the sync API. After the connection
        recovered, acking a message delivered before is dropped with a warning (the
        broker redelivers it) and counted in the channel's ``stale_settlements``.
        Returns at once, having queued the ack for the connection.

        Args:
            multiple: also acknowledge every earlier unacknowledged delivery of the
                channel.

        Returns:
            An already-complete awaitable (:class:`Settled`): asyncio code may write
            either ``message.ack()`` or ``await message.ack()``.

        Raises:
            InvalidStateError: the message was not delivered on a channel, was already
                acknowledged or rejected, or its channel is closed.
        """
        channel = self._channel()
        channel.basic_ack(self.delivery_tag, multiple)
        self.settled = True
        return SETTLED

    def nack(self, multiple: bool = False, requeue: bool = True) -> Settled:
        """Negatively acknowledge: requeue it, or dead-letter/drop it (``requeue=False``).

        Safe from any thread and dropped after a recovery, like :meth:`ack`.

        Args:
            multiple: also nack every earlier unacknowledged delivery of the channel.
            requeue: put it back in the queue; ``False`` dead-letters or drops it.

        Returns:
            An already-complete awaitable (:class:`Settled`), as :meth:`ack` does.

        Raises:
            InvalidStateError: the message was not delivered on a channel, was already
                acknowledged or rejected, or its channel is closed.
        """
        channel = self._channel()
        channel.basic_nack(self.delivery_tag, multiple, requeue)
        self.settled = True
        return SETTLED

    def reject(self, requeue: bool = True) -> Settled:
        """Reject this one message (like ``nack`` without ``multiple``).

        Args:
            requeue: put it back in the queue; ``False`` dead-letters or drops it.

        Returns:
            An already-complete awaitable (:class:`Settled`), as :meth:`ack` does.

        Raises:
            InvalidStateError: the message was not delivered on a channel, was already
                acknowledged or rejected, or its channel is closed.
        """
        channel = self._channel()
        channel.basic_reject(self.delivery_tag, requeue)
        self.settled = True
        return SETTLED

    def _channel(self) -> AckTarget:
        from ..exceptions import InvalidStateError

        target = self._target
        if target is None:
            raise InvalidStateError("this message was not delivered on a channel; nothing to ack")
        if self.settled:
            raise InvalidStateError(
                f"delivery {self.delivery_tag} was already acknowledged or rejected"
            )
        return target

    def __repr__(self) -> str:
        body = self.body if len(self.body) <= 40 else self.body[:40] + b"..."
        return (
            f"<Message tag={self.delivery_tag} exchange={self.exchange!r} "
            f"routing_key={self.routing_key!r} redelivered={self.redelivered} body={body!r}>"
        )
