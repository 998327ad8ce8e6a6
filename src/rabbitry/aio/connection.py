"""AsyncConnection: the asyncio engine around :class:`ConnectionProtocol`.

The engine owns the socket, the timers and the futures; every protocol rule lives in
``rabbitry.protocol``. Bytes flow ``data_received → receive_data → data_to_send → write``
and events flow ``events_received → futures and callbacks``. :class:`AsyncConnection`
composes the objects that do that work, each in its own module:

* :class:`~rabbitry.aio._socket.SocketIO`: the socket of the current attempt, the corked
  writes, and (its :class:`~rabbitry.aio._socket.ReadFlow`) the back-pressure on reads;
* :class:`~rabbitry.aio._dispatch.EventDispatcher`: the protocol's events to the
  channels, waiters and callbacks;
* :class:`~rabbitry.aio._timers.Timers`: the heartbeat tick and the close-ok deadline;
* :class:`~rabbitry.aio._connection_state.ConnectionLifecycle`: the state, the endings, the start
  of recovery;
* :class:`~rabbitry.aio._connect.Connector`: the connection attempts over the addresses;
* :class:`~rabbitry.aio._opener.ChannelOpener`: opening channels;
* :class:`~rabbitry.aio._recovery_port.RecoveryPort`: the connection as its recovery
  drives it.

:func:`~rabbitry.aio._parts.assemble` creates and wires them; the class keeps the public
API and forwards to them.
"""

from __future__ import annotations

import asyncio
import logging
import os
import weakref
from functools import cached_property
from typing import TYPE_CHECKING, Any, Self

from ..broker import RABBITMQ_3_MAX_MESSAGE_SIZE, server_capabilities
from ..config import ConnectionParameters, default_url, parse_urls
from ..exceptions import (
    AMQPError,
    InvalidStateError,
    Timeout,
)
from ..observability import _state as _obs
from ..protocol.connection import ConnectionProtocol, ConnectionState
from ..record import TopologyRecord
from ..recovery import DEFAULT_RECOVERY, RecoveryPolicy, State
from ._connection_state import CloseCallback, LoopHooks
from ._parts import assemble, check_provider

if TYPE_CHECKING:
    import ssl
    from collections.abc import Callable, Sequence

    from ..publishing.pipe import WritePath
    from ._connect import CredentialsProvider as CredentialsProvider
    from ._dispatch import BlockedCallback
    from ._lifecycle import ChannelEvents
    from ._socket import ReadFlow
    from .channel import AsyncChannel

__all__ = ["AsyncConnection"]

logger = logging.getLogger("rabbitry.connection")

# Every connection opened in this process, so that a forked child can disable them all.
CONNECTIONS: weakref.WeakSet[AsyncConnection] = weakref.WeakSet()


