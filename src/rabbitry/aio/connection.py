"""AsyncConnection: the asyncio engine around :class:`ConnectionProtocol`.

The engine owns the socket, the timers and the futures; every protocol rule lives in
``rabbitry.protocol``. Bytes flow ``data_received → receive_data → data_to_send → write``
and events flow ``events_received → futures and callbacks`` (the dispatch, the state
changes and the endings are in :mod:`rabbitry.aio._events`, a base class).

Writes are corked per loop pass: the first frames an API call queues in a pass are
written at once (a round trip costs no extra loop iteration), what follows in the same
pass leaves in one ``write`` from one scheduled flush, and what is queued while a chunk
of the socket is handled leaves in one ``write`` at the end of the chunk. A burst
longer than ``_FLUSH_FRAMES`` frames is flushed at once so memory stays bounded, and
publishers wait while the transport's buffer is above its high-water mark.
"""

from __future__ import annotations

import asyncio
import inspect
import logging
import os
import ssl
import weakref
from collections.abc import Awaitable, Callable, Sequence
from typing import TYPE_CHECKING, Any, Self, cast

from ..broker import RABBITMQ_3_MAX_MESSAGE_SIZE, server_capabilities
from ..config import ConnectionParameters, default_url, parse_urls
from ..exceptions import (
    AMQPError,
    AuthenticationError,
    ConfigurationError,
    ConnectError,
    ConnectionClosedByClient,
    ConnectionRecovering,
    CredentialsError,
    InvalidStateError,
    NotAnAMQPServer,
    Timeout,
    TLSError,
    VirtualHostAccessRefused,
    VirtualHostNotFound,
)
from ..observability import _state as _obs
from ..protocol.connection import ConnectionProtocol, ConnectionState
from ..publishing.pipe import WritePath
from ..record import TopologyRecord
from ..recovery import DEFAULT_RECOVERY, RecoveryPolicy, State
from ._connect_errors import refine, wait_opened
from ._events import _CLOSE_TIMEOUT, BlockedCallback, CloseCallback, ConnectionEvents, LoopHooks
from .channel import AsyncChannel, create_channel

if TYPE_CHECKING:
    from ..protocol.events import Event
    from ._lifecycle import ChannelHooks

__all__ = ["AsyncConnection"]

logger = logging.getLogger("rabbitry.connection")

#: Flush at once when this many frames are queued within one loop iteration.
_FLUSH_FRAMES = 256
#: Above this many bytes queued, a flush writes the pieces one by one instead of joining.
_JOIN_BYTES = 1024 * 1024

# Every connection opened in this process, so that a forked child can disable them all.
_CONNECTIONS: weakref.WeakSet[AsyncConnection] = weakref.WeakSet()

#: Returns ``(username, password)``; called before every connect and reconnect attempt.
CredentialsProvider = Callable[[], "tuple[str, str] | Awaitable[tuple[str, str]]"]


class _Transport(asyncio.Protocol):
    """asyncio glue: forwards socket events to the connection."""

    def __init__(self, connection: AsyncConnection, proto: ConnectionProtocol) -> None:
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


