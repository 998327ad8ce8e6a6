"""AsyncConnection's socket: bytes in, bytes out.

:class:`SocketIO` holds the socket and the sans-IO protocol object of the current
connection attempt: what happens when the socket connects, delivers a chunk or goes
away (the :class:`Transport` it connects with forwards those events), and how frames
are written. :class:`ReadFlow` is the back-pressure on its reads. The events a chunk
yields go to an :class:`EventSink` (the connection's dispatcher).

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
from typing import TYPE_CHECKING, Protocol, cast

from ..protocol.connection import ConnectionProtocol, ConnectionState

if TYPE_CHECKING:
    from ..protocol.events import Event
    from ..publishing.pipe import WritePath
    from ._lifecycle import ChannelEvents
    from .channel import AsyncChannel

__all__ = ["EventSink", "ReadFlow", "SocketIO", "Transport"]

logger = logging.getLogger("rabbitry.connection")

#: Flush at once when this many frames are queued within one loop iteration.
_FLUSH_FRAMES = 256
#: Above this many bytes queued, a flush writes the pieces one by one instead of joining.
_JOIN_BYTES = 1024 * 1024


class EventSink(Protocol):
    """Where :class:`SocketIO` hands what the protocol object reports."""

    def handle(self, events: list[Event]) -> None:
        """Handle the events the protocol object produced, in order."""

    def protocol_closing(self) -> None:
        """The protocol object is CLOSING after a chunk (it found a violation)."""


class Transport(asyncio.Protocol):
    """asyncio glue: forwards socket events to the connection's :class:`SocketIO`."""

    def __init__(self, io: SocketIO, proto: ConnectionProtocol) -> None:
        self._io = io
        # The protocol object this socket serves: a late event from the socket of an
        # earlier attempt (or of a connection that recovery replaced) must not reach
        # the new one.
        self._proto = proto

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        # Not an isinstance() check: uvloop's transports do not derive from asyncio's.
        stream = cast("asyncio.Transport", transport)
        if self._io.proto is self._proto:
            self._io.connection_made(stream)
        else:
            stream.abort()

    def data_received(self, data: bytes) -> None:
        if self._io.proto is self._proto:
            self._io.data_received(data)

    def eof_received(self) -> bool:
        return False  # let the transport close; connection_lost follows

    def connection_lost(self, exc: Exception | None) -> None:
        if self._io.proto is self._proto:
            self._io.connection_lost(exc)

    def pause_writing(self) -> None:
        self._io.writes.paused = True

    def resume_writing(self) -> None:
        self._io.resume_writing()


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

    Get it from the connection's ``read_flow``.
    """

    def __init__(self, io: SocketIO, channels: dict[int, ChannelEvents[AsyncChannel]]) -> None:
        self._io = io
        # The hooks of the connection's channels: one awaiting a reply keeps reading on.
        self._channels = channels
        #: How many holders paused reading.
        self.pauses = 0
        #: Whether the transport is paused now: ``pauses > 0`` and no reply is awaited.
        self.paused = False
        #: The events already read (the rest of a chunk) that wait for the last release.
        self.held: list[Event] = []

    def pause(self) -> None:
        """Stop reading the socket: a consumer's queue is full (loop thread).

        Pauses are counted (the sync dispatcher and every full consumer queue each hold
        one); reading resumes when the last is released by :meth:`resume`. Deliveries
        already read in the same chunk are held back too (see the connection's
        dispatcher), so a queue grows by at most the message that filled it. While a
        reply is awaited the socket is read anyway (:meth:`recheck`).
        """
        self.pauses += 1
        if not self.paused:
            self.recheck()

    def resume(self) -> None:
        """Release one :meth:`pause` (loop thread)."""
        if not self.pauses:
            return
        self.pauses -= 1
        if not self.pauses:
            self.recheck()

    def recheck(self) -> None:
        """Pause or resume the transport's reading (loop thread).

        Paused while some consumer holds a pause and no channel waits for a reply (the
        answer to a request, or confirms); a reply somebody waits for is always read. A
        channel calls it when it sends a request.
        """
        hold = bool(self.pauses) and not any(
            hooks.awaits_reply() for hooks in self._channels.values()
        )
        if hold is self.paused:
            return
        io = self._io
        transport, proto = io.transport, io.proto
        if transport is None or proto is None:
            return  # the next socket starts from pauses (SocketIO.connection_made)
        self.paused = proto.rx_paused = hold
        if hold:
            transport.pause_reading()
            return
        if self.held and io.loop is not None:
            io.loop.call_soon(self.release)
        transport.resume_reading()

    def release(self) -> None:
        """Handle the events held back while reading was paused (in order)."""
        events, self.held = self.held, []
        if events:
            self._io.sink.handle(events)


class SocketIO:
    """Moves bytes between the socket of the current attempt and its sans-IO protocol
    object: corked writes, and reads handed to the event sink.

    Args:
        channels: the hooks of the connection's channels, by number (for :class:`ReadFlow`).
    """

    def __init__(self, channels: dict[int, ChannelEvents[AsyncChannel]]) -> None:
        self.loop: asyncio.AbstractEventLoop | None = None
        #: The protocol object of the current attempt (``None`` between attempts).
        self.proto: ConnectionProtocol | None = None
        self.transport: asyncio.Transport | None = None
        #: Set when the current attempt's socket is gone.
        self.lost: asyncio.Future[None] | None = None
        #: An ssl.SSLError that ended the current attempt's socket.
        self.tls_error: ssl.SSLError | None = None
        #: Where the protocol's events go (set by the connection).
        self.sink: EventSink
        # Write coalescing (see kick): frames were written in this loop pass, so more
        # wait for the scheduled flush; and a batch of work is running (a chunk of the
        # socket, or the sync API's hand-off queue) that flushes when it ends.
        self._corked = False
        self._in_batch = False
        self._flush_handle: asyncio.Handle | None = None
        #: What channels and publishers use to write, and the transport's back-pressure
        #: (set by the connection: ``WritePath(kick, flush, await_recovery)``).
        self.writes: WritePath
        self.flow = ReadFlow(self, channels)

    # ------------------------------------------------------------------ writing

    def kick(self) -> None:
        """Write queued frames now, or once at the end of this loop pass.

        The first frames queued in a loop pass leave at once: a lone publish or ack
        (a round trip) costs no extra loop iteration. What follows in the same pass is
        corked and leaves in one write, from a flush scheduled with ``call_soon`` (so a
        burst of publishes is one ``write``), or at the end of a batch (see
        :meth:`begin_batch`): what callbacks queue while a chunk of the socket is
        handled, what one drain of the sync API's hand-off queue queues.
        """
        proto = self.proto
        if proto is None:
            return
        if not self._corked and self.transport is not None:
            self._corked = True  # a new pass: until a flush or the next read, cork
            self.flush()
        elif len(proto.send_queue) >= _FLUSH_FRAMES:
            self.flush()
        elif self._flush_handle is None and not self._in_batch and self.loop is not None:
            self._flush_handle = self.loop.call_soon(self._flush_corked)

    def begin_batch(self) -> None:
        """Cork writes until :meth:`end_batch`, which writes them in one go (loop thread)."""
        self._in_batch = self._corked = True

    def end_batch(self) -> None:
        """Write what was queued since :meth:`begin_batch`; later frames leave at once."""
        self._in_batch = self._corked = False
        proto = self.proto
        if proto is not None and proto.send_queue:
            self.flush()

    def _flush_corked(self) -> None:
        """The flush scheduled by :meth:`kick`: the pass that corked is over."""
        self._flush_handle = None
        self._corked = False
        self.flush()

    def cancel_flush(self) -> None:
        """Drop the flush :meth:`kick` scheduled, if any (the connection ends)."""
        if self._flush_handle is not None:
            self._flush_handle.cancel()
            self._flush_handle = None

    def flush(self) -> None:
        """Write every frame the protocol object queued."""
        proto = self.proto
        if proto is None:
            return
        if self.flow.paused and self.loop is not None:
            # Frames sent while a full queue holds reading may await replies (a request,
            # publishes to confirm): their answers must be read. Checked after the code
            # that sent them has registered what it waits for (a publish's confirm).
            self.loop.call_soon(self.flow.recheck)
        out = proto.buffers_to_send()
        transport = self.transport
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

    def resume_writing(self) -> None:
        """The transport drained, or went away: publishers may write again."""
        self.writes.resume()

    # ------------------------------------------------------------------ socket events

    def connection_made(self, transport: asyncio.Transport) -> None:
        """The socket of the current attempt connected."""
        self.transport = transport
        flow = self.flow
        flow.held = []  # deliveries of an earlier socket: the broker requeued them
        flow.paused = False
        if flow.pauses:
            flow.recheck()  # a consumer queue is still full from before a reconnect
        self.flush()  # the protocol header

    def connection_lost(self, exc: Exception | None) -> None:
        """The socket of the current attempt went away (``exc``: why, if known)."""
        proto = self.proto
        self.transport = None
        self.resume_writing()
        if proto is not None:
            proto.receive_eof()
            self.sink.handle(proto.events_received())
        if self.lost is not None and not self.lost.done():
            self.lost.set_result(None)
        if exc is not None:
            logger.debug("socket closed: %r", exc)
            if isinstance(exc, ssl.SSLError):
                # Read by the attempt only while it waits for connection.open-ok.
                self.tls_error = exc

    def data_received(self, data: bytes) -> None:
        """A chunk of the socket: feed it to the protocol object, hand on its events."""
        proto = self.proto
        if proto is None:
            return
        flow = self.flow
        # Frames queued while this chunk is handled (answers of the protocol, acks and
        # publishes of callbacks) leave in one write at the end; the next frames
        # queued after that, in a later pass, leave at once (begin_batch inlined).
        self._in_batch = self._corked = True
        try:
            if flow.held:
                flow.release()  # what was read before goes first
            proto.receive_data(data)
            if proto.send_queue:
                # The protocol's own answers (a close-ok, a flow-ok) leave before the
                # events are handled: a connection that ends there is aborted unflushed.
                self.flush()
            events = proto.events_received()
            if events:
                self.sink.handle(events)
            if flow.pauses and not flow.paused:
                flow.recheck()  # read for a reply: pause again once none is awaited
        finally:
            self._in_batch = self._corked = False
        if proto.send_queue:
            self.flush()
        if proto.state is ConnectionState.CLOSING:
            self.sink.protocol_closing()
