"""Automatic recovery against a throw-away node (the fault matrix in ``docs/recovery.md``).

Each test connects with a fast ``RecoveryPolicy``, breaks the connection (forced close by
connection name, or a TCP reset through the fault proxy) and checks what came back.
"""

from __future__ import annotations

import asyncio
import threading
import uuid
from typing import TYPE_CHECKING

import pytest
from tests.faults.helpers import FAST, WAIT, eventually, force_close, unique
from tests.support.proxy import TcpProxy

import rabbitry
from rabbitry import (
    AsyncConnection,
    Binding,
    Exchange,
    Message,
    Queue,
    RecoveryPolicy,
    State,
    Topology,
)

if TYPE_CHECKING:
    from collections.abc import AsyncIterator

    from tests.support.node import BrokerNode


@pytest.fixture
async def recovering(broker_node: BrokerNode) -> AsyncIterator[AsyncConnection]:
    conn = AsyncConnection(
        broker_node.url, connection_name=unique("conn"), heartbeat=5, recovery=FAST
    )
    await conn.connect()
    try:
        yield conn
    finally:
        await conn.close(timeout=5)


async def test_forced_close_recovers_channels_topology_and_consumers(
    broker_node: BrokerNode, recovering: AsyncConnection
) -> None:
    """R1 + T5: numbers, QoS, confirm mode, topology (server-named rename) and consumers."""
    conn = recovering
    states: list[State] = []
    renames: list[tuple[str, str]] = []
    conn.on_state_change(lambda state, cause: states.append(state))
    conn.on_queue_renamed(lambda old, new: renames.append((old, new)))

    direct, topic, fanout = unique("direct"), unique("topic"), unique("fanout")
    durable = unique("durable")
    server_named = Queue("", exclusive=True, durable=False)
    topology = Topology(
        exchanges=[
            Exchange(direct, "direct", durable=False, auto_delete=False),
            Exchange(topic, "topic", durable=False),
            Exchange(fanout, "fanout", durable=False),
        ],
        queues=[Queue(durable), server_named],
        bindings=[
            Binding(direct, durable, "d"),
            Binding(topic, server_named, "t.#"),
            Binding(fanout, durable),
            Binding(topic, fanout, "f.*", destination_type="exchange"),
        ],
    )
    result = await topology.aapply(conn)
    first_name = result.name_of(server_named)

    channels = [await conn.channel() for _ in range(4)]
    await channels[1].close()
    await channels[3].close()
    publisher, consumer_channel = channels[0], channels[2]
    await publisher.confirm_select()
    await consumer_channel.basic_qos(7)
    got: list[bytes] = []
    numbers = [c.channel_id for c in channels]
    tag = await consumer_channel.basic_consume(first_name, lambda m: (got.append(m.body), m.ack()))

    await force_close(broker_node, conn)
    assert await eventually(lambda: conn.state is State.RECOVERING or states[-1:] == [State.OPEN])
    await conn.wait_recovered(WAIT)

    assert states[:2] == [State.RECOVERING, State.OPEN]
    assert [c.channel_id for c in channels] == numbers
    assert sorted(conn._proto.channels) == [numbers[0], numbers[2]]  # closed stay closed
    assert publisher.is_open and consumer_channel.is_open
    assert channels[1].is_closed and channels[3].is_closed
    assert publisher.confirm_mode
    assert consumer_channel._qos == (7, 0, False)
    assert len(renames) == 1 and renames[0][0] == first_name
    new_name = renames[0][1]
    assert new_name != first_name

    # Every binding routes again, the consumer follows the renamed queue (same tag).
    confirm = await publisher.basic_publish(topic, "t.x", b"via-topic")
    assert confirm is not None
    await confirm
    assert await eventually(lambda: got == [b"via-topic"])
    assert tag in consumer_channel._consumers
    for exchange, key in ((direct, "d"), (fanout, ""), (topic, "f.a")):
        confirm = await publisher.basic_publish(exchange, key, b"to-durable")
        assert confirm is not None
        await confirm
    ok = await publisher.queue_declare(durable, passive=True)
    assert ok.message_count == 3
    await topology.adelete(conn)


