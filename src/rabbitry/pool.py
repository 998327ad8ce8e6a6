"""AsyncChannelPool: at most N channels shared by many tasks.

Theory of operation
-------------------
The pool counts every channel it owns: idle, lent out, opening, or settling its
confirms before it can be lent again (``_owned``). It never owns more than ``size``.

``acquire`` takes an idle channel; if there is none and fewer than ``size`` are owned it
opens one; otherwise it queues. Waiters are served strictly in order: a returned channel
goes straight to the oldest waiter, and when a channel is discarded the oldest waiter is
told to open a replacement (the "token" is the right to own one more channel), so a
newcomer can never overtake a task that has been waiting.

Returning a channel:

* closed (by a broker error, or with its connection): it is discarded and its place
  handed on, so the pool replaces it transparently with a fresh channel;
* with publishes still unconfirmed: it is held back until every one is settled (acked,
  nacked or failed), so the next user never inherits someone else's confirms. The wait
  has a deadline (``confirm_timeout``): past it the channel is closed, its unconfirmed
  publishes fail with :class:`PublishOutcomeUnknown` (caused by a :class:`Timeout`)
  and its place is handed on, so a broker that never confirms cannot hang the pool;
* otherwise it is lent to the oldest waiter or becomes idle.

Idle channels of a connection that went away are closed channels: they are discarded
when picked, so after a reconnect the pool refills on the new connection.
"""

from __future__ import annotations

import asyncio
import logging
from collections import deque
from typing import TYPE_CHECKING

from ._support.waiters import Waiters
from .aio.channel import pipe_of
from .exceptions import AMQPError, ConfigurationError, InvalidStateError, PoolTimeout, Timeout
from .observability import _state as _obs

if TYPE_CHECKING:
    from collections.abc import Callable, Coroutine

    from .aio.channel import AsyncChannel
    from .aio.connection import AsyncConnection

__all__ = ["AsyncChannelPool"]

logger = logging.getLogger("rabbitry.pool")


