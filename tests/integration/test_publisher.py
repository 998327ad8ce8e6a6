"""Publisher against the real broker: confirms, nacks, returns, channel errors, alarms.

The memory-alarm tests run on a throw-away node of their own
(``tests/support/node.py``; marker ``faults``): the shared broker is never alarmed.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import threading
import time
from datetime import timedelta
from typing import TYPE_CHECKING, Any

import pytest

import rabbitry
from rabbitry.exceptions import (
    Nacked,
    NotFound,
    PublishRefused,
    PublishTimeout,
    Unroutable,
)
from rabbitry.publisher import OutgoingMessage

if TYPE_CHECKING:
    from collections.abc import Iterator

    from tests.integration.conftest import Names
    from tests.support.node import BrokerNode

pytestmark = pytest.mark.timeout(180)


async def outcomes(futures: list[asyncio.Future[None]]) -> list[BaseException | None]:
    await asyncio.wait(futures, timeout=60)
    assert all(f.done() for f in futures)
    return [f.exception() for f in futures]


async def drain(channel: rabbitry.AsyncChannel, queue: str) -> list[rabbitry.Message]:
    got = []
    while (message := await channel.basic_get(queue, no_ack=True, timeout=10)) is not None:
        got.append(message)
    return got


# --------------------------------------------------------------------------- confirms


async def test_100k_confirmed_messages_all_acked(
    conn: rabbitry.AsyncConnection, channel: rabbitry.AsyncChannel, names: Names
) -> None:
    queue = names.queue()
    await channel.queue_declare(queue)
    publisher = await conn.publisher(max_in_flight=1000)
    futures = [await publisher.send(b"%d" % i, routing_key=queue) for i in range(100_000)]
    await publisher.wait_for_confirms(timeout=120)
    assert publisher.in_flight == 0
    failed = [e for e in await outcomes(futures) if e is not None]
    assert failed == []
    declared = await channel.queue_declare(queue, passive=True)
    assert declared.message_count == 100_000
    await publisher.close()


def test_sync_100k_confirmed_messages_all_acked(url: str, names: Names) -> None:
    queue = names.queue()
    with rabbitry.Connection(url) as connection:
        channel = connection.channel()
        channel.queue_declare(queue)
        with connection.publisher() as publisher:
            futures = [publisher.publish(b"%d" % i, routing_key=queue) for i in range(100_000)]
            publisher.wait_for_confirms(timeout=120)
            done, _ = concurrent.futures.wait(futures, timeout=60)
            assert len(done) == 100_000
            assert [f for f in futures if f.exception() is not None] == []
        assert channel.queue_declare(queue, passive=True).message_count == 100_000


async def test_nack_surfaces_exactly_the_rejected_messages(
    conn: rabbitry.AsyncConnection, channel: rabbitry.AsyncChannel, names: Names
) -> None:
    queue = names.queue()
    await channel.queue_declare(
        queue, arguments={"x-max-length": 10, "x-overflow": "reject-publish"}
    )
    publisher = await conn.publisher()
    futures = [await publisher.send(b"%d" % i, routing_key=queue) for i in range(100)]
    results = await outcomes(futures)
    acked = [i for i, r in enumerate(results) if r is None]
    nacked = [i for i, r in enumerate(results) if isinstance(r, Nacked)]
    assert len(acked) == 10 and len(nacked) == 90
    assert len(acked) + len(nacked) == 100  # nothing else (no unknown outcome)
    # The acked ones are exactly the ones in the queue.
    stored = sorted(int(m.body) for m in await drain(channel, queue))
    assert stored == acked
    await publisher.close()


async def test_batch_nacks(
    conn: rabbitry.AsyncConnection, channel: rabbitry.AsyncChannel, names: Names
) -> None:
    queue = names.queue()
    await channel.queue_declare(
        queue, arguments={"x-max-length": 5, "x-overflow": "reject-publish"}
    )
    publisher = await conn.publisher()
    results = await publisher.publish_batch([b"%d" % i for i in range(20)], routing_key=queue)
    assert [r is None for r in results] == [True] * 5 + [False] * 15
    assert all(isinstance(r, Nacked) for r in results[5:])


async def test_unroutable_mandatory_carries_the_returned_message(
    conn: rabbitry.AsyncConnection, channel: rabbitry.AsyncChannel, names: Names
) -> None:
    queue = names.queue()
    await channel.queue_declare(queue)
    publisher = await conn.publisher(mandatory=True)
    missing = names.queue("never-declared")
    futures = []
    for i in range(50):
        key = queue if i % 2 == 0 else missing
        futures.append(await publisher.send(b"%d" % i, routing_key=key))
    results = await outcomes(futures)
    for i, result in enumerate(results):
        if i % 2 == 0:
            assert result is None
        else:
            assert isinstance(result, Unroutable), (i, result)
            assert result.message.body == b"%d" % i
            assert result.message.reply_code == 312
            assert result.message.routing_key == missing
    # Not mandatory: the broker drops it silently and acks.
    dropped = await publisher.send(b"x", routing_key=missing, mandatory=False)
    await asyncio.wait_for(dropped, 10)
    assert (await channel.queue_declare(queue, passive=True)).message_count == 25
    await publisher.close()


async def test_missing_exchange_fails_and_publisher_keeps_working(
    conn: rabbitry.AsyncConnection, channel: rabbitry.AsyncChannel, names: Names
) -> None:
    queue = names.queue()
    await channel.queue_declare(queue)
    publisher = await conn.publisher()
    old_channel = publisher.channel_id
    before = await publisher.send(b"before", routing_key=queue)
    await asyncio.wait_for(before, 10)
    bad = await publisher.send(b"bad", exchange=names.exchange("missing"))
    (error,) = await outcomes([bad])
    assert isinstance(error, PublishRefused) and error.reply_code == 404
    assert isinstance(error.__cause__, NotFound)
    assert "no exchange" in error.reply_text
    # Transparently on a fresh channel.
    after = await publisher.send(b"after", routing_key=queue)
    await asyncio.wait_for(after, 10)
    assert publisher.channel_id != old_channel
    assert sorted(m.body for m in await drain(channel, queue)) == [b"after", b"before"]
    await publisher.close()


def test_sync_missing_exchange_unroutable_and_nack(url: str, names: Names) -> None:
    queue = names.queue()
    limited = names.queue("limited")
    with rabbitry.Connection(url) as connection:
        channel = connection.channel()
        channel.queue_declare(queue)
        channel.queue_declare(
            limited, arguments={"x-max-length": 1, "x-overflow": "reject-publish"}
        )
        publisher = connection.publisher()
        bad = publisher.publish(b"x", exchange=names.exchange("missing"))
        error = bad.exception(10)
        assert isinstance(error, PublishRefused) and isinstance(error.__cause__, NotFound)
        returned = publisher.publish(b"r", routing_key=names.queue("nowhere"), mandatory=True)
        assert isinstance(returned.exception(10), Unroutable)
        first = publisher.publish(b"1", routing_key=limited)
        second = publisher.publish(b"2", routing_key=limited)
        assert first.result(10) is None
        assert isinstance(second.exception(10), Nacked)
        assert publisher.publish_batch([b"a", b"b"], routing_key=queue) == [None, None]
        publisher.close()


async def test_properties_reach_the_consumer(
    conn: rabbitry.AsyncConnection, channel: rabbitry.AsyncChannel, names: Names
) -> None:
    queue = names.queue()
    await channel.queue_declare(queue, durable=True)
    publisher = await conn.publisher()
    await asyncio.wait_for(
        await publisher.send(
            b"p", routing_key=queue, persistent=True, expiration=timedelta(minutes=5)
        ),
        10,
    )
    await asyncio.wait_for(
        await publisher.send(
            b"q",
            routing_key=queue,
            properties=rabbitry.Properties(message_id="given", content_type="text/plain"),
            expiration=60_000,
        ),
        10,
    )
    first, second = await drain(channel, queue)
    assert first.properties.delivery_mode == 2
    assert first.properties.expiration == "300000"
    assert first.properties.message_id
    assert second.properties.message_id == "given"
    assert second.properties.content_type == "text/plain"
    assert second.properties.expiration == "60000"
    await publisher.close()


async def test_expired_message_is_dropped_by_the_broker(
    conn: rabbitry.AsyncConnection, channel: rabbitry.AsyncChannel, names: Names
) -> None:
    queue = names.queue()
    await channel.queue_declare(queue)
    publisher = await conn.publisher()
    await asyncio.wait_for(
        await publisher.send(b"gone", routing_key=queue, expiration=timedelta(milliseconds=1)),
        10,
    )
    await asyncio.sleep(0.2)
    assert await channel.basic_get(queue, no_ack=True) is None
    await publisher.close()


async def test_confirm_false_fire_and_forget(
    conn: rabbitry.AsyncConnection, channel: rabbitry.AsyncChannel, names: Names
) -> None:
    queue = names.queue()
    await channel.queue_declare(queue)
    publisher = await conn.publisher(confirm=False)
    for i in range(1000):
        await publisher.send(b"%d" % i, routing_key=queue)
    await publisher.wait_for_confirms()
    deadline = time.monotonic() + 10
    while (await channel.queue_declare(queue, passive=True)).message_count < 1000:
        assert time.monotonic() < deadline
        await asyncio.sleep(0.01)
    await publisher.close()


# --------------------------------------------------------------------------- alarms


@pytest.fixture(scope="module")
def alarm_node() -> Iterator[BrokerNode]:
    """A throw-away node of this module's own (the shared broker is never alarmed)."""
    from tests.support.node import BrokerNode, find_scripts_dir

    if find_scripts_dir() is None:
        pytest.fail("the rabbitmq-server scripts are missing; deselect with -m 'not faults'")
    node = BrokerNode()
    try:
        node.start()
        yield node
    finally:
        node.stop()


