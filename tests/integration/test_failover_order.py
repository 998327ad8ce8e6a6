"""Recovery with several broker addresses tries the one it just lost last.

Two proxies in front of the shared broker stand for two cluster nodes. The connection
is on the first; that "node" then freezes (the proxy black-holes: TCP connects succeed,
nothing answers) and its connection is reset. Trying the frozen address first would
cost a whole ``connection_timeout``; the connection goes to the second address at once.
"""

from __future__ import annotations

import asyncio

from tests.support.proxy import TcpProxy

from rabbitry import AsyncConnection
from rabbitry.config import parse_url
from rabbitry.recovery import RecoveryPolicy, State

CONNECT_TIMEOUT = 5.0


async def test_recovery_tries_the_lost_address_last(url: str) -> None:
    target = parse_url(url)
    with (
        TcpProxy(target.host, target.port) as first,
        TcpProxy(target.host, target.port) as second,
    ):
        conn = AsyncConnection(
            [first.url(), second.url()],
            connection_timeout=CONNECT_TIMEOUT,
            recovery=RecoveryPolicy(initial_delay=0.01, jitter=0),
        )
        await conn.connect()
        try:
            assert conn.params.port == first.port
            states: list[State] = []
            conn.on_state_change(lambda state, _exc: states.append(state))
            first.blackhole()  # a frozen node: accepts connections, never answers
            assert first.reset() == 1
            # The state callbacks, not polling: a fast recovery could slip between polls.
            async with asyncio.timeout(3 * CONNECT_TIMEOUT):
                while states != [State.RECOVERING, State.OPEN]:
                    assert len(states) < 2, states
                    await asyncio.sleep(0.005)
            await conn.wait_recovered(timeout=CONNECT_TIMEOUT)
            assert conn.params.port == second.port
            # The frozen address was never tried again (trying it would have cost a whole
            # connection_timeout): its proxy saw the first connection only.
            assert first.connections == 1  # never tried again
            channel = await conn.channel()
            await channel.queue_declare("", exclusive=True)
        finally:
            await conn.close()
