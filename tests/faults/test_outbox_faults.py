"""The durable outbox under faults, on a throw-away node.

* The producer process is killed with SIGKILL at random points while publishing 10,000
  messages and restarted on the same outbox file: a consumer sees every id (lost = 0),
  duplicates are counted and reported.
* The broker is unreachable (the fault proxy refuses connections): ``publish()`` keeps
  storing up to the outbox's bound, then fails with :class:`OutboxFull` after its
  timeout; once the broker is back everything stored is delivered.
"""

from __future__ import annotations

import asyncio
import os
import random
import select
import signal
import subprocess
import sys
import time
import uuid
from collections import Counter
from pathlib import Path
from typing import TYPE_CHECKING

import pytest
from tests.faults.helpers import WAIT, eventually
from tests.support.proxy import TcpProxy

import rabbitry
from rabbitry import AsyncConnection, OutboxFull, RecoveryPolicy, SQLiteOutbox
from rabbitry.protocol.spec import BasicProperties

if TYPE_CHECKING:
    from tests.support.node import BrokerNode

PRODUCER = Path(__file__).with_name("outbox_producer.py")
TOTAL = 10_000
KILLS = 6


def unique(prefix: str) -> str:
    return f"rabbitry-outbox-{prefix}-{uuid.uuid4().hex[:8]}"


async def drain_ids(channel: rabbitry.AsyncChannel, queue: str) -> Counter[str]:
    seen: Counter[str] = Counter()
    while (message := await channel.basic_get(queue, no_ack=True, timeout=10)) is not None:
        seen[str(message.properties.message_id)] += 1
    return seen


def wait_line(child: subprocess.Popen[str], timeout: float) -> str:
    assert child.stdout is not None
    ready, _, _ = select.select([child.stdout], [], [], timeout)
    if not ready:
        raise AssertionError(f"the producer said nothing within {timeout} s")
    return child.stdout.readline().strip()


def progress_of(path: Path) -> int:
    try:
        text = path.read_text().strip()
    except FileNotFoundError:
        return 0
    return int(text) if text else 0


def start_producer(url: str, outbox: Path, queue: str, progress: Path) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, str(PRODUCER), url, str(outbox), queue, str(TOTAL), str(progress)],
        stdout=subprocess.PIPE,
        text=True,
        env=os.environ.copy(),
    )


@pytest.mark.timeout(120)
async def test_sigkill_of_the_producer_loses_nothing(
    broker_node: BrokerNode, tmp_path: Path
) -> None:
    seed = random.randrange(2**32)
    rng = random.Random(seed)
    thresholds = sorted(rng.sample(range(500, 9500), KILLS))
    queue = unique("kill")
    outbox, progress = tmp_path / "outbox.db", tmp_path / "progress"
    conn = AsyncConnection(broker_node.url)
    await conn.connect()
    try:
        channel = await conn.channel()
        await channel.queue_declare(queue)
        kills: list[str] = []
        started = time.monotonic()
        while True:
            child = start_producer(broker_node.url, outbox, queue, progress)
            try:
                line = await asyncio.to_thread(wait_line, child, 30)
                assert line.startswith("ready "), line
                if len(kills) < KILLS:
                    # A random point of the stream (thresholds drawn over 500..9500),
                    # plus a random few ms: mid-batch, mid-commit, mid-resend.
                    target = thresholds[len(kills)]
                    while child.poll() is None and progress_of(progress) < target:
                        await asyncio.sleep(0.002)
                    await asyncio.sleep(rng.uniform(0.0, 0.02))
                    if child.poll() is None:
                        child.send_signal(signal.SIGKILL)
                        child.wait()
                        kills.append(f"{line} -> killed at {progress_of(progress)}")
                        continue
                line = await asyncio.to_thread(wait_line, child, 60)
                assert line.startswith("done"), line
                assert child.wait(timeout=30) == 0
                break
            finally:
                if child.poll() is None:
                    child.kill()
                child.wait()
                if child.stdout is not None:
                    child.stdout.close()
        seen = await drain_ids(channel, queue)
        await channel.queue_delete(queue)
    finally:
        await conn.close()
    expected = {f"m-{n}" for n in range(TOTAL)}
    lost = expected - seen.keys()
    unexpected = seen.keys() - expected
    duplicates = sum(count - 1 for count in seen.values())
    print(
        f"seed={seed} kills={len(kills)} ({'; '.join(kills)}) delivered={len(seen)} "
        f"lost={len(lost)} unexpected={len(unexpected)} duplicates={duplicates} "
        f"in {time.monotonic() - started:.1f} s"
    )
    assert len(kills) == KILLS, kills
    assert not lost, f"lost {len(lost)} messages, e.g. {sorted(lost)[:5]} (seed {seed})"
    assert not unexpected, sorted(unexpected)[:5]
    status = SQLiteOutbox(outbox).status()
    assert (status.pending, status.dead) == (0, 0)


