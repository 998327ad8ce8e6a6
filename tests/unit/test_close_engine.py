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
from rabbitry.exceptions import ConnectionClosedByClient, ProtocolError
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
