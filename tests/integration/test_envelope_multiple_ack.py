"""A record's ``ack(multiple=True)`` means what it means for a message: every record the
iterator handed out up to it is acknowledged, those of earlier envelopes included.

The loop is the one consumers write for plain messages ("ack every Nth with
``multiple=True``"); it must keep working the day the producer switches to a
batching publisher.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from tests.support.proxy import TcpProxy

import rabbitry
from rabbitry import (
    AsyncBatchingPublisher,
    AsyncConnection,
    BatchingPublisher,
    Properties,
    RecoveryPolicy,
)
from rabbitry.config import parse_urls

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


def _spring_envelope(*records: bytes) -> bytes:
    return b"".join(len(r).to_bytes(4, "big") + r for r in records)


SPRING = Properties(headers={"springBatchFormat": "lengthHeader4"})
#: Three envelopes and a plain message between the first two.
MIXED = [
    (_spring_envelope(b"a0", b"a1", b"a2"), SPRING),
    (b"p0", None),
    (_spring_envelope(b"b0", b"b1", b"b2"), SPRING),
    (_spring_envelope(b"c0", b"c1", b"c2"), SPRING),
]


def test_sync_nack_of_a_record_with_multiple_covers_everything_handed_out_up_to_it(
    url: str, names: Names
) -> None:
    """``nack(multiple=True, requeue=False)`` on ``b1``: the first envelope and the plain
    message go at once (no dead-letter exchange: dropped); ``b2`` is still handed out,
    and once it is acked b's envelope goes too, rejected; the last envelope, handed out
    and never settled, comes back to the queue."""
    queue = names.queue()
    with rabbitry.Connection(url) as conn:
        channel = conn.channel()
        channel.queue_declare(queue)
        with conn.publisher() as publisher:
            for body, props in MIXED:
                publisher.publish(body, routing_key=queue, properties=props).result(WAIT)
        seen = []
        for message in channel.consume(queue, prefetch=100, timeout=1):
            seen.append(message.body)
            if message.body == b"a0":
                message.ack()
            if message.body == b"b1":
                message.nack(multiple=True, requeue=False)
            if message.body == b"b2":
                message.ack()
        assert b" ".join(seen) == b"a0 a1 a2 p0 b0 b1 b2 c0 c1 c2"
        channel.close()
        assert conn.channel().queue_declare(queue, passive=True).message_count == 1


async def test_async_nack_of_a_record_with_multiple_covers_everything_handed_out_up_to_it(
    conn: AsyncConnection, names: Names
) -> None:
    queue = names.queue()
    channel = await conn.channel()
    await channel.queue_declare(queue)
    async with await conn.publisher() as publisher:
        for body, props in MIXED:
            await publisher.publish(body, routing_key=queue, properties=props)
    seen = []
    async for message in channel.consume(queue, prefetch=100, timeout=1):
        seen.append(message.body)
        if message.body == b"a0":
            message.ack()
        if message.body == b"b1":
            message.nack(multiple=True, requeue=False)
        if message.body == b"b2":
            message.ack()
    assert b" ".join(seen) == b"a0 a1 a2 p0 b0 b1 b2 c0 c1 c2"
    await channel.close()
    check = await conn.channel()
    assert (await check.queue_declare(queue, passive=True)).message_count == 1


RECOVER = RecoveryPolicy(initial_delay=0.05, max_delay=0.5)
ENVELOPES = 3
RECORDS_EACH = 4
ALL_RECORDS = sorted(b"%d.%d" % (e, r) for e in range(ENVELOPES) for r in range(RECORDS_EACH))


def _publish_envelopes(conn: rabbitry.Connection, queue: str) -> None:
    with conn.publisher() as publisher:
        for e in range(ENVELOPES):
            records = [b"%d.%d" % (e, r) for r in range(RECORDS_EACH)]
            body = _spring_envelope(*records)
            publisher.publish(body, routing_key=queue, properties=SPRING).result(WAIT)


def test_sync_multiple_ack_of_a_record_from_before_a_recovery_acks_nothing_after_it(
    url: str, names: Names
) -> None:
    """A record handed out before the connection recovered is acked with ``multiple``
    once the envelopes came back: the ack is dropped as stale (the broker redelivered
    them), the channel stays open, and no redelivered envelope is acked by it."""
    queue = names.queue()
    params = parse_urls(url)[0]
    with TcpProxy(params.host, params.port) as proxy:
        with rabbitry.Connection(proxy.url(), recovery=RECOVER) as conn:
            channel = conn.channel()
            channel.queue_declare(queue)
            _publish_envelopes(conn, queue)
            stale: rabbitry.Message | None = None
            for message in channel.consume(queue, prefetch=100, timeout=WAIT):
                if stale is None:
                    assert proxy.reset() == 1
                if message.redelivered:  # the first delivery of the recovered channel
                    assert stale is not None
                    stale.ack(multiple=True)
                    break
                stale = message
            assert channel.stale_settlements >= 1
            channel.queue_declare(queue, passive=True)  # the channel is still open
            channel.close()
            again = []
            for message in conn.channel().consume(queue, timeout=1):
                again.append(message.body)
                message.ack()
            assert sorted(again) == ALL_RECORDS


async def test_async_multiple_ack_of_a_record_from_before_a_recovery_acks_nothing_after_it(
    url: str, names: Names
) -> None:
    queue = names.queue()
    params = parse_urls(url)[0]
    with TcpProxy(params.host, params.port) as proxy:
        with rabbitry.Connection(url) as setup:
            setup.channel().queue_declare(queue)
            _publish_envelopes(setup, queue)
        async with AsyncConnection(proxy.url(), recovery=RECOVER) as conn:
            channel = await conn.channel()
            stale: rabbitry.Message | None = None
            async for message in channel.consume(queue, prefetch=100, timeout=WAIT):
                if stale is None:
                    assert proxy.reset() == 1
                if message.redelivered:
                    assert stale is not None
                    stale.ack(multiple=True)
                    break
                stale = message
            assert channel.stale_settlements >= 1
            await channel.queue_declare(queue, passive=True)  # the channel is still open
            await channel.close()
            again = []
            async for message in (await conn.channel()).consume(queue, timeout=1):
                again.append(message.body)
                message.ack()
            assert sorted(again) == ALL_RECORDS
