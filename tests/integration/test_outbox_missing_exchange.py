"""Outbox rows for an exchange that does not exist, among good rows.

A publish to a missing exchange makes the broker close the channel (404), which takes
the pending confirms of every row sent before it on that channel: those rows would be
resent and delivered twice. The outbox publisher learns that an exchange is missing
without losing its channel (a passive declare on a side channel, once per exchange
name) and moves the rows for it to the dead table with the reason, logged at ERROR
(rate-limited, with counts).
"""

from __future__ import annotations

import logging
from collections import Counter
from typing import TYPE_CHECKING

import pytest

import rabbitry
from rabbitry import OutboxError, OutgoingMessage, SQLiteOutbox

if TYPE_CHECKING:
    from pathlib import Path

    from tests.integration.conftest import Names

    from rabbitry.outbox import OutboxBatch

pytestmark = pytest.mark.timeout(180)


async def _drain_ids(channel: rabbitry.AsyncChannel, queue: str) -> Counter[str]:
    got: Counter[str] = Counter()
    while (message := await channel.basic_get(queue, no_ack=True, timeout=30)) is not None:
        assert message.properties.message_id is not None
        got[message.properties.message_id] += 1
    return got


@pytest.mark.parametrize("bad", [1, 12])
async def test_rows_for_a_missing_exchange_cost_no_duplicates_of_good_rows(
    conn: rabbitry.AsyncConnection,
    channel: rabbitry.AsyncChannel,
    names: Names,
    tmp_path: Path,
    caplog: pytest.LogCaptureFixture,
    bad: int,
) -> None:
    queue = names.queue()
    missing = names.exchange("never-declared")
    await channel.queue_declare(queue)
    good = 3000
    every = good // bad
    rows = []
    for i in range(good):
        rows.append(OutgoingMessage(b"good %d" % i, routing_key=queue))
        if i % every == every // 2 and len(rows) - i - 1 < bad:
            rows.append(OutgoingMessage(b"bad %d" % i, exchange=missing, routing_key="k"))
    path = str(tmp_path / "outbox.db")
    with caplog.at_level(logging.ERROR, logger="rabbitry.outbox"):
        async with await conn.publisher(outbox=SQLiteOutbox(path), timeout=30) as publisher:
            ids: list[str] = []
            for start in range(0, len(rows), 250):  # a producer publishing in batches
                ids += await publisher.publish_many(rows[start : start + 250])
            await publisher.flush(timeout=120)
            stats = publisher.stats()
    bad_ids = {i for i, row in zip(ids, rows, strict=True) if row.exchange == missing}
    assert len(bad_ids) == bad
    assert (stats.pending, stats.dead, stats.acked) == (0, bad, good)
    prefix = f"outbox {path}: {bad - 10} more messages moved to the dead table (each is in "
    prefix += "the dead table with its reason): "
    delivered = await _drain_ids(channel, queue)
    duplicates = sum(n - 1 for n in delivered.values())
    assert duplicates == 0
    assert set(delivered) == set(ids) - bad_ids
    dead = SQLiteOutbox(path).dead()
    assert {d.record.message_id for d in dead} == bad_ids
    for record in dead:
        assert record.reason.startswith("exchange not found: ")
        assert missing in record.reason
    errors = [r.getMessage() for r in caplog.records if r.levelno == logging.ERROR]
    # Rate-limited: ten rows in full, then a notice and one summary with the count.
    full = [m for m in errors if "moved to the dead table (rabbitry outbox" in m]
    assert len(full) == min(bad, 10) and all(missing in m for m in full)
    summaries = [m for m in errors if "more messages moved to the dead table" in m]
    assert summaries == ([] if bad <= 10 else [f"{prefix}{bad - 10} no exchange"])
    assert len(errors) == len(full) + (2 if bad > 10 else 0)


def test_sync_outbox_row_for_a_missing_exchange_costs_no_duplicates(
    url: str, names: Names, tmp_path: Path
) -> None:
    queue = names.queue()
    missing = names.exchange("never-declared")
    path = str(tmp_path / "outbox.db")
    with rabbitry.Connection(url) as conn:
        channel = conn.channel()
        channel.queue_declare(queue)
        with conn.publisher(outbox=SQLiteOutbox(path), timeout=30) as publisher:
            good = [publisher.publish(b"a %d" % i, routing_key=queue) for i in range(500)]
            bad = publisher.publish(b"bad", exchange=missing, routing_key="k")
            good += publisher.publish_many([b"b %d" % i for i in range(1000)], routing_key=queue)
            publisher.flush(timeout=120)
            assert publisher.stats().dead == 1
        delivered: Counter[str] = Counter()
        while (message := channel.basic_get(queue, no_ack=True)) is not None:
            assert message.properties.message_id is not None
            delivered[message.properties.message_id] += 1
    assert sorted(delivered) == sorted(good) and set(delivered.values()) == {1}
    (dead,) = SQLiteOutbox(path).dead()
    assert dead.record.message_id == bad and dead.reason.startswith("exchange not found: 404")


class _FullDisk(SQLiteOutbox):
    """A store whose writes of new rows fail, like a full disk."""

    def apply(self, batch: OutboxBatch) -> None:
        if batch.inserts:
            raise OutboxError(self.name, "write failed: database or disk is full")
        super().apply(batch)


async def test_failed_commits_are_raised_to_each_caller_and_logged_rate_limited(
    conn: rabbitry.AsyncConnection, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    with caplog.at_level(logging.ERROR, logger="rabbitry.outbox"):
        publisher = await conn.publisher(outbox=_FullDisk(str(tmp_path / "o.db")))
        try:
            for i in range(30):
                with pytest.raises(OutboxError, match="disk is full"):
                    await publisher.publish(b"%d" % i, routing_key="q")
        finally:
            await publisher.close()
    errors = [r.getMessage() for r in caplog.records if r.levelno == logging.ERROR]
    assert sum("commit failed" in m for m in errors) == 10
    assert len(errors) == 12  # and the notice, and the summary at close
    assert errors[-1].endswith("20 more failed commits (each raised to its caller): 20 failed")
