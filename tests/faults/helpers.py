"""Small helpers shared by the fault tests."""

from __future__ import annotations

import asyncio
import uuid
from typing import TYPE_CHECKING, Any

from rabbitry import AsyncConnection, RecoveryPolicy, State

if TYPE_CHECKING:
    from collections.abc import Callable

    from tests.support.node import BrokerNode

#: Reconnect quickly: the tests measure the library, not the backoff.
FAST = RecoveryPolicy(initial_delay=0.05, max_delay=0.5, jitter=0.1)
WAIT = 15.0


def unique(prefix: str) -> str:
    return f"rabbitry-rec-{prefix}-{uuid.uuid4().hex[:8]}"


async def eventually(predicate: Callable[[], Any], timeout: float = WAIT) -> bool:
    deadline = asyncio.get_running_loop().time() + timeout
    while asyncio.get_running_loop().time() < deadline:
        if predicate():
            return True
        await asyncio.sleep(0.02)
    return bool(predicate())


async def force_close(node: BrokerNode, conn: AsyncConnection) -> None:
    """Close ``conn`` from the broker and return once the client has noticed (left OPEN).

    Only then does ``wait_recovered()`` wait for the recovery: called while the client
    has not yet read the broker's connection.close, it finds the connection OPEN and
    returns at once.
    """
    name = conn.params.connection_name
    assert name
    left_open = asyncio.Event()

    def on_change(state: State, cause: BaseException | None) -> None:
        if state is not State.OPEN:
            left_open.set()

    conn.on_state_change(on_change)
    closed = await asyncio.to_thread(node.close_connection_by_name, name, "recovery test")
    assert closed == 1
    await asyncio.wait_for(left_open.wait(), WAIT)


class StateLog:
    """Records a connection's state changes with their loop time and cause."""

    def __init__(self, conn: AsyncConnection) -> None:
        self.loop = asyncio.get_running_loop()
        self.changes: list[tuple[float, State, BaseException | None]] = []
        conn.on_state_change(self._on_change)

    def _on_change(self, state: State, cause: BaseException | None) -> None:
        self.changes.append((self.loop.time(), state, cause))

    @property
    def states(self) -> list[State]:
        return [state for _, state, _ in self.changes]

    def first(self, state: State) -> tuple[float, BaseException | None]:
        for when, seen, cause in self.changes:
            if seen is state:
                return when, cause
        raise AssertionError(f"never {state}: {self.states}")
