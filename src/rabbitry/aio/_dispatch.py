"""AsyncConnection's event dispatch: what the engine does with each protocol event.

:class:`EventDispatcher` hands the events of the sans-IO connection to the channels
(deliveries, confirms, replies, returns, cancels, flow, closes), to the connection's
own waiter of update-secret-ok and blocked callbacks, and the connection-level ones
(opened, ended) to the connection's lifecycle through :class:`Ends`.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, Protocol

from ..exceptions import Timeout
from ..protocol.connection import ConnectionState
from ..protocol.events import (
    ChannelClosedEvent,
    ConnectionBlocked,
    ConnectionOpened,
    ConnectionTerminated,
    ConnectionUnblocked,
    ConsumerCancelledByBroker,
    Delivery,
    Event,
    FlowChanged,
    PublishConfirmed,
    Returned,
    RpcReply,
)
from .channel import pipe_of

if TYPE_CHECKING:
    from ..exceptions import AMQPError
    from ._lifecycle import ChannelEvents
    from ._socket import SocketIO
    from ._timers import Timers
    from .channel import AsyncChannel

__all__ = ["BlockedCallback", "Ends", "EventDispatcher"]

logger = logging.getLogger("rabbitry.connection")

BlockedCallback = Callable[[str | None], Any]


class Ends(Protocol):
    """What :class:`EventDispatcher` tells the connection's lifecycle."""

    def dropped_cause(self, events: list[Event]) -> AMQPError | None:
        """The protocol object is closed: the error of the ``ConnectionTerminated``
        among ``events`` if the connection will be recovered (its channels are then
        suspended, not closed), else ``None``."""

    def on_opened(self) -> None:
        """connection.open-ok arrived."""

    def on_dropped(self, exc: AMQPError) -> None:
        """The connection died for a recoverable reason; its channels are suspended."""

    def on_terminated(self, exc: AMQPError) -> None:
        """The connection ended for good (or a connection attempt failed)."""