@pytest.mark.timeout(90)
async def test_broker_unreachable_fills_the_outbox_then_delivers_everything(
    broker_node: BrokerNode, tmp_path: Path
) -> None:
    queue = unique("down")
    path = tmp_path / "outbox.db"
    bound = 300
    direct = AsyncConnection(broker_node.url)
    await direct.connect()
    proxy = TcpProxy("127.0.0.1", broker_node.port).start()
    conn = AsyncConnection(
        proxy.url(),
        recovery=RecoveryPolicy(initial_delay=0.05, max_delay=0.5, jitter=0.1),
        connection_timeout=2,
    )
    try:
        channel = await direct.channel()
        await channel.queue_declare(queue)
        await conn.connect()
        outbox = SQLiteOutbox(
            path, max_rows=bound, confirm_timeout=2.0, retry_delay=0.05, max_retry_delay=0.5
        )
        publisher = await conn.publisher(outbox=outbox, timeout=1.0)
        ids = [await publisher.publish(b"before", routing_key=queue) for _ in range(50)]
        await publisher.flush(timeout=10)

        proxy.refuse()
        proxy.reset()  # the broker is gone: new connections are refused
        started = time.monotonic()
        for n in range(bound // 2):
            ids.append(
                await publisher.publish(
                    b"down", routing_key=queue, properties=BasicProperties(message_id=f"d-{n}")
                )
            )
        ids += await publisher.publish_many([b"down-batch"] * (bound // 2), routing_key=queue)
        storing = time.monotonic() - started
        assert publisher.stats().pending == bound
        assert conn.state is not rabbitry.State.OPEN
        blocked = time.monotonic()
        with pytest.raises(OutboxFull) as info:
            await publisher.publish(b"one too many", routing_key=queue)
        waited = time.monotonic() - blocked
        assert waited >= 0.9, waited  # it waited its timeout for room before giving up
        assert f"full ({bound}/{bound} rows" in str(info.value)
        assert str(path) in str(info.value) and "unreachable" in str(info.value)
        down_for = time.monotonic() - started

        proxy.refuse(False)  # the broker is back
        await publisher.flush(timeout=30)
        stats = publisher.stats()
        await publisher.close()
        seen = await drain_ids(channel, queue)
        await channel.queue_delete(queue)
    finally:
        await conn.close(timeout=5)
        await direct.close()
        proxy.stop()
    lost = set(ids) - seen.keys()
    duplicates = sum(count - 1 for count in seen.values())
    print(
        f"stored {bound} while down in {storing:.2f} s, down {down_for:.1f} s; "
        f"delivered={len(seen)} lost={len(lost)} duplicates={duplicates} resent={stats.resent}"
    )
    assert len(ids) == 50 + bound
    assert not lost, sorted(lost)[:5]
    assert seen.keys() == set(ids)
    assert SQLiteOutbox(path).status().pending == 0


@pytest.mark.timeout(60)
async def test_missing_confirms_are_resent_after_confirm_timeout(
    broker_node: BrokerNode, tmp_path: Path
) -> None:
    queue = unique("slow")
    path = tmp_path / "outbox.db"
    direct = AsyncConnection(broker_node.url)
    await direct.connect()
    proxy = TcpProxy("127.0.0.1", broker_node.port).start()
    conn = AsyncConnection(proxy.url())
    try:
        channel = await direct.channel()
        await channel.queue_declare(queue)
        await conn.connect()
        outbox = SQLiteOutbox(path, confirm_timeout=0.3, retry_delay=0.05, max_retry_delay=0.2)
        publisher = await conn.publisher(outbox=outbox)
        proxy.latency(1.0)  # confirms now take 2 s: longer than confirm_timeout
        ids = await publisher.publish_many([b"slow"] * 20, routing_key=queue)
        # Confirms take 2 s, the timeout is 0.3 s: messages are sent again meanwhile.
        assert await eventually(lambda: publisher.stats().resent >= 20, WAIT)
        proxy.latency(0)
        await publisher.flush(timeout=30)
        stats = publisher.stats()
        await publisher.close()
        seen = await drain_ids(channel, queue)
        await channel.queue_delete(queue)
    finally:
        await conn.close(timeout=5)
        await direct.close()
        proxy.stop()
    # Nothing lost. The resends are duplicates; some may still be on their way.
    assert seen.keys() == set(ids)
    assert stats.pending == 0 and stats.acked == 20
    status = SQLiteOutbox(path).status()
    assert status.resent == stats.resent and status.pending == 0
