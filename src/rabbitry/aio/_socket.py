"""AsyncConnection's socket: bytes in, bytes out.

:class:`SocketIO` is a base of :class:`~rabbitry.aio.connection.AsyncConnection`: what
the connection does when its socket connects, delivers a chunk or goes away (the
:class:`Transport` it connects with forwards those events), and how it writes.

Writes are corked per loop pass: the first frames an API call queues in a pass are
written at once (a round trip costs no extra loop iteration), what follows in the same
pass leaves in one ``write`` from one scheduled flush, and what is queued while a chunk
of the socket is handled leaves in one ``write`` at the end of the chunk. A burst
longer than ``_FLUSH_FRAMES`` frames is flushed at once so memory stays bounded, and
publishers wait while the transport's buffer is above its high-water mark.
"""

from __future__ import annotations

import asyncio
import logging
import ssl
from typing import TYPE_CHECKING, cast

from ..protocol.connection import ConnectionProtocol, ConnectionState

if TYPE_CHECKING:
    from ..protocol.events import Event
    from ..publishing.pipe import WritePath

__all__ = ["SocketIO", "Transport"]

logger = logging.getLogger("rabbitry.connection")

#: Flush at once when this many frames are queued within one loop iteration.
_FLUSH_FRAMES = 256
#: Above this many bytes queued, a flush writes the pieces one by one instead of joining.
_JOIN_BYTES = 1024 * 1024


class Transport(asyncio.Protocol):
    """asyncio glue: forwards socket events to the connection."""

    def __init__(self, connection: SocketIO, proto: ConnectionProtocol) -> None:
        self._connection = connection
        # The protocol object this socket serves: a late event from the socket of an
        # earlier attempt (or of a connection that recovery replaced) must not reach
        # the new one.
        self._proto = proto

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        # Not an isinstance() check: uvloop's transports do not derive from asyncio's.
        stream = cast("asyncio.Transport", transport)
        if self._connection._proto is self._proto:
            self._connection._on_connection_made(stream)
        else:
            stream.abort()

    def data_received(self, data: bytes) -> None:
        if self._connection._proto is self._proto:
            self._connection._on_data(data)

    def eof_received(self) -> bool:
        return False  # let the transport close; connection_lost follows

    def connection_lost(self, exc: Exception | None) -> None:
        if self._connection._proto is self._proto:
            self._connection._on_connection_lost(exc)

    def pause_writing(self) -> None:
        self._connection._writes.paused = True

    def resume_writing(self) -> None:
        self._connection._resume_writing()


class SocketIO:
    """The socket side of :class:`~rabbitry.aio.connection.AsyncConnection`."""

    _loop: asyncio.AbstractEventLoop | None
    _proto: ConnectionProtocol | None
    _transport: asyncio.Transport | None
    _opened: asyncio.Future[None] | None
    _lost: asyncio.Future[None] | None
    _flush_handle: asyncio.Handle | None
    _close_deadline: asyncio.TimerHandle | None
    # Write coalescing: see _kick.
    _corked: bool
    _in_batch: bool
    _writes: WritePath
    _read_pauses: int
    _reading_paused: bool
    _held_events: list[Event]
    _handshake_tls_error: ssl.SSLError | None

    if TYPE_CHECKING:

        def _handle_events(self, events: list[Event]) -> None: ...

        def _release_held(self) -> None: ...

        def _update_reading(self) -> None: ...

        def _arm_close_deadline(self) -> None: ...

    # ------------------------------------------------------------------ writing

    def _kick(self) -> None:
        """Write queued frames now, or once at the end of this loop pass.

        The first frames queued in a loop pass leave at once: a lone publish or ack
        (a round trip) costs no extra loop iteration. What follows in the same pass is
        corked and leaves in one write, from a flush scheduled with ``call_soon`` (so a
        burst of publishes is one ``write``), or at the end of a batch (see
        :meth:`_begin_batch`): what callbacks queue while a chunk of the socket is
        handled, what one drain of the sync API's hand-off queue queues.
        """
        proto = self._proto
        if proto is None:
            return
        if not self._corked and self._transport is not None:
            self._corked = True  # a new pass: until a flush or the next read, cork
            self._flush()
        elif len(proto.send_queue) >= _FLUSH_FRAMES:
            self._flush()
        elif self._flush_handle is None and not self._in_batch and self._loop is not None:
            self._flush_handle = self._loop.call_soon(self._flush_corked)

    def _begin_batch(self) -> None:
        """Cork writes until :meth:`_end_batch`, which writes them in one go (loop thread)."""
        self._in_batch = self._corked = True

    def _end_batch(self) -> None:
        """Write what was queued since :meth:`_begin_batch`; later frames leave at once."""
        self._in_batch = self._corked = False
        proto = self._proto
        if proto is not None and proto.send_queue:
            self._flush()

    def _flush_corked(self) -> None:
        """The flush scheduled by :meth:`_kick`: the pass that corked is over."""
        self._flush_handle = None
        self._corked = False
        self._flush()

    def _flush(self) -> None:
        proto = self._proto
        if proto is None:
            return
        if self._reading_paused and self._loop is not None:
            # Frames sent while a full queue holds reading may await replies (a request,
            # publishes to confirm): their answers must be read. Checked after the code
            # that sent them has registered what it waits for (a publish's confirm).
            self._loop.call_soon(self._update_reading)
        out = proto.buffers_to_send()
        transport = self._transport
        if not out or transport is None or transport.is_closing():
            return
        if len(out) == 1:
            transport.write(out[0])
        elif sum(map(len, out)) <= _JOIN_BYTES:
            transport.write(b"".join(out))
        else:
            # A large message: joining would copy its body once more before the
            # transport copies what the socket did not take. Piece by piece, the
            # transport's buffer holds the only copy.
            write = transport.write
            for piece in out:
                write(piece)

    def _resume_writing(self) -> None:
        """The transport drained, or went away: publishers may write again."""
        self._writes.resume()

    # ------------------------------------------------------------------ socket events

    def _on_connection_made(self, transport: asyncio.Transport) -> None:
        self._transport = transport
        self._held_events = []  # deliveries of an earlier socket: the broker requeued them
        self._reading_paused = False
        if self._read_pauses:
            self._update_reading()  # a consumer queue is still full from before a reconnect
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

    def _on_data(self, data: bytes) -> None:
        proto = self._proto
        if proto is None:
            return
        # Frames queued while this chunk is handled (answers of the protocol, acks and
        # publishes of callbacks) leave in one write at the end; the next frames
        # queued after that, in a later pass, leave at once (_begin_batch inlined).
        self._in_batch = self._corked = True
        try:
            if self._held_events:
                self._release_held()  # what was read before goes first
            proto.receive_data(data)
            if proto.send_queue:
                # The protocol's own answers (a close-ok, a flow-ok) leave before the
                # events are handled: a connection that ends there is aborted unflushed.
                self._flush()
            events = proto.events_received()
            if events:
                self._handle_events(events)
            if self._read_pauses and not self._reading_paused:
                self._update_reading()  # read for a reply: pause again once none is awaited
        finally:
            self._in_batch = self._corked = False
        if proto.send_queue:
            self._flush()
        if proto.state is ConnectionState.CLOSING and self._close_deadline is None:
            self._arm_close_deadline()