async def _wait_for(predicate: Any, timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, "condition not met in time"
        await asyncio.sleep(0.01)


@pytest.mark.faults
async def test_memory_alarm_blocks_then_releases_publishers_without_loss(
    alarm_node: BrokerNode,
) -> None:
    node = alarm_node
    queue = "rabbitry-test-alarm-async"
    total, window = 1000, 50
    async with rabbitry.AsyncConnection(node.url, heartbeat=2) as publishing:
        async with rabbitry.AsyncConnection(node.url) as consuming:
            consumer_channel = await consuming.channel()
            await consumer_channel.queue_declare(queue)
            received: list[bytes] = []
            await consumer_channel.basic_consume(
                queue, lambda m: received.append(m.body), no_ack=True
            )
            publisher = await publishing.publisher(max_in_flight=window)
            first = await publisher.send(b"warm-up", routing_key=queue)
            await asyncio.wait_for(first, 10)
            await asyncio.to_thread(node.set_alarm, "memory")
            futures: list[asyncio.Future[None]] = []

            async def produce() -> None:
                for i in range(total):
                    futures.append(await publisher.send(b"%d" % i, routing_key=queue))

            task = asyncio.create_task(produce())
            await _wait_for(lambda: publisher.is_blocked)
            assert publishing.is_blocked and publisher.blocked_reason
            # Blocked: publishing stops; what is in memory stays within the window.
            await asyncio.sleep(3 * 2)  # 3 heartbeat intervals
            stalled = len(futures)
            assert stalled <= window + 1
            assert publisher.in_flight <= window
            assert not task.done()
            assert publishing.is_open  # survived the block (heartbeats kept flowing)
            await asyncio.to_thread(node.clear_alarm, "memory")
            await asyncio.wait_for(task, 60)
            assert not publisher.is_blocked
            results = await outcomes(futures)
            assert results == [None] * total
            await _wait_for(lambda: len(received) == total + 1)
            assert sorted(received[1:], key=int) == [b"%d" % i for i in range(total)]
            await publisher.close()
            await consumer_channel.queue_delete(queue)


@pytest.mark.faults
def test_sync_memory_alarm_blocks_then_releases(alarm_node: BrokerNode) -> None:
    node = alarm_node
    queue = "rabbitry-test-alarm-sync"
    total = 300
    with rabbitry.Connection(node.url, heartbeat=2) as connection:
        channel = connection.channel()
        channel.queue_declare(queue)
        publisher = connection.publisher(max_in_flight=20)
        publisher.publish(b"warm-up", routing_key=queue).result(10)
        node.set_alarm("memory")
        futures: list[concurrent.futures.Future[None]] = []
        errors: list[BaseException] = []

        def produce() -> None:
            try:
                for i in range(total):
                    futures.append(publisher.publish(b"%d" % i, routing_key=queue))
            except BaseException as exc:  # reported below
                errors.append(exc)

        thread = threading.Thread(target=produce)
        thread.start()
        deadline = time.monotonic() + 30
        while not publisher.is_blocked:
            assert time.monotonic() < deadline
            time.sleep(0.01)
        with pytest.raises(PublishTimeout, match="blocked"):
            publisher.publish(b"late", routing_key=queue, timeout=0.2)
        time.sleep(2)
        assert len(futures) <= 21 and thread.is_alive()
        node.clear_alarm("memory")
        thread.join(60)
        assert errors == [] and not thread.is_alive()
        publisher.wait_for_confirms(timeout=60)
        assert [f.exception(10) for f in futures] == [None] * total
        assert channel.queue_declare(queue, passive=True).message_count == total + 1
        publisher.close()
        channel.queue_delete(queue)


# --------------------------------------------------------------------------- batch


async def test_publish_batch_mixed(
    conn: rabbitry.AsyncConnection, channel: rabbitry.AsyncChannel, names: Names
) -> None:
    queue = names.queue()
    other = names.queue("other")
    await channel.queue_declare(queue)
    await channel.queue_declare(other)
    publisher = await conn.publisher()
    messages: list[OutgoingMessage | bytes] = [b"%d" % i for i in range(1000)]
    messages[10] = OutgoingMessage(b"to-other", routing_key=other)
    messages[20] = OutgoingMessage(b"lost", routing_key=names.queue("nowhere"), mandatory=True)
    results = await publisher.publish_batch(messages, routing_key=queue)
    assert [i for i, r in enumerate(results) if r is not None] == [20]
    assert isinstance(results[20], Unroutable)
    assert (await channel.queue_declare(queue, passive=True)).message_count == 998
    assert (await channel.queue_declare(other, passive=True)).message_count == 1
    await publisher.close()
