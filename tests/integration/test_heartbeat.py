"""Heartbeats and dead peers, with a fault-injecting TCP proxy in front of the broker."""

from __future__ import annotations

import asyncio
import time
from typing import TYPE_CHECKING

import pytest
from tests.support.proxy import TcpProxy

import rabbitry
from rabbitry import AsyncConnection
from rabbitry.config import parse_urls

if TYPE_CHECKING:
    from collections.abc import AsyncIterator, Iterator

    from tests.integration.conftest import Names

pytestmark = pytest.mark.timeout(30)

#: Deadline for waiting on the end of a connection (a hang fails, never a timing bound).
WAIT = 10.0
HEARTBEAT = 1
#: What rabbitry promises: a silent peer is detected within 2 × heartbeat + 1 s.
DETECTION_BOUND = 2 * HEARTBEAT + 1
#: Allowance for event-loop and thread scheduling on a busy CI machine.
SCHEDULING_MARGIN = 0.5


@pytest.fixture
def proxy(url: str) -> Iterator[TcpProxy]:
    params = parse_urls(url)[0]
    with TcpProxy(params.host, params.port) as running:
        yield running


def proxied_url(proxy: TcpProxy, url: str) -> str:
    params = parse_urls(url)[0]
    return proxy.url(user=params.username, password=params.password)


@pytest.fixture
async def hb_conn(proxy: TcpProxy, url: str) -> AsyncIterator[AsyncConnection]:
    """A connection through the proxy with a 1-second heartbeat."""
    conn = AsyncConnection(
        proxied_url(proxy, url), heartbeat=HEARTBEAT, connection_timeout=5, recovery=None
    )
    await conn.connect()
    assert conn.heartbeat == HEARTBEAT
    try:
        yield conn
    finally:
        await conn.close(timeout=2)


async def test_blackhole_ends_in_heartbeat_timeout(
    proxy: TcpProxy, hb_conn: AsyncConnection, names: Names
) -> None:
    ch = await hb_conn.channel()
    await ch.confirm_select()
    queue = names.queue()
    await ch.queue_declare(queue)
    ended: list[rabbitry.AMQPError] = []
    hb_conn.add_close_callback(ended.append)

    proxy.blackhole()
    start = time.monotonic()
    # Work in flight when the network dies must fail with the same reason.
    pending_rpc = asyncio.ensure_future(ch.queue_declare(queue, passive=True))
    pending_confirm = await ch.basic_publish("", queue, b"into the void")
    assert pending_confirm is not None
    async with asyncio.timeout(WAIT):
        exc = await hb_conn.wait_closed()
    elapsed = time.monotonic() - start

    assert isinstance(exc, rabbitry.HeartbeatTimeout)
    # The one timing assertion of this suite: the bound the product promises.
    assert elapsed <= DETECTION_BOUND + SCHEDULING_MARGIN, f"detected after {elapsed:.2f} s"
    assert hb_conn.is_closed
    assert not hb_conn.is_open
    assert hb_conn.close_exc is exc
    assert ended == [exc]
    assert ch.is_closed
    assert isinstance(ch.close_exc, rabbitry.HeartbeatTimeout)
    with pytest.raises(rabbitry.HeartbeatTimeout):
        await pending_rpc
    with pytest.raises(rabbitry.PublishOutcomeUnknown) as info:
        await pending_confirm
    assert isinstance(info.value.__cause__, rabbitry.HeartbeatTimeout)
    with pytest.raises(rabbitry.InvalidStateError):
        await hb_conn.channel()
    # close() after the fact returns at once instead of waiting for a close-ok.
    async with asyncio.timeout(2):
        await hb_conn.close()


async def test_idle_connection_stays_open(
    proxy: TcpProxy, hb_conn: AsyncConnection, names: Names
) -> None:
    ch = await hb_conn.channel()
    up, down = proxy.bytes_upstream, proxy.bytes_downstream
    # Idle for more than three heartbeat intervals, so that both sides would have given
    # up on each other if heartbeats were not flowing.
    await asyncio.sleep(3.5 * HEARTBEAT)
    assert hb_conn.is_open
    assert hb_conn.close_exc is None
    assert ch.is_open
    # Heartbeat frames (8 bytes) went both ways meanwhile (the next one, at the latest).
    deadline = time.monotonic() + 2 * HEARTBEAT + 1
    while proxy.bytes_upstream - up < 8 or proxy.bytes_downstream - down < 8:
        assert time.monotonic() < deadline, "no heartbeat frames"
        await asyncio.sleep(0.05)
    queue = names.queue()
    assert (await ch.queue_declare(queue)).queue == queue


async def test_reset_ends_in_connection_lost(proxy: TcpProxy, url: str, names: Names) -> None:
    # A long heartbeat: only the reset itself can end the connection within WAIT.
    conn = AsyncConnection(
        proxied_url(proxy, url), heartbeat=60, connection_timeout=5, recovery=None
    )
    await conn.connect()
    try:
        ch = await conn.channel()
        queue = names.queue()
        await ch.queue_declare(queue)
        consumer = ch.consume(queue)
        next_message = asyncio.ensure_future(anext(consumer))
        await asyncio.sleep(0.1)  # the consumer is registered

        assert proxy.reset() == 1
        async with asyncio.timeout(WAIT):
            exc = await conn.wait_closed()
        assert isinstance(exc, rabbitry.ConnectionLost)
        assert conn.close_exc is exc
        assert ch.is_closed
        assert isinstance(ch.close_exc, rabbitry.ConnectionLost)
        # A consumer waiting for messages hears about it too.
        with pytest.raises(rabbitry.ConnectionLost):
            async with asyncio.timeout(WAIT):
                await next_message
        await consumer.aclose()
    finally:
        async with asyncio.timeout(WAIT):
            await conn.close()
