"""Sharding over the x-consistent-hash exchange (rabbitry.sharding) on the test cluster.

The plugin is enabled on the throw-away cluster only (never on the shared broker). Each
test publishes numbered messages for many keys and checks the two promises: one key
always lands in one queue, in publish order; and the keys spread over the queues.
"""

from __future__ import annotations

import asyncio
import threading
from collections import Counter, defaultdict
from typing import TYPE_CHECKING

import pytest

import rabbitry
from rabbitry import AsyncConnection, Properties
from rabbitry.sharding import (
    AsyncShardedConsumer,
    AsyncShardedPublisher,
    ShardedConsumer,
    ShardedPublisher,
    Shards,
)

if TYPE_CHECKING:
    from tests.support.cluster import RabbitCluster

    from rabbitry.message import Message

KEYS = 200
PER_KEY = 10
SHARDS = 4
WAIT = 30.0


class Seen:
    """Which queue each key was delivered from, and the sequence numbers in order."""

    def __init__(self) -> None:
        self.queues: dict[str, set[str]] = defaultdict(set)
        self.sequences: dict[str, list[int]] = defaultdict(list)
        self.count = 0
        self.lock = threading.Lock()

    def add(self, message: Message, key: str) -> None:
        with self.lock:
            self.queues[key].add(message.consumer_tag)
            self.sequences[key].append(int(message.body))
            self.count += 1

    def check(self, shards: Shards, tags: dict[str, str]) -> Counter[str]:
        """Assert per-key order and one queue per key; return keys per queue."""
        assert self.count == KEYS * PER_KEY
        per_queue: Counter[str] = Counter()
        for key, seq in self.sequences.items():
            assert seq == list(range(PER_KEY)), f"{key} out of order: {seq}"
            assert len(self.queues[key]) == 1, f"{key} went to {self.queues[key]}"
            per_queue[tags[next(iter(self.queues[key]))]] += 1
        assert set(per_queue) <= set(shards.queue_names)
        return per_queue


def assert_spread(per_queue: Counter[str], shards: Shards) -> None:
    # Equal weights: each queue's share of 200 keys is ~50 (binomial sd ~6); every queue
    # gets at least 40 % and at most 160 % of an even share.
    even = KEYS / shards.count
    assert len(per_queue) == shards.count, per_queue
    for queue, keys in per_queue.items():
        assert 0.4 * even <= keys <= 1.6 * even, f"{queue}: {keys} keys ({dict(per_queue)})"


@pytest.mark.parametrize("hash_header", [None, "x-shard-key"])
async def test_async_sharding_spreads_keys_and_keeps_per_key_order(
    rmq_cluster: RabbitCluster, unique: str, hash_header: str | None
) -> None:
    shards = Shards(f"{unique}-ex", SHARDS, hash_header=hash_header)
    seen = Seen()
    async with AsyncConnection(rmq_cluster.urls) as conn:

        async def handler(message: Message) -> None:
            key = message.headers.get("key")
            assert isinstance(key, str)
            seen.add(message, key)

        consumer = AsyncShardedConsumer(conn, shards, handler, prefetch=50)
        await consumer.start()
        tags = {c.consumer_tag or "": c.queue for c in consumer.consumers}
        publisher = await AsyncShardedPublisher.create(conn, shards, max_in_flight=500)
        for n in range(PER_KEY):
            for k in range(KEYS):
                key = f"customer-{k}"
                await publisher.send(
                    str(n).encode(), key, properties=Properties(headers={"key": key})
                )
        await publisher.wait_for_confirms(timeout=WAIT)
        async with asyncio.timeout(WAIT):
            while seen.count < KEYS * PER_KEY:
                await asyncio.sleep(0.05)
        await consumer.stop()
        await publisher.close()
        await shards.topology().adelete(conn)
    assert_spread(seen.check(shards, tags), shards)


def test_sync_sharding_twin(rmq_cluster: RabbitCluster, unique: str) -> None:
    shards = Shards(f"{unique}-ex", SHARDS, queue_prefix=f"{unique}-q", queue_type="quorum")
    seen = Seen()
    done = threading.Event()

    def handler(message: Message) -> None:
        seen.add(message, message.routing_key)
        if seen.count == KEYS * PER_KEY:
            done.set()

    with rabbitry.Connection(rmq_cluster.urls) as conn:
        consumer = ShardedConsumer(conn, shards, handler, prefetch=50)
        consumer.start()
        tags = {c.consumer_tag or "": c.queue for c in consumer.consumers}
        with ShardedPublisher.create(conn, shards) as publisher:
            for n in range(PER_KEY):
                for k in range(KEYS):
                    publisher.publish(str(n).encode(), f"k{k}")
            publisher.wait_for_confirms(timeout=WAIT)
        assert done.wait(WAIT)
        consumer.stop()
        shards.topology().delete(conn)
    assert_spread(seen.check(shards, tags), shards)


async def test_declared_exchange_is_consistent_hash_with_weighted_bindings(
    rmq_cluster: RabbitCluster, unique: str
) -> None:
    shards = Shards(f"{unique}-ex", 3, weight=5)
    node = rmq_cluster.nodes[0]
    async with AsyncConnection(rmq_cluster.urls) as conn:
        await shards.topology().aapply(conn)
        try:
            exchanges = await asyncio.to_thread(
                node.ctl, "list_exchanges", "name", "type", "--quiet", "--no-table-headers"
            )
            bindings = await asyncio.to_thread(
                node.ctl,
                "list_bindings",
                "source_name",
                "destination_name",
                "routing_key",
                "--quiet",
                "--no-table-headers",
            )
        finally:
            await shards.topology().adelete(conn)
    assert f"{shards.exchange}\tx-consistent-hash" in exchanges
    weighted = {
        tuple(line.split("\t")) for line in bindings.splitlines() if line.startswith(unique)
    }
    assert weighted == {(shards.exchange, q, "5") for q in shards.queue_names}
