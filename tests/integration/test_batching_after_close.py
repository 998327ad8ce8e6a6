"""A batching publisher whose connection closed for good (recovery gave up) refuses
records at once, as the plain publisher does, instead of accepting them to fail later:
a producer thread stops with a typed error, and records already buffered fail."""

from __future__ import annotations

import asyncio
import logging
import threading
from typing import TYPE_CHECKING

import pytest
from tests.support.proxy import TcpProxy

import rabbitry
from rabbitry import (
    AsyncBatchingPublisher,
    AsyncConnection,
    BatchingPublisher,
    InvalidStateError,
    RecoveryPolicy,
)
from rabbitry.config import parse_urls

if TYPE_CHECKING:
    from tests.integration.conftest import Names

WAIT = 20.0
GIVE_UP = RecoveryPolicy(initial_delay=0.05, max_delay=0.1, max_attempts=2)


def test_a_producer_thread_stops_when_recovery_gives_up(
    url: str, names: Names, caplog: pytest.LogCaptureFixture
) -> None:
    queue = names.queue()
    params = parse_urls(url)[0]
    with TcpProxy(params.host, params.port) as proxy:
        conn = rabbitry.Connection(proxy.url(), connection_timeout=1, recovery=GIVE_UP)
        conn.connect()
        conn.channel().queue_declare(queue, auto_delete=True)
        publisher = conn.publisher()
        batching = BatchingPublisher(publisher, batch_records=50, linger=30)
        held = batching.publish(b"held", routing_key=queue)  # in the open batch
        stop = threading.Event()
        ended: list[BaseException] = []
        accepted = 0

        def produce() -> None:
            nonlocal accepted
            try:
                while not stop.is_set():
                    batching.publish(b"r", routing_key=queue)
                    accepted += 1
            except BaseException as exc:
                ended.append(exc)

        caplog.set_level(logging.ERROR, logger="rabbitry")
        proxy.refuse(True)
        proxy.reset()
        conn.wait_closed(WAIT)
        producer = threading.Thread(target=produce)
        producer.start()
        producer.join(WAIT)
        stop.set()
        producer.join(WAIT)
        assert len(ended) == 1, "the producer thread kept publishing into a dead connection"
        assert isinstance(ended[0], InvalidStateError)
        # The plain publisher's error, with the same cause: the connection's end.
        with pytest.raises(InvalidStateError) as plain:
            publisher.publish(b"plain", routing_key=queue)
        assert plain.value.__cause__ is not None
        assert type(ended[0].__cause__) is type(plain.value.__cause__)
        assert accepted == 0
        with pytest.raises(InvalidStateError):
            batching.publish(b"later", routing_key=queue)
        with pytest.raises(rabbitry.AMQPError):
            held.result(WAIT)
        refusals = [r for r in caplog.records if r.name == "rabbitry.batching"]
        assert len(refusals) == 1  # one line for every record it held, then silence
        assert "1 records in 1 envelopes were not sent" in refusals[0].getMessage()
        batching.close()
        conn.close()


async def test_async_batching_publisher_refuses_records_once_the_connection_is_gone(
    url: str, names: Names
) -> None:
    queue = names.queue()
    params = parse_urls(url)[0]
    with TcpProxy(params.host, params.port) as proxy:
        conn = AsyncConnection(proxy.url(), connection_timeout=1, recovery=GIVE_UP)
        await conn.connect()
        channel = await conn.channel()
        await channel.queue_declare(queue, auto_delete=True)
        publisher = await conn.publisher()
        batching = AsyncBatchingPublisher(publisher, batch_records=50, linger=30)
        held = await batching.publish(b"held", routing_key=queue)
        proxy.refuse(True)
        proxy.reset()
        await conn.wait_closed(WAIT)
        with pytest.raises(InvalidStateError) as refused:
            await batching.publish(b"later", routing_key=queue)
        with pytest.raises(InvalidStateError) as plain:
            await publisher.send(b"plain", routing_key=queue)
        assert plain.value.__cause__ is not None
        assert type(refused.value.__cause__) is type(plain.value.__cause__)
        with pytest.raises(rabbitry.AMQPError):
            await asyncio.wait_for(held, WAIT)
        await batching.close()
        await conn.close()


