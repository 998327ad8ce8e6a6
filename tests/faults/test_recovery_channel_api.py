"""Recovery of what the channel API declared, and losses it reports instead of hiding.

Every test breaks its connection on the session's throw-away node (a forced close by
connection name, or a refused reconnect through the fault proxy) and checks, through the
public API, what came back and what was reported.
"""

from __future__ import annotations

import asyncio
import logging
import re
import threading
import time
from typing import TYPE_CHECKING

import pytest
from tests.faults.helpers import FAST, WAIT, eventually, force_close, unique
from tests.support.proxy import TcpProxy

import rabbitry
import rabbitry.exceptions
from rabbitry import (
    AsyncConnection,
    ConsumerCancelled,
    InvalidStateError,
    Message,
    RecoveryPolicy,
    State,
)

if TYPE_CHECKING:
    from collections.abc import AsyncIterator

    from tests.support.node import BrokerNode


@pytest.fixture
async def conn(broker_node: BrokerNode) -> AsyncIterator[AsyncConnection]:
    connection = AsyncConnection(
        broker_node.url, connection_name=unique("conn"), heartbeat=5, recovery=FAST
    )
    await connection.connect()
    try:
        yield connection
    finally:
        await connection.close(timeout=5)


async def _recover(node: BrokerNode, conn: AsyncConnection) -> None:
    states: list[State] = []
    conn.on_state_change(lambda state, cause: states.append(state))
    await force_close(node, conn)
    assert await eventually(lambda: State.OPEN in states), states
    await conn.wait_recovered(WAIT)


async def test_server_named_queue_binding_and_consumer_declared_on_a_channel_recover(
    broker_node: BrokerNode, conn: AsyncConnection
) -> None:
    """The RPC-reply-queue pattern: all three come back, the consumer follows the rename."""
    channel = await conn.channel()
    exchange = unique("ex")
    await channel.exchange_declare(exchange, "direct", auto_delete=False)
    first = (await channel.queue_declare("", exclusive=True)).queue
    await channel.queue_bind(first, exchange, "k")
    got: list[bytes] = []
    await channel.basic_consume(first, lambda m: (got.append(m.body), m.ack()))
    renames: list[tuple[str, str]] = []
    errors: list[tuple[str, str]] = []
    conn.on_queue_renamed(lambda old, new: renames.append((old, new)))
    conn.on_recovery_error(lambda kind, name, exc: errors.append((kind, name)))

    await _recover(broker_node, conn)

    assert errors == []
    assert len(renames) == 1 and renames[0][0] == first
    assert channel.is_open
    await channel.confirm_select()
    confirm = await channel.basic_publish(exchange, "k", b"after")
    assert confirm is not None
    await confirm
    assert await eventually(lambda: got == [b"after"]), got
    await channel.exchange_delete(exchange)


async def test_channel_deletes_and_unbinds_are_not_replayed(
    broker_node: BrokerNode, conn: AsyncConnection
) -> None:
    channel = await conn.channel()
    exchange, kept, deleted = unique("ex"), unique("kept"), unique("deleted")
    await channel.exchange_declare(exchange, "fanout")
    await channel.queue_declare(kept)
    await channel.queue_declare(deleted)
    await channel.queue_bind(kept, exchange)
    await channel.queue_bind(deleted, exchange)
    await channel.queue_unbind(kept, exchange)
    await channel.queue_delete(deleted)

    await _recover(broker_node, conn)

    record = conn.topology_record
    assert record.queue(kept) is not None
    assert record.queue(deleted) is None
    assert record.bindings_of(kept) == ()
    fresh = await conn.channel()
    with pytest.raises(rabbitry.NotFound):
        await fresh.queue_declare(deleted, passive=True)
    await channel.confirm_select()
    confirm = await channel.basic_publish(exchange, "", b"x")  # routes nowhere now
    assert confirm is not None
    await confirm
    assert (await channel.queue_declare(kept, passive=True)).message_count == 0
    await channel.queue_delete(kept)
    await channel.exchange_delete(exchange)


