"""Batch reads of classic and quorum queues leave the queue as it was (marker ``spark``)."""

from __future__ import annotations

import threading
import time
import uuid
from typing import TYPE_CHECKING, Any

import pytest
from tests.spark.conftest import consumers, depth, publish

if TYPE_CHECKING:
    import rabbitry

pytest.importorskip("pyspark")
pytest.importorskip("pyarrow")
# Several Spark jobs per test; the first test of a session also starts Spark.
pytestmark = pytest.mark.timeout(300)

# More than the default prefetch (2000): a read must not stop at the prefetch.
_TOTAL = 5000


def _read(spark: Any, queue: str, **options: Any) -> Any:
    reader = spark.read.format("rabbitmq").option("queue", queue)
    for key, value in options.items():
        reader = reader.option(key, str(value))
    return reader.load()


def _bodies(rows: list[Any]) -> list[int]:
    return [int(bytes(r.body)) for r in rows]


def _queue_order(conn: rabbitry.Connection, queue: str) -> list[int]:
    """The queue's messages in delivery order, left in the queue."""
    channel = conn.channel()
    try:
        order = []
        for message in channel.consume(queue, prefetch=_TOTAL + 10, timeout=2):
            order.append(int(message.body))
            if len(order) == _TOTAL:
                break
        channel.basic_nack(0, multiple=True, requeue=True)
        return order
    finally:
        channel.close()


def test_limit_count_collect_leave_the_queue_as_it_was(
    spark: Any, conn: rabbitry.Connection, make_queue: Any
) -> None:
    queue = make_queue()
    publish(conn, queue, _TOTAL)
    df = _read(spark, queue)
    assert len(df.limit(5).collect()) == 5
    assert depth(conn, queue) == _TOTAL
    assert df.count() == _TOTAL
    rows = df.collect()
    assert sorted(_bodies(rows)) == list(range(_TOTAL))
    assert sorted(r.offset for r in rows) == list(range(_TOTAL))
    assert depth(conn, queue) == _TOTAL
    # requeued messages went back to their places: the queue's order is unchanged
    assert _queue_order(conn, queue) == list(range(_TOTAL))


def test_partitions_split_the_queue_each_message_once(
    spark: Any, conn: rabbitry.Connection, make_queue: Any
) -> None:
    queue = make_queue()
    publish(conn, queue, _TOTAL)
    df = _read(spark, queue, numPartitions=3)
    assert df.rdd.getNumPartitions() == 3
    rows = df.collect()
    assert sorted(_bodies(rows)) == list(range(_TOTAL))  # no duplicate, nothing missing
    # partition i holds positions [start_i, end_i) of the queue as planned
    assert _bodies(sorted(rows, key=lambda r: r.offset)) == list(range(_TOTAL))
    assert depth(conn, queue) == _TOTAL


def test_a_failed_job_leaves_the_queue_as_it_was(
    spark: Any, conn: rabbitry.Connection, make_queue: Any
) -> None:
    from pyspark.sql import functions as F

    def fail(body: bytes) -> str:
        raise RuntimeError("later stage failed")

    queue = make_queue()
    publish(conn, queue, 1000)
    broken = F.udf(fail, "string", useArrow=False)
    with pytest.raises(Exception, match="later stage failed"):
        _read(spark, queue).repartition(2).select(broken("body")).collect()
    assert depth(conn, queue) == 1000
    assert sorted(_bodies(_read(spark, queue).collect())) == list(range(1000))


def test_a_read_beyond_the_largest_prefetch_returns_everything(
    spark: Any, conn: rabbitry.Connection, make_queue: Any
) -> None:
    # The prefetch count is a 16-bit field: past 65,535 held deliveries a partition
    # fetches the rest with basic.get.
    queue = make_queue()
    total = 70_000
    publish(conn, queue, total)
    rows = _read(spark, queue).select("body", "offset").collect()
    assert sorted(_bodies(rows)) == list(range(total))
    assert depth(conn, queue) == total


def test_destructive_read_consumes_everything_it_returns(
    spark: Any, conn: rabbitry.Connection, make_queue: Any
) -> None:
    queue = make_queue()
    publish(conn, queue, _TOTAL)
    rows = _read(spark, queue, consume="destructive", numPartitions=2).collect()
    assert sorted(_bodies(rows)) == list(range(_TOTAL))
    assert depth(conn, queue) == 0


