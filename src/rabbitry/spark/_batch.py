"""Batch reads of classic and quorum queues (``spark.read``), without pyspark.

A batch read leaves the queue as it was (``consume=requeue``, the default). The planner
fixes the number of messages to read: the queue's ready count when the query is planned
(``queue.declare`` passive). Each partition then reads the queue from its head with an
*exclusive* consumer (``basic.consume exclusive=true``) that holds every delivery
unacknowledged (a prefetch up to 65,535, then ``basic.get``), skips the messages that
belong to earlier partitions, yields its own share, and finally returns everything it
holds by closing its channel. Theory of operation:

* While a partition holds its deliveries unacknowledged nobody else can see them, and the
  exclusive consumer keeps sibling partitions (and any other consumer) off the queue, so
  partitions read one after another and each sees the same head of the queue.
* RabbitMQ puts a requeued message of a classic queue back at its original position. So
  the head read by partition *i* is the head read by partition *i - 1*: position *k* of
  the snapshot is the same message for every partition and is yielded exactly once.
* A quorum queue does not keep that position (measured on 3.10: a returned message goes
  behind the ready ones), so a quorum queue is read by one partition, which holds every
  message it reads until the end; ``numPartitions`` > 1 is refused for it.
* If the task fails, is cancelled, or Spark stops reading (``limit``), the generator is
  closed or the connection dies: either way the broker requeues every held delivery.
  Nothing is acknowledged, so no job outcome changes the queue.

The price: partition *i* receives the messages of partitions ``0..i`` too (``(n + 1) / 2``
transfers per message for ``n`` partitions) and the partitions do not overlap in time.
Every return raises a quorum queue message's delivery count (its ``x-delivery-limit``;
20 by default on RabbitMQ 4.x), which is why quorum queues need ``acceptDeliveryCount``.

``consume=destructive`` is the old at-most-once read: it acknowledges rows as they are
handed to Spark, whatever later happens to the job.
"""

from __future__ import annotations

import logging
import queue as queue_module
import time
from typing import TYPE_CHECKING, Any

from ..exceptions import AccessRefused, ConfigurationError, NotFound
from ._arrow import MAX_BATCH_ROWS, ArrowRows
from ._core import check_queue_type

if TYPE_CHECKING:
    from collections.abc import Iterator

    from ..protocol.message import Message
    from ..sync.channel import Channel
    from ..sync.connection import Connection
    from ._options import ReadOptions

__all__ = [
    "DeliveryCountRefused",
    "QueueBusy",
    "QueueSnapshot",
    "browse_share",
    "consume_share",
    "delivery_count_refused",
    "plan_queue_read",
]

logger = logging.getLogger("rabbitry.spark")

#: The largest prefetch count AMQP 0-9-1 can express (a short); 0 means unlimited.
_MAX_PREFETCH = 65535


class QueueBusy(RuntimeError):
    """A non-destructive batch read could not get the queue to itself.

    The read needs an exclusive consumer so that every ready message is returned exactly
    once; another consumer on the queue (an application, a streaming query) prevents it.
    """


class DeliveryCountRefused(ConfigurationError):
    """A batch read of a quorum queue would raise every message's delivery count.

    Each return counts toward the queue's delivery limit; once it is reached the broker
    dead-letters or drops the message. Opt in with ``acceptDeliveryCount=true``.
    """


class QueueSnapshot:
    """What the planner saw: the queue's ready messages and consumers, and the broker."""

    __slots__ = ("consumers", "ready", "server_version")

    def __init__(self, ready: int, consumers: int, server_version: str) -> None:
        self.ready = ready
        self.consumers = consumers
        self.server_version = server_version


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


