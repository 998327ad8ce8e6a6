"""Recovery with several broker addresses tries the one it just lost last.

Two proxies in front of the shared broker stand for two cluster nodes. The connection
is on the first; that "node" then freezes (the proxy black-holes: TCP connects succeed,
nothing answers) and its connection is reset. Trying the frozen address first would
cost a whole ``connection_timeout``; the connection goes to the second address at once.
"""

from __future__ import annotations

import asyncio
import time

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
            started = time.monotonic()
            assert first.reset() == 1
            async with asyncio.timeout(CONNECT_TIMEOUT):
                while conn.state is State.OPEN:  # until the reset is noticed
                    await asyncio.sleep(0.005)
            await conn.wait_recovered(timeout=3 * CONNECT_TIMEOUT)
            elapsed = time.monotonic() - started
            assert states == [State.RECOVERING, State.OPEN]
            assert conn.params.port == second.port
            # Not a timing bound of the product: the frozen address was simply never
            # waited on (it would have taken CONNECT_TIMEOUT).
            assert elapsed < CONNECT_TIMEOUT, f"recovered after {elapsed:.2f} s"
            assert first.connections == 1  # never tried again
            channel = await conn.channel()
            await channel.queue_declare("", exclusive=True)
        finally:
            await conn.close()
