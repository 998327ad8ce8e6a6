"""Stream queues over AMQP 0-9-1, single active consumer, and quorum-queue QoS rules.

Streams: a consumer starts where ``x-stream-offset`` says (first, last, next, an offset,
a timestamp), needs a prefetch and manual acks, and sees each delivery's offset as
``Message.stream_offset``. The client refuses, before sending ``basic.consume``, what the
broker would refuse by closing the channel. Single active consumer: of two consumers
only one gets messages, and the other takes over when it cancels.
"""

from __future__ import annotations

import asyncio
from datetime import UTC, datetime, timedelta
from typing import TYPE_CHECKING

import pytest

import rabbitry
from rabbitry import ConfigurationError
from rabbitry.topology import Queue, Topology

if TYPE_CHECKING:
    from collections.abc import Awaitable, Callable

    from tests.integration.conftest import Names

    from rabbitry.message import Message

WAIT = 10.0


async def publish_all(conn: rabbitry.AsyncConnection, queue: str, bodies: list[str]) -> None:
    async with await conn.publisher() as publisher:
        for body in bodies:
            await publisher.send(body, routing_key=queue)
        await publisher.wait_for_confirms(timeout=WAIT)


async def read(
    conn: rabbitry.AsyncConnection, queue: str, offset: object, count: int, settle: float = 0.3
) -> list[Message]:
    """Consume ``queue`` from ``offset`` until ``count`` messages came, then ``settle``
    seconds more (to see that nothing else arrives)."""
    got: list[Message] = []
    enough = asyncio.Event()

    async def handler(message: Message) -> None:
        got.append(message)
        if len(got) >= count:
            enough.set()

    consumer = conn.consumer(queue, handler, prefetch=50, arguments={"x-stream-offset": offset})
    async with consumer:
        await asyncio.wait_for(enough.wait(), WAIT)
        await asyncio.sleep(settle)
    return got


async def declare_stream(conn: rabbitry.AsyncConnection, names: Names) -> str:
    queue = names.queue("stream")
    await Topology(queues=[Queue(queue, queue_type="stream")]).aapply(conn)
    return queue


async def test_stream_offsets_first_offset_last_next(
    conn: rabbitry.AsyncConnection, names: Names
) -> None:
    queue = await declare_stream(conn, names)
    await publish_all(conn, queue, [str(i) for i in range(10)])

    first = await read(conn, queue, "first", 10)
    assert [m.body for m in first] == [str(i).encode() for i in range(10)]
    offsets = [m.stream_offset for m in first]
    assert all(isinstance(o, int) for o in offsets)
    assert offsets == sorted(offsets)
    assert len(set(offsets)) == 10

    # Reading from a stored offset starts exactly there.
    from_sixth = await read(conn, queue, offsets[5], 5)
    assert [m.body for m in from_sixth] == [str(i).encode() for i in range(5, 10)]
    assert [m.stream_offset for m in from_sixth] == offsets[5:]

    # "last" starts at the last chunk: it includes the last message.
    last = await read(conn, queue, "last", 1)
    assert last[-1].body == b"9"

    # "next" skips everything stored: only what is published afterwards arrives.
    got: list[Message] = []

    async def handler(message: Message) -> None:
        got.append(message)

    async with conn.consumer(queue, handler, prefetch=10, arguments={"x-stream-offset": "next"}):
        await asyncio.sleep(0.3)
        await publish_all(conn, queue, ["new"])
        async with asyncio.timeout(WAIT):
            while not got:
                await asyncio.sleep(0.02)
        await asyncio.sleep(0.3)
    assert [m.body for m in got] == [b"new"]
    assert got[0].stream_offset is not None
    assert got[0].stream_offset > offsets[-1]


async def test_stream_offset_by_timestamp(conn: rabbitry.AsyncConnection, names: Names) -> None:
    queue = await declare_stream(conn, names)
    await publish_all(conn, queue, ["old-1", "old-2"])
    # AMQP timestamps are whole seconds: wait until the next second has begun.
    since = datetime.now(UTC).replace(microsecond=0) + timedelta(seconds=1)
    await asyncio.sleep((since - datetime.now(UTC)).total_seconds() + 0.1)
    await publish_all(conn, queue, ["new-1", "new-2"])
    got = await read(conn, queue, since, 2)
    assert [m.body for m in got] == [b"new-1", b"new-2"]


