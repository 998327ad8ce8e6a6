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
    """The connection is finished; ``exc`` says why. Emitted exactly once."""

    exc: AMQPError


@dataclass(frozen=True, slots=True)
class ConnectionBlocked(Event):
    """connection.blocked: the broker stopped reading our publishes (resource alarm)."""

    reason: str


@dataclass(frozen=True, slots=True)
class ConnectionUnblocked(Event):
    """connection.unblocked: the alarm cleared."""


@dataclass(frozen=True, slots=True)
class RpcReply(Event):
    """The answer to the oldest synchronous request on ``channel``.

    ``channel`` is 0 for connection-level requests (connection.update-secret).
    ``message`` is set for basic.get-ok (the fetched message).
    """

    channel: int
    method: Method
    message: Message | None = None


@dataclass(frozen=True, slots=True)
class Delivery(Event):
    """A complete basic.deliver (method, header and body)."""

    channel: int
    message: Message


@dataclass(frozen=True, slots=True)
class Returned(Event):
    """A complete basic.return: an unroutable mandatory message came back."""

    channel: int
    message: Message


@dataclass(frozen=True, slots=True)
class PublishConfirmed(Event):
    """basic.ack (``ack=True``) or basic.nack from the broker in confirm mode."""

    channel: int
    delivery_tag: int
    multiple: bool
    ack: bool


@dataclass(frozen=True, slots=True)
class ConsumerCancelledByBroker(Event):
    """The broker cancelled a consumer (basic.cancel: queue deleted, failover...).

    The event; the engine turns it into the consumer's cancel path, where an iterator
    raises the exception :class:`rabbitry.exceptions.ConsumerCancelled`.
    """

    channel: int
    consumer_tag: str


@dataclass(frozen=True, slots=True)
class FlowChanged(Event):
    """channel.flow from the broker: publishing on ``channel`` may (``active``) go on."""

    channel: int
    active: bool


@dataclass(frozen=True, slots=True)
class ChannelClosedEvent(Event):
    """The channel is closed; ``exc`` is the reason (by the broker or by us)."""

    channel: int
    exc: AMQPError
