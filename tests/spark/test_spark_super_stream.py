"""A super stream with a local SparkSession and the real broker: rows written land in the
partition the hash says, and a streaming read takes every partition in parallel, each in
order, and resumes from its checkpoint without reading anything twice or missing anything."""

from __future__ import annotations

import json
import uuid
from typing import TYPE_CHECKING, Any

import pytest

from rabbitry import OutgoingMessage
from rabbitry.topology import SuperStream, partition_for, super_stream

if TYPE_CHECKING:
    from collections.abc import Iterator
    from pathlib import Path

    import rabbitry

WAIT = 240


@pytest.fixture
def layout(conn: rabbitry.Connection) -> Iterator[SuperStream]:
    """A super stream of 3 partitions, deleted afterwards."""
    name = f"rabbitry-spark-super-{uuid.uuid4().hex[:10]}"
    topology = super_stream(name, 3)
    topology.apply(conn)
    yield SuperStream(name, 3)
    topology.delete(conn)


def _key(seq: int) -> str:
    return f"customer-{seq % 41}"


def _publish(conn: rabbitry.Connection, layout: SuperStream, seqs: range) -> None:
    """Publish ``b"<seq>"`` for each seq, in order, to the partition of its key."""
    messages = [
        OutgoingMessage(
            str(seq), exchange=layout.name, routing_key=layout.binding_key_for(_key(seq))
        )
        for seq in seqs
    ]
    with conn.publisher(max_in_flight=2000, mandatory=True) as publisher:
        outcomes = publisher.publish_batch(messages)
    assert not [o for o in outcomes if o is not None]


def _super_options(layout: SuperStream) -> dict[str, str]:
    return {"superStream": layout.name, "superStreamPartitions": str(layout.partitions)}


def test_write_lands_in_the_partition_the_hash_says(spark: Any, layout: SuperStream) -> None:
    options = _super_options(layout)
    keyed = (
        spark.range(600)
        .repartition(2)
        .selectExpr(
            "cast(id as string) as body", "concat('customer-', cast(id % 41 as string)) as customer"
        )
    )
    keyed.write.format("rabbitmq").options(**options).option("partitionKeyColumn", "customer").mode(
        "append"
    ).save()
    explicit = spark.range(600, 630).selectExpr(
        "cast(id as string) as body", "cast(id % 3 as int) as partition"
    )
    explicit.write.format("rabbitmq").options(**options).mode("append").save()

    rows = spark.read.format("rabbitmq").options(**options).load().collect()
    assert sorted(int(bytes(r.body)) for r in rows) == list(range(630))
    for row in rows:
        seq = int(bytes(row.body))
        index = partition_for(_key(seq), 3) if seq < 600 else seq % 3
        assert row.queue == layout.queues[index], (seq, row.queue)
        assert row.exchange == layout.name and row.routing_key == str(index)
    assert {r.queue for r in rows} == set(layout.queues)


def _run(spark: Any, layout: SuperStream, checkpoint: Path) -> list[Any]:
    """One AvailableNow run of the super stream; the rows of its batches, in order."""
    batches: list[tuple[int, list[Any]]] = []

    def keep(frame: Any, batch_id: int) -> None:  # runs in this (the driver's) process
        batches.append((batch_id, frame.collect()))

    reader = spark.readStream.format("rabbitmq").options(**_super_options(layout))
    query = (
        reader.option("maxRecordsPerTrigger", "100")
        .option("startingOffsets", "earliest")
        .load()
        .writeStream.foreachBatch(keep)
        .option("checkpointLocation", str(checkpoint))
        .trigger(availableNow=True)
        .start()
    )
    assert query.awaitTermination(WAIT), "the AvailableNow run did not finish"
    assert query.exception() is None
    ids = [batch_id for batch_id, _rows in batches]
    assert ids == sorted(set(ids)), ids  # each batch once
    return [row for _id, rows in batches for row in rows]


