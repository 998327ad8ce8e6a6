"""format("rabbitmq") against the real broker with a local SparkSession (marker ``spark``)."""

from __future__ import annotations

import time
import uuid
from typing import TYPE_CHECKING, Any

import pytest
from tests.spark.conftest import broker_address, depth, publish, settled_depth, through
from tests.support.proxy import TcpProxy

if TYPE_CHECKING:
    from collections.abc import Callable
    from pathlib import Path

    import rabbitry


def _bodies(rows: list[Any]) -> list[int]:
    return [int(bytes(r.body)) for r in rows]


def _left_in(conn: rabbitry.Connection, queue: str) -> str:
    """What a queue that should be empty still holds: bodies, redelivered flags (for a
    failure message; takes the messages off the queue)."""
    channel = conn.channel()
    try:
        left = []
        while (message := channel.basic_get(queue, no_ack=True)) is not None:
            left.append((int(bytes(message.body)), message.redelivered))
    finally:
        channel.close()
    bodies = sorted(body for body, _ in left)
    again = sum(1 for _, redelivered in left if redelivered)
    span = f"bodies {bodies[0]}..{bodies[-1]}" if bodies else "nothing"
    return f"{span} ({len(bodies)}, {again} flagged redelivered)"


def _wait_for(predicate: Callable[[], bool], timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.5)


def _stream(spark: Any, queue: str, **options: Any) -> Any:
    reader = spark.readStream.format("rabbitmq").option("queue", queue)
    for key, value in options.items():
        reader = reader.option(key, str(value))
    return reader.load()


def test_batch_write_then_read(spark: Any, conn: rabbitry.Connection, make_queue: Any) -> None:
    queue = make_queue()
    df = spark.range(2000).repartition(2).selectExpr("cast(id as string) as body")
    df.write.format("rabbitmq").option("routingKey", queue).option("jobId", "job1").mode(
        "append"
    ).save()
    assert depth(conn, queue) == 2000
    rows = (
        spark.read.format("rabbitmq")
        .option("queue", queue)
        .option("numPartitions", "2")
        .load()
        .collect()
    )
    assert sorted(_bodies(rows)) == list(range(2000))
    ids = {r.message_id for r in rows}
    assert len(ids) == 2000 and all(i.startswith("job1:") for i in ids)
    assert all(r.queue == queue and r.routing_key == queue for r in rows)
    assert depth(conn, queue) == 2000  # a batch read leaves the queue as it was


def test_write_with_columns(spark: Any, conn: rabbitry.Connection, make_queue: Any) -> None:
    queue = make_queue()
    df = spark.createDataFrame(
        [(b"a", queue, "id-a", {"k": "v"})],
        "value binary, routing_key string, message_id string, headers map<string,string>",
    )
    df.write.format("rabbitmq").mode("append").save()
    channel = conn.channel()
    message = channel.basic_get(queue, no_ack=True)
    assert message is not None
    assert (message.body, message.properties.message_id) == (b"a", "id-a")
    assert message.properties.headers == {"k": "v"}


def test_write_unknown_column_is_an_error(spark: Any, make_queue: Any) -> None:
    queue = make_queue()
    df = spark.createDataFrame([("a", 1)], "body string, extra int")
    with pytest.raises(Exception, match="unknown column"):
        df.write.format("rabbitmq").option("routingKey", queue).mode("append").save()


def test_write_to_missing_exchange_fails_clearly(spark: Any) -> None:
    missing = f"rabbitry-spark-missing-{uuid.uuid4().hex[:8]}"
    df = spark.range(10).selectExpr("cast(id as string) as body")
    with pytest.raises(Exception, match=f"exchange '{missing}' does not exist"):
        df.write.format("rabbitmq").option("exchange", missing).mode("append").save()


def test_read_option_error_names_the_option(spark: Any) -> None:
    with pytest.raises(Exception, match="option prefetch"):
        spark.read.format("rabbitmq").option("queue", "q").option(
            "prefetch", "ten"
        ).load().collect()


def test_available_now_drain_leaves_queue_empty(
    spark: Any, conn: rabbitry.Connection, make_queue: Any, tmp_path: Path
) -> None:
    queue = make_queue()
    publish(conn, queue, 3000)
    name = f"drain_{uuid.uuid4().hex[:8]}"
    query = (
        _stream(spark, queue, maxMessagesPerBatch=1000)
        .writeStream.format("memory")
        .queryName(name)
        .option("checkpointLocation", str(tmp_path / "chk"))
        .trigger(availableNow=True)
        .start()
    )
    query.awaitTermination(120)
    rows = spark.table(name).collect()
    assert sorted(_bodies(rows)) == list(range(3000))
    # The last batch was acked too: after the query (and its consumer) ended nothing
    # came back to the queue.
    assert settled_depth(conn, queue) == 0


