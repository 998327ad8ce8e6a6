"""What a close does to pending calls, against the scripted broker (no real broker).

The scripted broker never answers ``basic.qos``, so a ``basic_qos`` call stays pending
until the connection fails it; with ``answer_close = False`` it never answers
``connection.close`` either, so a call that fails while the connection is still CLOSING
has failed at once, not after the close-ok deadline.
"""

from __future__ import annotations

import asyncio
import threading
from typing import TYPE_CHECKING

import pytest
from fake_broker import FakeBroker

import rabbitry
from rabbitry.exceptions import ConnectionClosedByClient, ProtocolError, RemoteProtocolError
from rabbitry.protocol import spec
from rabbitry.protocol.connection import ConnectionState

if TYPE_CHECKING:
    from collections.abc import Iterator

pytestmark = pytest.mark.timeout(60)

HANG = 30.0  # only a hang gets near it


@pytest.fixture
def broker() -> Iterator[FakeBroker]:
    with FakeBroker() as fake:
        fake.answer_close = False
        yield fake


async def _pending_qos(broker: FakeBroker, conn: rabbitry.AsyncConnection) -> asyncio.Task[object]:
    channel = await conn.channel()
    call = asyncio.ensure_future(channel.basic_qos(10))
    await asyncio.to_thread(broker.wait_for, lambda: bool(broker.sent(spec.BasicQos)))
    assert not call.done()
    return call


async def test_a_protocol_violation_fails_pending_calls_without_waiting_for_close_ok(
    broker: FakeBroker,
) -> None:
    conn = rabbitry.AsyncConnection(broker.url, recovery=None)
    await conn.connect()
    try:
        call = await _pending_qos(broker, conn)
        broker.send(0, spec.BasicAck(delivery_tag=1))  # a basic method on channel 0
        with pytest.raises(ProtocolError):
            await asyncio.wait_for(call, HANG)
        assert conn._proto is not None and conn._proto.state is ConnectionState.CLOSING
    finally:
        await conn.close(timeout=0.1)


async def test_close_fails_pending_calls_without_waiting_for_close_ok(
    broker: FakeBroker,
) -> None:
    conn = rabbitry.AsyncConnection(broker.url, recovery=None)
    await conn.connect()
    call = await _pending_qos(broker, conn)
    closing = asyncio.ensure_future(conn.close(timeout=HANG))
    with pytest.raises(ConnectionClosedByClient):
        await asyncio.wait_for(call, HANG)
    assert not closing.done()  # still waiting for the close-ok that never comes
    assert conn._proto is not None and conn._proto.state is ConnectionState.CLOSING
    closing.cancel()
    await asyncio.gather(closing, return_exceptions=True)
    await conn.close(timeout=0.1)


def test_sync_close_fails_a_call_waiting_in_another_thread(broker: FakeBroker) -> None:
    broker.answer_close = True
    conn = rabbitry.Connection(broker.url, recovery=None)
    conn.connect()
    channel = conn.channel()
    outcome: list[BaseException] = []
    asked = threading.Event()

    def call() -> None:
        try:
            asked.set()
            channel.basic_qos(10)
        except BaseException as exc:
            outcome.append(exc)

    caller = threading.Thread(target=call)
    caller.start()
    assert asked.wait(HANG)
    broker.wait_for(lambda: bool(broker.sent(spec.BasicQos)), HANG)
    conn.close()
    caller.join(HANG)
    assert not caller.is_alive()
    assert len(outcome) == 1 and isinstance(outcome[0], ConnectionClosedByClient)


async def _violated(broker: FakeBroker, conn: rabbitry.AsyncConnection) -> None:
    """The broker sends a frame on a channel that was never opened; the client answers
    with connection.close (504) and waits for a close-ok that never comes."""
    broker.send(7, spec.BasicAck(delivery_tag=1))
    await asyncio.to_thread(broker.wait_for, lambda: bool(broker.sent(spec.ConnectionClose)))


@pytest.mark.parametrize("recovery", ["default", "none"])
async def test_calls_after_a_protocol_violation_fail_at_once_with_the_violation_as_cause(
    broker: FakeBroker, recovery: str
) -> None:
    conn = (
        rabbitry.AsyncConnection(broker.url)
        if recovery == "default"
        else rabbitry.AsyncConnection(broker.url, recovery=None)
    )
    await conn.connect()
    try:
        channel = await conn.channel()
        await _violated(broker, conn)
        calls = {
            "channel": conn.channel(timeout=HANG),
            "queue_declare": channel.queue_declare("q", timeout=HANG),
            "basic_publish": channel.basic_publish("", "q", b"x"),
        }
        for name, call in calls.items():
            with pytest.raises(rabbitry.InvalidStateError, match="closing") as caught:
                await call
            cause = caught.value.__cause__
            assert isinstance(cause, RemoteProtocolError), name
            assert cause.reply_code == 504 and "unopened channel 7" in str(cause)
        # Nothing more went out after connection.close.
        (close_index,) = [
            i for i, (_, m) in enumerate(broker.methods) if isinstance(m, spec.ConnectionClose)
        ]
        assert broker.methods[close_index + 1 :] == []
    finally:
        await conn.close(timeout=0.1)


def test_sync_calls_after_a_protocol_violation_fail_at_once_with_the_cause(
    broker: FakeBroker,
) -> None:
    with rabbitry.Connection(broker.url) as conn:
        channel = conn.channel()
        broker.send(7, spec.BasicAck(delivery_tag=1))
        broker.wait_for(lambda: bool(broker.sent(spec.ConnectionClose)))
        for name, call in (
            ("channel", lambda: conn.channel(timeout=HANG)),
            ("queue_declare", lambda: channel.queue_declare("q", timeout=HANG)),
            ("basic_publish", lambda: channel.basic_publish("", "q", b"x")),
        ):
            with pytest.raises(rabbitry.InvalidStateError, match="closing") as caught:
                call()
            assert isinstance(caught.value.__cause__, RemoteProtocolError), name
        conn.close(timeout=0.1)
