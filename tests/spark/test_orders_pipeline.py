"""The reference pipeline (``make demo``) at a small size, with exact accounting.

Checks the outcome against the generator's own plan and against the broker: every valid
order aggregated exactly once (Parquet totals equal totals computed here), every invalid
or still-failing one in the parking lot once, every deliberate duplicate dropped,
unroutable messages kept by the alternate exchange, no queue left with messages. The
same run through a super stream of 4 partitions (``--partitions 4``) also checks that
each order is in its customer's partition.
"""

from __future__ import annotations

import uuid
from collections import Counter
from typing import TYPE_CHECKING, Any

import pytest

from orders_pipeline import PipelineConfig, build_topology, generate, run
from rabbitry.topology import ATTEMPTS_HEADER, PARKED_REASON_HEADER, SuperStream

if TYPE_CHECKING:
    from pathlib import Path

    import rabbitry
    from orders_pipeline import EventPlan


def _drain(conn: rabbitry.Connection, queue: str) -> list[Any]:
    channel = conn.channel()
    try:
        messages = []
        while (message := channel.basic_get(queue, no_ack=True)) is not None:
            messages.append(message)
        return messages
    finally:
        channel.close()


# Above the pipeline's own deadline (timeout=240 below) plus a JVM boot, so a slow run
# ends with the pipeline's error, not with pytest-timeout interrupting a py4j call (which
# breaks the shared SparkSession for every later Spark test).
@pytest.mark.timeout(420)
def test_orders_pipeline_accounts_for_every_message(
    spark: Any, conn: rabbitry.Connection, url: str, tmp_path: Path
) -> None:
    _run_and_check(spark, conn, url, tmp_path, partitions=None)


@pytest.mark.timeout(420)
def test_orders_pipeline_on_a_super_stream_accounts_for_every_message(
    spark: Any, conn: rabbitry.Connection, url: str, tmp_path: Path
) -> None:
    _run_and_check(spark, conn, url, tmp_path, partitions=4)


def _check_partitions(spark: Any, url: str, layout: SuperStream, plan: EventPlan) -> None:
    """Every routed event, duplicates included, is in its customer's partition, once."""
    rows = (
        spark.read.format("rabbitmq")
        .option("url", url)
        .option("superStream", layout.name)
        .option("superStreamPartitions", str(layout.partitions))
        .load()
        .select("queue", "message_id")
        .collect()
    )
    routed = [e for e in plan.events if e.kind != "unroutable"]
    customers = {e.message_id: e.customer for e in routed}
    for row in rows:
        assert row["queue"] == layout.queue_for(customers[row["message_id"]])
    assert Counter(row["message_id"] for row in rows) == Counter(e.message_id for e in routed)
    assert {row["queue"] for row in rows} == set(layout.queues)


def _run_and_check(
    spark: Any, conn: rabbitry.Connection, url: str, tmp_path: Path, partitions: int | None
) -> None:
    config = PipelineConfig(
        url=url,
        events=2000,
        batch_size=2000,
        output_dir=tmp_path,
        run_id=uuid.uuid4().hex[:10],
        prefix="rabbitry-spark-pipeline",
        retry_delays=(0.5, 1.0),
        keep_topology=True,
        progress=False,
        timeout=240,
        partitions=partitions,
    )
    plan = generate(config.events, run_id=config.run_id, seed=config.seed, mix=config.mix)
    names, policy = config.names, config.policy
    assert plan.duplicates and plan.unroutable and plan.parked_ids  # the mix has every fault
    try:
        summary = run(config, spark=spark)
        assert summary.partitions == partitions

        assert summary.published == summary.confirmed == len(plan.events) == 2000
        assert summary.unroutable == plan.unroutable
        assert summary.duplicates_dropped == plan.duplicates
        assert summary.lost == 0 and summary.unexpected == 0
        assert summary.aggregated == len(plan.valid_ids)
        assert summary.parked == len(plan.parked_ids)
        transient = sum(1 for e in plan.unique if e.kind == "transient")
        poison = sum(1 for e in plan.unique if e.kind == "poison")
        assert summary.recovered == transient
        # Transient orders fail once; poison ones fail max_attempts times (2 retries).
        assert summary.retried == transient + poison * (config.max_attempts - 1)
        # Every routed message reached Spark once, plus one delivery per retry.
        routed = len(plan.events) - plan.unroutable
        assert summary.consumed == routed + summary.retried
        # What the source handed over after dedup and what the sink published: every
        # routed order once plus one copy of its body per retry; one move per retry or
        # parking, each confirmed.
        first = sum(len(e.body) for e in plan.unique if e.kind != "unroutable")
        again = sum(
            len(e.body) * (1 if e.kind == "transient" else config.max_attempts - 1)
            for e in plan.unique
            if e.kind in ("transient", "poison")
        )
        assert summary.body_bytes == first + again
        assert summary.moves_published == summary.retried + summary.parked
        assert summary.ok

        # The Parquet output: each valid order once, totals equal to the generator's.
        orders = spark.read.parquet(str(summary.orders_path))
        ids = [r["message_id"] for r in orders.select("message_id").collect()]
        assert len(ids) == len(set(ids))
        assert set(ids) == plan.valid_ids
        expected = {
            (minute.timestamp(), category): totals
            for (minute, category), totals in plan.revenue().items()
        }
        revenue = spark.read.parquet(str(summary.revenue_path)).collect()
        got = {
            (r["minute"].timestamp(), r["category"]): (r["revenue_eur"], r["orders"])
            for r in revenue
        }
        assert got.keys() == expected.keys()
        for key, (eur, count) in expected.items():
            assert got[key][1] == count, key
            assert got[key][0] == pytest.approx(eur, rel=1e-9), key

        # The broker: the parking lot holds each invalid or poison message once, with
        # the reason; the alternate exchange kept the unroutable ones; nothing else left.
        parked = _drain(conn, policy.names().parking_lot or "")
        parked_ids = [m.properties.message_id for m in parked]
        assert sorted(parked_ids) == sorted(plan.parked_ids)
        kinds = {e.message_id: e.kind for e in plan.unique}
        for message in parked:
            headers = message.properties.headers or {}
            if kinds[message.properties.message_id] == "poison":
                assert headers[PARKED_REASON_HEADER] == "max-attempts"
                assert headers[ATTEMPTS_HEADER] == config.max_attempts
            else:
                assert headers[PARKED_REASON_HEADER] == "not-retryable"
        assert len(_drain(conn, names.unrouted)) == plan.unroutable
        for queue in (names.work, *policy.names().retry_queues):
            assert _drain(conn, queue) == [], queue
        if config.super_stream is not None:
            _check_partitions(spark, url, config.super_stream, plan)
    finally:
        build_topology(names, policy, partitions).delete(conn)
