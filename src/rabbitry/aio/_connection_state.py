"""AsyncConnection's lifecycle: its state, the ways it ends, and recovery's start.

:class:`ConnectionLifecycle` holds the :class:`~rabbitry.recovery.State` of the
connection and its listeners, and handles the endings: closed by either side, dropped
for a reason worth recovering (it starts a :class:`~rabbitry.aio._recovery.Recovery`),
recovery given up, aborted by a loop about to stop. :class:`LoopHooks` is what the
connection hands the thread-safe API's IO thread.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, NamedTuple, Protocol

from ..exceptions import (
    AMQPConnectionError,
    AMQPError,
    ConnectionClosedByClient,
    ConnectionRecovering,
    InvalidStateError,
    Timeout,
)
from ..protocol.connection import ConnectionState
from ..protocol.events import ConnectionTerminated
from ..recovery import RecoveryPolicy, State, is_recoverable
from ._recovery import Port, Recovery
from ._timers import CLOSE_TIMEOUT

if TYPE_CHECKING:
    from ..config import ConnectionParameters
    from ..protocol.events import Event
    from ._dispatch import EventDispatcher
    from ._socket import SocketIO
    from ._timers import Timers

__all__ = ["CloseCallback", "ConnectionLifecycle", "LoopHooks", "Owner"]

logger = logging.getLogger("rabbitry.connection")

CloseCallback = Callable[[AMQPError], Any]


class LoopHooks(NamedTuple):
    """What code that runs a connection's event loop on a thread of its own (the
    thread-safe API's IO thread) calls on that thread; not for applications.

    Get them with :func:`rabbitry.aio.connection.loop_hooks`. They are bound methods of
    the connection's collaborators: calling one costs what calling the connection would.

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


class Owner(Protocol):
    """The public attributes of the connection that its lifecycle reads and sets."""

    params: ConnectionParameters
    close_exc: AMQPError | None
    recovery: RecoveryPolicy | None


