"""The publishing interface (``rabbitry.publishing``): a connection's WritePath and a
channel's PublishPipe, driven through their public members.

WritePath alone on an event loop; PublishPipe on a real AsyncConnection against the
scripted broker (``fake_broker.py``), which confirms only when a test says so.
"""

from __future__ import annotations

import asyncio
from typing import TYPE_CHECKING, Any

import pytest
from fake_broker import FakeBroker

import rabbitry
from rabbitry.aio.channel import pipe_of
from rabbitry.aio.connection import writes_of
from rabbitry.exceptions import (
    ConnectionLost,
    InvalidStateError,
    Nacked,
    PublishOutcomeUnknown,
    PublishRefused,
)
from rabbitry.publishing import PublishPipe, WritePath

if TYPE_CHECKING:
    from collections.abc import AsyncIterator, Iterator

pytestmark = pytest.mark.timeout(60)

#: Upper bound for something that should happen soon (never a timing assertion).
WAIT = 5.0


async def _yield_to_loop(passes: int = 5) -> None:
    """Let every ready callback run, a few loop passes over."""
    for _ in range(passes):
        await asyncio.sleep(0)


def _write_path() -> tuple[WritePath, list[str]]:
    calls: list[str] = []

    async def await_recovery(timeout: float | None, what: str) -> None:
        calls.append(f"recovery {what}")

    path = WritePath(lambda: calls.append("kick"), lambda: calls.append("flush"), await_recovery)
    return path, calls


# --------------------------------------------------------------------------- WritePath


async def test_write_path_forwards_kick_flush_and_await_recovery() -> None:
    path, calls = _write_path()
    path.kick()
    path.flush()
    await path.await_recovery(1.0, "basic.publish")
    assert calls == ["kick", "flush", "recovery basic.publish"]
    assert path.paused is False


async def test_wait_writable_returns_at_once_when_writes_are_not_paused() -> None:
    path, _ = _write_path()
    await asyncio.wait_for(path.wait_writable(), WAIT)


async def test_wait_writable_waits_until_resume_and_resume_wakes_every_waiter() -> None:
    path, _ = _write_path()
    path.paused = True
    waiters = [asyncio.create_task(path.wait_writable()) for _ in range(3)]
    await _yield_to_loop()
    assert not any(w.done() for w in waiters)
    path.resume()
    assert path.paused is False
    done, pending = await asyncio.wait(waiters, timeout=WAIT)
    assert not pending
    assert all(w.result() is None for w in done)


async def test_wait_writable_keeps_waiting_when_paused_again_before_it_runs() -> None:
    path, _ = _write_path()
    path.paused = True
    waiter = asyncio.create_task(path.wait_writable())
    await _yield_to_loop()
    path.resume()
    path.paused = True  # the buffer filled up again before the waiter ran
    await _yield_to_loop()
    assert not waiter.done()
    path.resume()
    await asyncio.wait_for(waiter, WAIT)


async def test_a_cancelled_wait_is_skipped_by_resume() -> None:
    path, _ = _write_path()
    path.paused = True
    cancelled = asyncio.create_task(path.wait_writable())
    kept = asyncio.create_task(path.wait_writable())
    await _yield_to_loop()
    cancelled.cancel()
    with pytest.raises(asyncio.CancelledError):
        await cancelled
    path.resume()
    await asyncio.wait_for(kept, WAIT)


async def test_defer_keeps_a_hook_only_while_paused_and_runs_it_once() -> None:
    path, _ = _write_path()
    calls: list[str] = []
    assert path.defer(lambda: calls.append("not kept")) is False
    path.resume()
    assert calls == []
    path.paused = True
    assert path.defer(lambda: calls.append("first")) is True
    assert path.defer(lambda: calls.append("second")) is True
    assert calls == []
    path.resume()
    assert calls == ["first", "second"]
    path.resume()
    assert calls == ["first", "second"]


# --------------------------------------------------------------------------- PublishPipe


class _Record:
    """A Settleable that stands for a message, as the publisher's records do."""

    def __init__(self, *, resend: bool = False) -> None:
        self.resend_on_recovery = resend
        self.outcome: BaseException | str | None = "unsettled"

    def done(self) -> bool:
        return self.outcome != "unsettled"

    def set_result(self, result: None, /) -> None:
        self.outcome = result

    def set_exception(self, exception: BaseException, /) -> None:
        self.outcome = exception


