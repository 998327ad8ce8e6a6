"""How a recovering connection treats its channels, against the scripted broker.

The scripted broker accepts a new connection after ``drop()``, so a connection with a
recovery policy reconnects to it; the tests wait on the connection's own state changes,
never on time.
"""

from __future__ import annotations

import asyncio
from typing import TYPE_CHECKING

import pytest
from fake_broker import FakeBroker

import rabbitry
from rabbitry import RecoveryPolicy, State
from rabbitry.exceptions import AMQPError, ConnectError
from rabbitry.protocol import spec

if TYPE_CHECKING:
    from collections.abc import Iterator

pytestmark = pytest.mark.timeout(60)

HANG = 30.0  # only a hang gets near it


@pytest.fixture
def broker() -> Iterator[FakeBroker]:
    with FakeBroker() as fake:
        yield fake


def _states(conn: rabbitry.AsyncConnection) -> dict[State, asyncio.Event]:
    """One event per state, set when the connection enters it."""
    events = {state: asyncio.Event() for state in State}
    conn.on_state_change(lambda state, cause: events[state].set())
    return events


async def test_a_channel_closed_while_recovering_is_forgotten_by_its_connection(
    broker: FakeBroker,
) -> None:
    # No reconnect attempt before the test ends: the channels stay suspended.
    policy = RecoveryPolicy(initial_delay=HANG * 2, max_delay=HANG * 2)
    conn = rabbitry.AsyncConnection(broker.url, heartbeat=0, recovery=policy)
    await conn.connect()
    try:
        states = _states(conn)
        closed, kept = await conn.channel(), await conn.channel()
        broker.drop()
        await asyncio.wait_for(states[State.RECOVERING].wait(), HANG)
        await closed.close()
        assert closed.is_closed
        assert not kept.is_closed  # suspended, waiting for recovery
        assert sorted(conn._channels) == [kept.channel_id]
    finally:
        await conn.close(timeout=1)


async def test_recovery_reopens_the_channels_with_their_numbers(broker: FakeBroker) -> None:
    policy = RecoveryPolicy(initial_delay=0.01, jitter=0.0)
    conn = rabbitry.AsyncConnection(broker.url, heartbeat=0, recovery=policy)
    await conn.connect()
    try:
        states = _states(conn)
        first, second = await conn.channel(), await conn.channel()
        await second.confirm_select()
        await first.close()
        broker.drop()
        await asyncio.wait_for(states[State.RECOVERING].wait(), HANG)
        await conn.wait_recovered(HANG)
        assert broker.connections == 2
        assert sorted(conn._channels) == [second.channel_id]
        assert second.is_open and second.confirm_mode
        # The second connection opened only the live channel, then selected confirms.
        reopened = [number for number, _ in broker.sent(spec.ChannelOpen)]
        assert reopened == [first.channel_id, second.channel_id, second.channel_id]
        assert len(broker.sent(spec.ConfirmSelect)) == 2
    finally:
        await conn.close(timeout=1)


async def test_recovery_gives_up_and_reports_the_connection() -> None:
    policy = RecoveryPolicy(initial_delay=0.01, jitter=0.0, max_attempts=1)
    with FakeBroker() as broker:
        conn = rabbitry.AsyncConnection(broker.url, heartbeat=0, recovery=policy)
        await conn.connect()
        address = conn.params.address
        channel = await conn.channel()
        reports: list[tuple[str, str, AMQPError]] = []
        conn.on_recovery_error(lambda kind, name, exc: reports.append((kind, name, exc)))
    # The broker is gone: its port refuses the reconnect, and one attempt is allowed.
    try:
        cause = await conn.wait_closed(HANG)
        assert isinstance(cause, ConnectError)
        assert conn.state is State.CLOSED
        assert reports == [("connection", address, cause)]
        assert channel.is_closed and channel.close_exc is cause
        assert conn._channels == {}
    finally:
        await conn.close(timeout=1)
