"""AsyncChannel across a connection recovery, against the scripted broker (no real broker).

The scripted broker answers basic.get only when a test says so, and can put a
connection.close right behind the answer in one write: the client then handles the
reply and the end of the connection in one read, before the caller of ``basic_get``
has run again.
"""

from __future__ import annotations

import asyncio
from typing import TYPE_CHECKING

import pytest
from fake_broker import FakeBroker

import rabbitry
from rabbitry.protocol import spec

if TYPE_CHECKING:
    from collections.abc import Iterator

pytestmark = pytest.mark.timeout(60)

WAIT = 5.0


@pytest.fixture
def broker() -> Iterator[FakeBroker]:
    with FakeBroker() as fake:
        yield fake


async def _get_sent(broker: FakeBroker, count: int) -> None:
    await asyncio.to_thread(broker.wait_for, lambda: len(broker.sent(spec.BasicGet)) == count)


async def test_a_get_answered_as_the_connection_ends_belongs_to_the_dead_connection(
    broker: FakeBroker,
) -> None:
    """basic.get-ok and connection.close arrive together: the message was delivered on
    the connection that ended, so after recovery acking it must be dropped as stale
    (the broker redelivers it), never sent on the new connection, where its delivery
    tag names another delivery."""
    policy = rabbitry.RecoveryPolicy(initial_delay=0.01, max_delay=0.05, jitter=0)
    conn = rabbitry.AsyncConnection(broker.url, heartbeat=0, connection_timeout=5, recovery=policy)
    await conn.connect()
    try:
        channel = await conn.channel()
        call = asyncio.ensure_future(channel.basic_get("q", timeout=WAIT))
        await _get_sent(broker, 1)
        broker.get_ok(channel.channel_id, 1, b"old", then_close=(541, "INTERNAL_ERROR"))
        stale = await asyncio.wait_for(call, WAIT)
        assert stale is not None and stale.body == b"old"
        await conn.wait_recovered(timeout=WAIT)
        assert broker.connections == 2
        assert stale.epoch < channel.epoch

        call = asyncio.ensure_future(channel.basic_get("q", timeout=WAIT))
        await _get_sent(broker, 2)
        broker.get_ok(channel.channel_id, 1, b"new")
        fresh = await asyncio.wait_for(call, WAIT)
        assert fresh is not None and fresh.body == b"new"
        assert fresh.delivery_tag != stale.delivery_tag

        stale.ack()
        assert channel.stale_settlements == 1
        fresh.ack()
        await asyncio.to_thread(broker.wait_for, lambda: bool(broker.sent(spec.BasicAck)))
        acks = [m for _, m in broker.sent(spec.BasicAck) if isinstance(m, spec.BasicAck)]
        assert [(m.delivery_tag, m.multiple) for m in acks] == [(1, False)]
    finally:
        await conn.close(timeout=2)