@pytest.fixture
def broker() -> Iterator[FakeBroker]:
    with FakeBroker() as fake:
        yield fake


@pytest.fixture
async def conn(broker: FakeBroker) -> AsyncIterator[rabbitry.AsyncConnection]:
    connection = rabbitry.AsyncConnection(
        broker.url, heartbeat=0, connection_timeout=5, recovery=None
    )
    await connection.connect()
    try:
        yield connection
    finally:
        await connection.close(timeout=2)


def _frames(pipe: PublishPipe, body: bytes = b"x", exchange: str = "") -> list[bytes]:
    return pipe.protocol.encode_publish(exchange, "q", body, None, False)


async def _settle(future: asyncio.Future[Any]) -> BaseException | None:
    await asyncio.wait({future}, timeout=WAIT)
    assert future.done(), "no outcome in time"
    return future.exception()


async def test_the_pipe_shares_the_connection_write_path(
    conn: rabbitry.AsyncConnection,
) -> None:
    channel = await conn.channel()
    pipe = pipe_of(channel)
    assert pipe.writes is writes_of(conn)
    assert pipe.kick == pipe.writes.kick and pipe.flush == pipe.writes.flush
    assert pipe.protocol.channel_id == channel.channel_id


async def test_publish_without_confirms_resolves_the_waiter_once_queued(
    broker: FakeBroker, conn: rabbitry.AsyncConnection
) -> None:
    pipe = pipe_of(await conn.channel())
    waiter = asyncio.get_running_loop().create_future()
    pipe.publish(_frames(pipe, b"one"), waiter)
    pipe.publish(_frames(pipe, b"two"), None)
    assert waiter.done() and waiter.result() is None
    got = await asyncio.to_thread(broker.wait_published, 2)
    assert [p.body for p in got] == [b"one", b"two"]
    assert not pipe.confirms


async def test_publish_in_confirm_mode_is_settled_by_the_broker(
    broker: FakeBroker, conn: rabbitry.AsyncConnection
) -> None:
    channel = await conn.channel()
    await channel.confirm_select()
    pipe = pipe_of(channel)
    loop = asyncio.get_running_loop()
    acked, nacked = loop.create_future(), loop.create_future()
    pipe.publish(_frames(pipe), acked)
    pipe.publish(_frames(pipe), nacked)
    assert [seq for seq, _ in pipe.confirms] == [1, 2]
    assert pipe.unsettled() == [acked, nacked]
    await asyncio.to_thread(broker.wait_published, 2)
    broker.ack(1, channel=channel.channel_id)
    broker.nack(2, channel=channel.channel_id)
    assert await _settle(acked) is None
    assert isinstance(await _settle(nacked), Nacked)
    assert not pipe.confirms and pipe.unsettled() == []


async def test_publish_after_the_channel_closed_fails_the_waiter_and_sends_nothing(
    broker: FakeBroker, conn: rabbitry.AsyncConnection
) -> None:
    channel = await conn.channel()
    await channel.confirm_select()
    pipe = pipe_of(channel)
    frames = _frames(pipe)
    await channel.close()
    waiter = asyncio.get_running_loop().create_future()
    pipe.publish(frames, waiter)  # never raises into the loop
    error = await _settle(waiter)
    assert isinstance(error, InvalidStateError)
    assert "closed" in str(error)
    pipe.publish(frames, None)  # no waiter: dropped the same way
    assert not pipe.confirms
    assert broker.published == []


async def test_kick_writes_what_is_queued_while_writes_are_paused(
    broker: FakeBroker, conn: rabbitry.AsyncConnection
) -> None:
    channel = await conn.channel()
    pipe = pipe_of(channel)
    transport = conn._transport
    assert transport is not None
    transport.get_protocol().pause_writing()  # as asyncio does above the high-water mark
    assert pipe.writes.paused
    # The pause only holds back publishers that wait for it: queued frames still go out.
    pipe.publish(_frames(pipe, b"queued"), None)
    got = await asyncio.to_thread(broker.wait_published, 1)
    assert got[0].body == b"queued"
    held = asyncio.create_task(channel.basic_publish("", "q", b"held"))
    await _yield_to_loop()
    assert not held.done()
    assert len(broker.published) == 1
    transport.get_protocol().resume_writing()
    assert not pipe.writes.paused
    assert await asyncio.wait_for(held, WAIT) is None
    got = await asyncio.to_thread(broker.wait_published, 2)
    assert got[1].body == b"held"


