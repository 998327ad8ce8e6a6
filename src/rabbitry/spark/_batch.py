"""Batch reads of classic and quorum queues (``spark.read``), without pyspark.

A batch read leaves the queue's messages in the queue (``consume=requeue``, the default).
The planner fixes the number of messages to read: the queue's ready count when the query
is planned (``queue.declare`` passive), and refuses a queue that has consumers: reading
next to a running service would take messages from it (and it from us). Each partition
then reads the queue from its head in *windows*: a consumer (never exclusive: another
client's ``basic.consume`` always succeeds) with a prefetch of one window, held
unacknowledged until the window is complete, cancelled, and checked: a consumer that
appeared on the queue meanwhile fails the read (:class:`QueueBusy`) instead of letting a
short or mixed result through. The partition yields its own positions, then opens the
next window, and at the end returns everything it holds by closing its channel. Theory of
operation:

* While a partition holds its deliveries unacknowledged nobody else can see them. Only one
  consumer of the read exists at a time (the previous window's is cancelled first), so a
  single-active-consumer queue works too, and the partitions of one read take turns
  through an exclusive *lock queue* (``rabbitry.spark.browse.<queue>``), which no other
  client of the queue notices.
* RabbitMQ puts a requeued classic-queue message back at its original position. So the
  head read by partition *i* is the head read by partition *i - 1*: position *k* of the
  snapshot is the same message for every partition and is yielded exactly once.
* A quorum queue does not keep that position, so it is read by one partition;
  ``numPartitions`` > 1 is refused for it. Every return raises a quorum message's
  delivery count: the read needs ``acceptDeliveryCount=true`` and the queue's delivery
  limit (:mod:`rabbitry.spark._limits`), holds no more than the window Spark is taking
  (a ``limit(n)`` returns at most one window it never handed out), and fails with
  :class:`DeliveryLimitReached` on a delivery that one more return would bring to the
  limit. That read still returns what it holds (AMQP 0-9-1 has no uncounted return), so
  it leaves a *marker queue* (:func:`limit_marker`) that makes every later
  non-destructive read of the queue fail when planned, before it touches a message.
* A connection that recovers in the middle of a read has returned everything the read
  held, and the broker delivers the head again. Deliveries carry the channel's recovery
  epoch: a partition that has not yet handed Spark a row starts over on a fresh channel;
  one that has fails with :class:`ReadInterrupted` (Spark retries the task), never
  mixing deliveries of two epochs in one result.
* If the task fails, is cancelled, or Spark stops reading (``limit``), the generator is
  closed or the connection dies: either way the broker requeues every held delivery.

``consume=destructive`` acknowledges each Arrow batch before handing it to Spark (a
``basic.qos`` round trip confirms that the broker applied the ack): at-most-once with
respect to the job's output, and a recovery never yields a delivery twice.

The planner and its refusals are in :mod:`rabbitry.spark._batch_plan`.
"""

from __future__ import annotations

import hashlib
import logging
import queue as queue_module
import threading
import time
from typing import TYPE_CHECKING, Any, Final

from ..exceptions import (
    AMQPError,
    ChannelClosedByBroker,
    DeliveryCountRefused,
    DeliveryLimitReached,
    QueueBusy,
    ReadInterrupted,
    ResourceLocked,
)
from ..recovery import State
from ._arrow import MAX_BATCH_ROWS, ArrowRows
from ._batch_plan import (
    QueueSnapshot,
    delivery_count_refused,
    limit_marker,
    plan_queue_read,
    ways_out,
)
from ._limits import DeliveryLimit, delivery_count

if TYPE_CHECKING:
    from collections.abc import Iterator

    from ..protocol.message import Message
    from ..sync.channel import Channel
    from ..sync.connection import Connection
    from ._options import ReadOptions

__all__ = [
    "DeliveryCountRefused",
    "DeliveryLimitReached",
    "QueueBusy",
    "QueueSnapshot",
    "ReadInterrupted",
    "browse_share",
    "consume_share",
    "delivery_count_refused",
    "limit_marker",
    "plan_queue_read",
]

logger = logging.getLogger("rabbitry.spark")

#: The largest prefetch count AMQP 0-9-1 can express (a short); 0 means unlimited.
_MAX_PREFETCH: Final = 65535
#: Deliveries per window of a non-destructive read (and rows per Arrow batch).
WINDOW: Final = MAX_BATCH_ROWS
#: How often a read that is starting over after a recovery may do so.
_RESTARTS: Final = 3
#: Seconds between progress lines of a long read.
_PROGRESS_EVERY: Final = 10.0
#: How long a read waits for a recovering connection before it gives up.
_RECOVERY_WAIT: Final = 60.0


