"""Publisher, consumer and topology faults (P1/P6, C4/C5, T2/T4 of the fault matrix in
``docs/recovery.md``). P2 (the headline), P5, C1, T1 and T5 are in ``test_recovery.py``; P3 is
``tests/integration/test_nack_retry.py`` with ``test_publisher.py``'s exact-90-nacks
test, P4 is ``test_unroutable_mandatory_*`` in ``tests/integration/test_publisher.py``
and C2 is the broker-cancel tests of ``tests/integration/test_consumer.py``.
"""

from __future__ import annotations

import asyncio
import inspect
import threading
import time
from typing import TYPE_CHECKING

import pytest
from tests.faults.helpers import FAST, WAIT, StateLog, eventually, force_close, unique
from tests.support.checker import Checker
from tests.support.proxy import TcpProxy

import rabbitry
from rabbitry import (
    AsyncConnection,
    Binding,
    Exchange,
    Properties,
    PublishTimeout,
    Queue,
    RecoveryPolicy,
    State,
    Topology,
)

if TYPE_CHECKING:
    from tests.support.node import BrokerNode

pytestmark = pytest.mark.timeout(180)


async def _admin_drain(
    node: BrokerNode, queue: str, *, delete: bool = True
) -> list[rabbitry.Message]:
    got = []
    async with AsyncConnection(node.url, recovery=None) as admin:
        channel = await admin.channel()
        while (message := await channel.basic_get(queue, no_ack=True)) is not None:
            got.append(message)
        if delete:
            await channel.queue_delete(queue)
    return got


async def _depth(node: BrokerNode, queue: str) -> int:
    async with AsyncConnection(node.url, recovery=None) as admin:
        ok = await (await admin.channel()).queue_declare(queue, passive=True)
        return ok.message_count


async def _feed(node: BrokerNode, queue: str, checker: Checker, count: int) -> None:
    """Publish ``count`` confirmed messages with ids 0..count-1 from a direct connection."""
    async with AsyncConnection(node.url, recovery=None) as feeder:
        publisher = await feeder.publisher()
        for i in range(count):
            checker.attempt(str(i))
            await (
                await publisher.send(
                    b"x", routing_key=queue, properties=Properties(message_id=str(i))
                )
            )
            checker.confirm(str(i))


async def _declare(node: BrokerNode, queue: str) -> None:
    async with AsyncConnection(node.url, recovery=None) as admin:
        await (await admin.channel()).queue_declare(queue)


# --------------------------------------------------------------------------- publisher


async def test_p1_lost_confirm_is_retransmitted(broker_node: BrokerNode) -> None:
    """P1: the broker stored the message but its confirm was lost with the connection:
    recovery sends it again, the consumer sees it twice (both redelivered=false), the
    publisher counts the resend, and the future resolves on the new confirm."""
    queue = unique("p1")
    await _declare(broker_node, queue)
    with TcpProxy("127.0.0.1", broker_node.port) as proxy:
        conn = AsyncConnection(proxy.url(), heartbeat=10, recovery=FAST)
        await conn.connect()
        try:
            publisher = await conn.publisher(republish_unconfirmed=True)
            proxy.drop("downstream")
            first = await publisher.send(
                b"one", routing_key=queue, properties=Properties(message_id="one")
            )
            depth = 0
            for _ in range(100):
                depth = await _depth(broker_node, queue)
                if depth:
                    break
                await asyncio.sleep(0.05)
            assert depth == 1, "the broker never got the first message"
            assert not first.done()  # its confirm was dropped on the way back
            proxy.drop("downstream", False)
            proxy.reset()
            await asyncio.wait_for(first, WAIT)
            assert publisher._core.channel is not None and publisher._core.channel.republished == 1
            second = await publisher.send(
                b"two", routing_key=queue, properties=Properties(message_id="two")
            )
            await asyncio.wait_for(second, WAIT)
            await publisher.close()
        finally:
            await conn.close(timeout=5)
    got = await _admin_drain(broker_node, queue)
    assert [m.properties.message_id for m in got] == ["one", "one", "two"]
    assert not any(m.redelivered for m in got)  # a consumer cannot tell: dedup by id


