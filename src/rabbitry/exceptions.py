"""Every exception rabbitry raises.

The tree::

    AMQPError
    ├── ProtocolError                      a frame or method broke AMQP 0-9-1
    │   ├── LocalProtocolError (ValueError)  we were asked to send something invalid;
    │   │   │                                 raised before anything reaches the wire
    │   │   └── MessageTooLarge               a body above max_message_size (the broker's
    │   │                                     limit unless set: 16 MiB on RabbitMQ 4.x)
    │   └── RemoteProtocolError               the broker sent something invalid; the
    │                                         connection is closed with reply_code
    ├── ConfigurationError (ValueError)    a bad URL or connection option
    ├── InvalidStateError (RuntimeError)   the object cannot do that now (closed channel…)
    ├── AMQPConnectionError (ConnectionError)
    │   ├── ConnectError                   no configured address accepted us
    │   │   ├── VirtualHostNotFound        the broker has no such virtual host (530)
    │   │   ├── VirtualHostAccessRefused   the user may not use the virtual host (530/403)
    │   │   └── NotAnAMQPServer            the address answers, but not with AMQP 0-9-1
    │   │                                     (e.g. the management HTTP port 15672)
    │   ├── AuthenticationError            the broker refused our credentials
    │   ├── CredentialsError               the credentials_provider failed
    │   ├── HeartbeatTimeout               the peer went silent for 2 × heartbeat
    │   ├── ConnectionLost                 the socket failed or reached EOF
    │   ├── ConnectionRecovering           recovering; the policy says fail fast
    │   ├── TLSError                       the TLS handshake failed (untrusted CA, wrong
    │   │                                     host name, bad client certificate)
    │   └── ConnectionClosed(reply_code, reply_text, class_id, method_id)
    │       ├── ConnectionClosedByClient
    │       └── ConnectionClosedByBroker
    │           ├── ConnectionForced 320, InvalidPath 402, ConnectionAccessRefused 403
    │           ├── FrameError 501, AMQPSyntaxError 502, CommandInvalid 503
    │           ├── ChannelError 504, UnexpectedFrame 505, ResourceError 506
    │           └── NotAllowed 530, AMQPNotImplemented 540, InternalError 541
    ├── ChannelClosed(reply_code, reply_text, class_id, method_id)
    │   ├── ChannelClosedByClient
    │   └── ChannelClosedByBroker
    │       ├── ContentTooLarge 311, NoRoute 312, NoConsumers 313
    │       └── AccessRefused 403, NotFound 404, ResourceLocked 405, PreconditionFailed 406
    ├── ConsumerCancelled                  the broker cancelled a consumer (basic.cancel)
    ├── RpcError(routing_key)              a request/reply call failed (rabbitry.rpc)
    │   ├── RpcUnroutable                  no queue was bound for the request
    │   ├── RpcInterrupted(reason)         the connection or channel was lost meanwhile
    │   ├── RpcRemoteError(error)          the server's handler raised; it answered so
    │   └── RpcTimeout (also Timeout)      no reply within the call's timeout
    ├── BatchFormatError (Reject, ValueError)  a batch envelope is malformed or of a
    │                                     format this client does not know
    ├── PublishError
    │   ├── Nacked                         the broker nacked a confirmed publish
    │   ├── Unroutable                     a mandatory publish came back (basic.return)
    │   ├── PublishRefused(reply_code, reply_text)  the broker closed the channel because
    │   │                                     of this publish (404, 403, 406): do not resend
    │   ├── PublishOutcomeUnknown          the channel or connection died before the confirm
    │   ├── UnobservedPublishFailures(count, failures)  a publisher ended holding failed
    │   │                                     publishes nobody looked at
    │   └── PublishTimeout (also Timeout)  a publish's deadline passed (room, block, confirm)
    │       └── OutboxFull                 the durable outbox stayed at its bound (rows/bytes)
    ├── OutboxError(path)                  the durable outbox cannot be used (path and cause)
    │   ├── OutboxLocked                   another process holds the outbox file
    │   └── OutboxCorrupt                  the file is not a sound rabbitry outbox
    ├── TopologyError                      declaring, checking or retrying topology failed
    │   ├── TopologyValidationError (ValueError)  a declaration breaks a RabbitMQ rule;
    │   │                                     raised before anything is sent
    │   ├── TopologyConflict               an entity exists with other arguments (406)
    │   └── TopologyMissingExchange        an alternate or dead-letter exchange named by
    │                                         the topology exists nowhere
    ├── ManagementError(status, reason)    the management HTTP API refused or failed
    │   └── ManagementNotFound             404: no such queue, vhost, policy…
    └── Timeout (TimeoutError)             a deadline passed
        └── PoolTimeout                    no pooled channel became free in time

Handler outcomes are not errors of the library, so they are not :class:`AMQPError` instances: a
consumer's handler raises them to say what becomes of its message::

    HandlerSignal
    ├── Retry                              take the retry path
    ├── Reject                             park (or dead-letter) without retrying
    │   └── BatchFormatError               (also an AMQPError, above)
    └── Requeue                            put it back on its queue

Outside the tree, a ``BaseException`` like ``KeyboardInterrupt``: ``ServiceStopped``,
raised by a stop signal in the main thread of a service run with ``rabbitry.run``.

Broker reply codes map to classes through one registry per level (connection, channel);
registering a code twice is a programming error and fails at import time.
"""

