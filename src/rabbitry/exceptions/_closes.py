"""Connection and channel closes, and the broker reply codes that name them.

Part of the :mod:`rabbitry.exceptions` package, whose ``__init__`` is its only face.
"""

from __future__ import annotations

from typing import Any

from ._base import AMQPError, method_name

# --------------------------------------------------------------------------- closes


class _Close(AMQPError):
    """Shared shape of connection.close and channel.close reasons."""

    def __init__(
        self,
        reply_code: int = 0,
        reply_text: str = "",
        class_id: int = 0,
        method_id: int = 0,
    ) -> None:
        super().__init__(reply_code, reply_text, class_id, method_id)
        self.reply_code = reply_code
        self.reply_text = reply_text
        self.class_id = class_id
        self.method_id = method_id

    def __str__(self) -> str:
        text = f"({self.reply_code}) {self.reply_text}".rstrip()
        if self.class_id or self.method_id:
            text += f" [in {method_name(self.class_id, self.method_id)}]"
        return text

    def __reduce__(self) -> tuple[Any, ...]:
        return (type(self), (self.reply_code, self.reply_text, self.class_id, self.method_id))


class AMQPConnectionError(AMQPError, ConnectionError):
    """The connection is gone or could not be made."""


class ConnectError(AMQPConnectionError):
    """No configured broker address accepted the connection.

    Attributes:
        errors: one ``(address, exception)`` pair per address tried, in order.
    """

    def __init__(self, message: str, errors: list[tuple[str, BaseException]] | None = None) -> None:
        super().__init__(message)
        self.errors = list(errors or [])


class VirtualHostNotFound(ConnectError):
    """The broker has no virtual host of the name the URL gives (530 NOT_ALLOWED at
    connection.open); the message carries the broker's reply text. Not retried."""


class VirtualHostAccessRefused(ConnectError):
    """The user authenticated but may not use the virtual host (530 NOT_ALLOWED or 403
    ACCESS_REFUSED at connection.open); the message carries the broker's reply text.
    Grant the user permissions on it (``rabbitmqctl set_permissions``). Not retried."""


class NotAnAMQPServer(ConnectError):
    """The address accepted the TCP connection but does not speak AMQP 0-9-1: its first
    bytes were not a connection.start frame, or it answered an HTTP probe (the URL
    probably names the management HTTP port, 15672, instead of 5672).

    Attributes:
        received: the first bytes it sent (at most 64; empty when it sent nothing).
    """

    def __init__(self, message: str, received: bytes = b"") -> None:
        super().__init__(message)
        self.received = received

    def __reduce__(self) -> tuple[Any, ...]:
        return (type(self), (str(self), self.received))


class AuthenticationError(AMQPConnectionError):
    """The broker refused our credentials or our SASL mechanism."""


class CredentialsError(AMQPConnectionError):
    """The ``credentials_provider`` failed or returned something that is not a
    ``(username, password)`` pair of strings.

    On the first connect it ends ``connect()``; during recovery it counts as a failed
    attempt and the next one calls the provider again. ``__cause__`` is the provider's
    own exception, if it raised one.
    """


class HeartbeatTimeout(AMQPConnectionError):
    """Nothing arrived from the broker for more than twice the negotiated heartbeat."""


class ConnectionLost(AMQPConnectionError):
    """The socket failed, or the broker closed it without connection.close."""


class ConnectionRecovering(AMQPConnectionError):
    """The connection is recovering and the recovery policy says not to wait."""


class TLSError(AMQPConnectionError):
    """The TLS handshake with the broker failed: the certificate chain is not trusted,
    the certificate does not match the host name, or the broker refused ours.

    The message names the address and the reason; ``__cause__`` is the
    :class:`ssl.SSLError` (or :class:`ssl.CertificateError`).
    """


class ConnectionClosed(_Close, AMQPConnectionError):
    """The connection was closed with connection.close (by either side)."""


class ConnectionClosedByClient(ConnectionClosed):
    """This client closed the connection (``close()``, or after a protocol error)."""


class ConnectionClosedByBroker(ConnectionClosed):
    """The broker closed the connection; subclasses name the reply code."""


class ChannelClosed(_Close):
    """The channel was closed with channel.close (by either side)."""


class ChannelClosedByClient(ChannelClosed):
    """This client closed the channel."""


class ChannelClosedByBroker(ChannelClosed):
    """The broker closed the channel; subclasses name the reply code."""


_CONNECTION_CODES: dict[int, type[ConnectionClosedByBroker]] = {}
_CHANNEL_CODES: dict[int, type[ChannelClosedByBroker]] = {}


def _connection_code(code: int) -> Any:
    def register(cls: type[ConnectionClosedByBroker]) -> type[ConnectionClosedByBroker]:
        if code in _CONNECTION_CODES:
            raise RuntimeError(f"connection reply code {code} registered twice")
        _CONNECTION_CODES[code] = cls
        return cls

    return register


