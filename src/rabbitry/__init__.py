"""rabbitry: a fast, loss-free, self-recovering RabbitMQ (AMQP 0-9-1) client.

The asyncio API is :class:`AsyncConnection` / :class:`AsyncChannel`, the thread-safe
API their twins :class:`Connection` / :class:`Channel`; messages are
:class:`Message`, their properties :class:`Properties`; every error is in
:mod:`rabbitry.exceptions`; the ones applications usually catch are re-exported here.
"""

import logging
from typing import TYPE_CHECKING, Any

from ._connection import AsyncConnection
from ._version import __version__
from .aio import AsyncChannel
from .batching_publisher import AsyncBatchingPublisher, BatchingPublisher
from .config import ConnectionParameters, parse_url, parse_urls
from .consumer import AsyncConsumer, ConsumerStats, DedupStore, MemoryDedupStore
from .exceptions import (
    AMQPConnectionError,
    AMQPError,
    ChannelClosed,
    ConfigurationError,
    InvalidStateError,
    Nacked,
    NotFound,
    PreconditionFailed,
    PublishError,
    PublishOutcomeUnknown,
    Reject,
    Requeue,
    Retry,
    Timeout,
    Unroutable,
)
from .message import Message, Properties
from .outbox import Outbox, OutboxStatus, SQLiteOutbox
from .outbox_publisher import AsyncOutboxPublisher, OutboxStats
from .pool import AsyncChannelPool
from .publisher import AsyncPublisher, OutgoingMessage
from .recovery import NackRetry, RecoveryPolicy, State
from .rpc import AsyncRpcClient, AsyncRpcServer
from .service import run
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
    "AsyncBatchingPublisher",
    "AsyncChannel",
    "AsyncChannelPool",
    "AsyncConnection",
    "AsyncConsumer",
    "AsyncOutboxPublisher",
    "AsyncPublisher",
    "AsyncRpcClient",
    "AsyncRpcServer",
    "BatchingPublisher",
    "Binding",
    "Channel",
    "ChannelClosed",
    "ChannelPool",
    "ConfigurationError",
    "Connection",
    "ConnectionParameters",
    "Consumer",
    "ConsumerStats",
    "DedupStore",
    "Exchange",
    "InvalidStateError",
    "MemoryDedupStore",
    "Message",
    "NackRetry",
    "Nacked",
    "NotFound",
    "Outbox",
    "OutboxPublisher",
    "OutboxStats",
    "OutboxStatus",
    "OutgoingMessage",
    "PreconditionFailed",
    "Properties",
    "PublishError",
    "PublishOutcomeUnknown",
    "Publisher",
    "Queue",
    "RecoveryPolicy",
    "Reject",
    "Requeue",
    "Retry",
    "RetryPolicy",
    "RpcClient",
    "RpcServer",
    "SQLiteOutbox",
    "State",
    "Timeout",
    "Topology",
    "Unroutable",
    "__version__",
    "handle_failure",
    "parse_url",
    "parse_urls",
    "run",
]

# The other exceptions of rabbitry.exceptions, and the AMQP number types of
# rabbitry.message (Int8, ..., Float32), are attributes of the package too, so that
# ``rabbitry.ConnectionLost`` and ``from rabbitry import Int64`` work; they are not in
# __all__ and are documented where they live.
if TYPE_CHECKING:
    from .exceptions import (  # noqa: I001 (one block, aliases kept together)
        AccessRefused as AccessRefused,
        AuthenticationError as AuthenticationError,
        BatchFormatError as BatchFormatError,
        ChannelClosedByBroker as ChannelClosedByBroker,
        ChannelClosedByClient as ChannelClosedByClient,
        ConnectError as ConnectError,
        ConnectionClosed as ConnectionClosed,
        ConnectionClosedByBroker as ConnectionClosedByBroker,
        ConnectionClosedByClient as ConnectionClosedByClient,
        ConnectionForced as ConnectionForced,
        ConnectionLost as ConnectionLost,
        ConnectionRecovering as ConnectionRecovering,
        ConsumerCancelled as ConsumerCancelled,
        CredentialsError as CredentialsError,
        HandlerSignal as HandlerSignal,
        HeartbeatTimeout as HeartbeatTimeout,
        LocalProtocolError as LocalProtocolError,
        ManagementError as ManagementError,
        ManagementNotFound as ManagementNotFound,
        MessageTooLarge as MessageTooLarge,
        NotAnAMQPServer as NotAnAMQPServer,
        OutboxCorrupt as OutboxCorrupt,
        OutboxError as OutboxError,
        OutboxFull as OutboxFull,
        OutboxLocked as OutboxLocked,
        PoolTimeout as PoolTimeout,
        ProtocolError as ProtocolError,
        PublishRefused as PublishRefused,
        PublishTimeout as PublishTimeout,
        RemoteProtocolError as RemoteProtocolError,
        ResourceLocked as ResourceLocked,
        RpcError as RpcError,
        RpcInterrupted as RpcInterrupted,
        RpcRemoteError as RpcRemoteError,
        RpcTimeout as RpcTimeout,
        RpcUnroutable as RpcUnroutable,
        ServiceStopped as ServiceStopped,
        TLSError as TLSError,
        TopologyConflict as TopologyConflict,
        TopologyError as TopologyError,
        TopologyMissingExchange as TopologyMissingExchange,
        TopologyValidationError as TopologyValidationError,
        UnobservedPublishFailures as UnobservedPublishFailures,
        VirtualHostAccessRefused as VirtualHostAccessRefused,
        VirtualHostNotFound as VirtualHostNotFound,
    )
    from .message import (
        Float32 as Float32,
        Int8 as Int8,
        Int16 as Int16,
        Int32 as Int32,
        Int64 as Int64,
        UInt8 as UInt8,
        UInt16 as UInt16,
        UInt32 as UInt32,
    )


def __getattr__(name: str) -> Any:
    from . import exceptions, message

    for module in (exceptions, message):
        if name in module.__all__:
            value = getattr(module, name)
            globals()[name] = value
            return value
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