from __future__ import annotations

from typing import Any

from ._errors_base import AMQPError, Message, method_name
from ._errors_base import name_methods_with as name_methods_with
from ._errors_rpc import (
    RpcError,
    RpcInterrupted,
    RpcRemoteError,
    RpcUnroutable,
    ServiceStopped,
)
from ._errors_topology import (
    ManagementError,
    ManagementNotFound,
    TopologyConflict,
    TopologyError,
    TopologyMissingExchange,
    TopologyValidationError,
)

__all__ = [
    "AMQPConnectionError",
    "AMQPError",
    "AMQPNotImplemented",
    "AMQPSyntaxError",
    "AccessRefused",
    "AuthenticationError",
    "BatchFormatError",
    "ChannelClosed",
    "ChannelClosedByBroker",
    "ChannelClosedByClient",
    "ChannelError",
    "CommandInvalid",
    "ConfigurationError",
    "ConnectError",
    "ConnectionAccessRefused",
    "ConnectionClosed",
    "ConnectionClosedByBroker",
    "ConnectionClosedByClient",
    "ConnectionForced",
    "ConnectionLost",
    "ConnectionRecovering",
    "ConsumerCancelled",
    "ContentTooLarge",
    "CredentialsError",
    "FrameError",
    "HandlerSignal",
    "HeartbeatTimeout",
    "InternalError",
    "InvalidPath",
    "InvalidStateError",
    "LocalProtocolError",
    "ManagementError",
    "ManagementNotFound",
    "MessageTooLarge",
    "Nacked",
    "NoConsumers",
    "NoRoute",
    "NotAllowed",
    "NotAnAMQPServer",
    "NotFound",
    "OutboxCorrupt",
    "OutboxError",
    "OutboxFull",
    "OutboxLocked",
    "PoolTimeout",
    "PreconditionFailed",
    "ProtocolError",
    "PublishError",
    "PublishOutcomeUnknown",
    "PublishRefused",
    "PublishTimeout",
    "Reject",
    "RemoteProtocolError",
    "Requeue",
    "ResourceError",
    "ResourceLocked",
    "Retry",
    "RpcError",
    "RpcInterrupted",
    "RpcRemoteError",
    "RpcTimeout",
    "RpcUnroutable",
    "ServiceStopped",
    "TLSError",
    "Timeout",
    "TopologyConflict",
    "TopologyError",
    "TopologyMissingExchange",
    "TopologyValidationError",
    "UnexpectedFrame",
    "UnobservedPublishFailures",
    "Unroutable",
    "VirtualHostAccessRefused",
    "VirtualHostNotFound",
    "channel_error_for",
    "connection_error_for",
]


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


