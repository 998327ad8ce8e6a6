"""rabbitry: a fast, loss-free, self-recovering RabbitMQ (AMQP 0-9-1) client.

The asyncio API is :class:`AsyncConnection` / :class:`AsyncChannel`, the thread-safe
API their twins :class:`Connection` / :class:`Channel`; messages are
:class:`Message`, their properties :class:`Properties`; every error is in
:mod:`rabbitry.exceptions`; the ones applications usually catch are re-exported here.
"""

import logging

from ._connection import AsyncConnection
from ._version import __version__
from .aio import AsyncChannel
from .batching_publisher import AsyncBatchingPublisher, BatchingPublisher
from .config import ConnectionParameters, parse_url, parse_urls
from .consumer import AsyncConsumer, ConsumerStats, DedupStore, MemoryDedupStore
from .exceptions import (
    AccessRefused,
    AMQPConnectionError,
    AMQPError,
    AuthenticationError,
    BatchFormatError,
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
    ConnectionRecovering,
    ConsumerCancelled,
    CredentialsError,
    HandlerSignal,
    HeartbeatTimeout,
    InvalidStateError,
    LocalProtocolError,
    ManagementError,
    ManagementNotFound,
    MessageTooLarge,
    Nacked,
    NotAnAMQPServer,
    NotFound,
    OutboxCorrupt,
    OutboxError,
    OutboxFull,
    OutboxLocked,
    PoolTimeout,
    PreconditionFailed,
    ProtocolError,
    PublishError,
    PublishOutcomeUnknown,
    PublishRefused,
    PublishTimeout,
    Reject,
    RemoteProtocolError,
    Requeue,
    ResourceLocked,
    Retry,
    RpcError,
    RpcInterrupted,
    RpcRemoteError,
    RpcTimeout,
    RpcUnroutable,
    Timeout,
    TLSError,
    TopologyConflict,
    TopologyError,
    TopologyMissingExchange,
    TopologyValidationError,
    UnobservedPublishFailures,
    Unroutable,
    VirtualHostAccessRefused,
    VirtualHostNotFound,
)
from .message import Message, Properties
from .outbox import Outbox, OutboxStatus, SQLiteOutbox
from .outbox_publisher import AsyncOutboxPublisher, OutboxStats
from .pool import AsyncChannelPool
from .protocol.frames import Float32, Int8, Int16, Int32, Int64, UInt8, UInt16, UInt32
from .publisher import AsyncPublisher, OutgoingMessage
from .recovery import NackRetry, RecoveryPolicy, State
from .rpc import AsyncRpcClient, AsyncRpcServer
from .service import ServiceStopped, run
from .sync import Channel, Connection
from .sync.consumer import Consumer
from .sync.outbox_publisher import OutboxPublisher
from .sync.pool import ChannelPool
from .sync.publisher import Publisher
from .sync.rpc import RpcClient, RpcServer
from .topology import (
    Binding,
    Exchange,
    Queue,
    RetryPolicy,
    Topology,
    handle_failure,
)

# A library leaves logging to the application. Without a handler of its own, Python's
# last-resort handler would print rabbitry's WARNING and ERROR lines to stderr in
# applications that never configured logging; with it, they go wherever the
# application's configuration sends them (records still propagate to the root logger).
logging.getLogger(__name__).addHandler(logging.NullHandler())

__all__ = [
    "AMQPConnectionError",
    "AMQPError",
    "AccessRefused",
    "AsyncBatchingPublisher",
    "AsyncChannel",
    "AsyncChannelPool",
    "AsyncConnection",
    "AsyncConsumer",
    "AsyncOutboxPublisher",
    "AsyncPublisher",
    "AsyncRpcClient",
    "AsyncRpcServer",
    "AuthenticationError",
    "BatchFormatError",
    "BatchingPublisher",
    "Binding",
    "Channel",
    "ChannelClosed",
    "ChannelClosedByBroker",
    "ChannelClosedByClient",
    "ChannelPool",
    "ConfigurationError",
    "ConnectError",
    "Connection",
    "ConnectionClosed",
    "ConnectionClosedByBroker",
    "ConnectionClosedByClient",
    "ConnectionForced",
    "ConnectionLost",
    "ConnectionParameters",
    "ConnectionRecovering",
    "Consumer",
    "ConsumerCancelled",
    "ConsumerStats",
    "CredentialsError",
    "DedupStore",
    "Exchange",
    "Float32",
    "HandlerSignal",
    "HeartbeatTimeout",
    "Int8",
    "Int16",
    "Int32",
    "Int64",
    "InvalidStateError",
    "LocalProtocolError",
    "ManagementError",
    "ManagementNotFound",
    "MemoryDedupStore",
    "Message",
    "MessageTooLarge",
    "NackRetry",
    "Nacked",
    "NotAnAMQPServer",
    "NotFound",
    "Outbox",
    "OutboxCorrupt",
    "OutboxError",
    "OutboxFull",
    "OutboxLocked",
    "OutboxPublisher",
    "OutboxStats",
    "OutboxStatus",
    "OutgoingMessage",
    "PoolTimeout",
    "PreconditionFailed",
    "Properties",
    "ProtocolError",
    "PublishError",
    "PublishOutcomeUnknown",
    "PublishRefused",
    "PublishTimeout",
    "Publisher",
    "Queue",
    "RecoveryPolicy",
    "Reject",
    "RemoteProtocolError",
    "Requeue",
    "ResourceLocked",
    "Retry",
    "RetryPolicy",
    "RpcClient",
    "RpcError",
    "RpcInterrupted",
    "RpcRemoteError",
    "RpcServer",
    "RpcTimeout",
    "RpcUnroutable",
    "SQLiteOutbox",
    "ServiceStopped",
    "State",
    "TLSError",
    "Timeout",
    "Topology",
    "TopologyConflict",
    "TopologyError",
    "TopologyMissingExchange",
    "TopologyValidationError",
    "UInt8",
    "UInt16",
    "UInt32",
    "UnobservedPublishFailures",
    "Unroutable",
    "VirtualHostAccessRefused",
    "VirtualHostNotFound",
    "__version__",
    "handle_failure",
    "parse_url",
    "parse_urls",
    "run",
]