async def test_stream_consumer_rules_are_checked_before_the_wire(
    conn: rabbitry.AsyncConnection, names: Names
) -> None:
    queue = await declare_stream(conn, names)

    async def handler(message: Message) -> None:
        pass

    with pytest.raises(ConfigurationError, match="prefetch"):
        conn.consumer(queue, handler, prefetch=0, arguments={"x-stream-offset": "first"})
    with pytest.raises(ConfigurationError, match="manual"):
        conn.consumer(queue, handler, ack="auto", arguments={"x-stream-offset": "first"})
    with pytest.raises(ConfigurationError, match="x-stream-offset"):
        conn.consumer(queue, handler, arguments={"x-stream-offset": "yesterday"})

    # A raw channel: the queue is known to be a stream (declared through the topology).
    ch = await conn.channel()
    with pytest.raises(ConfigurationError, match="prefetch"):
        await ch.basic_consume(queue, handler)
    await ch.basic_qos(10, global_=True)
    with pytest.raises(ConfigurationError, match="global"):
        await ch.basic_consume(queue, handler)
    assert ch.is_open  # nothing was sent: the broker did not close the channel
    await ch.basic_qos(10)
    tag = await ch.basic_consume(queue, handler)
    await ch.basic_cancel(tag)
    await ch.close()


async def test_quorum_queue_refuses_global_qos(
    conn: rabbitry.AsyncConnection, names: Names
) -> None:
    queue = names.queue("quorum")
    await Topology(queues=[Queue(queue, queue_type="quorum", delivery_limit=3)]).aapply(conn)

    async def handler(message: Message) -> None:
        pass

    ch = await conn.channel()
    await ch.basic_qos(10, global_=True)
    with pytest.raises(ConfigurationError, match="global QoS"):
        await ch.basic_consume(queue, handler)
    with pytest.raises(ConfigurationError, match="only stream queues"):
        await ch.basic_consume(queue, handler, arguments={"x-stream-offset": "first"})
    assert ch.is_open
    await ch.basic_qos(10)  # per-consumer QoS is fine
    tag = await ch.basic_consume(queue, handler)
    await ch.basic_cancel(tag)
    await ch.close()


@pytest.mark.parametrize("queue_type", ["classic", "quorum"])
async def test_single_active_consumer_hands_over_on_cancel(
    conn: rabbitry.AsyncConnection, names: Names, queue_type: str
) -> None:
    queue = names.queue("sac")
    await Topology(
        queues=[Queue(queue, queue_type=queue_type, single_active_consumer=True)]
    ).aapply(conn)
    got: dict[str, list[bytes]] = {"a": [], "b": []}

    def handler_for(who: str) -> Callable[[Message], Awaitable[None]]:
        async def handler(message: Message) -> None:
            got[who].append(message.body)

        return handler

    a = conn.consumer(queue, handler_for("a"), prefetch=10)
    b = conn.consumer(queue, handler_for("b"), prefetch=10)
    await a.start()
    await b.start()
    await publish_all(conn, queue, [f"m{i}" for i in range(10)])
    async with asyncio.timeout(WAIT):
        while len(got["a"]) < 10:
            await asyncio.sleep(0.02)
    await asyncio.sleep(0.2)
    assert got["b"] == []  # only the active consumer gets messages

    await a.stop()  # the other one takes over
    await publish_all(conn, queue, [f"n{i}" for i in range(10)])
    async with asyncio.timeout(WAIT):
        while len(got["b"]) < 10:
            await asyncio.sleep(0.02)
    await b.stop()
    assert got["a"] == [f"m{i}".encode() for i in range(10)]
    assert got["b"] == [f"n{i}".encode() for i in range(10)]


async def test_quorum_delivery_limit_dead_letters_a_poison_message(
    conn: rabbitry.AsyncConnection, names: Names
) -> None:
    queue, dlq = names.queue("quorum"), names.queue("dlq")
    await Topology(
        queues=[
            Queue(dlq),
            Queue(
                queue,
                queue_type="quorum",
                delivery_limit=2,
                dead_letter_exchange="",
                dead_letter_routing_key=dlq,
            ),
        ]
    ).aapply(conn)
    await publish_all(conn, queue, ["poison"])
    ch = await conn.channel()
    deliveries = 0
    async with asyncio.timeout(WAIT):
        while True:  # until it shows up in the dead-letter queue
            message = await ch.basic_get(queue)
            if message is not None:
                deliveries += 1
                message.nack(requeue=True)
                continue
            dead = await ch.basic_get(dlq, no_ack=True)
            if dead is not None:
                break
            await asyncio.sleep(0.05)
    # The first delivery plus delivery_limit redeliveries; then it is dead-lettered.
    assert deliveries == 3
    assert dead.body == b"poison"
    await ch.close()