# --------------------------------------------------------------------------- publish


class PublishError(AMQPError):
    """A published message was not accepted by the broker."""


class Nacked(PublishError):
    """The broker answered basic.nack for this publish (confirm mode).

    Attributes:
        delivery_tag: the publish sequence number the broker nacked.
    """

    def __init__(self, delivery_tag: int, message: str = "") -> None:
        super().__init__(message or f"the broker nacked publish #{delivery_tag}")
        self.delivery_tag = delivery_tag


class Unroutable(PublishError):
    """A mandatory publish was returned by the broker (basic.return).

    Attributes:
        message: the returned message, with ``reply_code`` and ``reply_text``.
    """

    def __init__(self, message: Message) -> None:
        super().__init__(
            f"({message.reply_code}) {message.reply_text}: exchange={message.exchange!r} "
            f"routing_key={message.routing_key!r}"
        )
        self.message = message


class PublishOutcomeUnknown(PublishError):
    """The channel or connection ended before the broker confirmed this publish.

    The message may or may not have been routed: resend it (with the same message_id)
    if at-least-once is wanted. ``__cause__`` is why the channel ended.

    Attributes:
        delivery_tag: the publish sequence number on the channel that ended.
        discarded: ``True`` when the message cannot have been routed: it was sent on
            the channel after a publish the broker refused, and the broker discards
            everything that follows the offending method on a channel it closes. Sending
            it again cannot make a duplicate.
    """

    def __init__(self, delivery_tag: int, message: str = "", *, discarded: bool = False) -> None:
        super().__init__(message or f"publish #{delivery_tag}: outcome unknown, channel ended")
        self.delivery_tag = delivery_tag
        self.discarded = discarded


class PublishRefused(PublishError):
    """The broker refused this publish: it closed the channel because of it.

    A definite answer, unlike :class:`PublishOutcomeUnknown`: the message was not
    routed, and sending it again unchanged fails the same way. Typical causes: 404 (the
    exchange does not exist), 403 (no write permission, or an internal exchange) and 406
    (a body above the broker's ``max_message_size``, a ``user_id`` that is not the
    connection's user). ``__cause__`` is the :class:`ChannelClosedByBroker` the broker
    sent.

    Attributes:
        delivery_tag: the publish sequence number on the channel that was closed.
        reply_code: the broker's reply code (404, 403, 406...).
        reply_text: the broker's explanation, as received.
    """

    def __init__(self, delivery_tag: int, reply_code: int, reply_text: str) -> None:
        super().__init__(
            f"publish #{delivery_tag} refused by the broker: ({reply_code}) {reply_text}"
        )
        self.delivery_tag = delivery_tag
        self.reply_code = reply_code
        self.reply_text = reply_text

    def __reduce__(self) -> tuple[Any, ...]:
        return (type(self), (self.delivery_tag, self.reply_code, self.reply_text))


class UnobservedPublishFailures(PublishError):
    """A publisher ended (``close()``, or the end of its ``with`` / ``async with`` block)
    while it held failed publishes whose outcome nobody looked at.

    A future returned by ``publish`` (sync) or ``send`` (asyncio) counts as looked at
    once its ``result()`` or ``exception()`` was called, it was awaited, or a
    done-callback was added to it before it failed. The failures are logged at ERROR
    too; when the block already ends with an exception, they are only logged, so that
    exception is not replaced.

    Attributes:
        count: how many failed publishes nobody looked at.
        failures: the first of them (at most a thousand), oldest first: each the
            exception its future holds (:class:`Unroutable`, :class:`PublishRefused`...).
        first: ``failures[0]``.
        what: the kind of publisher that ended ("Publisher", "AsyncBatchingPublisher"...).
    """

    def __init__(self, count: int, failures: list[BaseException], what: str = "publisher") -> None:
        first = failures[0] if failures else None
        super().__init__(
            f"{what} ended with {count} failed publish{'es' if count != 1 else ''} nobody "
            f"looked at; the first: {type(first).__name__}: {first}"
        )
        self.count = count
        self.failures = failures
        self.first = first
        self.what = what

    def __reduce__(self) -> tuple[Any, ...]:
        return (type(self), (self.count, self.failures, self.what))


