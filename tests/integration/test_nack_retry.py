"""``nack_retry``: broker nacks are sent again with backoff (P3 in ``docs/recovery.md``).

A queue with ``x-max-length=10`` and ``x-overflow=reject-publish`` nacks every publish
beyond its tenth message, deterministically: without a retry policy exactly 90 of 100
fail (``test_publisher.py``); with one, and a consumer that starts later, all 100 are
confirmed and delivered, each with its own ``message_id``.
"""

from __future__ import annotations

import asyncio
import time
from typing import TYPE_CHECKING

import pytest

import rabbitry
from rabbitry import NackRetry
from rabbitry.exceptions import ConfigurationError, Nacked
from rabbitry.protocol.spec import BasicProperties

if TYPE_CHECKING:
    from collections.abc import Callable

    from tests.integration.conftest import Names

pytestmark = pytest.mark.timeout(120)

BOUNDED = {"x-max-length": 10, "x-overflow": "reject-publish"}
PATIENT = NackRetry(max_attempts=200, initial_delay=0.02, max_delay=0.1, jitter=0.1)
WAIT = 30.0  # a deadline that turns a hang into a failure, not a measurement


async def eventually(predicate: Callable[[], bool], timeout: float = WAIT) -> bool:
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            return False
        await asyncio.sleep(0.01)
    return True


def wait_until(predicate: Callable[[], bool], timeout: float = WAIT) -> bool:
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            return False
        time.sleep(0.01)
    return True


async def test_nacked_messages_are_resent_until_a_consumer_makes_room(
    conn: rabbitry.AsyncConnection, channel: rabbitry.AsyncChannel, names: Names
) -> None:
    queue = names.queue()
    await channel.queue_declare(queue, arguments=BOUNDED)
    publisher = await conn.publisher(nack_retry=PATIENT)
    futures = [
        await publisher.send(
            b"%d" % i, routing_key=queue, properties=BasicProperties(message_id=f"id-{i}")
        )
        for i in range(100)
    ]
    # The first 10 fill the queue; the other 90 are nacked and resent while it stays full.
    assert await eventually(lambda: all(f.done() for f in futures[:10]))
    assert [f.result() for f in futures[:10]] == [None] * 10
    assert await eventually(lambda: publisher.nack_resends >= 1)
    assert not any(f.done() for f in futures[10:])  # no room without a consumer

    seen: list[str] = []
    done = asyncio.Event()

    async def handler(message: rabbitry.Message) -> None:
        assert message.properties.message_id is not None
        seen.append(message.properties.message_id)
        if len(set(seen)) == 100:
            done.set()

    consumer = conn.consumer(queue, handler, prefetch=20)
    await consumer.start()
    try:
        await asyncio.wait_for(asyncio.gather(*futures), 60)  # every one confirmed
        await asyncio.wait_for(done.wait(), 60)
    finally:
        await consumer.stop()
    assert set(seen) == {f"id-{i}" for i in range(100)}
    assert len(seen) == 100  # a nacked publish is not stored: no duplicates
    await publisher.wait_for_confirms(timeout=10)
    await publisher.close()


async def test_retries_are_bounded_then_the_nack_surfaces(
    conn: rabbitry.AsyncConnection, channel: rabbitry.AsyncChannel, names: Names
) -> None:
    queue = names.queue()
    await channel.queue_declare(queue, arguments=BOUNDED)
    publisher = await conn.publisher(nack_retry=NackRetry(max_attempts=2, initial_delay=0.01))
    futures = [await publisher.send(b"%d" % i, routing_key=queue) for i in range(30)]
    await asyncio.wait(futures, timeout=30)
    results = [f.exception() for f in futures]
    assert sum(r is None for r in results) == 10
    assert sum(isinstance(r, Nacked) for r in results) == 20
    assert publisher.nack_resends == 2 * 20
    assert publisher.in_flight == 0
    await publisher.close(timeout=5)


async def test_batch_members_are_retried_too(
    conn: rabbitry.AsyncConnection, channel: rabbitry.AsyncChannel, names: Names
) -> None:
    queue = names.queue()
    await channel.queue_declare(queue, arguments=BOUNDED)
    publisher = await conn.publisher(nack_retry=PATIENT)
    batch = asyncio.ensure_future(
        publisher.publish_batch([b"%d" % i for i in range(40)], routing_key=queue)
    )
    assert await eventually(lambda: publisher.nack_resends >= 1)
    assert not batch.done()  # 40 messages, room for 10: nothing drains the queue yet
    drained = 0
    while not batch.done():
        message = await channel.basic_get(queue, no_ack=True, timeout=5)
        drained += message is not None
        if message is None:
            await asyncio.sleep(0.02)
    assert await batch == [None] * 40
    while await channel.basic_get(queue, no_ack=True, timeout=5) is not None:
        drained += 1
    assert drained == 40
    await publisher.close()


def test_sync_publisher_resends_nacks_until_every_message_is_stored_once(
    url: str, names: Names
) -> None:
    with rabbitry.Connection(url) as connection:
        channel = connection.channel()
        queue = names.queue()
        channel.queue_declare(queue, arguments=BOUNDED)
        with connection.publisher() as filler:
            fill = [b"fill-%d" % i for i in range(10)]
            assert filler.publish_batch(fill, routing_key=queue) == [None] * 10
        # The queue is full, so every publish below is nacked until the drain makes room.
        publisher = connection.publisher(nack_retry=PATIENT)
        bodies = [b"%d" % i for i in range(20)]
        futures = [publisher.publish(body, routing_key=queue) for body in bodies]
        assert wait_until(lambda: publisher.nack_resends >= 1), "no nack was resent"
        assert not any(future.done() for future in futures)

        drained: list[bytes] = []
        deadline = time.monotonic() + WAIT
        while len(drained) < len(fill) + len(bodies) and time.monotonic() < deadline:
            message = channel.basic_get(queue, no_ack=True, timeout=5)
            if message is None:
                time.sleep(0.01)
            else:
                drained.append(bytes(message.body))
        assert [future.result(timeout=WAIT) for future in futures] == [None] * 20
        assert channel.basic_get(queue, no_ack=True, timeout=5) is None  # nothing stored twice
        assert sorted(drained) == sorted(fill + bodies)  # each one delivered exactly once
        publisher.close()


def test_nack_retry_is_validated() -> None:
    with pytest.raises(ConfigurationError, match="max_attempts: must be >= 1"):
        NackRetry(max_attempts=0)
    with pytest.raises(ConfigurationError, match="max_delay: must be >= initial_delay"):
        NackRetry(initial_delay=2, max_delay=1)
    assert NackRetry(jitter=0).delay(3) == pytest.approx(0.4)