async def test_p6_timed_out_publish_stays_in_the_outbox_until_confirmed(
    broker_node: BrokerNode,
) -> None:
    """P6: the deadline (1 s) is shorter than the fault (a 3 s blackhole, then a reset):
    the caller gets PublishTimeout at once, the message stays unconfirmed in the outbox and
    recovery delivers it (lost = 0)."""
    queue = unique("p6")
    await _declare(broker_node, queue)
    with TcpProxy("127.0.0.1", broker_node.port) as proxy:
        conn = AsyncConnection(proxy.url(), heartbeat=20, recovery=FAST)
        await conn.connect()
        try:
            publisher = await conn.publisher(republish_unconfirmed=True, timeout=1.0)
            proxy.blackhole()
            started = time.monotonic()
            future = await publisher.send(
                b"late", routing_key=queue, properties=Properties(message_id="late")
            )
            with pytest.raises(PublishTimeout):
                await future
            assert time.monotonic() - started >= 0.9  # the deadline, not the fault, ended it
            assert [u.message_id for u in publisher.unconfirmed()] == ["late"]
            await asyncio.sleep(2)
            assert [u.message_id for u in publisher.unconfirmed()] == ["late"]
            proxy.resume()
            proxy.reset()
            assert await eventually(lambda: conn.state is not State.OPEN)
            # During recovery the outbox still lists it (kept for the resend).
            assert [u.message_id for u in publisher.unconfirmed()] == ["late"]
            await conn.wait_recovered(WAIT)
            assert await eventually(lambda: not publisher.unconfirmed())
            await publisher.close()
        finally:
            proxy.heal()
            await conn.close(timeout=5)
    got = await _admin_drain(broker_node, queue)
    assert [m.properties.message_id for m in got] == ["late"]


async def test_publisher_close_during_recovery_waits_for_the_resend(
    broker_node: BrokerNode,
) -> None:
    """close() while the connection recovers must not abandon the messages kept for the
    resend (found by P6): it waits for recovery and their confirms, within its timeout."""
    queue = unique("close-rec")
    await _declare(broker_node, queue)
    with TcpProxy("127.0.0.1", broker_node.port) as proxy:
        conn = AsyncConnection(proxy.url(), heartbeat=20, recovery=FAST)
        await conn.connect()
        try:
            publisher = await conn.publisher(republish_unconfirmed=True)
            proxy.drop("upstream")  # the broker never sees them
            futures = [
                await publisher.send(
                    b"%d" % i, routing_key=queue, properties=Properties(message_id=str(i))
                )
                for i in range(20)
            ]
            await asyncio.sleep(0.2)
            proxy.drop("upstream", False)
            proxy.reset()
            assert await eventually(lambda: conn.state is State.RECOVERING)
            await publisher.close(timeout=WAIT)
            assert all(f.done() and f.exception() is None for f in futures)
        finally:
            await conn.close(timeout=5)
    got = await _admin_drain(broker_node, queue)
    assert sorted(int(m.body) for m in got) == list(range(20))


# --------------------------------------------------------------------------- consumers


async def test_c4_handler_blocking_the_loop_loses_nothing(broker_node: BrokerNode) -> None:
    """C4 (asyncio): a handler that blocks the event loop for 3 x H starves the heartbeats;
    the broker drops the connection, recovery redelivers, nothing is lost."""
    queue = unique("c4")
    await _declare(broker_node, queue)
    checker = Checker()
    await _feed(broker_node, queue, checker, 10)
    conn = AsyncConnection(broker_node.url, heartbeat=2, recovery=FAST)
    await conn.connect()
    log = StateLog(conn)
    blocked = False

    async def handler(message: rabbitry.Message) -> None:
        nonlocal blocked
        if not blocked:
            blocked = True
            time.sleep(6)  # the fault under test: the event loop stalls
        assert message.properties.message_id is not None
        checker.deliver(message.properties.message_id, message.redelivered)

    consumer = conn.consumer(queue, handler, prefetch=1)
    await consumer.start()
    try:
        assert await eventually(lambda: checker.delivered.keys() >= checker.confirmed, 40)
    finally:
        await consumer.stop()
        await conn.close(timeout=5)
    print(f"C4 async: state changes {log.states}")
    await _admin_drain(broker_node, queue)
    checker.check(max_duplicates=1)