async def test_record_channel_topology_false_reports_the_consumer_it_cannot_restore(
    broker_node: BrokerNode, caplog: pytest.LogCaptureFixture
) -> None:
    """Opted out of recording: the exclusive queue is gone, and that is said loudly.

    The consumer's cancel path runs (iterator: ConsumerCancelled; callback consumer:
    on_cancel), the loss is an ERROR and an ``on_recovery_error`` event, another consumer
    of the same channel keeps working, and "recovered" is not a WARNING.
    """
    policy = RecoveryPolicy(
        initial_delay=0.05, max_delay=0.5, jitter=0.1, record_channel_topology=False
    )
    conn = AsyncConnection(broker_node.url, connection_name=unique("conn"), recovery=policy)
    await conn.connect()
    try:
        channel = await conn.channel()
        durable = unique("durable")
        await channel.queue_declare(durable)
        gone = (await channel.queue_declare("", exclusive=True)).queue
        cancelled: list[str] = []
        gone_tag = await channel.basic_consume(gone, lambda m: None, on_cancel=cancelled.append)
        got: list[bytes] = []
        await channel.basic_consume(durable, lambda m: (got.append(m.body), m.ack()))
        events: list[tuple[str, str, type[BaseException]]] = []
        conn.on_recovery_error(lambda kind, name, exc: events.append((kind, name, type(exc))))

        caplog.set_level(logging.INFO, logger="rabbitry")
        await _recover(broker_node, conn)

        assert cancelled == [gone_tag]
        assert [(kind, cls) for kind, _, cls in events] == [("consumer", rabbitry.NotFound)]
        assert gone_tag in events[0][1] and gone in events[0][1]
        errors = [r for r in caplog.records if r.levelno == logging.ERROR]
        assert any(gone in r.getMessage() for r in errors), [r.getMessage() for r in errors]
        recovered = [r for r in caplog.records if "recovered" in r.getMessage()]
        assert recovered and all(r.levelno == logging.INFO for r in recovered)

        assert channel.is_open  # the other consumer's channel was not taken down
        await channel.confirm_select()
        confirm = await channel.basic_publish("", durable, b"still-consumed")
        assert confirm is not None
        await confirm
        assert await eventually(lambda: got == [b"still-consumed"]), got
        await channel.queue_delete(durable)
    finally:
        await conn.close(timeout=5)


async def test_iterator_over_an_unrestorable_queue_raises_consumer_cancelled(
    broker_node: BrokerNode,
) -> None:
    policy = RecoveryPolicy(
        initial_delay=0.05, max_delay=0.5, jitter=0.1, record_channel_topology=False
    )
    conn = AsyncConnection(broker_node.url, connection_name=unique("conn"), recovery=policy)
    await conn.connect()
    try:
        channel = await conn.channel()
        gone = (await channel.queue_declare("", exclusive=True)).queue

        async def read() -> list[Message]:
            return [m async for m in channel.consume(gone, timeout=None)]

        reader = asyncio.create_task(read())
        assert await eventually(lambda: len(channel._consumer_specs()) == 1)
        await _recover(broker_node, conn)
        with pytest.raises(ConsumerCancelled):
            await asyncio.wait_for(reader, WAIT)
    finally:
        await conn.close(timeout=5)


async def test_stale_tag_with_multiple_never_settles_deliveries_made_after_recovery(
    broker_node: BrokerNode, conn: AsyncConnection
) -> None:
    """The raw channel API: a tag kept across a recovery names nothing on the new channel."""
    channel = await conn.channel()
    queue = unique("stale")
    await channel.queue_declare(queue)
    await channel.confirm_select()
    for body in (b"a", b"b", b"c"):
        confirm = await channel.basic_publish("", queue, body)
        assert confirm is not None
        await confirm
    before = [await channel.basic_get(queue) for _ in range(3)]
    assert all(m is not None for m in before)
    old_tag = before[-1].delivery_tag  # type: ignore[union-attr]

    await _recover(broker_node, conn)

    again = await channel.basic_get(queue)
    assert again is not None and again.redelivered
    assert again.delivery_tag > old_tag  # tags keep growing across the recovery
    channel.basic_ack(old_tag, multiple=True)  # dropped: it would have acked `again`
    channel.basic_nack(old_tag, requeue=False)
    assert channel.stale_settlements == 2
    # The message fetched after recovery is still unacked: a recover puts it back.
    await channel.basic_recover(requeue=True)
    assert await eventually(lambda: channel.is_open)
    count = (await channel.queue_declare(queue, passive=True)).message_count
    assert count == 3, count
    assert channel.is_open, channel.close_exc
    await channel.queue_delete(queue)


async def test_consume_iterator_timing_out_during_recovery_is_not_resubscribed(
    broker_node: BrokerNode,
) -> None:
    """An iterator abandoned while the connection is down leaves no consumer behind."""
    queue = unique("zombie")
    with TcpProxy("127.0.0.1", broker_node.port) as proxy:
        conn = AsyncConnection(proxy.url(), connection_name=unique("conn"), recovery=FAST)
        await conn.connect()
        try:
            channel = await conn.channel()
            await channel.queue_declare(queue)
            proxy.refuse()
            iterator = channel.consume(queue, prefetch=5, timeout=0.5)
            reader = asyncio.create_task(_drain(iterator))
            assert await eventually(lambda: len(channel._consumer_specs()) == 1)
            proxy.reset()
            assert await eventually(lambda: conn.state is State.RECOVERING)
            assert await asyncio.wait_for(reader, WAIT) == []  # timed out while down
            assert channel._consumer_specs() == []
            proxy.refuse(False)
            await conn.wait_recovered(WAIT)
            ok = await channel.queue_declare(queue, passive=True)
            assert ok.consumer_count == 0
            await channel.queue_delete(queue)
        finally:
            await conn.close(timeout=5)


