"""AsyncChannelPool / ChannelPool against the scripted broker of ``fake_broker.py``."""

from __future__ import annotations

import asyncio
import threading
import time
from typing import TYPE_CHECKING, Any

import pytest
from fake_broker import FakeBroker

import rabbitry
from rabbitry.exceptions import ConfigurationError, InvalidStateError, PoolTimeout, Timeout
from rabbitry.pool import lending
from rabbitry.protocol import spec
from rabbitry.sync.pool import ChannelPool

if TYPE_CHECKING:
    from collections.abc import AsyncIterator, Iterator

pytestmark = pytest.mark.timeout(60)

WAIT = 5.0


@pytest.fixture
def broker() -> Iterator[FakeBroker]:
    with FakeBroker() as fake:
        yield fake


@pytest.fixture
async def conn(broker: FakeBroker) -> AsyncIterator[rabbitry.AsyncConnection]:
    connection = rabbitry.AsyncConnection(broker.url, heartbeat=0, connection_timeout=5)
    await connection.connect()
    try:
        yield connection
    finally:
        await connection.close(timeout=2)


async def wait_until(predicate: object, timeout: float = WAIT) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():  # type: ignore[operator]
        assert time.monotonic() < deadline, "condition not met in time"
        await asyncio.sleep(0.005)


async def test_invalid_size(conn: rabbitry.AsyncConnection) -> None:
    for size in (0, -1, True, 1.5):
        with pytest.raises(ConfigurationError):
            await conn.channel_pool(size)  # type: ignore[arg-type]


async def test_never_more_than_size_channels_and_timeout(
    broker: FakeBroker, conn: rabbitry.AsyncConnection
) -> None:
    pool = await conn.channel_pool(2, confirm=False)
    async with pool.acquire() as first, pool.acquire() as second:
        assert first is not second and pool.open_channels == 2 and pool.in_use == 2
        with pytest.raises(PoolTimeout) as caught:
            async with pool.acquire(timeout=0.05):
                pass
        assert isinstance(caught.value, Timeout)
        assert pool.waiting == 0
    assert pool.open_channels == 2 and pool.in_use == 0
    async with pool.acquire() as again:
        assert again in (first, second)  # reused, not a third channel
    assert len(broker.sent(spec.ChannelOpen)) == 2
    assert not broker.sent(spec.ConfirmSelect)
    await pool.close()


async def test_waiters_are_served_in_order(conn: rabbitry.AsyncConnection) -> None:
    pool = await conn.channel_pool(1)
    order: list[int] = []

    async def user(i: int) -> None:
        async with pool.acquire(timeout=WAIT):
            order.append(i)
            await asyncio.sleep(0.01)

    async with pool.acquire():
        tasks = []
        for i in range(5):
            tasks.append(asyncio.create_task(user(i)))
            await asyncio.sleep(0.005)  # queue them in a known order
        await wait_until(lambda: pool.waiting == 5)
    await asyncio.gather(*tasks)
    assert order == [0, 1, 2, 3, 4]
    assert pool.open_channels == 1


async def test_cancelled_waiter_does_not_block_the_queue(conn: rabbitry.AsyncConnection) -> None:
    pool = await conn.channel_pool(1)
    async with pool.acquire():
        with pytest.raises(PoolTimeout):
            async with pool.acquire(timeout=0.02):
                pass
    async with pool.acquire(timeout=WAIT) as channel:
        assert channel.is_open


async def test_a_channel_handed_to_a_waiter_cancelled_in_the_same_pass_goes_on(
    broker: FakeBroker, conn: rabbitry.AsyncConnection
) -> None:
    pool = await conn.channel_pool(1)
    take, give = lending(pool)
    channel = await take(WAIT)
    first = asyncio.create_task(take(WAIT))
    second = asyncio.create_task(take(WAIT))
    await wait_until(lambda: pool.waiting == 2)
    give(channel)  # handed to the first waiter...
    first.cancel()  # ...cancelled before it could take it
    with pytest.raises(asyncio.CancelledError):
        await first
    assert await asyncio.wait_for(second, WAIT) is channel
    assert pool.in_use == 1 and pool.waiting == 0
    # With nobody else waiting, it goes back to the idle channels.
    last = asyncio.create_task(take(WAIT))
    await wait_until(lambda: pool.waiting == 1)
    give(channel)
    last.cancel()
    with pytest.raises(asyncio.CancelledError):
        await last
    assert pool.in_use == 0 and pool.open_channels == 1
    assert await take(WAIT) is channel
    assert len(broker.sent(spec.ChannelOpen)) == 1
    await pool.close()


async def test_broken_channel_is_replaced(
    broker: FakeBroker, conn: rabbitry.AsyncConnection
) -> None:
    pool = await conn.channel_pool(1)
    async with pool.acquire() as channel:
        broker.close_channel(channel.channel_id, 406, "PRECONDITION_FAILED - test")
        await wait_until(lambda: channel.is_closed)
    assert pool.open_channels == 0
    async with pool.acquire(timeout=WAIT) as fresh:
        assert fresh is not channel and fresh.is_open and fresh.confirm_mode
    assert pool.open_channels == 1


