"""Connection faults through the TCP fault proxy (R3, R4, R6, R7 of
``docs/recovery.md``).

R1, R2, R5 and R8 are in ``test_recovery.py``. Every test here counts messages with the
checker of ``tests/support/checker.py`` where messages flow, and the faults package's
autouse guard checks that no thread or socket is left behind.
"""

from __future__ import annotations

import asyncio
import hashlib
import itertools
import logging
import random
import threading
from typing import TYPE_CHECKING

import pytest
from tests.faults.helpers import FAST, WAIT, StateLog, eventually, unique
from tests.support.checker import Checker
from tests.support.evil_broker import EvilBroker, Scenario
from tests.support.proxy import TcpProxy

import rabbitry
from rabbitry import AsyncConnection, HeartbeatTimeout, Properties, State

if TYPE_CHECKING:
    from tests.support.node import BrokerNode

pytestmark = pytest.mark.timeout(180)


async def _declare(node: BrokerNode, queue: str) -> None:
    async with AsyncConnection(node.url, recovery=None) as admin:
        channel = await admin.channel()
        await channel.queue_declare(queue)


async def _delete(node: BrokerNode, queue: str) -> None:
    async with AsyncConnection(node.url, recovery=None) as admin:
        channel = await admin.channel()
        await channel.queue_delete(queue)


@pytest.mark.parametrize("busy", [False, True], ids=["idle", "busy"])
async def test_r3_blackhole_is_detected_within_two_heartbeats(
    broker_node: BrokerNode, busy: bool
) -> None:
    """R3: nothing arrives any more, the socket stays open: heartbeats find out in <= 2H+1 s,
    and recovery completes once the network is back."""
    heartbeat = 2
    with TcpProxy("127.0.0.1", broker_node.port) as proxy:
        conn = AsyncConnection(
            proxy.url(), heartbeat=heartbeat, connection_timeout=2, recovery=FAST
        )
        await conn.connect()
        try:
            log = StateLog(conn)
            loop = asyncio.get_running_loop()
            queue = unique("r3")
            await _declare(broker_node, queue)
            publisher = await conn.publisher(republish_unconfirmed=True)
            pending: list[asyncio.Future[None]] = []
            start = loop.time()
            proxy.blackhole()
            if busy:  # confirms now wait in vain until the resend after recovery
                for i in range(50):
                    pending.append(await publisher.send(b"%d" % i, routing_key=queue))
            assert await eventually(lambda: conn.state is State.RECOVERING, 3 * heartbeat + 2)
            when, cause = log.first(State.RECOVERING)
            detected = when - start
            print(f"R3 busy={busy}: blackhole detected after {detected:.2f} s (H={heartbeat})")
            assert detected <= 2 * heartbeat + 1
            assert isinstance(cause, HeartbeatTimeout)
            proxy.resume()
            await conn.wait_recovered(WAIT)
            await asyncio.wait_for(asyncio.gather(*pending), WAIT)
            await publisher.close()
        finally:
            await conn.close(timeout=5)
            await _delete(broker_node, queue)


