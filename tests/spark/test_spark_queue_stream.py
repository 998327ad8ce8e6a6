"""Streaming reads of classic queues: replays, graceful restarts (marker ``spark``)."""

from __future__ import annotations

import subprocess
import sys
import time
from typing import TYPE_CHECKING, Any

import pytest
from tests.spark.conftest import consumers, depth, publish, settled_depth

if TYPE_CHECKING:
    from pathlib import Path

    import rabbitry

pytest.importorskip("pyspark")
pytest.importorskip("pyarrow")

from pyspark.sql.datasource import CaseInsensitiveDict
from pyspark.sql.types import StructType

from rabbitry.spark import RabbitMQDataSource
from rabbitry.spark._core import QueueConsumer, ReplayUnavailable
from rabbitry.spark._options import parse_read_options

# Several Spark jobs per test; the first test of a session also starts Spark.
pytestmark = pytest.mark.timeout(300)


def _wait_for(predicate: Any, timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.5)


def test_replay_of_a_batch_still_held_raises(
    url: str, conn: rabbitry.Connection, make_queue: Any
) -> None:
    queue = make_queue()
    publish(conn, queue, 10)
    options = {"url": url, "queue": queue, "pollTimeoutMs": "5000"}
    consumer = QueueConsumer(parse_read_options(options))
    rows, end = consumer.read(0)
    assert end == len(rows) > 0
    planned = {"seq": end, "session": consumer.session}
    replayer = RabbitMQDataSource(CaseInsensitiveDict(options)).simpleStreamReader(StructType())
    try:
        # the session that read the batch still holds it: an empty replay would lose it
        with pytest.raises(ReplayUnavailable, match="still held by the live source session"):
            replayer.readBetweenOffsets({"seq": 0}, planned)
    finally:
        consumer.close()
    # the session is gone, its deliveries are back in the queue: the replay is empty
    assert list(replayer.readBetweenOffsets({"seq": 0}, planned)) == []
    assert depth(conn, queue) == 10


# The last read of an AvailableNow run, as Spark's source process makes it, and then the
# end Spark gives that process: it is killed (SIGTERM, no handler) as soon as the read
# has returned. SIGKILL right after the return is the same, without the luck of timing.
_FINAL_READ_THEN_KILLED = """
import os, signal, sys
from rabbitry.spark._core import QueueConsumer
from rabbitry.spark._options import parse_read_options

consumer = QueueConsumer(parse_read_options(
    {"url": sys.argv[1], "queue": sys.argv[2], "maxMessagesPerBatch": "400"}
))
assert consumer.prepare_available_now() == 400
_, end = consumer.read(0)
assert end == 400
assert consumer.read(end) == ([], end)  # acks the batch; nothing is left to read
os.kill(os.getpid(), signal.SIGKILL)
"""


def test_the_acks_of_a_read_are_applied_by_the_broker_before_it_returns(
    url: str, conn: rabbitry.Connection, make_queue: Any
) -> None:
    queue = make_queue()
    publish(conn, queue, 400)
    child = subprocess.run(
        [sys.executable, "-c", _FINAL_READ_THEN_KILLED, url, queue],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert child.returncode == -9, child.stderr
    # the batch was in Spark's commit log when the read acked it: it must not come back
    assert settled_depth(conn, queue) == 0


def test_graceful_stop_and_restart_lose_nothing(
    spark: Any, conn: rabbitry.Connection, make_queue: Any, tmp_path: Path
) -> None:
    queue = make_queue()
    publish(conn, queue, 3000)
    checkpoint = str(tmp_path / "chk")
    # an idempotent sink: a replayed batch id replaces what that batch wrote before
    batches: dict[int, list[tuple[int, bool]]] = {}

    def sink(batch: Any, batch_id: int) -> None:
        batches[batch_id] = [(int(bytes(r.body)), r.redelivered) for r in batch.collect()]

    def start(**trigger: Any) -> Any:
        return (
            spark.readStream.format("rabbitmq")
            .option("queue", queue)
            .option("maxMessagesPerBatch", "300")
            .load()
            .writeStream.foreachBatch(sink)
            .option("checkpointLocation", checkpoint)
            .trigger(**trigger)
            .start()
        )

    query = start(processingTime="200 milliseconds")
    try:
        # stops right after a batch was handed to the sink: the window in which its
        # commit is written but its acknowledgement not yet sent
        _wait_for(lambda: sum(map(len, batches.values())) >= 900, 120, "900 rows")
    finally:
        query.stop()
    # AvailableNow reads what is ready when it starts: let the stopped source's
    # connection go (its unacknowledged deliveries are requeued then) before restarting.
    _wait_for(lambda: consumers(conn, queue) == 0, 30, "the stopped source to disconnect")
    query = start(availableNow=True)
    query.awaitTermination(180)
    rows = [row for batch in batches.values() for row in batch]
    ids = [body for body, _ in rows]
    assert set(ids) == set(range(3000))  # nothing lost
    twice = {body for body in ids if ids.count(body) > 1}
    # at-least-once: a batch committed by Spark whose ack the stop cut off is delivered
    # again, flagged; at most that one batch
    assert len(twice) <= 300
    assert twice <= {body for body, redelivered in rows if redelivered}
    assert settled_depth(conn, queue) == 0
