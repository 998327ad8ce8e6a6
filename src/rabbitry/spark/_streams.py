"""Stream queues in the data source, without pyspark: offsets, probes and range reads.

A stream queue (and each partition of a super stream) is read by offset: the planner
finds the head and the tail with short probes, and an executor task reads one range
``[start, end)`` with a consumer that starts at ``x-stream-offset`` ``start``. Nothing is
acknowledged or rejected (acks are credit only), so a read changes nothing.
"""

from __future__ import annotations

import logging
import queue as queue_module
import time
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any

from ..exceptions import ConfigurationError, DataLossError, NotFound
from ._arrow import ArrowRows

if TYPE_CHECKING:
    from collections.abc import Iterator

    from ..protocol.message import Message
    from ..sync.channel import Channel
    from ..sync.connection import Connection
    from ._options import ReadOptions

__all__ = [
    "DataLossError",
    "read_stream_range",
    "resolve_start",
    "split_range",
    "stream_bounds",
    "stream_first",
    "stream_tail",
]

logger = logging.getLogger("rabbitry.spark")


def split_range(start: int, end: int, parts: int) -> list[tuple[int, int]]:
    """Split ``[start, end)`` into at most ``parts`` contiguous non-empty ranges."""
    total = end - start
    if total <= 0:
        return []
    parts = max(1, min(parts, total))
    size, extra = divmod(total, parts)
    ranges = []
    low = start
    for index in range(parts):
        high = low + size + (1 if index < extra else 0)
        ranges.append((low, high))
        low = high
    return ranges


def _stream_offset(message: Message) -> int | None:
    headers = message.properties.headers
    if not headers:
        return None
    offset = headers.get("x-stream-offset")
    return offset if isinstance(offset, int) else None


