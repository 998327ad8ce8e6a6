"""Smoke tests of the throw-away node fixture, driven with the real rabbitry client.

Each fault the fixture can inject is checked once from the client's side: a resource
alarm blocks a publishing connection and clearing it unblocks it; a forced close arrives
as ``ConnectionForced`` (320); ``kill -9`` is seen at once as a lost connection and a
restart keeps durable data; a frozen node (SIGSTOP) ends in ``HeartbeatTimeout``.

Timing: the only timing assertions are the product's bounds (heartbeat detection within
2 × heartbeat + 1 s; a dead socket noticed within a second); every other wait is a
deadline that turns a hang into a failure.
"""

from __future__ import annotations

import asyncio
import subprocess
import time
import uuid
from pathlib import Path
from typing import TYPE_CHECKING

import pytest
from tests.support.node import epmd_names

import rabbitry
from rabbitry import AsyncConnection, Properties

if TYPE_CHECKING:
    from tests.support.node import Alarm, BrokerNode

pytestmark = pytest.mark.timeout(90)

#: Deadline for something that should happen (a hang fails; never a timing bound).
WAIT = 10.0
HEARTBEAT = 1
#: What rabbitry promises: a silent peer is detected within 2 × heartbeat + 1 s.
HEARTBEAT_BOUND = 2 * HEARTBEAT + 1
#: A peer whose socket the OS closed (kill -9) is noticed as soon as the EOF arrives.
DEAD_SOCKET_BOUND = 1.0
#: Allowance for event-loop and thread scheduling on a busy CI machine.
SCHEDULING_MARGIN = 0.5


def unique(prefix: str) -> str:
    return f"rabbitry-faults-{prefix}-{uuid.uuid4().hex[:8]}"


def processes_named(name: str) -> str:
    """``pgrep -af name``: empty when no process mentions the node name."""
    return subprocess.run(
        ["pgrep", "-af", name], capture_output=True, text=True, check=False
    ).stdout.strip()


async def test_node_is_private_and_serves_amqp(broker_node: BrokerNode) -> None:
    assert broker_node.port != 5672
    assert broker_node.name.startswith("rabbitry-t")
    assert broker_node.url == f"amqp://guest:guest@127.0.0.1:{broker_node.port}/"
    assert (broker_node.base_dir / "home" / ".erlang.cookie").stat().st_mode & 0o777 == 0o400
    assert broker_node.short_name in epmd_names()
    assert broker_node.eval("node().") == f"'{broker_node.name}'"

    async with AsyncConnection(broker_node.url, connection_timeout=5) as conn:
        ch = await conn.channel()
        await ch.confirm_select()
        queue = (await ch.queue_declare("", exclusive=True)).queue
        confirm = await ch.basic_publish("", queue, b"hello")
        assert confirm is not None
        await asyncio.wait_for(confirm, WAIT)
        message = await ch.basic_get(queue, no_ack=True)
        assert message is not None
        assert message.body == b"hello"


def test_sync_client_round_trip(broker_node: BrokerNode) -> None:
    with rabbitry.Connection(broker_node.url, connection_timeout=5) as conn:
        ch = conn.channel()
        ch.confirm_select()
        queue = ch.queue_declare("", exclusive=True).queue
        confirm = ch.basic_publish("", queue, b"sync hello")
        assert confirm is not None
        confirm.result(WAIT)
        message = ch.basic_get(queue, no_ack=True)
        assert message is not None
        assert message.body == b"sync hello"


@pytest.mark.parametrize(("alarm", "reason"), [("memory", "memory"), ("disk", "disk")])
async def test_alarm_blocks_a_publisher_until_cleared(
    broker_node: BrokerNode, alarm: Alarm, reason: str
) -> None:
    conn = AsyncConnection(broker_node.url, connection_timeout=5)
    await conn.connect()
    try:
        seen: list[str | None] = []
        changed = asyncio.Event()

        def on_blocked(why: str | None) -> None:
            seen.append(why)
            changed.set()

        conn.add_blocked_callback(on_blocked)
        ch = await conn.channel()
        await ch.confirm_select()
        queue = (await ch.queue_declare("", exclusive=True)).queue

        await asyncio.to_thread(broker_node.set_alarm, alarm)
        assert broker_node.alarms == {alarm}
        # RabbitMQ blocks a connection (connection.blocked) only once it publishes.
        assert not conn.is_blocked
        confirm = await ch.basic_publish("", queue, b"held back")
        assert confirm is not None
        async with asyncio.timeout(WAIT):
            await changed.wait()
        assert conn.is_blocked
        assert len(seen) == 1
        assert seen[0] is not None
        assert reason in seen[0]
        assert conn.blocked_reason == seen[0]
        assert not confirm.done()  # the broker stopped reading mid-publish: it is held

        changed.clear()
        await asyncio.to_thread(broker_node.clear_alarm, alarm)
        assert broker_node.alarms == set()
        async with asyncio.timeout(WAIT):
            await changed.wait()
            await confirm  # the held-back publish goes through
        assert seen[1:] == [None]
        assert not conn.is_blocked
        assert conn.blocked_reason is None
        assert conn.is_open
    finally:
        await conn.close(timeout=WAIT)


