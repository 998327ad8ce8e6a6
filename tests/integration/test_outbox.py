"""The durable outbox publisher against the real broker.

Every test keeps its outbox file in ``tmp_path``; faults (SIGKILL of the producer, the
broker unreachable) are in ``tests/faults/test_outbox_faults.py``.
"""

from __future__ import annotations

import asyncio
import json
import threading
import time
from typing import TYPE_CHECKING

import pytest
from click.testing import CliRunner

import rabbitry
from rabbitry import (
    ConfigurationError,
    LocalProtocolError,
    OutboxCorrupt,
    OutboxFull,
    OutboxLocked,
    OutgoingMessage,
    SQLiteOutbox,
)
from rabbitry.cli._app import cli
from rabbitry.outbox import OutboxBatch, OutboxRecord
from rabbitry.protocol import spec

if TYPE_CHECKING:
    from pathlib import Path

    from tests.integration.conftest import Names

pytestmark = pytest.mark.timeout(120)


async def drain(channel: rabbitry.AsyncChannel, queue: str) -> list[rabbitry.Message]:
    got = []
    while (message := await channel.basic_get(queue, no_ack=True, timeout=10)) is not None:
        got.append(message)
    return got


async def test_publish_returns_after_storing_and_delivers_with_the_same_id(
    conn: rabbitry.AsyncConnection, channel: rabbitry.AsyncChannel, names: Names, tmp_path: Path
) -> None:
    queue = names.queue()
    await channel.queue_declare(queue)
    path = str(tmp_path / "outbox.db")
    async with await conn.publisher(outbox=SQLiteOutbox(path), timeout=10) as publisher:
        assert isinstance(publisher, rabbitry.AsyncOutboxPublisher)
        first = await publisher.publish(b"one", routing_key=queue, persistent=True)
        mine = await publisher.publish(
            "two",
            routing_key=queue,
            properties=spec.BasicProperties(message_id="order-42", headers={"k": "v"}),
        )
        assert mine == "order-42"
        await publisher.flush(timeout=10)
        stats = publisher.stats()
        assert (stats.pending, stats.stored, stats.acked, stats.resent, stats.dead) == (
            0, 2, 2, 0, 0,
        )  # fmt: skip
        assert stats.oldest_age is None
    got = await drain(channel, queue)
    assert [m.body for m in got] == [b"one", b"two"]
    assert [m.properties.message_id for m in got] == [first, "order-42"]
    assert got[0].properties.delivery_mode == 2
    assert got[1].properties.headers == {"k": "v"}
    assert SQLiteOutbox(path).status().pending == 0


async def test_publish_many_is_one_batch_with_per_message_targets(
    conn: rabbitry.AsyncConnection, channel: rabbitry.AsyncChannel, names: Names, tmp_path: Path
) -> None:
    a, b = names.queue("a"), names.queue("b")
    for queue in (a, b):
        await channel.queue_declare(queue)
    publisher = await conn.publisher(outbox=SQLiteOutbox(tmp_path / "o.db"))
    try:
        ids = await publisher.publish_many(
            [b"1", OutgoingMessage(b"2", routing_key=b), b"3"], routing_key=a
        )
        assert len(set(ids)) == 3
        assert await publisher.publish_many([]) == []
        await publisher.flush(timeout=10)
    finally:
        await publisher.close()
    assert [m.body for m in await drain(channel, a)] == [b"1", b"3"]
    (other,) = await drain(channel, b)
    assert (other.body, other.properties.message_id) == (b"2", ids[1])


async def test_unroutable_messages_go_to_the_dead_table_once(
    conn: rabbitry.AsyncConnection, names: Names, tmp_path: Path
) -> None:
    path = str(tmp_path / "o.db")
    missing = names.queue("never-declared")
    publisher = await conn.publisher(outbox=SQLiteOutbox(path), mandatory=True)
    try:
        message_id = await publisher.publish(b"lost?", routing_key=missing)
        await publisher.flush(timeout=10)
        stats = publisher.stats()
        assert (stats.pending, stats.dead, stats.resent, stats.acked) == (0, 1, 0, 0)
    finally:
        await publisher.close()
    (dead,) = SQLiteOutbox(path).dead()
    assert dead.reason == "312 NO_ROUTE"
    assert (dead.record.message_id, dead.record.routing_key) == (message_id, missing)
    assert dead.record.body == b"lost?"


