"""Review findings: each test reproduces one suspected bug and is marked xfail(strict=True).

Unit-style tests use the scripted broker of ``tests/unit/fake_broker.py``; integration
tests use the real broker at ``RABBITMQ_URL`` (default amqp://guest:guest@127.0.0.1:5672/)
and delete every entity they create.
"""

from __future__ import annotations

import asyncio
import sys
import threading
import time
import uuid
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "unit"))

from fake_broker import FakeBroker

import rabbitry
from rabbitry.config import default_url, parse_urls
from rabbitry.exceptions import PoolTimeout
from rabbitry.protocol import spec
from rabbitry.topology import RetryPolicy

if TYPE_CHECKING:
    from collections.abc import AsyncIterator, Callable, Iterator

    from rabbitry.protocol.message import Message

pytestmark = pytest.mark.timeout(60)

WAIT = 10.0
URL = default_url()


# =========================================================================== helpers


def _name(suffix: str) -> str:
    return f"rabbitry-review-{uuid.uuid4().hex[:8]}-{suffix}"


async def _eventually(predicate: Callable[[], bool], timeout: float = WAIT) -> bool:
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            return False
        await asyncio.sleep(0.01)
    return True


def _eventually_sync(predicate: Callable[[], bool], timeout: float = WAIT) -> bool:
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            return False
        time.sleep(0.01)
    return True


async def _cleanup(queues: list[str], exchanges: list[str]) -> None:
    async with rabbitry.AsyncConnection(URL, connection_timeout=5) as connection:
        for name in queues:
            ch = await connection.channel()
            try:
                await ch.queue_delete(name, timeout=5)
            except rabbitry.AMQPError:
                pass
        for name in exchanges:
            ch = await connection.channel()
            try:
                await ch.exchange_delete(name, timeout=5)
            except rabbitry.AMQPError:
                pass


async def _ready_count(queue: str) -> int:
    async with rabbitry.AsyncConnection(URL, connection_timeout=5) as connection:
        ch = await connection.channel()
        reply = await ch.queue_declare(queue, passive=True, timeout=5)
        return reply.message_count


@pytest.fixture
async def aconn() -> AsyncIterator[rabbitry.AsyncConnection]:
    connection = rabbitry.AsyncConnection(URL, connection_timeout=5)
    await connection.connect()
    try:
        yield connection
    finally:
        await connection.close()


@pytest.fixture
def broker() -> Iterator[FakeBroker]:
    with FakeBroker() as fake:
        yield fake


class _StallConfirmBroker(FakeBroker):
    """Answers everything the fake broker answers, except confirm.select (while ``stall``)."""

    stall = True

    def _method(self, conn: Any, channel: int, method: Any) -> None:
        if type(method) is spec.ConfirmSelect and self.stall:
            conn.channels[channel].confirm = True
            return
        super()._method(conn, channel, method)


# =========================================================================== consumer


@pytest.mark.integration
async def test_batch_multiple_ack_acks_earlier_message_whose_move_failed(
    aconn: rabbitry.AsyncConnection,
) -> None:
    queue = _name("work")
    dlx = f"{queue}.dlx"  # exists, but nothing is bound: every retry move is unroutable
    policy = RetryPolicy(delays=[0.1, 0.2], max_attempts=3, queue=queue)
    # The retry queues exist too (start() checks that), unbound: moves stay unroutable.
    helpers = [*policy.names(queue).retry_queues, f"{queue}.parking-lot"]
    try:
        ch = await aconn.channel()
        await ch.queue_declare(queue)
        await ch.exchange_declare(dlx, "direct")
        for helper in helpers:
            await ch.queue_declare(helper)
        await ch.basic_publish("", queue, b"bad")
        await ch.basic_publish("", queue, b"good")
        await ch.close()

        handled: list[bytes] = []

        async def handler(batch: list[Message]) -> None:
            handled.extend(m.body for m in batch)
            if batch[0].body == b"bad":
                raise ValueError("boom")

        # Several delays: the client-republish path (confirmed + mandatory move).
        consumer = aconn.consumer(
            queue, handler, retry=policy, batch_size=1, batch_timeout=0.05, prefetch=10
        )
        await consumer.start(timeout=5)
        # The unmoved "bad" message is requeued (after a pause) and handled again, so
        # only the start of the history is fixed; the invariant checked below is that
        # it is never lost.
        assert await _eventually(lambda: handled[:2] == [b"bad", b"good"] and consumer.stats.acked)
        await asyncio.sleep(0.2)
        await consumer.stop(timeout=5)
        # The "bad" message was neither moved (unroutable) nor acked on purpose: closing
        # the channel must hand it back to the queue. It must not be lost.
        counts: list[int] = []

        async def back() -> bool:
            counts.append(await _ready_count(queue))
            return counts[-1] == 1

        deadline = time.monotonic() + 3
        while not await back() and time.monotonic() < deadline:
            await asyncio.sleep(0.1)
        assert counts[-1] == 1, f"the failed, unmoved message was lost (ready={counts[-1]})"
    finally:
        await _cleanup([queue, *helpers], [dlx])