def test_forced_close_by_connection_name(broker_node: BrokerNode) -> None:
    victim_name, bystander_name = unique("victim"), unique("bystander")
    victim = rabbitry.Connection(
        broker_node.url, connection_name=victim_name, connection_timeout=5, recovery=None
    )
    bystander = rabbitry.Connection(
        broker_node.url, connection_name=bystander_name, connection_timeout=5, recovery=None
    )
    victim.connect()
    bystander.connect()
    try:
        listed = {row["connection_name"] for row in broker_node.list_connections()}
        assert {victim_name, bystander_name} <= listed

        assert broker_node.close_connection_by_name(victim_name, "fault test") == 1
        exc = victim.wait_closed(WAIT)
        assert isinstance(exc, rabbitry.ConnectionForced)
        assert exc.reply_code == 320
        assert "fault test" in exc.reply_text
        assert bystander.is_open
        bystander.channel().queue_declare("", exclusive=True)  # still usable

        assert broker_node.close_connections("everyone out") >= 1
        exc = bystander.wait_closed(WAIT)
        assert isinstance(exc, rabbitry.ConnectionForced)
        assert "everyone out" in exc.reply_text
    finally:
        victim.close(timeout=WAIT)
        bystander.close(timeout=WAIT)


async def test_paused_node_ends_in_heartbeat_timeout(broker_node: BrokerNode) -> None:
    conn = AsyncConnection(
        broker_node.url, heartbeat=HEARTBEAT, connection_timeout=5, recovery=None
    )
    await conn.connect()
    try:
        assert conn.heartbeat == HEARTBEAT
        await conn.channel()
        broker_node.pause(max_seconds=WAIT + 5)
        try:
            assert broker_node.is_paused
            start = time.monotonic()
            exc = await conn.wait_closed(WAIT)
            elapsed = time.monotonic() - start
        finally:
            broker_node.resume()
        assert isinstance(exc, rabbitry.HeartbeatTimeout)
        # The one bound the product promises for a silent peer.
        assert elapsed <= HEARTBEAT_BOUND + SCHEDULING_MARGIN, f"detected after {elapsed:.2f} s"
    finally:
        await conn.close(timeout=WAIT)
    assert not broker_node.is_paused
    # Thawed, the node serves new connections again.
    async with AsyncConnection(broker_node.url, connection_timeout=WAIT) as again:
        ch = await again.channel()
        await ch.queue_declare("", exclusive=True)


async def test_kill9_is_noticed_and_durable_data_survives_restarts(
    fresh_node: BrokerNode,
) -> None:
    node = fresh_node
    url, name, base_dir = node.url, node.name, node.base_dir
    queue = unique("durable")
    persistent = Properties(delivery_mode=2)

    conn = AsyncConnection(url, connection_timeout=5, recovery=None)
    await conn.connect()
    try:
        ch = await conn.channel()
        await ch.confirm_select()
        await ch.queue_declare(queue, durable=True)
        confirm = await ch.basic_publish("", queue, b"before kill", properties=persistent)
        assert confirm is not None
        await asyncio.wait_for(confirm, WAIT)  # confirmed = on disk

        start = time.monotonic()
        await asyncio.to_thread(node.kill)
        exc = await conn.wait_closed(WAIT)
        elapsed = time.monotonic() - start
        assert isinstance(exc, rabbitry.ConnectionLost | rabbitry.HeartbeatTimeout)
        assert elapsed <= DEAD_SOCKET_BOUND + SCHEDULING_MARGIN, f"noticed after {elapsed:.2f} s"
    finally:
        await conn.close(timeout=WAIT)
    assert not node.is_running
    assert node.short_name not in epmd_names()
    assert processes_named(name) == ""

    # Crash recovery: same port, same data.
    await asyncio.to_thread(node.start)
    assert node.url == url
    async with AsyncConnection(url, connection_timeout=5) as conn:
        ch = await conn.channel()
        await ch.confirm_select()
        assert (await ch.queue_declare(queue, passive=True)).message_count == 1
        confirm = await ch.basic_publish("", queue, b"before restart", properties=persistent)
        assert confirm is not None
        await asyncio.wait_for(confirm, WAIT)

    # Graceful restart: the same again.
    await asyncio.to_thread(node.restart)
    async with AsyncConnection(url, connection_timeout=5) as conn:
        ch = await conn.channel()
        bodies = []
        while (message := await ch.basic_get(queue, no_ack=True)) is not None:
            bodies.append(message.body)
            assert message.properties.delivery_mode == 2
        assert bodies == [b"before kill", b"before restart"]

    # A full stop leaves nothing behind.
    await asyncio.to_thread(node.stop)
    assert node.short_name not in epmd_names()
    assert processes_named(name) == ""
    assert not base_dir.exists()


def test_the_watchdog_runs_before_the_broker_boots(broker_node: BrokerNode) -> None:
    # The VM runs -eval and -s in order and `rabbit:boot()` returns only once the node is
    # up: a watchdog after it would not halt a node whose boot waits (for a cluster
    # peer's tables, say) after its owner died.
    pid = broker_node.pid
    assert pid is not None
    args = Path(f"/proc/{pid}/cmdline").read_bytes().decode().split("\0")
    boots = [i for i in range(len(args)) if args[i : i + 3] == ["-s", "rabbit", "boot"]]
    watchdogs = [i for i, arg in enumerate(args) if arg == "-eval" and "/proc/" in args[i + 1]]
    assert len(boots) == 1, args
    assert len(watchdogs) == 1, args
    assert watchdogs[0] < boots[0], args
