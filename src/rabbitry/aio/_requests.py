"""The synchronous requests of one channel and their replies.

:class:`Requests` sends a channel's synchronous methods (declare, bind, qos, consume,
get...) and matches the broker's replies to them, which come in request order.
"""

from __future__ import annotations

import asyncio
import copy
import logging
from collections import deque
from typing import TYPE_CHECKING, Any, Protocol

from ..exceptions import ConnectionLost, Timeout
from ..protocol.channel import ChannelState

if TYPE_CHECKING:
    from collections.abc import Awaitable, Callable

    from ..exceptions import AMQPError
    from ..protocol.frames import Method
    from ..protocol.message import AckTarget, Message
    from ._link import ChannelLink

__all__ = ["ReadFlow", "Requests"]

logger = logging.getLogger("rabbitry.channel")


class ReadFlow(Protocol):
    """The connection's back-pressure on its socket reads (``aio._events.ReadFlow``)."""

    def pause(self) -> None: ...

    def resume(self) -> None: ...

    def recheck(self) -> None: ...


class Requests:
    """A channel's requests awaiting the broker's reply, answered in the order sent.

    Args:
        link: the channel's shared state.
        owner: the channel (a fetched message settles through it).
        loop: the connection's event loop.
        read_flow: the connection's read back-pressure (a reply must not be held back).
        kick: writes what the protocol queued.
        await_recovery: ``await_recovery(timeout, what)`` waits out a recovery.
    """

    __slots__ = ("_await_recovery", "_kick", "_link", "_loop", "_owner", "_pending", "_read_flow")

    def __init__(
        self,
        link: ChannelLink,
        owner: AckTarget,
        *,
        loop: asyncio.AbstractEventLoop,
        read_flow: ReadFlow,
        kick: Callable[[], None],
        await_recovery: Callable[[float | None, str], Awaitable[None]],
    ) -> None:
        self._link = link
        self._owner = owner
        self._loop = loop
        self._read_flow = read_flow
        self._kick = kick
        self._await_recovery = await_recovery
        # One future per request sent, answered in order; the hook runs when the reply
        # is handled (before later deliveries), e.g. to register a consumer.
        self._pending: deque[tuple[asyncio.Future[Any], Callable[[Any], None] | None]] = deque()

    def __bool__(self) -> bool:
        return bool(self._pending)

    def register(self, hook: Callable[[Any], None] | None = None) -> asyncio.Future[Any]:
        """Expect the reply to a request the protocol just queued.

        Args:
            hook: called with the reply when it is handled (before later deliveries).

        Returns:
            The future the reply resolves.
        """
        future: asyncio.Future[Any] = self._loop.create_future()
        self._pending.append((future, hook))
        self._read_flow.recheck()  # a full consumer queue must not hold the reply back
        return future

    async def wait(
        self, name: str, timeout: float | None, future: asyncio.Future[Any] | None = None
    ) -> Any:
        """Wait for the reply to ``future`` (by default the last request registered).

        Args:
            name: the request's method name, for the timeout's message.
            timeout: seconds to wait (``None``: no limit).
            future: the reply to wait for.

        Returns:
            The reply (a method, or the message of basic.get-ok).

        Raises:
            Timeout: no reply within ``timeout`` seconds.
        """
        if future is None:
            future = self._pending[-1][0]
        self._kick()
        if timeout is None:
            return await future
        try:
            async with asyncio.timeout(timeout):
                return await future
        except TimeoutError:
            raise Timeout(f"{name} got no answer within {timeout} s") from None

    async def call(
        self, method: Method, timeout: float | None, hook: Callable[[Any], None] | None = None
    ) -> Any:
        """Send ``method`` (after a recovery under way) and wait for its reply.

        Args:
            method: the synchronous method.
            timeout: seconds to wait (``None``: no limit).
            hook: called with the reply when it is handled.

        Returns:
            The reply.
        """
        if self._link.suspended:
            await self._await_recovery(timeout, method.NAME)
        self._link.protocol.send_method(method)
        self.register(hook)
        return await self.wait(method.NAME, timeout)

    async def replay(self, method: Method) -> Any:
        """A request of recovery itself: sent now, never waiting for recovery.

        Args:
            method: the synchronous method.

        Returns:
            The reply.

        Raises:
            ConnectionLost: the connection dropped again (recovery tries again).
        """
        if self._link.protocol.state is not ChannelState.OPEN:
            raise ConnectionLost(f"the connection dropped before {method.NAME} was replayed")
        self._link.protocol.send_method(method)
        self.register(None)
        return await self.wait(method.NAME, 30.0)

    def on_reply(self, method: Method, message: Message | None) -> None:
        """The reply to the oldest request, with its content if it has one.

        Args:
            method: the reply.
            message: the message of a basic.get-ok.
        """
        if not self._pending:
            logger.warning(
                "channel %s: reply %s with no request", self._link.channel_id, method.NAME
            )
            return
        future, hook = self._pending.popleft()
        if message is not None:
            # basic.get-ok: the delivery belongs to the connection it arrived on, so it
            # gets that connection's epoch and tag numbering now; the connection may end
            # (and a new epoch start) before the caller runs again.
            self._link.tags.stamp(message, self._owner)
        if hook is not None:
            try:
                hook(method)
            except Exception:
                logger.exception(
                    "channel %s: handling %s failed", self._link.channel_id, method.NAME
                )
        if not future.done():
            future.set_result(message if message is not None else method)

    def fail_all(self, exc: AMQPError) -> None:
        """Fail every request waiting for its reply with ``exc``.

        Args:
            exc: why; each waiter gets a copy of its own.
        """
        pending, self._pending = self._pending, deque()
        for future, _ in pending:
            if not future.done():
                # A fresh instance per waiter: one exception object raised in several
                # tasks would collect all their tracebacks.
                future.set_exception(copy.copy(exc))