async def _drain(iterator: AsyncIterator[Message]) -> list[Message]:
    return [m async for m in iterator]


def test_sync_consume_iterator_timing_out_during_recovery_is_not_resubscribed(
    broker_node: BrokerNode,
) -> None:
    queue = unique("zombie-sync")
    with TcpProxy("127.0.0.1", broker_node.port) as proxy:
        with rabbitry.Connection(
            proxy.url(), connection_name=unique("conn"), recovery=FAST
        ) as conn:
            channel = conn.channel()
            channel.queue_declare(queue)
            proxy.refuse()
            result: list[list[Message]] = []
            started = threading.Event()

            def read() -> None:
                iterator = channel.consume(queue, prefetch=5, timeout=0.5)
                started.set()
                result.append(list(iterator))

            reader = threading.Thread(target=read)
            reader.start()
            assert started.wait(WAIT)
            with rabbitry.Connection(broker_node.url) as direct:
                probe = direct.channel()
                deadline = time.monotonic() + WAIT
                while probe.queue_declare(queue, passive=True).consumer_count != 1:
                    assert time.monotonic() < deadline, "the iterator never subscribed"
                    time.sleep(0.02)
            proxy.reset()
            reader.join(WAIT)
            assert not reader.is_alive() and result == [[]]
            proxy.refuse(False)
            conn.wait_recovered(WAIT)
            assert channel.queue_declare(queue, passive=True).consumer_count == 0
            channel.queue_delete(queue)


async def test_recovery_gives_up_when_the_virtual_host_was_deleted(
    broker_node: BrokerNode,
) -> None:
    """530 NOT_ALLOWED on every reconnect cannot heal: CLOSED, reported, not RECOVERING."""
    vhost = unique("vhost")
    await asyncio.to_thread(broker_node.ctl, "add_vhost", vhost)
    await asyncio.to_thread(
        broker_node.ctl, "set_permissions", "-p", vhost, "guest", ".*", ".*", ".*"
    )
    url = broker_node.url.rstrip("/") + "/" + vhost
    conn = AsyncConnection(url, connection_name=unique("conn"), recovery=FAST)
    await conn.connect()
    events: list[tuple[str, type[BaseException]]] = []
    conn.on_recovery_error(lambda kind, name, exc: events.append((kind, type(exc))))
    try:
        await asyncio.to_thread(broker_node.ctl, "delete_vhost", vhost)
        reason = await conn.wait_closed(WAIT)
        # The reconnect's 530 NOT_ALLOWED, typed: the broker's own error is kept.
        assert isinstance(reason, rabbitry.exceptions.VirtualHostNotFound), reason
        assert [type(exc) for _, exc in reason.errors] == [rabbitry.exceptions.NotAllowed]
        assert conn.state is State.CLOSED
        assert events == [("connection", rabbitry.exceptions.VirtualHostNotFound)]
        with pytest.raises(InvalidStateError):
            await conn.channel()
    finally:
        await conn.close(timeout=5)


async def test_stopping_a_consumer_while_recovering_leaves_no_consumer_behind(
    broker_node: BrokerNode,
) -> None:
    queue = unique("stopped")
    with TcpProxy("127.0.0.1", broker_node.port) as proxy:
        conn = AsyncConnection(proxy.url(), connection_name=unique("conn"), recovery=FAST)
        await conn.connect()
        try:
            channel = await conn.channel()
            await channel.queue_declare(queue)

            async def handle(message: Message) -> None:
                return None

            consumer = conn.consumer(queue, handle)
            await consumer.start()
            proxy.refuse()
            proxy.reset()
            assert await eventually(lambda: conn.state is State.RECOVERING)
            await asyncio.wait_for(consumer.stop(), WAIT)
            proxy.refuse(False)
            await conn.wait_recovered(WAIT)
            ok = await channel.queue_declare(queue, passive=True)
            assert ok.consumer_count == 0
            await channel.queue_delete(queue)
        finally:
            await conn.close(timeout=5)


