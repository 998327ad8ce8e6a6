"""K1-K5 of ``docs/cluster.md``: quorum-queue failover on a 3-node cluster, and a soak.

Each test runs the ``total-queue`` checker of ``workload.py``: lost = 0 and unexpected = 0
are required; duplicates, nacks and recovered are counted and printed (run with ``-s``
to see the numbers; docs/cluster.md records a measured run). Stall bounds are the pass
criteria of §3.8, measured from the fault to the first confirm after it.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import os
import random
import time
from collections import Counter
from typing import TYPE_CHECKING

import pytest
from tests.cluster.workload import (
    NACK_RETRY,
    Checker,
    Publishing,
    Stalls,
    Trace,
    connect,
    consume_into,
    declare_quorum,
    publish_paced,
    track_states,
    wait_delivered,
)

from rabbitry import AMQPError
from rabbitry.recovery import State

if TYPE_CHECKING:
    from pathlib import Path

    from tests.support.cluster import RabbitCluster
    from tests.support.node import BrokerNode

    from rabbitry import AsyncConnection


def node_of(cluster: RabbitCluster, conn: AsyncConnection) -> BrokerNode:
    """The member a connection is attached to (by its AMQP port)."""
    return next(n for n in cluster.nodes if n.port == conn.params.port)


def consumers_on_live_nodes(cluster: RabbitCluster, queue: str) -> int:
    """How many consumers of ``queue`` have their channel on a running node.

    A consumer whose node died without closing its channels (a graceful stop that timed
    out and was turned into a kill) is kept by a quorum queue as "suspected down" and
    still counted by ``queue.declare-ok``; it is not a consumer of this client's.
    """
    live = cluster.running()
    listing = live[0].ctl("list_consumers", "-q", "--no-table-headers", "queue_name", "channel_pid")
    rows = [line.split("\t") for line in listing.splitlines() if line.strip()]
    return sum(
        1
        for row in rows
        if row[0] == queue and any(row[1].startswith(f"<{node.name}.") for node in live)
    )


def report(name: str, checker: Checker, stalls: Stalls, started: float, **extra: object) -> None:
    numbers = {**checker.summary(), **extra}
    numbers["stalls_s"] = stalls.per_fault()
    numbers["time_s"] = round(time.monotonic() - started, 1)
    print(f"\n{name}: {numbers}")


def assert_total_queue(checker: Checker) -> None:
    assert not checker.lost(), f"lost {len(checker.lost())}: {sorted(checker.lost())[:20]}"
    assert not checker.unexpected(), f"unexpected: {sorted(checker.unexpected())[:20]}"


# --------------------------------------------------------------------------- K1


@pytest.mark.timeout(240)
async def test_k1_leader_with_the_publisher_killed_twice(
    rmq_cluster: RabbitCluster, unique: str
) -> None:
    """10k confirmed messages; the quorum leader, which is also the node the publisher is
    connected to, is killed with SIGKILL at 3k and 7k confirms. The publisher knows all
    three nodes, fails over, re-sends its unconfirmed messages, and re-publishes what the
    leaderless queue nacks (with backoff). The consumer sits on another node."""
    cluster = rmq_cluster
    total, kills_at, window = 10_000, (3_000, 7_000), 1_000
    started = time.monotonic()
    queue = f"{unique}-k1"
    admin = await connect(cluster.urls, f"{unique}-admin")
    await declare_quorum(admin, queue)
    await admin.close()
    leader = cluster.leader(queue)
    others = [n for n in cluster.nodes if n is not leader]

    pub_conn = await connect(cluster.urls_from(leader), f"{unique}-pub")
    con_conn = await connect(cluster.urls_from(others[0]), f"{unique}-con")
    states = track_states(pub_conn)
    checker, stalls = Checker(), Stalls()
    in_flight_at_kill: list[int] = []
    try:
        assert node_of(cluster, pub_conn) is leader
        consumer = await consume_into(con_conn, queue, checker)
        publisher = await pub_conn.publisher(
            max_in_flight=window, republish_unconfirmed=True, nack_retry=NACK_RETRY
        )
        publishing = Publishing(publisher, queue, checker, stalls)

        async def restart_after_failover(victim: BrokerNode) -> BrokerNode:
            # A booting node eats CPU on a small machine; start it once the failover
            # is over (the window's worth of confirms arrived), not during the election.
            confirmed = len(checker.confirmed)
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(15):
                    while len(checker.confirmed) < confirmed + window:
                        await asyncio.sleep(0.05)
            return await asyncio.to_thread(cluster.start, victim)

        restart: asyncio.Task[BrokerNode] | None = None
        for n in range(total):
            if any(n == at - window - 500 for at in kills_at[1:]):
                # The last victim must be back before the next kill (a quorum of 3
                # survives one loss, not two), and the leader must be where the
                # publisher now is; done well before the kill, so the window fills up
                # again before it.
                if restart is not None:
                    await restart
                    restart = None
                await asyncio.to_thread(cluster.move_leader, queue, node_of(cluster, pub_conn))
            if n in kills_at:
                victim = node_of(cluster, pub_conn)
                in_flight_at_kill.append(publisher.in_flight)
                stalls.fault(f"kill -9 {victim.short_name}")
                await asyncio.to_thread(cluster.kill, victim)
                restart = asyncio.create_task(restart_after_failover(victim))
            await publishing.publish(n)
        await publishing.settle(120)
        if restart is not None:
            await restart
        await wait_delivered(checker, 60)
        await consumer.stop()
    finally:
        await pub_conn.close()
        await con_conn.close()

    report(
        "K1",
        checker,
        stalls,
        started,
        in_flight_at_kill=in_flight_at_kill,
        recoveries=states.count(State.RECOVERING),
    )
    assert not publishing.errors, publishing.errors[:5]
    assert checker.confirmed == set(range(total))
    assert_total_queue(checker)
    assert len(checker.delivered) == total
    assert states.count(State.RECOVERING) == len(kills_at)  # one failover per kill
    # Duplicates come from re-sent unconfirmed messages and redelivered unacked ones.
    assert checker.duplicates() <= sum(in_flight_at_kill) + 2 * 200 * len(kills_at)
    assert min(in_flight_at_kill) > 0  # each kill hit unconfirmed messages
    for what, stall in stalls.per_fault():
        assert stall <= 5.0, f"{what}: confirms stalled {stall:.2f} s"


# --------------------------------------------------------------------------- K2-K4


async def _follower_run(
    cluster: RabbitCluster,
    unique: str,
    name: str,
    fault: str,
    *,
    total: int = 5_000,
    fault_at: int = 1_500,
    rate: float = 400.0,
) -> tuple[Checker, Stalls, list[State], list[State], AsyncConnection, BrokerNode]:
    """Publisher and consumer on the two followers (K2, K3) or both on one follower
    (K4); ``fault`` hits the leader (``stop``, ``pause``) or the clients' node
    (``stop-client-node``) once ``fault_at`` ids were published, while publishing
    goes on at ``rate`` per second."""
    queue = f"{unique}-{name}"
    admin = await connect(cluster.urls, f"{unique}-admin")
    await declare_quorum(admin, queue)
    await admin.close()
    leader = cluster.leader(queue)
    f1, f2 = [n for n in cluster.nodes if n is not leader]
    consumer_first = f1 if fault == "stop-client-node" else f2
    pub_conn = await connect(cluster.urls_from(f1), f"{unique}-pub")
    con_conn = await connect(cluster.urls_from(consumer_first), f"{unique}-con")
    pub_states, con_states = track_states(pub_conn), track_states(con_conn)
    checker, stalls = Checker(), Stalls()
    victim = f1 if fault == "stop-client-node" else leader
    try:
        consumer = await consume_into(con_conn, queue, checker)
        publisher = await pub_conn.publisher(
            max_in_flight=1_000, republish_unconfirmed=True, nack_retry=NACK_RETRY
        )
        publishing = Publishing(publisher, queue, checker, stalls)
        await publish_paced(publishing, range(fault_at), rate)
        stalls.fault(f"{fault} {victim.short_name}")
        if fault == "pause":
            with cluster.paused(victim, 20):
                await publish_paced(publishing, range(fault_at, fault_at + int(rate * 20)), rate)
            rest = range(fault_at + int(rate * 20), total)
        else:
            await asyncio.to_thread(cluster.stop, victim)
            rest = range(fault_at, total)
        await publish_paced(publishing, rest, rate)
        await publishing.settle(60)
        await wait_delivered(checker, 60)
        if fault == "stop-client-node":
            # The consumer came back on the quorum queue: exactly one, on a live node.
            assert await asyncio.to_thread(consumers_on_live_nodes, cluster, queue) == 1
        await consumer.stop()
    finally:
        await pub_conn.close()
        await con_conn.close()
    assert not publishing.errors, publishing.errors[:5]
    assert checker.confirmed == set(range(total))
    assert_total_queue(checker)
    return checker, stalls, pub_states, con_states, pub_conn, victim


@pytest.mark.timeout(180)
async def test_k2_graceful_stop_of_the_leader(rmq_cluster: RabbitCluster, unique: str) -> None:
    """``rabbitmqctl stop`` of the leader while clients sit on the followers: no
    reconnect, confirms stall at most 1 s, nothing lost."""
    started = time.monotonic()
    checker, stalls, pub_states, con_states, _, _ = await _follower_run(
        rmq_cluster, unique, "k2", "stop"
    )
    report("K2", checker, stalls, started)
    assert State.RECOVERING not in pub_states + con_states  # no reconnect
    ((_, stall),) = stalls.per_fault()
    assert stall <= 1.0, f"confirms stalled {stall:.2f} s"


@pytest.mark.timeout(180)
async def test_k3_leader_frozen_for_20_seconds(rmq_cluster: RabbitCluster, unique: str) -> None:
    """SIGSTOP of the leader for 20 s (below net_ticktime), then SIGCONT: confirms stall
    at most 15 s, nothing lost, and the cluster has no partition afterwards."""
    started = time.monotonic()
    checker, stalls, pub_states, con_states, _, _ = await _follower_run(
        rmq_cluster, unique, "k3", "pause", total=6_000, fault_at=1_000, rate=200.0
    )
    report("K3", checker, stalls, started)
    assert State.RECOVERING not in pub_states + con_states
    ((_, stall),) = stalls.per_fault()
    assert stall <= 15.0, f"confirms stalled {stall:.2f} s"
    assert rmq_cluster.partitions() == "[]"


@pytest.mark.timeout(180)
async def test_k4_the_clients_node_is_stopped(rmq_cluster: RabbitCluster, unique: str) -> None:
    """The node both clients are connected to is stopped: they reconnect to the next of
    their three endpoints, re-declare the topology, the consumer resumes on the quorum
    queue, and nothing is lost."""
    started = time.monotonic()
    checker, stalls, pub_states, con_states, pub_conn, victim = await _follower_run(
        rmq_cluster, unique, "k4", "stop-client-node"
    )
    report("K4", checker, stalls, started)
    assert pub_states.count(State.RECOVERING) == 1
    assert con_states.count(State.RECOVERING) == 1
    assert pub_conn.params.port != victim.port  # failed over to another endpoint


# --------------------------------------------------------------------------- K5

#: Faults the nemesis injects (8 by default: 4 kills, 4 freezes, in a random order);
#: override for a longer soak. The clients run until the last fault has healed.
SOAK_FAULTS = int(os.environ.get("RABBITRY_SOAK_FAULTS", "8"))
#: Seconds of health before each fault.
SOAK_HEALTHY = 5.0
#: Operations per second over all clients, as in rabbitmq/jepsen.
SOAK_RATE = 50.0
SOAK_CLIENTS = 3


async def _soak_client(
    cluster: RabbitCluster,
    unique: str,
    index: int,
    queue: str,
    checker: Checker,
    stalls: Stalls,
    ids: itertools.count[int],
    stop: asyncio.Event,
    counts: Counter[str],
    trace: Trace,
) -> Publishing:
    """One Jepsen-style client: a random mix of enqueues (confirmed, nacks retried) and
    dequeues (basic.get + ack) at SOAK_RATE / SOAK_CLIENTS per second. Every operation
    goes into ``trace``."""
    rng = random.Random(index)
    urls = cluster.urls_from(index)
    conn = await connect([urls[0], *rng.sample(urls[1:], len(urls) - 1)], f"{unique}-c{index}")
    publisher = await conn.publisher(
        max_in_flight=1_000, republish_unconfirmed=True, nack_retry=NACK_RETRY
    )
    publishing = Publishing(publisher, queue, checker, stalls, trace, index)
    channel = await conn.channel()
    interval = SOAK_CLIENTS / SOAK_RATE
    try:
        while not stop.is_set():
            tick = time.monotonic()
            if rng.random() < 0.5:
                await publishing.publish(next(ids))
                counts["enqueue"] += 1
            else:
                where = {"client": index, "port": conn.params.port, "channel": channel.channel_id}
                try:
                    if channel.is_closed:
                        channel = await conn.channel(timeout=5)
                        where["channel"] = channel.channel_id
                    message = await channel.basic_get(queue, timeout=5)
                    if message is not None:
                        trace.add("dequeue", id=int(message.body), **where)
                        checker.record(message)
                        message.ack()
                    else:
                        trace.add("empty", **where)
                    counts["dequeue" if message is not None else "empty"] += 1
                except (AMQPError, TimeoutError) as exc:
                    trace.add("dequeue failed", error=repr(exc), **where)
                    counts[f"dequeue failed: {type(exc).__name__}"] += 1
            await asyncio.sleep(max(0.0, interval - (time.monotonic() - tick)))
        await publishing.settle(90)
    finally:
        await conn.close()
    return publishing


async def _nemesis(cluster: RabbitCluster, stalls: Stalls, trace: Trace) -> list[str]:
    """SOAK_FAULTS faults, half kill -9 and restart, half a 10 s freeze, each on a random
    node after SOAK_HEALTHY seconds of health, in a random order."""
    rng = random.Random()
    kinds = ["kill"] * (SOAK_FAULTS // 2) + ["freeze"] * (SOAK_FAULTS - SOAK_FAULTS // 2)
    rng.shuffle(kinds)
    done: list[str] = []
    for kind in kinds:
        await asyncio.sleep(SOAK_HEALTHY)
        victim = rng.choice(cluster.nodes)
        trace.add(kind, port=victim.port)
        if kind == "kill":
            stalls.fault(f"kill -9 {victim.short_name}")
            await asyncio.to_thread(cluster.kill, victim)
            await asyncio.sleep(2)
            await asyncio.to_thread(cluster.start, victim)
        else:
            stalls.fault(f"SIGSTOP 10s {victim.short_name}")
            cluster.pause(victim, 10)
            try:
                await asyncio.sleep(10)
            finally:
                cluster.resume(victim)
        trace.add(f"{kind} over", port=victim.port)
        done.append(f"{kind} {victim.short_name}")
    await asyncio.sleep(SOAK_HEALTHY)
    return done


def _queue_counts(cluster: RabbitCluster, queue: str) -> tuple[int, int, int]:
    """(messages, ready, unacknowledged) of ``queue``, as ``rabbitmqctl list_queues``
    on a running member reports them."""
    out = cluster.any_running().ctl(
        "list_queues",
        "--no-table-headers",
        "name",
        "messages",
        "messages_ready",
        "messages_unacknowledged",
    )
    for line in out.splitlines():
        fields = line.split()
        if len(fields) == 4 and fields[0] == queue:
            return int(fields[1]), int(fields[2]), int(fields[3])
    raise AssertionError(f"list_queues does not show {queue}: {out!r}")


async def _drain(
    cluster: RabbitCluster, unique: str, queue: str, checker: Checker, trace: Trace
) -> tuple[int, int, int]:
    """Take every message from the queue through each member in turn, until the queue
    holds none, ready or unacknowledged; returns the last counts.

    A message can still be checked out to a channel that is gone when the drain starts
    (a basic.get-ok that came after its caller's timeout stays unacknowledged until its
    channel ends, and the queue returns it when it processes that end): such a message
    is ready again only later, so the drain waits for the count to reach 0, up to
    DRAIN_SETTLE seconds.
    """
    deadline = time.monotonic() + DRAIN_SETTLE
    while True:
        for node in cluster.nodes:
            conn = await connect([node.url], f"{unique}-drain")
            try:
                channel = await conn.channel()
                while (message := await channel.basic_get(queue, timeout=10)) is not None:
                    trace.add("drained", id=int(message.body), port=node.port)
                    checker.record(message)
                    message.ack()
            finally:
                await conn.close()
        counts = await asyncio.to_thread(_queue_counts, cluster, queue)
        trace.add("queue after drain", counts=counts)
        if counts[0] == 0 or time.monotonic() >= deadline:
            return counts
        await asyncio.sleep(0.5)


#: How long the drain waits for messages still checked out to reach the queue again.
DRAIN_SETTLE = 60.0


@pytest.mark.timeout(SOAK_FAULTS * 40 + 240 + DRAIN_SETTLE)
async def test_k5_soak_of_random_kills_and_freezes(
    rmq_cluster: RabbitCluster, unique: str, tmp_path: Path
) -> None:
    """Jepsen-lite: 3 clients enqueue and dequeue at 50 ops/s on a quorum queue while
    the nemesis kills and restarts, or freezes for 10 s, a random node SOAK_FAULTS times
    (half of each kind); then the cluster heals and every node is drained until the
    queue is empty. lost = 0 and unexpected = 0; on a failure the message names the
    history of each lost id (the whole trace is in ``tmp_path``)."""
    cluster = rmq_cluster
    started = time.monotonic()
    queue = f"{unique}-k5"
    admin = await connect(cluster.urls, f"{unique}-admin")
    await declare_quorum(admin, queue)
    await admin.close()
    checker, stalls, counts, trace = Checker(), Stalls(), Counter[str](), Trace()
    ids = itertools.count()
    stop = asyncio.Event()
    clients = [
        asyncio.create_task(
            _soak_client(cluster, unique, i, queue, checker, stalls, ids, stop, counts, trace)
        )
        for i in range(SOAK_CLIENTS)
    ]
    nemesis = asyncio.create_task(_nemesis(cluster, stalls, trace))
    try:
        faults = await nemesis
    finally:
        nemesis.cancel()
        stop.set()
        results = await asyncio.gather(*clients, return_exceptions=True)
    for result in results:
        if isinstance(result, BaseException):
            raise result
        assert not result.errors, result.errors[:5]

    # Heal, then drain every node until the queue is empty.
    await asyncio.to_thread(cluster.heal)
    left = await _drain(cluster, unique, queue, checker, trace)

    report("K5", checker, stalls, started, faults=faults, ops=dict(counts))
    trace.dump(tmp_path / "k5-trace.jsonl")
    assert len(faults) == SOAK_FAULTS, faults
    assert counts["enqueue"] > 0
    assert counts["dequeue"] > 0
    assert not checker.unknown(), "publishes without outcome after healing"
    lost = sorted(checker.lost())
    assert not lost, (
        f"lost {len(lost)}: {lost[:20]}; queue (messages, ready, unacked) {left}; "
        + "; ".join(f"id {n}: {trace.about(n)}" for n in lost[:5])
        + f"; trace: {tmp_path / 'k5-trace.jsonl'}"
    )
    assert_total_queue(checker)