def test_quorum_read_needs_accept_delivery_count(
    spark: Any, conn: rabbitry.Connection, make_queue: Any
) -> None:
    queue = make_queue("quorum")
    publish(conn, queue, 1000)
    with pytest.raises(Exception, match="option acceptDeliveryCount") as info:
        _read(spark, queue, queueType="quorum").collect()
    assert "delivery limit" in str(info.value)
    assert depth(conn, queue) == 1000
    with pytest.raises(Exception, match="option numPartitions: a batch read of quorum queue"):
        _read(spark, queue, queueType="quorum", acceptDeliveryCount="true", numPartitions=2).count()
    with pytest.raises(Exception, match="option deliveryLimit"):
        _read(spark, queue, queueType="quorum", acceptDeliveryCount="true").count()
    rows = _read(
        spark, queue, queueType="quorum", acceptDeliveryCount="true", deliveryLimit=20
    ).collect()
    assert sorted(_bodies(rows)) == list(range(1000))
    assert depth(conn, queue) == 1000
    # each read returned every message: all delivery counts went up alike
    again = _read(
        spark, queue, queueType="quorum", acceptDeliveryCount="true", deliveryLimit=20
    ).collect()
    assert sorted(_bodies(again)) == list(range(1000))
    counts = {r.delivery_count for r in again}
    assert len(counts) == 1 and counts.pop() >= 1


def test_a_queue_with_consumers_is_refused(
    spark: Any, conn: rabbitry.Connection, make_queue: Any
) -> None:
    queue = make_queue()
    publish(conn, queue, 10)
    channel = conn.channel()
    channel.basic_qos(1)
    channel.basic_consume(queue, lambda message: None)
    with pytest.raises(Exception, match=r"has 1 consumer\(s\)"):
        _read(spark, queue).collect()
    channel.close()
    assert depth(conn, queue) == 10


def test_missing_queue_names_the_option(spark: Any) -> None:
    missing = f"rabbitry-spark-missing-{uuid.uuid4().hex[:8]}"
    with pytest.raises(Exception, match=f"option queue: queue '{missing}' does not exist"):
        _read(spark, missing).collect()


def test_a_cancelled_job_leaves_the_queue_as_it_was(
    spark: Any, conn: rabbitry.Connection, make_queue: Any
) -> None:
    queue = make_queue()
    total = 3000
    with conn.publisher(max_in_flight=1000) as publisher:
        outcomes = publisher.publish_batch([b"%d" % n for n in range(total)], routing_key=queue)
        # A classic queue drops an expired message only when it reaches the head, so the
        # planner counts this one and the read, holding every other message, waits for it
        # until the job is cancelled: the cancel always lands while the queue is held.
        publisher.publish(b"expires", routing_key=queue, expiration=1).result(30)
    assert not [o for o in outcomes if o is not None]
    group = f"cancel-{uuid.uuid4().hex[:8]}"
    failure: list[BaseException] = []

    def run() -> None:
        spark.sparkContext.setJobGroup(group, "cancelled batch read", interruptOnCancel=True)
        try:
            _read(spark, queue, pollTimeoutMs=600_000).collect()
        except Exception as exc:
            failure.append(exc)

    job = threading.Thread(target=run)
    job.start()
    _wait_for(
        lambda: consumers(conn, queue) == 1 and depth(conn, queue) == 0,
        120,
        "the read to hold every message",
        seen=lambda: f"{consumers(conn, queue)} consumer(s), {depth(conn, queue)} ready",
    )
    spark.sparkContext.cancelJobGroup(group)
    job.join(120)
    assert not job.is_alive(), "the cancelled job did not end"
    assert failure, "the job was not cancelled"
    _wait_for(lambda: consumers(conn, queue) == 0, 60, "the cancelled read to let go")
    assert depth(conn, queue) == total
    assert sorted(_bodies(_read(spark, queue).collect())) == list(range(total))


def _wait_for(predicate: Any, timeout: float, what: str, *, seen: Any = None) -> None:
    """Wait for ``predicate``; on timeout, say what ``seen()`` (if given) shows then."""
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            now = f" (now: {seen()})" if seen is not None else ""
            raise AssertionError(f"timed out waiting for {what}{now}")
        time.sleep(0.2)
