"""Flow control: resource alarms on the session's throw-away node (B1-B4 of
the fault matrix in ``docs/recovery.md``). The alarms are raised with ``rabbit_alarm``
(``BrokerNode.set_alarm``) and always cleared again (by the test, and by the faults
package's guard after it)."""

from __future__ import annotations

import asyncio
import time
from typing import TYPE_CHECKING

import pytest
from tests.faults.helpers import FAST, WAIT, StateLog, eventually, unique
from tests.support.checker import Checker

import rabbitry
from rabbitry import AsyncConnection, Properties, State

if TYPE_CHECKING:
    from tests.support.node import BrokerNode

pytestmark = pytest.mark.timeout(120)


class Blocks:
    """Records connection.blocked / unblocked with their loop time."""

    def __init__(self, conn: AsyncConnection) -> None:
        self.loop = asyncio.get_running_loop()
        self.events: list[tuple[float, str | None]] = []
        conn.add_blocked_callback(lambda reason: self.events.append((self.loop.time(), reason)))

    @property
    def reasons(self) -> list[str | None]:
        return [reason for _, reason in self.events]


async def _queue(node: BrokerNode, name: str, messages: int = 0) -> None:
    async with AsyncConnection(node.url, recovery=None) as admin:
        channel = await admin.channel()
        await channel.queue_declare(name)
        if messages:
            publisher = await admin.publisher()
            await publisher.publish_batch([b"%d" % i for i in range(messages)], routing_key=name)


async def _delete(node: BrokerNode, *names: str) -> None:
    async with AsyncConnection(node.url, recovery=None) as admin:
        channel = await admin.channel()
        for name in names:
            await channel.queue_delete(name)


async def test_b1_memory_alarm_held_for_4h_publisher_survives(broker_node: BrokerNode) -> None:
    """B1: a memory alarm held for 4 x H (H = 2 s). The publisher connection is blocked,
    survives (no heartbeat death, no reconnect), is unblocked within 2 s of the clear, and
    all 1k messages are confirmed; a consume-only connection keeps receiving meanwhile."""
    out, feed = unique("b1-out"), unique("b1-feed")
    await _queue(broker_node, out)
    await _queue(broker_node, feed, messages=200)
    checker = Checker()
    pub_conn = AsyncConnection(broker_node.url, heartbeat=2, recovery=FAST)
    sub_conn = AsyncConnection(broker_node.url, heartbeat=2, recovery=FAST)
    await pub_conn.connect()
    await sub_conn.connect()
    try:
        log = StateLog(pub_conn)
        blocks = Blocks(pub_conn)
        received = 0

        async def slow(message: rabbitry.Message) -> None:
            nonlocal received
            received += 1
            await asyncio.sleep(0.04)  # 200 messages take ~8 s: they span the alarm

        consumer = sub_conn.consumer(feed, slow, prefetch=1)
        publisher = await pub_conn.publisher()
        await asyncio.to_thread(broker_node.set_alarm, "memory")
        await consumer.start()
        futures = []
        for i in range(1000):
            checker.attempt(str(i))
            futures.append(
                await publisher.send(
                    b"x", routing_key=out, properties=Properties(message_id=str(i))
                )
            )
        assert await eventually(lambda: pub_conn.is_blocked, WAIT)
        during_start = received
        await asyncio.sleep(8)  # blocked for 4 x H: heartbeats keep both connections up
        assert await eventually(lambda: received > during_start, WAIT), (
            "the consume-only connection stopped receiving"
        )
        during = received - during_start
        assert not any(f.done() for f in futures[-10:])  # held back by the broker
        cleared = asyncio.get_running_loop().time()
        await asyncio.to_thread(broker_node.clear_alarm, "memory")
        assert await eventually(lambda: not pub_conn.is_blocked, WAIT)
        unblocked_after = blocks.events[-1][0] - cleared
        for i, future in enumerate(futures):
            await asyncio.wait_for(future, WAIT)
            checker.confirm(str(i))
        print(
            f"B1: unblocked {unblocked_after:.2f} s after the clear; consumer got {during} during"
        )
        assert blocks.reasons[-1] is None and blocks.reasons[0] is not None
        assert log.states == []  # no heartbeat timeout, no reconnect
        await consumer.stop()
        await publisher.close()
    finally:
        await pub_conn.close(timeout=5)
        await sub_conn.close(timeout=5)
    async with AsyncConnection(broker_node.url, recovery=None) as reader:
        channel = await reader.channel()
        while (message := await channel.basic_get(out, no_ack=True)) is not None:
            assert message.properties.message_id is not None
            checker.deliver(message.properties.message_id)
    await _delete(broker_node, out, feed)
    checker.check(max_duplicates=0)