class AsyncConnection(ConnectionEvents):
    """The asyncio engine of :class:`rabbitry.AsyncConnection`: the socket, the timers,
    the channels and recovery.

    Applications construct :class:`rabbitry.AsyncConnection`, which adds the factories of
    the high-level objects (``publisher()``, ``consumer()``, ``channel_pool()``,
    ``rpc_client()``, ``rpc_server()``); its documentation describes the arguments. The
    engine knows nothing of those objects: they are built on it.
    """

    def __init__(
        self,
        url: str | Sequence[str] | None = None,
        *,
        heartbeat: int | None = None,
        connection_timeout: float | None = None,
        channel_max: int | None = None,
        frame_max: int | None = None,
        connection_name: str | None = None,
        auth_mechanism: str | None = None,
        ssl_context: ssl.SSLContext | None = None,
        client_properties: dict[str, Any] | None = None,
        max_message_size: int | None = None,
        recovery: RecoveryPolicy | None = DEFAULT_RECOVERY,
        credentials_provider: CredentialsProvider | None = None,
    ) -> None:
        if credentials_provider is not None and not callable(credentials_provider):
            raise ConfigurationError(
                "credentials_provider: must be a callable returning (username, password), "
                f"not {type(credentials_provider).__name__}"
            )
        self._credentials_provider = credentials_provider
        options = {
            "heartbeat": heartbeat,
            "connection_timeout": connection_timeout,
            "channel_max": channel_max,
            "frame_max": frame_max,
            "connection_name": connection_name,
            "auth_mechanism": auth_mechanism,
            "ssl_context": ssl_context,
            "client_properties": client_properties,
        }
        self._candidates = parse_urls(
            url if url is not None else default_url(),
            **{k: v for k, v in options.items() if v is not None},
        )
        self._max_message_size = max_message_size
        self.params: ConnectionParameters = self._candidates[0]
        self._loop: asyncio.AbstractEventLoop | None = None
        self._proto: ConnectionProtocol | None = None
        self._transport: asyncio.Transport | None = None
        self._channels: dict[int, ChannelHooks[AsyncChannel]] = {}
        self._opened: asyncio.Future[None] | None = None
        self._terminated: asyncio.Future[AMQPError] | None = None
        self._lost: asyncio.Future[None] | None = None
        self._flush_handle: asyncio.Handle | None = None
        # Write coalescing (see _kick): frames were written in this loop pass, so more
        # wait for the scheduled flush; and a batch of work is running (a chunk of the
        # socket, or the sync API's hand-off queue) that flushes when it ends.
        self._corked = False
        self._in_batch = False
        self._tick_handle: asyncio.TimerHandle | None = None
        self._close_deadline: asyncio.TimerHandle | None = None
        # What channels and publishers use to write, and the transport's back-pressure.
        self._writes = WritePath(self._kick, self._flush, self._await_recovery)
        # Read back-pressure: how many holders paused reading, and the events already
        # read (the rest of a chunk) that wait until the last pause is released.
        self._read_pauses = 0
        self._held_events: list[Event] = []
        self._update_secret_waiter: asyncio.Future[None] | None = None
        # An ssl.SSLError that ended the socket before connection.open-ok (see connect).
        self._handshake_tls_error: ssl.SSLError | None = None
        self._blocked_callbacks: list[BlockedCallback] = []
        self._close_callbacks: list[CloseCallback] = []
        self.close_exc: AMQPError | None = None
        # What apply() declared, in order; automatic recovery replays it.
        self.topology_record = TopologyRecord()
        self.recovery = recovery
        self._state = State.CONNECTING
        self._closing = False
        self._recovered: asyncio.Event | None = None
        self._recovery_task: asyncio.Task[None] | None = None
        self._dropped_exc: AMQPError | None = None
        self._state_callbacks: list[Callable[[State, AMQPError | None], Any]] = []
        self._rename_callbacks: list[Callable[[str, str], Any]] = []
        self._recovery_error_callbacks: list[Callable[[str, str, AMQPError], Any]] = []
        self._pid = os.getpid()
        if _obs.active is not None:  # rabbitry.observability: state and recovery metrics
            _obs.active.connection_created(self)

    def __repr__(self) -> str:
        state = self._proto.state.value if self._proto else "new"
        return f"<AsyncConnection {self.params.display_url()} {state}>"

    # ------------------------------------------------------------------ state

    @property
    def is_open(self) -> bool:
        """The connection is open and usable."""
        return self._proto is not None and self._proto.state is ConnectionState.OPEN

    @property
    def is_closed(self) -> bool:
        """The connection was opened and is now closed (for any reason)."""
        return self._terminated is not None and self._terminated.done()

    @property
    def is_blocked(self) -> bool:
        """The broker sent connection.blocked (a resource alarm) and no unblocked yet."""
        return self._proto is not None and self._proto.blocked_reason is not None

    @property
    def blocked_reason(self) -> str | None:
        """The broker's reason for the current block, or ``None``."""
        return self._proto.blocked_reason if self._proto else None

    @property
    def server_properties(self) -> dict[str, Any]:
        """The broker's server-properties (product, version, capabilities...)."""
        return self._proto.server_properties if self._proto else {}

    @property
    def server_version(self) -> tuple[int, ...]:
        """The broker's version, e.g. ``(4, 0, 5)``; ``()`` before connecting or if unknown."""
        return self._proto.server_version if self._proto else ()

    @property
    def server_capabilities(self) -> dict[str, bool]:
        """The broker's ``capabilities`` table (``publisher_confirms``, ``per_consumer_qos``...)."""
        return server_capabilities(self.server_properties)

    @property
    def max_message_size(self) -> int:
        """The largest body sent or accepted (0 = no limit); follows the broker when not set.

        Before the first connection it is the option given, or 128 MiB when none was.
        """
        if self._proto is not None:
            return self._proto.max_message_size
        if self._max_message_size is None:
            return RABBITMQ_3_MAX_MESSAGE_SIZE
        return self._max_message_size

    @property
    def heartbeat(self) -> int:
        """The negotiated heartbeat interval in seconds (0 when off)."""
        return self._proto.heartbeat if self._proto else 0

    @property
    def frame_max(self) -> int:
        """The negotiated largest frame size."""
        return self._proto.frame_max if self._proto else 0

    @property
    def channel_max(self) -> int:
        """The negotiated highest channel number."""
        return self._proto.channel_max if self._proto else 0

    def add_blocked_callback(self, callback: BlockedCallback) -> None:
        """Call ``callback(reason)`` on connection.blocked and ``callback(None)`` on unblocked.

        Runs on the event loop; exceptions are logged.
        """
        self._blocked_callbacks.append(callback)

    def add_close_callback(self, callback: CloseCallback) -> None:
        """Call ``callback(exc)`` once when the connection ends, with the reason.

        Runs on the event loop; exceptions are logged.
        """
        self._close_callbacks.append(callback)

    # ------------------------------------------------------------------ open / close

    async def connect(self, timeout: float | None = None) -> None:
        """Connect to the first address that accepts us, in order.

        Args:
            timeout: overall deadline in seconds (each address also has its own
                ``connection_timeout``).

        Raises:
            AuthenticationError: the broker refused the credentials (not retried).
            ConnectError: no address accepted the connection; ``errors`` lists why.
            InvalidStateError: already connected.
        """
        if self._proto is not None:
            raise InvalidStateError("connect() was already called on this connection")
        self._loop = asyncio.get_running_loop()
        self._pid = os.getpid()
        _CONNECTIONS.add(self)
        errors: list[tuple[str, BaseException]] = []
        try:
            async with asyncio.timeout(timeout):
                for params in self._candidates:
                    try:
                        await self._connect_one(params)
                        self.params = params
                        if not self.heartbeat:
                            logger.warning(
                                "heartbeats are off on the connection to %s: a dead peer "
                                "behind a silent network is only noticed when TCP gives up "
                                "(about 11 minutes on Linux), and recovery waits as long",
                                params.address,
                            )
                        self._recovered = asyncio.Event()
                        self._recovered.set()
                        self._set_state(State.OPEN, None)
                        return
                    except (AuthenticationError, VirtualHostNotFound, VirtualHostAccessRefused):
                        self._reset_attempt()
                        raise
                    except (AMQPError, OSError, TimeoutError) as exc:
                        errors.append((params.address, exc))
                        logger.debug("connect to %s failed: %r", params.address, exc)
                        self._reset_attempt()
        except TimeoutError:
            self._reset_attempt()
            raise Timeout(f"could not connect within {timeout} s") from None
        summary = "; ".join(f"{address}: {exc!r}" for address, exc in errors)
        failure = ConnectError(f"could not connect to any broker ({summary})", errors)
        for kind in (TLSError, CredentialsError, NotAnAMQPServer):
            same = [exc for _, exc in errors if isinstance(exc, kind)]
            if errors and len(same) == len(errors):
                # Every address failed the same local way (TLS configuration, or the
                # credentials provider): shown as such, its __cause__ explaining it.
                raise same[-1]
        raise failure from (errors[-1][1] if errors else None)

    async def _provided_credentials(self) -> tuple[str, str]:
        provider = self._credentials_provider
        assert provider is not None
        try:
            result = provider()
            if inspect.isawaitable(result):
                result = await result
        except Exception as exc:  # the provider is user code: any failure is reported
            raise CredentialsError(f"credentials_provider raised {type(exc).__name__}") from exc
        if (
            not isinstance(result, tuple)
            or len(result) != 2
            or not all(isinstance(part, str) for part in result)
        ):
            raise CredentialsError(
                "credentials_provider: must return a (username, password) tuple of two "
                f"strings, got {type(result).__name__}"
            )
        return result

    async def _connect_one(self, params: ConnectionParameters) -> None:
        loop = asyncio.get_running_loop()
        self._handshake_tls_error = None
        username, password = params.username, params.password
        if self._credentials_provider is not None:
            username, password = await self._provided_credentials()
        self._proto = ConnectionProtocol(
            username=username,
            password=password,
            virtual_host=params.virtual_host,
            heartbeat=params.heartbeat,
            channel_max=params.channel_max,
            frame_max=params.frame_max,
            auth_mechanism=params.auth_mechanism,
            connection_name=params.connection_name,
            locale=params.locale,
            client_properties=params.client_properties,
            max_message_size=self._max_message_size,
        )
        self._opened = loop.create_future()
        if self._terminated is None or self._terminated.done():
            self._terminated = loop.create_future()
        self._lost = loop.create_future()
        if self._state is not State.RECOVERING:
            self.close_exc = None
        context: ssl.SSLContext | None = None
        if params.use_tls:
            context = params.ssl_context or ssl.create_default_context()
        try:
            async with asyncio.timeout(params.connection_timeout):
                proto = self._proto
                await loop.create_connection(
                    lambda: _Transport(self, proto),
                    params.host,
                    params.port,
                    ssl=context,
                    server_hostname=params.server_hostname if context else None,
                )
                await wait_opened(self._opened, lambda: bool(proto.greeting), params)
        except TimeoutError:
            raise Timeout(
                f"{params.address}: no open connection within {params.connection_timeout} s"
            ) from None
        except AMQPError as exc:
            refined = refine(exc, params)
            if refined is not exc:
                raise refined from exc
            alert = self._handshake_tls_error
            if alert is not None and not isinstance(exc, AuthenticationError):
                # TLS 1.3: the broker checks our certificate after our side of the
                # handshake finished, so its refusal arrives as an alert on the first read.
                reason = alert.reason or str(alert)
                raise TLSError(
                    f"{params.address}: the broker ended the TLS session during the AMQP "
                    f"handshake: {reason} (is a valid client certificate configured?)"
                ) from alert
            raise  # already ours (AuthenticationError is also an OSError: keep it as it is)
        except (ssl.SSLError, ssl.CertificateError) as exc:  # before OSError: its subclass
            reason = getattr(exc, "verify_message", None) or exc.reason or str(exc)
            host = params.server_hostname
            raise TLSError(
                f"{params.address}: TLS handshake with {host!r} failed: {reason}"
            ) from exc
        except OSError as exc:
            raise ConnectError(f"{params.address}: {exc}") from exc

    async def __aenter__(self) -> Self:
        await self.connect()
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.close()

    async def close(
        self,
        reply_code: int = 200,
        reply_text: str = "Normal shutdown",
        *,
        timeout: float | None = None,
    ) -> None:
        """Close cleanly: connection.close, wait for close-ok, close the socket.

        Idempotent. Past ``timeout`` (default 10 s) the socket is closed anyway, so this
        returns in bounded time even when the broker is gone. In a process forked from
        the one that connected it does nothing (the socket is the parent's).
        """
        if self._pid != os.getpid():
            return
        self._closing = True
        if self._state is State.RECOVERING:
            await self._stop_recovery(ConnectionClosedByClient(reply_code, reply_text))
            return
        proto = self._proto
        if proto is None or self._terminated is None:
            return
        if not self._terminated.done():
            proto.close(reply_code, reply_text)
            self._flush()
            self._handle_events(proto.events_received())
            if proto.close_exc is not None:
                # Nothing the broker sends from now on but close-ok is read (0-9-1
                # §4.2.2.1): what was pending fails now, not after the close-ok wait.
                self._fail_all_pending(proto.close_exc)
            try:
                await asyncio.wait_for(
                    asyncio.shield(self._terminated),
                    timeout if timeout is not None else _CLOSE_TIMEOUT,
                )
            except TimeoutError:
                proto.abort(ConnectionClosedByClient(reply_code, reply_text))
                self._handle_events(proto.events_received())
        if self._transport is not None:
            self._transport.close()
        if self._lost is not None and not self._lost.done():
            try:
                await asyncio.wait_for(asyncio.shield(self._lost), 1.0)
            except TimeoutError:
                if self._transport is not None:
                    self._transport.abort()

    async def wait_closed(self, timeout: float | None = None) -> AMQPError:
        """Wait until the connection ends; returns the reason.

        Raises:
            InvalidStateError: the connection was never opened.
            Timeout: still open after ``timeout`` seconds.
        """
        if self._terminated is None:
            raise InvalidStateError("the connection was never opened")
        try:
            async with asyncio.timeout(timeout):
                return await asyncio.shield(self._terminated)
        except TimeoutError:
            raise Timeout(f"connection still open after {timeout} s") from None

    def _abort(self, exc: AMQPError) -> None:
        """End the connection now, not waiting for the broker (``LoopHooks.abort``)."""
        self._closing = True
        task = self._recovery_task
        if task is not None and not task.done():
            task.cancel()
        proto = self._proto
        if proto is not None and proto.state is not ConnectionState.CLOSED:
            proto.abort(exc)
            self._handle_events(proto.events_received())
        if not self.is_closed:
            self._reset_attempt()
            self._finish_closed(exc)
        if self._transport is not None:
            # Not close(): a broker that reads nothing (blocked) would keep it open.
            self._transport.abort()

    # ------------------------------------------------------------------ channels

    async def channel(
        self, channel_id: int | None = None, *, timeout: float | None = None
    ) -> AsyncChannel:
        """Open a channel (the lowest free number unless ``channel_id`` is given)."""
        if self._state is State.RECOVERING:
            await self._await_recovery(timeout, "open a channel")
        return await self._open_channel(channel_id, timeout)

    async def _open_channel(
        self,
        channel_id: int | None,
        timeout: float | None,
        *,
        record: bool = True,
        internal: bool = False,
    ) -> AsyncChannel:
        """Open a channel now (recovery uses it while the connection is RECOVERING).

        ``record=False``: what the channel declares is not recorded for recovery (the
        channels of recovery itself and of the topology layer, which records on its own).
        """
        proto = self._require_open()
        channel_proto = proto.open_channel(channel_id)
        policy = self.recovery
        records = record and policy is not None and policy.record_channel_topology
        hooks = create_channel(
            self,
            channel_proto,
            self._writes,
            records=records,
            internal=internal,
            forget=self._forget_channel,
        )
        self._channels[channel_proto.channel_id] = hooks
        await hooks.wait_open(timeout)
        return hooks.channel

    async def update_secret(
        self, new_secret: bytes | str, reason: str = "", *, timeout: float | None = None
    ) -> None:
        """Replace the credentials of the open connection (connection.update-secret)."""
        proto = self._require_open()
        proto.update_secret(new_secret, reason)
        assert self._loop is not None
        waiter = self._update_secret_waiter = self._loop.create_future()
        self._kick()
        try:
            async with asyncio.timeout(timeout):
                await waiter
        except TimeoutError:
            raise Timeout(f"connection.update-secret got no answer within {timeout} s") from None

    def _require_open(self) -> ConnectionProtocol:
        proto = self._proto
        if proto is None or proto.state is not ConnectionState.OPEN:
            if self.close_exc is not None:
                raise InvalidStateError("the connection is closed") from self.close_exc
            raise InvalidStateError("the connection is not open (call connect() first)")
        return proto

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
        finally:
            self._in_batch = self._corked = False
        if proto.send_queue:
            self._flush()
        if proto.state is ConnectionState.CLOSING and self._close_deadline is None:
            self._arm_close_deadline()

    # ------------------------------------------------------------------ recovery

    @property
    def state(self) -> State:
        """CONNECTING, OPEN, RECOVERING or CLOSED."""
        return self._state

    def on_state_change(self, callback: Callable[[State, AMQPError | None], Any]) -> None:
        """Call ``callback(state, cause)`` on every state change (on the event loop)."""
        self._state_callbacks.append(callback)

    def on_queue_renamed(self, callback: Callable[[str, str], Any]) -> None:
        """Call ``callback(old, new)`` when recovery gives a server-named queue a new name."""
        self._rename_callbacks.append(callback)

    def on_recovery_error(self, callback: Callable[[str, str, AMQPError], Any]) -> None:
        """Call ``callback(kind, name, exc)`` when an entity fails to re-declare."""
        self._recovery_error_callbacks.append(callback)

    async def wait_recovered(self, timeout: float | None = None) -> None:
        """Return once the connection is OPEN (at once if it is).

        Raises:
            InvalidStateError: the connection is closed (for good).
            Timeout: still recovering after ``timeout`` seconds.
        """
        try:
            async with asyncio.timeout(timeout):
                # Loop: the connection may drop again between the recovery that woke
                # this waiter and the waiter running; that is a new outage to wait out.
                while self._state is State.RECOVERING:
                    assert self._recovered is not None
                    await self._recovered.wait()
        except TimeoutError:
            raise Timeout(f"still recovering after {timeout} s") from None
        if self._state is not State.OPEN:
            raise InvalidStateError(f"the connection is {self._state.value}") from self.close_exc

    async def _await_recovery(self, timeout: float | None, what: str) -> None:
        """An operation met a recovering connection: wait or fail, by policy."""
        if self._state is not State.RECOVERING:
            return
        assert self.recovery is not None
        if self.recovery.during_recovery == "fail":
            raise ConnectionRecovering(f"cannot {what}: the connection is recovering")
        await self.wait_recovered(timeout)


