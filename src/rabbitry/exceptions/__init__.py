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

The Spark data source's errors (:mod:`rabbitry.spark`) are in the tree too, each also a
builtin ``RuntimeError`` (``DeliveryCountRefused`` a ``ValueError``)::

    AMQPError
    ├── SourceCancelled                    the broker cancelled a streaming query's consumer
    ├── DataLossError                      offsets asked for that retention removed
    ├── DeliveryLimitReached               a quorum read stopped near the delivery limit
    │   └── DeliveryLimitRefused           a restart would push messages past the limit
    ├── ReadInterrupted                    recovery in a read that had handed out rows
    ├── InvalidStateError
    │   ├── QueueBusy                      a browsing read of a queue another consumer uses
    │   └── ReplayUnavailable              a planned micro-batch cannot be replayed
    ├── ConfigurationError
    │   └── DeliveryCountRefused           a quorum read would raise delivery counts
    ├── AMQPConnectionError
    │   └── BrokerUnavailable              a streaming source lost its broker for good
    └── PublishError
        └── PublishFailed                  a write task's messages were not all confirmed
            └── UnroutableRows             rows came back unroutable (mandatory)

Outside the tree, a ``BaseException`` like ``KeyboardInterrupt``: ``ServiceStopped``,
raised by a stop signal in the main thread of a service run with ``rabbitry.run``.

Broker reply codes map to classes through one registry per level (connection, channel);
registering a code twice is a programming error and fails at import time.
"""

from __future__ import annotations

from ._base import (
    AMQPError,
    ConfigurationError,
    InvalidStateError,
    LocalProtocolError,
    MessageTooLarge,
    PoolTimeout,
    ProtocolError,
    RemoteProtocolError,
    Timeout,
)
from ._base import name_methods_with as name_methods_with
from ._closes import (
    AccessRefused,
    AMQPConnectionError,
    AMQPNotImplemented,
    AMQPSyntaxError,
    AuthenticationError,
    ChannelClosed,
    ChannelClosedByBroker,
    ChannelClosedByClient,
    ChannelError,
    CommandInvalid,
    ConnectError,
    ConnectionAccessRefused,
    ConnectionClosed,
    ConnectionClosedByBroker,
    ConnectionClosedByClient,
    ConnectionForced,
    ConnectionLost,
    ConnectionRecovering,
    ContentTooLarge,
    CredentialsError,
    FrameError,
    HeartbeatTimeout,
    InternalError,
    InvalidPath,
    NoConsumers,
    NoRoute,
    NotAllowed,
    NotAnAMQPServer,
    NotFound,
    PreconditionFailed,
    ResourceError,
    ResourceLocked,
    TLSError,
    UnexpectedFrame,
    VirtualHostAccessRefused,
    VirtualHostNotFound,
    channel_error_for,
    connection_error_for,
)
from ._handling import (
    BatchFormatError,
    ConsumerCancelled,
    HandlerSignal,
    Reject,
    Requeue,
    Retry,
)
from ._publish import (
    Nacked,
    OutboxCorrupt,
    OutboxError,
    OutboxFull,
    OutboxLocked,
    PublishError,
    PublishOutcomeUnknown,
    PublishRefused,
    PublishTimeout,
    UnobservedPublishFailures,
    Unroutable,
)
from ._rpc import (
    RpcError,
    RpcInterrupted,
    RpcRemoteError,
    RpcTimeout,
    RpcUnroutable,
    ServiceStopped,
)
from ._spark import (
    BrokerUnavailable,
    DataLossError,
    DeliveryCountRefused,
    DeliveryLimitReached,
    DeliveryLimitRefused,
    PublishFailed,
    QueueBusy,
    ReadInterrupted,
    ReplayUnavailable,
    SourceCancelled,
    UnroutableRows,
)
from ._topology import (
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
    "BrokerUnavailable",
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
    "DataLossError",
    "DeliveryCountRefused",
    "DeliveryLimitReached",
    "DeliveryLimitRefused",
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
    "PublishFailed",
    "PublishOutcomeUnknown",
    "PublishRefused",
    "PublishTimeout",
    "QueueBusy",
    "ReadInterrupted",
    "Reject",
    "RemoteProtocolError",
    "ReplayUnavailable",
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
    "SourceCancelled",
    "TLSError",
    "Timeout",
    "TopologyConflict",
    "TopologyError",
    "TopologyMissingExchange",
    "TopologyValidationError",
    "UnexpectedFrame",
    "UnobservedPublishFailures",
    "Unroutable",
    "UnroutableRows",
    "VirtualHostAccessRefused",
    "VirtualHostNotFound",
    "channel_error_for",
    "connection_error_for",
]
