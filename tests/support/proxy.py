"""A TCP proxy that injects network faults between a client and a broker.

Tests point the client at the proxy instead of the broker and then, from the test
thread, switch faults on and off: black-holing, one-way loss, resets, refused
connections, latency, throttling and mid-stream cuts. The proxy runs its own asyncio
event loop in a daemon thread so it works the same for blocking and asyncio clients,
and so a client that hogs its own loop cannot stall the "network".

Every control method hands its change to the proxy thread and waits until it has been
applied, so once the call returns the fault is in force for the next chunk of data.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import logging
import socket
import struct
import threading
from collections.abc import Callable
from typing import TYPE_CHECKING, Literal, TypeVar
from urllib.parse import quote, urlencode

if TYPE_CHECKING:
    from asyncio.trsock import TransportSocket
    from types import TracebackType

__all__ = ["Direction", "TapCallback", "TcpProxy"]

Direction = Literal["upstream", "downstream"]
"""``"upstream"`` is client to broker, ``"downstream"`` is broker to client."""

TapCallback = Callable[[Direction, bytes], None]

_DIRECTIONS: tuple[Direction, ...] = ("upstream", "downstream")

# Read size and queue depth bound memory to about 1 MiB per direction per connection;
# when a queue is full the reader stops reading, so TCP flow control pushes back on
# the sender instead of the proxy buffering without limit.
_CHUNK = 64 * 1024
_QUEUE_CHUNKS = 16

# Throttled data is released in slices of this many seconds' worth, so a low
# bandwidth still looks like a steady trickle rather than one burst per chunk.
_SLICE_SECONDS = 0.05

_CONTROL_TIMEOUT = 5.0
_CONNECT_TIMEOUT = 5.0
_CLOSE_TIMEOUT = 1.0
#: How often a held direction checks whether it was released.
_HOLD_POLL_SECONDS = 0.01
_EOF_POLL_SECONDS = 0.02

_log = logging.getLogger(__name__)

_T = TypeVar("_T")


def _check_direction(direction: str) -> Direction:
    if direction == "upstream":
        return "upstream"
    if direction == "downstream":
        return "downstream"
    raise ValueError(f"direction must be 'upstream' or 'downstream', not {direction!r}")


def _set_linger_zero(sock: socket.socket | TransportSocket) -> None:
    # A zero linger makes close() send RST instead of FIN, which is how a crashed
    # peer or a stateful firewall dropping its state looks to the other end.
    with contextlib.suppress(OSError):
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))


def _rst_stream(writer: asyncio.StreamWriter) -> None:
    sock = writer.get_extra_info("socket")
    if sock is not None:
        _set_linger_zero(sock)
    writer.transport.abort()


def _rst_socket(sock: socket.socket) -> None:
    _set_linger_zero(sock)
    sock.close()


class _Link:
    """One proxied client connection together with its connection to the target."""

    def __init__(
        self,
        proxy: TcpProxy,
        client_reader: asyncio.StreamReader,
        client_writer: asyncio.StreamWriter,
        target_reader: asyncio.StreamReader,
        target_writer: asyncio.StreamWriter,
    ) -> None:
        self._proxy = proxy
        self._sources: dict[Direction, asyncio.StreamReader] = {
            "upstream": client_reader,
            "downstream": target_reader,
        }
        self._sinks: dict[Direction, asyncio.StreamWriter] = {
            "upstream": target_writer,
            "downstream": client_writer,
        }
        # Set once the link is being torn down; everything that waits also watches it
        # so a reset connection does not linger behind a latency or throttle sleep.
        self._dead = asyncio.Event()

    @property
    def dead(self) -> bool:
        return self._dead.is_set()

    def abort(self) -> None:
        """Reset both sides of the link at once."""
        if self._dead.is_set():
            return
        self._dead.set()
        for writer in self._sinks.values():
            _rst_stream(writer)

    async def run(self) -> None:
        await asyncio.gather(*(self._pipe(direction) for direction in _DIRECTIONS))

    async def _nap(self, seconds: float) -> bool:
        """Sleep up to ``seconds``; return True if the link is still alive afterwards."""
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self._dead.wait(), seconds)
        return not self._dead.is_set()

    async def _pipe(self, direction: Direction) -> None:
        # Reading and writing run separately so that latency delays every chunk by the
        # same amount instead of adding up: the reader timestamps chunks as they
        # arrive and the writer releases each one when its time has come.
        queue: asyncio.Queue[tuple[float, bytes] | None] = asyncio.Queue(_QUEUE_CHUNKS)
        reader = asyncio.create_task(self._read(direction, queue))
        try:
            await self._write(direction, queue)
        finally:
            reader.cancel()
            await asyncio.wait({reader})
            if not reader.cancelled() and reader.exception() is not None:
                _log.error("proxy reader failed", exc_info=reader.exception())

    async def _read(
        self, direction: Direction, queue: asyncio.Queue[tuple[float, bytes] | None]
    ) -> None:
        proxy = self._proxy
        source = self._sources[direction]
        loop = asyncio.get_running_loop()
        try:
            while data := await source.read(_CHUNK):
                # Discarding on arrival means data sent during a black-hole is lost for
                # good, as on a real network, rather than delivered after resume().
                if proxy._discarding(direction):
                    continue
                await queue.put((loop.time() + proxy._latency_s, data))
        except OSError:
            # One peer reset its socket. Passing the reset on lets the other peer
            # notice immediately, which is what tests of a dying broker want.
            self.abort()
        await queue.put(None)

    async def _write(
        self, direction: Direction, queue: asyncio.Queue[tuple[float, bytes] | None]
    ) -> None:
        proxy = self._proxy
        sink = self._sinks[direction]
        loop = asyncio.get_running_loop()
        try:
            while not self.dead:
                item = await queue.get()
                while direction in proxy._held:  # data and EOF wait, in order
                    if not await self._nap(_HOLD_POLL_SECONDS):
                        return
                if self.dead:
                    return
                if item is None:
                    await self._forward_eof(direction, sink)
                    return
                due, data = item
                delay = due - loop.time()
                if delay > 0 and not await self._nap(delay):
                    return
                # Checked again on release so that a fault switched on while data
                # sits in the latency queue also catches that data.
                if proxy._discarding(direction):
                    continue
                await self._send(direction, sink, data)
        except OSError:
            self.abort()

    async def _forward_eof(self, direction: Direction, sink: asyncio.StreamWriter) -> None:
        # A black-holed network would not deliver the FIN either, so hold it back
        # until the direction is open again (or the link dies).
        while self._proxy._discarding(direction):
            if not await self._nap(_EOF_POLL_SECONDS):
                return
        if sink.can_write_eof():
            sink.write_eof()
        else:
            sink.close()

    async def _send(self, direction: Direction, sink: asyncio.StreamWriter, data: bytes) -> None:
        proxy = self._proxy
        view = memoryview(data)
        while view and not self.dead:
            rate = proxy._rate
            piece = view if rate is None else view[: max(1, int(rate * _SLICE_SECONDS))]
            allowed, cut = proxy._take_cut_budget(direction, len(piece))
            if cut:
                # Make sure the allowed bytes have left the transport's buffer before
                # the RST, otherwise the abort would silently discard them.
                sink.transport.set_write_buffer_limits(high=0)
            if allowed:
                chunk = bytes(piece[:allowed])
                # Count and tap before writing, so that once the receiver has the data
                # the counters and the tap already reflect it.
                proxy._account(direction, chunk)
                sink.write(chunk)
                if cut:
                    with contextlib.suppress(TimeoutError):
                        await asyncio.wait_for(sink.drain(), _CLOSE_TIMEOUT)
                else:
                    await sink.drain()
            if cut:
                self.abort()
                return
            if rate is not None and not await self._nap(len(piece) / rate):
                return
            view = view[len(piece) :]


class TcpProxy:
    """A fault-injecting TCP proxy running on its own thread.

    Example:
        >>> with TcpProxy("127.0.0.1", 5672) as proxy:  # doctest: +SKIP
        ...     conn = connect(proxy.url(heartbeat=2))
        ...     proxy.blackhole()
        ...     ...  # the client should notice the missed heartbeats
        ...     proxy.resume()

    The proxy can be stopped and started again; a restart listens on the same port,
    which makes ``stop()``/``start()`` a convenient "broker went away and came back".

    Args:
        target_host: Host of the server to forward to, normally the broker.
        target_port: Port of the server to forward to.
        listen_host: Address to listen on.
        listen_port: Port to listen on; 0 picks a free port (see ``port``).
    """

    def __init__(
        self,
        target_host: str,
        target_port: int,
        listen_host: str = "127.0.0.1",
        listen_port: int = 0,
    ) -> None:
        self._target_host = target_host
        self._target_port = target_port
        self._listen_host = listen_host
        self._port = listen_port

        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None
        self._listener: socket.socket | None = None
        self._links: set[_Link] = set()
        # Client streams whose connection to the target is still being set up.
        self._pending: set[asyncio.StreamWriter] = set()
        self._handlers: set[asyncio.Task[None]] = set()
        # Accepted sockets not yet wrapped in a transport; closed on shutdown in case
        # their handler task was cancelled before it ever ran.
        self._unowned: set[socket.socket] = set()

        # Fault state. Only ever changed on the proxy thread (see _apply), so the data
        # path can read it without locks.
        self._blackholed = False
        self._dropped: set[Direction] = set()
        # Directions whose data waits, in order, until release() (see hold()).
        self._held: set[Direction] = set()
        self._refusing = False
        self._latency_s = 0.0
        self._rate: float | None = None
        self._cut: tuple[Direction, int] | None = None
        self._tap: TapCallback | None = None

        self._bytes: dict[Direction, int] = {"upstream": 0, "downstream": 0}
        self._accepted = 0
        self._tap_errors: list[Exception] = []

    # -- lifecycle -------------------------------------------------------------------

    def start(self) -> TcpProxy:
        """Bind the listening socket and start forwarding.

        Returns:
            The proxy itself, so ``proxy = TcpProxy(...).start()`` works.

        Raises:
            RuntimeError: If the proxy is already running.
            OSError: If the listening socket cannot be bound.
        """
        if self._thread is not None:
            raise RuntimeError("proxy is already running")
        # Binding here rather than on the proxy thread makes a busy port fail loudly in
        # the caller, and means ``port`` is known before start() returns.
        family = socket.AF_INET6 if ":" in self._listen_host else socket.AF_INET
        listener = socket.create_server((self._listen_host, self._port), family=family)
        listener.setblocking(False)
        self._port = listener.getsockname()[1]
        self._listener = listener
        loop = asyncio.new_event_loop()
        thread = threading.Thread(
            target=self._run, args=(loop, listener), name=f"TcpProxy-{self._port}", daemon=True
        )
        self._loop = loop
        self._thread = thread
        thread.start()
        return self

    def stop(self) -> None:
        """Abort all connections, close the listener and join the proxy thread.

        Safe to call more than once, and on a proxy that was never started.
        """
        loop, thread = self._loop, self._thread
        if loop is None or thread is None:
            return
        with contextlib.suppress(RuntimeError):  # the loop already closed on its own
            loop.call_soon_threadsafe(loop.stop)
        thread.join(_CONTROL_TIMEOUT * 2)
        if thread.is_alive():
            _log.warning("TcpProxy thread %s did not stop in time", thread.name)
        self._loop = None
        self._thread = None

    def __enter__(self) -> TcpProxy:
        return self.start()

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()

    def __repr__(self) -> str:
        state = "running" if self._thread is not None else "stopped"
        return (
            f"<TcpProxy {self._listen_host}:{self._port} -> "
            f"{self._target_host}:{self._target_port} {state}>"
        )

    # -- addresses and counters ------------------------------------------------------

    @property
    def host(self) -> str:
        """The address the proxy listens on."""
        return self._listen_host

    @property
    def port(self) -> int:
        """The port the proxy listens on; known once ``start()`` has returned."""
        if self._port == 0:
            raise RuntimeError("the proxy has not been started, so it has no port yet")
        return self._port

    @property
    def target(self) -> tuple[str, int]:
        """The ``(host, port)`` the proxy forwards to."""
        return (self._target_host, self._target_port)

    def url(
        self,
        user: str = "guest",
        password: str = "guest",
        vhost: str = "%2f",
        **query: str | int | float,
    ) -> str:
        """Build an AMQP URL that connects through the proxy.

        Args:
            user: User name; percent-encoded as needed.
            password: Password; percent-encoded as needed.
            vhost: Virtual host, already percent-encoded (the default ``%2f`` is "/").
            **query: Extra URL query parameters, e.g. ``heartbeat=2``.

        Returns:
            An ``amqp://`` URL for the proxy's listening address.
        """
        host = f"[{self.host}]" if ":" in self.host else self.host
        base = f"amqp://{quote(user, safe='')}:{quote(password, safe='')}@{host}:{self.port}"
        url = f"{base}/{vhost}"
        return f"{url}?{urlencode(query)}" if query else url

    @property
    def bytes_upstream(self) -> int:
        """Bytes forwarded from clients to the target so far."""
        return self._bytes["upstream"]

    @property
    def bytes_downstream(self) -> int:
        """Bytes forwarded from the target to clients so far."""
        return self._bytes["downstream"]

    @property
    def connections(self) -> int:
        """Client connections accepted so far, including refused ones."""
        return self._accepted

    @property
    def active_connections(self) -> int:
        """Client connections currently being forwarded."""
        return len(self._links)

    @property
    def tap_errors(self) -> list[Exception]:
        """Exceptions raised by the tap callback (they are logged, not propagated)."""
        return list(self._tap_errors)

    # -- faults ----------------------------------------------------------------------

    def blackhole(self) -> None:
        """Silently discard all data in both directions, keeping connections open."""

        def change() -> None:
            self._blackholed = True

        self._apply(change)

    def resume(self) -> None:
        """Undo ``blackhole()`` and ``drop()``: forward data in both directions again."""

        def change() -> None:
            self._blackholed = False
            self._dropped.clear()

        self._apply(change)

    def drop(self, direction: Direction, enabled: bool = True) -> None:
        """Silently discard data in one direction only.

        Args:
            direction: ``"upstream"`` (client to broker) or ``"downstream"``.
            enabled: False forwards that direction again.
        """
        checked = _check_direction(direction)
        if enabled:
            self._apply(lambda: self._dropped.add(checked))
        else:
            self._apply(lambda: self._dropped.discard(checked))

    def hold(self, direction: Direction) -> None:
        """Hold back data in one direction, keeping it: nothing is lost or reordered.

        The peers see a stalled network; :meth:`release` (or :meth:`heal`) delivers what
        was held, in order. Unlike ``latency``, nothing arrives until the test says so,
        however slow the machine is.

        Args:
            direction: ``"upstream"`` (client to broker) or ``"downstream"``.
        """
        checked = _check_direction(direction)
        self._apply(lambda: self._held.add(checked))

    def release(self, direction: Direction) -> None:
        """Undo :meth:`hold`: deliver the held data, in order, then flow again.

        Args:
            direction: ``"upstream"`` or ``"downstream"``.
        """
        checked = _check_direction(direction)
        self._apply(lambda: self._held.discard(checked))

    def reset(self) -> int:
        """Abort every current connection with a TCP RST on both sides.

        Returns:
            How many connections were reset.
        """

        def change() -> int:
            links = list(self._links)
            for link in links:
                link.abort()
            # Connections still waiting for the target count as current too; a test
            # that resets straight after connecting should not race the set-up.
            pending = list(self._pending)
            for writer in pending:
                _rst_stream(writer)
            return len(links) + len(pending)

        return self._apply(change)

    def refuse(self, enabled: bool = True) -> None:
        """Reset new client connections as soon as they are accepted.

        Existing connections are not affected; combine with ``reset()`` to take the
        "broker" away completely.
        """

        def change() -> None:
            self._refusing = bool(enabled)

        self._apply(change)

    def latency(self, seconds: float) -> None:
        """Delay every chunk by ``seconds`` in each direction, preserving order.

        Applies to data that arrives after the call; 0 switches it off.
        """
        if seconds < 0:
            raise ValueError("latency cannot be negative")

        def change() -> None:
            self._latency_s = float(seconds)

        self._apply(change)

    def bandwidth(self, bytes_per_second: float | None) -> None:
        """Throttle each direction of each connection; None removes the limit."""
        if bytes_per_second is not None and bytes_per_second <= 0:
            raise ValueError("bandwidth must be positive, or None for unlimited")
        rate = None if bytes_per_second is None else float(bytes_per_second)

        def change() -> None:
            self._rate = rate

        self._apply(change)

    def cut_after(self, nbytes: int | None, direction: Direction = "downstream") -> None:
        """Reset a connection after ``nbytes`` more bytes have flowed in ``direction``.

        The budget is shared by all connections and fires once: the connection that
        carries the last allowed byte is reset right after it (so ``nbytes`` can cut
        in the middle of a frame) and the trigger disarms. With ``nbytes=0`` the next
        connection to send anything in that direction is reset before any of it is
        forwarded.

        Args:
            nbytes: Bytes still to forward, or None to disarm.
            direction: Which direction to count.
        """
        if nbytes is not None and nbytes < 0:
            raise ValueError("nbytes cannot be negative")
        checked = _check_direction(direction)
        cut = None if nbytes is None else (checked, nbytes)

        def change() -> None:
            self._cut = cut

        self._apply(change)

    def tap(self, callback: TapCallback | None) -> None:
        """Call ``callback(direction, data)`` for every chunk forwarded.

        The callback runs on the proxy thread and must be quick; it may call the
        proxy's control methods. Exceptions are logged and kept in ``tap_errors``.
        None removes the tap.
        """

        def change() -> None:
            self._tap = callback

        self._apply(change)

    def heal(self) -> None:
        """Clear every fault: black-hole, drops, holds, refusal, latency, bandwidth and cuts."""

        def change() -> None:
            self._blackholed = False
            self._dropped.clear()
            self._held.clear()
            self._refusing = False
            self._latency_s = 0.0
            self._rate = None
            self._cut = None

        self._apply(change)

    # -- internals -------------------------------------------------------------------

    def _apply(self, change: Callable[[], _T]) -> _T:
        """Run ``change`` on the proxy thread and wait for it to finish."""
        loop = self._loop
        if loop is None or threading.current_thread() is self._thread:
            # Stopped, or called from a tap callback: nothing to synchronise with.
            return change()
        # A plain callback rather than a coroutine: if the loop stops before running
        # it, nothing is left behind to warn about an un-awaited coroutine.
        done: concurrent.futures.Future[_T] = concurrent.futures.Future()

        def run() -> None:
            if not done.set_running_or_notify_cancel():
                return
            try:
                done.set_result(change())
            except Exception as exc:
                done.set_exception(exc)

        loop.call_soon_threadsafe(run)
        return done.result(_CONTROL_TIMEOUT)

    def _discarding(self, direction: Direction) -> bool:
        return self._blackholed or direction in self._dropped

    def _take_cut_budget(self, direction: Direction, size: int) -> tuple[int, bool]:
        """Return how many of ``size`` bytes may pass, and whether to cut after them."""
        cut = self._cut
        if cut is None or cut[0] != direction:
            return size, False
        remaining = cut[1]
        if size < remaining:
            self._cut = (direction, remaining - size)
            return size, False
        self._cut = None
        return remaining, True

    def _account(self, direction: Direction, chunk: bytes) -> None:
        self._bytes[direction] += len(chunk)
        tap = self._tap
        if tap is None:
            return
        try:
            tap(direction, chunk)
        except Exception as exc:
            # A failing tap must not take the connection down with it; the test can
            # inspect tap_errors instead.
            _log.exception("TcpProxy tap callback failed")
            self._tap_errors.append(exc)

    def _run(self, loop: asyncio.AbstractEventLoop, listener: socket.socket) -> None:
        asyncio.set_event_loop(loop)
        try:
            accept_task = loop.create_task(self._accept_loop(listener))
            loop.run_forever()
            loop.run_until_complete(self._shutdown(accept_task, listener))
        finally:
            try:
                leftovers = asyncio.all_tasks(loop)
                for task in leftovers:
                    task.cancel()
                if leftovers:
                    loop.run_until_complete(asyncio.wait(leftovers, timeout=_CONTROL_TIMEOUT))
                listener.close()
                loop.run_until_complete(loop.shutdown_asyncgens())
                # Host-name targets are resolved in the default executor's threads;
                # shutting it down is what keeps stop() from leaking them.
                loop.run_until_complete(loop.shutdown_default_executor())
            finally:
                asyncio.set_event_loop(None)
                loop.close()

    async def _shutdown(self, accept_task: asyncio.Task[None], listener: socket.socket) -> None:
        accept_task.cancel()
        await asyncio.wait({accept_task})
        listener.close()
        self._listener = None
        for link in list(self._links):
            link.abort()
        handlers = list(self._handlers)
        for task in handlers:
            task.cancel()
        if handlers:
            await asyncio.wait(handlers, timeout=_CONTROL_TIMEOUT)
        for sock in self._unowned:
            sock.close()
        self._unowned.clear()

    async def _accept_loop(self, listener: socket.socket) -> None:
        loop = asyncio.get_running_loop()
        while True:
            try:
                conn, _ = await loop.sock_accept(listener)
            except OSError:
                # Typically out of file descriptors; back off instead of spinning.
                _log.exception("TcpProxy accept failed")
                await asyncio.sleep(0.1)
                continue
            self._accepted += 1
            if self._refusing:
                _rst_socket(conn)
                continue
            self._unowned.add(conn)
            task = loop.create_task(self._serve(conn))
            self._handlers.add(task)
            task.add_done_callback(self._handler_done)

    def _handler_done(self, task: asyncio.Task[None]) -> None:
        self._handlers.discard(task)
        if not task.cancelled() and task.exception() is not None:
            _log.error("TcpProxy connection handler failed", exc_info=task.exception())

    async def _serve(self, conn: socket.socket) -> None:
        self._unowned.discard(conn)
        writers: list[asyncio.StreamWriter] = []
        try:
            client_reader, client_writer = await asyncio.open_connection(sock=conn, limit=_CHUNK)
            # From here on the transport owns the socket and closes it.
            writers.append(client_writer)
            self._pending.add(client_writer)
            try:
                target_reader, target_writer = await asyncio.wait_for(
                    asyncio.open_connection(self._target_host, self._target_port, limit=_CHUNK),
                    _CONNECT_TIMEOUT,
                )
            except (OSError, TimeoutError):
                # An unreachable target looks to the client like a broker that
                # accepted and immediately died, so it fails fast.
                _rst_stream(client_writer)
                return
            finally:
                self._pending.discard(client_writer)
            writers.append(target_writer)
            if client_writer.transport.is_closing():
                # reset() hit this connection while the target was being dialled.
                _rst_stream(target_writer)
                return
            link = _Link(self, client_reader, client_writer, target_reader, target_writer)
            self._links.add(link)
            try:
                await link.run()
            finally:
                self._links.discard(link)
        finally:
            if not writers:
                conn.close()
            for writer in writers:
                writer.close()
            for writer in writers:
                try:
                    await asyncio.wait_for(writer.wait_closed(), _CLOSE_TIMEOUT)
                except TimeoutError:
                    # The peer stopped reading, so an orderly close cannot flush.
                    _rst_stream(writer)
                except OSError:
                    pass
