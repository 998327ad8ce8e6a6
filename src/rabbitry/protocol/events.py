"""Events the sans-IO protocol hands to an engine.

Each is a frozen, slotted dataclass. The engine reads them with
``ConnectionProtocol.events_received()`` after feeding bytes, in the order they
happened on the wire, and turns them into resolved futures and callbacks.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from ..exceptions import AMQPError
    from .frames import Method
    from .message import Message

__all__ = [
    "ChannelClosedEvent",
    "ConnectionBlocked",
    "ConnectionOpened",
    "ConnectionTerminated",
    "ConnectionUnblocked",
    "ConsumerCancelledByBroker",
    "Delivery",
    "Event",
    "FlowChanged",
    "PublishConfirmed",
    "Returned",
    "RpcReply",
]


@dataclass(frozen=True, slots=True)
class Event:
    """Base class of protocol events."""


@dataclass(frozen=True, slots=True)
class ConnectionOpened(Event):
    """connection.open-ok arrived: the connection is usable.

    Attributes:
        server_properties: the broker's connection.start server-properties table.
        channel_max: negotiated highest channel number.
        frame_max: negotiated largest frame, overhead included.
        heartbeat: negotiated heartbeat interval in seconds (0: off).
    """

    server_properties: dict[str, Any]
    channel_max: int
    frame_max: int
    heartbeat: int


@dataclass(frozen=True, slots=True)
class ConnectionTerminated(Event):
    """The connection is finished; ``exc`` says why. Emitted exactly once, last.

    Attributes:
        exc: the reason: the broker's close, a protocol error, EOF, a heartbeat timeout
            or the client's own close (:class:`rabbitry.exceptions.ConnectionClosedByClient`).
    """

    exc: AMQPError


@dataclass(frozen=True, slots=True)
class ConnectionBlocked(Event):
    """connection.blocked: the broker stopped reading our publishes (resource alarm).

    RabbitMQ sends it once a publishing connection is blocked by a memory or disk alarm;
    a connection that has not published since the alarm is not told.

    Attributes:
        reason: the broker's text, e.g. ``"low on memory"``.
    """

    reason: str


@dataclass(frozen=True, slots=True)
class ConnectionUnblocked(Event):
    """connection.unblocked: no alarm is left; publishes are read again."""


@dataclass(frozen=True, slots=True)
class RpcReply(Event):
    """The answer to the oldest synchronous request on ``channel``.

    A channel's synchronous requests are answered in the order they were sent, so the
    reply belongs to the oldest one still waiting.

    Attributes:
        channel: the channel number; 0 for connection-level requests
            (connection.update-secret).
        method: the reply method (e.g. queue.declare-ok, basic.get-empty).
        message: for basic.get-ok, the fetched message; else ``None``.
    """

    channel: int
    method: Method
    message: Message | None = None


@dataclass(frozen=True, slots=True)
class Delivery(Event):
    """A complete basic.deliver: its method, content header and every body frame.

    Attributes:
        channel: the channel of the consumer; the delivery tag is scoped to it.
        message: the message, with its delivery tag, consumer tag and redelivered flag.
    """

    channel: int
    message: Message


@dataclass(frozen=True, slots=True)
class Returned(Event):
    """A complete basic.return: an unroutable mandatory message came back.

    In confirm mode the broker sends the return before the publish's basic.ack.

    Attributes:
        channel: the channel it was published on.
        message: the message, with the reply code and text of the return.
    """

    channel: int
    message: Message


@dataclass(frozen=True, slots=True)
class PublishConfirmed(Event):
    """basic.ack (``ack=True``) or basic.nack from the broker in confirm mode.

    Attributes:
        channel: the publishing channel.
        delivery_tag: the publish's sequence number on the channel, counted from 1.
        multiple: the confirm also covers every earlier unconfirmed publish.
        ack: True for basic.ack; False for basic.nack (the broker could not take it).
    """

    channel: int
    delivery_tag: int
    multiple: bool
    ack: bool


@dataclass(frozen=True, slots=True)
class ConsumerCancelledByBroker(Event):
    """The broker cancelled a consumer (basic.cancel: queue deleted, failover...).

    The event; the engine turns it into the consumer's cancel path, where an iterator
    raises the exception :class:`rabbitry.exceptions.ConsumerCancelled`. RabbitMQ sends
    it only to clients announcing the ``consumer_cancel_notify`` capability.

    Attributes:
        channel: the consumer's channel.
        consumer_tag: the consumer the broker cancelled.
    """

    channel: int
    consumer_tag: str


@dataclass(frozen=True, slots=True)
class FlowChanged(Event):
    """channel.flow from the broker: publishing on ``channel`` may (``active``) go on.

    Attributes:
        channel: the channel the flow applies to.
        active: True when content may be sent again, False when it must stop.
    """

    channel: int
    active: bool


@dataclass(frozen=True, slots=True)
class ChannelClosedEvent(Event):
    """The channel is closed; ``exc`` is the reason (by the broker or by us).

    Attributes:
        channel: the channel number, free for reuse from now on.
        exc: the broker's channel.close as an exception, or the client's own close.
    """

    channel: int
    exc: AMQPError