@pytest.mark.integration
async def test_failed_retry_move_stalls_consumer_instead_of_redelivering(
    aconn: rabbitry.AsyncConnection,
) -> None:
    queue = _name("work")
    dlx = f"{queue}.dlx"  # exists, nothing bound: the move is returned (unroutable)
    policy = RetryPolicy(delays=[0.1, 0.2], max_attempts=3, queue=queue)
    # The retry queues exist too (start() checks that), unbound: moves stay unroutable.
    helpers = [*policy.names(queue).retry_queues, f"{queue}.parking-lot"]
    try:
        ch = await aconn.channel()
        await ch.queue_declare(queue)
        await ch.exchange_declare(dlx, "direct")
        for helper in helpers:
            await ch.queue_declare(helper)
        await ch.basic_publish("", queue, b"bad")
        await ch.basic_publish("", queue, b"good")
        await ch.close()

        seen: list[bytes] = []

        async def handler(message: Message) -> None:
            seen.append(message.body)
            if message.body == b"bad":
                raise ValueError("boom")

        consumer = aconn.consumer(queue, handler, retry=policy, prefetch=1)
        await consumer.start(timeout=5)
        try:
            # docs/topology.md: "if the republish is not confirmed (nack, timeout,
            # unroutable, channel closed) the original is not acked and the broker delivers
            # it again". Either "bad" comes again or at least "good" gets through.
            progressed = await _eventually(
                lambda: seen.count(b"bad") >= 2 or b"good" in seen, timeout=5
            )
        finally:
            await consumer.stop(timeout=5)
        assert progressed, f"consumer stalled after a failed move; handled only {seen}"
    finally:
        await _cleanup([queue, *helpers], [dlx])


@pytest.mark.integration
async def test_resubscribe_strands_messages_of_existing_server_named_queue(
    aconn: rabbitry.AsyncConnection,
) -> None:
    from rabbitry.topology import Binding, Exchange, Queue, Topology

    exchange = _name("x")
    try:
        work = Queue("", durable=False, exclusive=True)
        topology = Topology([Exchange(exchange, "direct", durable=False)], [work], [])
        topology = Topology(topology.exchanges, topology.queues, [Binding(exchange, work, "k")])
        result = await topology.aapply(aconn, timeout=5)
        old_name = result.name_of(work)
        ch = await aconn.channel()
        await ch.basic_publish(exchange, "k", b"m1")
        await ch.close()

        deliveries: list[tuple[bytes, bool]] = []

        async def handler(message: Message) -> None:
            deliveries.append((message.body, message.redelivered))
            if len(deliveries) == 1:
                # Any channel error (here 403 ACCESS_REFUSED) closes the consumer's channel:
                # the broker requeues m1 into its queue, the consumer resubscribes.
                await message.channel.exchange_declare("amq.review-forbidden", "direct")

        consumer = aconn.consumer(old_name, handler)
        await consumer.start(timeout=5)
        try:
            redelivered = await _eventually(lambda: len(deliveries) >= 2, timeout=5)
        finally:
            await consumer.stop(timeout=5)
        ch = await aconn.channel()
        stranded = (await ch.queue_declare(old_name, passive=True, timeout=5)).message_count
        await ch.close()
        assert redelivered, (
            f"m1 never came back: the consumer moved from {old_name!r} to {consumer.queue!r}, "
            f"{stranded} message(s) stranded in the old queue"
        )
    finally:
        await _cleanup([], [exchange])


