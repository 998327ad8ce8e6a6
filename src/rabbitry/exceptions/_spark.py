"""The errors of the Spark data source (:mod:`rabbitry.spark`), in rabbitry's tree.

Each is an :class:`~rabbitry.exceptions.AMQPError` under the branch that fits it, and
also derives from a builtin (``RuntimeError``, or ``ValueError`` through
:class:`ConfigurationError`), so ``except RuntimeError`` clauses catch it. They cross Spark's
process boundary (executor to driver), so each survives a pickle round trip.

Part of the :mod:`rabbitry.exceptions` package, whose ``__init__`` is its only face;
:mod:`rabbitry.spark` exports them too.
"""

from __future__ import annotations

from typing import Any

from ._base import AMQPError, ConfigurationError, InvalidStateError
from ._closes import AMQPConnectionError
from ._publish import PublishError

__all__ = [
    "BrokerUnavailable",
    "DataLossError",
    "DeliveryCountRefused",
    "DeliveryLimitReached",
    "DeliveryLimitRefused",
    "PublishFailed",
    "QueueBusy",
    "ReadInterrupted",
    "ReplayUnavailable",
    "SourceCancelled",
    "UnroutableRows",
]

# --------------------------------------------------------------------------- streaming


class SourceCancelled(AMQPError, RuntimeError):
    """The broker cancelled the consumer of a streaming query (e.g. its queue was deleted)."""


class BrokerUnavailable(AMQPConnectionError, RuntimeError):
    """A streaming source lost its broker and could not get it back within
    ``recoveryTimeoutMs`` (the query stops; its unacknowledged messages are back in the
    queue, and a restart from the checkpoint goes on)."""


class ReplayUnavailable(InvalidStateError):
    """A planned micro-batch of a classic/quorum queue cannot be replayed.

    Its messages are still held (unacknowledged) by the source session that read them, so
    an empty replay would let that session acknowledge them later: data loss.
    """


class DataLossError(AMQPError, RuntimeError):
    """Offsets of a stream queue were asked for that retention already removed."""


# --------------------------------------------------------------------------- batch reads


class QueueBusy(InvalidStateError):
    """A non-destructive batch read of a queue that another consumer uses.

    Refused when planned (the queue has consumers), or raised during the read when a
    consumer appeared: the read cannot return the queue's content while someone else
    takes messages from it.
    """


class DeliveryCountRefused(ConfigurationError):
    """A batch read of a quorum queue would raise every message's delivery count.

    Each return counts toward the queue's delivery limit; once it is reached the broker
    dead-letters or drops the message. Opt in with ``acceptDeliveryCount=true`` (and tell
    the limit when the broker cannot: ``deliveryLimit`` or ``managementUrl``).
    """


class DeliveryLimitReached(AMQPError, RuntimeError):
    """A read of a quorum queue stopped at messages close to its delivery limit.

    A batch read raises it when it meets a message one return from the limit; the
    streaming source raises its subclass :class:`DeliveryLimitRefused` before reading
    anything. Catch this class for both.

    Attributes:
        queue: the queue.
        limit: its delivery limit.
    """

    def __init__(self, message: str, queue: str = "", limit: int | None = None) -> None:
        super().__init__(message)
        self.queue = queue
        self.limit = limit

    def __reduce__(self) -> tuple[Any, ...]:
        return (type(self), (str(self), self.queue, self.limit))


class DeliveryLimitRefused(DeliveryLimitReached):
    """A restarted streaming query of a quorum queue would read messages that one more
    failed run could push to the queue's delivery limit (where the broker dead-letters or
    drops them); nothing was read."""


class ReadInterrupted(AMQPError, RuntimeError):
    """The connection recovered in the middle of a read that had already handed rows to
    Spark: the broker took back what the read held, so the task fails (Spark retries it)
    rather than return a mix of two reads."""


# --------------------------------------------------------------------------- writes


class PublishFailed(PublishError, RuntimeError):
    """A write task could not get every message confirmed (Spark retries the task)."""


class UnroutableRows(PublishFailed):
    """Rows were returned by the broker as unroutable (``mandatory=true``, the default).

    Attributes:
        returned: how many rows were returned.
        routes: returned rows per ``(exchange, routing_key)`` (the first few pairs).
    """

    def __init__(self, message: str, returned: int, routes: dict[tuple[str, str], int]) -> None:
        super().__init__(message)
        self.returned = returned
        self.routes = routes

    def __reduce__(self) -> tuple[Any, ...]:
        return (type(self), (str(self), self.returned, self.routes))
