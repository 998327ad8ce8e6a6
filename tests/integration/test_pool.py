"""ChannelPool against the real broker: many users, few channels, broken channels."""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import threading
from typing import TYPE_CHECKING

import pytest

import rabbitry
from rabbitry.exceptions import NotFound, PoolTimeout

if TYPE_CHECKING:
    from tests.integration.conftest import Names

pytestmark = pytest.mark.timeout(180)

USERS = 16
SIZE = 4
TOTAL = 40_000
CHUNK = 100  # messages published per borrow


async def test_16_tasks_share_4_channels_for_40k_messages(
    conn: rabbitry.AsyncConnection, channel: rabbitry.AsyncChannel, names: Names
) -> None:
    queue = names.queue()
    await channel.queue_declare(queue)
    baseline = len(conn._channels)  # the fixture's own channel
    pool = await conn.channel_pool(size=SIZE)
    peak = {"pool": 0, "connection": 0}
    confirms: list[asyncio.Future[None]] = []

    def sample() -> None:
        peak["pool"] = max(peak["pool"], pool.open_channels)
        peak["connection"] = max(peak["connection"], len(conn._channels) - baseline)

    async def user(n: int) -> None:
        for start in range(0, TOTAL // USERS, CHUNK):
            async with pool.acquire(timeout=30) as pooled:
                sample()
                for i in range(CHUNK):
                    future = await pooled.basic_publish("", queue, b"%d-%d" % (n, start + i))
                    assert future is not None
                    confirms.append(future)
                sample()

    await asyncio.gather(*(user(n) for n in range(USERS)))
    await asyncio.wait(confirms, timeout=60)
    assert len(confirms) == TOTAL
    assert [f for f in confirms if not f.done() or f.exception() is not None] == []
    assert peak["pool"] <= SIZE and peak["connection"] <= SIZE
    assert peak["pool"] == SIZE  # the users really competed for the channels
    assert (await channel.queue_declare(queue, passive=True)).message_count == TOTAL
    await pool.close()


def test_16_threads_share_4_channels_for_40k_messages(url: str, names: Names) -> None:
    queue = names.queue()
    with rabbitry.Connection(url) as connection:
        control = connection.channel()
        control.queue_declare(queue)
        pool = connection.channel_pool(size=SIZE)
        errors: list[BaseException] = []
        confirms: list[concurrent.futures.Future[None]] = []
        lock = threading.Lock()
        peak = 0

        def user(n: int) -> None:
            nonlocal peak
            try:
                for start in range(0, TOTAL // USERS, CHUNK):
                    with pool.acquire(timeout=30) as pooled:
                        with lock:
                            # the control channel is the one extra on the connection
                            opened = len(connection._async._channels) - 1
                            peak = max(peak, pool.open_channels, opened)
                        batch = []
                        for i in range(CHUNK):
                            future = pooled.basic_publish("", queue, b"%d-%d" % (n, start + i))
                            assert future is not None
                            batch.append(future)
                    with lock:
                        confirms.extend(batch)
            except BaseException as exc:  # reported below
                errors.append(exc)

        threads = [threading.Thread(target=user, args=(n,)) for n in range(USERS)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(120)
        assert errors == []
        done, _ = concurrent.futures.wait(confirms, timeout=60)
        assert len(done) == TOTAL
        assert [f for f in confirms if f.exception() is not None] == []
        assert peak <= SIZE
        assert control.queue_declare(queue, passive=True).message_count == TOTAL
        pool.close()


async def test_channel_broken_by_a_broker_error_is_replaced(
    conn: rabbitry.AsyncConnection, names: Names
) -> None:
    pool = await conn.channel_pool(size=1)
    async with pool.acquire() as pooled:
        with pytest.raises(NotFound):
            await pooled.queue_declare(names.queue("missing"), passive=True)
        assert pooled.is_closed
    async with pool.acquire(timeout=10) as fresh:
        assert fresh is not pooled and fresh.is_open
        queue = names.queue()
        await fresh.queue_declare(queue)
        confirm = await fresh.basic_publish("", queue, b"x")
        assert confirm is not None
        await asyncio.wait_for(confirm, 10)
    assert pool.open_channels == 1
    async with pool.acquire() as first:
        with pytest.raises(PoolTimeout):
            async with pool.acquire(timeout=0.1):
                pass
        assert first.is_open
    await pool.close()


def test_sync_channel_broken_by_a_broker_error_is_replaced(url: str, names: Names) -> None:
    with rabbitry.Connection(url) as connection, connection.channel_pool(size=1) as pool:
        with pool.acquire() as pooled:
            with pytest.raises(NotFound):
                pooled.queue_declare(names.queue("missing"), passive=True)
        with pool.acquire(timeout=10) as fresh:
            assert fresh.is_open and fresh._async is not pooled._async
            queue = names.queue()
            fresh.queue_declare(queue)
            confirm = fresh.basic_publish("", queue, b"x")
            assert confirm is not None
            confirm.result(10)
        assert pool.open_channels == 1


async def test_returned_channel_whose_confirms_never_come_is_closed_at_the_deadline(
    url: str, names: Names
) -> None:
    from tests.support.proxy import TcpProxy

    from rabbitry.config import parse_urls

    queue = names.queue()
    params = parse_urls(url)[0]
    proxy = TcpProxy(params.host, params.port).start()
    conn = rabbitry.AsyncConnection(proxy.url(), connection_timeout=5)
    await conn.connect()
    try:
        ch = await conn.channel()
        await ch.queue_declare(queue)
        pool = await conn.channel_pool(size=1, confirm_timeout=0.2)
        assert pool.confirm_timeout == 0.2
        async with pool.acquire(timeout=10) as channel:
            proxy.drop("downstream")  # the broker's confirms never reach the client
            future = await channel.basic_publish("", queue, b"x")
            assert future is not None
        # Returned with an unconfirmed publish: failed as unknown at the deadline, not a
        # hang; the pool gives the place back.
        error = await asyncio.wait_for(asyncio.gather(future, return_exceptions=True), 30)
        assert isinstance(error[0], rabbitry.PublishOutcomeUnknown)
        assert isinstance(error[0].__cause__, rabbitry.Timeout)
        assert "confirm_timeout" in str(error[0].__cause__)
        while pool.open_channels:
            await asyncio.sleep(0.01)
        assert channel._proto.state is not rabbitry.protocol.ChannelState.OPEN
    finally:
        proxy.stop()
        with contextlib.suppress(rabbitry.AMQPError, OSError):
            await conn.close(timeout=1)


def test_pool_refuses_a_confirm_timeout_that_is_not_positive(url: str) -> None:
    with rabbitry.Connection(url) as conn:
        for bad in (0, -1, "5", True):
            with pytest.raises(rabbitry.ConfigurationError, match="confirm_timeout"):
                conn.channel_pool(confirm_timeout=bad)  # type: ignore[arg-type]
        assert conn.channel_pool(confirm_timeout=None).confirm_timeout is None
