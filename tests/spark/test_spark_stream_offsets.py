"""Stream offsets with gaps: a range starting on an offset that holds no message.

A stream queue's offsets have gaps: each segment after the first opens with an entry of
the stream's own, which takes an offset and is never delivered. A read whose range
starts on such an offset is not a loss; a read whose start retention removed is. These
call the executor-side reader directly (no Spark), against the broker.
"""

from __future__ import annotations

import time
import uuid
from typing import TYPE_CHECKING, Any

import pytest

from rabbitry.exceptions import ConfigurationError
from rabbitry.spark._core import (
    DataLossError,
    read_stream_range,
    stream_bounds,
    stream_first,
    stream_tail,
)
from rabbitry.spark._options import ReadOptions, parse_read_options

if TYPE_CHECKING:
    from collections.abc import Iterator
    from pathlib import Path

    import rabbitry

_BODY = 400  # bytes: a segment of 5,000 bytes holds about ten messages


@pytest.fixture
def stream(conn: rabbitry.Connection) -> Iterator[str]:
    channel = conn.channel()
    name = f"rabbitry-spark-gaps-{uuid.uuid4().hex[:10]}"
    yield name
    channel.queue_delete(name)


def _declare(conn: rabbitry.Connection, name: str, **arguments: int) -> None:
    conn.channel().queue_declare(
        name,
        durable=True,
        arguments={
            "x-queue-type": "stream",
            "x-stream-max-segment-size-bytes": 5000,
            **arguments,
        },
    )


def _publish(conn: rabbitry.Connection, name: str, count: int) -> None:
    # One message in flight: the stream writes each in a chunk of its own. A burst can
    # land in one chunk larger than a segment, which retention then removes whole.
    with conn.publisher(max_in_flight=1) as publisher:
        outcomes = publisher.publish_batch(
            [f"{n:04d}".encode().ljust(_BODY, b"x") for n in range(count)], routing_key=name
        )
    assert outcomes == [None] * count


def _offsets(options: ReadOptions, start: int, end: int) -> list[int]:
    return [
        offset
        for batch in read_stream_range(options, start, end)
        for offset in batch.column("offset").to_pylist()
    ]


def _options(url: str, name: str, **extra: str) -> ReadOptions:
    return parse_read_options({"url": url, "queue": name, "queueType": "stream", **extra})


def test_a_range_starting_on_an_offset_without_a_message_reads_what_follows(
    conn: rabbitry.Connection, url: str, stream: str
) -> None:
    _declare(conn, stream)
    _publish(conn, stream, 60)
    options = _options(url, stream)
    tail = stream_tail(options)
    offsets = _offsets(options, 0, tail)
    assert len(offsets) == 60
    gaps = sorted(set(range(tail)) - set(offsets))
    assert gaps  # the segments are small: several open with an entry of their own
    for gap in gaps:
        after = [offset for offset in offsets if offset > gap][:5]
        # Before the fix: DataLossError "offsets [gap, gap + 1) are gone (retention)".
        assert _offsets(options, gap, after[-1] + 1) == after, gap


def _retention_moved(conn: rabbitry.Connection, url: str, stream: str) -> int:
    """A stream of 100 messages whose first segments retention removed; its first offset."""
    # Retention keeps about four segments: the stream never runs empty.
    _declare(conn, stream, **{"x-max-length-bytes": 20_000})
    _publish(conn, stream, 100)
    options = _options(url, stream)
    # The broker applies retention in the background, after a segment rolls over.
    deadline = time.monotonic() + 30
    while (head := stream_first(options)) == 0:
        assert time.monotonic() < deadline, "retention removed no segment within 30 s"
        time.sleep(0.2)
    return head


def test_a_streaming_read_past_removed_offsets_reads_data_in_its_first_batch(
    spark: Any, conn: rabbitry.Connection, url: str, stream: str, tmp_path: Path
) -> None:
    head = _retention_moved(conn, url, stream)
    tail = stream_tail(_options(url, stream))
    assert head > 20  # more removed offsets than two batches' limit
    batches: list[tuple[int, list[int]]] = []

    def keep(frame: Any, batch_id: int) -> None:  # runs in this (the driver's) process
        batches.append((batch_id, [row.offset for row in frame.collect()]))

    query = (
        spark.readStream.format("rabbitmq")
        .options(queue=stream, queueType="stream", url=url)
        .option("startingOffsets", "0")  # as a checkpoint from before retention moved
        .option("failOnDataLoss", "false")
        .option("maxRecordsPerTrigger", "10")
        .load()
        .writeStream.foreachBatch(keep)
        .option("checkpointLocation", str(tmp_path / "checkpoint"))
        .trigger(availableNow=True)
        .start()
    )
    assert query.awaitTermination(120), "the AvailableNow run did not finish"
    assert query.exception() is None
    # Before: a batch of 10 removed offsets after another, each empty, until the
    # batches reached the stream's first offset.
    assert batches and all(offsets for _id, offsets in batches), batches
    offsets = [offset for _id, rows in batches for offset in rows]
    assert offsets == sorted(set(offsets))
    assert offsets[0] >= head and offsets[-1] == tail - 1


def test_a_range_whose_start_retention_removed_is_a_loss(
    conn: rabbitry.Connection, url: str, stream: str
) -> None:
    head = _retention_moved(conn, url, stream)
    options = _options(url, stream)
    tail = stream_tail(options)
    with pytest.raises(DataLossError, match=r"offsets \[0, \d+\) are gone \(retention"):
        _offsets(options, 0, tail)
    skipped = _options(url, stream, failOnDataLoss="false")
    assert _offsets(skipped, 0, tail)[0] >= head


def test_an_ending_offset_past_the_tail_is_refused_when_planned(
    conn: rabbitry.Connection, url: str, stream: str
) -> None:
    _declare(conn, stream)
    _publish(conn, stream, 10)
    tail = stream_tail(_options(url, stream))
    # Before: the read waited 30 s for offsets nobody had written, then reported a loss.
    with pytest.raises(ConfigurationError, match=rf"option endingOffsets: 1000 .* is {tail}\)"):
        stream_bounds(_options(url, stream, endingOffsets="1000"))
    assert stream_bounds(_options(url, stream, endingOffsets=str(tail))) == (0, tail)