def _lock_name(queue: str) -> str:
    name = f"rabbitry.spark.browse.{queue}"
    if len(name.encode()) <= 255:
        return name
    return f"rabbitry.spark.browse.{hashlib.sha256(queue.encode()).hexdigest()}"


class _Recovered(Exception):
    """The connection recovered under the read (internal)."""


class _Watch:
    """Notices that the connection left the OPEN state (a reset, a recovery)."""

    def __init__(self, conn: Connection) -> None:
        self.left_open = threading.Event()
        self._conn = conn
        conn.on_state_change(self._changed)

    def _changed(self, state: State, cause: AMQPError | None) -> None:
        if state is not State.OPEN:
            self.left_open.set()

    def wait_open(self) -> None:
        deadline = time.monotonic() + _RECOVERY_WAIT
        while self._conn.state is not State.OPEN:
            if self._conn.state is State.CLOSED or time.monotonic() > deadline:
                raise ReadInterrupted(
                    "rabbitmq batch read: the connection was lost in the middle of the read "
                    "and did not come back; the queue keeps every message"
                )
            time.sleep(0.05)
        self.left_open.clear()


class _Browse:
    """One attempt at reading positions ``[0, end)`` on a fresh channel."""

    def __init__(
        self,
        conn: Connection,
        watch: _Watch,
        options: ReadOptions,
        start: int,
        end: int,
        limit: DeliveryLimit | None,
    ) -> None:
        self.conn = conn
        self.watch = watch
        self.options = options
        self.start = start
        self.end = end
        self.limit = limit
        self.yielded = 0
        #: This read's cancelled consumers that hold deliveries (one per window).
        self.cancelled = 0
        self.channel: Channel | None = None

    def _stale(self, channel: Channel, epoch: int, message: Message | None = None) -> bool:
        return (
            self.watch.left_open.is_set()
            or channel.epoch != epoch
            or (message is not None and message.epoch != epoch)
        )

    def _others(self, channel: Channel) -> int:
        """Consumers of the queue that are not this read's.

        A quorum queue goes on counting a cancelled consumer while it holds deliveries
        (measured on 3.10.8 and 4.0.5), a classic queue does not; a cancelled consumer
        that received nothing is not counted by either.
        """
        count = channel.queue_declare(self.options.queue, passive=True).consumer_count
        ours = self.cancelled if self.options.queue_type == "quorum" else 0
        return max(0, count - ours)

    def _busy(self, consumers: int, position: int) -> QueueBusy:
        return QueueBusy(
            f"rabbitmq batch read of {self.options.queue!r}: {consumers} other consumer(s) "
            f"appeared on the queue during the read (after {position} of {self.end} "
            "messages); they take messages the read would return, so the read fails "
            "rather than return a partial result. The messages it held go back to the "
            "queue. Read when the queue has no consumers, or read a stream queue"
        )

    def _check_limit(self, channel: Channel, message: Message) -> None:
        limit = self.limit
        if limit is None:
            return
        count = delivery_count(message)
        # Two returns in hand: the close that follows a refusal returns this message
        # too, and it must still leave one for whoever reads it next.
        if limit.can_return(count, spare=2):
            return
        queue = self.options.queue
        try:  # before the close that returns it: later reads are refused when planned
            channel.queue_declare(limit_marker(queue), durable=True)
        except AMQPError as exc:
            logger.error("rabbitmq batch read: could not leave the limit marker: %s", exc)
        logger.error(
            "rabbitmq batch read of %r: a message has been returned %d time(s); %s. "
            "The read stops here.",
            queue,
            count,
            limit.describe(),
        )
        raise DeliveryLimitReached(
            f"rabbitmq batch read of quorum queue {queue!r}: a message was delivered with "
            f"x-delivery-count {count}, and {limit.describe()}: returning it again would "
            f"leave it one return from being removed. The read stops (this last return "
            f"keeps it in the queue) and later reads are refused; {ways_out(queue)}",
            queue,
            limit.limit,
        )

    def run(self) -> Iterator[Any]:
        options, queue, end = self.options, self.options.queue, self.end
        channel = self.channel = self.conn.channel()
        epoch = channel.epoch
        wait = max(options.poll_timeout, 2.0)
        rows = ArrowRows(queue, max_rows=WINDOW)
        position = 0
        began = last_log = time.monotonic()
        while position < end:
            size = min(WINDOW, end - position)
            inbox: queue_module.SimpleQueue[Message] = queue_module.SimpleQueue()
            channel.basic_qos(size)
            tag = channel.basic_consume(queue, inbox.put)
            got = 0
            while got < size:
                try:
                    message = inbox.get(timeout=wait)
                except queue_module.Empty:
                    if self._stale(channel, epoch):
                        raise _Recovered from None
                    channel.basic_cancel(tag)
                    self.cancelled += 1 if got else 0
                    others = self._others(channel)
                    if others:
                        raise self._busy(others, position) from None
                    logger.warning(
                        "rabbitmq batch read of %r: the queue held %d message(s), fewer than "
                        "the %d planned (consumed or expired since planning); positions "
                        "%d..%d are not in the result",
                        queue,
                        position,
                        end,
                        max(position, self.start),
                        end - 1,
                    )
                    yield from self._hand(rows.finish())
                    return
                if self._stale(channel, epoch, message):
                    raise _Recovered
                self._check_limit(channel, message)
                if position >= self.start:
                    rows.add(message, position)
                position += 1
                got += 1
            # The window is complete: one consumer at a time, and nobody else's.
            channel.basic_cancel(tag)
            self.cancelled += 1
            others = self._others(channel)
            if others:
                raise self._busy(others, position)
            if self._stale(channel, epoch):
                raise _Recovered
            yield from self._hand(rows.finish())
            now = time.monotonic()
            if now - last_log >= _PROGRESS_EVERY:
                last_log = now
                logger.info(
                    "rabbitmq batch read of %r: %d of %d messages in %.0f s",
                    queue,
                    position,
                    end,
                    now - began,
                )
        yield from self._hand(rows.finish())

    def _hand(self, batches: list[Any]) -> Iterator[Any]:
        for batch in batches:
            self.yielded += batch.num_rows
            yield batch

    def close(self) -> None:
        channel = self.channel
        if channel is not None and channel.is_open:
            try:
                # Closing the channel returns everything it holds (a classic queue puts
                # each message back at its original position).
                channel.close(timeout=30)
            except Exception as exc:  # the connection close requeues them anyway
                logger.debug("rabbitmq batch read: closing the channel failed: %s", exc)


