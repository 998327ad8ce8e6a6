"""The Spark source reads batch envelopes as one row per record (marker ``spark``)."""

from __future__ import annotations

import struct
from typing import TYPE_CHECKING, Any

import pytest
from tests.spark.conftest import depth

import rabbitry
from rabbitry import BatchFormatError, BatchingPublisher, Properties
from rabbitry.protocol.message import Message

if TYPE_CHECKING:
    from collections.abc import Callable

pytest.importorskip("pyspark")
pytest.importorskip("pyarrow")

from rabbitry.spark._core import PublishFailed, QueueConsumer
from rabbitry.spark._options import parse_read_options, parse_write_options
from rabbitry.spark._rows import message_rows
from rabbitry.spark._write import publish_rows

pytestmark = pytest.mark.timeout(300)


def _by_hand(*records: bytes) -> bytes:
    return b"".join(struct.pack(">I", len(r)) + r for r in records)


def _fill(conn: rabbitry.Connection, queue: str) -> list[bytes]:
    """Two envelopes of 3 records and a plain message; returns every record in order."""
    with conn.publisher() as publisher:
        # linger=30: batch_records alone splits, even if this thread stalls mid-batch.
        with BatchingPublisher(
            publisher, batch_records=3, linger=30, properties=Properties(app_id="t")
        ) as b:
            for i in range(6):
                b.publish(b"r%d" % i, routing_key=queue)
        publisher.publish(b"plain", routing_key=queue).result(20)
        publisher.wait_for_confirms(timeout=20)
    return [b"r%d" % i for i in range(6)] + [b"plain"]


def test_message_rows_splits_envelopes_and_refuses_unknown_formats() -> None:
    envelope = Message(
        _by_hand(b"a", b"b"),
        Properties(headers={"springBatchFormat": "lengthHeader4", "k": "v"}, message_id="m"),
        delivery_tag=9,
    )
    shared = message_rows(envelope, "q", 5)
    assert [(r[0], r[4], r[5], r[8], r[10]) for r in shared] == [
        (b"a", 5, 9, "m:0", {"k": "v"}),  # each record an id: the envelope's and its index
        (b"b", 5, 9, "m:1", {"k": "v"}),
    ]
    assert [r[4] for r in message_rows(envelope, "q", 5, consecutive=True)] == [5, 6]
    plain = Message(b"p", Properties())
    assert [r[0] for r in message_rows(plain, "q", 0)] == [b"p"]
    odd = Message(b"", Properties(headers={"springBatchFormat": "zip"}))
    with pytest.raises(BatchFormatError, match="'zip'"):
        message_rows(odd, "q", 0)


def test_queue_stream_reads_one_row_per_record_and_acks_the_envelopes(
    url: str, conn: rabbitry.Connection, make_queue: Callable[..., str]
) -> None:
    queue = make_queue()
    records = _fill(conn, queue)
    options = {"url": url, "queue": queue, "pollTimeoutMs": "2000", "idleTimeoutMs": "500"}
    consumer = QueueConsumer(parse_read_options(options))
    try:
        rows: list[Any] = []
        end = 0
        while len(rows) < len(records):
            batch, end = consumer.read(end)
            assert batch, "the source stopped before every record was read"
            rows.extend(batch)
        assert [r[0] for r in rows] == records
        assert [r[4] for r in rows] == list(range(len(records)))  # offsets count rows
        assert {r[11][9] for r in rows[:6]} == {"t"}  # the envelope's app_id
        consumer.ack_through(end)
    finally:
        consumer.close()
    assert depth(conn, queue) == 0


def test_spark_batch_read_returns_records_and_leaves_the_queue(
    spark: Any, conn: rabbitry.Connection, make_queue: Callable[..., str]
) -> None:
    queue = make_queue()
    records = _fill(conn, queue)
    rows = spark.read.format("rabbitmq").option("queue", queue).load().collect()
    assert [bytes(r.body) for r in rows] == records
    assert [r.offset for r in rows] == [0, 0, 0, 1, 1, 1, 2]  # the message's position
    assert depth(conn, queue) == 3  # two envelopes and the plain message, left as they were