async def test_close_refuses_records_other_tasks_publish_while_it_flushes(
    conn: AsyncConnection, names: Names
) -> None:
    """A task publishes while ``close()`` hands the last batch over: the record is
    refused with a typed error, not accepted into a batch that nothing would send."""
    queue = names.queue()
    channel = await conn.channel()
    await channel.queue_declare(queue, auto_delete=True)
    publisher = await conn.publisher()
    batching = AsyncBatchingPublisher(publisher, batch_records=50, linger=30)
    first = await batching.publish(b"first", routing_key=queue)
    closing = asyncio.ensure_future(batching.close())
    await asyncio.sleep(0)  # close() is now waiting for its last batch to be handed over
    assert not closing.done()
    with pytest.raises(InvalidStateError):
        await batching.publish(b"during close", routing_key=queue)
    await asyncio.wait_for(closing, WAIT)
    await asyncio.wait_for(first, WAIT)
    assert (await channel.queue_declare(queue, passive=True)).message_count == 1
    await publisher.close()


async def test_a_failing_record_never_drops_records_the_handler_did_not_see(
    conn: AsyncConnection, names: Names, caplog: pytest.LogCaptureFixture
) -> None:
    """No retry policy, no dead-letter exchange: an envelope with a failing record is
    dropped, but only after the handler saw every one of its records; the drop is
    counted in records and the ERROR line says how many records the envelope had."""
    queue = names.queue()
    channel = await conn.channel()
    await channel.queue_declare(queue)
    publisher = await conn.publisher()
    async with AsyncBatchingPublisher(publisher, batch_records=10, linger=30) as batching:
        futures = [await batching.publish(b"%d" % i, routing_key=queue) for i in range(1000)]
    for future in futures:
        await asyncio.wait_for(future, WAIT)
    seen: list[int] = []

    async def handle(message: rabbitry.Message) -> None:
        seen.append(int(message.body))
        if int(message.body) % 30 == 7:
            raise RuntimeError("record fails")

    failing_envelopes = len({i // 10 for i in range(1000) if i % 30 == 7})
    with caplog.at_level(logging.ERROR, logger="rabbitry.consumer"):
        async with conn.consumer(queue, handle, prefetch=20) as consumer:

            async def settled() -> None:  # every envelope acked or dropped
                while consumer.stats.acked + consumer.stats.dropped < 100:
                    await asyncio.sleep(0.01)

            await asyncio.wait_for(settled(), WAIT)
    assert seen == list(range(1000))
    assert consumer.stats.dropped == failing_envelopes
    assert consumer.stats.dropped_records == 10 * failing_envelopes
    first = next(r for r in caplog.records if "record fails" in r.getMessage())
    assert "a batch envelope: 1 of its 10 records failed" in first.getMessage()
    assert "dropped" in first.getMessage()
    assert (await channel.queue_declare(queue, passive=True)).message_count == 0
    await publisher.close()


def test_envelopes_the_publisher_refuses_are_logged_rate_limited_with_counts(
    url: str, names: Names, caplog: pytest.LogCaptureFixture
) -> None:
    """The publisher stays open but refuses envelope after envelope (its window stays
    full: the confirms are held back, and each envelope's deadline passes): a burst of
    ERROR lines, then the rest counted in one summary when the batching publisher
    closes, not one line per envelope."""
    queue = names.queue()
    params = parse_urls(url)[0]
    with TcpProxy(params.host, params.port) as proxy:
        with rabbitry.Connection(proxy.url()) as conn:
            conn.channel().queue_declare(queue)
            publisher = conn.publisher(max_in_flight=1)
            batching = BatchingPublisher(publisher, batch_records=2, linger=30, timeout=0.01)
            caplog.set_level(logging.ERROR, logger="rabbitry")
            proxy.hold("downstream")
            futures = [batching.publish(b"r", routing_key=queue) for _ in range(100)]
            batching.close()
            proxy.release("downstream")
            # The first envelope took the window's one slot and then missed its
            # deadline too, waiting for its confirm: every record failed, typed.
            for future in futures:
                assert isinstance(future.exception(WAIT), rabbitry.PublishTimeout)
            publisher.close()
    lines = [r.getMessage() for r in caplog.records if r.name == "rabbitry.batching"]
    refused = [line for line in lines if "an envelope of 2 records was not sent" in line]
    assert len(refused) == 10, lines
    assert lines[-1] == (
        "batching publisher: 39 more unsent envelopes (without traceback): 39 PublishTimeout"
    )
    assert len(lines) == 12  # the burst, the line saying the rest are counted, the summary
