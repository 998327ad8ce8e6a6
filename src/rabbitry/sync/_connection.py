"""The core of :class:`rabbitry.Connection`, the thread-safe twin of
:class:`rabbitry.AsyncConnection`.

One IO thread per connection runs the asyncio engine; this class only forwards to it
(see ``_portal.py`` for the hand-off and the callback dispatcher). The members that do
nothing else are generated from :class:`~rabbitry.AsyncConnection` into the base class
:class:`~rabbitry.sync._connection_forwarding.ConnectionForwarding`
(``tools/gen_twins.py``). The factories of the
publisher, consumer, pool and RPC twins are added by the public class in
``connection.py``, which those twins do not import.
"""

from __future__ import annotations

import asyncio
import inspect
import itertools
import weakref
from typing import TYPE_CHECKING, Any, Self

from .._connection import AsyncConnection
from ..aio.connection import loop_hooks, writes_of
from ..exceptions import AMQPError, ConnectionClosedByClient, InvalidStateError, Timeout
from ..recovery import DEFAULT_RECOVERY
from ._connection_forwarding import ConnectionForwarding
from ._portal import Dispatcher, Portal, caller_timeout
from .channel import Channel

if TYPE_CHECKING:
    import ssl
    from collections.abc import Callable, Sequence

    from ..aio.connection import CredentialsProvider
    from ..config import ConnectionParameters
    from ..record import TopologyRecord
    from ..recovery import RecoveryPolicy, State

__all__ = ["Connection"]

_CLOSE_TIMEOUT = 10.0
_ids = itertools.count(1)
#: Connections that connected in this process (rabbitry.run closes those left open).
CONNECTED: weakref.WeakSet[Connection] = weakref.WeakSet()


