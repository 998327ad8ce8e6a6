"""AsyncConnection: the asyncio engine around :class:`ConnectionProtocol`.

The engine owns the socket, the timers and the futures; every protocol rule lives in
``rabbitry.protocol``. Bytes flow ``data_received → receive_data → data_to_send → write``
and events flow ``events_received → futures and callbacks``.

Writes are corked: API calls queue frames in the protocol and schedule one flush per
loop iteration, so a burst of publishes leaves in one ``write`` (DESIGN §3). A burst
longer than ``_FLUSH_FRAMES`` frames is flushed at once so memory stays bounded, and
publishers wait while the transport's buffer is above its high-water mark.
"""

from __future__ import annotations

import asyncio
import logging
import ssl
from collections.abc import Awaitable, Callable, Sequence
from typing import TYPE_CHECKING, Any, Literal

from ..config import ConnectionParameters, default_url, parse_urls
from ..exceptions import (
    AMQPConnectionError,
    AMQPError,
    AuthenticationError,
    ConnectError,
    ConnectionClosedByClient,
    InvalidStateError,
    Timeout,
)
from ..protocol import spec
from ..protocol.connection import ConnectionProtocol, ConnectionState
from ..protocol.events import (
    ChannelClosedEvent,
    ConnectionBlocked,
    ConnectionOpened,
    ConnectionTerminated,
    ConnectionUnblocked,
    ConsumerCancelled,
    Delivery,
    Event,
    FlowChanged,
    PublishConfirmed,
    Returned,
    RpcReply,
)
from ..record import TopologyRecord
from .channel import AsyncChannel

if TYPE_CHECKING:
    from ..consumer import AsyncConsumer, DedupStore
    from ..pool import AsyncChannelPool
    from ..publisher import AsyncPublisher

__all__ = ["AsyncConnection"]

logger = logging.getLogger("rabbitry.connection")

#: Flush at once when this many frames are queued within one loop iteration.
_FLUSH_FRAMES = 256
#: How long close() waits for connection.close-ok by default.
_CLOSE_TIMEOUT = 10.0

BlockedCallback = Callable[[str | None], Any]
CloseCallback = Callable[[AMQPError], Any]


class _Transport(asyncio.Protocol):
    """asyncio glue: forwards socket events to the connection."""

    def __init__(self, connection: AsyncConnection) -> None:
        self._connection = connection

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        assert isinstance(transport, asyncio.Transport)
        self._connection._on_connection_made(transport)

    def data_received(self, data: bytes) -> None:
        self._connection._on_data(data)

    def eof_received(self) -> bool:
        return False  # let the transport close; connection_lost follows

    def connection_lost(self, exc: Exception | None) -> None:
        self._connection._on_connection_lost(exc)

    def pause_writing(self) -> None:
        self._connection._write_paused = True

    def resume_writing(self) -> None:
        self._connection._resume_writing()