async def test_b2_overlapping_alarms_unblock_only_when_both_clear(
    broker_node: BrokerNode,
) -> None:
    """B2: memory and disk alarms at once: clearing one keeps the block."""
    queue = unique("b2")
    await _queue(broker_node, queue)
    conn = AsyncConnection(broker_node.url, heartbeat=5, recovery=FAST)
    await conn.connect()
    try:
        publisher = await conn.publisher()
        await asyncio.to_thread(broker_node.set_alarm, "memory")
        await asyncio.to_thread(broker_node.set_alarm, "disk")
        future = await publisher.send(b"x", routing_key=queue)
        assert await eventually(lambda: conn.is_blocked, WAIT)
        await asyncio.to_thread(broker_node.clear_alarm, "memory")
        await asyncio.sleep(1.5)
        assert conn.is_blocked and not future.done()
        await asyncio.to_thread(broker_node.clear_alarm, "disk")
        assert await eventually(lambda: not conn.is_blocked, WAIT)
        await asyncio.wait_for(future, WAIT)
        await publisher.close()
    finally:
        await conn.close(timeout=5)
        await _delete(broker_node, queue)


async def test_b3_alarm_raised_before_connecting(broker_node: BrokerNode) -> None:
    """B3: the connection opens under an alarm; blocked arrives with the first publish."""
    queue = unique("b3")
    await _queue(broker_node, queue)
    await asyncio.to_thread(broker_node.set_alarm, "disk")
    conn = AsyncConnection(broker_node.url, heartbeat=5, recovery=FAST)
    try:
        await conn.connect()
        blocks = Blocks(conn)
        assert conn.is_open and not conn.is_blocked
        publisher = await conn.publisher()
        future = await publisher.send(b"x", routing_key=queue)
        assert await eventually(lambda: conn.is_blocked, WAIT)
        await asyncio.to_thread(broker_node.clear_alarm, "disk")
        await asyncio.wait_for(future, WAIT)
        assert blocks.reasons[0] is not None and blocks.reasons[-1] is None
        await publisher.close()
    finally:
        await conn.close(timeout=5)
        await _delete(broker_node, queue)


async def test_b4_close_while_blocked_returns_in_time(broker_node: BrokerNode) -> None:
    """B4: close(timeout=2) on a blocked connection with a publish stuck behind the block
    returns within 2.5 s and leaves the connection CLOSED (the stuck publish fails)."""
    queue = unique("b4")
    await _queue(broker_node, queue)
    conn = AsyncConnection(broker_node.url, heartbeat=5, recovery=FAST)
    await conn.connect()
    try:
        publisher = await conn.publisher()
        await asyncio.to_thread(broker_node.set_alarm, "memory")
        first = await publisher.send(b"x" * 100_000, routing_key=queue)
        assert await eventually(lambda: conn.is_blocked, WAIT)
        stuck = asyncio.ensure_future(publisher.send(b"y", routing_key=queue))
        started = time.monotonic()
        await asyncio.wait_for(conn.close(timeout=2), WAIT)  # a hang fails, not a slow box
        print(f"B4: close took {time.monotonic() - started:.2f} s while blocked")
        assert conn.is_closed and conn.state is State.CLOSED
        for task in (first, stuck):
            with pytest.raises(rabbitry.AMQPError):
                result = await asyncio.wait_for(task, WAIT)
                if isinstance(result, asyncio.Future):
                    await result
    finally:
        await asyncio.to_thread(broker_node.clear_alarm, "memory")
        await conn.close(timeout=5)
        await _delete(broker_node, queue)
