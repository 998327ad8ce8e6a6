"""The window of an asyncio publisher: how many unconfirmed messages it may have."""

from __future__ import annotations

from .._support.waiters import Waiters

__all__ = ["SendWindow"]


class SendWindow:
    """Counts the reserved slots of the window and hands freed ones out in FIFO order.

    ``reserved`` of ``size`` slots are taken; ``waiters`` are the publishes waiting for
    one (a slot handed to a waiter cancelled meanwhile and taken by nobody else is
    freed). The fast path (a free slot and nobody waiting) is
    ``reserved < size and not waiters`` followed by ``reserved += 1``, which the
    publisher inlines; :meth:`release` is what a settled message calls.
    """

    __slots__ = ("reserved", "size", "waiters")

    def __init__(self, size: int) -> None:
        self.size = size
        self.reserved = 0
        self.waiters: Waiters[None] = Waiters(lambda _slot: self.release())

    def reserve_more(self) -> bool:
        """Reserve one more slot if there is room and nobody waits for one.

        Returns:
            True when a slot was reserved.
        """
        if self.reserved < self.size and not self.waiters:
            self.reserved += 1
            return True
        return False

    def release(self) -> None:
        """A confirm freed a slot: hand it to the oldest waiter, or free it."""
        if not (self.waiters and self.waiters.hand(None)):
            self.reserved -= 1
