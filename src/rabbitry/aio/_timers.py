"""AsyncConnection's timers: the heartbeat tick and the deadline of close-ok."""

from __future__ import annotations

from typing import TYPE_CHECKING, Protocol

from ..protocol.connection import ConnectionState

if TYPE_CHECKING:
    import asyncio

    from ..exceptions import AMQPError
    from ..protocol.events import Event
    from ._socket import SocketIO

__all__ = ["CLOSE_TIMEOUT", "TimerSink", "Timers"]

#: How long close() waits for connection.close-ok by default.
CLOSE_TIMEOUT = 10.0


class TimerSink(Protocol):
    """What :class:`Timers` tells the connection's dispatcher."""

    def handle(self, events: list[Event]) -> None:
        """Handle the events a tick or an overdue close produced, in order."""

    def fail_all_pending(self, exc: AMQPError) -> None:
        """The connection is closing: fail every waiting call."""


class Timers:
    """Runs a connection's timers: the heartbeat tick of the protocol object, and the
    bound on the wait for close-ok once the protocol closes the connection.

    Args:
        io: the connection's socket side (its protocol object, loop and flush).
    """

    def __init__(self, io: SocketIO) -> None:
        self._io = io
        #: Where the events of a tick go (set by the connection).
        self.sink: TimerSink
        self._tick_handle: asyncio.TimerHandle | None = None
        self._close_deadline: asyncio.TimerHandle | None = None

    def start_heartbeat(self) -> None:
        """The connection opened: tick the protocol object every ``tick_interval``."""
        io = self._io
        proto = io.proto
        if proto is not None and proto.tick_interval and io.loop is not None:
            proto.tick(io.loop.time())
            self._tick_handle = io.loop.call_later(proto.tick_interval, self._on_tick)

    def _on_tick(self) -> None:
        self._tick_handle = None
        io = self._io
        proto = io.proto
        loop = io.loop
        if proto is None or loop is None:
            return
        proto.tick(loop.time())
        io.flush()
        self.sink.handle(proto.events_received())
        interval = proto.tick_interval
        if interval and proto.state is not ConnectionState.CLOSED:
            self._tick_handle = loop.call_later(interval, self._on_tick)

    def arm_close_deadline(self) -> None:
        """The protocol closes the connection (it found a violation): bound the wait.

        The pending calls fail at once with the violation; only the socket waits (up
        to ``CLOSE_TIMEOUT``) for the broker's close-ok. Once per close.
        """
        if self._close_deadline is not None:
            return
        io = self._io
        assert io.loop is not None
        self._close_deadline = io.loop.call_later(CLOSE_TIMEOUT, self._close_overdue)
        proto = io.proto
        if proto is not None and proto.close_exc is not None:
            self.sink.fail_all_pending(proto.close_exc)

    def _close_overdue(self) -> None:
        proto = self._io.proto
        if proto is not None and proto.state is ConnectionState.CLOSING:
            assert proto.close_exc is not None
            proto.abort(proto.close_exc)
            self.sink.handle(proto.events_received())

    def cancel(self) -> None:
        """Cancel every timer, and the socket side's scheduled flush (the attempt ends)."""
        if self._close_deadline is not None:
            self._close_deadline.cancel()
            self._close_deadline = None
        if self._tick_handle is not None:
            self._tick_handle.cancel()
            self._tick_handle = None
        self._io.cancel_flush()
