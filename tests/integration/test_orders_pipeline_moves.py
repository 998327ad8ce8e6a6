"""The reference pipeline's retries and parked records, sent from the driver.

``_Job._publish_moves`` is what ``foreachBatch`` calls for the failed records of a
micro-batch; these tests drive it against the broker without Spark.
"""

from __future__ import annotations

import time
import uuid
from typing import TYPE_CHECKING, Any

import pytest

import rabbitry
from orders_pipeline import PipelineConfig, build_topology
from orders_pipeline._pipeline import PipelineError, _Job
from rabbitry import OutgoingMessage
from rabbitry.topology import ATTEMPTS_HEADER, PARKED_REASON_HEADER

if TYPE_CHECKING:
    from collections.abc import Iterator


@pytest.fixture
def job(url: str) -> Iterator[_Job]:
    config = PipelineConfig(
        url=url, run_id=uuid.uuid4().hex[:10], prefix="rabbitry-test-moves", progress=False
    )
    topology = build_topology(config.names, config.policy)
    with rabbitry.Connection(url) as conn:
        topology.apply(conn)
        job = _Job(None, config)  # type: ignore[arg-type]  # Spark is not needed here
        try:
            yield job
        finally:
            job.close()
            topology.delete(conn)


def _row(message_id: str, status: str, attempt: int) -> dict[str, Any]:
    return {
        "message_id": message_id,
        "body": b'{"order_id": "o-1"}',
        "headers": {"x-death": "[]", "x-demo-fault": "transient"},
        "exchange": "orders",
        "routing_key": "order.created.eu",
        "status": status,
        "reason": "amount must be > 0" if status == "invalid" else None,
        "attempt": attempt,
        "currency": "EUR",
    }


def _get(conn: rabbitry.Connection, queue: str, deadline: float) -> rabbitry.Message:
    channel = conn.channel()
    try:
        while (message := channel.basic_get(queue, no_ack=True)) is None:
            assert time.monotonic() < deadline, f"nothing arrived in {queue!r}"
            time.sleep(0.05)
        return message
    finally:
        channel.close()


def test_a_retry_and_a_parked_record_are_confirmed_where_the_policy_sends_them(
    job: _Job, url: str
) -> None:
    retry, kind = job._move(_row("m-retry", "transient", attempt=0))
    assert kind == "retry"
    park, kind = job._move(_row("m-park", "invalid", attempt=0))
    assert kind == "park"
    job._publish_moves([retry, park])

    deadline = time.monotonic() + 60
    with rabbitry.Connection(url) as conn:
        parked = _get(conn, job.policy.names().parking_lot or "", deadline)
        assert parked.properties.message_id == "m-park"
        headers = parked.properties.headers or {}
        assert headers[PARKED_REASON_HEADER] == "not-retryable"
        assert headers[ATTEMPTS_HEADER] == 1
        assert "x-death" not in headers  # the broker's own header is not sent back
        # The retry waits out its tier, then the broker dead-letters it to the work queue.
        back = _get(conn, job.names.work, deadline)
        assert back.properties.message_id == "m-retry"
        assert back.body == b'{"order_id": "o-1"}'
        assert (back.properties.headers or {})[ATTEMPTS_HEADER] == 1


def test_a_move_no_queue_takes_fails_the_batch(job: _Job) -> None:
    lost = OutgoingMessage(b"{}", routing_key="no-such-tier")
    with pytest.raises(PipelineError, match=r"1 of 2 retry or parking move\(s\) were not"):
        job._publish_moves([job._move(_row("m-park", "invalid", attempt=0))[0], lost])


def test_an_invalid_order_is_parked_even_with_attempts_left(job: _Job) -> None:
    move, kind = job._move(_row("m-bad", "invalid", attempt=1))
    assert kind == "park"
    assert (move.properties.headers or {})[PARKED_REASON_HEADER] == "not-retryable"
