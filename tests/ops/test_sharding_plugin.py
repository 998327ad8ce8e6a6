"""The ``rabbitmq_sharding`` plugin through ``Topology.with_sharding`` and the sharded
queue consumers, on the ops node (which has the plugin enabled)."""

from __future__ import annotations

import asyncio
import collections
import threading
import time
from typing import TYPE_CHECKING

import pytest

import rabbitry
from rabbitry.exceptions import ConfigurationError, TopologyValidationError
from rabbitry.sharded_queue import (
    AsyncShardedQueueConsumer,
    ShardedQueueConsumer,
    shard_queue_name,
)
from rabbitry.topology import MODULUS_HASH, Exchange, Queue, Topology

if TYPE_CHECKING:
    from collections.abc import Callable, Iterator

    from tests.support.node import BrokerNode

    from rabbitry.management import ManagementClient


def _wait(predicate: Callable[[], object], what: str, timeout: float = 30.0) -> object:
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.1)


def _shards(api: ManagementClient, exchange: str) -> list[str]:
    prefix = f"sharding: {exchange} - "
    return sorted(q.name for q in api.queues("/") if q.name.startswith(prefix))


@pytest.fixture
def sharded(api: ManagementClient, mgmt_node: BrokerNode, uid: str) -> Iterator[Topology]:
    """A sharded ``x-modulus-hash`` exchange with 3 shards per node, applied."""
    topology = Topology(exchanges=[Exchange(f"{uid}.x", MODULUS_HASH, durable=False)])
    topology = topology.with_sharding(f"{uid}.x", 3)
    with rabbitry.Connection(mgmt_node.url) as conn:
        topology.apply(conn, management=api)
    try:
        yield topology
    finally:
        with rabbitry.Connection(mgmt_node.url) as conn:
            topology.delete(conn, management=api)
        for name in _shards(api, f"{uid}.x"):
            api.delete_queue(name)


def test_shards_follow_shards_per_node(
    api: ManagementClient, mgmt_node: BrokerNode, sharded: Topology, uid: str
) -> None:
    node = mgmt_node.name
    expected = [shard_queue_name(f"{uid}.x", node, n) for n in range(3)]
    _wait(lambda: _shards(api, f"{uid}.x") == expected, "3 shard queues")
    assert sharded.sharded_exchanges() == {f"{uid}.x": 3}
    # Raising shards-per-node adds shards; the plugin never removes any.
    more = Topology(exchanges=sharded.exchanges).with_sharding(f"{uid}.x", 5)
    with rabbitry.Connection(mgmt_node.url) as conn:
        more.apply(conn, management=api)
    expected = [shard_queue_name(f"{uid}.x", node, n) for n in range(5)]
    _wait(lambda: _shards(api, f"{uid}.x") == expected, "5 shard queues")


def test_consumers_of_the_sharded_queue_share_it_and_get_each_message_once(
    api: ManagementClient, mgmt_node: BrokerNode, sharded: Topology, uid: str
) -> None:
    exchange = f"{uid}.x"
    _wait(lambda: len(_shards(api, exchange)) == 3, "3 shard queues")
    seen: collections.Counter[bytes] = collections.Counter()
    lock = threading.Lock()
    total = 600

    def handle(message: rabbitry.Message) -> None:
        with lock:
            seen[message.body] += 1

    with rabbitry.Connection(mgmt_node.url) as conn:
        with ShardedQueueConsumer(conn, exchange, handle, consumers=3, prefetch=20) as group:
            # Each subscription was confirmed before the next: the plugin gave every
            # shard one consumer.
            _wait(
                lambda: [q.consumers for q in api.queues("/") if q.name.startswith(
                    f"sharding: {exchange} - ")] == [1, 1, 1],
                "one consumer per shard",
            )  # fmt: skip
            with conn.publisher() as publisher:
                for i in range(total):
                    publisher.publish(b"%d" % i, exchange=exchange, routing_key=f"key-{i}")
                publisher.wait_for_confirms(timeout=30)
            _wait(lambda: sum(seen.values()) >= total, f"{total} deliveries")
            _wait(lambda: all(c.stats.acked for c in group.consumers), "acks")
        assert sorted(seen) == sorted(b"%d" % i for i in range(total))
        assert set(seen.values()) == {1}
        delivered = [c.stats.delivered for c in group.consumers]
        assert sum(delivered) == total
        assert all(count > 0 for count in delivered), delivered
    assert all(q.messages == 0 for q in api.queues("/") if q.name.startswith("sharding: "))


async def test_async_consumer_of_the_sharded_queue(
    api: ManagementClient, mgmt_node: BrokerNode, sharded: Topology, uid: str
) -> None:
    exchange = f"{uid}.x"
    await asyncio.to_thread(_wait, lambda: len(_shards(api, exchange)) == 3, "3 shard queues")
    got: list[bytes] = []
    done = asyncio.Event()

    async def handle(message: rabbitry.Message) -> None:
        got.append(message.body)
        if len(got) >= 60:
            done.set()

    async with rabbitry.AsyncConnection(mgmt_node.url) as conn:
        async with AsyncShardedQueueConsumer(conn, exchange, handle, consumers=3):
            publisher = await conn.publisher()
            for i in range(60):
                await publisher.send(b"%d" % i, exchange=exchange, routing_key=str(i))
            await publisher.wait_for_confirms(timeout=30)
            await publisher.close()
            await asyncio.wait_for(done.wait(), 30)
    assert sorted(got) == sorted(b"%d" % i for i in range(60))


def test_sharded_name_is_not_a_queue_and_retry_is_refused(
    mgmt_node: BrokerNode, sharded: Topology, uid: str
) -> None:
    with pytest.raises(TopologyValidationError, match="sharded exchange"):
        sharded + Topology(queues=[Queue(f"{uid}.x")])
    with (
        rabbitry.Connection(mgmt_node.url) as conn,
        pytest.raises(ConfigurationError, match=r"^retry"),
    ):
        ShardedQueueConsumer(
            conn, f"{uid}.x", lambda m: None, consumers=1, retry=rabbitry.RetryPolicy(delays=[1])
        )