class Connection(ConnectionForwarding):
    """The thread-safe connection without the factories of the high-level objects: the
    IO thread, the portal, the channels and the state.

    Applications construct :class:`rabbitry.Connection` (``rabbitry.sync.Connection``),
    which adds ``publisher()``, ``consumer()``, ``channel_pool()``, ``rpc_client()`` and
    ``rpc_server()``; its documentation describes the arguments. The thread-safe twins of
    those objects are built on this class and import it, not the public one.
    """

    callback_queue_size = 1024

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
        provider: CredentialsProvider | None = None
        if credentials_provider is not None and callable(credentials_provider):
            # A plain function may block (an HTTP call for a token): it runs in a worker
            # thread so the IO thread keeps serving the other connections' heartbeats.
            provider = _off_loop(credentials_provider)
        elif credentials_provider is not None:
            provider = credentials_provider  # AsyncConnection reports the type error
        self._async = AsyncConnection(
            url,
            heartbeat=heartbeat,
            connection_timeout=connection_timeout,
            channel_max=channel_max,
            frame_max=frame_max,
            connection_name=connection_name,
            auth_mechanism=auth_mechanism,
            ssl_context=ssl_context,
            client_properties=client_properties,
            max_message_size=max_message_size,
            recovery=recovery,
            credentials_provider=provider,
        )
        self._id = next(_ids)
        self._portal: Portal | None = None
        self._dispatcher: Dispatcher | None = None

    def __repr__(self) -> str:
        return repr(self._async).replace("AsyncConnection", "Connection", 1)

    def __enter__(self) -> Self:
        if self._portal is None:
            self.connect()
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    # ------------------------------------------------------------------ state

    @property
    def params(self) -> ConnectionParameters:
        """The parameters of the address in use (the first one before connecting)."""
        return self._async.params

    @property
    def recovery(self) -> RecoveryPolicy | None:
        """The recovery policy (``None``: a failed connection stays closed)."""
        return self._async.recovery

    def on_state_change(self, callback: Callable[[State, AMQPError | None], Any]) -> None:
        """Call ``callback(state, cause)`` on every state change; on the dispatcher thread.

        May be called before :meth:`connect`, as on the async twin; changes made while
        ``connect()`` runs are not reported (the dispatcher starts once it returns).

        Args:
            callback: called with the new :class:`State` and the error that caused the
                change (``None`` when there is none).
        """
        self._subscribe(
            self._async.on_state_change, lambda state, cause: self._post(callback, state, cause)
        )

    def on_queue_renamed(self, callback: Callable[[str, str], Any]) -> None:
        """Call ``callback(old, new)`` when recovery renames a server-named queue.

        May be called before :meth:`connect`; runs on the dispatcher thread.

        Args:
            callback: called with the queue's old and new names.
        """
        self._subscribe(
            self._async.on_queue_renamed, lambda old, new: self._post(callback, old, new)
        )

    def on_recovery_error(self, callback: Callable[[str, str, AMQPError], Any]) -> None:
        """Call ``callback(kind, name, exc)`` when an entity fails to re-declare.

        May be called before :meth:`connect`; runs on the dispatcher thread.

        Args:
            callback: called with the kind of entity, its name and the error.
        """
        self._subscribe(
            self._async.on_recovery_error,
            lambda kind, name, exc: self._post(callback, kind, name, exc),
        )

    @property
    def close_exc(self) -> AMQPError | None:
        """Why the connection ended, once it has."""
        return self._async.close_exc

    @property
    def topology_record(self) -> TopologyRecord:
        """What ``Topology.apply`` declared on this connection, in order (for recovery)."""
        return self._async.topology_record

    @property
    def io_thread_name(self) -> str | None:
        """The IO thread's name (for diagnostics)."""
        return self._portal.thread.name if self._portal else None

    def add_blocked_callback(self, callback: Callable[[str | None], Any]) -> None:
        """Call ``callback(reason)`` on connection.blocked, ``callback(None)`` on unblocked.

        Runs on the dispatcher thread. May be called before :meth:`connect`.

        Args:
            callback: called with the broker's reason, or ``None`` when unblocked.
        """
        self._subscribe(
            self._async.add_blocked_callback, lambda reason: self._post(callback, reason)
        )

    def add_close_callback(self, callback: Callable[[AMQPError], Any]) -> None:
        """Call ``callback(exc)`` once when the connection ends; on the dispatcher thread.

        May be called before :meth:`connect`.

        Args:
            callback: called with why the connection ended.
        """
        self._subscribe(self._async.add_close_callback, lambda exc: self._post(callback, exc))

    # ------------------------------------------------------------------ open / close

    def connect(self, timeout: float | None = None) -> None:
        """Start the IO thread and connect (see :meth:`AsyncConnection.connect`).

        Args:
            timeout: overall deadline in seconds (each address also has its own
                ``connection_timeout``).

        Raises:
            AuthenticationError, ConnectError, Timeout: as the async twin.
            InvalidStateError: already connected.
        """
        if self._portal is not None:
            raise InvalidStateError("connect() was already called on this connection")
        portal = Portal(f"rabbitry-io-{self._id}")
        engine = self._async
        portal.set_write_gate(writes_of(engine).defer)
        hooks = loop_hooks(engine)
        portal.set_batch_hooks(hooks.begin_batch, hooks.end_batch)
        portal.on_stop = self._end_engine
        self._portal = portal
        try:
            portal.call(engine.connect, timeout, wait=caller_timeout(timeout))
        except BaseException:
            portal.stop()
            self._portal = None
            raise
        reading = engine.read_flow
        self._dispatcher = Dispatcher(
            portal,
            f"rabbitry-callbacks-{self._id}",
            self.callback_queue_size,
            reading.pause,
            reading.resume,
        )
        portal.dispatcher = self._dispatcher
        CONNECTED.add(self)

    def close(
        self,
        reply_code: int = 200,
        reply_text: str = "Normal shutdown",
        *,
        timeout: float | None = None,
    ) -> None:
        """Close the connection and stop its threads; from any thread, idempotent.

        Returns within ``timeout`` (default 10 s) plus a short grace, even when the broker
        is gone or has blocked the connection: past it the socket is dropped.

        Everything pending fails at once with the reason: calls waiting in other threads,
        unconfirmed publishes, publishes still queued for the IO thread; threads blocked
        for room or by a resource alarm wake up and raise. Consumer callbacks not started
        yet are dropped (the broker requeues their messages): none starts once this
        returns. See "What close does to futures, consumers and callbacks" in
        ``docs/recovery.md``.

        Args:
            reply_code: the close code sent to the broker.
            reply_text: the close text sent to the broker.
            timeout: seconds to wait for close-ok (``None``: 10 s).
        """
        portal = self._portal
        if portal is None:
            return
        limit = _CLOSE_TIMEOUT if timeout is None else timeout
        if not portal.in_io_thread():
            try:
                portal.call(
                    self._async.close, reply_code, reply_text, timeout=limit, wait=limit + 2.0
                )
            except (AMQPError, InvalidStateError, Timeout):
                pass
        reason = self._async.close_exc or ConnectionClosedByClient(reply_code, reply_text)
        if self._dispatcher is not None:
            self._dispatcher.stop(timeout=min(limit, 1.0))
        portal.stop(timeout=min(limit, 5.0), reason=reason)

    # ------------------------------------------------------------------ channels

    def channel(self, channel_id: int | None = None, *, timeout: float | None = None) -> Channel:
        """Open a channel.

        Args:
            channel_id: the channel number (``None``: the lowest free one).
            timeout: seconds to wait for open-ok (``None``: no limit).

        Returns:
            The open channel.
        """
        portal = self._require_portal()
        channel = portal.call(
            self._async.channel, channel_id, timeout=timeout, wait=caller_timeout(timeout)
        )
        return Channel(self, channel, portal)

    # ------------------------------------------------------------------ internals

    def _end_engine(self) -> None:
        """IO thread, loop stopped: end the engine if ``close()`` did not (e.g. it was
        called from the IO thread, or its wait ran out), so that every future it holds
        fails now, and drop the socket."""
        reason = self._portal.stop_reason if self._portal is not None else None
        if not isinstance(reason, AMQPError):
            reason = ConnectionClosedByClient(200, "the connection's IO thread stopped")
        loop_hooks(self._async).abort(reason)

    def _require_portal(self) -> Portal:
        if self._portal is None:
            raise InvalidStateError("the connection is not open (call connect() first)")
        return self._portal

    def _subscribe(self, register: Callable[[Any], None], relay: Callable[..., None]) -> None:
        """Hand ``relay`` to one of the engine's ``register`` methods.

        Before :meth:`connect` the IO thread does not run yet, so nothing else touches
        the engine: register directly. After it, register on the IO thread.
        """
        portal = self._portal
        if portal is None:
            register(relay)
        else:
            portal.submit(register, relay)

    def _post(self, fn: Callable[..., Any], *args: Any) -> None:
        """IO thread: hand a user callback to the dispatcher thread."""
        portal = self._portal
        if portal is not None:
            portal.post_callback(fn, *args)


def portal_of(connection: Connection) -> Portal:
    """The IO thread's portal of an open ``connection``.

    For the library's thread-safe objects built on a connection (publishers, consumers,
    pools, RPC); not for applications.

    Raises:
        InvalidStateError: the connection is not open.
    """
    return connection._require_portal()


def engine_of(connection: Connection) -> AsyncConnection:
    """The asyncio engine under ``connection``, for the library's code that runs on its
    IO thread (e.g. ``Topology.apply``); not for applications."""
    return connection._async


def post_callback(connection: Connection, fn: Callable[..., Any], *args: Any) -> None:
    """IO thread: run the user callback ``fn(*args)`` on ``connection``'s dispatcher
    thread (for the library's thread-safe objects; not for applications)."""
    connection._post(fn, *args)


def _off_loop(provider: CredentialsProvider) -> CredentialsProvider:
    async def call() -> tuple[str, str]:
        result = await asyncio.to_thread(provider)
        if inspect.isawaitable(result):
            return await result
        return result

    return call
