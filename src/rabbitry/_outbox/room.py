"""The bound of an outbox publisher on the rows and bytes it stores."""

from __future__ import annotations

import asyncio
from typing import TYPE_CHECKING

from .._support.waiters import Waiters
from ..exceptions import InvalidStateError, LocalProtocolError, OutboxFull

if TYPE_CHECKING:
    from ..outbox import Outbox

__all__ = ["OutboxRoom"]


class OutboxRoom:
    """Reserves room in the outbox's bound (``max_rows``, ``max_bytes``) for each publish,
    takes it back when rows leave, and serves the publishes waiting for room in order.

    Args:
        outbox: the store, whose ``max_rows`` and ``max_bytes`` are the bound.
        timeout: the default deadline of a reservation (``None``: no limit).
    """

    def __init__(self, outbox: Outbox, timeout: float | None) -> None:
        self._outbox = outbox
        self._timeout = timeout
        #: ``close()`` was called: reservations are refused.
        self.closed = False
        #: Rows and bytes reserved: stored, or being stored.
        self.rows = 0
        self.bytes = 0
        # Reservations waiting for room, each with its (rows, bytes); handed that grant.
        self._waiters: Waiters[tuple[int, int]] = Waiters(self._give_back)
        # Told when no row is left.
        self._idle: Waiters[None] = Waiters()

    async def reserve(self, rows: int, size: int, timeout: float | None) -> None:
        """Reserve room for ``rows`` rows of ``size`` bytes in all, waiting for it.

        Args:
            rows: how many rows.
            size: their bytes.
            timeout: seconds to wait for room (``None``: the default given at creation).

        Raises:
            InvalidStateError: the room is closed.
            LocalProtocolError: the rows can never fit the bound.
            OutboxFull: no room before the deadline.
        """
        if self.closed:
            raise InvalidStateError("the publisher is closed")
        outbox = self._outbox
        if rows > outbox.max_rows or size > outbox.max_bytes:
            raise LocalProtocolError(
                f"publish_many.messages: {rows} messages of {size} bytes can never fit the "
                f"outbox's bound (max_rows {outbox.max_rows}, max_bytes {outbox.max_bytes})"
            )
        if (
            not self._waiters
            and self.rows + rows <= outbox.max_rows
            and self.bytes + size <= outbox.max_bytes
        ):
            self.rows += rows
            self.bytes += size
            return
        if timeout is None:
            timeout = self._timeout
        try:
            async with asyncio.timeout(timeout):
                await self._waiters.wait((rows, size))
        except TimeoutError:
            raise OutboxFull(
                f"outbox {outbox.name}: full ({self.rows}/{outbox.max_rows} rows, "
                f"{self.bytes}/{outbox.max_bytes} bytes) for {timeout} s; the broker "
                "is not confirming fast enough (or is unreachable)",
                rows=self.rows,
                size=self.bytes,
            ) from None
        finally:
            # A waiter that left the head may have held back smaller ones behind it.
            self._serve()

    def release(self, rows: int, size: int) -> None:
        """Give back the room of ``rows`` rows of ``size`` bytes that left the outbox."""
        self.rows -= rows
        self.bytes -= size
        self._serve()
        if not self.rows:
            self._idle.wake_all(None)

    async def wait_idle(self) -> None:
        """Wait until no row is left."""
        await self._idle.wait()

    def close(self, exc: BaseException) -> None:
        """Refuse further reservations; the waiting ones fail with ``exc``."""
        self.closed = True
        self._waiters.fail_all(exc)

    def _give_back(self, grant: tuple[int, int]) -> None:
        """Take back room granted to a reservation that was cancelled before it resumed."""
        self.release(*grant)

    def _serve(self) -> None:
        """Grant room to the waiting reservations, oldest first, while the next one fits."""
        outbox = self._outbox
        waiters = self._waiters
        while waiters:
            need = waiters.next_need()
            if need is None:
                break
            need_rows, need_size = need
            if self.rows + need_rows > outbox.max_rows or self.bytes + need_size > outbox.max_bytes:
                break
            self.rows += need_rows
            self.bytes += need_size
            waiters.hand(need)