async def test_nacked_messages_are_resent_until_acked(
    conn: rabbitry.AsyncConnection, channel: rabbitry.AsyncChannel, names: Names, tmp_path: Path
) -> None:
    # A queue that holds one message and nacks publishes while full (reject-publish).
    queue = names.queue()
    await channel.queue_declare(
        queue, arguments={"x-max-length": 1, "x-overflow": "reject-publish"}
    )
    outbox = SQLiteOutbox(tmp_path / "o.db", retry_delay=0.05, max_retry_delay=0.2)
    publisher = await conn.publisher(outbox=outbox)
    try:
        ids = await publisher.publish_many([b"a", b"b", b"c"], routing_key=queue)
        # Nothing is consumed yet: "a" fills the queue, "b" and "c" are nacked and
        # resent (with backoff) until there is room.
        deadline = time.monotonic() + 10
        while publisher.stats().resent < 4:
            assert time.monotonic() < deadline, f"resent only {publisher.stats().resent}"
            await asyncio.sleep(0.02)
        assert publisher.stats().pending == 2
        seen: list[str] = []
        deadline = time.monotonic() + 30
        while len(seen) < 3 and time.monotonic() < deadline:
            message = await channel.basic_get(queue, no_ack=True)
            if message is None:
                await asyncio.sleep(0.05)
            else:
                seen.append(str(message.properties.message_id))
        await publisher.flush(timeout=10)
        stats = publisher.stats()
    finally:
        await publisher.close()
    assert sorted(set(seen), key=ids.index) == ids  # nothing lost
    assert stats.resent >= 4 and stats.pending == 0
    status = SQLiteOutbox(tmp_path / "o.db").status()
    assert status.resent == stats.resent and status.pending == 0


async def test_rows_left_in_the_outbox_are_sent_at_start(
    conn: rabbitry.AsyncConnection, channel: rabbitry.AsyncChannel, names: Names, tmp_path: Path
) -> None:
    queue = names.queue()
    await channel.queue_declare(queue)
    path = str(tmp_path / "o.db")
    # What a producer killed before the broker confirmed leaves behind.
    store = SQLiteOutbox(path)
    store.open()
    store.apply(
        OutboxBatch(
            inserts=[
                OutboxRecord(
                    n,
                    f"left-{n}",
                    "",
                    queue,
                    False,
                    spec.BasicProperties(message_id=f"left-{n}").encode(),
                    b"x" * n,
                    time.time(),
                )
                for n in (1, 2, 3)
            ]
        )
    )
    store.close()
    publisher = await conn.publisher(outbox=SQLiteOutbox(path))
    try:
        new = await publisher.publish(b"new", routing_key=queue)
        await publisher.flush(timeout=10)
        stats = publisher.stats()
    finally:
        await publisher.close()
    got = await drain(channel, queue)
    assert [m.properties.message_id for m in got] == ["left-1", "left-2", "left-3", new]
    assert (stats.resent, stats.acked) == (3, 4)
    assert SQLiteOutbox(path).status().last_id == 4  # the new row numbered after them


async def test_a_full_outbox_blocks_then_raises_outbox_full(
    conn: rabbitry.AsyncConnection, channel: rabbitry.AsyncChannel, names: Names, tmp_path: Path
) -> None:
    # Every publish to this queue is nacked, so nothing leaves the outbox.
    queue = names.queue()
    await channel.queue_declare(
        queue, arguments={"x-max-length": 0, "x-overflow": "reject-publish"}
    )
    outbox = SQLiteOutbox(tmp_path / "o.db", max_rows=5, max_bytes=10_000, retry_delay=0.05)
    publisher = await conn.publisher(outbox=outbox, timeout=0.3)
    try:
        await publisher.publish_many([b"x"] * 4, routing_key=queue)
        await publisher.publish(b"x", routing_key=queue)
        started = time.monotonic()
        with pytest.raises(OutboxFull, match=r"full \(5/5 rows") as info:
            await publisher.publish(b"x", routing_key=queue)
        assert time.monotonic() - started >= 0.25
        assert (info.value.rows, isinstance(info.value, rabbitry.PublishTimeout)) == (5, True)
        with pytest.raises(OutboxFull):
            await publisher.publish_many([b"y"] * 2, routing_key=queue, timeout=0.05)
        with pytest.raises(LocalProtocolError, match="can never fit"):
            await publisher.publish_many([b"y"] * 6, routing_key=queue)
        with pytest.raises(LocalProtocolError, match="max_bytes"):
            await publisher.publish(b"z" * 20_000, routing_key=queue)
        assert publisher.stats().pending == 5
    finally:
        await publisher.close()
    assert SQLiteOutbox(tmp_path / "o.db").status().pending == 5  # kept for later


