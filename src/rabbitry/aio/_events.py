"""AsyncConnection's events and endings: what the engine does with each protocol event.

:class:`ConnectionEvents` is a base of :class:`~rabbitry.aio.connection.AsyncConnection`:
the dispatch of the protocol's events to channels and callbacks, the heartbeat tick,
read back-pressure, the state changes of recovery, and the ways a connection ends
(closed by either side, close-ok overdue, recovery given up). :class:`ReadFlow` and
:class:`LoopHooks` are what the connection hands the library's own collaborators: its
consumers, and the thread-safe API's IO thread; :class:`RecoveryPort` is how the
recovery started when the connection drops drives it.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable
from functools import cached_property
from typing import TYPE_CHECKING, Any, NamedTuple

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
from ._recovery import Recovery
from .channel import pipe_of

if TYPE_CHECKING:
    from ..config import ConnectionParameters
    from ..protocol.channel import ChannelProtocol
    from ..publishing.pipe import WritePath
    from ..record import TopologyRecord
    from ._lifecycle import ChannelEvents
    from .channel import AsyncChannel

__all__ = ["ConnectionEvents", "LoopHooks", "ReadFlow", "RecoveryPort"]

logger = logging.getLogger("rabbitry.connection")

#: How long close() waits for connection.close-ok by default.
CLOSE_TIMEOUT = 10.0

BlockedCallback = Callable[[str | None], Any]
CloseCallback = Callable[[AMQPError], Any]


class ReadFlow:
    """Back-pressure on a connection's socket reads, for the library's consumers; not
    for applications.

    A consumer whose queue of deliveries is full (a channel's coroutine consumer,
    :class:`rabbitry.AsyncConsumer`, the thread-safe API's callback dispatcher) calls
    ``pause()``, and ``resume()`` once that queue has drained enough: on the loop thread,
    one ``resume()`` for each ``pause()``. Pauses are counted, and the socket is read
    again when the last one is released. Deliveries already read in the same chunk wait
    too, so a full queue grows by at most the message that filled it; a pause still held
    when the connection reconnects keeps the new socket unread.

    A pause never holds back a reply somebody waits for: while a channel of the
    connection waits for the answer to a request, or for the confirms of its publishes,
    the socket is read (and the full queues grow for that long); reading stops again
    once nothing is awaited. A handler that declares, gets or publishes with confirms on
    its own connection therefore never waits for ever behind its own full queue.

    Get it from the connection's ``read_flow``. Its members are the connection's own
    bound methods: calling one costs what calling the connection would.
    """

    __slots__ = ("pause", "recheck", "resume")

    def __init__(self, connection: ConnectionEvents) -> None:
        self.pause: Callable[[], None] = connection._pause_reading
        self.resume: Callable[[], None] = connection._resume_reading
        #: A channel now waits for a reply (it sent a request): read again if paused.
        self.recheck: Callable[[], None] = connection._update_reading


class LoopHooks(NamedTuple):
    """What code that runs a connection's event loop on a thread of its own (the
    thread-safe API's IO thread) calls on that thread; not for applications.

    Get them with :func:`rabbitry.aio.connection.loop_hooks`. They are the connection's
    own bound methods: calling one costs what calling the connection would.

    Attributes:
        begin_batch: cork writes: what is queued until ``end_batch()`` leaves in one
            write (around a run of several queued operations).
        end_batch: write what was queued since ``begin_batch()``; later frames leave
            at once.
        abort: end the connection now with the given error, without waiting for the
            broker, for a loop about to stop: every future the connection holds fails
            with it, the close callbacks run and the socket is dropped.
    """

    begin_batch: Callable[[], None]
    end_batch: Callable[[], None]
    abort: Callable[[AMQPError], None]


class ConnectionEvents:
    """Event dispatch, recovery state and endings of :class:`AsyncConnection`."""

    params: ConnectionParameters
    _candidates: list[ConnectionParameters]
    recovery: RecoveryPolicy | None
    close_exc: AMQPError | None
    topology_record: TopologyRecord
    _loop: asyncio.AbstractEventLoop | None
    _proto: ConnectionProtocol | None
    _transport: asyncio.Transport | None
    _writes: WritePath
    # The hooks of every open channel (and of the suspended ones), by channel number.
    _channels: dict[int, ChannelEvents[AsyncChannel]]
    _opened: asyncio.Future[None] | None
    _terminated: asyncio.Future[AMQPError] | None
    _flush_handle: asyncio.Handle | None
    _tick_handle: asyncio.TimerHandle | None
    _close_deadline: asyncio.TimerHandle | None
    _read_pauses: int
    # Whether the transport is paused now: _read_pauses > 0 and no reply is awaited.
    _reading_paused: bool
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

        async def _connect_one(self, params: ConnectionParameters) -> None: ...

        async def _open_channel(
            self,
            channel_id: int | None,
            timeout: float | None,
            *,
            record: bool = True,
            internal: bool = False,
        ) -> AsyncChannel: ...

    @cached_property
    def read_flow(self) -> ReadFlow:
        """The back-pressure on this connection's socket reads, for the library's
        consumers (see :class:`ReadFlow`); not for applications."""
        return ReadFlow(self)

    def _pause_reading(self) -> None:
        """Stop reading the socket: a consumer's queue is full (loop thread).

        Pauses are counted (the sync dispatcher and every full consumer queue each hold
        one); reading resumes when the last is released by :meth:`_resume_reading`.
        Deliveries already read in the same chunk are held back too (see
        :meth:`_handle_events`), so a queue grows by at most the message that filled it.
        While a reply is awaited the socket is read anyway (:meth:`_update_reading`).
        """
        self._read_pauses += 1
        if not self._reading_paused:
            self._update_reading()

    def _resume_reading(self) -> None:
        """Release one :meth:`_pause_reading` (loop thread)."""
        if not self._read_pauses:
            return
        self._read_pauses -= 1
        if not self._read_pauses:
            self._update_reading()

    def _update_reading(self) -> None:
        """Pause or resume the transport's reading (loop thread).

        Paused while some consumer holds a pause and no channel waits for a reply (the
        answer to a request, or confirms); a reply somebody waits for is always read.
        """
        hold = bool(self._read_pauses) and not any(
            hooks.awaits_reply() for hooks in self._channels.values()
        )
        if hold is self._reading_paused:
            return
        transport, proto = self._transport, self._proto
        if transport is None or proto is None:
            return  # the next socket starts from _read_pauses (_on_connection_made)
        self._reading_paused = proto.rx_paused = hold
        if hold:
            transport.pause_reading()
            return
        if self._held_events and self._loop is not None:
            self._loop.call_soon(self._release_held)
        transport.resume_reading()

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
        to ``CLOSE_TIMEOUT``) for the broker's close-ok.
        """
        assert self._loop is not None
        self._close_deadline = self._loop.call_later(CLOSE_TIMEOUT, self._close_overdue)
        proto = self._proto
        if proto is not None and proto.close_exc is not None:
            self._fail_all_pending(proto.close_exc)

    def _fail_all_pending(self, exc: AMQPError) -> None:
        """The connection is closing: fail every channel's waiting calls and confirms.

        Publishes kept for a resend after recovery stay kept (the close may still turn
        out recoverable); the channels themselves end when the connection does.
        """
        for hooks in list(self._channels.values()):
            pipe_of(hooks.channel).fail_pending(exc, keep_resendable=True)
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
                if (
                    self._reading_paused
                    and proto is not None
                    and proto.state is ConnectionState.OPEN
                ):
                    # A consumer's queue just filled: the rest of this chunk waits as
                    # if it had not been read yet (released with the last pause).
                    rest = events[index + 1 :]
                    if rest:
                        self._held_events = rest + self._held_events
                    return
            elif kind is PublishConfirmed:
                assert isinstance(event, PublishConfirmed)
                hooks = channels.get(event.channel)
                if hooks is not None:
                    hooks.on_confirm(event.delivery_tag, event.multiple, event.ack)
            elif kind is RpcReply:
                assert isinstance(event, RpcReply)
                if event.channel == 0:
                    waiter = self._update_secret_waiter
                    self._update_secret_waiter = None
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

    def consumer_cancelled(self, queue: str) -> None:
        """Tell the connection that a consumer of ``queue`` was cancelled, or forgotten
        while the channel was closed or suspended (a channel calls it; not for
        applications).

        If it was the last consumer of ``queue`` on this connection and the topology
        record holds ``queue`` as auto-delete, the broker has deleted the queue: the
        record forgets it, so recovery does not declare it again.

        Args:
            queue: the queue the consumer consumed from.
        """
        recorded = self.topology_record.queue(queue)
        if recorded is None or not recorded.auto_delete:
            return
        for hooks in self._channels.values():
            if any(method.queue == queue for method in hooks.consumer_specs()):
                return
        logger.debug("auto-delete queue %r lost its last consumer: forgotten", queue)
        self.topology_record.forget_queue(queue)

    def _forget_channel(self, channel_id: int) -> None:
        """A channel ended on its own (e.g. closed while the connection was down)."""
        self._channels.pop(channel_id, None)

    def _on_dropped(self, exc: AMQPError) -> None:
        """The connection died for a recoverable reason; its channels are suspended."""
        self._held_events = []  # unacked deliveries: the broker requeues them
        self._cancel_timers()
        transport = self._transport
        self._transport = None
        if transport is not None:
            transport.abort()
        self._resume_writing()
        waiter = self._update_secret_waiter
        self._update_secret_waiter = None
        if waiter is not None and not waiter.done():
            waiter.set_exception(exc)
        if self._opened is not None and not self._opened.done():
            self._opened.set_exception(exc)  # an attempt during recovery failed
        self.close_exc = exc
        if self._state is State.RECOVERING:
            return  # the recovery loop sees the failure and tries again
        logger.warning("connection to %s lost (%r); recovering", self.params.address, exc)
        assert self._recovered is not None and self._loop is not None
        self._recovered.clear()
        self._set_state(State.RECOVERING, exc)
        assert self.recovery is not None
        port = RecoveryPort(self, self._connect_one, self._open_channel)
        recovery = Recovery(port, self.recovery)
        self._recovery_task = self._loop.create_task(recovery.run(exc))

    def _reset_attempt(self) -> None:
        """Forget the current connection attempt: its socket, protocol and timers."""
        if self._transport is not None:
            self._transport.abort()
        self._transport = None
        self._writes.paused = False  # its loss is not reported: no drain will come
        self._proto = None
        self._cancel_timers()

    async def _stop_recovery(self, exc: AMQPError) -> None:
        task = self._recovery_task
        if task is not None and not task.done():
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)
        self._reset_attempt()
        self._finish_closed(exc)

    def _finish_closed(self, exc: AMQPError) -> None:
        self.close_exc = exc
        for hooks in list(self._channels.values()):
            hooks.on_closed(exc)
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
        for hooks in list(self._channels.values()):
            hooks.on_closed(exc)
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


