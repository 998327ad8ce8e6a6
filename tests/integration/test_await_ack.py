"""``message.ack()`` / ``nack()`` / ``reject()`` on messages of the asyncio API work both as
a plain call and awaited; the broker sees each settlement once."""

from __future__ import annotations

import asyncio
from typing import TYPE_CHECKING

import pytest

from rabbitry import AsyncConnection, ChannelClosedByClient, Connection, InvalidStateError, Message
from rabbitry.message import Settled

if TYPE_CHECKING:
    from tests.integration.conftest import Names

DEADLINE = 30.0


async def _fill(conn: AsyncConnection, queue: str, count: int) -> None:
    channel = await conn.channel()
    await channel.queue_declare(queue)
    for i in range(count):
        await channel.basic_publish("", queue, f"m{i}".encode())


async def _take(conn: AsyncConnection, queue: str, count: int) -> list[Message]:
    channel = await conn.channel()
    taken: list[Message] = []
    async for message in channel.consume(queue, prefetch=count, timeout=DEADLINE):
        taken.append(message)
        if len(taken) == count:
            break
    return taken


async def _ready_count(conn: AsyncConnection, queue: str) -> int:
    channel = await conn.channel()
    count = (await channel.queue_declare(queue, passive=True)).message_count
    await channel.close()
    return count


async def test_ack_nack_and_reject_can_be_awaited_or_called(
    conn: AsyncConnection, names: Names
) -> None:
    queue = names.queue()
    await _fill(conn, queue, 6)
    first, second, third, fourth, fifth, sixth = await _take(conn, queue, 6)
    assert await first.ack() is None
    assert isinstance(second.ack(), Settled)
    await third.nack(requeue=False)
    fourth.nack(requeue=False)
    await fifth.reject(requeue=True)  # back on the queue
    sixth.reject(requeue=False)
    assert all(m.settled for m in (first, second, third, fourth, fifth, sixth))
    with pytest.raises(InvalidStateError, match="already acknowledged"):
        await first.ack()
    # Only the rejected-with-requeue one comes back: the others were settled once each.
    (again,) = await _take(conn, queue, 1)
    assert again.body == fifth.body and again.redelivered
    await again.ack()
    assert await _ready_count(conn, queue) == 0


def test_the_sync_api_acks_as_a_plain_call(url: str, names: Names) -> None:
    queue = names.queue()
    with Connection(url) as conn:
        channel = conn.channel()
        channel.queue_declare(queue)
        channel.basic_publish("", queue, b"x")
        (message,) = list(channel.consume(queue, prefetch=1, timeout=2))
        message.ack()
        assert message.settled
        assert channel.queue_declare(queue, passive=True).message_count == 0


async def test_a_consumer_handler_may_await_its_ack(conn: AsyncConnection, names: Names) -> None:
    queue = names.queue()
    await _fill(conn, queue, 3)
    handled: list[bytes] = []

    async def handler(message: Message) -> None:
        await message.ack()  # the consumer does not ack it a second time
        handled.append(message.body)

    consumer = conn.consumer(queue, handler)
    async with consumer:
        for _ in range(int(DEADLINE / 0.05)):
            if len(handled) == 3:
                break
            await asyncio.sleep(0.05)
    assert handled == [b"m0", b"m1", b"m2"]
    assert consumer.channel is not None and consumer.channel.close_exc is not None
    assert isinstance(consumer.channel.close_exc, ChannelClosedByClient)  # not a 406
    assert await _ready_count(conn, queue) == 0