def remove_callback(connection: AsyncConnection, callback: Callable[..., Any]) -> None:
    """Stop calling ``callback``, registered with ``add_blocked_callback``,
    ``add_close_callback`` or ``on_state_change`` (if it is), for the library's objects
    that stop listening when they close (publishers, RPC clients); not for applications.
    """
    for callbacks in (
        connection._blocked_callbacks,
        connection._close_callbacks,
        connection._state_callbacks,
    ):
        if callback in callbacks:
            callbacks.remove(callback)


def loop_hooks(connection: AsyncConnection) -> LoopHooks:
    """The hooks of ``connection`` for the thread-safe API's IO thread; not for applications."""
    return LoopHooks(connection._begin_batch, connection._end_batch, connection._abort)


def open_connections(loop: asyncio.AbstractEventLoop) -> list[AsyncConnection]:
    """The connections of this process opened on ``loop`` and not closed yet.

    For :func:`rabbitry.service.run`, which closes those its main function left open.
    """
    return [conn for conn in list(_CONNECTIONS) if conn._loop is loop and not conn.is_closed]


def writes_of(connection: AsyncConnection) -> WritePath:
    """The connection's write path, for the library's publishing code (the publishers,
    the thread-safe facade's write gate); not for applications."""
    return connection._writes


def _after_fork() -> None:
    """In a forked child: the sockets and the loop belong to the parent.

    Each inherited connection is marked closed in the sans-IO core only (no frame is
    written, no event handled, the socket is left alone for the parent), so every later
    call raises :class:`InvalidStateError` at once, chained to an error naming the fork.
    """
    for conn in list(_CONNECTIONS):
        proto = conn._proto
        if proto is None or proto.state is ConnectionState.CLOSED:
            continue
        exc = InvalidStateError(
            f"this connection was opened in process {conn._pid} and cannot be used after "
            "fork(): its socket and event loop belong to the parent. Open a new "
            "connection in the child process (see 'Processes and fork' in docs/recovery.md)"
        )
        proto.abort(exc)
        proto.events_received()  # dropped: nothing of the parent's loop runs here
        conn.close_exc = exc
        conn._closing = True
        conn._transport = None
        conn._writes.paused = False


os.register_at_fork(after_in_child=_after_fork)
