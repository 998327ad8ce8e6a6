"""Planning a batch read of a classic/quorum queue, before any message is touched.

:func:`plan_queue_read` takes the queue's snapshot (ready messages, consumers, broker,
delivery limit) and refuses a read that cannot return the queue's content: a queue with
consumers, a quorum queue without ``acceptDeliveryCount`` or one a failed read left at
its delivery limit (:func:`limit_marker`). The read itself is in
:mod:`rabbitry.spark._batch`.
"""

from __future__ import annotations

import hashlib
import logging
from typing import TYPE_CHECKING

from ..exceptions import (
    ConfigurationError,
    DeliveryCountRefused,
    DeliveryLimitReached,
    NotFound,
    QueueBusy,
)
from ._limits import DeliveryLimit, effective_delivery_limit
from ._queue_probe import check_queue_type

if TYPE_CHECKING:
    from ..sync.connection import Connection
    from ._options import ReadOptions

__all__ = [
    "QueueSnapshot",
    "delivery_count_refused",
    "limit_marker",
    "lookup_limit",
    "plan_queue_read",
    "ways_out",
]

logger = logging.getLogger("rabbitry.spark")


class QueueSnapshot:
    """What the planner saw: the queue's ready messages and consumers, the broker, and
    (quorum queues) the delivery limit."""

    __slots__ = ("consumers", "delivery_limit", "ready", "server_version")

    def __init__(
        self,
        ready: int,
        consumers: int,
        server_version: str,
        delivery_limit: DeliveryLimit | None = None,
    ) -> None:
        self.ready = ready
        self.consumers = consumers
        self.server_version = server_version
        self.delivery_limit = delivery_limit


def limit_marker(queue: str) -> str:
    """The marker queue a :class:`DeliveryLimitReached` read leaves for ``queue``.

    Args:
        queue: the queue read.

    Returns:
        ``rabbitry.spark.delivery-limit.<queue>`` (a hash of the name when too long).
    """
    name = f"rabbitry.spark.delivery-limit.{queue}"
    if len(name.encode()) <= 255:
        return name
    return f"rabbitry.spark.delivery-limit.{hashlib.sha256(queue.encode()).hexdigest()}"


def delivery_count_refused(queue: str, server_version: str) -> DeliveryCountRefused:
    """The error for a non-destructive batch read of quorum queue ``queue``."""
    major = server_version.split(".", 1)[0]
    limit = (
        "20 by default on RabbitMQ 4.x"
        if major.isdigit() and int(major) >= 4
        else "none by default on RabbitMQ 3.x"
    )
    return DeliveryCountRefused(
        f"option acceptDeliveryCount: queue {queue!r} is a quorum queue "
        f"(broker {server_version or 'unknown'}): a batch read returns every message it "
        "reads, and each return raises the message's delivery count toward the queue's "
        f"delivery limit (x-delivery-limit argument or delivery-limit policy; {limit}); "
        "at the limit the broker dead-letters or drops the message. Set "
        "acceptDeliveryCount=true to read anyway, drain the queue with readStream "
        "(trigger availableNow) instead, or keep data to re-read in a stream queue"
    )


def ways_out(queue: str) -> str:
    return (
        f"read the data from a stream queue instead, raise the delivery limit of {queue!r} "
        "(x-delivery-limit or a delivery-limit policy), or consume the queue "
        "(consume=destructive, or readStream)"
    )


def lookup_limit(options: ReadOptions, conn: Connection) -> DeliveryLimit:
    """The read's queue's delivery limit: from ``managementUrl`` when it is given and
    usable, else ``deliveryLimit``, else unknown (see :mod:`._limits`)."""
    management = None
    if options.management_url:
        try:
            from ..management import ManagementClient

            management = ManagementClient(options.management_url)
        except Exception as exc:  # httpx missing, bad URL: go on without it
            logger.warning("rabbitmq batch read: option managementUrl not usable: %s", exc)
    try:
        return effective_delivery_limit(
            options.queue,
            options.queue_type,
            conn.server_version,
            stated=options.delivery_limit,
            management=management,
        )
    finally:
        if management is not None:
            management.close()


def _exists(conn: Connection, queue: str) -> bool:
    channel = conn.channel()
    try:
        channel.queue_declare(queue, passive=True)
    except NotFound:
        return False
    channel.close()
    return True


def plan_queue_read(options: ReadOptions) -> QueueSnapshot:
    """Look at the queue on the driver and refuse a read that cannot keep its promise.

    Raises:
        ConfigurationError: the queue does not exist.
        DeliveryCountRefused: a non-destructive read of a quorum queue without
            ``acceptDeliveryCount=true``, or whose delivery limit cannot be learned.
        DeliveryLimitReached: an earlier read of this quorum queue met a message at its
            limit (the marker queue :func:`limit_marker` exists).
        QueueBusy: a non-destructive read of a queue that has consumers.
    """
    conn = options.connect.connect(" [spark planner]")
    try:
        version = str(conn.server_properties.get("version", ""))
        channel = conn.channel()
        try:
            ok = channel.queue_declare(options.queue, passive=True)
        except NotFound:
            raise ConfigurationError(
                f"option queue: queue {options.queue!r} does not exist"
            ) from None
        channel.close()
        check_queue_type(conn, options)
        snapshot = QueueSnapshot(ok.message_count, ok.consumer_count, version)
        if options.consume == "destructive":
            return snapshot
        if options.queue_type == "quorum" and not options.accept_delivery_count:
            raise delivery_count_refused(options.queue, version)
        if options.queue_type == "quorum" and options.num_partitions > 1:
            raise ConfigurationError(
                f"option numPartitions: a batch read of quorum queue {options.queue!r} uses "
                f"one partition (a quorum queue does not return a message to its position, "
                f"so partitions taking turns could read one twice), got "
                f"{options.num_partitions}; use df.repartition(n) after the read"
            )
        if snapshot.consumers:
            raise QueueBusy(
                f"rabbitmq batch read: queue {options.queue!r} has {snapshot.consumers} "
                "consumer(s); a non-destructive read would take messages away from them "
                "while it holds them (and miss the ones they take). Read when the queue "
                "has no consumers, read a stream queue with the same data instead, or use "
                "consume=destructive (at-most-once, competes with the consumers)"
            )
        if options.queue_type == "quorum":
            limit = lookup_limit(options, conn)
            if not limit.known:
                raise DeliveryCountRefused(
                    f"option deliveryLimit: {limit.describe()}; a batch read of a quorum "
                    "queue needs it to keep every message below the limit. Give the "
                    "queue's limit (option deliveryLimit) or its management API (option "
                    "managementUrl, e.g. http://user:password@host:15672/)"
                )
            if _exists(conn, limit_marker(options.queue)):
                raise DeliveryLimitReached(
                    f"rabbitmq batch read: an earlier read of quorum queue "
                    f"{options.queue!r} met a message one return from the delivery limit "
                    f"({limit.describe()}), and another read would return it onto it. "
                    f"Refused before reading; {ways_out(options.queue)}. Then delete "
                    f"queue {limit_marker(options.queue)!r} (a destructive read that "
                    "empties the queue deletes it)",
                    options.queue,
                    limit.limit,
                )
            snapshot.delivery_limit = limit
        return snapshot
    finally:
        conn.close(timeout=5)