async def test_r3_heartbeat_zero_warns_and_never_detects(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """R3, H = 0 on both sides: a silent peer is never detected (documented), and the
    library says so when it connects. The peer is the scripted broker of
    tests/support/evil_broker.py, which proposes heartbeat 0 and then says nothing."""
    with EvilBroker(Scenario("silent", open_channel=False)) as peer:
        conn = AsyncConnection(peer.url, heartbeat=0, recovery=FAST)
        with caplog.at_level(logging.WARNING, logger="rabbitry"):
            await conn.connect()
        try:
            assert conn.heartbeat == 0
            assert any("heartbeats are off" in r.getMessage() for r in caplog.records)
            await asyncio.sleep(3)
            assert conn.state is State.OPEN  # nothing can tell: the reason for the warning
        finally:
            await conn.close(timeout=5)


async def test_r4_latency_and_low_bandwidth_cause_no_reconnect(broker_node: BrokerNode) -> None:
    """R4: 200 ms each way, then 256 KiB/s: slower, never a spurious heartbeat timeout."""
    rng = random.Random(4)
    checker = Checker()
    queue = unique("r4")
    await _declare(broker_node, queue)
    with TcpProxy("127.0.0.1", broker_node.port) as proxy:
        conn = AsyncConnection(proxy.url(), heartbeat=2, recovery=FAST)
        await conn.connect()
        try:
            log = StateLog(conn)
            publisher = await conn.publisher(max_in_flight=200)
            proxy.latency(0.2)
            phases = [(300, 4096), (16, 128 * 1024)]
            for phase, (count, largest) in enumerate(phases):
                if phase == 1:
                    proxy.latency(0)
                    proxy.bandwidth(256 * 1024)
                futures = []
                for i in range(count):
                    message_id = f"{phase}-{i}"
                    checker.attempt(message_id)
                    body = rng.randbytes(rng.randint(1024, largest))
                    futures.append(
                        (
                            message_id,
                            await publisher.send(
                                body,
                                routing_key=queue,
                                properties=Properties(message_id=message_id),
                            ),
                        )
                    )
                for message_id, future in futures:
                    await asyncio.wait_for(future, 60)
                    checker.confirm(message_id)
                await asyncio.sleep(2.5)  # more than a heartbeat interval under the fault
            proxy.heal()
            assert log.states == [], f"spurious state changes: {log.changes}"
            assert conn.state is State.OPEN
            await publisher.close()
        finally:
            await conn.close(timeout=10)
    async with AsyncConnection(broker_node.url, recovery=None) as reader:
        channel = await reader.channel()
        while (message := await channel.basic_get(queue, no_ack=True)) is not None:
            assert message.properties.message_id is not None
            checker.deliver(message.properties.message_id)
        await channel.queue_delete(queue)
    checker.check(max_duplicates=0)


async def test_r6_flapping_resets_lose_nothing(broker_node: BrokerNode) -> None:
    """R6: 12 resets at random 0.1-1.5 s intervals, some during recovery itself."""
    rng = random.Random(6)
    total = 3000
    checker = Checker()
    queue = unique("r6")
    await _declare(broker_node, queue)
    with TcpProxy("127.0.0.1", broker_node.port) as proxy:
        conn = AsyncConnection(proxy.url(), heartbeat=5, recovery=FAST, connection_timeout=3)
        await conn.connect()
        log = StateLog(conn)
        done = asyncio.Event()

        async def handler(message: rabbitry.Message) -> None:
            assert message.properties.message_id is not None
            checker.deliver(message.properties.message_id, message.redelivered)
            if checker.delivered.keys() >= checker.attempted and len(checker.attempted) == total:
                done.set()

        consumer = conn.consumer(queue, handler, prefetch=50)
        await consumer.start()
        publisher = await conn.publisher(max_in_flight=500, republish_unconfirmed=True)
        resets = 0

        during_recovery = 0
        hit_recovery = threading.Event()

        def reset_the_reconnect(direction: str, data: bytes) -> None:
            # Runs on the proxy thread: the recovery's new connection says hello.
            nonlocal during_recovery
            if hit_recovery.is_set() and direction == "upstream" and data.startswith(b"AMQP"):
                hit_recovery.clear()
                during_recovery += proxy.reset() > 0

        proxy.tap(reset_the_reconnect)

        accepted_after_last_reset = 0

        async def flapper() -> None:
            nonlocal resets, accepted_after_last_reset
            for n in range(12):
                await asyncio.sleep(rng.uniform(0.1, 1.5))
                # Reset a connection that exists: a reset that finds the client between
                # two connections would hit nothing, and the count would be left to chance.
                assert await eventually(lambda: proxy.active_connections > 0)
                if n % 3 == 2:
                    hit_recovery.set()  # and reset the recovery itself, mid-handshake
                resets += proxy.reset() > 0
                accepted_after_last_reset = proxy.connections

        async def settle(message_id: str, future: asyncio.Future[None]) -> None:
            try:
                await future
                checker.confirm(message_id)
            except rabbitry.AMQPError as exc:
                checker.fail(message_id, exc)

        try:
            chaos = asyncio.ensure_future(flapper())
            settlers = []
            for i in range(total):
                message_id = str(i)
                checker.attempt(message_id)
                if i % 50 == 0:
                    await asyncio.sleep(0.02)  # ~2.5k msg/s: the stream outlasts the chaos
                future = await publisher.send(
                    message_id.encode(),
                    routing_key=queue,
                    properties=Properties(message_id=message_id),
                    timeout=90,
                )
                settlers.append(asyncio.ensure_future(settle(message_id, future)))
            await chaos
            # The client reconnecting proves it noticed the last reset; only then does
            # wait_recovered() wait for that recovery (it returns at once while OPEN).
            assert await eventually(lambda: proxy.connections > accepted_after_last_reset)
            await asyncio.wait_for(asyncio.gather(*settlers), 90)
            await conn.wait_recovered(WAIT)
            await asyncio.wait_for(done.wait(), 60)
            # One recovery at a time: every RECOVERING is followed by OPEN before the next.
            states = [s for s in log.states if s in (State.RECOVERING, State.OPEN)]
            for a, b in itertools.pairwise(states):
                assert a is not b, f"two {a} in a row: {states}"
            print(
                f"R6: {resets} resets ({during_recovery} during recovery), "
                f"{states.count(State.RECOVERING)} recoveries"
            )
            assert resets == 12
            assert during_recovery >= 1  # every third reset arms one; at least the last fires
            async with AsyncConnection(broker_node.url, recovery=None) as admin:
                ok = await (await admin.channel()).queue_declare(queue, passive=True)
                assert ok.consumer_count == 1  # the consumer came back exactly once
        finally:
            await consumer.stop()
            await publisher.close(timeout=5)
            await conn.close(timeout=5)
            await _delete(broker_node, queue)
    checker.check(max_duplicates=12 * 550)


async def test_r7_cut_mid_frame_never_corrupts_a_body(broker_node: BrokerNode) -> None:
    """R7 (the "stairway"): the server-to-client stream is cut after 2^5 ... 2^16 bytes,
    i.e. inside headers and bodies; every delivered body still passes its checksum."""
    rng = random.Random(7)
    queue = unique("r7")
    await _declare(broker_node, queue)
    checker = Checker()
    corrupt: list[str] = []

    def handle(message: rabbitry.Message) -> None:
        message_id = message.properties.message_id
        assert message_id is not None
        digest = (message.properties.headers or {}).get("sha256")
        if hashlib.sha256(message.body).hexdigest() != digest:
            corrupt.append(message_id)
        checker.deliver(message_id, message.redelivered)

    async with AsyncConnection(broker_node.url, recovery=None) as feeder:
        feed = await feeder.publisher()
        with TcpProxy("127.0.0.1", broker_node.port) as proxy:
            conn = AsyncConnection(proxy.url(), heartbeat=5, recovery=FAST)
            await conn.connect()
            log = StateLog(conn)

            async def handler(message: rabbitry.Message) -> None:
                handle(message)
                await asyncio.sleep(0.002)

            consumer = conn.consumer(queue, handler, prefetch=10)
            await consumer.start()
            count = 0
            try:
                for exponent in range(5, 17):
                    await conn.wait_recovered(WAIT)
                    recoveries = log.states.count(State.RECOVERING)
                    proxy.cut_after(2**exponent, "downstream")
                    for _ in range(17):  # ~170 KiB: more than any cut lets through
                        body = rng.randbytes(10 * 1024)
                        message_id = str(count)
                        count += 1
                        checker.attempt(message_id)
                        await feed.send(
                            body,
                            routing_key=queue,
                            properties=Properties(
                                message_id=message_id,
                                headers={"sha256": hashlib.sha256(body).hexdigest()},
                            ),
                        )
                        checker.confirm(message_id)
                    assert await eventually(
                        lambda r=recoveries: log.states.count(State.RECOVERING) > r
                    ), f"the cut after 2^{exponent} bytes never fired"
                await conn.wait_recovered(WAIT)
                assert await eventually(lambda: checker.delivered.keys() >= checker.confirmed, 30)
            finally:
                await consumer.stop()
                await conn.close(timeout=5)
        await (await feeder.channel()).queue_delete(queue)
    assert not corrupt, f"corrupt bodies: {corrupt[:5]}"
    assert log.states.count(State.RECOVERING) == 12
    checker.check()
