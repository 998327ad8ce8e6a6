"""rabbitry: a fast, loss-free, self-recovering RabbitMQ (AMQP 0-9-1) client.

The asyncio API is :class:`AsyncConnection` / :class:`AsyncChannel`, the thread-safe
API their twins :class:`Connection` / :class:`Channel`; messages are
:class:`Message`, their properties :class:`Properties`; every error is in
:mod:`rabbitry.exceptions`; the ones applications usually catch are re-exported here.
"""

from .aio import AsyncChannel, AsyncConnection
from .config import ConnectionParameters, parse_url, parse_urls
from .exceptions import (
    AccessRefused,
    AMQPConnectionError,
    AMQPError,
    AuthenticationError,
    ChannelClosed,
    ChannelClosedByBroker,
    ChannelClosedByClient,
    ConfigurationError,
    ConnectError,
    ConnectionClosed,
    ConnectionClosedByBroker,
    ConnectionClosedByClient,
    ConnectionForced,
    ConnectionLost,
    ConsumerCancelled,
    HeartbeatTimeout,
    InvalidStateError,
    LocalProtocolError,
    Nacked,
    NotFound,
    PreconditionFailed,
    ProtocolError,
    PublishError,
    PublishOutcomeUnknown,
    RemoteProtocolError,
    ResourceLocked,
    Timeout,
    Unroutable,
)
from .message import Message, Properties
from .protocol.frames import Float32, Int8, Int16, Int32, Int64, UInt8, UInt16, UInt32
from .sync import Channel, Connection

__version__ = "0.1.0.dev0"

__all__ = [
    "AMQPConnectionError",
    "AMQPError",
    "AccessRefused",
    "AsyncChannel",
    "AsyncConnection",
    "AuthenticationError",
    "Channel",
    "ChannelClosed",
    "ChannelClosedByBroker",
    "ChannelClosedByClient",
    "ConfigurationError",
    "ConnectError",
    "Connection",
    "ConnectionClosed",
    "ConnectionClosedByBroker",
    "ConnectionClosedByClient",
    "ConnectionForced",
    "ConnectionLost",
    "ConnectionParameters",
    "ConsumerCancelled",
    "Float32",
    "HeartbeatTimeout",
    "Int8",
    "Int16",
    "Int32",
    "Int64",
    "InvalidStateError",
    "LocalProtocolError",
    "Message",
    "Nacked",
    "NotFound",
    "PreconditionFailed",
    "Properties",
    "ProtocolError",
    "PublishError",
    "PublishOutcomeUnknown",
    "RemoteProtocolError",
    "ResourceLocked",
    "Timeout",
    "UInt8",
    "UInt16",
    "UInt32",
    "Unroutable",
    "__version__",
    "parse_url",
    "parse_urls",
]
