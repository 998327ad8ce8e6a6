"""A classic/quorum streaming query while its broker restarts (a private node).

The query waits for the broker (up to ``recoveryTimeoutMs``) and goes on: nothing
missing, and a message read twice only as a redelivery of a batch whose acks died with
the old connection (flagged ``redelivered``). Past the wait it fails, naming it.
"""

from __future__ import annotations

import time
import uuid
from typing import TYPE_CHECKING, Any

import pytest
from tests.support.node import BrokerNode

import rabbitry

if TYPE_CHECKING:
    from collections.abc import Callable, Iterator
    from pathlib import Path

pytestmark = pytest.mark.timeout(400)

COUNT = 3000


@pytest.fixture
def node() -> Iterator[BrokerNode]:
    broker = BrokerNode()
    try:
        broker.start()
        yield broker
    finally:
        broker.stop()


def _wait_for(predicate: Callable[[], bool], timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.5)


def _fill(url: str, kind: str) -> str:
    queue = f"rabbitry-spark-restart-{kind}-{uuid.uuid4().hex[:8]}"
    with rabbitry.Connection(url) as conn:
        conn.channel().queue_declare(queue, durable=True, arguments={"x-queue-type": kind})
        with conn.publisher(max_in_flight=1000) as publisher:
            outcomes = publisher.publish_batch(
                [str(n).encode() for n in range(COUNT)], routing_key=queue, persistent=True
            )
    assert not [o for o in outcomes if o is not None]
    return queue


def _query(
    spark: Any, url: str, queue: str, kind: str, path: Path, sink: Any, **options: str
) -> Any:
    reader = (
        spark.readStream.format("rabbitmq")
        .option("url", url)
        .option("queue", queue)
        .option("queueType", kind)
        .option("maxMessagesPerBatch", "200")
    )
    for key, value in options.items():
        reader = reader.option(key, value)
    return (
        reader.load()
        .writeStream.foreachBatch(sink)
        .option("checkpointLocation", str(path / "chk"))
        .trigger(processingTime="300 milliseconds")
        .start()
    )


@pytest.mark.parametrize("kind", ["classic", "quorum"])
def test_a_streaming_query_waits_for_a_restarted_broker_and_goes_on(
    spark: Any, node: BrokerNode, tmp_path: Path, kind: str
) -> None:
    queue = _fill(node.url, kind)
    batches: dict[int, list[tuple[int, bool]]] = {}

    def sink(batch: Any, batch_id: int) -> None:
        batches[batch_id] = [(int(bytes(r.body)), r.redelivered) for r in batch.collect()]

    def bodies() -> list[tuple[int, bool]]:
        return [row for rows in list(batches.values()) for row in rows]

    query = _query(spark, node.url, queue, kind, tmp_path, sink)
    try:
        _wait_for(lambda: len(bodies()) >= 600, 120, "600 rows")
        node.restart()
        _wait_for(
            lambda: len({body for body, _ in bodies()}) == COUNT or not query.isActive,
            180,
            "every message after the restart",
        )
        assert query.isActive, query.exception()
    finally:
        query.stop()
    rows = bodies()
    ids = [body for body, _ in rows]
    assert sorted(set(ids)) == list(range(COUNT))
    twice = {body for body in ids if ids.count(body) > 1}
    assert twice <= {body for body, redelivered in rows if redelivered}


def test_a_streaming_query_fails_naming_its_wait_when_the_broker_stays_away(
    spark: Any, node: BrokerNode, tmp_path: Path
) -> None:
    from pyspark.errors import StreamingQueryException

    queue = _fill(node.url, "classic")
    seen: list[int] = []

    def sink(batch: Any, batch_id: int) -> None:
        seen.append(batch.count())

    query = _query(spark, node.url, queue, "classic", tmp_path, sink, recoveryTimeoutMs="3000")
    try:
        _wait_for(lambda: sum(seen) >= 600, 120, "600 rows")
        node.stop(keep_data=True)
        with pytest.raises(StreamingQueryException) as failure:
            query.awaitTermination(120)
    finally:
        query.stop()
    message = str(failure.value)
    assert "BrokerUnavailable" in message
    assert "within recoveryTimeoutMs (3000 ms" in message


@pytest.mark.parametrize("value", ["-1", "soon", "86400001"])
def test_recovery_timeout_is_refused_when_not_a_number_of_milliseconds(value: str) -> None:
    from rabbitry.exceptions import ConfigurationError
    from rabbitry.spark._options import parse_read_options

    with pytest.raises(ConfigurationError, match="option recoveryTimeoutMs: "):
        parse_read_options({"queue": "q", "recoveryTimeoutMs": value})


def test_recovery_timeout_defaults_to_five_minutes() -> None:
    from rabbitry.spark._options import parse_read_options

    assert parse_read_options({"queue": "q"}).recovery_timeout == 300.0
    assert parse_read_options({"queue": "q", "recoveryTimeoutMs": "0"}).recovery_timeout == 0.0