def _channel_code(code: int) -> Any:
    def register(cls: type[ChannelClosedByBroker]) -> type[ChannelClosedByBroker]:
        if code in _CHANNEL_CODES:
            raise RuntimeError(f"channel reply code {code} registered twice")
        _CHANNEL_CODES[code] = cls
        return cls

    return register


@_connection_code(320)
class ConnectionForced(ConnectionClosedByBroker):
    """320 CONNECTION_FORCED: an operator or the broker's shutdown closed us."""


@_connection_code(402)
class InvalidPath(ConnectionClosedByBroker):
    """402 INVALID_PATH: the virtual host does not exist."""


@_connection_code(403)
class ConnectionAccessRefused(ConnectionClosedByBroker):
    """403 ACCESS_REFUSED at connection level (e.g. no access to the virtual host)."""


@_connection_code(501)
class FrameError(ConnectionClosedByBroker):
    """501 FRAME_ERROR: the broker received a malformed frame from us."""


@_connection_code(502)
class AMQPSyntaxError(ConnectionClosedByBroker):
    """502 SYNTAX_ERROR: the broker could not parse a method we sent."""


@_connection_code(503)
class CommandInvalid(ConnectionClosedByBroker):
    """503 COMMAND_INVALID: we sent a method that is invalid in the current state."""


@_connection_code(504)
class ChannelError(ConnectionClosedByBroker):
    """504 CHANNEL_ERROR: we used a channel that is not open."""


@_connection_code(505)
class UnexpectedFrame(ConnectionClosedByBroker):
    """505 UNEXPECTED_FRAME: we sent a frame the broker did not expect."""


@_connection_code(506)
class ResourceError(ConnectionClosedByBroker):
    """506 RESOURCE_ERROR: the broker ran out of a resource for this connection."""


@_connection_code(530)
class NotAllowed(ConnectionClosedByBroker):
    """530 NOT_ALLOWED: the operation is not allowed (e.g. an unsupported feature)."""


@_connection_code(540)
class AMQPNotImplemented(ConnectionClosedByBroker):
    """540 NOT_IMPLEMENTED: the broker does not implement what we asked for."""


@_connection_code(541)
class InternalError(ConnectionClosedByBroker):
    """541 INTERNAL_ERROR: the broker failed internally."""


@_channel_code(311)
class ContentTooLarge(ChannelClosedByBroker):
    """311 CONTENT_TOO_LARGE: the message body exceeds what the broker accepts."""


@_channel_code(312)
class NoRoute(ChannelClosedByBroker):
    """312 NO_ROUTE (as a channel close; returns use :class:`Unroutable`)."""


@_channel_code(313)
class NoConsumers(ChannelClosedByBroker):
    """313 NO_CONSUMERS."""


@_channel_code(403)
class AccessRefused(ChannelClosedByBroker):
    """403 ACCESS_REFUSED: no permission for this resource."""


@_channel_code(404)
class NotFound(ChannelClosedByBroker):
    """404 NOT_FOUND: the exchange or queue does not exist."""


@_channel_code(405)
class ResourceLocked(ChannelClosedByBroker):
    """405 RESOURCE_LOCKED: e.g. an exclusive queue owned by another connection."""


@_channel_code(406)
class PreconditionFailed(ChannelClosedByBroker):
    """406 PRECONDITION_FAILED: e.g. a re-declare with different arguments."""


def connection_error_for(
    reply_code: int, reply_text: str = "", class_id: int = 0, method_id: int = 0
) -> ConnectionClosedByBroker:
    """Build the exception for a connection.close received from the broker.

    Args:
        reply_code: the close's reply code (e.g. 320, 530).
        reply_text: the broker's text.
        class_id: the class of the method that caused the close (0: none).
        method_id: the method that caused it (0: none).

    Returns:
        An instance of the class registered for ``reply_code`` (e.g.
        :class:`ConnectionForced` for 320), or of :class:`ConnectionClosedByBroker` for a
        code with no class of its own.
    """
    cls = _CONNECTION_CODES.get(reply_code, ConnectionClosedByBroker)
    return cls(reply_code, reply_text, class_id, method_id)


def channel_error_for(
    reply_code: int, reply_text: str = "", class_id: int = 0, method_id: int = 0
) -> ChannelClosedByBroker:
    """Build the exception for a channel.close received from the broker.

    Args:
        reply_code: the close's reply code (e.g. 404, 406).
        reply_text: the broker's text.
        class_id: the class of the method that caused the close (0: none).
        method_id: the method that caused it (0: none).

    Returns:
        An instance of the class registered for ``reply_code`` (e.g. :class:`NotFound`
        for 404), or of :class:`ChannelClosedByBroker` for a code with no class of its
        own.
    """
    cls = _CHANNEL_CODES.get(reply_code, ChannelClosedByBroker)
    return cls(reply_code, reply_text, class_id, method_id)