class RecoveryPort:
    """The connection as its :class:`~rabbitry.aio._recovery.Recovery` drives it.

    For the library's own use. The connection creates one per outage, when it drops for
    a reason worth retrying (``ConnectionEvents._on_dropped``), and hands it to the
    recovery it starts: the recovery reconnects, re-opens the channels, reports what it
    could not restore and ends the outage only through these members.

    Args:
        connection: the connection that dropped.
        connect: its attempt to connect to one address (raises what failed).
        open_channel: its way to open a channel, as ``AsyncConnection._open_channel``.
    """

    def __init__(
        self,
        connection: ConnectionEvents,
        connect: Callable[[ConnectionParameters], Awaitable[None]],
        open_channel: Callable[..., Awaitable[AsyncChannel]],
    ) -> None:
        self._conn = connection
        self._connect = connect
        self._open_channel = open_channel

    @property
    def closing(self) -> bool:
        """``close()`` was called: recovery stops."""
        return self._conn._closing

    @property
    def params(self) -> ConnectionParameters:
        """The address connected last: the one that failed, until a reconnect works."""
        return self._conn.params

    @property
    def is_open(self) -> bool:
        """The connection of the current attempt is open."""
        proto = self._conn._proto
        return proto is not None and proto.is_open

    @property
    def close_exc(self) -> AMQPError | None:
        """Why the connection (or the last attempt) ended."""
        return self._conn.close_exc

    @property
    def topology_record(self) -> TopologyRecord:
        """What the channels and ``Topology.apply`` declared: recovery declares it again."""
        return self._conn.topology_record

    def candidates(self) -> list[ConnectionParameters]:
        """The configured addresses, in their configured order (a new list)."""
        return list(self._conn._candidates)

    async def connect(self, params: ConnectionParameters) -> None:
        """Connect to ``params``, which becomes :attr:`params`.

        Args:
            params: the address to connect to.

        Raises:
            AMQPError: the connection failed (``OSError`` and ``TimeoutError`` too);
                the attempt is forgotten before the error propagates.
        """
        try:
            await self._connect(params)
        except (AMQPError, OSError, TimeoutError):
            self._conn._reset_attempt()
            raise
        self._conn.params = params

    def end_attempt(self, reason: AMQPError | None = None) -> None:
        """Forget the current attempt: its socket, its protocol object and its timers.

        Args:
            reason: if given and the attempt's connection is still open, it is aborted
                with ``reason`` first, and what that causes is handled (its channels
                are suspended again).
        """
        conn = self._conn
        proto = conn._proto
        if reason is not None and proto is not None and proto.state is ConnectionState.OPEN:
            proto.abort(reason)
            conn._handle_events(proto.events_received())
        conn._reset_attempt()

    def channels(self) -> list[ChannelEvents[AsyncChannel]]:
        """The hooks of the connection's channels (open or suspended), by channel number."""
        channels = self._conn._channels
        return [channels[number] for number in sorted(channels)]

    def reopen(self, channel_id: int) -> ChannelProtocol:
        """Open channel ``channel_id`` on the new connection (channel.open is queued).

        Args:
            channel_id: the number the channel had.

        Returns:
            The channel's new protocol object (for ``ChannelEvents.resume``).
        """
        proto = self._conn._proto
        assert proto is not None
        return proto.open_channel(channel_id)

    async def open_channel(self, timeout: float) -> AsyncChannel:
        """Open a channel for recovery's own requests.

        It records nothing for recovery, and is closed, not suspended, if the
        connection drops again.

        Args:
            timeout: seconds to wait for channel.open-ok.

        Returns:
            The open channel.
        """
        channel: AsyncChannel = await self._open_channel(None, timeout, record=False, internal=True)
        return channel

    def report(self, kind: str, name: str, exc: AMQPError) -> None:
        """Tell the ``on_recovery_error`` callbacks that something was not restored.

        Args:
            kind: what it is: ``"exchange"``, ``"queue"``, ``"binding"``,
                ``"consumer"``, ``"channel"`` or ``"connection"``.
            name: which one.
            exc: why.
        """
        for callback in list(self._conn._recovery_error_callbacks):
            try:
                callback(kind, name, exc)
            except Exception:
                logger.exception("recovery error callback %r failed", callback)

    def renamed(self, old: str, new: str) -> None:
        """Tell the ``on_queue_renamed`` callbacks that a server-named queue was renamed.

        Args:
            old: its name before the connection dropped.
            new: the name the broker gave it now.
        """
        for callback in list(self._conn._rename_callbacks):
            try:
                callback(old, new)
            except Exception:
                logger.exception("rename callback %r failed", callback)

    def recovered(self) -> None:
        """Recovery reconnected and replayed: the connection is OPEN again."""
        conn = self._conn
        assert conn._recovered is not None
        conn._set_state(State.OPEN, None)
        conn._recovered.set()

    def give_up(self, exc: AMQPError) -> None:
        """Recovery failed for good: end the connection with ``exc``.

        Logged at ERROR and reported to the ``on_recovery_error`` callbacks as
        ``("connection", address, exc)``.

        Args:
            exc: why recovery gave up.
        """
        address = self._conn.params.address
        logger.error("giving up recovering the connection to %s: %r", address, exc)
        self.report("connection", address, exc)
        self._conn._finish_closed(exc)