async def test_a_reservation_that_times_out_lets_a_smaller_one_behind_it_in(
    conn: rabbitry.AsyncConnection, channel: rabbitry.AsyncChannel, names: Names, tmp_path: Path
) -> None:
    # Nothing leaves the outbox (every publish is nacked), so room only changes hands.
    queue = names.queue()
    await channel.queue_declare(
        queue, arguments={"x-max-length": 0, "x-overflow": "reject-publish"}
    )
    outbox = SQLiteOutbox(tmp_path / "o.db", max_rows=5, max_bytes=10_000, retry_delay=0.05)
    publisher = await conn.publisher(outbox=outbox)
    try:
        await publisher.publish_many([b"x"] * 3, routing_key=queue)
        big = asyncio.create_task(
            publisher.publish_many([b"y"] * 3, routing_key=queue, timeout=0.2)
        )
        await asyncio.sleep(0)  # the three rows wait first: 3 + 3 > 5
        small = asyncio.create_task(publisher.publish(b"z", routing_key=queue, timeout=60))
        with pytest.raises(OutboxFull):
            await big
        # The one row fits beside the three; it waited only behind the bigger batch.
        await asyncio.wait_for(small, 30)
        assert publisher.stats().pending == 4
    finally:
        await publisher.close()


async def test_corrupt_or_locked_outbox_fails_at_start(
    conn: rabbitry.AsyncConnection, tmp_path: Path
) -> None:
    bad = tmp_path / "bad.db"
    bad.write_bytes(b"\x00garbage" * 500)
    with pytest.raises(OutboxCorrupt, match=str(bad)):
        await conn.publisher(outbox=SQLiteOutbox(bad))
    assert bad.read_bytes() == b"\x00garbage" * 500
    path = tmp_path / "o.db"
    first = await conn.publisher(outbox=SQLiteOutbox(path))
    try:
        with pytest.raises(OutboxLocked, match="in use by another publisher"):
            await conn.publisher(outbox=SQLiteOutbox(path))
        await first.publish(b"still works", routing_key="")
    finally:
        await first.close()
    second = await conn.publisher(outbox=SQLiteOutbox(path))  # released by close()
    await second.close()
    with pytest.raises(ConfigurationError, match="confirm=True"):
        await conn.publisher(outbox=SQLiteOutbox(path), confirm=False)
    with pytest.raises(ConfigurationError, match="must be an Outbox"):
        await conn.publisher(outbox=str(path))  # type: ignore[call-overload]


def test_sync_outbox_publisher(url: str, names: Names, tmp_path: Path) -> None:
    queue = names.queue()
    path = str(tmp_path / "o.db")
    with rabbitry.Connection(url) as conn:
        channel = conn.channel()
        channel.queue_declare(queue)
        with conn.publisher(outbox=SQLiteOutbox(path), timeout=10) as publisher:
            assert isinstance(publisher, rabbitry.OutboxPublisher)
            one = publisher.publish(b"one", routing_key=queue)
            many = publisher.publish_many([b"two", b"three"], routing_key=queue)
            publisher.flush(timeout=10)
            stats = publisher.stats()
            assert (stats.acked, stats.pending) == (3, 0)
            assert "OutboxPublisher" in repr(publisher)
        assert publisher.is_closed
        got = []
        while (message := channel.basic_get(queue, no_ack=True, timeout=10)) is not None:
            got.append(message)
    assert [m.properties.message_id for m in got] == [one, *many]
    assert SQLiteOutbox(path).status().pending == 0


def test_sync_close_after_the_connection_still_releases_the_outbox(
    url: str, names: Names, tmp_path: Path
) -> None:
    path = str(tmp_path / "o.db")
    conn = rabbitry.Connection(url)
    conn.connect()
    publisher = conn.publisher(outbox=SQLiteOutbox(path))
    publisher.publish(b"x", routing_key=names.queue("unused"))
    conn.close()
    publisher.close()  # the IO thread is gone; the file lock must still be released
    again = SQLiteOutbox(path)
    again.open()
    again.close()