def test_prefetch_equal_to_batch_size_does_not_deadlock(
    spark: Any, conn: rabbitry.Connection, make_queue: Any, tmp_path: Path
) -> None:
    # Acking only in commit() stalls here: Spark commits batch N to the source only once
    # it planned a non-empty batch N+1, and the broker sends nothing while prefetch is full.
    queue = make_queue()
    publish(conn, queue, 1500)
    name = f"deadlock_{uuid.uuid4().hex[:8]}"
    query = (
        _stream(spark, queue, maxMessagesPerBatch=500, prefetch=500)
        .writeStream.format("memory")
        .queryName(name)
        .option("checkpointLocation", str(tmp_path / "chk"))
        .trigger(processingTime="500 milliseconds")
        .start()
    )
    try:
        _wait_for(lambda: spark.table(name).count() >= 1500, 90, "1500 rows")
        _wait_for(lambda: depth(conn, queue) == 0, 30, "the queue to be empty")
    finally:
        query.stop()
    assert sorted(_bodies(spark.table(name).collect())) == list(range(1500))


def test_sink_failure_then_restart_loses_nothing_quorum(
    spark: Any, conn: rabbitry.Connection, make_queue: Any, tmp_path: Path
) -> None:
    queue = make_queue("quorum")
    publish(conn, queue, 1000)
    checkpoint = str(tmp_path / "chk")
    seen: list[Any] = []

    def failing(batch: Any, batch_id: int) -> None:
        rows = batch.collect()
        if batch_id == 1:
            raise RuntimeError("sink failed")
        seen.extend(rows)

    query = (
        _stream(spark, queue, maxMessagesPerBatch=400, queueType="quorum")
        .writeStream.foreachBatch(failing)
        .option("checkpointLocation", checkpoint)
        .trigger(availableNow=True)
        .start()
    )
    with pytest.raises(Exception, match="sink failed"):
        query.awaitTermination(120)
    assert len(seen) == 400
    _wait_for(lambda: depth(conn, queue) == 600, 30, "the failed batch to be requeued")

    def keep(batch: Any, batch_id: int) -> None:
        seen.extend(batch.collect())

    query = (
        _stream(spark, queue, maxMessagesPerBatch=400, queueType="quorum")
        .writeStream.foreachBatch(keep)
        .option("checkpointLocation", checkpoint)
        .trigger(availableNow=True)
        .start()
    )
    query.awaitTermination(120)
    bodies = _bodies(seen)
    assert sorted(set(bodies)) == list(range(1000))  # missing = 0
    assert len(bodies) == 1000  # the failed batch was never handed to the sink
    redelivered = [r for r in seen if r.redelivered]
    # the failed batch and the prefetched rest came back flagged
    assert set(range(400, 800)) <= set(_bodies(redelivered))
    assert all(r.delivery_count and r.delivery_count >= 1 for r in redelivered)
    left = settled_depth(conn, queue)
    assert left == 0, f"{left} message(s) left unacknowledged: {_left_in(conn, queue)}"


def test_stream_queue_partitioned_read(
    spark: Any, conn: rabbitry.Connection, make_queue: Any, tmp_path: Path
) -> None:
    queue = make_queue("stream")
    publish(conn, queue, 3000)
    name = f"stream_{uuid.uuid4().hex[:8]}"
    query = (
        _stream(
            spark,
            queue,
            queueType="stream",
            maxRecordsPerTrigger=1000,
            numPartitions=2,
            startingOffsets="earliest",
        )
        .writeStream.format("memory")
        .queryName(name)
        .option("checkpointLocation", str(tmp_path / "chk"))
        .trigger(availableNow=True)
        .start()
    )
    query.awaitTermination(120)
    rows = spark.table(name).collect()
    assert sorted(r.offset for r in rows) == list(range(3000))
    assert sorted(_bodies(rows)) == list(range(3000))
    # batch read of an offset range
    rows = (
        spark.read.format("rabbitmq")
        .option("queue", queue)
        .option("queueType", "stream")
        .option("startingOffsets", "100")
        .option("endingOffsets", "250")
        .option("numPartitions", "2")
        .load()
        .collect()
    )
    assert sorted(r.offset for r in rows) == list(range(100, 250))