def test_c4_sync_handler_blocking_keeps_heartbeats_flowing(broker_node: BrokerNode) -> None:
    """C4 (threads): the handler blocks its own thread for 3 x H; the IO thread keeps the
    heartbeats going, so the connection never drops."""
    queue = unique("c4s")
    checker = Checker()
    changes: list[State] = []
    with rabbitry.Connection(broker_node.url, heartbeat=2, recovery=FAST) as conn:
        conn.on_state_change(lambda state, _cause: changes.append(state))
        channel = conn.channel()
        channel.queue_declare(queue)
        publisher = conn.publisher()
        for i in range(10):
            checker.attempt(str(i))
            publisher.publish(
                b"x", routing_key=queue, properties=Properties(message_id=str(i))
            ).result(10)
            checker.confirm(str(i))
        first = threading.Event()

        def handler(message: rabbitry.Message) -> None:
            if not first.is_set():
                first.set()
                time.sleep(6)
            assert message.properties.message_id is not None
            checker.deliver(message.properties.message_id, message.redelivered)

        with conn.consumer(queue, handler, prefetch=1):
            deadline = time.monotonic() + 30
            while checker.delivered.keys() < checker.confirmed and time.monotonic() < deadline:
                time.sleep(0.05)
        assert changes == []  # no heartbeat timeout, no recovery
        channel.queue_delete(queue)
    checker.check(max_duplicates=0)


async def _consumer_count(node: BrokerNode, queue: str) -> int:
    async with AsyncConnection(node.url, recovery=None) as admin:
        ok = await (await admin.channel()).queue_declare(queue, passive=True)
        return ok.consumer_count


async def test_c5_auto_ack_reset_loses_at_most_what_was_in_flight(broker_node: BrokerNode) -> None:
    """C5: with ack="auto" the broker forgets each message as it sends it, so a reset may
    lose what was in flight (at most once, the documented trade-off; manual ack is the
    default). Nothing else may go: no message twice, none redelivered, and everything the
    broker still held reaches the recovered consumer."""
    assert inspect.signature(AsyncConnection.consumer).parameters["ack"].default == "manual"
    assert inspect.signature(rabbitry.Connection.consumer).parameters["ack"].default == "manual"
    queue = unique("c5")
    await _declare(broker_node, queue)
    total = 1000
    before = [b"%d" % i for i in range(total)]
    after = [b"after-%d" % i for i in range(100)]
    async with AsyncConnection(broker_node.url, recovery=None) as feeder:
        publisher = await feeder.publisher()
        assert await publisher.publish_batch(before, routing_key=queue) == [None] * total
    seen: list[bytes] = []
    redelivered: list[bytes] = []
    with TcpProxy("127.0.0.1", broker_node.port) as proxy:
        conn = AsyncConnection(proxy.url(), heartbeat=5, recovery=FAST)
        await conn.connect()

        async def handler(message: rabbitry.Message) -> None:
            seen.append(bytes(message.body))
            if message.redelivered:
                redelivered.append(bytes(message.body))
            await asyncio.sleep(0.001)

        consumer = conn.consumer(queue, handler, ack="auto")
        await consumer.start()
        try:
            assert await eventually(lambda: len(seen) >= 100)
            accepted = proxy.connections
            assert proxy.reset() == 1
            # Reconnected, recovered, and the broker has dropped the old consumer: only
            # then can a new message reach nobody but the recovered consumer.
            assert await eventually(lambda: proxy.connections > accepted, WAIT)
            await conn.wait_recovered(WAIT)
            deadline = time.monotonic() + WAIT
            while await _consumer_count(broker_node, queue) != 1:
                assert time.monotonic() < deadline, "the old consumer is still registered"
                await asyncio.sleep(0.05)
            async with AsyncConnection(broker_node.url, recovery=None) as feeder:
                publisher = await feeder.publisher()
                assert await publisher.publish_batch(after, routing_key=queue) == [None] * 100
            # The queue is FIFO: once the last of these arrived, so did every message the
            # broker still held at the reset.
            assert await eventually(lambda: after[-1] in seen, WAIT), "recovered consumer idle"
        finally:
            await consumer.stop()
            await conn.close(timeout=5)
    left = await _depth(broker_node, queue)
    await _admin_drain(broker_node, queue)
    assert left == 0
    assert len(seen) == len(set(seen)), "a message was delivered twice"
    assert redelivered == []  # auto-ack: the broker kept nothing to redeliver
    assert [body for body in seen if body.startswith(b"after-")] == after
    delivered_before = {body for body in seen if not body.startswith(b"after-")}
    assert delivered_before <= set(before)
    print(f"C5: delivered={len(delivered_before)} lost={total - len(delivered_before)}")