class AsyncConnection:
    """A connection to RabbitMQ for asyncio code.

    Usage::

        async with AsyncConnection("amqp://guest:guest@localhost/") as conn:
            channel = await conn.channel()
            await channel.queue_declare("jobs", durable=True)

    Args:
        url: an ``amqp://`` or ``amqps://`` URL, or several tried in order on connect.
            ``None`` reads ``RABBITMQ_URL`` (default ``amqp://guest:guest@127.0.0.1:5672/``).
        heartbeat: seconds; negotiated as the lower non-zero of ours and the broker's.
        connection_timeout: seconds for TCP connect + TLS + AMQP handshake, per address.
        channel_max: highest channel number wanted.
        frame_max: largest frame wanted (>= 4096).
        connection_name: shown in the management UI.
        auth_mechanism: PLAIN (default), AMQPLAIN or EXTERNAL.
        ssl_context: TLS settings; giving one turns TLS on for ``amqp://`` URLs too.
        client_properties: extra client-properties entries.
        max_message_size: largest message body sent or accepted (bytes; 0 = no limit).

    Options given as keywords override the same options in the URLs' query strings.
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
        max_message_size: int = 128 * 1024 * 1024,
    ) -> None:
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
        self._channels: dict[int, AsyncChannel] = {}
        self._opened: asyncio.Future[None] | None = None
        self._terminated: asyncio.Future[AMQPError] | None = None
        self._lost: asyncio.Future[None] | None = None
        self._flush_handle: asyncio.Handle | None = None
        self._tick_handle: asyncio.TimerHandle | None = None
        self._close_deadline: asyncio.TimerHandle | None = None
        self._write_paused = False
        self._drain_waiters: list[asyncio.Future[None]] = []
        # Called (loop thread) when the transport accepts writes again.
        self._writable_hooks: list[Callable[[], None]] = []
        self._update_secret_waiter: asyncio.Future[None] | None = None
        self._blocked_callbacks: list[BlockedCallback] = []
        self._close_callbacks: list[CloseCallback] = []
        self.close_exc: AMQPError | None = None
        # What apply() declared, in order; automatic recovery replays it.
        self.topology_record = TopologyRecord()

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
        errors: list[tuple[str, BaseException]] = []
        try:
            async with asyncio.timeout(timeout):
                for params in self._candidates:
                    try:
                        await self._connect_one(params)
                        self.params = params
                        return
                    except AuthenticationError:
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
        raise ConnectError(f"could not connect to any broker ({summary})", errors) from (
            errors[-1][1] if errors else None
        )

    def _reset_attempt(self) -> None:
        if self._transport is not None:
            self._transport.abort()
        self._transport = None
        self._proto = None
        self._cancel_timers()

    async def _connect_one(self, params: ConnectionParameters) -> None:
        loop = asyncio.get_running_loop()
        self._proto = ConnectionProtocol(
            username=params.username,
            password=params.password,
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
        self._terminated = loop.create_future()
        self._lost = loop.create_future()
        self.close_exc = None
        context: ssl.SSLContext | None = None
        if params.use_tls:
            context = params.ssl_context or ssl.create_default_context()
        try:
            async with asyncio.timeout(params.connection_timeout):
                await loop.create_connection(
                    lambda: _Transport(self),
                    params.host,
                    params.port,
                    ssl=context,
                    server_hostname=params.server_hostname if context else None,
                )
                await self._opened
        except TimeoutError:
            raise Timeout(
                f"{params.address}: no open connection within {params.connection_timeout} s"
            ) from None
        except AMQPError:
            raise  # already ours (AuthenticationError is also an OSError: keep it as it is)
        except OSError as exc:
            raise ConnectError(f"{params.address}: {exc}") from exc

    async def __aenter__(self) -> AsyncConnection:
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
        returns in bounded time even when the broker is gone.
        """
        proto = self._proto
        if proto is None or self._terminated is None:
            return
        if not self._terminated.done():
            proto.close(reply_code, reply_text)
            self._flush()
            self._handle_events(proto.events_received())
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

    def _pause_reading(self) -> None:
        """Stop reading the socket (the sync dispatcher is full); loop thread."""
        if self._transport is not None and self._proto is not None:
            self._proto.rx_paused = True
            self._transport.pause_reading()

    def _resume_reading(self) -> None:
        if self._transport is not None and self._proto is not None:
            self._proto.rx_paused = False
            self._transport.resume_reading()

    # ------------------------------------------------------------------ channels

    async def channel(
        self, channel_id: int | None = None, *, timeout: float | None = None
    ) -> AsyncChannel:
        """Open a channel (the lowest free number unless ``channel_id`` is given)."""
        proto = self._require_open()
        channel_proto = proto.open_channel(channel_id)
        channel = AsyncChannel(self, channel_proto)
        self._channels[channel_proto.channel_id] = channel
        await channel._await_rpc(spec.ChannelOpen.NAME, timeout)
        return channel

    async def publisher(
        self,
        *,
        confirm: bool = True,
        max_in_flight: int = 1000,
        mandatory: bool = False,
        timeout: float | None = None,
        republish_unconfirmed: bool = False,
    ) -> AsyncPublisher:
        """A publisher on its own channel (see :class:`rabbitry.AsyncPublisher`).

        ``timeout`` is the default deadline of each publish and also bounds opening the
        publisher's channel.
        """
        from ..publisher import AsyncPublisher

        return await AsyncPublisher._create(
            self,
            open_timeout=timeout,
            confirm=confirm,
            max_in_flight=max_in_flight,
            mandatory=mandatory,
            timeout=timeout,
            republish_unconfirmed=republish_unconfirmed,
        )

    async def channel_pool(self, size: int = 10, *, confirm: bool = True) -> AsyncChannelPool:
        """A pool of at most ``size`` channels (see :class:`rabbitry.AsyncChannelPool`)."""
        from ..pool import AsyncChannelPool

        self._require_open()
        return AsyncChannelPool(self, size=size, confirm=confirm)

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

    def consumer(
        self,
        queue: str,
        handler: Callable[[Any], Awaitable[Any]],
        *,
        ack: Literal["manual", "auto"] = "manual",
        prefetch: int = 100,
        concurrency: int = 1,
        retry: Any = None,
        batch_size: int | None = None,
        batch_timeout: float | None = None,
        exclusive: bool = False,
        arguments: dict[str, Any] | None = None,
        dedup: DedupStore | None = None,
        on_cancel: Callable[[str], Any] | None = None,
        resubscribe: bool = True,
    ) -> AsyncConsumer:
        """A handler-based consumer of ``queue`` (not started: ``await c.start()`` or
        ``async with``); see :class:`rabbitry.consumer.AsyncConsumer`."""
        from ..consumer import AsyncConsumer

        return AsyncConsumer(
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

    def _require_open(self) -> ConnectionProtocol:
        proto = self._proto
        if proto is None or proto.state is not ConnectionState.OPEN:
            if self.close_exc is not None:
                raise InvalidStateError("the connection is closed") from self.close_exc
            raise InvalidStateError("the connection is not open (call connect() first)")
        return proto

    # ------------------------------------------------------------------ writing

    def _kick(self) -> None:
        """Schedule a flush of queued frames for the end of this loop iteration."""
        proto = self._proto
        if proto is None:
            return
        if len(proto._out) >= _FLUSH_FRAMES:
            self._flush()
        elif self._flush_handle is None and self._loop is not None:
            self._flush_handle = self._loop.call_soon(self._flush)

    def _flush(self) -> None:
        self._flush_handle = None
        proto = self._proto
        if proto is None:
            return
        data = proto.data_to_send()
        transport = self._transport
        if data and transport is not None and not transport.is_closing():
            transport.write(data)

    async def _wait_writable(self) -> None:
        """Wait while the transport's write buffer is above its high-water mark."""
        while self._write_paused and self._transport is not None:
            assert self._loop is not None
            waiter = self._loop.create_future()
            self._drain_waiters.append(waiter)
            await waiter

    def _resume_writing(self) -> None:
        self._write_paused = False
        hooks, self._writable_hooks = self._writable_hooks, []
        for hook in hooks:
            hook()
        waiters, self._drain_waiters = self._drain_waiters, []
        for waiter in waiters:
            if not waiter.done():
                waiter.set_result(None)

    # ------------------------------------------------------------------ socket events

    def _on_connection_made(self, transport: asyncio.Transport) -> None:
        self._transport = transport
        self._flush()  # the protocol header

    def _on_data(self, data: bytes) -> None:
        proto = self._proto
        if proto is None:
            return
        proto.receive_data(data)
        out = proto.data_to_send()
        if out and self._transport is not None:
            self._transport.write(out)
        events = proto.events_received()
        if events:
            self._handle_events(events)
        if proto.state is ConnectionState.CLOSING and self._close_deadline is None:
            self._arm_close_deadline()

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

    def _on_tick(self) -> None:
        self._tick_handle = None
        proto = self._proto
        loop = self._loop
        if proto is None or loop is None:
            return
        proto.tick(loop.time())
        self._flush()
        self._handle_events(proto.events_received())
        interval = proto.tick_interval
        if interval and proto.state is not ConnectionState.CLOSED:
            self._tick_handle = loop.call_later(interval, self._on_tick)

    def _arm_close_deadline(self) -> None:
        """The protocol closes the connection (it found a violation): bound the wait."""
        assert self._loop is not None
        self._close_deadline = self._loop.call_later(_CLOSE_TIMEOUT, self._close_overdue)

    def _close_overdue(self) -> None:
        proto = self._proto
        if proto is not None and proto.state is ConnectionState.CLOSING:
            assert proto.close_exc is not None
            proto.abort(proto.close_exc)
            self._handle_events(proto.events_received())

    def _cancel_timers(self) -> None:
        if self._close_deadline is not None:
            self._close_deadline.cancel()
            self._close_deadline = None
        if self._tick_handle is not None:
            self._tick_handle.cancel()
            self._tick_handle = None
        if self._flush_handle is not None:
            self._flush_handle.cancel()
            self._flush_handle = None

    # ------------------------------------------------------------------ events

    def _handle_events(self, events: list[Event]) -> None:
        channels = self._channels
        for event in events:
            kind = type(event)
            if kind is Delivery:
                assert isinstance(event, Delivery)
                channel = channels.get(event.channel)
                if channel is not None:
                    channel._on_delivery(event.message)
            elif kind is PublishConfirmed:
                assert isinstance(event, PublishConfirmed)
                channel = channels.get(event.channel)
                if channel is not None:
                    channel._on_confirm(event.delivery_tag, event.multiple, event.ack)
            elif kind is RpcReply:
                assert isinstance(event, RpcReply)
                if event.channel == 0:
                    waiter = self._update_secret_waiter
                    self._update_secret_waiter = None
                    if waiter is not None and not waiter.done():
                        waiter.set_result(None)
                else:
                    channel = channels.get(event.channel)
                    if channel is not None:
                        channel._on_rpc_reply(event.method, event.message)
            elif kind is Returned:
                assert isinstance(event, Returned)
                channel = channels.get(event.channel)
                if channel is not None:
                    channel._on_return(event.message)
            elif kind is ConsumerCancelled:
                assert isinstance(event, ConsumerCancelled)
                channel = channels.get(event.channel)
                if channel is not None:
                    channel._on_consumer_cancelled(event.consumer_tag)
            elif kind is FlowChanged:
                assert isinstance(event, FlowChanged)
                channel = channels.get(event.channel)
                if channel is not None:
                    channel._on_flow(event.active)
            elif kind is ChannelClosedEvent:
                assert isinstance(event, ChannelClosedEvent)
                channel = channels.pop(event.channel, None)
                if channel is not None:
                    channel._on_closed(event.exc)
            elif kind is ConnectionOpened:
                self._on_opened()
            elif kind is ConnectionBlocked:
                assert isinstance(event, ConnectionBlocked)
                self._notify_blocked(event.reason)
            elif kind is ConnectionUnblocked:
                self._notify_blocked(None)
            elif kind is ConnectionTerminated:
                assert isinstance(event, ConnectionTerminated)
                self._on_terminated(event.exc)

    def _on_opened(self) -> None:
        if self._opened is not None and not self._opened.done():
            self._opened.set_result(None)
        proto = self._proto
        if proto is not None and proto.tick_interval and self._loop is not None:
            proto.tick(self._loop.time())
            self._tick_handle = self._loop.call_later(proto.tick_interval, self._on_tick)

    def _notify_blocked(self, reason: str | None) -> None:
        if reason is None:
            logger.info("connection unblocked by the broker")
        else:
            logger.warning("connection blocked by the broker: %s", reason)
        for callback in list(self._blocked_callbacks):
            try:
                callback(reason)
            except Exception:
                logger.exception("blocked callback %r failed", callback)

    def _on_terminated(self, exc: AMQPError) -> None:
        self.close_exc = exc
        self._cancel_timers()
        self._flush()  # e.g. the close-ok answering the broker's close
        transport = self._transport
        if transport is not None:
            if isinstance(exc, AMQPConnectionError) and not isinstance(
                exc, ConnectionClosedByClient
            ):
                transport.abort()
            else:
                transport.close()
        for channel in list(self._channels.values()):
            channel._on_closed(exc)
        self._channels.clear()
        self._resume_writing()
        waiter = self._update_secret_waiter
        self._update_secret_waiter = None
        if waiter is not None and not waiter.done():
            waiter.set_exception(exc)
        if self._terminated is not None and not self._terminated.done():
            self._terminated.set_result(exc)
        opened = self._opened
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
            logger.warning("connection to %s ended: %r", self.params.address, exc)
        for callback in list(self._close_callbacks):
            try:
                callback(exc)
            except Exception:
                logger.exception("close callback %r failed", callback)