async def test_broken_channel_hands_its_place_to_a_waiter(
    broker: FakeBroker, conn: rabbitry.AsyncConnection
) -> None:
    pool = await conn.channel_pool(1)
    got: list[rabbitry.AsyncChannel] = []

    async def waiter() -> None:
        async with pool.acquire(timeout=WAIT) as channel:
            got.append(channel)

    async with pool.acquire() as channel:
        task = asyncio.create_task(waiter())
        await wait_until(lambda: pool.waiting == 1)
        broker.close_channel(channel.channel_id)
        await wait_until(lambda: channel.is_closed)
    await asyncio.wait_for(task, WAIT)
    assert got and got[0] is not channel and pool.open_channels == 1


async def test_channel_comes_back_only_after_its_confirms(
    broker: FakeBroker, conn: rabbitry.AsyncConnection
) -> None:
    pool = await conn.channel_pool(1)
    async with pool.acquire() as channel:
        confirm = await channel.basic_publish("", "q", b"x")
        assert confirm is not None
    await asyncio.to_thread(broker.wait_published, 1)
    waiting = asyncio.create_task(pool._acquire(timeout=WAIT))
    await asyncio.sleep(0.05)
    assert not waiting.done() and pool.in_use == 0 and pool.open_channels == 1
    broker.ack(1)
    again = await asyncio.wait_for(waiting, WAIT)
    assert again is channel and confirm.done()
    pool._release(again)


async def test_close_fails_waiters_and_closes_idle(conn: rabbitry.AsyncConnection) -> None:
    async with await conn.channel_pool(1) as pool:
        async with pool.acquire() as lent:
            task = asyncio.create_task(pool._acquire(timeout=WAIT))
            await wait_until(lambda: pool.waiting == 1)
            await pool.close()
            with pytest.raises(InvalidStateError):
                await task
        await wait_until(lambda: lent.is_closed)  # closed when it came back
        assert pool.is_closed and pool.open_channels == 0
        with pytest.raises(InvalidStateError):
            async with pool.acquire():
                pass
    assert "size=1" in repr(pool)


def test_sync_pool_threads(broker: FakeBroker) -> None:
    broker.auto_ack = True
    with rabbitry.Connection(broker.url, heartbeat=0) as connection:
        pool = connection.channel_pool(size=2)
        assert isinstance(pool, ChannelPool)
        peak = 0
        errors: list[BaseException] = []
        lock = threading.Lock()

        def work() -> None:
            nonlocal peak
            try:
                for _ in range(20):
                    with pool.acquire(timeout=WAIT) as channel:
                        with lock:
                            peak = max(peak, pool.in_use)
                        future = channel.basic_publish("", "q", b"x")
                        assert future is not None
                        future.result(WAIT)
            except BaseException as exc:  # reported below
                errors.append(exc)

        threads = [threading.Thread(target=work) for _ in range(6)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(WAIT * 4)
        assert errors == []
        assert peak <= 2 and pool.open_channels <= 2
        assert len(broker.published) == 120
        assert {p.channel for p in broker.published} <= {1, 2}
        with pytest.raises(PoolTimeout):
            with pool.acquire(), pool.acquire(), pool.acquire(timeout=0.05):
                pass
        with pool:
            assert pool.size == 2 and pool.confirm
        assert pool.is_closed


async def test_acquire_timeout_during_confirm_select_closes_the_channel(
    broker: FakeBroker, conn: rabbitry.AsyncConnection
) -> None:
    broker.hold_confirm_select = True
    pool = await conn.channel_pool(1, confirm=True)
    with pytest.raises(PoolTimeout):
        async with pool.acquire(timeout=0.3):
            pass
    # The pool forgot the channel, so it must close it: otherwise its size bound is a lie.
    assert pool.open_channels == 0
    await wait_until(lambda: not [h for h in conn._channels.values() if h.channel.is_open])


async def test_a_cancelled_confirm_wait_leaves_the_loop_idle_until_the_ack(
    broker: FakeBroker, conn: rabbitry.AsyncConnection
) -> None:
    pool = await conn.channel_pool(1, confirm=True)
    scans = 0

    class CountingDict(dict):  # type: ignore[type-arg]
        def values(self) -> Any:
            nonlocal scans
            scans += 1
            return super().values()

    async with pool.acquire(timeout=WAIT) as channel:
        tracker = channel._confirms
        tracker._pending = CountingDict(tracker._pending)
        confirm = await channel.basic_publish("", "q", b"x")
        assert confirm is not None
        with pytest.raises(TimeoutError):
            await asyncio.wait_for(confirm, 0.01)  # cancels the future on timeout
    # The released channel waits for its outstanding confirm. Nothing arrives meanwhile,
    # so nothing may rescan the confirm table: a busy loop would, on every iteration.
    before = scans
    for _ in range(200):
        await asyncio.sleep(0)
    await asyncio.sleep(0.05)
    assert scans == before, f"the confirm table was scanned {scans - before} times while idle"
    broker.ack(1)
    async with pool.acquire(timeout=WAIT) as again:
        assert again is channel  # settled by the ack and handed out again