class AsyncChannelPool:
    """A pool of at most ``size`` channels on one connection.

    Get one with ``await connection.channel_pool(size=4)``; borrow a channel with
    ``async with pool.acquire(timeout=5) as channel: ...``. Channels are opened lazily.

    Args:
        connection: the connection the channels belong to.
        size: the most channels open at once.
        confirm: put each channel in confirm mode (``basic_publish`` then returns a
            future settled by the broker's confirm).
        confirm_timeout: seconds a returned channel may wait for the confirms of its
            publishes before it is closed and they fail as outcome unknown (``None``:
            no limit).

    Raises:
        ConfigurationError: ``size`` is not a positive int, or ``confirm_timeout`` is
            not a positive number.
    """

    def __init__(
        self,
        connection: AsyncConnection,
        *,
        size: int = 10,
        confirm: bool = True,
        confirm_timeout: float | None = 30.0,
    ) -> None:
        if isinstance(size, bool) or not isinstance(size, int) or size < 1:
            raise ConfigurationError(f"size: must be an int of at least 1, got {size!r}")
        if confirm_timeout is not None and (
            isinstance(confirm_timeout, bool)
            or not isinstance(confirm_timeout, int | float)
            or not confirm_timeout > 0
        ):
            raise ConfigurationError(
                f"confirm_timeout: must be a number of seconds > 0 or None, got {confirm_timeout!r}"
            )
        self._confirm_timeout = confirm_timeout
        self._conn = connection
        self._size = size
        self._confirm = confirm
        self._idle: deque[AsyncChannel] = deque()
        # Served oldest first: a channel, or None for the right to open one.
        self._waiters: Waiters[AsyncChannel | None] = Waiters(self._give_back)
        self._lent: set[AsyncChannel] = set()
        self._settling: set[asyncio.Task[None]] = set()
        self._owned = 0
        self._closed = False
        if _obs.active is not None:  # rabbitry.observability: waiters, lent channels
            _obs.active.pool_created(self)

    def __repr__(self) -> str:
        return (
            f"<AsyncChannelPool size={self._size} open={self._owned} lent={len(self._lent)} "
            f"waiting={len(self._waiters)}>"
        )

    async def __aenter__(self) -> AsyncChannelPool:
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.close()

    # ------------------------------------------------------------------ state

    @property
    def size(self) -> int:
        """The most channels the pool keeps open at once."""
        return self._size

    @property
    def confirm(self) -> bool:
        """Pooled channels are in confirm mode."""
        return self._confirm

    @property
    def confirm_timeout(self) -> float | None:
        """Seconds a returned channel may wait for its confirms (``None``: no limit)."""
        return self._confirm_timeout

    @property
    def open_channels(self) -> int:
        """Channels the pool owns now (idle, lent, opening or settling confirms)."""
        return self._owned

    @property
    def in_use(self) -> int:
        """Channels lent out now."""
        return len(self._lent)

    @property
    def waiting(self) -> int:
        """Callers queued for a channel."""
        return len(self._waiters)

    @property
    def is_closed(self) -> bool:
        """``close()`` was called."""
        return self._closed

    # ------------------------------------------------------------------ borrowing

    def acquire(self, timeout: float | None = None) -> _Lease:
        """Borrow a channel: ``async with pool.acquire(timeout=5) as channel: ...``.

        The channel goes back to the pool when the block ends (after its outstanding
        confirms are settled). Callers waiting for a channel are served in order.

        Args:
            timeout: seconds to wait for a channel (``None``: no limit).

        Returns:
            An async context manager lending the channel.

        Raises:
            PoolTimeout: no channel became free within ``timeout`` (on entering).
            InvalidStateError: the pool or the connection is closed.
        """
        return _Lease(self, timeout)

    async def _acquire(self, timeout: float | None = None) -> AsyncChannel:
        """Take a channel (loop thread); give it back with :meth:`_release`."""
        scope = asyncio.timeout(timeout)
        try:
            async with scope:
                while True:
                    if self._closed:
                        raise InvalidStateError("the channel pool is closed")
                    if not self._waiters:
                        channel = self._take_idle()
                        if channel is not None:
                            return channel
                        if self._owned < self._size:
                            self._owned += 1
                            return await self._open()
                    got = await self._waiters.wait()
                    if got is None:  # the right to open a replacement
                        return await self._open()
                    if got.is_open:
                        self._lent.add(got)
                        return got
                    self._discard()  # closed on the way; wait again
        except TimeoutError:
            if scope.expired():
                raise PoolTimeout(f"no pooled channel became free within {timeout} s") from None
            raise

    def _take_idle(self) -> AsyncChannel | None:
        idle = self._idle
        while idle:
            channel = idle.popleft()
            if channel.is_open:
                self._lent.add(channel)
                return channel
            self._owned -= 1
        return None

    async def _open(self) -> AsyncChannel:
        """Open a channel for a place already counted in ``_owned``."""
        channel: AsyncChannel | None = None
        try:
            channel = await self._conn.channel()
            if self._confirm:
                await channel.confirm_select()
        except BaseException:
            self._discard()
            if channel is not None:
                # Opened, but confirm.select failed or was cancelled (acquire timed
                # out): the pool no longer counts it, so it must not stay open.
                self._close_soon(channel)
            raise
        self._lent.add(channel)
        return channel

    def _give_back(self, got: AsyncChannel | None) -> None:
        """A waiter was served but gave up at the same moment, and nobody else waits."""
        if got is None:
            self._discard()
        else:
            self._lent.add(got)
            self._release(got)

    def _release(self, channel: AsyncChannel) -> None:
        """Take a channel back (loop thread; the sync twin submits it)."""
        if channel not in self._lent:
            logger.warning("channel %s returned to a pool that did not lend it", channel.channel_id)
            return
        self._lent.discard(channel)
        if not channel.is_open:
            self._discard()
        elif self._closed:
            self._owned -= 1
            self._close_soon(channel)
        elif pipe_of(channel).confirms:
            task = asyncio.get_running_loop().create_task(self._settle_then_return(channel))
            self._settling.add(task)
            task.add_done_callback(self._settling.discard)
        else:
            self._hand_on(channel)

    def _hand_on(self, channel: AsyncChannel) -> None:
        if not self._waiters.hand(channel):
            self._idle.append(channel)

    def _discard(self) -> None:
        """A place became free: let the oldest waiter open a new channel."""
        if not self._waiters.hand(None):  # the place passes to the waiter
            self._owned -= 1

    async def _settle_then_return(self, channel: AsyncChannel) -> None:
        abandoned = False
        try:
            # Until its confirm table is empty (every publish acked, nacked or failed
            # with the channel) or the channel ends.
            async with asyncio.timeout(self._confirm_timeout):
                await pipe_of(channel).wait_settled()
        except TimeoutError:
            abandoned = True
            self._abandon(channel)
        finally:
            if abandoned:
                self._discard()  # its place goes to the oldest waiter
            else:
                self._lent.add(channel)
                self._release(channel)

    def _abandon(self, channel: AsyncChannel) -> None:
        """No confirm came in time: fail what is unconfirmed, close the channel."""
        pipe = pipe_of(channel)
        unconfirmed = len(pipe.confirms)
        reason = Timeout(
            f"no publisher confirm within {self._confirm_timeout} s after the channel was "
            "returned to the pool (confirm_timeout); the channel was closed"
        )
        logger.error(
            "pool: channel %s came back with %d unconfirmed publish(es) and no confirm "
            "arrived within %s s; closing it, they fail as outcome unknown",
            channel.channel_id,
            unconfirmed,
            self._confirm_timeout,
        )
        pipe.fail_pending(reason)
        if channel.is_open and self._conn.is_open:
            task = asyncio.get_running_loop().create_task(
                channel.close(timeout=self._confirm_timeout)
            )
            task.add_done_callback(_retrieve)

    # ------------------------------------------------------------------ closing

    async def close(self, *, timeout: float | None = None) -> None:
        """Close the idle channels and refuse new borrowers; idempotent.

        Lent channels are closed when they come back. Waiters get
        :class:`InvalidStateError`.

        Args:
            timeout: seconds to wait for channels that are settling confirms
                (``None``: no limit).
        """
        if self._closed:
            return
        self._closed = True
        self._waiters.fail_all(InvalidStateError("the channel pool is closed"))
        if self._settling:
            await asyncio.wait(set(self._settling), timeout=timeout)
        idle, self._idle = self._idle, deque()
        for channel in idle:
            self._owned -= 1
            if channel.is_open and self._conn.is_open:
                try:
                    await channel.close(timeout=timeout)
                except AMQPError:
                    pass

    def _close_soon(self, channel: AsyncChannel) -> None:
        if not channel.is_open or not self._conn.is_open:
            return
        task = asyncio.get_running_loop().create_task(channel.close())
        task.add_done_callback(_retrieve)