def _check_order(layout: SuperStream, rows: list[Any]) -> None:
    """Each row in its hash partition; per partition, offsets and sequence numbers rise."""
    for queue in layout.queues:
        mine = [r for r in rows if r.queue == queue]
        assert mine, f"nothing read from {queue}"
        offsets = [r.offset for r in mine]
        seqs = [int(bytes(r.body)) for r in mine]
        assert offsets == sorted(set(offsets)), queue
        assert seqs == sorted(set(seqs)), queue
        assert all(layout.queues[partition_for(_key(s), 3)] == queue for s in seqs)


def test_stream_read_every_partition_once_then_resume(
    spark: Any, conn: rabbitry.Connection, layout: SuperStream, tmp_path: Path
) -> None:
    checkpoint = tmp_path / "chk"
    _publish(conn, layout, range(300))
    first = _run(spark, layout, checkpoint)
    assert sorted(int(bytes(r.body)) for r in first) == list(range(300))
    _check_order(layout, first)
    # maxRecordsPerTrigger=100 over 300 rows: several batches, offsets per partition.
    offset_files = sorted(
        (p for p in (checkpoint / "offsets").iterdir() if p.name.isdigit()),
        key=lambda p: int(p.name),
    )
    assert len(offset_files) >= 3
    last = json.loads(offset_files[-1].read_text().splitlines()[-1])
    assert set(last["partitions"]) == set(layout.queues)

    _publish(conn, layout, range(300, 450))
    second = _run(spark, layout, checkpoint)  # restarted from the checkpoint
    assert sorted(int(bytes(r.body)) for r in second) == list(range(300, 450))
    _check_order(layout, second)


def test_a_partition_count_below_the_super_streams_or_a_missing_partition_is_refused(
    spark: Any, url: str, conn: rabbitry.Connection, layout: SuperStream, tmp_path: Path
) -> None:
    _publish(conn, layout, range(30))
    fewer = {"url": url, "superStream": layout.name, "superStreamPartitions": "2"}
    refused = r"option superStreamPartitions: 2, but queue '.*-2' exists"
    # Read with 2 of 3 partitions, the rows of the third were skipped without an error.
    with pytest.raises(Exception, match=refused):
        spark.read.format("rabbitmq").options(**fewer).load().count()
    query = None
    with pytest.raises(Exception, match=refused):
        query = (
            spark.readStream.format("rabbitmq")
            .options(**fewer)
            .load()
            .writeStream.format("noop")
            .option("checkpointLocation", str(tmp_path / "checkpoint"))
            .trigger(availableNow=True)
            .start()
        )
        query.awaitTermination(WAIT)
    if query is not None:
        query.stop()
    keyed = spark.range(10).selectExpr("CAST(id AS STRING) AS key", "CAST(id AS STRING) AS body")
    with pytest.raises(Exception, match=refused):
        keyed.write.format("rabbitmq").options(**fewer).option("partitionKeyColumn", "key").mode(
            "append"
        ).save()
    # A super stream that is not there is named as such, not as a queue option.
    missing = {**fewer, "superStream": f"{layout.name}-nope"}
    with pytest.raises(Exception, match=r"option superStream: partition '.*-nope-0' of super"):
        spark.read.format("rabbitmq").options(**missing).load().count()
    # A key column no row of which could be hashed is refused before a task runs.
    doubles = spark.range(3).selectExpr("CAST(id AS DOUBLE) AS key", "'b' AS body")
    with pytest.raises(Exception, match=r"column 'key' \(partitionKeyColumn\).* got double"):
        doubles.write.format("rabbitmq").options(**_super_options(layout)).option(
            "url", url
        ).option("partitionKeyColumn", "key").mode("append").save()
    # The right count reads every message.
    rows = spark.read.format("rabbitmq").options(**{**fewer, **_super_options(layout)}).load()
    assert rows.count() == 30
