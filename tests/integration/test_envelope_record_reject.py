"""A record rejected without requeue (the poison-message habit: ``reject(requeue=False)``,
``nack(requeue=False)``) goes alone: the other records of its envelope are still handed
out, so none is dropped without being seen. The envelope is dead-lettered (or dropped,
on a queue without a dead-letter exchange) once every record was settled, with the
rejected ones among them."""

from __future__ import annotations

import asyncio
from typing import TYPE_CHECKING

import rabbitry
from rabbitry import AsyncConnection, Properties

if TYPE_CHECKING:
    from tests.integration.conftest import Names

WAIT = 20.0
SPRING = Properties(headers={"springBatchFormat": "lengthHeader4"})


def _envelope(*records: bytes) -> bytes:
    return b"".join(len(r).to_bytes(4, "big") + r for r in records)


RECORDS = [b"r%d" % i for i in range(6)]


def _declare_with_dead_letters(channel: rabbitry.Channel, queue: str) -> str:
    parked = queue + ".dead"
    channel.queue_declare(parked)
    channel.queue_declare(
        queue,
        arguments={"x-dead-letter-exchange": "", "x-dead-letter-routing-key": parked},
    )
    return parked


def test_sync_iterator_hands_out_the_records_after_one_rejected_without_requeue(
    url: str, names: Names
) -> None:
    queue = names.queue()
    with rabbitry.Connection(url) as conn:
        channel = conn.channel()
        parked = _declare_with_dead_letters(channel, queue)
        with conn.publisher() as publisher:
            publisher.publish(_envelope(*RECORDS), routing_key=queue, properties=SPRING).result(
                WAIT
            )
            publisher.publish(b"plain", routing_key=queue).result(WAIT)
        seen = []
        for message in channel.consume(queue, prefetch=10, timeout=1):
            seen.append(message.body)
            if message.body == b"r2":
                message.reject(requeue=False)
            elif message.body == b"r4":
                message.nack(requeue=False)
            else:
                message.ack()
        assert seen == [*RECORDS, b"plain"]
        # Every record was settled, two of them rejected: the envelope is dead-lettered
        # whole (the records handled with it go along, as handled copies).
        assert channel.queue_declare(queue, passive=True).message_count == 0
        dead = [m.body for m in channel.consume(parked, timeout=1, unpack_batches=True)]
        assert dead == RECORDS


async def test_async_consumer_handler_sees_every_record_after_one_it_rejects(
    conn: AsyncConnection, names: Names
) -> None:
    queue = names.queue()
    channel = await conn.channel()
    await channel.queue_declare(queue)  # no dead-letter exchange: a rejected record drops
    async with await conn.publisher() as publisher:
        await publisher.publish(_envelope(*RECORDS), routing_key=queue, properties=SPRING)
    seen: list[bytes] = []

    async def handle(message: rabbitry.Message) -> None:
        seen.append(message.body)
        if message.body == b"r1":
            message.reject(requeue=False)

    async def every_record_seen() -> None:
        while len(seen) < len(RECORDS):
            await asyncio.sleep(0.01)

    async with conn.consumer(queue, handle, prefetch=10):
        await asyncio.wait_for(every_record_seen(), WAIT)
    # The consumer stopped after its last handler returned: the envelope was settled
    # (dropped, for its rejected record), not left unacked to come back.
    assert seen == RECORDS
    assert (await channel.queue_declare(queue, passive=True)).message_count == 0


async def test_a_list_handler_rejecting_a_record_dead_letters_its_envelope_once(
    conn: AsyncConnection, names: Names
) -> None:
    """A list handler rejects one record without requeue and returns: that record's
    envelope is dead-lettered (not acked with the rest), the other envelope acked."""
    queue = names.queue()
    dead_queue = queue + ".dead"
    names.track_queue(dead_queue)
    channel = await conn.channel()
    await channel.queue_declare(dead_queue)
    await channel.queue_declare(
        queue, arguments={"x-dead-letter-exchange": "", "x-dead-letter-routing-key": dead_queue}
    )
    async with await conn.publisher() as publisher:
        await publisher.publish(_envelope(b"a0", b"a1"), routing_key=queue, properties=SPRING)
        await publisher.publish(_envelope(b"b0", b"b1"), routing_key=queue, properties=SPRING)
    seen: list[bytes] = []

    async def handle(messages: list[rabbitry.Message]) -> None:
        for message in messages:
            seen.append(message.body)
            if message.body == b"b0":
                message.reject(requeue=False)

    async def every_record_seen() -> None:
        while len(seen) < 4:
            await asyncio.sleep(0.01)

    async with conn.consumer(queue, handle, batch_size=10, batch_timeout=0.2) as consumer:
        await asyncio.wait_for(every_record_seen(), WAIT)
    assert seen == [b"a0", b"a1", b"b0", b"b1"]
    assert consumer.stats.acked == 1
    assert (await channel.queue_declare(queue, passive=True)).message_count == 0
    dead = await channel.basic_get(dead_queue, no_ack=True)
    assert dead is not None and dead.body == _envelope(b"b0", b"b1")
    assert (await channel.queue_declare(dead_queue, passive=True)).message_count == 0