@pytest.mark.integration
@pytest.mark.xfail(
    strict=True,
    reason="BUG: with ack='auto' no basic.qos is sent and nothing pauses the socket, so "
    "the consumer's inbox grows without bound behind a slow handler",
)
async def test_auto_ack_consumer_inbox_is_unbounded(aconn: rabbitry.AsyncConnection) -> None:
    queue = _name("work")
    release = asyncio.Event()
    try:
        ch = await aconn.channel()
        await ch.queue_declare(queue)
        for _ in range(500):
            await ch.basic_publish("", queue, b"x")
        await ch.close()

        async def handler(message: Message) -> None:
            await release.wait()

        consumer = aconn.consumer(queue, handler, ack="auto", prefetch=10)
        await consumer.start(timeout=5)
        try:
            await _eventually(lambda: consumer.stats.delivered >= 500, timeout=3)
            held = len(consumer._inbox)
        finally:
            release.set()
            await consumer.stop(drain=False, timeout=5)
        # docs/consuming.md: "Prefetch bounds how many unacknowledged messages, and so how
        # much memory, the consumer holds."
        assert held <= consumer.prefetch, f"{held} messages buffered with prefetch=10"
    finally:
        await _cleanup([queue], [])


@pytest.mark.integration
async def test_consumer_sends_stale_ack_after_recovery() -> None:
    from tests.support.proxy import TcpProxy

    from rabbitry.recovery import RecoveryPolicy

    queue = _name("work")
    go = asyncio.Event()
    deliveries: list[int] = []
    async with rabbitry.AsyncConnection(URL, connection_timeout=5) as admin:
        ch = await admin.channel()
        await ch.queue_declare(queue)
        broker = parse_urls(URL)[0]
        proxy = TcpProxy(broker.host, broker.port).start()
        conn = rabbitry.AsyncConnection(
            proxy.url(),
            connection_timeout=5,
            recovery=RecoveryPolicy(initial_delay=0.05, max_delay=0.5),
        )
        try:
            await conn.connect()

            async def handler(message: Message) -> None:
                deliveries.append(message.delivery_tag)
                if len(deliveries) == 1:
                    await go.wait()  # still running when the connection is recovered

            consumer = conn.consumer(queue, handler)
            await consumer.start(timeout=5)
            await ch.basic_publish("", queue, b"m1")
            assert await _eventually(lambda: len(deliveries) == 1)
            channel = consumer.channel
            assert channel is not None
            proxy.reset()
            # Recovery resubscribes; the broker redelivers m1 on the new channel (it waits
            # in the inbox behind the first, still running, handler).
            assert await _eventually(lambda: consumer.stats.delivered >= 2)
            go.set()
            assert await _eventually(lambda: len(deliveries) >= 2)
            await asyncio.sleep(0.5)
            # DESIGN §2: "After recovery, acks for delivery tags of the old channel are
            # dropped with a warning, never sent (no 406 on the new channel)."
            assert channel.close_exc is None, f"stale ack sent: {channel.close_exc!r}"
            await consumer.stop(timeout=5)
        finally:
            await conn.close()
            proxy.stop()
            await ch.queue_delete(queue)


# =========================================================================== pool


async def test_pool_acquire_timeout_during_confirm_select_leaks_channel() -> None:
    with _StallConfirmBroker() as broker:
        connection = rabbitry.AsyncConnection(broker.url, heartbeat=0, connection_timeout=5)
        await connection.connect()
        try:
            pool = await connection.channel_pool(1, confirm=True)
            with pytest.raises(PoolTimeout):
                async with pool.acquire(timeout=0.3):
                    pass
            assert pool.open_channels == 0  # the pool forgot the channel...
            # ...so it must have closed it; otherwise the pool's size bound is a lie.
            await asyncio.sleep(0.3)
            open_channels = [ch for ch in connection._channels.values() if ch.is_open]
            assert not open_channels, f"leaked channels: {open_channels}"
        finally:
            await connection.close(timeout=2)


