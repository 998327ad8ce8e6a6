"""A record's ``ack(multiple=True)`` means what it means for a message: every record the
iterator handed out up to it is acknowledged, those of earlier envelopes included.

The loop is the one consumers write for plain messages ("ack every Nth with
``multiple=True``"); it must keep working the day the producer switches to a
batching publisher.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import rabbitry
from rabbitry import AsyncBatchingPublisher, AsyncConnection, BatchingPublisher, Properties

if TYPE_CHECKING:
    from tests.integration.conftest import Names

WAIT = 20.0
RECORDS = 2_500
PER_ENVELOPE = 25
EVERY = 10
PREFETCH = 10


def test_sync_ack_every_nth_record_with_multiple_acks_every_envelope(
    url: str, names: Names
) -> None:
    queue = names.queue()
    with rabbitry.Connection(url) as conn:
        channel = conn.channel()
        channel.queue_declare(queue)
        with conn.publisher() as publisher:
            with BatchingPublisher(publisher, batch_records=PER_ENVELOPE, linger=30) as batching:
                futures = [batching.publish(b"%d" % i, routing_key=queue) for i in range(RECORDS)]
                batching.flush()
                for future in futures:
                    future.result(WAIT)
        got = []
        for i, message in enumerate(channel.consume(queue, prefetch=PREFETCH, timeout=2)):
            got.append(int(message.body))
            if i % EVERY == EVERY - 1:
                message.ack(multiple=True)
        assert got == list(range(RECORDS))
        channel.close()  # anything still unacked goes back to the queue
        assert conn.channel().queue_declare(queue, passive=True).message_count == 0


async def test_async_ack_every_nth_record_with_multiple_acks_every_envelope(
    conn: AsyncConnection, names: Names
) -> None:
    queue = names.queue()
    channel = await conn.channel()
    await channel.queue_declare(queue)
    publisher = await conn.publisher()
    async with AsyncBatchingPublisher(publisher, batch_records=PER_ENVELOPE, linger=30) as batching:
        futures = [await batching.publish(b"%d" % i, routing_key=queue) for i in range(RECORDS)]
        await batching.flush()
        for future in futures:
            await future
    got = []
    i = 0
    async for message in channel.consume(queue, prefetch=PREFETCH, timeout=2):
        got.append(int(message.body))
        if i % EVERY == EVERY - 1:
            message.ack(multiple=True)
        i += 1
    assert got == list(range(RECORDS))
    await channel.close()
    check = await conn.channel()
    assert (await check.queue_declare(queue, passive=True)).message_count == 0


def test_multiple_ack_of_a_record_covers_plain_messages_and_earlier_records(
    url: str, names: Names
) -> None:
    """Envelopes of 3 and plain messages interleaved; one ``ack(multiple=True)`` on the
    second record of the third envelope: everything before it is gone from the queue,
    and what follows it (one record of that envelope, a plain message) comes back."""
    queue = names.queue()
    spring = Properties(headers={"springBatchFormat": "lengthHeader4"})

    def envelope(*records: bytes) -> bytes:
        return b"".join(len(r).to_bytes(4, "big") + r for r in records)

    with rabbitry.Connection(url) as conn:
        channel = conn.channel()
        channel.queue_declare(queue)
        with conn.publisher() as publisher:
            for body, props in [
                (envelope(b"a0", b"a1", b"a2"), spring),
                (b"p0", None),
                (envelope(b"b0", b"b1", b"b2"), spring),
                (b"p1", None),
                (envelope(b"c0", b"c1", b"c2"), spring),
                (b"p2", None),
            ]:
                publisher.publish(body, routing_key=queue, properties=props).result(WAIT)
        seen = []
        for message in channel.consume(queue, prefetch=100, timeout=1):
            seen.append(message.body)
            if message.body == b"c1":
                message.ack(multiple=True)
        assert b" ".join(seen) == b"a0 a1 a2 p0 b0 b1 b2 p1 c0 c1 c2 p2"
        channel.close()
        again = []
        channel = conn.channel()
        for message in channel.consume(queue, prefetch=100, timeout=1):
            again.append(message.body)
            message.ack()
        # The third envelope was never acked as a whole (c2 was not), so it comes back
        # entire, flagged redelivered; the plain message after it too. Nothing before.
        assert again == [b"c0", b"c1", b"c2", b"p2"]
