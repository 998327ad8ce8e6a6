"""A replicated stream survives the loss of its leader node, and offsets stay put.

1,000 confirmed messages go into a stream on the 3-node cluster; its leader's node is
killed; a consumer on another node then reads the stream from ``first`` and from a
stored offset, and sees every message once, in order, with the offsets it had before.
"""

from __future__ import annotations

import asyncio
from typing import TYPE_CHECKING

import pytest
from tests.cluster.workload import FAST_RECOVERY

from rabbitry import AMQPError, AsyncConnection
from rabbitry.topology import Queue, Topology

if TYPE_CHECKING:
    from tests.support.cluster import RabbitCluster

    from rabbitry.message import Message

COUNT = 1_000
WAIT = 30.0


async def read_from(
    conn: AsyncConnection, queue: str, offset: object, count: int, wait: float = WAIT
) -> dict[int, bytes]:
    """``count`` distinct offsets read from ``offset`` on, as {offset: body}.

    Keyed by offset: a consumer re-subscribed by recovery starts again from ``offset``,
    and the messages it sees twice are the same messages.
    """
    got: dict[int, bytes] = {}
    enough = asyncio.Event()

    async def handler(message: Message) -> None:
        assert message.stream_offset is not None
        got[message.stream_offset] = message.body
        if len(got) >= count:
            enough.set()

    async with conn.consumer(queue, handler, prefetch=200, arguments={"x-stream-offset": offset}):
        await asyncio.wait_for(enough.wait(), wait)
    return got


@pytest.mark.timeout(240)
async def test_stream_survives_its_leader_and_keeps_offsets(
    rmq_cluster: RabbitCluster, unique: str
) -> None:
    cluster = rmq_cluster
    queue = f"{unique}-stream"
    async with AsyncConnection(cluster.urls, recovery=FAST_RECOVERY) as conn:
        await Topology(queues=[Queue(queue, queue_type="stream")]).aapply(conn)
        async with await conn.publisher() as publisher:
            for i in range(COUNT):
                await publisher.send(str(i), routing_key=queue)
            await publisher.wait_for_confirms(timeout=WAIT)
        before = await read_from(conn, queue, "first", COUNT)
    offsets = sorted(before)
    assert [before[o] for o in offsets] == [str(i).encode() for i in range(COUNT)]

    leader = cluster.leader(queue)
    await asyncio.to_thread(cluster.kill, leader)
    survivor = cluster.any_running(besides=[leader])
    urls = cluster.urls_from(survivor)
    # The stream elects a new leader and its replicas restart to follow it; until then
    # basic.consume is refused (506 "does not have a running local replica", which
    # closes the connection), so each attempt uses a connection of its own.
    after: dict[int, bytes] = {}
    attempts = 0
    async with asyncio.timeout(3 * WAIT):
        while not after:
            attempts += 1
            try:
                async with AsyncConnection(urls, recovery=None) as conn:
                    after = await read_from(conn, queue, "first", COUNT, wait=10)
            except (AMQPError, TimeoutError):
                await asyncio.sleep(1)
    async with AsyncConnection(urls, recovery=FAST_RECOVERY) as conn:
        resumed = await read_from(conn, queue, offsets[600], COUNT - 600)
        await Topology(queues=[Queue(queue, queue_type="stream")]).adelete(conn)
    print(f"\nstream read again after {attempts} attempt(s)")
    assert after == before  # same messages at the same offsets
    assert sorted(resumed) == offsets[600:]
    assert [resumed[o] for o in offsets[600:]] == [str(i).encode() for i in range(600, COUNT)]