@pytest.mark.timeout(900)
async def test_consumer_connection_reset_200_times_under_load_loses_nothing(
    broker_node: BrokerNode, caplog: pytest.LogCaptureFixture
) -> None:
    """Deliveries stream through a proxy that resets the consumer's connection 200 times.

    Every confirmed message reaches the handler (duplicates allowed: redeliveries after a
    reset), no reconnect meets a protocol error, and every recovery completes.
    """
    queue = unique("resets")
    resets = 200
    caplog.set_level(logging.INFO, logger="rabbitry")
    publisher_conn = AsyncConnection(broker_node.url, connection_name=unique("pub"))
    await publisher_conn.connect()
    seen: set[int] = set()
    with TcpProxy("127.0.0.1", broker_node.port) as proxy:
        conn = AsyncConnection(
            proxy.url(), connection_name=unique("conn"), heartbeat=5, recovery=FAST
        )
        await conn.connect()
        recoveries = 0

        def on_state(state: State, cause: BaseException | None) -> None:
            nonlocal recoveries
            if state is State.OPEN:
                recoveries += 1

        conn.on_state_change(on_state)
        try:
            channel = await conn.channel()
            await channel.queue_declare(queue)
            await channel.basic_qos(50)

            def handle(message: Message) -> None:
                seen.add(int(message.body))
                message.ack()

            await channel.basic_consume(queue, handle)
            publisher = await publisher_conn.publisher()
            confirmed: list[int] = []
            stop = asyncio.Event()

            async def produce() -> None:
                n = 0
                while not stop.is_set():
                    if n - len(seen) > 2000:  # a bounded backlog: the drain at the end is short
                        await asyncio.sleep(0.01)
                        continue
                    batch = [
                        await publisher.send(str(n + i).encode(), routing_key=queue)
                        for i in range(20)
                    ]
                    for i, future in enumerate(batch):
                        await future
                        confirmed.append(n + i)
                    n += 20

            producing = asyncio.create_task(produce())
            for round_ in range(resets):
                target = len(seen) + 10
                assert await eventually(lambda t=target: len(seen) >= t), (round_, len(seen))
                proxy.reset()
                assert await eventually(
                    lambda r=round_: conn.state is State.RECOVERING or recoveries > r
                )
                await conn.wait_recovered(WAIT)
            stop.set()
            await producing
            assert await eventually(lambda: seen >= set(confirmed), timeout=60), (
                f"{len(set(confirmed) - seen)} confirmed messages never delivered; "
                f"channel open={channel.is_open}, state={conn.state}, "
                f"stale settlements={channel.stale_settlements}"
            )
            assert recoveries == resets
            protocol_errors = [
                r.getMessage() for r in caplog.records if "unopened" in r.getMessage()
            ]
            assert protocol_errors == []
            await channel.queue_delete(queue)
        finally:
            await conn.close(timeout=5)
            await publisher_conn.close(timeout=5)


async def test_a_drop_as_the_replay_ends_is_not_reported_as_recovered(
    broker_node: BrokerNode, conn: AsyncConnection
) -> None:
    """The recovery's new connection is reset while its last scratch channel closes.

    No replay step is waiting for an answer then, so nothing raises: recovery must still
    see that the connection it replayed on is gone and try again, instead of reporting
    OPEN over a dead socket (the consumer would never get another message).
    """
    queue = unique("replay-end")
    setup = await conn.channel()
    await setup.queue_declare(queue)
    await setup.close()
    # channel.close (class 20, method 40) in a method frame, on any channel.
    channel_close = re.compile(rb"\x01..\x00\x00..\x00\x14\x00\x28", re.DOTALL)
    with TcpProxy("127.0.0.1", broker_node.port) as proxy:
        client = AsyncConnection(
            proxy.url(), connection_name=unique("conn"), heartbeat=5, recovery=FAST
        )
        await client.connect()
        try:
            channel = await client.channel()
            got: list[bytes] = []
            await channel.basic_consume(queue, lambda message: got.append(message.body))
            armed = threading.Event()
            hits: list[int] = []

            def reset_at_the_scratch_close(direction: str, data: bytes) -> None:
                # The record holds no topology (the queue was declared on another
                # connection), so the only channel.close of the replay is the scratch
                # channel's, its very last step.
                if armed.is_set() and direction == "upstream" and channel_close.search(data):
                    armed.clear()
                    hits.append(proxy.reset())

            proxy.tap(reset_at_the_scratch_close)
            armed.set()
            proxy.reset()
            assert await eventually(lambda: bool(hits)), "the replay never closed its scratch"
            assert hits == [1]
            assert await eventually(lambda: proxy.connections >= 3)
            await client.wait_recovered(WAIT)
            await (await conn.channel()).basic_publish("", queue, b"after")
            assert await eventually(lambda: got == [b"after"]), (
                f"state={client.state}, channel open={channel.is_open}"
            )
            assert channel.is_open
        finally:
            await client.close(timeout=5)