async def test_ack_of_a_delivery_from_before_recovery_is_dropped(
    broker_node: BrokerNode, recovering: AsyncConnection
) -> None:
    """C1: a stale delivery tag is never sent on the new channel (no 406)."""
    conn = recovering
    queue = unique("stale")
    channel = await conn.channel()
    await channel.queue_declare(queue)
    await channel.confirm_select()
    confirm = await channel.basic_publish("", queue, b"one")
    assert confirm is not None
    await confirm
    before = await channel.basic_get(queue)
    assert before is not None

    await force_close(broker_node, conn)
    await conn.wait_recovered(WAIT)

    before.ack()  # dropped with a warning: its tag belongs to the dead connection
    again = await channel.basic_get(queue)  # the broker redelivered it
    assert again is not None and again.redelivered and again.body == b"one"
    again.ack()
    await asyncio.sleep(0.2)
    assert channel.is_open, channel.close_exc
    await channel.queue_delete(queue)


async def test_tcp_reset_recovers_and_pending_requests_fail(broker_node: BrokerNode) -> None:
    """R2: a reset is detected at once; in-flight confirms fail as outcome unknown."""
    with TcpProxy("127.0.0.1", broker_node.port) as proxy:
        conn = AsyncConnection(proxy.url(), recovery=FAST, heartbeat=5)
        await conn.connect()
        try:
            channel = await conn.channel()
            queue = unique("reset")
            await channel.queue_declare(queue)
            await channel.confirm_select()
            proxy.drop("downstream")  # the confirm never arrives
            pending = await channel.basic_publish("", queue, b"x")
            assert pending is not None
            await asyncio.sleep(0.1)
            proxy.reset()
            proxy.heal()
            with pytest.raises(rabbitry.PublishOutcomeUnknown):
                await asyncio.wait_for(pending, WAIT)
            await conn.wait_recovered(WAIT)
            assert conn.state is State.OPEN
            ok = await channel.queue_declare(queue, passive=True)
            assert ok.message_count == 1  # it was routed: at-least-once, not lost
            await channel.queue_delete(queue)
        finally:
            await conn.close(timeout=5)


async def test_operations_wait_for_recovery_or_fail_fast(broker_node: BrokerNode) -> None:
    """P5: during an outage requests wait (policy "wait") or fail at once ("fail")."""
    with TcpProxy("127.0.0.1", broker_node.port) as proxy:
        waiting = AsyncConnection(proxy.url(), recovery=FAST)
        failing = AsyncConnection(
            proxy.url(), recovery=RecoveryPolicy(initial_delay=0.05, during_recovery="fail")
        )
        await waiting.connect()
        await failing.connect()
        try:
            wait_channel = await waiting.channel()
            fail_channel = await failing.channel()
            proxy.refuse(True)
            proxy.reset()
            assert await eventually(
                lambda: waiting.state is State.RECOVERING and failing.state is State.RECOVERING
            )
            with pytest.raises(rabbitry.ConnectionRecovering):
                await fail_channel.queue_declare("", exclusive=True)
            with pytest.raises(rabbitry.Timeout):
                await wait_channel.queue_declare("", exclusive=True, timeout=0.3)
            declare = asyncio.ensure_future(wait_channel.queue_declare("", exclusive=True))
            await asyncio.sleep(0.3)
            assert not declare.done()
            proxy.refuse(False)
            ok = await asyncio.wait_for(declare, WAIT)
            assert ok.queue.startswith("amq.gen-")
        finally:
            await waiting.close(timeout=5)
            await failing.close(timeout=5)


async def test_gives_up_after_max_attempts(broker_node: BrokerNode) -> None:
    """R5/R8: with max_attempts the connection ends CLOSED with the last error."""
    with TcpProxy("127.0.0.1", broker_node.port) as proxy:
        conn = AsyncConnection(
            proxy.url(),
            connection_timeout=1,
            recovery=RecoveryPolicy(initial_delay=0.05, max_delay=0.1, max_attempts=3),
        )
        await conn.connect()
        closed: list[rabbitry.AMQPError] = []
        conn.add_close_callback(closed.append)
        channel = await conn.channel()
        proxy.refuse(True)
        proxy.reset()
        exc = await conn.wait_closed(WAIT)
        assert conn.state is State.CLOSED
        assert isinstance(exc, rabbitry.AMQPConnectionError)
        assert closed == [exc]
        assert channel.is_closed
        with pytest.raises(rabbitry.InvalidStateError):
            await conn.wait_recovered(1)
        await conn.close()