def plan_queue_read(options: ReadOptions) -> QueueSnapshot:
    """Look at the queue on the driver and refuse a read that cannot keep its promise.

    Raises:
        ConfigurationError: the queue does not exist.
        DeliveryCountRefused: a non-destructive read of a quorum queue without
            ``acceptDeliveryCount=true``.
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
        check_queue_type(conn, options)
    finally:
        conn.close(timeout=5)
    snapshot = QueueSnapshot(ok.message_count, ok.consumer_count, version)
    if options.consume == "destructive":
        return snapshot
    if options.queue_type == "quorum" and not options.accept_delivery_count:
        raise delivery_count_refused(options.queue, version)
    if options.queue_type == "quorum" and options.num_partitions > 1:
        raise ConfigurationError(
            f"option numPartitions: a batch read of quorum queue {options.queue!r} uses one "
            f"partition (a quorum queue does not return a message to its position, so "
            f"partitions taking turns could read one twice), got {options.num_partitions}; "
            "use df.repartition(n) after the read"
        )
    if snapshot.consumers:
        raise QueueBusy(
            f"rabbitmq batch read: queue {options.queue!r} has {snapshot.consumers} "
            "consumer(s); a batch read needs the queue to itself (an exclusive consumer) to "
            "return every ready message exactly once and leave them in the queue. Stop "
            "the consumers, or read with consume=destructive (at-most-once)"
        )
    return snapshot


def _exclusive_consumer(
    conn: Connection, options: ReadOptions, prefetch: int, inbox: queue_module.SimpleQueue[Message]
) -> Channel:
    """Open a channel whose consumer has the queue to itself, waiting for siblings."""
    deadline = time.monotonic() + options.exclusive_wait
    delay = 0.05
    while True:
        channel = conn.channel()
        channel.basic_qos(prefetch)
        try:
            channel.basic_consume(options.queue, inbox.put, exclusive=True)
        except AccessRefused as exc:
            # Another partition of this read (or some other consumer) has the queue.
            if time.monotonic() + delay > deadline:
                raise QueueBusy(
                    f"rabbitmq batch read: queue {options.queue!r} stayed in use by another "
                    f"consumer for {options.exclusive_wait:.0f} s (option exclusiveWaitMs); "
                    "partitions of one read take turns, so a long read of many partitions "
                    "needs a longer wait, or fewer partitions"
                ) from exc
            time.sleep(delay)
            delay = min(1.0, delay * 2)
            continue
        return channel


def browse_share(options: ReadOptions, start: int, end: int) -> Iterator[Any]:
    """Executor side, ``consume=requeue``: the rows of snapshot positions ``[start, end)``
    as record batches (``pyarrow.RecordBatch``, see :class:`~rabbitry.spark._arrow.ArrowRows`).

    Holds positions ``[0, end)`` unacknowledged and returns all of them at the end (or
    when the task fails or stops early). Row offsets are the snapshot positions.
    """
    if end <= start:
        return
    conn = options.connect.connect(f" [spark batch read {start}-{end}]")
    channel: Channel | None = None
    try:
        inbox: queue_module.SimpleQueue[Message] = queue_module.SimpleQueue()
        # A prefetch of exactly `end` makes the broker stop after our share. The prefetch
        # count is a short: past 65,535 held deliveries the rest is fetched one by one
        # with basic.get (not limited by the prefetch, and the exclusive consumer keeps
        # everyone else off the queue), so memory never holds more than the prefetch.
        pushed = min(end, _MAX_PREFETCH)
        channel = _exclusive_consumer(conn, options, pushed, inbox)
        wait = max(options.poll_timeout, 2.0)
        queue = options.queue
        rows = ArrowRows(queue)
        for position in range(end):
            try:
                if position < pushed:
                    message = inbox.get(timeout=wait)
                else:
                    fetched = channel.basic_get(queue, timeout=wait)
                    if fetched is None:
                        raise queue_module.Empty
                    message = fetched
            except queue_module.Empty:
                logger.warning(
                    "rabbitmq batch read of %r: the queue held %d message(s), fewer than the "
                    "%d planned (consumed or expired since planning); positions %d..%d are "
                    "not in the result",
                    queue,
                    position,
                    end,
                    max(position, start),
                    end - 1,
                )
                break
            if position >= start:
                rows.add(message, position)
                yield from rows.ready()
        yield from rows.finish()
    finally:
        if channel is not None and channel.is_open:
            try:
                # Closing the channel returns everything it holds (a classic queue puts
                # each message back at its original position) and ends the exclusive
                # consumer in the same step. Not basic.nack: the still-open consumer
                # would be handed the requeued messages straight back.
                channel.close(timeout=30)
            except Exception as exc:  # the connection close below requeues them anyway
                logger.debug("rabbitmq batch read: closing the channel failed: %s", exc)
        conn.close(timeout=5)


def consume_share(options: ReadOptions, quota: int, first_offset: int) -> Iterator[Any]:
    """Executor side, ``consume=destructive``: consume up to ``quota`` messages, as
    record batches (``pyarrow.RecordBatch``, see :class:`~rabbitry.spark._arrow.ArrowRows`).

    At-most-once with respect to the job's output: rows are acknowledged once Spark has
    taken them from this iterator, before the job's result is written anywhere. If the
    task fails first, the unacknowledged rest is requeued.
    """
    if quota <= 0:
        return
    conn = options.connect.connect(" [spark destructive read]")
    try:
        channel = conn.channel()
        inbox: queue_module.SimpleQueue[Message] = queue_module.SimpleQueue()
        prefetch = max(1, min(_MAX_PREFETCH, options.prefetch, quota))
        channel.basic_qos(prefetch)
        channel.basic_consume(options.queue, inbox.put)
        # A batch closes after at most `step` deliveries, so the broker never waits for
        # acks of deliveries that are not yet handed to Spark.
        step = max(1, prefetch // 2)
        rows = ArrowRows(options.queue, max_rows=min(step, MAX_BATCH_ROWS))
        last_tag = acked_tag = 0
        for index in range(quota):
            try:
                message = inbox.get(timeout=options.poll_timeout)
            except queue_module.Empty:
                break
            rows.add(message, first_offset + index)
            last_tag = message.delivery_tag
            for batch in rows.ready():
                yield batch
                # Spark took the batch: acknowledge every delivery in it.
                channel.basic_ack(last_tag, multiple=True)
                acked_tag = last_tag
        for batch in rows.finish():
            yield batch
        if last_tag != acked_tag:
            channel.basic_ack(last_tag, multiple=True)
        # A round trip after the last ack: it is on the wire before the connection closes.
        channel.basic_qos(1)
    finally:
        conn.close(timeout=5)