def test_writer_task_retry_duplicates_are_identifiable(
    spark: Any, conn: rabbitry.Connection, make_queue: Any
) -> None:
    from pyspark.sql import functions as F
    from pyspark.sql.types import StringType

    def fail_first_attempt(n: int) -> str:
        from pyspark import TaskContext

        context = TaskContext.get()
        if n % 10_000 == 9_000 and context is not None and context.attemptNumber() == 0:
            raise RuntimeError("injected task failure")
        return str(n)

    queue = make_queue()
    body = F.udf(fail_first_attempt, StringType(), useArrow=False)
    df = spark.range(0, 20_000, numPartitions=2).select(body("id").alias("body"))
    # small Arrow batches: the writer publishes rows before the UDF fails further on
    spark.conf.set("spark.sql.execution.arrow.maxRecordsPerBatch", "100")
    try:
        df.write.format("rabbitmq").option("routingKey", queue).option("jobId", "retry").option(
            "maxInFlight", "50"
        ).mode("append").save()
    finally:
        spark.conf.unset("spark.sql.execution.arrow.maxRecordsPerBatch")
    channel = conn.channel()
    ids: list[str] = []
    bodies: set[bytes] = set()
    for message in channel.consume(queue, prefetch=5000, timeout=2):
        ids.append(message.properties.message_id or "")
        bodies.add(message.body)
        message.ack()
    assert len(bodies) == 20_000  # nothing lost
    assert len(set(ids)) == 20_000  # each row has one id, retries reuse it
    # the first attempts published (and got confirmed) rows before the injected failure;
    # their retries published them again with the same ids
    assert len(ids) > 20_000, "no duplicates: the injected failure came before any publish"


def test_connection_drop_mid_batch_loses_nothing(
    spark: Any, conn: rabbitry.Connection, make_queue: Any, tmp_path: Path, url: str
) -> None:
    queue = make_queue()
    publish(conn, queue, 3000)
    name = f"proxy_{uuid.uuid4().hex[:8]}"
    with TcpProxy(*broker_address(url)) as proxy:
        query = (
            _stream(spark, queue, maxMessagesPerBatch=300, url=through(proxy.url(), url))
            .writeStream.format("memory")
            .queryName(name)
            .option("checkpointLocation", str(tmp_path / "chk"))
            .trigger(processingTime="300 milliseconds")
            .start()
        )
        try:
            _wait_for(lambda: spark.table(name).count() >= 600, 90, "600 rows")
            assert proxy.reset() >= 1
            _wait_for(
                lambda: len(set(_bodies(spark.table(name).collect()))) == 3000,
                90,
                "all 3000 messages after the drop",
            )
        finally:
            query.stop()
    rows = spark.table(name).collect()
    assert sorted(set(_bodies(rows))) == list(range(3000))
    counts: dict[int, int] = {}
    for body in _bodies(rows):
        counts[body] = counts.get(body, 0) + 1
    duplicated = {body for body, count in counts.items() if count > 1}
    # at-least-once: a duplicate is a redelivery of a batch whose ack was lost with the
    # connection, and it is flagged
    assert {int(bytes(r.body)) for r in rows if r.redelivered} >= duplicated


def test_streaming_write_queue_to_queue(
    spark: Any, conn: rabbitry.Connection, make_queue: Any, tmp_path: Path
) -> None:
    source, target = make_queue(), make_queue()
    publish(conn, source, 1000)
    query = (
        _stream(spark, source, maxMessagesPerBatch=400)
        .selectExpr("body", "headers")
        .writeStream.format("rabbitmq")
        .option("routingKey", target)
        .option("checkpointLocation", str(tmp_path / "chk"))
        .trigger(availableNow=True)
        .start()
    )
    query.awaitTermination(120)
    channel = conn.channel()
    ids: list[str] = []
    bodies: list[int] = []
    for message in channel.consume(target, prefetch=1000, timeout=2):
        ids.append(message.properties.message_id or "")
        bodies.append(int(message.body))
        message.ack()
    assert sorted(bodies) == list(range(1000))
    # {queryId}:{batchId}:{partition}:{index}
    assert {i.split(":")[0] for i in ids} == {query.id}
    assert {int(i.split(":")[1]) for i in ids} == {0, 1, 2}
    assert len(set(ids)) == 1000
    assert settled_depth(conn, source) == 0