def test_sync_publishes_from_many_threads_share_commits(
    url: str, names: Names, tmp_path: Path
) -> None:
    queue = names.queue()
    with rabbitry.Connection(url) as conn:
        channel = conn.channel()
        channel.queue_declare(queue)
        with conn.publisher(outbox=SQLiteOutbox(tmp_path / "o.db")) as publisher:
            ids: list[str] = []
            lock = threading.Lock()

            def produce(n: int) -> None:
                for i in range(50):
                    message_id = publisher.publish(f"{n}-{i}", routing_key=queue)
                    with lock:
                        ids.append(message_id)

            threads = [threading.Thread(target=produce, args=(n,)) for n in range(4)]
            for thread in threads:
                thread.start()
            for thread in threads:
                thread.join()
            publisher.flush(timeout=10)
        got = set()
        while (message := channel.basic_get(queue, no_ack=True, timeout=10)) is not None:
            got.add(message.properties.message_id)
    assert len(ids) == 200 and got == set(ids)


async def test_cancelled_publish_still_delivers_what_it_queued(
    conn: rabbitry.AsyncConnection, channel: rabbitry.AsyncChannel, names: Names, tmp_path: Path
) -> None:
    queue = names.queue()
    await channel.queue_declare(queue)
    publisher = await conn.publisher(outbox=SQLiteOutbox(tmp_path / "o.db"))
    try:
        task = asyncio.ensure_future(publisher.publish_many([b"a", b"b"], routing_key=queue))
        await asyncio.sleep(0)  # queued for the writer, not yet committed
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        await publisher.flush(timeout=10)
    finally:
        await publisher.close()
    # At-least-once: a batch handed over is delivered whole even if the caller left.
    assert [m.body for m in await drain(channel, queue)] == [b"a", b"b"]


async def test_refused_rows_go_to_the_dead_table_with_the_reason_and_are_not_resent(
    conn: rabbitry.AsyncConnection,
    channel: rabbitry.AsyncChannel,
    names: Names,
    tmp_path: Path,
    caplog: pytest.LogCaptureFixture,
) -> None:
    path = str(tmp_path / "o.db")
    queue = names.queue()
    gone = names.exchange("deleted")
    missing = names.exchange("never-declared")
    await channel.queue_declare(queue)
    await channel.exchange_declare(gone, "fanout")
    await channel.queue_bind(queue, gone)
    publisher = await conn.publisher(outbox=SQLiteOutbox(path, retry_delay=0.01))
    try:
        first = await publisher.publish(b"first", exchange=gone)
        await publisher.flush(timeout=30)  # the exchange was checked and is remembered
        await channel.exchange_delete(gone)
        before = await publisher.publish(b"before", routing_key=queue)
        refused = await publisher.publish(b"refused", exchange=gone, routing_key="k")
        after = await publisher.publish(b"after", routing_key=queue)
        await publisher.flush(timeout=30)
        never = await publisher.publish(b"never sent", exchange=missing, routing_key="k")
        again = await publisher.publish(b"checked again", exchange=gone)
        await publisher.flush(timeout=30)
        await channel.exchange_declare(gone, "fanout")
        await channel.queue_bind(queue, gone)
        back = await publisher.publish(b"back", exchange=gone)
        await publisher.flush(timeout=30)
        stats = publisher.stats()
        assert (stats.pending, stats.dead) == (0, 3)
    finally:
        await publisher.close()
    dead = {d.record.message_id: d for d in SQLiteOutbox(path).dead()}
    assert set(dead) == {refused, never, again}
    # Sent once, refused by the broker (404: deleted after it was checked), not resent.
    assert dead[refused].reason.startswith("refused by the broker: 404 NOT_FOUND")
    assert gone in dead[refused].reason
    assert dead[refused].record.attempts == 1
    # Checked before sending (the refusal made the name unknown again): never sent.
    for message_id, name in ((never, missing), (again, gone)):
        assert dead[message_id].reason.startswith("exchange not found: 404 NOT_FOUND")
        assert name in dead[message_id].reason
        assert dead[message_id].record.attempts == 0
    errors = [r for r in caplog.records if r.levelname == "ERROR" and "dead table" in r.message]
    assert len(errors) == 3 and refused in errors[0].getMessage()
    got = await drain(channel, queue)
    # (An exchange deleted after its check can still cost a resend of a row sent before
    # the refused one: the refusal closes the channel. Hence a set.)
    assert {m.properties.message_id for m in got} == {first, before, after, back}
    result = CliRunner().invoke(cli, ["--json", "outbox", "status", path])
    assert result.exit_code == 0, result.output
    status = json.loads(result.stdout)
    assert status["dead"] == 3
    assert {r["reason"]: r["rows"] for r in status["dead_reasons"]} == {
        d.reason: 1 for d in dead.values()
    }
    text = CliRunner().invoke(cli, ["outbox", "status", path])
    assert "refused by the broker: 404" in text.stdout