def test_publish_rows_with_batch_records_sends_envelopes_with_stable_ids(
    url: str, conn: rabbitry.Connection, make_queue: Callable[..., str]
) -> None:
    queue = make_queue()
    options = parse_write_options({"url": url, "routingKey": queue, "batchRecords": "4"})
    rows = [{"body": b"w%d" % i} for i in range(10)]
    result = publish_rows(options, rows, "job:3", 3, 0)
    assert (result.published, result.confirmed) == (10, 10)  # rows, not envelopes
    channel = conn.channel()
    raw = []
    while (message := channel.basic_get(queue, no_ack=True)) is not None:
        raw.append(message)
    assert [m.properties.message_id for m in raw] == ["job:3:0", "job:3:4", "job:3:8"]
    assert [[bytes(r) for r in _split_by_hand(m.body)] for m in raw] == [
        [b"w0", b"w1", b"w2", b"w3"],
        [b"w4", b"w5", b"w6", b"w7"],
        [b"w8", b"w9"],
    ]
    assert all(m.properties.headers["springBatchFormat"] == "lengthHeader4" for m in raw)
    with pytest.raises(PublishFailed, match="option batchRecords: row 0 has a 'headers'"):
        publish_rows(options, [{"body": b"x", "headers": {"a": "b"}}], "job:4", 4, 0)


def test_spark_write_with_batch_records_round_trips_through_a_read(
    spark: Any, conn: rabbitry.Connection, make_queue: Callable[..., str]
) -> None:
    queue = make_queue()
    df = spark.createDataFrame([(f"v{i}",) for i in range(25)], "value STRING").coalesce(1)
    df.write.format("rabbitmq").option("routingKey", queue).option("batchRecords", "10").mode(
        "append"
    ).save()
    assert depth(conn, queue) == 3  # 10 + 10 + 5 records
    rows = spark.read.format("rabbitmq").option("queue", queue).load().collect()
    assert sorted(bytes(r.body) for r in rows) == sorted(b"v%d" % i for i in range(25))
    with pytest.raises(Exception, match="option batchRecords"):
        spark.createDataFrame([("a", "id")], "value STRING, message_id STRING").write.format(
            "rabbitmq"
        ).option("routingKey", queue).option("batchRecords", "10").mode("append").save()


def _split_by_hand(body: bytes) -> list[bytes]:
    out, offset = [], 0
    while offset < len(body):
        (size,) = struct.unpack_from(">I", body, offset)
        out.append(body[offset + 4 : offset + 4 + size])
        offset += 4 + size
    return out


def test_each_record_of_an_envelope_gets_its_own_message_id_stable_across_redelivery(
    spark: Any, conn: rabbitry.Connection, make_queue: Callable[..., str]
) -> None:
    queue = make_queue()
    df = spark.range(10_000).selectExpr("CAST(id AS STRING) AS value").coalesce(1)
    df.write.format("rabbitmq").option("routingKey", queue).option("batchRecords", "100").mode(
        "append"
    ).save()
    assert depth(conn, queue) == 100  # envelopes of 100 rows
    reader = spark.read.format("rabbitmq").option("queue", queue)
    first = {
        r.value: r.message_id
        for r in reader.load().selectExpr("CAST(body AS STRING) AS value", "message_id").collect()
    }
    # The deduplication docs/spark.md recommends keeps every row (one id per envelope
    # kept 100 of 10,000).
    assert reader.load().dropDuplicates(["message_id"]).count() == 10_000
    assert len(first) == 10_000 and len(set(first.values())) == 10_000
    # The read returned the envelopes to the queue: read again, they come redelivered,
    # and every record has the id it had.
    again = reader.load().selectExpr("CAST(body AS STRING) AS value", "message_id", "redelivered")
    rows = again.collect()
    assert all(r.redelivered for r in rows)
    assert {r.value: r.message_id for r in rows} == first