def _take_turn(conn: Connection, options: ReadOptions) -> None:
    """Hold the read's lock queue (partitions of one read take turns), waiting for it."""
    deadline = time.monotonic() + options.exclusive_wait
    delay = 0.05
    name = _lock_name(options.queue)
    while True:
        channel = conn.channel()
        try:
            channel.queue_declare(name, exclusive=True, auto_delete=True)
        except ResourceLocked as exc:
            if time.monotonic() + delay > deadline:
                raise QueueBusy(
                    f"rabbitmq batch read: another partition of a read of {options.queue!r} "
                    f"held lock queue {name!r} for {options.exclusive_wait:.0f} s (option "
                    "exclusiveWaitMs); partitions take turns, so a long read of many "
                    "partitions needs a longer wait, or fewer partitions"
                ) from exc
            time.sleep(delay)
            delay = min(1.0, delay * 2)
            continue
        return


def _wait_for_ghosts(conn: Connection, queue: str) -> None:
    """Wait (bounded) until the broker has dropped the consumer of the lost connection.

    The broker notices a dead connection and removes its consumer (returning what it
    held) a little after the client recovered; until then that consumer holds the head
    of the queue and would look like another consumer to the restarted read.
    """
    channel = conn.channel()
    try:
        deadline = time.monotonic() + _RECOVERY_WAIT
        while channel.queue_declare(queue, passive=True).consumer_count:
            if time.monotonic() > deadline:
                return  # the read's own check names the consumers
            time.sleep(0.05)
    finally:
        channel.close()


def browse_share(
    options: ReadOptions, start: int, end: int, limit: DeliveryLimit | None = None
) -> Iterator[Any]:
    """Executor side, ``consume=requeue``: the rows of snapshot positions ``[start, end)``
    as record batches (``pyarrow.RecordBatch``, see :class:`~rabbitry.spark._arrow.ArrowRows`).

    Holds positions ``[0, end)`` unacknowledged and returns all of them at the end (or
    when the task fails or stops early). Row offsets are the snapshot positions.
    ``limit`` (quorum queues) is the delivery limit the planner learned.

    Raises:
        QueueBusy: another consumer appeared on the queue during the read.
        DeliveryLimitReached: a delivery that one more return would bring to the limit.
        ReadInterrupted: the connection recovered after rows were handed to Spark.
    """
    if end <= start:
        return
    conn = options.connect.connect(f" [spark batch read {start}-{end}]")
    try:
        watch = _Watch(conn)
        if options.num_partitions > 1:
            _take_turn(conn, options)
        restarts = 0
        while True:
            attempt = _Browse(conn, watch, options, start, end, limit)
            try:
                yield from attempt.run()
                return
            except (_Recovered, AMQPError) as exc:
                # A channel the broker closed (404: queue deleted, 403...) is not a
                # recovery, nor is the read's own verdict (a consumer appeared, a message
                # is at its delivery limit). Any other error of a call: the connection
                # went away (the state-change callback may not have run yet).
                if isinstance(
                    exc, ChannelClosedByBroker | QueueBusy | DeliveryLimitReached | ReadInterrupted
                ):
                    raise
                if attempt.yielded or options.num_partitions > 1 or restarts >= _RESTARTS:
                    raise ReadInterrupted(
                        f"rabbitmq batch read of {options.queue!r}: the connection recovered "
                        f"after {attempt.yielded} row(s) of positions {start}..{end - 1} "
                        "were handed to Spark; the broker took back what the read held and "
                        "delivers it again, so this task fails (Spark retries it) rather "
                        "than return some messages twice and others not at all"
                    ) from None
                restarts += 1
                logger.warning(
                    "rabbitmq batch read of %r: the connection recovered before any row "
                    "was handed to Spark; reading positions %d..%d again from the start",
                    options.queue,
                    start,
                    end - 1,
                )
                # The old channel recovers with the connection (and its consumer with
                # it): close it once it has, so that it holds nothing.
                watch.wait_open()
            finally:
                attempt.close()
            _wait_for_ghosts(conn, options.queue)
    finally:
        conn.close(timeout=5)


