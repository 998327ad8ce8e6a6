"""Connection: the thread-safe twin of :class:`rabbitry.AsyncConnection`.

The IO thread, the portal and the channels are in ``_connection.py``; this module adds
the factories of the thread-safe publisher, consumer, channel pool and RPC objects,
which are built on that core class.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Literal, cast, overload

from ..exceptions import InvalidStateError
from ..pool import AsyncChannelPool
from . import _connection
from ._portal import caller_timeout
from .consumer import Consumer
from .outbox_publisher import OutboxPublisher
from .pool import ChannelPool
from .publisher import Publisher
from .rpc import RpcClient, RpcServer

if TYPE_CHECKING:
    from collections.abc import Callable

    from ..consumer import DedupStore, SyncHandler
    from ..outbox import Outbox
    from ..outbox_publisher import AsyncOutboxPublisher
    from ..protocol.message import Message
    from ..recovery import NackRetry
    from ..rpc import ReplyBody
    from ..topology._retry import RetryPolicy

__all__ = ["Connection"]


class Connection(_connection.Connection):
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

    # ------------------------------------------------------------------ factories

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

        if outbox is not None:
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
            wait=caller_timeout(timeout),
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

        self._require_portal()
        if not self._async.is_open:
            raise InvalidStateError("the connection is not open")
        return ChannelPool(
            self,
            AsyncChannelPool(
                self._async, size=size, confirm=confirm, confirm_timeout=confirm_timeout
            ),
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

        return RpcServer(self, queue, handler, prefetch=prefetch, concurrency=concurrency)