async def test_wait_settled_returns_once_every_publish_is_confirmed(
    broker: FakeBroker, conn: rabbitry.AsyncConnection
) -> None:
    channel = await conn.channel()
    await channel.confirm_select()
    pipe = pipe_of(channel)
    await asyncio.wait_for(pipe.wait_settled(), WAIT)  # nothing unconfirmed
    first = _Record()
    pipe.publish(_frames(pipe), first)
    pipe.publish(_frames(pipe), _Record())
    first.set_exception(asyncio.CancelledError())  # its owner gave up; the entry stays
    settled = asyncio.create_task(pipe.wait_settled())
    await asyncio.to_thread(broker.wait_published, 2)
    broker.ack(1, channel=channel.channel_id)
    await _yield_to_loop()
    assert not settled.done()
    broker.ack(2, channel=channel.channel_id)
    await asyncio.wait_for(settled, WAIT)
    assert not pipe.confirms


async def test_wait_settled_returns_when_the_channel_ends_first(
    broker: FakeBroker, conn: rabbitry.AsyncConnection
) -> None:
    channel = await conn.channel()
    await channel.confirm_select()
    pipe = pipe_of(channel)
    record = _Record()
    pipe.publish(_frames(pipe, exchange="x"), record)
    settled = asyncio.create_task(pipe.wait_settled())
    await asyncio.to_thread(broker.wait_published, 1)
    broker.close_channel(channel.channel_id)  # 404, no exchange 'x'
    await asyncio.wait_for(settled, WAIT)
    # The head the pipe kept tells which publish the broker refused.
    assert isinstance(record.outcome, PublishRefused)
    assert record.outcome.delivery_tag == 1 and record.outcome.reply_code == 404


async def test_fail_pending_keeps_resendable_publishes_first_in_unsettled(
    broker: FakeBroker, conn: rabbitry.AsyncConnection
) -> None:
    channel = await conn.channel()
    await channel.confirm_select()
    pipe = pipe_of(channel)
    kept, lost = _Record(resend=True), _Record()
    pipe.publish(_frames(pipe), kept)
    pipe.publish(_frames(pipe), lost)
    pipe.fail_pending(ConnectionLost("gone"), keep_resendable=True)
    assert isinstance(lost.outcome, PublishOutcomeUnknown)
    assert isinstance(lost.outcome.__cause__, ConnectionLost)
    assert not kept.done()
    newer = _Record()
    pipe.publish(_frames(pipe), newer)
    assert pipe.unsettled() == [kept, newer]
    pipe.fail_pending(ConnectionLost("for good"))
    assert isinstance(kept.outcome, PublishOutcomeUnknown)
    assert isinstance(newer.outcome, PublishOutcomeUnknown)
    assert pipe.unsettled() == []
    assert channel.is_open  # failing what is pending does not close the channel


async def test_the_pipe_follows_the_channel_through_recovery(broker: FakeBroker) -> None:
    policy = rabbitry.RecoveryPolicy(initial_delay=0.01, max_delay=0.05)
    conn = rabbitry.AsyncConnection(broker.url, heartbeat=0, connection_timeout=5, recovery=policy)
    await conn.connect()
    try:
        channel = await conn.channel()
        await channel.confirm_select()
        pipe = pipe_of(channel)
        before = pipe.protocol
        broker.drop()
        await asyncio.to_thread(broker.wait_for, lambda: broker.connections == 2)
        await conn.wait_recovered(timeout=WAIT)
        assert pipe_of(channel) is pipe
        assert pipe.protocol is not before
        assert pipe.protocol.confirm_mode
        waiter = asyncio.get_running_loop().create_future()
        pipe.publish(_frames(pipe, b"after"), waiter)
        got = await asyncio.to_thread(broker.wait_published, 1)
        assert got[-1].body == b"after" and got[-1].seq == 1
        broker.ack(1, channel=channel.channel_id)
        assert await _settle(waiter) is None
    finally:
        await conn.close(timeout=2)