class HandlerSignal(Exception):
    """Raised by a consumer handler to say what should happen to the message.

    Not an :class:`AMQPError`: nothing went wrong in the library, and an
    ``except AMQPError`` around client calls must not catch a handler's decision.
    """


class Retry(HandlerSignal):
    """Raise from a handler to send the message down the retry path."""


class Reject(HandlerSignal):
    """Raise from a handler to park (or dead-letter) the message without retrying."""


class BatchFormatError(Reject, AMQPError, ValueError):
    """A batch envelope (``springBatchFormat`` header) cannot be split into its records.

    Its body is truncated or malformed, or its format is not one rabbitry knows. Being a
    :class:`Reject`, a consumer parks (or dead-letters) the envelope without retrying and
    logs it at ERROR; the iterators (``channel.consume()``) raise it with the envelope
    unsettled, for the caller to reject.

    Attributes:
        message: the envelope as delivered, when there is one.
    """

    def __init__(self, text: str, message: Message | None = None) -> None:
        super().__init__(text)
        self.message = message


class Requeue(HandlerSignal):
    """Raise from a handler to put the message back on its queue.

    Use sparingly: a message that always fails this way loops through the broker.
    """


class ConsumerCancelled(AMQPError):
    """The broker cancelled the consumer (basic.cancel), e.g. because its queue was deleted.

    Attributes:
        consumer_tag: the cancelled consumer's tag.
    """

    def __init__(self, consumer_tag: str) -> None:
        super().__init__(f"the broker cancelled consumer {consumer_tag!r}")
        self.consumer_tag = consumer_tag


# --------------------------------------------------------------------------- time


class Timeout(AMQPError, TimeoutError):
    """A deadline passed before the operation completed."""


class PublishTimeout(PublishError, Timeout):
    """A publish did not complete before its deadline.

    Raised by ``publish()`` when the deadline passed before the message could be sent
    (the connection stayed blocked, or the in-flight window stayed full): nothing was
    sent. Set on the publish's future when the broker did not confirm in time: the
    message may still be confirmed later, and stays in flight until it is.
    """


class OutboxFull(PublishTimeout):
    """The durable outbox stayed at its bound (rows or bytes) until the publish's deadline.

    Nothing was stored. The outbox drains as the broker confirms what it holds; while the
    broker is unreachable it stays full.

    Attributes:
        rows: the rows stored when the deadline passed.
        size: the bytes stored when the deadline passed.
    """

    def __init__(self, message: str, *, rows: int = 0, size: int = 0) -> None:
        super().__init__(message)
        self.rows = rows
        self.size = size


class RpcTimeout(RpcError, Timeout):
    """No reply arrived within the call's timeout.

    Attributes:
        timeout: the call's timeout in seconds.
    """

    def __init__(self, routing_key: str, timeout: float | None) -> None:
        super().__init__(
            routing_key, f"no reply to the RPC call to {routing_key!r} within {timeout} s"
        )
        self.timeout = timeout

    def __reduce__(self) -> tuple[Any, ...]:
        return (type(self), (self.routing_key, self.timeout))


class PoolTimeout(Timeout):
    """No channel of a :class:`rabbitry.ChannelPool` became free within the timeout."""


# --------------------------------------------------------------------------- outbox


class OutboxError(AMQPError):
    """The durable publisher outbox cannot be opened, read or written.

    Attributes:
        path: where the outbox lives (a file path, or a store's description).
    """

    def __init__(self, path: str, message: str) -> None:
        super().__init__(f"outbox {path}: {message}")
        self.path = path


class OutboxLocked(OutboxError):
    """Another publisher (in this or another process) holds the outbox.

    One outbox serves one publisher at a time: two would send each other's messages.
    """


class OutboxCorrupt(OutboxError):
    """The outbox file is damaged or is not a rabbitry outbox; nothing was read from it."""
