"""Publishing into a connection the broker has blocked (a resource alarm on the session's
throw-away node) holds a bounded amount of memory, and blocks or times out with the
reason instead of buffering without limit."""

from __future__ import annotations

import asyncio
import gc
import os
import threading
import time
from typing import TYPE_CHECKING

import pytest
from tests.faults.helpers import unique

import rabbitry
from rabbitry.exceptions import InvalidStateError, PublishTimeout

if TYPE_CHECKING:
    from tests.support.node import BrokerNode

pytestmark = pytest.mark.timeout(180)

MIB = 1024 * 1024
BODY = 64 * 1024
COUNT = 3000  # 187 MiB of distinct bodies
#: Allowed RSS growth while the producer is blocked: the 16 MiB hand-off budget, the
#: transport's buffer and the kernel's share of the socket, and allocator slack.
RSS_LIMIT = 64 * MIB
HANG = 60.0


def rss() -> int:
    with open("/proc/self/statm") as statm:
        return int(statm.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def wait_until(predicate: object, timeout: float = HANG) -> bool:
    deadline = time.monotonic() + timeout
    while not predicate():  # type: ignore[operator]
        if time.monotonic() > deadline:
            return False
        time.sleep(0.01)
    return True


def _delete(url: str, queue: str) -> None:
    with rabbitry.Connection(url, recovery=None) as conn:
        conn.channel().queue_delete(queue)


@pytest.mark.parametrize("end", ["unblock", "close"])
def test_sync_basic_publish_while_blocked_waits_within_a_byte_budget(
    broker_node: BrokerNode, end: str
) -> None:
    queue = unique("blocked-bytes")
    conn = rabbitry.Connection(broker_node.url, recovery=None)
    conn.connect()
    producer: threading.Thread | None = None
    try:
        channel = conn.channel()
        channel.queue_declare(queue)
        broker_node.set_alarm("memory")
        gc.collect()
        before = rss()
        sent = [0]
        outcome: list[BaseException] = []

        def produce() -> None:
            try:
                for i in range(COUNT):
                    channel.basic_publish("", queue, i.to_bytes(4, "big") + bytes(BODY - 4))
                    sent[0] += 1
            except BaseException as exc:
                outcome.append(exc)

        producer = threading.Thread(target=produce, name="test-producer")
        producer.start()
        portal = conn._portal
        assert portal is not None
        assert wait_until(lambda: portal._room_waiters > 0), "the producer never blocked"
        growth = rss() - before
        assert sent[0] < COUNT
        assert growth < RSS_LIMIT, f"RSS grew by {growth / MIB:.1f} MiB ({sent[0]} queued)"
        if end == "unblock":
            broker_node.clear_alarm("memory")
            producer.join(HANG)
            assert not producer.is_alive()
            assert outcome == [] and sent[0] == COUNT
        else:
            conn.close(timeout=2)  # the broker reads nothing: the close-ok never comes
            producer.join(HANG)
            assert not producer.is_alive(), "close() left the producer blocked"
            assert len(outcome) == 1 and isinstance(outcome[0], InvalidStateError)
            assert isinstance(outcome[0].__cause__, rabbitry.ConnectionClosed)
    finally:
        broker_node.clear_alarms()
        conn.close()
        if producer is not None:
            producer.join(HANG)
        _delete(broker_node.url, queue)


def test_sync_publisher_on_a_blocked_connection_times_out_naming_the_block(
    broker_node: BrokerNode,
) -> None:
    queue = unique("blocked-timeout")
    with rabbitry.Connection(broker_node.url, recovery=None) as conn:
        conn.channel().queue_declare(queue)
        publisher = conn.publisher()
        try:
            broker_node.set_alarm("memory")
            first = publisher.publish(b"first", routing_key=queue)  # makes the broker block
            assert wait_until(lambda: publisher.is_blocked)
            with pytest.raises(PublishTimeout, match="connection blocked by the broker: "):
                publisher.publish(b"second", routing_key=queue, timeout=0.5)
            broker_node.clear_alarm("memory")
            assert first.result(HANG) is None
        finally:
            broker_node.clear_alarms()
            publisher.close()
    _delete(broker_node.url, queue)


async def test_async_publisher_on_a_blocked_connection_times_out_naming_the_block(
    broker_node: BrokerNode,
) -> None:
    queue = unique("blocked-timeout-async")
    async with rabbitry.AsyncConnection(broker_node.url, recovery=None) as conn:
        await (await conn.channel()).queue_declare(queue)
        publisher = await conn.publisher()
        try:
            await asyncio.to_thread(broker_node.set_alarm, "memory")
            first = await publisher.send(b"first", routing_key=queue)
            loop = asyncio.get_running_loop()
            deadline = loop.time() + HANG
            while not publisher.is_blocked and loop.time() < deadline:
                await asyncio.sleep(0.01)
            with pytest.raises(PublishTimeout, match="connection blocked by the broker: "):
                await publisher.send(b"second", routing_key=queue, timeout=0.5)
            await asyncio.to_thread(broker_node.clear_alarm, "memory")
            assert await asyncio.wait_for(first, HANG) is None
        finally:
            await asyncio.to_thread(broker_node.clear_alarms)
            await publisher.close()
        await (await conn.channel()).queue_delete(queue)
