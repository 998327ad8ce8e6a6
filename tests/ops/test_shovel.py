"""The shovel (rabbitry.shovel and ``rabbitry shovel``) on the management-enabled node.

Loss is checked Jepsen-style: every source message carries a unique ``message_id``;
after the run the destination is drained and ``lost`` = ids sent minus ids received
must be empty; duplicates (received - unique) are reported and must not exceed what
the shovel itself counted as possible duplicates.
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest

import rabbitry
from rabbitry.protocol.spec import BasicProperties
from rabbitry.shovel import AsyncShovel, Shovel

if TYPE_CHECKING:
    from tests.support.node import BrokerNode

    from rabbitry.management import AsyncManagementClient, ManagementClient

_ROOT = Path(__file__).resolve().parents[2]
N = 10_000


async def _fill(url: str, queue: str, n: int, **properties: Any) -> None:
    conn = rabbitry.AsyncConnection(url)
    await conn.connect()
    try:
        channel = await conn.channel()
        await channel.queue_declare(queue, durable=False)
        async with await conn.publisher(max_in_flight=2000) as publisher:
            for i in range(n):
                props = BasicProperties(message_id=str(i), **properties)
                await publisher.send(b"body-%d" % i, routing_key=queue, properties=props)
            await publisher.wait_for_confirms(timeout=60)
    finally:
        await conn.close()


async def _drain(url: str, queue: str) -> list[str]:
    """Every message id in ``queue``, in order (taking them out)."""
    conn = rabbitry.AsyncConnection(url)
    await conn.connect()
    ids: list[str] = []
    try:
        channel = await conn.channel()
        depth = (await channel.queue_declare(queue, passive=True)).message_count
        if depth:
            async for message in channel.consume(queue, no_ack=True, timeout=2.0):
                ids.append(str(message.properties.message_id))
                if len(ids) >= depth:
                    break
        await channel.queue_delete(queue)
    finally:
        await conn.close()
    return ids


async def _depth(url: str, queue: str) -> int:
    conn = rabbitry.AsyncConnection(url)
    await conn.connect()
    try:
        channel = await conn.channel()
        return (await channel.queue_declare(queue, passive=True)).message_count
    finally:
        await conn.close()


async def _close_named(api: AsyncManagementClient, prefix: str) -> list[str]:
    """Force-close (through the management API) the connections whose client-given
    name starts with ``prefix``; returns those names."""
    closed = []
    for entry in await api.connections():
        name = (entry.get("client_properties") or {}).get("connection_name") or ""
        if name.startswith(prefix):
            await api.close_connection(entry["name"], reason="ops test: forced close")
            closed.append(name)
    return closed


def _check(ids: list[str], n: int, possible_duplicates: int) -> dict[str, int]:
    unique = set(ids)
    lost = {str(i) for i in range(n)} - unique
    duplicates = len(ids) - len(unique)
    assert not lost, f"lost {len(lost)} messages, e.g. {sorted(lost)[:5]}"
    assert unique <= {str(i) for i in range(n)}  # nothing unexpected
    assert duplicates <= possible_duplicates
    return {"lost": len(lost), "duplicates": duplicates}


async def _shovel_with_forced_close(
    shovel: AsyncShovel, api: AsyncManagementClient, prefix: str, at: int, expect: int
) -> tuple[Any, int, list[str]]:
    """Run ``shovel`` and force-close its connections (names starting with ``prefix``)
    through the management API once ``at`` messages moved.

    The API lists a new connection only after its next statistics round, so until the
    close has landed the test's progress callback holds the shovel to about 1000
    messages/s (it sleeps 1 ms per message on the loop); it runs at full speed after.
    """
    closed_event = False

    def throttle(stats: Any) -> None:
        if not closed_event:
            time.sleep(0.001)

    shovel.on_progress = throttle
    task = asyncio.create_task(shovel.run())
    deadline = time.monotonic() + 60
    while shovel.stats.moved < at:
        assert not task.done(), task
        assert time.monotonic() < deadline
        await asyncio.sleep(0.005)
    closed: list[str] = []
    while len(closed) < expect:
        assert not task.done(), "finished before the API listed its connections"
        assert time.monotonic() < deadline
        closed += await _close_named(api, prefix)
        if len(closed) < expect:
            await asyncio.sleep(0.05)
    moved_at_close = shovel.stats.moved
    closed_event = True
    stats = await asyncio.wait_for(task, 90)
    return stats, moved_at_close, closed


@pytest.mark.timeout(120)
async def test_shovel_moves_10k_between_queues_across_a_forced_close_of_the_source(
    aapi: AsyncManagementClient, mgmt_node: BrokerNode, uid: str
) -> None:
    url = mgmt_node.url
    source, target = f"{uid}.from", f"{uid}.to"
    await _fill(url, source, N)
    await _fill(url, target, 0)
    shovel = AsyncShovel(url, source, url, "", target, connection_name=uid)
    stats, at_close, closed = await _shovel_with_forced_close(
        shovel, aapi, f"{uid}-source", 1000, 1
    )
    assert closed == [f"{uid}-source"]
    assert at_close < N  # the close landed in the middle
    assert stats.moved == N and stats.target == N and stats.in_flight == 0
    assert stats.redelivered > 0  # the broker gave back what was unacknowledged
    assert await _depth(url, source) == 0
    result = _check(await _drain(url, target), N, stats.possible_duplicates)
    print(f"source closed at {at_close}: {stats.as_dict()} {result}")
    await _drain(url, source)


@pytest.mark.timeout(120)
async def test_shovel_moves_10k_between_vhosts_across_a_forced_close_of_the_destination(
    aapi: AsyncManagementClient, mgmt_node: BrokerNode, uid: str
) -> None:
    await aapi.create_vhost(uid)
    await aapi.set_permissions(uid, "guest")
    try:
        src_url = mgmt_node.url
        dst_url = f"{mgmt_node.url.rstrip('/')}/{uid}"
        source, target = f"{uid}.from", "moved"
        await _fill(src_url, source, N)
        await _fill(dst_url, target, 0)
        shovel = AsyncShovel(src_url, source, dst_url, "", target, connection_name=uid)
        stats, at_close, closed = await _shovel_with_forced_close(
            shovel, aapi, f"{uid}-destination", 1000, 1
        )
        assert closed == [f"{uid}-destination"]
        assert at_close < N
        assert stats.moved == N and stats.in_flight == 0
        assert await _depth(src_url, source) == 0
        result = _check(await _drain(dst_url, target), N, stats.possible_duplicates)
        print(f"destination closed at {at_close}: {stats.as_dict()} {result}")
        await _drain(src_url, source)
    finally:
        await aapi.delete_vhost(uid)


def test_sync_shovel_stop_and_resume_loses_nothing(mgmt_node: BrokerNode, uid: str) -> None:
    url = mgmt_node.url
    source, target = f"{uid}.from", f"{uid}.to"
    asyncio.run(_fill(url, source, 3000))
    asyncio.run(_fill(url, target, 0))
    first = Shovel(url, source, url, "", target, window=50)
    seen: list[int] = []

    def stop_early(stats: Any) -> None:
        seen.append(stats.moved)
        if stats.moved == 500:
            first.stop()

    first._async.on_progress = stop_early
    stats1 = first.run()
    assert 500 <= stats1.moved < 3000
    assert stats1.in_flight == 0
    stats2 = Shovel(url, source, url, "", target).run()
    assert stats2.target == 3000 - stats1.moved
    assert stats1.moved + stats2.moved == 3000
    ids = asyncio.run(_drain(url, target))
    assert ids == [str(i) for i in range(3000)]  # no loss, no duplicate, order kept
    asyncio.run(_drain(url, source))


# --------------------------------------------------------------------------- the CLI


def _cli(*args: str, timeout: float = 60) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "rabbitry", *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        env=os.environ.copy(),
        cwd=_ROOT,
    )


def test_cli_shovel_with_filter_and_count_leaves_the_rest_in_order(
    mgmt_node: BrokerNode, uid: str
) -> None:
    url = mgmt_node.url
    source, target = f"{uid}.from", f"{uid}.to"

    async def fill() -> None:
        conn = rabbitry.AsyncConnection(url)
        await conn.connect()
        channel = await conn.channel()
        await channel.queue_declare(source, durable=False)
        await channel.queue_declare(target, durable=False)
        async with await conn.publisher() as publisher:
            for i in range(20):
                kind = "a" if i % 2 == 0 else "b"
                props = BasicProperties(message_id=str(i), type=kind)
                await publisher.send(b"x", routing_key=source, properties=props)
        await conn.close()

    asyncio.run(fill())
    done = _cli(
        "--url", url, "--json", "shovel", "--from", source,
        "--to", f"amqp://guest:guest@127.0.0.1:{mgmt_node.port}/%2F//{target}",
        "--filter", "type=a", "--count", "5",
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    result = json.loads(done.stdout)
    assert result["moved"] == 5 and result["queue"] == source and result["exchange"] == ""
    assert "guest:guest" not in done.stdout
    assert asyncio.run(_drain(url, target)) == ["0", "2", "4", "6", "8"]
    left = asyncio.run(_drain(url, source))
    assert left == [str(i) for i in range(20) if i % 2 == 1 or i >= 10]  # order kept


def test_cli_shovel_unroutable_exits_1_and_keeps_the_message(
    mgmt_node: BrokerNode, uid: str
) -> None:
    url = mgmt_node.url
    source = f"{uid}.from"
    asyncio.run(_fill(url, source, 3))
    done = _cli("--url", url, "shovel", "--from", source, "--to", "amq.direct/nowhere")
    assert done.returncode == 1, (done.stdout, done.stderr)
    assert "Unroutable" in done.stderr
    assert asyncio.run(_drain(url, source)) == ["0", "1", "2"]


@pytest.mark.timeout(120)
def test_cli_shovel_killed_mid_run_then_rerun_loses_nothing(
    mgmt_node: BrokerNode, uid: str
) -> None:
    """SIGKILL at an arbitrary point (no cleanup at all), then run again: lost = 0."""
    url = mgmt_node.url
    source, target = f"{uid}.from", f"{uid}.to"
    asyncio.run(_fill(url, source, N))
    asyncio.run(_fill(url, target, 0))
    args = [sys.executable, "-m", "rabbitry", "--url", url, "--json", "shovel",
            "--from", source, "--to", f"/{target}"]  # fmt: skip
    process = subprocess.Popen(args, env=os.environ.copy(), cwd=_ROOT, stdout=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + 60
        while asyncio.run(_depth(url, target)) < 1000:
            assert process.poll() is None, "finished before it could be killed"
            assert time.monotonic() < deadline
            time.sleep(0.01)
    finally:
        process.send_signal(signal.SIGKILL)
        process.wait(10)
    at_kill = asyncio.run(_depth(url, target))
    assert at_kill < N
    done = _cli("--url", url, "--json", "shovel", "--from", source, "--to", f"/{target}")
    assert done.returncode == 0, done.stderr
    rerun = json.loads(done.stdout)
    ids = asyncio.run(_drain(url, target))
    unique = set(ids)
    assert unique == {str(i) for i in range(N)}  # lost = 0
    duplicates = len(ids) - len(unique)
    # The killed run's confirmed-but-unacknowledged copies are the only duplicates.
    assert duplicates <= 500
    print(f"killed at {at_kill} in the target; rerun {rerun}; duplicates {duplicates}")
    asyncio.run(_drain(url, source))


def test_shovel_of_an_empty_queue_and_its_repr(
    api: ManagementClient, mgmt_node: BrokerNode, uid: str
) -> None:
    url = mgmt_node.url
    source = f"{uid}.from"
    asyncio.run(_fill(url, source, 0))
    shovel = Shovel(url, source, url, "amq.fanout", idle_timeout=0.5, connection_name=uid)
    assert repr(shovel).startswith("<Shovel amqp://guest:***@")
    assert shovel.run().moved == 0
    asyncio.run(_drain(url, source))


def test_an_exception_in_on_progress_stops_the_run_and_loses_nothing(
    mgmt_node: BrokerNode, uid: str
) -> None:
    url = mgmt_node.url
    source, target = f"{uid}.from", f"{uid}.to"
    asyncio.run(_fill(url, source, 500))
    asyncio.run(_fill(url, target, 0))

    def explode(stats: Any) -> None:
        if stats.moved == 10:
            raise RuntimeError("progress display broke")

    with pytest.raises(RuntimeError, match="progress display broke"):
        Shovel(url, source, url, "", target, on_progress=explode).run()
    moved = asyncio.run(_drain(url, target))
    left = asyncio.run(_drain(url, source))
    # Copies already in flight were still settled (confirmed ones acknowledged, the
    # rest given back): every message is at one place or both, none is lost.
    assert len(moved) >= 10
    assert sorted(set(moved) | set(left), key=int) == [str(i) for i in range(500)]
