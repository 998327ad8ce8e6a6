"""A classic/quorum streaming query whose sink keeps failing, on a quorum queue.

Every return of a delivery raises its ``x-delivery-count``; at the queue's delivery limit
(20 by default on RabbitMQ 4.x) the broker drops or dead-letters it. A failed run must
return only what Spark had, and a restart that could take a message to the limit is
refused before anything is read.
"""

from __future__ import annotations

import uuid
from typing import TYPE_CHECKING, Any

import pytest
from tests.spark.conftest import publish, settled_depth

if TYPE_CHECKING:
    from collections.abc import Iterator
    from pathlib import Path

    import rabbitry

pytestmark = pytest.mark.timeout(900)


class SinkFailed(RuntimeError):
    pass


@pytest.fixture
def quorum(conn: rabbitry.Connection) -> Iterator[str]:
    name = f"rabbitry-spark-limit-{uuid.uuid4().hex[:10]}"
    conn.channel().queue_declare(name, durable=True, arguments={"x-queue-type": "quorum"})
    yield name
    conn.channel().queue_delete(name)


def _run(spark: Any, queue: str, checkpoint: Path, seen: list[set[int]]) -> BaseException | None:
    """One AvailableNow run whose sink fails on every non-empty batch; its error."""

    def sink(batch: Any, batch_id: int) -> None:
        bodies = {int(bytes(r.body)) for r in batch.collect()}
        if bodies:
            seen.append(bodies)
            raise SinkFailed(f"batch {batch_id}: the sink is down")

    query = (
        spark.readStream.format("rabbitmq")
        .option("queue", queue)
        .option("queueType", "quorum")
        .option("maxMessagesPerBatch", "100")
        .load()
        .writeStream.foreachBatch(sink)
        .option("checkpointLocation", str(checkpoint))
        .trigger(availableNow=True)
        .start()
    )
    try:
        query.awaitTermination(180)
    except Exception as exc:
        return exc
    finally:
        query.stop()
    return None


def _counts(conn: rabbitry.Connection, queue: str) -> dict[int, int]:
    """Each message's ``x-delivery-count`` (0 when absent), taking them off the queue."""
    channel = conn.channel()
    counts: dict[int, int] = {}
    while (message := channel.basic_get(queue)) is not None:
        count = (message.properties.headers or {}).get("x-delivery-count", 0)
        counts[int(bytes(message.body))] = count
        channel.basic_ack(message.delivery_tag)
    channel.close()
    return counts


def test_a_failed_run_returns_only_the_batch_spark_had(
    spark: Any, conn: rabbitry.Connection, quorum: str, tmp_path: Path
) -> None:
    publish(conn, quorum, 300)
    seen: list[set[int]] = []
    error = _run(spark, quorum, tmp_path / "chk", seen)
    assert error is not None and "the sink is down" in str(error)
    assert len(seen) == 1 and len(seen[0]) == 100
    assert settled_depth(conn, quorum) == 300
    counts = _counts(conn, quorum)
    assert sorted(counts) == list(range(300))
    # only the messages of the failed batch went back to the queue (once)
    assert {body for body, count in counts.items() if count} == seen[0]
    assert set(counts.values()) == {0, 1}


@pytest.mark.rabbitmq4
def test_a_failing_sink_restarted_25_times_loses_nothing_on_rabbitmq4(
    spark: Any, conn: rabbitry.Connection, quorum: str, tmp_path: Path
) -> None:
    publish(conn, quorum, 300)
    seen: list[set[int]] = []
    errors: list[str] = []
    for run in range(25):
        error = _run(spark, quorum, tmp_path / "chk", seen)
        assert error is not None
        errors.append(str(error))
        # nothing is ever dropped (the queue has no dead-letter exchange)
        assert settled_depth(conn, quorum) == 300, (run, errors[-1][:300])
    refused = [i for i, text in enumerate(errors) if "DeliveryLimitRefused" in text]
    assert refused, errors[-1][:500]
    first = refused[0]
    # every run before the refusal failed in the sink; every run after it is refused too
    assert all("the sink is down" in text for text in errors[:first])
    assert refused == list(range(first, 25))
    message = errors[first]
    assert f"rabbitmq source {quorum!r}: refusing to restart" in message
    assert "delivery limit 20" in message and "acceptDeliveryCount=true" in message
    counts = _counts(conn, quorum)
    assert sorted(counts) == list(range(300))
    assert max(counts.values()) < 20
