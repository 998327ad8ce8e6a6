"""The reference pipeline's streaming deduplication: bounded state, nothing dropped as late.

The job (``orders_pipeline._pipeline._Job``) runs on the shared SparkSession against the
broker, with a one-second ``dedup_window``; valid orders are published in three rounds,
more than two windows apart, and the test waits for each round to be aggregated.
"""

from __future__ import annotations

import time
import uuid
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any

import pytest

from orders_pipeline import Mix, PipelineConfig, build_topology, generate
from orders_pipeline._pipeline import _NO_DATA_BATCHES, _Job
from rabbitry import OutgoingMessage, Properties

if TYPE_CHECKING:
    from pathlib import Path

    import rabbitry
    from orders_pipeline import Event

_ROUND = 10
_WAIT = 120.0


def _message(event: Event, timestamp: datetime | None = None) -> OutgoingMessage:
    return OutgoingMessage(
        event.body,
        routing_key=event.routing_key,
        properties=Properties(
            message_id=event.message_id, content_type="application/json", timestamp=timestamp
        ),
    )


def _wait_done(job: _Job, ids: set[str]) -> None:
    deadline = time.monotonic() + _WAIT
    while True:
        if job.failure is not None:
            raise job.failure
        with job.counters.lock:
            missing = ids - job.counters.done_ids
        if not missing:
            return
        if time.monotonic() > deadline:
            pytest.fail(f"{len(missing)} order(s) not aggregated within {_WAIT} s")
        time.sleep(0.1)


def _reports(query: Any, rows: int) -> list[Any]:
    deadline = time.monotonic() + _WAIT
    while True:
        progress = list(query.recentProgress)
        if sum(p.numInputRows for p in progress) >= rows:
            return progress
        if time.monotonic() > deadline:
            pytest.fail(f"the progress reports do not account for {rows} rows: {progress}")
        time.sleep(0.1)


@pytest.mark.timeout(300)
def test_dedup_forgets_pairs_after_its_window_and_drops_no_row_as_late(
    spark: Any, conn: rabbitry.Connection, url: str, tmp_path: Path
) -> None:
    run_id = uuid.uuid4().hex[:10]
    config = PipelineConfig(
        url=url,
        output_dir=tmp_path,
        run_id=run_id,
        prefix="rabbitry-spark-dedup",
        dedup_window=1,
        progress=False,
    )
    quiet = Mix(malformed=0, invalid=0, transient=0, poison=0, unroutable=0, duplicates=0)
    events = generate(3 * _ROUND, run_id=run_id, mix=quiet).events
    assert len(events) == 3 * _ROUND
    rounds = [events[i : i + _ROUND] for i in range(0, len(events), _ROUND)]
    topology = build_topology(config.names, config.policy)
    topology.apply(conn)
    assert spark.conf.get(_NO_DATA_BATCHES, None) is None
    job = _Job(spark, config)
    query = job.start()
    try:
        # The query keeps its own copy of the setting; the session is left as it was.
        assert spark.conf.get(_NO_DATA_BATCHES, None) is None
        with conn.publisher(timeout=30) as publisher:
            for number, batch in enumerate(rounds):
                messages = [_message(event) for event in batch]
                if number == 0:
                    # A copy published right behind its original: the same micro-batch
                    # or the next one, inside the window however long a batch takes
                    # (the watermark runs one batch behind).
                    messages.append(_message(batch[0]))
                if number == 2:
                    # A message stamped long ago is not late: the window runs on the
                    # processing time, not on the message's own timestamp.
                    messages[-1] = _message(batch[-1], datetime(1970, 1, 2, tzinfo=UTC))
                outcomes = publisher.publish_batch(
                    messages, exchange=config.names.exchange, persistent=True
                )
                assert outcomes == [None] * len(messages)
                _wait_done(job, {event.message_id for event in batch})
                if number < 2:
                    # More than two windows between the rounds' batches: a batch is
                    # stamped when its trigger starts, and the source may wait up to its
                    # 1 s poll timeout there before the round's first message arrives.
                    time.sleep(3.5)
        # A batch's progress is posted after foreachBatch returned and Spark committed
        # it: wait until the reports account for every message delivered.
        progress = _reports(query, 3 * _ROUND + 1)
    finally:
        query.stop()
        job.close()
        topology.delete(conn)

    with job.counters.lock:
        assert job.counters.rows == 3 * _ROUND  # the copy was dropped, nothing else
    batches = [p for p in progress if "addBatch" in p.durationMs]
    # No empty micro-batch ran to evict state: the next batch with rows does it.
    assert all(p.numInputRows for p in batches)
    operators = [op for p in batches for op in p.stateOperators]
    assert operators
    assert sum(op.numRowsDroppedByWatermark for op in operators) == 0
    # The first round's pairs are gone once the third round's batch ran; plain
    # dropDuplicates would still hold all 30.
    assert batches[-1].stateOperators[0].numRowsTotal <= 2 * _ROUND
