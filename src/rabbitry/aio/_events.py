"""AsyncConnection's events and endings: what the engine does with each protocol event.

:class:`ConnectionEvents` is a base of :class:`~rabbitry.aio.connection.AsyncConnection`:
the dispatch of the protocol's events to channels and callbacks, the heartbeat tick,
read back-pressure, the state changes of recovery, and the ways a connection ends
(closed by either side, close-ok overdue, recovery given up).
"""

from __future__ import annotations

import asyncio
import logging
import ssl
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from ..exceptions import (
    AMQPConnectionError,
    AMQPError,
    ConnectionClosedByClient,
)
from ..protocol.connection import ConnectionProtocol, ConnectionState
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
from ..recovery import RecoveryPolicy, State, is_recoverable
from .channel import pipe_of

if TYPE_CHECKING:
    from ..config import ConnectionParameters
    from ..record import TopologyRecord
    from .channel import AsyncChannel

__all__ = ["ConnectionEvents"]

logger = logging.getLogger("rabbitry.connection")

#: How long close() waits for connection.close-ok by default.
_CLOSE_TIMEOUT = 10.0

BlockedCallback = Callable[[str | None], Any]
CloseCallback = Callable[[AMQPError], Any]


class ConnectionEvents:
    """Event dispatch, recovery state and endings of :class:`AsyncConnection`."""

    params: ConnectionParameters
    recovery: RecoveryPolicy | None
    close_exc: AMQPError | None
    topology_record: TopologyRecord
    _loop: asyncio.AbstractEventLoop | None
    _proto: ConnectionProtocol | None
    _transport: asyncio.Transport | None
    _lost: asyncio.Future[None] | None
    _handshake_tls_error: ssl.SSLError | None
    _channels: dict[int, AsyncChannel]
    _opened: asyncio.Future[None] | None
    _terminated: asyncio.Future[AMQPError] | None
    _flush_handle: asyncio.Handle | None
    _tick_handle: asyncio.TimerHandle | None
    _close_deadline: asyncio.TimerHandle | None
    _read_pauses: int
    _held_events: list[Event]
    _update_secret_waiter: asyncio.Future[None] | None
    _blocked_callbacks: list[BlockedCallback]
    _close_callbacks: list[CloseCallback]
    _state: State
    _closing: bool
    _recovered: asyncio.Event | None
    _recovery_task: asyncio.Task[None] | None
    _state_callbacks: list[Callable[[State, AMQPError | None], Any]]
    _rename_callbacks: list[Callable[[str, str], Any]]
    _recovery_error_callbacks: list[Callable[[str, str, AMQPError], Any]]

    if TYPE_CHECKING:

        def _flush(self) -> None: ...

        def _resume_writing(self) -> None: ...

        def _reset_attempt(self) -> None: ...

        def _on_dropped(self, exc: AMQPError) -> None: ...

    def _on_connection_made(self, transport: asyncio.Transport) -> None:
        self._transport = transport
        self._held_events = []  # deliveries of an earlier socket: the broker requeued them
        if self._read_pauses and self._proto is not None:
            # A consumer queue is still full from before a reconnect.
            self._proto.rx_paused = True
            transport.pause_reading()
        self._flush()  # the protocol header

    def _on_connection_lost(self, exc: Exception | None) -> None:
        proto = self._proto
        self._transport = None
        self._resume_writing()
        if proto is not None:
            proto.receive_eof()
            self._handle_events(proto.events_received())
        if self._lost is not None and not self._lost.done():
            self._lost.set_result(None)
        if exc is not None:
            logger.debug("socket closed: %r", exc)
            if isinstance(exc, ssl.SSLError) and self._opened is not None:
                if not self._opened.done() or self._opened.exception() is not None:
                    self._handshake_tls_error = exc

    def _pause_reading(self) -> None:
        """Stop reading the socket: a consumer's queue is full (loop thread).

        Pauses are counted (the sync dispatcher and every full consumer queue each hold
        one); reading resumes when the last is released by :meth:`_resume_reading`.
        Deliveries already read in the same chunk are held back too (see
        :meth:`_handle_events`), so a queue grows by at most the message that filled it.
        """
        self._read_pauses += 1
        if self._read_pauses == 1 and self._transport is not None and self._proto is not None:
            self._proto.rx_paused = True
            self._transport.pause_reading()

    def _resume_reading(self) -> None:
        """Release one :meth:`_pause_reading` (loop thread)."""
        if not self._read_pauses:
            return
        self._read_pauses -= 1
        if self._read_pauses:
            return
        if self._held_events and self._loop is not None:
            self._loop.call_soon(self._release_held)
        if self._transport is not None and self._proto is not None:
            self._proto.rx_paused = False
            self._transport.resume_reading()

    def _release_held(self) -> None:
        """Handle the events held back while reading was paused (in order)."""
        events, self._held_events = self._held_events, []
        if events:
            self._handle_events(events)

    def _on_tick(self) -> None:
        self._tick_handle = None
        proto = self._proto
        loop = self._loop
        if proto is None or loop is None:
            return
        proto.tick(loop.time())
        self._flush()
        self._handle_events(proto.events_received())
        interval = proto.tick_interval
        if interval and proto.state is not ConnectionState.CLOSED:
            self._tick_handle = loop.call_later(interval, self._on_tick)

    def _arm_close_deadline(self) -> None:
        """The protocol closes the connection (it found a violation): bound the wait.

        The pending calls fail at once with the violation; only the socket waits (up
        to ``_CLOSE_TIMEOUT``) for the broker's close-ok.
        """
        assert self._loop is not None
        self._close_deadline = self._loop.call_later(_CLOSE_TIMEOUT, self._close_overdue)
        proto = self._proto
        if proto is not None and proto.close_exc is not None:
            self._fail_all_pending(proto.close_exc)

    def _fail_all_pending(self, exc: AMQPError) -> None:
        """The connection is closing: fail every channel's waiting calls and confirms.

        Publishes kept for a resend after recovery stay kept (the close may still turn
        out recoverable); the channels themselves end when the connection does.
        """
        for channel in list(self._channels.values()):
            pipe_of(channel).fail_pending(exc, keep_resendable=True)
        waiter = self._update_secret_waiter
        self._update_secret_waiter = None
        if waiter is not None and not waiter.done():
            waiter.set_exception(exc)

    def _close_overdue(self) -> None:
        proto = self._proto
        if proto is not None and proto.state is ConnectionState.CLOSING:
            assert proto.close_exc is not None
            proto.abort(proto.close_exc)
            self._handle_events(proto.events_received())

    def _cancel_timers(self) -> None:
        if self._close_deadline is not None:
            self._close_deadline.cancel()
            self._close_deadline = None
        if self._tick_handle is not None:
            self._tick_handle.cancel()
            self._tick_handle = None
        if self._flush_handle is not None:
            self._flush_handle.cancel()
            self._flush_handle = None

    def _handle_events(self, events: list[Event]) -> None:
        channels = self._channels
        dropped: AMQPError | None = None
        proto = self._proto
        if (
            self.recovery is not None
            and not self._closing
            and (proto is None or proto.state is ConnectionState.CLOSED)
        ):
            # The connection just ended: if it will be recovered, its channels are
            # suspended (kept for replay) rather than closed.
            for event in events:
                if type(event) is ConnectionTerminated:
                    assert isinstance(event, ConnectionTerminated)
                    if self._state is State.RECOVERING or (
                        self._state is State.OPEN and is_recoverable(event.exc)
                    ):
                        dropped = event.exc
        for index, event in enumerate(events):
            kind = type(event)
            if kind is Delivery:
                assert isinstance(event, Delivery)
                channel = channels.get(event.channel)
                if channel is not None:
                    channel._on_delivery(event.message)
                else:
                    logger.error(
                        "delivery %s on channel %s, which has no channel object: it stays "
                        "unacknowledged until the channel closes",
                        event.message.delivery_tag,
                        event.channel,
                    )
                if self._read_pauses and proto is not None and proto.state is ConnectionState.OPEN:
                    # A consumer's queue just filled: the rest of this chunk waits as
                    # if it had not been read yet (released with the last pause).
                    rest = events[index + 1 :]
                    if rest:
                        self._held_events = rest + self._held_events
                    return
            elif kind is PublishConfirmed:
                assert isinstance(event, PublishConfirmed)
                channel = channels.get(event.channel)
                if channel is not None:
                    channel._on_confirm(event.delivery_tag, event.multiple, event.ack)
            elif kind is RpcReply:
                assert isinstance(event, RpcReply)
                if event.channel == 0:
                    waiter = self._update_secret_waiter
                    self._update_secret_waiter = None
                    if waiter is not None and not waiter.done():
                        waiter.set_result(None)
                else:
                    channel = channels.get(event.channel)
                    if channel is not None:
                        channel._on_rpc_reply(event.method, event.message)
            elif kind is Returned:
                assert isinstance(event, Returned)
                channel = channels.get(event.channel)
                if channel is not None:
                    channel._on_return(event.message)
            elif kind is ConsumerCancelledByBroker:
                assert isinstance(event, ConsumerCancelledByBroker)
                channel = channels.get(event.channel)
                if channel is not None:
                    channel._on_consumer_cancelled(event.consumer_tag)
            elif kind is FlowChanged:
                assert isinstance(event, FlowChanged)
                channel = channels.get(event.channel)
                if channel is not None:
                    channel._on_flow(event.active)
            elif kind is ChannelClosedEvent:
                assert isinstance(event, ChannelClosedEvent)
                if dropped is not None and event.exc is dropped:
                    channel = channels.get(event.channel)
                    if channel is not None:
                        channel._suspend(event.exc)
                    continue
                channel = channels.pop(event.channel, None)
                if channel is not None:
                    channel._on_closed(event.exc)
            elif kind is ConnectionOpened:
                self._on_opened()
            elif kind is ConnectionBlocked:
                assert isinstance(event, ConnectionBlocked)
                self._notify_blocked(event.reason)
            elif kind is ConnectionUnblocked:
                self._notify_blocked(None)
            elif kind is ConnectionTerminated:
                assert isinstance(event, ConnectionTerminated)
                if dropped is not None and event.exc is dropped:
                    self._on_dropped(event.exc)
                else:
                    self._on_terminated(event.exc)

    def _set_state(self, state: State, cause: AMQPError | None) -> None:
        if state is self._state:
            return
        self._state = state
        for callback in list(self._state_callbacks):
            try:
                callback(state, cause)
            except Exception:
                logger.exception("state callback %r failed", callback)

    def _forget_if_auto_deleted(self, queue: str) -> None:
        """A consumer of ``queue`` was cancelled: if it was the last one on this
        connection and the record holds ``queue`` as auto-delete, the broker has deleted
        the queue, so recovery must not declare it again."""
        recorded = self.topology_record.queue(queue)
        if recorded is None or not recorded.auto_delete:
            return
        for channel in self._channels.values():
            for consumer in channel._consumers.values():
                if consumer.spec is not None and consumer.spec.queue == queue:
                    return
        logger.debug("auto-delete queue %r lost its last consumer: forgotten", queue)
        self.topology_record.forget_queue(queue)

    def _recovery_done(self) -> None:
        """Recovery reconnected and replayed: the connection is OPEN again."""
        assert self._recovered is not None
        self._set_state(State.OPEN, None)
        self._recovered.set()

    def _notify_recovery_error(self, kind: str, name: str, exc: AMQPError) -> None:
        for callback in list(self._recovery_error_callbacks):
            try:
                callback(kind, name, exc)
            except Exception:
                logger.exception("recovery error callback %r failed", callback)

    def _notify_renamed(self, old: str, new: str) -> None:
        for callback in list(self._rename_callbacks):
            try:
                callback(old, new)
            except Exception:
                logger.exception("rename callback %r failed", callback)

    def _give_up(self, exc: AMQPError) -> None:
        """Recovery failed for good: end the connection with ``exc``."""
        logger.error("giving up recovering the connection to %s: %r", self.params.address, exc)
        self._notify_recovery_error("connection", self.params.address, exc)
        self._finish_closed(exc)

    async def _stop_recovery(self, exc: AMQPError) -> None:
        task = self._recovery_task
        if task is not None and not task.done():
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)
        self._reset_attempt()
        self._finish_closed(exc)

    def _finish_closed(self, exc: AMQPError) -> None:
        self.close_exc = exc
        for channel in list(self._channels.values()):
            channel._on_closed(exc)
        self._channels.clear()
        if self._terminated is not None and not self._terminated.done():
            self._terminated.set_result(exc)
        self._set_state(State.CLOSED, exc)
        if self._recovered is not None:
            self._recovered.set()
        for callback in list(self._close_callbacks):
            try:
                callback(exc)
            except Exception:
                logger.exception("close callback %r failed", callback)

    def _on_opened(self) -> None:
        if self._opened is not None and not self._opened.done():
            self._opened.set_result(None)
        proto = self._proto
        if proto is not None and proto.tick_interval and self._loop is not None:
            proto.tick(self._loop.time())
            self._tick_handle = self._loop.call_later(proto.tick_interval, self._on_tick)

    def _notify_blocked(self, reason: str | None) -> None:
        if reason is None:
            logger.info("connection unblocked by the broker")
        else:
            logger.warning("connection blocked by the broker: %s", reason)
        for callback in list(self._blocked_callbacks):
            try:
                callback(reason)
            except Exception:
                logger.exception("blocked callback %r failed", callback)

    def _on_terminated(self, exc: AMQPError) -> None:
        self.close_exc = exc
        self._held_events = []  # deliveries of closed channels: the broker requeues them
        if self._state is State.OPEN:
            self._set_state(State.CLOSED, exc)
        if self._recovered is not None:
            self._recovered.set()
        self._cancel_timers()
        self._flush()  # e.g. the close-ok answering the broker's close
        transport = self._transport
        if transport is not None:
            if isinstance(exc, AMQPConnectionError) and not isinstance(
                exc, ConnectionClosedByClient
            ):
                transport.abort()
            else:
                transport.close()
        for channel in list(self._channels.values()):
            channel._on_closed(exc)
        self._channels.clear()
        self._resume_writing()
        waiter = self._update_secret_waiter
        self._update_secret_waiter = None
        if waiter is not None and not waiter.done():
            waiter.set_exception(exc)
        if self._terminated is not None and not self._terminated.done():
            self._terminated.set_result(exc)
        opened = self._opened
        was_open = (
            opened is not None
            and opened.done()
            and not opened.cancelled()
            and opened.exception() is None
        )
        if opened is not None and not opened.done():
            opened.set_exception(exc)
        if not was_open:
            return  # a failed connection attempt: connect() reports it
        if isinstance(exc, ConnectionClosedByClient):
            logger.debug("connection closed: %s", exc)
        else:
            logger.warning("connection to %s ended: %r", self.params.address, exc)
        for callback in list(self._close_callbacks):
            try:
                callback(exc)
            except Exception:
                logger.exception("close callback %r failed", callback)