class EventDispatcher:
    """Hands each event of the sans-IO connection to its channel, waiter or callback.

    Args:
        io: the connection's socket side (its protocol object and read back-pressure).
        timers: the connection's timers (the close-ok deadline).
        channels: the hooks of every open channel (and of the suspended ones), by
            channel number.
    """

    def __init__(
        self,
        io: SocketIO,
        timers: Timers,
        channels: dict[int, ChannelEvents[AsyncChannel]],
    ) -> None:
        self._io = io
        self._timers = timers
        #: The connection's lifecycle (opened, dropped, terminated; set by the connection).
        self.ends: Ends
        self.channels = channels
        #: The waiter of connection.update-secret-ok, while one is awaited.
        self.update_secret_waiter: asyncio.Future[None] | None = None
        self.blocked_callbacks: list[BlockedCallback] = []

    def protocol_closing(self) -> None:
        """The protocol object is CLOSING (it found a violation): bound the wait."""
        self._timers.arm_close_deadline()

    def fail_all_pending(self, exc: AMQPError) -> None:
        """The connection is closing: fail every channel's waiting calls and confirms.

        Publishes kept for a resend after recovery stay kept (the close may still turn
        out recoverable); the channels themselves end when the connection does.
        """
        for hooks in list(self.channels.values()):
            pipe_of(hooks.channel).fail_pending(exc, keep_resendable=True)
        self.fail_update_secret(exc)

    def fail_update_secret(self, exc: AMQPError) -> None:
        """Fail the waiter of update-secret-ok, if any, with ``exc``."""
        waiter = self.update_secret_waiter
        self.update_secret_waiter = None
        if waiter is not None and not waiter.done():
            waiter.set_exception(exc)

    def close_channels(self, exc: AMQPError) -> None:
        """End every channel with ``exc`` and forget them."""
        for hooks in list(self.channels.values()):
            hooks.on_closed(exc)
        self.channels.clear()

    def consumes(self, queue: str) -> bool:
        """Whether a consumer of one of the channels consumes from ``queue``."""
        for hooks in self.channels.values():
            if any(method.queue == queue for method in hooks.consumer_specs()):
                return True
        return False

    async def await_update_secret(self, timeout: float | None) -> None:
        """Wait for the answer to the connection.update-secret just queued.

        Raises:
            Timeout: no update-secret-ok within ``timeout``.
            AMQPConnectionError: the connection ended meanwhile.
        """
        io = self._io
        assert io.loop is not None
        waiter = self.update_secret_waiter = io.loop.create_future()
        io.kick()
        try:
            async with asyncio.timeout(timeout):
                await waiter
        except TimeoutError:
            raise Timeout(f"connection.update-secret got no answer within {timeout} s") from None

    def forget(self, channel_id: int) -> None:
        """A channel ended on its own (e.g. closed while the connection was down)."""
        self.channels.pop(channel_id, None)

    def handle(self, events: list[Event]) -> None:
        """Hand each of ``events`` to its channel, waiter or callback, in order.

        While reading is paused, the events after a delivery are held back (see
        :class:`~rabbitry.aio._socket.ReadFlow`).
        """
        channels = self.channels
        dropped: AMQPError | None = None
        flow = self._io.flow
        proto = self._io.proto
        if proto is None or proto.state is ConnectionState.CLOSED:
            # The connection just ended: if it will be recovered, its channels are
            # suspended (kept for replay) rather than closed.
            dropped = self.ends.dropped_cause(events)
        for index, event in enumerate(events):
            kind = type(event)
            if kind is Delivery:
                assert isinstance(event, Delivery)
                hooks = channels.get(event.channel)
                if hooks is not None:
                    hooks.on_delivery(event.message)
                else:
                    logger.error(
                        "delivery %s on channel %s, which has no channel object: it stays "
                        "unacknowledged until the channel closes",
                        event.message.delivery_tag,
                        event.channel,
                    )
                if flow.paused and proto is not None and proto.state is ConnectionState.OPEN:
                    # A consumer's queue just filled: the rest of this chunk waits as
                    # if it had not been read yet (released with the last pause).
                    rest = events[index + 1 :]
                    if rest:
                        flow.held = rest + flow.held
                    return
            elif kind is PublishConfirmed:
                assert isinstance(event, PublishConfirmed)
                hooks = channels.get(event.channel)
                if hooks is not None:
                    hooks.on_confirm(event.delivery_tag, event.multiple, event.ack)
            elif kind is RpcReply:
                assert isinstance(event, RpcReply)
                if event.channel == 0:
                    waiter = self.update_secret_waiter
                    self.update_secret_waiter = None
                    if waiter is not None and not waiter.done():
                        waiter.set_result(None)
                else:
                    hooks = channels.get(event.channel)
                    if hooks is not None:
                        hooks.on_rpc_reply(event.method, event.message)
            elif kind is Returned:
                assert isinstance(event, Returned)
                hooks = channels.get(event.channel)
                if hooks is not None:
                    hooks.on_return(event.message)
            elif kind is ConsumerCancelledByBroker:
                assert isinstance(event, ConsumerCancelledByBroker)
                hooks = channels.get(event.channel)
                if hooks is not None:
                    hooks.on_consumer_cancelled(event.consumer_tag)
            elif kind is FlowChanged:
                assert isinstance(event, FlowChanged)
                hooks = channels.get(event.channel)
                if hooks is not None:
                    hooks.on_flow(event.active)
            elif kind is ChannelClosedEvent:
                assert isinstance(event, ChannelClosedEvent)
                if dropped is not None and event.exc is dropped:
                    hooks = channels.get(event.channel)
                    if hooks is not None:
                        hooks.suspend(event.exc)
                    continue
                hooks = channels.pop(event.channel, None)
                if hooks is not None:
                    hooks.on_closed(event.exc)
            elif kind is ConnectionOpened:
                self.ends.on_opened()
            elif kind is ConnectionBlocked:
                assert isinstance(event, ConnectionBlocked)
                self._notify_blocked(event.reason)
            elif kind is ConnectionUnblocked:
                self._notify_blocked(None)
            elif kind is ConnectionTerminated:
                assert isinstance(event, ConnectionTerminated)
                if dropped is not None and event.exc is dropped:
                    self.ends.on_dropped(event.exc)
                else:
                    self.ends.on_terminated(event.exc)

    def _notify_blocked(self, reason: str | None) -> None:
        if reason is None:
            logger.info("connection unblocked by the broker")
        else:
            logger.warning("connection blocked by the broker: %s", reason)
        for callback in list(self.blocked_callbacks):
            try:
                callback(reason)
            except Exception:
                logger.exception("blocked callback %r failed", callback)