# --------------------------------------------------------------------------- topology


@pytest.mark.parametrize("mode", ["skip", "abort"])
async def test_t2_entity_changed_out_of_band(broker_node: BrokerNode, mode: str) -> None:
    """T2: one of three queues was re-declared by someone else with other arguments, so
    its re-declare gets 406. skip: reported, the other two come back; abort: a clean
    CLOSED, no exception escapes."""
    names = [unique(f"t2-{i}") for i in range(3)]
    exchange = unique("t2-x")
    topology = Topology(
        exchanges=[Exchange(exchange, "direct", durable=False, auto_delete=False)],
        queues=[
            Queue(names[0], durable=False, exclusive=True),
            Queue(names[1], durable=False),
            Queue(names[2], durable=False, exclusive=True),
        ],
        bindings=[Binding(exchange, n, n) for n in names],
    )
    escaped: list[dict[str, object]] = []
    loop = asyncio.get_running_loop()
    loop.set_exception_handler(lambda _loop, context: escaped.append(context))
    policy = RecoveryPolicy(initial_delay=0.05, max_delay=0.5, on_entity_error=mode)  # type: ignore[arg-type]
    conn = AsyncConnection(broker_node.url, connection_name=unique("t2"), recovery=policy)
    await conn.connect()
    errors: list[tuple[str, str, rabbitry.AMQPError]] = []
    conn.on_recovery_error(lambda kind, name, exc: errors.append((kind, name, exc)))
    try:
        await topology.aapply(conn)
        async with AsyncConnection(broker_node.url, recovery=None) as other:
            channel = await other.channel()
            await channel.queue_delete(names[1])
            await channel.queue_declare(names[1], durable=False, arguments={"x-max-length": 5})
        await force_close(broker_node, conn)
        if mode == "skip":
            await conn.wait_recovered(WAIT)
            assert [(k, n) for k, n, _ in errors] == [("queue", names[1])]
            assert isinstance(errors[0][2], rabbitry.PreconditionFailed)
            publisher = await conn.publisher()
            for n in (names[0], names[2]):
                await asyncio.wait_for(
                    await publisher.send(b"x", exchange=exchange, routing_key=n), WAIT
                )
            channel = await conn.channel()
            for n in (names[0], names[2]):
                assert (await channel.queue_declare(n, passive=True)).message_count == 1
            await publisher.close()
        else:
            assert await eventually(lambda: conn.state is State.CLOSED)
            # The entity, then the connection given up because of it.
            assert [k for k, _, _ in errors] == ["queue", "connection"]
            assert errors[0][1] == names[1]
            assert errors[1][2] is errors[0][2]
            with pytest.raises(rabbitry.InvalidStateError):
                await conn.wait_recovered(1)
    finally:
        await conn.close(timeout=5)
        loop.set_exception_handler(None)
        async with AsyncConnection(broker_node.url, recovery=None) as admin:
            channel = await admin.channel()
            await channel.queue_delete(names[1])
            await channel.exchange_delete(exchange)
    assert not escaped, escaped


async def test_t4_auto_delete_queue_forgotten_after_its_last_consumer(
    broker_node: BrokerNode,
) -> None:
    """T4: an auto-delete queue with two consumers: after one cancel it is still recorded,
    after the last one the broker deletes it and recovery must not bring it back."""
    queue = unique("t4")
    conn = AsyncConnection(broker_node.url, connection_name=unique("t4c"), recovery=FAST)
    await conn.connect()
    try:
        await Topology(queues=[Queue(queue, durable=False, auto_delete=True)]).aapply(conn)
        channel = await conn.channel()
        first = await channel.basic_consume(queue, lambda m: None)
        second = await channel.basic_consume(queue, lambda m: None)
        await channel.basic_cancel(first)
        assert conn.topology_record.queue(queue) is not None
        await channel.basic_cancel(second)
        assert conn.topology_record.queue(queue) is None
        await force_close(broker_node, conn)
        await conn.wait_recovered(WAIT)
        async with AsyncConnection(broker_node.url, recovery=None) as admin:
            with pytest.raises(rabbitry.NotFound):
                await (await admin.channel()).queue_declare(queue, passive=True)
    finally:
        await conn.close(timeout=5)