@pytest.mark.integration
def test_sync_consumer_stop_timeout_is_not_kept() -> None:
    queue = _name("work")
    release = threading.Event()
    started = threading.Event()
    try:
        with rabbitry.Connection(URL, connection_timeout=5) as connection:
            ch = connection.channel()
            ch.queue_declare(queue)
            ch.basic_publish("", queue, b"slow")

            def handler(message: Message) -> None:
                started.set()
                release.wait(8)

            consumer = connection.consumer(queue, handler)
            consumer.start(timeout=5)
            assert started.wait(WAIT)
            stopped = threading.Event()
            stopper = threading.Thread(
                target=lambda: (consumer.stop(timeout=0.5), stopped.set()), daemon=True
            )
            t0 = time.monotonic()
            stopper.start()
            # stop(timeout=0.5) promises to stop waiting for handlers after 0.5 s.
            finished_in_time = stopped.wait(3.0)
            requeued_while_running = ch.queue_declare(queue, passive=True).message_count
            release.set()
            stopper.join(10)
            elapsed = time.monotonic() - t0
            assert finished_in_time and requeued_while_running == 0, (
                f"stop(timeout=0.5) took {elapsed:.1f} s; the message was back in the queue "
                f"({requeued_while_running}) while its handler still ran"
            )
    finally:
        release.set()
        asyncio.run(_cleanup([queue], []))


# =========================================================================== publisher


def test_sync_publisher_close_drops_accepted_backlog(broker: FakeBroker) -> None:
    broker.auto_ack = True
    connection = rabbitry.Connection(broker.url, heartbeat=0, connection_timeout=5)
    connection.connect()
    try:
        pub = connection.publisher()
        first = pub.publish(b"x", routing_key="q")
        got = broker.wait_published(1)
        assert first.result(WAIT) is None
        broker.close_channel(got[0].channel)
        assert _eventually_sync(lambda: pub._async._channel._proto.state.value != "open")
        # Accepted: publish() returned a future, the message waits for a new channel.
        accepted = pub.publish(b"y", routing_key="q")
        pub.close(timeout=5)  # "waits for outstanding confirms, then closes"
        error = accepted.exception(WAIT)
        assert error is None, f"an accepted message was dropped on close: {error!r}"
        assert [p.body for p in broker.published] == [b"x", b"y"]
    finally:
        connection.close(timeout=2)


async def test_publisher_close_during_channel_reopen_leaks_channel() -> None:
    with _StallConfirmBroker() as broker:
        broker.stall = False
        connection = rabbitry.AsyncConnection(broker.url, heartbeat=0, connection_timeout=5)
        await connection.connect()
        try:
            pub = await connection.publisher()
            first = pub.channel_id
            assert first is not None
            broker.close_channel(first)
            assert await _eventually(lambda: not pub._channel.is_open)  # type: ignore[union-attr]
            broker.stall = True
            sending = asyncio.create_task(pub.publish(b"x", routing_key="q"))
            # The replacement channel is open; its confirm.select has no answer yet.
            assert await _eventually(lambda: len(broker.sent(spec.ConfirmSelect)) == 2)
            second = broker.sent(spec.ConfirmSelect)[1][0]
            await pub.close(timeout=1)
            broker.send(second, spec.ConfirmSelectOk())
            with pytest.raises(rabbitry.AMQPError):
                await sending
            await asyncio.sleep(0.2)
            still_open = [ch for ch in connection._channels.values() if ch.is_open]
            assert not still_open, f"closed publisher left {still_open} open"
        finally:
            await connection.close(timeout=2)


async def test_pool_settle_busy_loops_on_cancelled_confirm(broker: FakeBroker) -> None:
    connection = rabbitry.AsyncConnection(broker.url, heartbeat=0, connection_timeout=5)
    await connection.connect()
    try:
        pool = await connection.channel_pool(1, confirm=True)
        scans = 0

        class CountingDict(dict):  # type: ignore[type-arg]
            def values(self) -> Any:
                nonlocal scans
                scans += 1
                return super().values()

        async with pool.acquire(timeout=5) as channel:
            channel._confirms = CountingDict(channel._confirms)
            confirm = await channel.basic_publish("", "q", b"x")
            assert confirm is not None
            with pytest.raises(TimeoutError):
                await asyncio.wait_for(confirm, 0.01)  # cancels the future on timeout
        await asyncio.sleep(0.3)  # no ack from the broker yet
        broker.ack(1)
        await asyncio.sleep(0.1)
        assert scans < 20, f"the confirm table was scanned {scans} times in 0.3 s"
    finally:
        await connection.close(timeout=2)