def _probe(
    options: ReadOptions,
    spec: Any,
    *,
    first_only: bool,
    max_seconds: float = 3.0,
    first_wait: float | None = None,
) -> int | None:
    """Consume a stream from ``spec``: the first offset delivered, or the highest seen.

    Waits ``first_wait`` (default: the poll timeout, at least 0.5 s) for the first
    delivery; None when none came. A short-lived connection is used and closed without
    cancel or reject (a reject closes the connection on a stream queue).
    """
    conn = options.connect.connect(" [spark stream probe]")
    try:
        channel = conn.channel()
        inbox: queue_module.SimpleQueue[Message] = queue_module.SimpleQueue()
        prefetch = 2000
        channel.basic_qos(prefetch)
        try:
            channel.basic_consume(options.queue, inbox.put, arguments={"x-stream-offset": spec})
        except NotFound:
            raise ConfigurationError(
                f"option queue: stream queue {options.queue!r} does not exist"
            ) from None
        highest: int | None = None
        deadline = time.monotonic() + max_seconds
        wait = max(options.poll_timeout, 0.5) if first_wait is None else first_wait
        count = 0
        while time.monotonic() < deadline:
            try:
                message = inbox.get(timeout=wait)
            except queue_module.Empty:
                break
            wait = options.idle_timeout
            offset = _stream_offset(message)
            count += 1
            if count % (prefetch // 2) == 0:
                channel.basic_ack(message.delivery_tag, multiple=True)
            if offset is None:
                continue
            if first_only:
                return offset
            highest = offset if highest is None else max(highest, offset)
        return highest
    finally:
        conn.close(timeout=5)


def stream_tail(options: ReadOptions) -> int:
    """The next offset after the last message now in the stream (0 when empty)."""
    highest = _probe(options, "last", first_only=False)
    return 0 if highest is None else highest + 1


def stream_first(options: ReadOptions) -> int:
    """The first offset still in the stream (0 when empty)."""
    first = _probe(options, "first", first_only=True)
    return 0 if first is None else first


def resolve_start(options: ReadOptions, spec: str) -> int:
    """``startingOffsets`` (earliest, latest, n, timestamp:s) → an offset."""
    if spec == "earliest":
        return stream_first(options)
    if spec == "latest":
        return stream_tail(options)
    if spec.startswith("timestamp:"):
        seconds = int(spec.split(":", 1)[1])
        when = datetime.fromtimestamp(seconds, UTC)
        found = _probe(options, when, first_only=True)
        return stream_tail(options) if found is None else found
    return int(spec)


def stream_bounds(options: ReadOptions) -> tuple[int, int]:
    """Batch read of a stream: ``[startingOffsets, endingOffsets)`` as numbers."""
    start = resolve_start(options, options.starting_offsets)
    tail = stream_tail(options)
    if options.ending_offsets == "latest":
        end = tail
    else:
        end = int(options.ending_offsets)
        if end > tail:
            # A batch read does not wait for offsets to be written: reading towards
            # them would only time out.
            raise ConfigurationError(
                f"option endingOffsets: {end} is past the end of stream queue "
                f"{options.queue!r} (its next offset is {tail}); use latest or an offset "
                f"up to {tail}"
            )
    return start, max(start, end)


def _subscribe(
    options: ReadOptions, offset: int, start: int, end: int
) -> tuple[Connection, Channel, queue_module.SimpleQueue[Message]]:
    """A connection whose consumer reads the stream from ``offset`` (a task of ``[start, end)``)."""
    conn = options.connect.connect(f" [spark stream {start}-{end}]")
    try:
        channel = conn.channel()
        inbox: queue_module.SimpleQueue[Message] = queue_module.SimpleQueue()
        channel.basic_qos(options.prefetch)
        channel.basic_consume(options.queue, inbox.put, arguments={"x-stream-offset": offset})
    except BaseException:
        conn.close(timeout=5)
        raise
    return conn, channel, inbox


def _check_loss(options: ReadOptions, wanted: int, delivered: int, timeout: float) -> None:
    """The first offset delivered from ``wanted`` is ``delivered`` > ``wanted``: a gap, or
    offsets removed by retention (then :class:`DataLossError`).

    Raises:
        DataLossError: the stream now starts above ``wanted``, or its first offset could
            not be read to tell.
    """
    queue = options.queue
    # The stream holds a message (the one delivered), so the probe waits for it.
    head = _probe(options, "first", first_only=True, max_seconds=timeout, first_wait=timeout)
    if head is None:
        raise DataLossError(
            f"stream queue {queue!r}: the first offset delivered is {delivered}, above the "
            f"range's start {wanted}, and the stream's first offset could not be read within "
            f"{timeout:.0f} s to tell a gap from a loss"
        )
    if head > wanted:
        raise DataLossError(
            f"stream queue {queue!r}: offsets [{wanted}, {head}) are gone (retention: the "
            f"stream now starts at offset {head}); set failOnDataLoss=false to skip them"
        )


def read_stream_range(options: ReadOptions, start: int, end: int) -> Iterator[Any]:
    """Executor side: the rows of offsets ``[start, end)`` of a stream queue, as record
    batches (``pyarrow.RecordBatch``, see :class:`~rabbitry.spark._arrow.ArrowRows`).

    Every offset of the range that holds a message is yielded once, in order, also when
    the connection is lost in the middle. The connection recovers by itself, but its
    recovery subscribes the consumer again with its original arguments, i.e. from the
    offset the subscription started at, which would deliver what was already yielded a
    second time. So the read watches the recovery epoch of the deliveries: at the first
    delivery of a newer epoch it closes that connection and subscribes anew from the
    offset after the last one it yielded (a WARNING says so); offsets below it are
    never yielded again.

    Acks serve as credit only. Offsets can have gaps (an offset taken by an entry of
    the stream's own, such as the one that opens each segment, holds no message), so
    the read stops at the first offset ≥ ``end - 1``. When the first offset delivered
    to a subscription is above the offset it asked for, the stream's first offset tells
    a gap from a loss: if the stream now starts above it, retention removed data
    (:class:`DataLossError` unless ``failOnDataLoss=false``); otherwise those offsets
    held no message.
    """
    if end <= start:
        return
    queue = options.queue
    timeout = max(30.0, options.poll_timeout)
    credit = max(1, options.prefetch // 2)
    rows = ArrowRows(queue)
    following = start  # the next offset to yield
    conn: Connection | None = None
    try:
        while True:
            conn, channel, inbox = _subscribe(options, following, start, end)
            epoch = channel.epoch
            # The offset this subscription asked for, until its first delivery.
            wanted: int | None = following
            since_ack, done = 0, False
            while True:
                try:
                    message = inbox.get(timeout=timeout)
                except queue_module.Empty:
                    raise DataLossError(
                        f"stream queue {queue!r}: no delivery for {timeout:.0f} s while "
                        f"reading offsets [{start}, {end}) (at offset {following})"
                    ) from None
                if message.epoch != epoch:
                    break  # the recovered consumer starts again at `wanted`
                since_ack += 1
                if since_ack >= credit and channel.epoch == epoch:
                    channel.basic_ack(message.delivery_tag, multiple=True)
                    since_ack = 0
                offset = _stream_offset(message)
                if offset is None:
                    continue
                if wanted is not None:
                    if offset > wanted and options.fail_on_data_loss:
                        _check_loss(options, wanted, offset, timeout)
                    wanted = None
                if offset < following:
                    continue
                if offset >= end:
                    done = True
                    break
                rows.add(message, offset)
                following = offset + 1
                yield from rows.ready()
                if offset >= end - 1:
                    done = True
                    break
            if done:
                break
            logger.warning(
                "stream queue %r: the connection recovered while reading offsets [%d, %d); "
                "subscribing again from offset %d (the offsets already read are not read "
                "again)",
                queue,
                start,
                end,
                following,
            )
            # Close without cancel (see below); the next subscription starts where this
            # one stopped.
            conn.close(timeout=5)
            conn = None
        yield from rows.finish()
    finally:
        # Close without cancel: a delivery for a cancelled consumer would be rejected,
        # and a reject on a stream queue closes the connection with an error.
        if conn is not None:
            conn.close(timeout=5)
