"""ChannelPool: the thread-safe twin of :class:`rabbitry.AsyncChannelPool`.

Same methods and parameters as the async twin; the pool's bookkeeping runs on the IO
thread. Borrowing waits for the IO thread (one round trip); giving a channel back does
not wait: it is queued behind the publishes the borrowing thread made, so the pool sees
them (and waits for their confirms) before the channel can be lent again.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from ..exceptions import InvalidStateError
from ..pool import lending
from ._connection import portal_of
from .channel import Channel, caller_timeout

if TYPE_CHECKING:
    from ..aio.channel import AsyncChannel
    from ..pool import AsyncChannelPool
    from ._connection import Connection

__all__ = ["ChannelPool"]


class ChannelPool:
    """At most ``size`` channels shared by many threads. Get one with
    ``connection.channel_pool(size=4)``; borrow with ``with pool.acquire(timeout=5) as ch``.

    See :class:`rabbitry.AsyncChannelPool` for the rules (order, replacement of broken
    channels, confirms settled before reuse).
    """

    def __init__(self, connection: Connection, pool: AsyncChannelPool) -> None:
        self._connection = connection
        self._async = pool
        self._borrow_async, self._give_back = lending(pool)
        self._portal = portal_of(connection)

    def __repr__(self) -> str:
        return repr(self._async).replace("AsyncChannelPool", "ChannelPool", 1)

    def __enter__(self) -> ChannelPool:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    # ------------------------------------------------------------------ state

    @property
    def size(self) -> int:
        """The most channels the pool keeps open at once."""
        return self._async.size

    @property
    def confirm(self) -> bool:
        """Pooled channels are in confirm mode."""
        return self._async.confirm

    @property
    def confirm_timeout(self) -> float | None:
        """Seconds a returned channel may wait for its confirms (``None``: no limit)."""
        return self._async.confirm_timeout

    @property
    def open_channels(self) -> int:
        """Channels the pool owns now (a snapshot)."""
        return self._async.open_channels

    @property
    def in_use(self) -> int:
        """Channels lent out now (a snapshot)."""
        return self._async.in_use

    @property
    def waiting(self) -> int:
        """Callers queued for a channel (a snapshot)."""
        return self._async.waiting

    @property
    def is_closed(self) -> bool:
        """``close()`` was called."""
        return self._async.is_closed

    # ------------------------------------------------------------------ borrowing

    def acquire(self, timeout: float | None = None) -> _Lease:
        """Borrow a channel: ``with pool.acquire(timeout=5) as channel: ...``.

        Args:
            timeout: seconds to wait for a channel (``None``: no limit).

        Returns:
            A context manager lending the channel.

        Raises:
            PoolTimeout: no channel became free within ``timeout`` (on entering).
            InvalidStateError: the pool or the connection is closed (on entering).
        """
        return _Lease(self, timeout)

    def _borrow(self, timeout: float | None) -> tuple[Channel, AsyncChannel]:
        """A channel lent, and the asyncio channel under it (what goes back)."""
        channel: AsyncChannel = self._portal.call(
            self._borrow_async, timeout, wait=caller_timeout(timeout)
        )
        return Channel(self._connection, channel, self._portal), channel

    def close(self, *, timeout: float | None = None) -> None:
        """Close the idle channels and refuse new borrowers (see the async twin).

        Args:
            timeout: seconds to wait for channels that are settling confirms
                (``None``: no limit).
        """
        if self._async.is_closed or not self._connection.is_open:
            return
        self._portal.call(self._async.close, timeout=timeout, wait=caller_timeout(timeout))


class _Lease:
    """``with pool.acquire() as channel``: borrow on entry, give back on exit."""

    __slots__ = ("_channel", "_engine", "_pool", "_timeout")

    def __init__(self, pool: ChannelPool, timeout: float | None) -> None:
        self._pool = pool
        self._timeout = timeout
        self._channel: Channel | None = None
        self._engine: AsyncChannel | None = None

    def __enter__(self) -> Channel:
        if self._channel is not None:
            raise InvalidStateError("this lease is already in use")
        self._channel, self._engine = self._pool._borrow(self._timeout)
        return self._channel

    def __exit__(self, *exc_info: object) -> None:
        engine, self._channel, self._engine = self._engine, None, None
        if engine is not None:
            try:
                self._pool._portal.submit(self._pool._give_back, engine)
            except InvalidStateError:
                pass  # the connection's IO thread is gone, and the channel with it
