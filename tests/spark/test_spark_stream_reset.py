"""A connection reset in the middle of a stream read: every offset of the range, once.

The reset comes from the TCP fault proxy when the body of a marker message in the
middle of the stream passes through it, so it always lands inside the range read (the
planner's probes read only the stream's head or tail). The connection recovers by
itself; the read must go on from the offset after the last one it yielded.
"""

from __future__ import annotations

import uuid
from typing import TYPE_CHECKING, Any

import pytest
from tests.spark.conftest import broker_address, through
from tests.support.proxy import TcpProxy

from rabbitry import OutgoingMessage
from rabbitry.spark._core import read_stream_range
from rabbitry.spark._options import parse_read_options
from rabbitry.topology import SuperStream, super_stream

if TYPE_CHECKING:
    from collections.abc import Iterator
    from pathlib import Path

    import rabbitry

pytestmark = pytest.mark.timeout(300)

COUNT = 30_000
MARK = 18_000  # the message whose body triggers the reset


def _body(n: int) -> bytes:
    # The marker's body is unique in the stream: "m-<uuid>" is never a number's body.
    return str(n).encode().ljust(100, b".")


class _ResetOnce:
    """A proxy tap that resets every connection once ``pattern`` has passed downstream."""

    def __init__(self, proxy: TcpProxy, pattern: bytes) -> None:
        self.proxy = proxy
        self.pattern = pattern
        self.fired = 0
        self._tail = b""

    def __call__(self, direction: str, data: bytes) -> None:
        if direction != "downstream" or self.fired:
            return
        window = self._tail + data
        self._tail = window[-len(self.pattern) :]
        if self.pattern in window:
            self.fired = self.proxy.reset()


@pytest.fixture
def stream(conn: rabbitry.Connection) -> Iterator[str]:
    name = f"rabbitry-spark-reset-{uuid.uuid4().hex[:10]}"
    conn.channel().queue_declare(name, durable=True, arguments={"x-queue-type": "stream"})
    yield name
    conn.channel().queue_delete(name)


def _fill(conn: rabbitry.Connection, routes: list[tuple[str, str]], marker: bytes) -> None:
    """Publish ``COUNT`` messages to each (exchange, routing key), the ``MARK``-th of
    the first route with body ``marker``."""
    with conn.publisher(max_in_flight=2000) as publisher:
        for index, (exchange, key) in enumerate(routes):
            bodies = [marker if (index == 0 and n == MARK) else _body(n) for n in range(COUNT)]
            outcomes = publisher.publish_batch(
                [OutgoingMessage(b, exchange=exchange, routing_key=key) for b in bodies]
            )
            assert not [o for o in outcomes if o is not None]


def _offsets_once(rows: list[Any], marker: bytes) -> list[int]:
    """The offsets of ``rows`` in order; checks each body is the one of its offset."""
    for row in rows:
        body = bytes(row.body)
        assert body == marker or body == _body(row.offset), (row.offset, body[:20])
    return [row.offset for row in rows]


def test_a_reset_mid_range_read_yields_every_offset_once(
    conn: rabbitry.Connection, stream: str, url: str
) -> None:
    marker = f"m-{uuid.uuid4().hex}".encode()
    _fill(conn, [("", stream)], marker)
    with TcpProxy(*broker_address(url)) as proxy:
        tap = _ResetOnce(proxy, marker)
        proxy.tap(tap)
        options = parse_read_options(
            {"url": through(proxy.url(), url), "queue": stream, "queueType": "stream"}
        )
        offsets: list[int] = []
        for batch in read_stream_range(options, 0, COUNT):
            offsets += batch.column("offset").to_pylist()
        assert tap.fired == 1
    assert offsets == list(range(COUNT))


def test_a_reset_mid_batch_read_of_a_stream_gives_every_offset_once(
    spark: Any, conn: rabbitry.Connection, stream: str, url: str
) -> None:
    marker = f"m-{uuid.uuid4().hex}".encode()
    _fill(conn, [("", stream)], marker)
    with TcpProxy(*broker_address(url)) as proxy:
        tap = _ResetOnce(proxy, marker)
        proxy.tap(tap)
        rows = (
            spark.read.format("rabbitmq")
            .option("url", through(proxy.url(), url))
            .option("queue", stream)
            .option("queueType", "stream")
            .load()
            .select("offset", "body")
            .collect()
        )
        assert tap.fired >= 1
    assert sorted(_offsets_once(rows, marker)) == list(range(COUNT))


def test_a_reset_mid_available_now_query_commits_every_offset_once(
    spark: Any, conn: rabbitry.Connection, stream: str, url: str, tmp_path: Path
) -> None:
    marker = f"m-{uuid.uuid4().hex}".encode()
    _fill(conn, [("", stream)], marker)
    output = str(tmp_path / "out")
    with TcpProxy(*broker_address(url)) as proxy:
        tap = _ResetOnce(proxy, marker)
        proxy.tap(tap)
        query = (
            spark.readStream.format("rabbitmq")
            .option("url", through(proxy.url(), url))
            .option("queue", stream)
            .option("queueType", "stream")
            .option("maxRecordsPerTrigger", str(COUNT))
            .load()
            .select("offset", "body")
            .writeStream.format("parquet")
            .option("path", output)
            .option("checkpointLocation", str(tmp_path / "chk"))
            .trigger(availableNow=True)
            .start()
        )
        query.awaitTermination(240)
        assert query.exception() is None
        assert tap.fired >= 1
    rows = spark.read.parquet(output).collect()
    assert sorted(_offsets_once(rows, marker)) == list(range(COUNT))


def test_a_reset_mid_super_stream_read_gives_every_offset_of_each_partition_once(
    spark: Any, conn: rabbitry.Connection, url: str
) -> None:
    name = f"rabbitry-spark-reset-super-{uuid.uuid4().hex[:10]}"
    topology = super_stream(name, 2)
    topology.apply(conn)
    layout = SuperStream(name, 2)
    try:
        marker = f"m-{uuid.uuid4().hex}".encode()
        _fill(conn, [(name, key) for key in layout.binding_keys], marker)
        with TcpProxy(*broker_address(url)) as proxy:
            tap = _ResetOnce(proxy, marker)
            proxy.tap(tap)
            rows = (
                spark.read.format("rabbitmq")
                .option("url", through(proxy.url(), url))
                .option("superStream", name)
                .option("superStreamPartitions", "2")
                .load()
                .select("queue", "offset", "body")
                .collect()
            )
            assert tap.fired >= 1
        for queue in layout.queues:
            mine = [row for row in rows if row.queue == queue]
            assert sorted(_offsets_once(mine, marker)) == list(range(COUNT)), queue
    finally:
        topology.delete(conn)