class _Lease:
    """``async with pool.acquire() as channel``: borrow on entry, give back on exit."""

    __slots__ = ("_channel", "_pool", "_timeout")

    def __init__(self, pool: AsyncChannelPool, timeout: float | None) -> None:
        self._pool = pool
        self._timeout = timeout
        self._channel: AsyncChannel | None = None

    async def __aenter__(self) -> AsyncChannel:
        if self._channel is not None:
            raise InvalidStateError("this lease is already in use")
        self._channel = await self._pool._acquire(self._timeout)
        return self._channel

    async def __aexit__(self, *exc_info: object) -> None:
        channel, self._channel = self._channel, None
        if channel is not None:
            self._pool._release(channel)


def _retrieve(task: asyncio.Task[object]) -> None:
    if not task.cancelled():
        task.exception()


def lending(
    pool: AsyncChannelPool,
) -> tuple[
    Callable[[float | None], Coroutine[None, None, AsyncChannel]],
    Callable[[AsyncChannel], None],
]:
    """The pool's borrow and give-back, both for the loop thread: the coroutine function
    that takes a channel (within a timeout) and the function that takes it back.

    For the thread-safe twin (:class:`rabbitry.ChannelPool`), which lends channels to
    threads outside an ``async with``; not for applications.
    """
    return pool._acquire, pool._release
