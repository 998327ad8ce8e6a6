"""The messages of a publisher: what it takes and what it keeps.

:class:`OutgoingMessage` (one message of ``publish_batch``), :class:`UnconfirmedMessage`
(the outbox entry recovery re-sends), and the conversions of the publish arguments that
need a rule: :func:`expiration_ms` (a per-message TTL) and :func:`as_properties` (the
properties given as a mapping). Applications import them from :mod:`rabbitry.publisher`
(or ``rabbitry``).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from datetime import timedelta
from typing import TYPE_CHECKING, Any, NamedTuple

from ..exceptions import LocalProtocolError
from ..protocol.publish import retarget
from ..protocol.spec import BasicProperties

if TYPE_CHECKING:
    from ..protocol import spec

__all__ = ["Body", "OutgoingMessage", "UnconfirmedMessage", "as_properties", "expiration_ms"]

#: What a message body may be; ``str`` is sent as UTF-8.
Body = bytes | bytearray | memoryview | str

_MAX_EXPIRATION = 2**32 - 1  # RabbitMQ: rabbit_misc:check_expiry, ?MAX_EXPIRY_TIMER
_ONE_MS = timedelta(milliseconds=1)


@dataclass(frozen=True, slots=True)
class OutgoingMessage:
    """One message of :meth:`AsyncPublisher.publish_batch`.

    Fields left at ``None`` take the value given to ``publish_batch`` itself.

    Attributes:
        body: the payload (``str`` is sent as UTF-8).
        exchange: the exchange to publish to.
        routing_key: the routing key.
        properties: the basic properties, or a mapping of their fields (converted on
            construction; ``message_id`` is generated when absent).
        mandatory: ask the broker to return the message if no queue gets it.
        persistent: ``True`` sends delivery mode 2 (persistent), ``False`` mode 1.
        expiration: per-message TTL, int milliseconds or a ``timedelta``.
    """

    body: Body
    exchange: str | None = None
    routing_key: str | None = None
    properties: spec.BasicProperties | None = None
    mandatory: bool | None = None
    persistent: bool | None = None
    expiration: int | timedelta | None = None

    def __post_init__(self) -> None:
        properties = self.properties
        if properties is not None and type(properties) is not BasicProperties:
            object.__setattr__(self, "properties", as_properties(properties))


class UnconfirmedMessage(NamedTuple):
    """A message sent and not yet settled, as kept in the outbox (for recovery).

    Attributes:
        seq: its publish sequence number on the channel it was sent on.
        message_id: its ``message_id`` (generated when the publisher set it).
        frames: the encoded frames as written (channel number included).
    """

    seq: int
    message_id: str | None
    frames: list[bytes]

    def frames_for(self, channel_id: int) -> list[bytes]:
        """The same frames addressed to channel ``channel_id`` (for a resend)."""
        return retarget(self.frames, channel_id)


def as_properties(
    value: spec.BasicProperties | Mapping[str, Any], field: str = "properties"
) -> spec.BasicProperties:
    """The :class:`BasicProperties` that ``value`` stands for.

    Args:
        value: a :class:`BasicProperties` (returned as is), or a mapping of its field
            names to values, e.g. ``{"message_id": "a", "headers": {"k": 1}}``.
        field: the name used in the error message.

    Returns:
        The properties.

    Raises:
        LocalProtocolError: ``value`` is neither, or a key is not a property name (the
            message names the key and lists the valid ones).
    """
    if isinstance(value, BasicProperties):
        return value
    if not isinstance(value, Mapping):
        raise LocalProtocolError(
            f"{field}: must be a rabbitry.Properties (BasicProperties) or a mapping of its "
            f"fields, got {type(value).__name__}"
        )
    unknown = [key for key in value if key not in BasicProperties.FIELDS]
    if unknown:
        raise LocalProtocolError(
            f"{field}: unknown property {unknown[0]!r}; the valid ones are "
            f"{', '.join(BasicProperties.FIELDS)}"
        )
    return BasicProperties(**value)


def expiration_ms(value: int | timedelta | str, field: str = "expiration") -> str:
    """Convert a per-message TTL to the digit string RabbitMQ requires.

    Args:
        value: int milliseconds, a ``timedelta`` (whole milliseconds, rounded down) or a
            string of digits.
        field: the name used in the error message.

    Raises:
        LocalProtocolError: a bool, a float, a negative value, a value above
            2^32 - 1 ms (RabbitMQ's limit) or anything else.
    """
    if isinstance(value, bool) or not isinstance(value, int | timedelta | str):
        raise LocalProtocolError(
            f"{field}: must be int milliseconds or a timedelta, got {type(value).__name__}"
        )
    if isinstance(value, timedelta):
        ms = value // _ONE_MS
    elif isinstance(value, str):
        if not (value.isascii() and value.isdigit()):
            raise LocalProtocolError(f"{field}: must be a string of digits, got {value!r}")
        ms = int(value)
    else:
        ms = value
    if ms < 0:
        raise LocalProtocolError(f"{field}: must not be negative, got {ms} ms")
    if ms > _MAX_EXPIRATION:
        raise LocalProtocolError(f"{field}: at most {_MAX_EXPIRATION} ms, got {ms} ms")
    return str(ms)


# Their home for applications (and for pickle) is rabbitry.publisher.
OutgoingMessage.__module__ = UnconfirmedMessage.__module__ = "rabbitry.publisher"
