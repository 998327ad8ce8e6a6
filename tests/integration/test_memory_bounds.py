"""Memory stays bounded in bytes when the application is slower than the broker.

A consumer whose callback (or handler) does not keep up, with nothing else to bound
what the broker sends (no ``basic_qos``, or ``ack="auto"``, which prefetch does not
count), must stop reading the socket instead of buffering the backlog. Each test builds
a backlog well above the bound, waits until the connection has paused reading (the only
wait, with a generous deadline), then checks the queue against its bound and the growth
of the resident set against a stated limit.
"""

from __future__ import annotations

import asyncio
import gc
import os
import uuid

import pytest

import rabbitry
from rabbitry.aio import channel as channel_module

pytestmark = pytest.mark.timeout(180)

MIB = 1024 * 1024
BODY = 64 * 1024
#: The backlog: 80 MiB of distinct 64 KiB bodies, five times the default byte bounds.
BACKLOG = 1280
#: Allowed RSS growth while the backlog waits: the 16 MiB bound, one read chunk, the
#: engine's own allocations, and slack for the allocator.
RSS_LIMIT = 48 * MIB
HANG = 60.0


def rss() -> int:
    """The resident set size of this process, in bytes."""
    with open("/proc/self/statm") as statm:
        return int(statm.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


async def eventually(predicate: object, timeout: float = HANG) -> bool:
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    while not predicate():  # type: ignore[operator]
        if loop.time() > deadline:
            return False
        await asyncio.sleep(0.01)
    return True


async def fill(url: str, queue: str, count: int, size: int) -> None:
    async with rabbitry.AsyncConnection(url) as conn:
        channel = await conn.channel()
        await channel.queue_declare(queue)
        publisher = await conn.publisher(max_in_flight=64)
        for start in range(0, count, 64):
            batch = [
                i.to_bytes(4, "big") + bytes(size - 4) for i in range(start, min(count, start + 64))
            ]
            outcomes = await publisher.publish_batch(batch, routing_key=queue)
            assert outcomes == [None] * len(batch)
        await publisher.close()


async def delete(url: str, queue: str) -> None:
    async with rabbitry.AsyncConnection(url) as conn:
        channel = await conn.channel()
        await channel.queue_delete(queue)


def reading_paused(conn: rabbitry.AsyncConnection) -> bool:
    transport = conn._transport
    return conn._read_pauses > 0 and transport is not None and not transport.is_reading()


async def test_coroutine_callback_without_qos_pauses_reading_at_its_queue_bound(
    url: str,
) -> None:
    queue = f"rabbitry-bounds-{uuid.uuid4().hex[:8]}"
    await fill(url, queue, BACKLOG, BODY)
    release = asyncio.Event()
    started = asyncio.Event()
    try:
        async with rabbitry.AsyncConnection(url) as conn:
            channel = await conn.channel()
            gc.collect()
            before = rss()

            async def slow(message: rabbitry.Message) -> None:
                started.set()
                await release.wait()

            await channel.basic_consume(queue, slow, no_ack=True)
            assert await eventually(lambda: reading_paused(conn)), "reading never paused"
            consumer = next(iter(channel._consumers.values()))
            assert consumer.queue is not None
            queued, queued_bytes = consumer.queue.qsize(), consumer.queued_bytes
            growth = rss() - before
            release.set()
            assert started.is_set()
            # The bound is reached by the message that fills it, and nothing is handed
            # over after the pause (what was read with it waits in the engine).
            assert queued <= channel_module.CONSUMER_QUEUE_MESSAGES
            assert queued_bytes < channel_module.CONSUMER_QUEUE_BYTES + BODY
            assert growth < RSS_LIMIT, f"RSS grew by {growth / MIB:.1f} MiB"
    finally:
        release.set()
        await delete(url, queue)


@pytest.mark.parametrize("prefetch", [10, 0])
async def test_auto_ack_consumer_holds_at_most_prefetch_or_its_byte_bound(
    url: str, prefetch: int
) -> None:
    queue = f"rabbitry-bounds-{uuid.uuid4().hex[:8]}"
    await fill(url, queue, BACKLOG, BODY)
    release = asyncio.Event()
    try:
        async with rabbitry.AsyncConnection(url) as conn:
            gc.collect()
            before = rss()

            async def slow(message: rabbitry.Message) -> None:
                await release.wait()

            consumer = conn.consumer(queue, slow, ack="auto", prefetch=prefetch)
            await consumer.start(timeout=10)
            try:
                assert await eventually(lambda: reading_paused(conn)), "reading never paused"
                held = len(consumer._flow.inbox)
                growth = rss() - before
            finally:
                release.set()
                await consumer.stop(drain=False, timeout=10)
            limit = prefetch if prefetch else (16 * MIB) // BODY
            assert held <= limit, f"{held} messages waiting (bound {limit})"
            assert growth < RSS_LIMIT, f"RSS grew by {growth / MIB:.1f} MiB"
    finally:
        await delete(url, queue)
