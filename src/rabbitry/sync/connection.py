"""Connection: the thread-safe twin of :class:`rabbitry.AsyncConnection`.

One IO thread per connection runs the asyncio engine; this class only forwards to it
(see ``_portal.py`` for the hand-off and the callback dispatcher).
"""

from __future__ import annotations

import asyncio
import inspect
import itertools
import weakref
from typing import TYPE_CHECKING, Any, Literal, cast, overload

from ..aio.connection import AsyncConnection, CredentialsProvider
from ..exceptions import AMQPError, ConnectionClosedByClient, InvalidStateError, Timeout
from ..recovery import DEFAULT_RECOVERY
from ._portal import Dispatcher, Portal
from .channel import Channel, _wait

if TYPE_CHECKING:
    import ssl
    from collections.abc import Callable, Sequence

    from ..config import ConnectionParameters
    from ..consumer import DedupStore, SyncHandler
    from ..outbox import Outbox
    from ..outbox_publisher import AsyncOutboxPublisher
    from ..protocol.message import Message
    from ..record import TopologyRecord
    from ..recovery import NackRetry, RecoveryPolicy, State
    from ..rpc import ReplyBody
    from ..topology import RetryPolicy
    from .consumer import Consumer
    from .outbox_publisher import OutboxPublisher
    from .pool import ChannelPool
    from .publisher import Publisher
    from .rpc import RpcClient, RpcServer

__all__ = ["Connection"]

_CLOSE_TIMEOUT = 10.0
_ids = itertools.count(1)
#: Connections that connected in this process (rabbitry.run closes those left open).
_CONNECTED: weakref.WeakSet[Connection] = weakref.WeakSet()