def consume_share(options: ReadOptions, quota: int, first_offset: int) -> Iterator[Any]:
    """Executor side, ``consume=destructive``: consume up to ``quota`` messages, as
    record batches (``pyarrow.RecordBatch``, see :class:`~rabbitry.spark._arrow.ArrowRows`).

    At-most-once with respect to the job's output: each batch is acknowledged (and the
    broker's answer to a following ``basic.qos`` awaited) before it is handed to Spark.
    Deliveries of a channel epoch older than the current one were requeued by the
    broker when the connection dropped and are left out (they arrive again); a recovery
    while an acknowledgement is on the wire fails the task with :class:`ReadInterrupted`.

    Raises:
        ReadInterrupted: the connection dropped while a batch was being acknowledged.
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
        step = max(1, min(prefetch // 2, MAX_BATCH_ROWS))
        taken = 0
        pending: list[Message] = []
        stale = 0
        while taken < quota:
            want = min(step, quota - taken)
            try:
                message = inbox.get(timeout=options.poll_timeout)
            except queue_module.Empty:
                message = None
            if message is not None:
                if message.epoch != channel.epoch:
                    stale += 1  # requeued by the broker when its connection died
                    continue
                pending.append(message)
            if pending and (message is None or len(pending) >= want):
                pending = [m for m in pending if m.epoch == channel.epoch]
                batch = _acknowledged(
                    channel, prefetch, pending, options.queue, first_offset + taken
                )
                taken += len(pending)
                pending = []
                if batch is not None:
                    yield batch
            if message is None:
                break
        if stale:
            logger.warning(
                "rabbitmq destructive read of %r: %d delivery(ies) predate a connection "
                "recovery; left to the broker, which delivers them again",
                options.queue,
                stale,
            )
        if options.queue_type == "quorum":
            _clear_limit_marker(channel, options.queue)
    finally:
        conn.close(timeout=5)


def _acknowledged(
    channel: Channel, prefetch: int, messages: list[Message], queue: str, first_offset: int
) -> Any | None:
    """Acknowledge ``messages`` and confirm it, then give their rows as one batch."""
    if not messages:
        return None
    epoch = messages[-1].epoch
    rows = ArrowRows(queue, max_rows=len(messages) + 1)
    for index, message in enumerate(messages):
        rows.add(message, first_offset + index)
    try:
        channel.basic_ack(messages[-1].delivery_tag, multiple=True)
        # A round trip after the ack: once it answers, the broker applied the ack.
        channel.basic_qos(prefetch)
    except AMQPError as exc:
        raise ReadInterrupted(
            f"rabbitmq destructive read of {queue!r}: the connection dropped while "
            f"{len(messages)} message(s) were being acknowledged; whether the broker "
            "removed them is unknown, so the task fails rather than lose or repeat them"
        ) from exc
    if channel.epoch != epoch or channel.stale_settlements:
        raise ReadInterrupted(
            f"rabbitmq destructive read of {queue!r}: the connection recovered while "
            f"{len(messages)} message(s) were being acknowledged; the task fails rather "
            "than lose or repeat them"
        )
    batches = rows.finish()
    return batches[0] if batches else None


def _clear_limit_marker(channel: Channel, queue: str) -> None:
    """After a destructive read that left the queue empty, drop its limit marker."""
    try:
        if channel.queue_declare(queue, passive=True).message_count == 0:
            channel.queue_delete(limit_marker(queue), if_empty=True)
    except AMQPError as exc:
        logger.debug("rabbitmq destructive read: limit marker not cleared: %s", exc)