class AsyncConnection:
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
        check_provider(credentials_provider)
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
        candidates = parse_urls(
            url if url is not None else default_url(),
            **{k: v for k, v in options.items() if v is not None},
        )
        self._max_message_size = max_message_size
        self.params: ConnectionParameters = candidates[0]
        self.close_exc: AMQPError | None = None
        # What apply() declared, in order; automatic recovery replays it.
        self.topology_record = TopologyRecord()
        self.recovery = recovery
        # The hooks of every open channel (and of the suspended ones), by channel number.
        self._channels: dict[int, ChannelEvents[AsyncChannel]] = {}
        # The collaborators (see the module docstring), wired to each other.
        parts = assemble(self, self._channels, candidates, credentials_provider, max_message_size)
        self._io, _, self._dispatch, self._life, self._connector, self._opener = parts
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
        return self._life.is_closed

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
        given = self._max_message_size
        return RABBITMQ_3_MAX_MESSAGE_SIZE if given is None else given

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
        self._dispatch.blocked_callbacks.append(callback)

    def add_close_callback(self, callback: CloseCallback) -> None:
        """Call ``callback(exc)`` once when the connection ends, with the reason.

        Runs on the event loop; exceptions are logged.

        Args:
            callback: called with why the connection ended.
        """
        self._life.close_callbacks.append(callback)

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
        self._io.loop = asyncio.get_running_loop()
        self._pid = os.getpid()
        CONNECTIONS.add(self)
        self._life.connected(await self._connector.connect_any(timeout))

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
        await self._life.close(reply_code, reply_text, timeout)

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
        terminated = self._life.terminated
        if terminated is None:
            raise InvalidStateError("the connection was never opened")
        try:
            async with asyncio.timeout(timeout):
                return await asyncio.shield(terminated)
        except TimeoutError:
            raise Timeout(f"connection still open after {timeout} s") from None

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
        if self._life.state is State.RECOVERING:
            await self._life.await_recovery(timeout, "open a channel")
        return await self._opener.open(channel_id, timeout)

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
        self._require_open().update_secret(new_secret, reason)
        await self._dispatch.await_update_secret(timeout)

    def _require_open(self) -> ConnectionProtocol:
        return self._opener.require_open()

    # ------------------------------------------------------------------ recovery

    @property
    def state(self) -> State:
        """CONNECTING, OPEN, RECOVERING or CLOSED."""
        return self._life.state

    def on_state_change(self, callback: Callable[[State, AMQPError | None], Any]) -> None:
        """Call ``callback(state, cause)`` on every state change (on the event loop).

        Args:
            callback: called with the new :class:`State` and the error that caused the
                change (``None`` when there is none).
        """
        self._life.state_callbacks.append(callback)

    def on_queue_renamed(self, callback: Callable[[str, str], Any]) -> None:
        """Call ``callback(old, new)`` when recovery gives a server-named queue a new name.

        Args:
            callback: called with the queue's old and new names.
        """
        self._life.rename_callbacks.append(callback)

    def on_recovery_error(self, callback: Callable[[str, str, AMQPError], Any]) -> None:
        """Call ``callback(kind, name, exc)`` when an entity fails to re-declare.

        Args:
            callback: called with the kind of entity (``"exchange"``, ``"queue"``,
                ``"binding"``, ``"consumer"`` or ``"channel"``), its name and the error.
        """
        self._life.recovery_error_callbacks.append(callback)

    async def wait_recovered(self, timeout: float | None = None) -> None:
        """Return once the connection is OPEN (at once if it is).

        Args:
            timeout: seconds to wait (``None``: no limit).

        Raises:
            InvalidStateError: the connection is closed (for good).
            Timeout: still recovering after ``timeout`` seconds.
        """
        await self._life.wait_recovered(timeout)

    @cached_property
    def read_flow(self) -> ReadFlow:
        """The back-pressure on this connection's socket reads, for the library's
        consumers (see :class:`ReadFlow`); not for applications."""
        return self._io.flow

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
        if recorded is None or not recorded.auto_delete or self._dispatch.consumes(queue):
            return
        logger.debug("auto-delete queue %r lost its last consumer: forgotten", queue)
        self.topology_record.forget_queue(queue)

    # Read-only views of the collaborators' state, for tests and debugging.

    @property
    def _proto(self) -> ConnectionProtocol | None:
        return self._io.proto

    @property
    def _transport(self) -> asyncio.Transport | None:
        return self._io.transport

    @property
    def _read_pauses(self) -> int:
        return self._io.flow.pauses

    @property
    def _state_callbacks(self) -> list[Callable[[State, AMQPError | None], Any]]:
        return self._life.state_callbacks

    def _flush(self) -> None:
        self._io.flush()


def remove_callback(connection: AsyncConnection, callback: Callable[..., Any]) -> None:
    """Stop calling ``callback``, registered with ``add_blocked_callback``,
    ``add_close_callback`` or ``on_state_change`` (if it is), for the library's objects
    that stop listening when they close (publishers, RPC clients); not for applications.
    """
    life = connection._life
    for callbacks in (
        connection._dispatch.blocked_callbacks,
        life.close_callbacks,
        life.state_callbacks,
    ):
        if callback in callbacks:
            callbacks.remove(callback)


def loop_hooks(connection: AsyncConnection) -> LoopHooks:
    """The hooks of ``connection`` for the thread-safe API's IO thread; not for applications."""
    io = connection._io
    return LoopHooks(io.begin_batch, io.end_batch, connection._life.abort)


def open_connections(loop: asyncio.AbstractEventLoop) -> list[AsyncConnection]:
    """The connections of this process opened on ``loop`` and not closed yet.

    For :func:`rabbitry.service.run`, which closes those its main function left open.
    """
    return [conn for conn in list(CONNECTIONS) if loop_of(conn) is loop and not conn.is_closed]


def loop_of(connection: AsyncConnection) -> asyncio.AbstractEventLoop | None:
    """The event loop the connection was opened on (``None`` before its first connect),
    for the library's objects that run on it (the publishers); not for applications."""
    return connection._io.loop


def writes_of(connection: AsyncConnection) -> WritePath:
    """The connection's write path, for the library's publishing code (the publishers,
    the thread-safe facade's write gate); not for applications."""
    return connection._io.writes


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
        conn._life.closing = True
        conn._io.transport = None
        conn._io.writes.paused = False


os.register_at_fork(after_in_child=_after_fork)