async def test_application_close_and_deleted_entities_are_not_recovered(
    broker_node: BrokerNode, recovering: AsyncConnection
) -> None:
    """T1: deleted entities do not reappear; close() never triggers recovery."""
    conn = recovering
    keep, gone = unique("keep"), unique("gone")
    topology = Topology(queues=[Queue(keep, durable=False), Queue(gone, durable=False)])
    await topology.aapply(conn)
    await Topology(queues=[Queue(gone, durable=False)]).adelete(conn)
    await force_close(broker_node, conn)
    await conn.wait_recovered(WAIT)
    channel = await conn.channel()
    await channel.queue_declare(keep, passive=True)
    with pytest.raises(rabbitry.NotFound):
        await channel.queue_declare(gone, passive=True)
    states: list[State] = []
    conn.on_state_change(lambda state, cause: states.append(state))
    fresh = await conn.channel()
    await fresh.queue_delete(keep)
    await conn.close()
    assert conn.state is State.CLOSED
    assert states == [State.CLOSED]


def test_sync_connection_recovers_and_consumer_resumes(broker_node: BrokerNode) -> None:
    """The sync facade: same recovery, callbacks on the dispatcher thread."""
    name = unique("sync")
    with rabbitry.Connection(broker_node.url, connection_name=name, recovery=FAST) as conn:
        channel = conn.channel()
        queue = channel.queue_declare(unique("syncq")).queue
        got: list[bytes] = []
        seen = threading.Event()

        def on_message(message: Message) -> None:
            got.append(message.body)
            message.ack()
            seen.set()

        channel.basic_consume(queue, on_message)
        states: list[State] = []
        conn.on_state_change(lambda state, cause: states.append(state))
        assert broker_node.close_connection_by_name(name, "sync recovery test") == 1
        deadline = threading.Event()
        for _ in range(200):
            if conn.state is State.OPEN and states:
                break
            deadline.wait(0.05)
        conn.wait_recovered(WAIT)
        channel.basic_publish("", queue, b"after")
        assert seen.wait(WAIT)
        assert got == [b"after"]
        channel.queue_delete(queue)


async def test_channel_pool_works_after_a_reconnect(
    broker_node: BrokerNode, recovering: AsyncConnection
) -> None:
    """After a reconnect the pool's channels are back on the new connection."""
    conn = recovering
    queue = unique("pool")
    pool = await conn.channel_pool(size=3)
    async with pool.acquire(timeout=5) as channel:
        await channel.queue_declare(queue)
    held = []
    for _ in range(3):
        held.append(pool.acquire(timeout=5))
    channels = [await lease.__aenter__() for lease in held]
    for lease in held:
        await lease.__aexit__(None, None, None)
    assert pool.open_channels == 3

    await force_close(broker_node, conn)
    await conn.wait_recovered(WAIT)

    async def publish_one(index: int) -> None:
        async with pool.acquire(timeout=WAIT) as channel:
            confirm = await channel.basic_publish("", queue, b"%d" % index)
            assert confirm is not None
            await confirm

    await asyncio.gather(*(publish_one(i) for i in range(30)))
    assert pool.open_channels <= 3
    assert all(c.is_open for c in channels if not c.is_closed)
    async with pool.acquire(timeout=5) as channel:
        ok = await channel.queue_declare(queue, passive=True)
        assert ok.message_count == 30
        await channel.queue_delete(queue)
    await pool.close()


