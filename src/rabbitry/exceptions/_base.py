"""The root of the tree, the errors of every layer, and the message errors name.

Part of the :mod:`rabbitry.exceptions` package, whose ``__init__`` is its only face.
Like every module of the package, it imports nothing else of rabbitry: the whole
library may raise these.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Protocol

if TYPE_CHECKING:
    from collections.abc import Callable

# Turns (class id, method id) into "queue.declare" in error texts. This module imports
# nothing of the package; rabbitry.protocol, when it is imported, hands it the spec's
# names through name_methods_with().
_namer: Callable[[int, int], str] = "{}.{}".format


def name_methods_with(namer: Callable[[int, int], str]) -> None:
    """Name AMQP methods in error texts with ``namer`` (for the library's own use).

    Args:
        namer: Turns a class id and a method id into a name such as ``"queue.declare"``.
    """
    global _namer
    _namer = namer


def method_name(class_id: int, method_id: int) -> str:
    """The name of an AMQP method in error texts.

    Args:
        class_id: The method's class id.
        method_id: The method's id within its class.

    Returns:
        ``"queue.declare"`` once :mod:`rabbitry.protocol` is imported, else ``"50.10"``.
    """
    return _namer(class_id, method_id)


class Message(Protocol):
    """The message an error carries: a :class:`rabbitry.Message` (a returned, delivered
    or reply message).

    This module is the bottom of the package and imports nothing from it, so the
    errors name the message by what they and their callers use of it.
    """

    body: bytes
    properties: Any
    delivery_tag: int
    redelivered: bool
    exchange: str
    routing_key: str
    consumer_tag: str
    message_count: int | None
    reply_code: int
    reply_text: str

    @property
    def headers(self) -> dict[str, Any]: ...

    def ack(self, multiple: bool = False) -> Any: ...

    def nack(self, multiple: bool = False, requeue: bool = True) -> Any: ...

    def reject(self, requeue: bool = True) -> Any: ...


class AMQPError(Exception):
    """Base class of every rabbitry exception."""


# --------------------------------------------------------------------------- protocol


class ProtocolError(AMQPError):
    """A violation of AMQP 0-9-1, by either side.

    Attributes:
        reply_code: the AMQP reply code that describes the violation (501 frame error,
            502 syntax error, 503 command invalid, 504 channel error, 505 unexpected
            frame, 540 not implemented).
    """

    def __init__(self, message: str, reply_code: int = 502) -> None:
        super().__init__(message)
        self.reply_code = reply_code


class LocalProtocolError(ProtocolError, ValueError):
    """We were asked to send something AMQP or RabbitMQ does not allow.

    Raised before anything is written, so the connection stays usable. The message names
    the field and the rule, e.g. ``queue.declare.queue: shortstr longer than 255 bytes``.
    """


class MessageTooLarge(LocalProtocolError):
    """A message body is larger than ``max_message_size``; nothing was sent.

    Unless the connection was given ``max_message_size``, the limit is the broker's
    default for its version (128 MiB on RabbitMQ 3.x, 16 MiB on 4.x), so a body the
    broker would refuse is refused here, before it is sent, instead of closing the
    channel and leaving the publish's outcome unknown.

    Attributes:
        size: the body's size in bytes.
        limit: the ``max_message_size`` in force, in bytes.
    """

    def __init__(self, size: int, limit: int, context: str = "basic.publish.body") -> None:
        super().__init__(
            f"{context}: {size} bytes exceeds max_message_size {limit} "
            f"({limit / 1048576:g} MiB); set the connection's max_message_size to the "
            "broker's configured limit if it differs"
        )
        self.size = size
        self.limit = limit


class RemoteProtocolError(ProtocolError):
    """The broker (or whatever speaks for it) sent bytes that break the protocol.

    The connection is closed with :attr:`reply_code` and this exception is what every
    waiter on that connection receives.
    """


# --------------------------------------------------------------------------- state


class ConfigurationError(AMQPError, ValueError):
    """A connection URL or option is invalid; the message names the field and the rule."""


class InvalidStateError(AMQPError, RuntimeError):
    """The operation is not possible in the object's current state (e.g. closed)."""


# --------------------------------------------------------------------------- time


class Timeout(AMQPError, TimeoutError):
    """A deadline passed before the operation completed."""


class PoolTimeout(Timeout):
    """No channel of a :class:`rabbitry.ChannelPool` became free within the timeout."""