class Connection:
    """A connection to RabbitMQ for threaded code; same options as ``AsyncConnection``.

    Usage::

        with Connection("amqp://guest:guest@localhost/") as conn:
            channel = conn.channel()
            channel.queue_declare("jobs", durable=True)
            for message in channel.consume("jobs", prefetch=10, timeout=5):
                message.ack()

    Any thread may use the connection and its channels. Callbacks (consumers, returns,
    blocked and close notifications) run on one dispatcher thread per connection, in
    order; a blocking callback delays later ones but never heartbeats.

    Attributes:
        callback_queue_size: callbacks queued for the dispatcher before the connection
            stops reading the socket (class attribute; set before ``connect``).
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

    def __enter__(self) -> Connection:
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
    def is_open(self) -> bool:
        """The connection is open and usable."""
        return self._async.is_open

    @property
    def is_closed(self) -> bool:
        """The connection was opened and is now closed."""
        return self._async.is_closed

    @property
    def recovery(self) -> RecoveryPolicy | None:
        """The recovery policy (``None``: a failed connection stays closed)."""
        return self._async.recovery

    @property
    def state(self) -> State:
        """CONNECTING, OPEN, RECOVERING or CLOSED."""
        return self._async.state

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

    def wait_recovered(self, timeout: float | None = None) -> None:
        """Block until the connection is OPEN; see :meth:`AsyncConnection.wait_recovered`.

        Args:
            timeout: seconds to wait (``None``: no limit).
        """
        self._require_portal().call(self._async.wait_recovered, timeout, wait=_wait(timeout))

    @property
    def is_blocked(self) -> bool:
        """The broker blocked publishing (resource alarm)."""
        return self._async.is_blocked

    @property
    def blocked_reason(self) -> str | None:
        """The broker's reason for the current block, or ``None``."""
        return self._async.blocked_reason

    @property
    def server_properties(self) -> dict[str, Any]:
        """The broker's server-properties."""
        return self._async.server_properties

    @property
    def server_version(self) -> tuple[int, ...]:
        """The broker's version, e.g. ``(4, 0, 5)``; ``()`` before connecting or if unknown."""
        return self._async.server_version

    @property
    def server_capabilities(self) -> dict[str, bool]:
        """The broker's ``capabilities`` table."""
        return self._async.server_capabilities

    @property
    def max_message_size(self) -> int:
        """The largest body sent or accepted (0 = no limit); follows the broker when not set."""
        return self._async.max_message_size

    @property
    def heartbeat(self) -> int:
        """The negotiated heartbeat interval in seconds."""
        return self._async.heartbeat

    @property
    def frame_max(self) -> int:
        """The negotiated largest frame size."""
        return self._async.frame_max

    @property
    def channel_max(self) -> int:
        """The negotiated highest channel number."""
        return self._async.channel_max

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

        def write_gate(resume: Callable[[], None]) -> bool:
            if engine._write_paused and engine._transport is not None:
                engine._writable_hooks.append(resume)
                return True
            return False

        portal.set_write_gate(write_gate)
        portal.on_stop = self._end_engine
        self._portal = portal
        try:
            portal.call(engine.connect, timeout, wait=_wait(timeout))
        except BaseException:
            portal.stop()
            self._portal = None
            raise
        self._dispatcher = Dispatcher(
            portal,
            f"rabbitry-callbacks-{self._id}",
            self.callback_queue_size,
            engine._pause_reading,
            engine._resume_reading,
        )
        portal.dispatcher = self._dispatcher
        _CONNECTED.add(self)

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

    def wait_closed(self, timeout: float | None = None) -> AMQPError:
        """Block until the connection ends.

        Args:
            timeout: seconds to wait (``None``: no limit).

        Returns:
            Why it ended.
        """
        return self._require_portal().call(self._async.wait_closed, timeout, wait=_wait(timeout))

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
        channel = portal.call(self._async.channel, channel_id, timeout=timeout, wait=_wait(timeout))
        return Channel(self, channel)

    @overload
    def publisher(
        self,
        *,
        confirm: bool = ...,
        max_in_flight: int = ...,
        mandatory: bool = ...,
        timeout: float | None = ...,
        republish_unconfirmed: bool = ...,
        nack_retry: NackRetry | None = ...,
        outbox: None = ...,
    ) -> Publisher: ...

    @overload
    def publisher(
        self,
        *,
        confirm: bool = ...,
        max_in_flight: int = ...,
        mandatory: bool = ...,
        timeout: float | None = ...,
        republish_unconfirmed: bool = ...,
        nack_retry: NackRetry | None = ...,
        outbox: Outbox,
    ) -> OutboxPublisher: ...

    def publisher(
        self,
        *,
        confirm: bool = True,
        max_in_flight: int = 1000,
        mandatory: bool = False,
        timeout: float | None = None,
        republish_unconfirmed: bool = False,
        nack_retry: NackRetry | None = None,
        outbox: Outbox | None = None,
    ) -> Publisher | OutboxPublisher:
        """A publisher on its own channel (see :class:`rabbitry.Publisher`).

        Args:
            confirm: use publisher confirms; ``False`` is fire-and-forget.
            max_in_flight: at most this many unconfirmed messages; past it ``publish``
                waits for a confirm.
            mandatory: default of ``publish(mandatory=...)``.
            timeout: the default deadline of each publish in seconds (``None``: none); it
                also bounds opening the publisher's channel.
            republish_unconfirmed: keep unconfirmed messages for recovery to send again
                after a reconnect (at-least-once).
            nack_retry: send a nacked message again after a backoff (``None``: a nack
                fails its future with :class:`Nacked`).
            outbox: store every message durably first (see ``docs/outbox.md``).

        Returns:
            A :class:`rabbitry.Publisher`; with ``outbox``, an
            :class:`rabbitry.OutboxPublisher`.
        """
        from .publisher import Publisher

        if outbox is not None:
            from .outbox_publisher import OutboxPublisher

            durable = self._require_portal().call(
                self._async.publisher,
                confirm=confirm,
                max_in_flight=max_in_flight,
                mandatory=mandatory,
                timeout=timeout,
                republish_unconfirmed=republish_unconfirmed,
                nack_retry=nack_retry,
                outbox=outbox,
                wait=None if timeout is None else timeout + 30.0,  # + reading the outbox
            )
            return OutboxPublisher(self, cast("AsyncOutboxPublisher", durable))
        engine = self._require_portal().call(
            self._async.publisher,
            confirm=confirm,
            max_in_flight=max_in_flight,
            mandatory=mandatory,
            timeout=timeout,
            republish_unconfirmed=republish_unconfirmed,
            nack_retry=nack_retry,
            wait=_wait(timeout),
        )
        return Publisher(self, engine)

    def channel_pool(
        self, size: int = 10, *, confirm: bool = True, confirm_timeout: float | None = 30.0
    ) -> ChannelPool:
        """A pool of at most ``size`` channels (see :class:`rabbitry.ChannelPool`).

        Args:
            size: the most channels open at once.
            confirm: put the channels in confirm mode.
            confirm_timeout: seconds to wait for a confirm (``None``: no limit).

        Returns:
            The pool (channels are opened as needed).

        Raises:
            InvalidStateError: the connection is not open.
        """
        from ..pool import AsyncChannelPool
        from .pool import ChannelPool

        self._require_portal()
        if not self._async.is_open:
            raise InvalidStateError("the connection is not open")
        return ChannelPool(
            self,
            AsyncChannelPool(
                self._async, size=size, confirm=confirm, confirm_timeout=confirm_timeout
            ),
        )

    def update_secret(
        self, new_secret: bytes | str, reason: str = "", *, timeout: float | None = None
    ) -> None:
        """Replace the credentials of the open connection (connection.update-secret).

        Args:
            new_secret: the new secret (e.g. a refreshed OAuth 2 token).
            reason: a text the broker logs.
            timeout: seconds to wait for update-secret-ok (``None``: no limit).
        """
        self._require_portal().call(
            self._async.update_secret, new_secret, reason, timeout=timeout, wait=_wait(timeout)
        )

    def consumer(
        self,
        queue: str,
        handler: SyncHandler,
        *,
        ack: Literal["manual", "auto"] = "manual",
        prefetch: int = 100,
        concurrency: int = 1,
        retry: RetryPolicy | None = None,
        batch_size: int | None = None,
        batch_timeout: float | None = None,
        exclusive: bool = False,
        arguments: dict[str, Any] | None = None,
        dedup: DedupStore | None = None,
        on_cancel: Callable[[str], Any] | None = None,
        resubscribe: bool = True,
    ) -> Consumer:
        """A handler-based consumer of ``queue`` (not started: ``c.start()`` or ``with``).

        ``handler(message)`` runs on a pool of ``concurrency`` threads; see
        :class:`rabbitry.sync.Consumer`.

        Args:
            queue: the queue to consume from.
            handler: ``handler(message)`` (or ``handler(messages)`` with batches).
            ack: ``"manual"`` (at-least-once, default) or ``"auto"`` (at-most-once).
            prefetch: unacknowledged deliveries allowed (raised to ``concurrency``).
            concurrency: handlers running at once.
            retry: a ``RetryPolicy`` (see ``rabbitry.topology``); ``None`` dead-letters.
            batch_size: deliver lists of up to this many messages.
            batch_timeout: seconds to wait for a batch to fill (default 1.0 with batches).
            exclusive: an exclusive consumer.
            arguments: consumer arguments (e.g. ``{"x-priority": 10}``).
            dedup: a :class:`DedupStore`; messages whose ``message_id`` it has seen are
                acked without calling the handler.
            on_cancel: ``callback(consumer_tag)`` when the broker cancels the consumer.
            resubscribe: consume again (with backoff) after a broker cancel or a channel
                error.

        Returns:
            The consumer, not started.
        """
        from .consumer import Consumer

        return Consumer(
            self,
            queue,
            handler,
            ack=ack,
            prefetch=prefetch,
            concurrency=concurrency,
            retry=retry,
            batch_size=batch_size,
            batch_timeout=batch_timeout,
            exclusive=exclusive,
            arguments=arguments,
            dedup=dedup,
            on_cancel=on_cancel,
            resubscribe=resubscribe,
        )

    def rpc_client(self, *, exchange: str = "", timeout: float | None = 30.0) -> RpcClient:
        """A started request/reply client; see :class:`rabbitry.sync.rpc.RpcClient`.

        Args:
            exchange: the exchange requests are published to (``""``: the default one).
            timeout: the default seconds to wait for a reply (``None``: no limit).

        Returns:
            The started client.
        """
        from .rpc import RpcClient

        client = RpcClient(self, exchange=exchange, timeout=timeout)
        client.start()
        return client

    def rpc_server(
        self,
        queue: str,
        handler: Callable[[Message], ReplyBody],
        *,
        prefetch: int = 10,
        concurrency: int = 1,
    ) -> RpcServer:
        """A request/reply server of ``queue`` (not started: ``s.start()`` or ``with``).

        See :class:`rabbitry.sync.rpc.RpcServer`.

        Args:
            queue: the queue requests arrive on.
            handler: ``handler(request)`` returns the reply body.
            prefetch: unacknowledged requests allowed.
            concurrency: handlers running at once.

        Returns:
            The server, not started.
        """
        from .rpc import RpcServer

        return RpcServer(self, queue, handler, prefetch=prefetch, concurrency=concurrency)

    # ------------------------------------------------------------------ internals

    def _end_engine(self) -> None:
        """IO thread, loop stopped: end the engine if ``close()`` did not (e.g. it was
        called from the IO thread, or its wait ran out), so that every future it holds
        fails now, and drop the socket."""
        reason = self._portal._stop_reason if self._portal is not None else None
        if not isinstance(reason, AMQPError):
            reason = ConnectionClosedByClient(200, "the connection's IO thread stopped")
        self._async._abort(reason)

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
        dispatcher = self._dispatcher
        if dispatcher is not None:
            dispatcher.post(fn, *args)


def _off_loop(provider: CredentialsProvider) -> CredentialsProvider:
    async def call() -> tuple[str, str]:
        result = await asyncio.to_thread(provider)
        if inspect.isawaitable(result):
            return await result
        return result

    return call