class ConnectionLifecycle:
    """Tracks a connection's state from the first attempt to its end, and ends it.

    Args:
        owner: the connection (its address, its close reason, its recovery policy).
        io: its socket side.
        timers: its timers.
        dispatch: its event dispatcher (the channels, the update-secret waiter).
    """

    def __init__(
        self, owner: Owner, io: SocketIO, timers: Timers, dispatch: EventDispatcher
    ) -> None:
        self._owner = owner
        self._io = io
        self._timers = timers
        self._dispatch = dispatch
        #: What recovery drives the connection through (set by the connection).
        self.port: Port
        self.state = State.CONNECTING
        #: ``close()`` (or an abort) was called: no recovery starts or goes on.
        self.closing = False
        #: Set while the connection is not RECOVERING (created on the first connect).
        self.recovered: asyncio.Event | None = None
        self.recovery_task: asyncio.Task[None] | None = None
        #: The current attempt's connection.open-ok.
        self.opened: asyncio.Future[None] | None = None
        #: Why the connection ended, once it has.
        self.terminated: asyncio.Future[AMQPError] | None = None
        self.close_callbacks: list[CloseCallback] = []
        self.state_callbacks: list[Callable[[State, AMQPError | None], Any]] = []
        self.rename_callbacks: list[Callable[[str, str], Any]] = []
        self.recovery_error_callbacks: list[Callable[[str, str, AMQPError], Any]] = []

    @property
    def is_closed(self) -> bool:
        """The connection was opened and is now closed (for any reason)."""
        return self.terminated is not None and self.terminated.done()

    def begin_attempt(self, loop: asyncio.AbstractEventLoop) -> asyncio.Future[None]:
        """A connection attempt starts: its futures.

        Returns:
            The future of its connection.open-ok.
        """
        self.opened = loop.create_future()
        if self.terminated is None or self.terminated.done():
            self.terminated = loop.create_future()
        self._io.lost = loop.create_future()
        if self.state is not State.RECOVERING:
            self._owner.close_exc = None
        return self.opened

    def set_state(self, state: State, cause: AMQPError | None) -> None:
        """Move to ``state`` and tell the state callbacks (if it is a change)."""
        if state is self.state:
            return
        self.state = state
        for callback in list(self.state_callbacks):
            try:
                callback(state, cause)
            except Exception:
                logger.exception("state callback %r failed", callback)

    def dropped_cause(self, events: list[Event]) -> AMQPError | None:
        """The error among ``events`` that ends the connection for recovery to heal,
        or ``None`` (the connection ends for good, or is closing)."""
        dropped: AMQPError | None = None
        if self._owner.recovery is not None and not self.closing:
            for event in events:
                if type(event) is ConnectionTerminated:
                    assert isinstance(event, ConnectionTerminated)
                    if self.state is State.RECOVERING or (
                        self.state is State.OPEN and is_recoverable(event.exc)
                    ):
                        dropped = event.exc
        return dropped

    def on_opened(self) -> None:
        """connection.open-ok arrived: the attempt succeeded, the heartbeat starts."""
        if self.opened is not None and not self.opened.done():
            self.opened.set_result(None)
        self._timers.start_heartbeat()

    def on_dropped(self, exc: AMQPError) -> None:
        """The connection died for a recoverable reason; its channels are suspended."""
        io = self._io
        io.flow.held = []  # unacked deliveries: the broker requeues them
        self._timers.cancel()
        transport = io.transport
        io.transport = None
        if transport is not None:
            transport.abort()
        io.resume_writing()
        self._dispatch.fail_update_secret(exc)
        if self.opened is not None and not self.opened.done():
            self.opened.set_exception(exc)  # an attempt during recovery failed
        owner = self._owner
        owner.close_exc = exc
        if self.state is State.RECOVERING:
            return  # the recovery loop sees the failure and tries again
        logger.warning("connection to %s lost (%r); recovering", owner.params.address, exc)
        assert self.recovered is not None and io.loop is not None
        self.recovered.clear()
        self.set_state(State.RECOVERING, exc)
        assert owner.recovery is not None
        recovery = Recovery(self.port, owner.recovery)
        self.recovery_task = io.loop.create_task(recovery.run(exc))

    def reset_attempt(self) -> None:
        """Forget the current connection attempt: its socket, protocol and timers."""
        io = self._io
        if io.transport is not None:
            io.transport.abort()
        io.transport = None
        io.writes.paused = False  # its loss is not reported: no drain will come
        io.proto = None
        self._timers.cancel()

    async def stop_recovery(self, exc: AMQPError) -> None:
        """``close()`` during recovery: stop it and end the connection with ``exc``."""
        task = self.recovery_task
        if task is not None and not task.done():
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)
        self.reset_attempt()
        self.finish_closed(exc)

    def finish_closed(self, exc: AMQPError) -> None:
        """End the connection with ``exc`` (no socket left): its channels, its waiters,
        the CLOSED state and the close callbacks."""
        self._owner.close_exc = exc
        self._dispatch.close_channels(exc)
        if self.terminated is not None and not self.terminated.done():
            self.terminated.set_result(exc)
        self.set_state(State.CLOSED, exc)
        if self.recovered is not None:
            self.recovered.set()
        self._run_close_callbacks(exc)

    def _run_close_callbacks(self, exc: AMQPError) -> None:
        for callback in list(self.close_callbacks):
            try:
                callback(exc)
            except Exception:
                logger.exception("close callback %r failed", callback)

    def on_terminated(self, exc: AMQPError) -> None:
        """The connection ended for good, or a connection attempt failed."""
        owner, io = self._owner, self._io
        owner.close_exc = exc
        io.flow.held = []  # deliveries of closed channels: the broker requeues them
        if self.state is State.OPEN:
            self.set_state(State.CLOSED, exc)
        if self.recovered is not None:
            self.recovered.set()
        self._timers.cancel()
        io.flush()  # e.g. the close-ok answering the broker's close
        transport = io.transport
        if transport is not None:
            if isinstance(exc, AMQPConnectionError) and not isinstance(
                exc, ConnectionClosedByClient
            ):
                transport.abort()
            else:
                transport.close()
        self._dispatch.close_channels(exc)
        io.resume_writing()
        self._dispatch.fail_update_secret(exc)
        if self.terminated is not None and not self.terminated.done():
            self.terminated.set_result(exc)
        opened = self.opened
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
            logger.warning("connection to %s ended: %r", owner.params.address, exc)
        self._run_close_callbacks(exc)

    def abort(self, exc: AMQPError) -> None:
        """End the connection now, not waiting for the broker (``LoopHooks.abort``)."""
        self.closing = True
        task = self.recovery_task
        if task is not None and not task.done():
            task.cancel()
        io = self._io
        proto = io.proto
        if proto is not None and proto.state is not ConnectionState.CLOSED:
            proto.abort(exc)
            self._dispatch.handle(proto.events_received())
        if not self.is_closed:
            self.reset_attempt()
            self.finish_closed(exc)
        if io.transport is not None:
            # Not close(): a broker that reads nothing (blocked) would keep it open.
            io.transport.abort()

    def connected(self, params: ConnectionParameters) -> None:
        """The first connect succeeded, to ``params``: the connection is OPEN."""
        owner = self._owner
        owner.params = params
        proto = self._io.proto
        if not (proto.heartbeat if proto else 0):
            logger.warning(
                "heartbeats are off on the connection to %s: a dead peer "
                "behind a silent network is only noticed when TCP gives up "
                "(about 11 minutes on Linux), and recovery waits as long",
                params.address,
            )
        self.recovered = asyncio.Event()
        self.recovered.set()
        self.set_state(State.OPEN, None)

    async def close(self, reply_code: int, reply_text: str, timeout: float | None) -> None:
        """Close cleanly (``AsyncConnection.close``): connection.close, wait for
        close-ok (at most ``timeout``, ``None``: ``CLOSE_TIMEOUT``), close the socket."""
        io = self._io
        self.closing = True
        if self.state is State.RECOVERING:
            await self.stop_recovery(ConnectionClosedByClient(reply_code, reply_text))
            return
        proto = io.proto
        terminated = self.terminated
        if proto is None or terminated is None:
            return
        if not terminated.done():
            proto.close(reply_code, reply_text)
            io.flush()
            self._dispatch.handle(proto.events_received())
            if proto.close_exc is not None:
                # Nothing the broker sends from now on but close-ok is read (0-9-1
                # §4.2.2.1): what was pending fails now, not after the close-ok wait.
                self._dispatch.fail_all_pending(proto.close_exc)
            try:
                await asyncio.wait_for(
                    asyncio.shield(terminated),
                    timeout if timeout is not None else CLOSE_TIMEOUT,
                )
            except TimeoutError:
                proto.abort(ConnectionClosedByClient(reply_code, reply_text))
                self._dispatch.handle(proto.events_received())
        if io.transport is not None:
            io.transport.close()
        if io.lost is not None and not io.lost.done():
            try:
                await asyncio.wait_for(asyncio.shield(io.lost), 1.0)
            except TimeoutError:
                if io.transport is not None:
                    io.transport.abort()

    async def wait_recovered(self, timeout: float | None) -> None:
        """Return once the connection is OPEN (``AsyncConnection.wait_recovered``)."""
        try:
            async with asyncio.timeout(timeout):
                # Loop: the connection may drop again between the recovery that woke
                # this waiter and the waiter running; that is a new outage to wait out.
                while self.state is State.RECOVERING:
                    assert self.recovered is not None
                    await self.recovered.wait()
        except TimeoutError:
            raise Timeout(f"still recovering after {timeout} s") from None
        if self.state is not State.OPEN:
            raise InvalidStateError(f"the connection is {self.state.value}") from (
                self._owner.close_exc
            )

    async def await_recovery(self, timeout: float | None, what: str) -> None:
        """An operation met a recovering connection: wait or fail, by policy
        (``WritePath.await_recovery``).

        Raises:
            ConnectionRecovering: the policy says to fail.
            Timeout: still recovering after ``timeout`` seconds.
            InvalidStateError: the connection closed instead.
        """
        if self.state is not State.RECOVERING:
            return
        policy = self._owner.recovery
        assert policy is not None
        if policy.during_recovery == "fail":
            raise ConnectionRecovering(f"cannot {what}: the connection is recovering")
        await self.wait_recovered(timeout)