async def test_headline_10k_confirmed_connection_killed_twice_all_delivered(
    broker_node: BrokerNode, recovering: AsyncConnection
) -> None:
    """10k confirmed, two kills mid-stream, 0 lost, 0 unexpected."""
    conn = recovering
    queue = unique("headline")
    setup = await conn.channel()
    await setup.queue_declare(queue)
    await setup.close()
    total = 10_000
    attempted = [str(i) for i in range(total)]
    publisher = await conn.publisher(max_in_flight=1000, republish_unconfirmed=True)
    outcomes: dict[str, BaseException | None] = {}

    async def settle(message_id: str, future: asyncio.Future[None]) -> None:
        try:
            await future
            outcomes[message_id] = None
        except rabbitry.AMQPError as exc:
            outcomes[message_id] = exc

    async def kill_when_open() -> None:
        await conn.wait_recovered(WAIT)
        await force_close(broker_node, conn)

    settlers = []
    kills = []
    for index, message_id in enumerate(attempted):
        if index in (3000, 7000):
            # Not awaited: publishing goes on while the kill lands (a CLI call takes
            # ~0.3 s), so it hits messages in flight: the resend path.
            kills.append(asyncio.ensure_future(kill_when_open()))
        if index % 100 == 0:
            await asyncio.sleep(0.02)  # ~5k msg/s: the stream outlasts each kill
        future = await publisher.send(
            message_id.encode(),
            routing_key=queue,
            properties=rabbitry.Properties(message_id=message_id),
            timeout=60,
        )
        settlers.append(asyncio.ensure_future(settle(message_id, future)))
    await asyncio.wait_for(asyncio.gather(*settlers), 120)
    await asyncio.gather(*kills)
    confirmed = {m for m, exc in outcomes.items() if exc is None}
    failed = {m: exc for m, exc in outcomes.items() if exc is not None}

    # Drain from a fresh connection (no recovery needed for the checker).
    delivered: dict[str, int] = {}
    async with AsyncConnection(broker_node.url) as reader:
        channel = await reader.channel()
        while True:
            message = await channel.basic_get(queue, no_ack=True)
            if message is None:
                break
            key = message.body.decode()
            delivered[key] = delivered.get(key, 0) + 1
        await channel.queue_delete(queue)
    lost = confirmed - delivered.keys()
    unexpected = delivered.keys() - set(attempted)
    duplicates = sum(count - 1 for count in delivered.values())
    republished = publisher._core.channel.republished if publisher._core.channel else 0
    print(
        f"checker: attempted={total} confirmed={len(confirmed)} failed={len(failed)} "
        f"delivered={len(delivered)} lost={len(lost)} unexpected={len(unexpected)} "
        f"duplicates={duplicates} republished={republished}"
    )
    await publisher.close()
    assert not failed, f"{len(failed)} publishes failed: {list(failed.items())[:3]}"
    assert len(confirmed) == total
    assert not lost, f"lost {len(lost)} confirmed messages"
    assert not unexpected
    assert duplicates <= 2 * 1000, duplicates


async def test_credentials_provider_is_asked_again_on_reconnect(broker_node: BrokerNode) -> None:
    """A rotated password is picked up by the reconnect, not only the first connect."""
    user = unique("user")
    passwords = ["first-" + uuid.uuid4().hex, "second-" + uuid.uuid4().hex]
    current = passwords[0]
    calls: list[str] = []
    await asyncio.to_thread(broker_node.ctl, "add_user", user, current)
    await asyncio.to_thread(broker_node.ctl, "set_permissions", "-p", "/", user, ".*", ".*", ".*")

    async def provider() -> tuple[str, str]:
        calls.append(current)
        return (user, current)

    conn = AsyncConnection(
        broker_node.url,  # guest/guest: never used, the provider wins
        connection_name=unique("conn"),
        recovery=FAST,
        credentials_provider=provider,
    )
    await conn.connect()
    try:
        await asyncio.to_thread(broker_node.ctl, "change_password", user, passwords[1])
        current = passwords[1]
        await force_close(broker_node, conn)
        await conn.wait_recovered(WAIT)
        channel = await conn.channel()
        await channel.queue_declare("", exclusive=True)
        assert calls[0] == passwords[0]
        assert calls[-1] == passwords[1]
        assert conn.state is State.OPEN
    finally:
        await conn.close(timeout=5)
        await asyncio.to_thread(broker_node.ctl, "delete_user", user)
