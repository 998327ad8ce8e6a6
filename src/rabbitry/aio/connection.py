"""AsyncConnection: the asyncio engine around :class:`ConnectionProtocol`.

The engine owns the socket, the timers and the futures; every protocol rule lives in
``rabbitry.protocol``. Bytes flow ``data_received → receive_data → data_to_send → write``
and events flow ``events_received → futures and callbacks``. Two base classes hold
parts of the engine: :mod:`rabbitry.aio._socket` the socket's events and the corked
writes, :mod:`rabbitry.aio._events` the dispatch, the state changes and the endings.
"""

from __future__ import annotations

import asyncio
import inspect
import logging
import os
import ssl
import weakref
from collections.abc import Awaitable, Callable, Sequence
from typing import TYPE_CHECKING, Any, Self

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
from ._events import CLOSE_TIMEOUT, BlockedCallback, CloseCallback, ConnectionEvents, LoopHooks
from ._socket import SocketIO, Transport
from .channel import AsyncChannel, create_channel

if TYPE_CHECKING:
    from ..protocol.events import Event
    from ._lifecycle import ChannelEvents

__all__ = ["AsyncConnection"]

logger = logging.getLogger("rabbitry.connection")

# Every connection opened in this process, so that a forked child can disable them all.
CONNECTIONS: weakref.WeakSet[AsyncConnection] = weakref.WeakSet()

#: Returns ``(username, password)``; called before every connect and reconnect attempt.
CredentialsProvider = Callable[[], "tuple[str, str] | Awaitable[tuple[str, str]]"]


class AsyncConnection(ConnectionEvents, SocketIO):
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
        self._channels: dict[int, ChannelEvents[AsyncChannel]] = {}
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
        self._reading_paused = False
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

        Args:
            callback: called with the broker's reason, or ``None`` when unblocked.
        """
        self._blocked_callbacks.append(callback)

    def add_close_callback(self, callback: CloseCallback) -> None:
        """Call ``callback(exc)`` once when the connection ends, with the reason.

        Runs on the event loop; exceptions are logged.

        Args:
            callback: called with why the connection ended.
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
            VirtualHostNotFound / VirtualHostAccessRefused: the virtual host does not
                exist, or the user may not use it (not retried).
            ConnectError: no address accepted the connection; ``errors`` lists why.
            TLSError / CredentialsError / NotAnAMQPServer: every address failed that
                same way (the TLS handshake, the credentials provider, or no AMQP 0-9-1
                server there).
            Timeout: no address accepted the connection within ``timeout``.
            InvalidStateError: already connected.
        """
        if self._proto is not None:
            raise InvalidStateError("connect() was already called on this connection")
        self._loop = asyncio.get_running_loop()
        self._pid = os.getpid()
        CONNECTIONS.add(self)
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
                    lambda: Transport(self, proto),
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

        Args:
            reply_code: the close code sent to the broker.
            reply_text: the close text sent to the broker.
            timeout: seconds to wait for close-ok (``None``: 10 s).
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
                    timeout if timeout is not None else CLOSE_TIMEOUT,
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
        """Wait until the connection ends.

        Args:
            timeout: seconds to wait (``None``: no limit).

        Returns:
            Why it ended.

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

    def _loop_hooks(self) -> LoopHooks:
        """What :func:`loop_hooks` hands the thread-safe API's IO thread."""
        return LoopHooks(self._begin_batch, self._end_batch, self._abort)

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
        """Open a channel.

        While the connection recovers it waits for it (within ``timeout``), or fails
        when the recovery policy says so.

        Args:
            channel_id: the channel number (``None``: the lowest free one).
            timeout: seconds to wait for open-ok (``None``: no limit).

        Returns:
            The open channel.

        Raises:
            InvalidStateError: the connection is not open (or closed while recovering).
            LocalProtocolError: ``channel_id`` is taken or out of range, or no channel
                number is free.
            ConnectionRecovering: the connection is recovering and the recovery policy
                says to fail.
            Timeout: no open-ok (or no recovery) within ``timeout``.
        """
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
        assert self._loop is not None
        hooks = create_channel(
            self,
            channel_proto,
            self._writes,
            loop=self._loop,
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
        """Replace the credentials of the open connection (connection.update-secret).

        Args:
            new_secret: the new secret (e.g. a refreshed OAuth 2 token).
            reason: a text the broker logs.
            timeout: seconds to wait for update-secret-ok (``None``: no limit).

        Raises:
            InvalidStateError: the connection is not open, or another update waits for
                its answer.
            Timeout: no update-secret-ok within ``timeout``.
            AMQPConnectionError: the connection ended meanwhile (a broker that refuses
                the new secret closes the connection).
        """
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
            if proto is not None and proto.close_exc is not None:
                raise InvalidStateError(
                    f"the connection is closing ({proto.close_exc})"
                ) from proto.close_exc
            raise InvalidStateError("the connection is not open (call connect() first)")
        return proto

    # ------------------------------------------------------------------ recovery

    @property
    def state(self) -> State:
        """CONNECTING, OPEN, RECOVERING or CLOSED."""
        return self._state

    def on_state_change(self, callback: Callable[[State, AMQPError | None], Any]) -> None:
        """Call ``callback(state, cause)`` on every state change (on the event loop).

        Args:
            callback: called with the new :class:`State` and the error that caused the
                change (``None`` when there is none).
        """
        self._state_callbacks.append(callback)

    def on_queue_renamed(self, callback: Callable[[str, str], Any]) -> None:
        """Call ``callback(old, new)`` when recovery gives a server-named queue a new name.

        Args:
            callback: called with the queue's old and new names.
        """
        self._rename_callbacks.append(callback)

    def on_recovery_error(self, callback: Callable[[str, str, AMQPError], Any]) -> None:
        """Call ``callback(kind, name, exc)`` when an entity fails to re-declare.

        Args:
            callback: called with the kind of entity (``"exchange"``, ``"queue"``,
                ``"binding"``, ``"consumer"`` or ``"channel"``), its name and the error.
        """
        self._recovery_error_callbacks.append(callback)

    async def wait_recovered(self, timeout: float | None = None) -> None:
        """Return once the connection is OPEN (at once if it is).

        Args:
            timeout: seconds to wait (``None``: no limit).

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
    return connection._loop_hooks()


def open_connections(loop: asyncio.AbstractEventLoop) -> list[AsyncConnection]:
    """The connections of this process opened on ``loop`` and not closed yet.

    For :func:`rabbitry.service.run`, which closes those its main function left open.
    """
    return [conn for conn in list(CONNECTIONS) if loop_of(conn) is loop and not conn.is_closed]


def loop_of(connection: AsyncConnection) -> asyncio.AbstractEventLoop | None:
    """The event loop the connection was opened on (``None`` before its first connect),
    for the library's objects that run on it (the publishers); not for applications."""
    return connection._loop


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
    conn: AsyncConnection
    for conn in list(CONNECTIONS):
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
