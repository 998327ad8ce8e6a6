"""The public :class:`AsyncConnection`: the engine plus the factories of the high-level
objects.

The engine (:class:`rabbitry.aio.connection.AsyncConnection`) owns the socket, the
channels and recovery, and imports nothing above it. The publisher, the consumer, the
channel pool and the RPC objects are built on the engine; the methods that create them
live here, in a module above all of them, so that ``rabbitry.AsyncConnection`` offers
them without the engine depending on them.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Literal, overload

from .aio import connection as _engine
from .consumer import AsyncConsumer
from .exceptions import ConfigurationError
from .outbox_publisher import AsyncOutboxPublisher, open_outbox_publisher
from .pool import AsyncChannelPool
from .publisher import AsyncPublisher, open_publisher
from .rpc import AsyncRpcClient, AsyncRpcServer

if TYPE_CHECKING:
    from collections.abc import Callable

    from .consumer import AsyncHandler, DedupStore
    from .outbox import Outbox
    from .recovery import NackRetry
    from .rpc import RpcHandler
    from .topology._retry import RetryPolicy

__all__ = ["AsyncConnection"]


class AsyncConnection(_engine.AsyncConnection):
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
            ``None`` (the default) follows the broker's default for its version: 128 MiB
            on RabbitMQ 3.x, 16 MiB on 4.x (:mod:`rabbitry.broker`); a bigger body raises
            :class:`MessageTooLarge` before anything is sent.
        recovery: how to reconnect and replay channels, topology and consumers after a
            connection failure (:class:`rabbitry.RecoveryPolicy`; on by default);
            ``None`` ends the connection instead.
        credentials_provider: a callable returning ``(username, password)``, called
            before each connect and reconnect attempt (e.g. to fetch a short-lived token);
            what it returns replaces the URL's user and password. It may be a coroutine
            function. If it raises, the attempt fails with :class:`CredentialsError`
            (recovery then tries again after its backoff).

    Options given as keywords override the same options in the URLs' query strings.
    """

    # ------------------------------------------------------------------ factories

    @overload
    async def publisher(
        self,
        *,
        confirm: bool = ...,
        max_in_flight: int = ...,
        mandatory: bool = ...,
        timeout: float | None = ...,
        republish_unconfirmed: bool = ...,
        nack_retry: NackRetry | None = ...,
        outbox: None = ...,
    ) -> AsyncPublisher: ...

    @overload
    async def publisher(
        self,
        *,
        confirm: bool = ...,
        max_in_flight: int = ...,
        mandatory: bool = ...,
        timeout: float | None = ...,
        republish_unconfirmed: bool = ...,
        nack_retry: NackRetry | None = ...,
        outbox: Outbox,
    ) -> AsyncOutboxPublisher: ...

    async def publisher(
        self,
        *,
        confirm: bool = True,
        max_in_flight: int = 1000,
        mandatory: bool = False,
        timeout: float | None = None,
        republish_unconfirmed: bool = False,
        nack_retry: NackRetry | None = None,
        outbox: Outbox | None = None,
    ) -> AsyncPublisher | AsyncOutboxPublisher:
        """A publisher on its own channel (see :class:`rabbitry.AsyncPublisher`).

        With ``outbox`` (e.g. ``SQLiteOutbox(path)``) the result is an
        :class:`rabbitry.AsyncOutboxPublisher`: ``publish()`` returns once the message is
        durably stored, and the stored messages are delivered in the background.

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
            A :class:`rabbitry.AsyncPublisher`; with ``outbox``, an
            :class:`rabbitry.AsyncOutboxPublisher`.

        Raises:
            ConfigurationError: ``nack_retry`` given with ``outbox``.
        """
        if outbox is not None:
            if nack_retry is not None:
                raise ConfigurationError(
                    "nack_retry: not used with outbox (the outbox resends nacked messages "
                    "itself, with its own backoff)"
                )

            return await open_outbox_publisher(
                self,
                outbox,
                open_timeout=timeout,
                confirm=confirm,
                max_in_flight=max_in_flight,
                mandatory=mandatory,
                timeout=timeout,
                republish_unconfirmed=republish_unconfirmed,
            )
        return await open_publisher(
            self,
            open_timeout=timeout,
            confirm=confirm,
            max_in_flight=max_in_flight,
            mandatory=mandatory,
            timeout=timeout,
            republish_unconfirmed=republish_unconfirmed,
            nack_retry=nack_retry,
        )

    async def channel_pool(
        self, size: int = 10, *, confirm: bool = True, confirm_timeout: float | None = 30.0
    ) -> AsyncChannelPool:
        """A pool of at most ``size`` channels (see :class:`rabbitry.AsyncChannelPool`).

        Args:
            size: the most channels open at once.
            confirm: put the channels in confirm mode.
            confirm_timeout: seconds to wait for a confirm (``None``: no limit).

        Returns:
            The pool (channels are opened as needed).

        Raises:
            InvalidStateError: the connection is not open.
        """
        self._require_open()
        return AsyncChannelPool(self, size=size, confirm=confirm, confirm_timeout=confirm_timeout)

    def consumer(
        self,
        queue: str,
        handler: AsyncHandler,
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
    ) -> AsyncConsumer:
        """A handler-based consumer of ``queue`` (not started: ``await c.start()`` or
        ``async with``); see :class:`rabbitry.consumer.AsyncConsumer`.

        Args:
            queue: the queue to consume from.
            handler: ``handler(message)``, a coroutine function or a plain one (or
                ``handler(messages)`` with batches).
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

    async def rpc_client(
        self, *, exchange: str = "", timeout: float | None = 30.0
    ) -> AsyncRpcClient:
        """A started request/reply client; see :class:`rabbitry.rpc.AsyncRpcClient`.

        Args:
            exchange: the exchange requests are published to (``""``: the default one).
            timeout: the default seconds to wait for a reply (``None``: no limit).

        Returns:
            The started client.
        """
        client = AsyncRpcClient(self, exchange=exchange, timeout=timeout)
        await client.start()
        return client

    def rpc_server(
        self, queue: str, handler: RpcHandler, *, prefetch: int = 10, concurrency: int = 1
    ) -> AsyncRpcServer:
        """A request/reply server of ``queue`` (not started: ``await s.start()`` or
        ``async with``); see :class:`rabbitry.rpc.AsyncRpcServer`.

        Args:
            queue: the queue requests arrive on.
            handler: ``async handler(request)`` returns the reply body.
            prefetch: unacknowledged requests allowed.
            concurrency: handlers running at once.

        Returns:
            The server, not started.
        """
        return AsyncRpcServer(self, queue, handler, prefetch=prefetch, concurrency=concurrency)