async def test_c3_consumer_timeout_closes_the_channel_and_the_consumer_comes_back(
    broker_node: BrokerNode,
) -> None:
    """C3: a handler holds a delivery past the broker's consumer_timeout (3 s here; the
    broker checks every channel tick, set to 1 s). The broker closes the channel with 406;
    the consumer subscribes again on a new channel and the message is redelivered."""

    def set_env(key: str, value: int) -> None:
        broker_node.eval(f"application:set_env(rabbit, {key}, {value}).")

    await asyncio.to_thread(set_env, "consumer_timeout", 3000)
    await asyncio.to_thread(set_env, "channel_tick_interval", 1000)
    queue = unique("c3")
    checker = Checker()
    conn = AsyncConnection(broker_node.url, heartbeat=5, recovery=FAST)
    try:
        await _declare(broker_node, queue)
        await _feed(broker_node, queue, checker, 5)
        await conn.connect()
        held = False

        async def handler(message: rabbitry.Message) -> None:
            nonlocal held
            if not held:
                held = True
                await asyncio.sleep(6)  # past consumer_timeout; its ack will be stale
            assert message.properties.message_id is not None
            checker.deliver(message.properties.message_id, message.redelivered)

        consumer = conn.consumer(queue, handler, prefetch=1)
        await consumer.start()
        try:
            assert await eventually(lambda: checker.delivered.keys() >= checker.confirmed, 40)
        finally:
            await consumer.stop()
        assert checker.redelivered >= 1  # the held message came back
        assert conn.state is State.OPEN  # a channel error, not a connection one
    finally:
        await asyncio.to_thread(set_env, "consumer_timeout", 1800000)
        await asyncio.to_thread(set_env, "channel_tick_interval", 60000)
        await conn.close(timeout=5)
        await _admin_drain(broker_node, queue)
    checker.check(max_duplicates=1)


async def test_t3_queue_deleted_during_topology_recovery(broker_node: BrokerNode) -> None:
    """T3: someone deletes a queue after recovery re-declared it and before its bindings
    are replayed; the bind gets 404, recovery declares the queue again and retries, and
    both routing keys deliver (the Java client's TopologyRecoveryRetry)."""
    queue = unique("t3")
    topology = Topology(
        queues=[Queue(queue, durable=False)],
        bindings=[Binding("amq.topic", queue, "t3.one"), Binding("amq.topic", queue, "t3.two")],
    )
    declare_ok = b"\x00\x32\x00\x0b" + bytes([len(queue)]) + queue.encode()
    armed = threading.Event()
    seen = threading.Event()

    def tap(direction: str, data: bytes) -> None:
        if armed.is_set() and direction == "downstream" and declare_ok in data:
            armed.clear()
            seen.set()

    admin = AsyncConnection(broker_node.url, recovery=None)
    await admin.connect()
    with TcpProxy("127.0.0.1", broker_node.port) as proxy:
        conn = AsyncConnection(
            proxy.url(), connection_name=unique("t3c"), heartbeat=10, recovery=FAST
        )
        await conn.connect()
        errors: list[object] = []
        conn.on_recovery_error(lambda *args: errors.append(args))
        try:
            await topology.aapply(conn)
            admin_channel = await admin.channel()
            proxy.tap(tap)
            proxy.latency(0.3)  # the bind reaches the broker >= 0.3 s after the declare-ok
            armed.set()
            await force_close(broker_node, conn)
            assert await eventually(seen.is_set, WAIT)
            await admin_channel.queue_delete(queue)  # between the re-declare and the bind
            await conn.wait_recovered(30)
            proxy.heal()
            assert errors == []
            publisher = await conn.publisher()
            for key in ("t3.one", "t3.two"):
                await asyncio.wait_for(
                    await publisher.send(key.encode(), exchange="amq.topic", routing_key=key),
                    WAIT,
                )
            await publisher.close()
            channel = await conn.channel()
            assert (await channel.queue_declare(queue, passive=True)).message_count == 2
        finally:
            proxy.tap(None)
            proxy.heal()
            await conn.close(timeout=5)
    await _admin_drain(broker_node, queue)
    await admin.close()
