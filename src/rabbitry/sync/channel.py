"""Channel: the thread-safe twin of :class:`rabbitry.AsyncChannel`.

Every method has the async twin's name and parameters (a test checks it) and forwards to
it on the connection's IO thread; nothing here decides protocol rules. Blocking methods
take ``timeout=`` and raise :class:`rabbitry.Timeout` past it.

Threads: any thread may call any method. Requests from several threads are queued by
the protocol and never interleave; a publish is encoded in the calling thread and its
frames are queued whole, so concurrent publishes are never torn. Callbacks (consumers,
returns) run on the connection's dispatcher thread, never on the IO thread; exceptions
they raise are logged.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Protocol

from ..aio.channel import pipe_of
from ..exceptions import AMQPError, InvalidStateError
from ._consume import consume as _consume
from ._portal import ConfirmFuture
from ._portal import _wait as _wait  # re-exported: the twins import it from here

if TYPE_CHECKING:
    import concurrent.futures
    from collections.abc import Callable, Iterator, Mapping

    from ..aio.channel import AsyncChannel
    from ..protocol import spec
    from ..protocol.message import Message
    from ._portal import Portal

__all__ = ["Channel"]


class _Connection(Protocol):
    """What a channel uses of its :class:`~rabbitry.sync.Connection`, which creates its
    channels and imports this module."""

    @property
    def is_open(self) -> bool: ...


class Channel:
    """An open channel for threaded code. Get one with ``connection.channel()``."""

    def __init__(self, connection: _Connection, channel: AsyncChannel, portal: Portal) -> None:
        self._connection = connection
        self._async = channel
        self._portal = portal
        self.channel_id = channel.channel_id
        self._pipe = pipe_of(channel)  # the publishing side, for basic_publish

    def __repr__(self) -> str:
        return f"<Channel {self.channel_id} {'closed' if self.is_closed else 'open'}>"

    def __enter__(self) -> Channel:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    # ------------------------------------------------------------------ state

    @property
    def is_open(self) -> bool:
        """The channel is open and usable."""
        return self._async.is_open

    @property
    def is_closed(self) -> bool:
        """The channel is closed (see :attr:`close_exc`)."""
        return self._async.is_closed

    @property
    def close_exc(self) -> AMQPError | None:
        """Why the channel closed, once it has."""
        return self._async.close_exc

    @property
    def republished(self) -> int:
        """Unconfirmed messages this channel sent again after a recovery."""
        return self._async.republished

    @property
    def epoch(self) -> int:
        """How many times the connection recovered under this channel (stale-ack guard)."""
        return self._async.epoch

    @property
    def stale_settlements(self) -> int:
        """Acks, nacks and rejects dropped because their delivery came before a recovery."""
        return self._async.stale_settlements

    @property
    def confirm_mode(self) -> bool:
        """confirm.select was requested on this channel."""
        return self._async.confirm_mode

    @property
    def flow_active(self) -> bool:
        """The broker's channel.flow allows publishing."""
        return self._async.flow_active

    @property
    def connection(self) -> _Connection:
        """The connection this channel belongs to."""
        return self._connection

    def add_return_callback(self, callback: Callable[[Message], Any]) -> None:
        """Call ``callback(message)`` for every basic.return, on the dispatcher thread.

        Args:
            callback: called with each returned (unroutable mandatory) :class:`Message`.
        """
        post = self._portal.post_callback

        def on_return(message: Message) -> None:
            message.settle_through(self)
            post(callback, message)

        self._portal.submit(self._async.add_return_callback, on_return)

    def wait_closed(self, timeout: float | None = None) -> AMQPError:
        """Block until the channel closes.

        Args:
            timeout: seconds to wait (``None``: no limit).

        Returns:
            Why it closed.
        """
        return self._portal.call(self._async.wait_closed, timeout, wait=_wait(timeout))

    # ------------------------------------------------------------------ exchange

    def exchange_declare(
        self,
        exchange: str,
        type: str = "direct",
        *,
        passive: bool = False,
        durable: bool = False,
        auto_delete: bool = False,
        internal: bool = False,
        arguments: Mapping[str, Any] | None = None,
        timeout: float | None = None,
    ) -> spec.ExchangeDeclareOk:
        """Declare an exchange (see :meth:`AsyncChannel.exchange_declare`).

        Args:
            exchange: the exchange name.
            type: ``direct``, ``fanout``, ``topic``, ``headers`` or a plugin's type.
            passive: only check that the exchange exists.
            durable: it survives a broker restart.
            auto_delete: deleted when its last binding is removed.
            internal: clients cannot publish to it (only exchange-to-exchange bindings).
            arguments: e.g. ``{"alternate-exchange": "unrouted"}``.
            timeout: seconds to wait for the broker's reply (``None``: no limit); then
                :class:`Timeout`.

        Returns:
            The broker's declare-ok.
        """
        return self._portal.call(
            self._async.exchange_declare,
            exchange,
            type,
            passive=passive,
            durable=durable,
            auto_delete=auto_delete,
            internal=internal,
            arguments=arguments,
            timeout=timeout,
            wait=_wait(timeout),
        )

    def exchange_delete(
        self, exchange: str, *, if_unused: bool = False, timeout: float | None = None
    ) -> spec.ExchangeDeleteOk:
        """Delete an exchange.

        Args:
            exchange: the exchange name.
            if_unused: only if it has no bindings.
            timeout: seconds to wait for the broker's reply (``None``: no limit); then
                :class:`Timeout`.

        Returns:
            The broker's delete-ok.
        """
        return self._portal.call(
            self._async.exchange_delete,
            exchange,
            if_unused=if_unused,
            timeout=timeout,
            wait=_wait(timeout),
        )

    def exchange_bind(
        self,
        destination: str,
        source: str,
        routing_key: str = "",
        *,
        arguments: Mapping[str, Any] | None = None,
        timeout: float | None = None,
    ) -> spec.ExchangeBindOk:
        """Bind exchange ``destination`` to exchange ``source``.

        Args:
            destination: the exchange that receives the messages.
            source: the exchange they are published to.
            routing_key: the binding key.
            arguments: binding arguments (for a headers exchange, the headers to match).
            timeout: seconds to wait for the broker's reply (``None``: no limit); then
                :class:`Timeout`.

        Returns:
            The broker's bind-ok.
        """
        return self._portal.call(
            self._async.exchange_bind,
            destination,
            source,
            routing_key,
            arguments=arguments,
            timeout=timeout,
            wait=_wait(timeout),
        )

    def exchange_unbind(
        self,
        destination: str,
        source: str,
        routing_key: str = "",
        *,
        arguments: Mapping[str, Any] | None = None,
        timeout: float | None = None,
    ) -> spec.ExchangeUnbindOk:
        """Remove an exchange-to-exchange binding.

        Args:
            destination: the exchange that received the messages.
            source: the exchange they were published to.
            routing_key: the binding key.
            arguments: the binding's arguments.
            timeout: seconds to wait for the broker's reply (``None``: no limit); then
                :class:`Timeout`.

        Returns:
            The broker's unbind-ok.
        """
        return self._portal.call(
            self._async.exchange_unbind,
            destination,
            source,
            routing_key,
            arguments=arguments,
            timeout=timeout,
            wait=_wait(timeout),
        )

    # ------------------------------------------------------------------ queue

    def queue_declare(
        self,
        queue: str = "",
        *,
        passive: bool = False,
        durable: bool = False,
        exclusive: bool = False,
        auto_delete: bool = False,
        arguments: Mapping[str, Any] | None = None,
        timeout: float | None = None,
    ) -> spec.QueueDeclareOk:
        """Declare a queue; ``queue=""`` asks the broker for a name.

        Args:
            queue: the queue name (``""``: a server-named queue).
            passive: only check that the queue exists.
            durable: it survives a broker restart.
            exclusive: used by this connection only, deleted when it closes.
            auto_delete: deleted when its last consumer is cancelled.
            arguments: e.g. ``{"x-queue-type": "quorum"}``.
            timeout: seconds to wait for the broker's reply (``None``: no limit); then
                :class:`Timeout`.

        Returns:
            The reply, with ``queue``, ``message_count`` and ``consumer_count``.
        """
        return self._portal.call(
            self._async.queue_declare,
            queue,
            passive=passive,
            durable=durable,
            exclusive=exclusive,
            auto_delete=auto_delete,
            arguments=arguments,
            timeout=timeout,
            wait=_wait(timeout),
        )

    def queue_bind(
        self,
        queue: str,
        exchange: str,
        routing_key: str = "",
        *,
        arguments: Mapping[str, Any] | None = None,
        timeout: float | None = None,
    ) -> spec.QueueBindOk:
        """Bind a queue to an exchange.

        Args:
            queue: the queue.
            exchange: the exchange.
            routing_key: the binding key.
            arguments: binding arguments (for a headers exchange, the headers to match).
            timeout: seconds to wait for the broker's reply (``None``: no limit); then
                :class:`Timeout`.

        Returns:
            The broker's bind-ok.
        """
        return self._portal.call(
            self._async.queue_bind,
            queue,
            exchange,
            routing_key,
            arguments=arguments,
            timeout=timeout,
            wait=_wait(timeout),
        )

    def queue_unbind(
        self,
        queue: str,
        exchange: str,
        routing_key: str = "",
        *,
        arguments: Mapping[str, Any] | None = None,
        timeout: float | None = None,
    ) -> spec.QueueUnbindOk:
        """Remove a queue binding.

        Args:
            queue: the queue.
            exchange: the exchange.
            routing_key: the binding key.
            arguments: the binding's arguments.
            timeout: seconds to wait for the broker's reply (``None``: no limit); then
                :class:`Timeout`.

        Returns:
            The broker's unbind-ok.
        """
        return self._portal.call(
            self._async.queue_unbind,
            queue,
            exchange,
            routing_key,
            arguments=arguments,
            timeout=timeout,
            wait=_wait(timeout),
        )

    def queue_purge(self, queue: str, *, timeout: float | None = None) -> spec.QueuePurgeOk:
        """Remove all ready messages from a queue.

        Args:
            queue: the queue.
            timeout: seconds to wait for the broker's reply (``None``: no limit); then
                :class:`Timeout`.

        Returns:
            The reply, with the ``message_count`` removed.
        """
        return self._portal.call(
            self._async.queue_purge, queue, timeout=timeout, wait=_wait(timeout)
        )

    def queue_delete(
        self,
        queue: str,
        *,
        if_unused: bool = False,
        if_empty: bool = False,
        timeout: float | None = None,
    ) -> spec.QueueDeleteOk:
        """Delete a queue.

        Args:
            queue: the queue.
            if_unused: only if it has no consumers.
            if_empty: only if it has no messages.
            timeout: seconds to wait for the broker's reply (``None``: no limit); then
                :class:`Timeout`.

        Returns:
            The reply, with the ``message_count`` it held.
        """
        return self._portal.call(
            self._async.queue_delete,
            queue,
            if_unused=if_unused,
            if_empty=if_empty,
            timeout=timeout,
            wait=_wait(timeout),
        )

    # ------------------------------------------------------------------ basic

    def basic_qos(
        self,
        prefetch_count: int = 0,
        *,
        prefetch_size: int = 0,
        global_: bool = False,
        timeout: float | None = None,
    ) -> spec.BasicQosOk:
        """Limit unacknowledged deliveries.

        Args:
            prefetch_count: deliveries a consumer may hold unacknowledged (0: no limit).
            prefetch_size: the same in bytes (0: no limit; RabbitMQ supports only 0).
            global_: the limit is per channel, not per consumer.
            timeout: seconds to wait for the broker's reply (``None``: no limit); then
                :class:`Timeout`.

        Returns:
            The broker's qos-ok.
        """
        return self._portal.call(
            self._async.basic_qos,
            prefetch_count,
            prefetch_size=prefetch_size,
            global_=global_,
            timeout=timeout,
            wait=_wait(timeout),
        )

    def basic_publish(
        self,
        exchange: str,
        routing_key: str,
        body: bytes | bytearray | memoryview | str,
        *,
        properties: spec.BasicProperties | None = None,
        mandatory: bool = False,
    ) -> concurrent.futures.Future[None] | None:
        """Publish a message from any thread without waiting for the IO thread.

        The message is encoded (and validated) in the calling thread and queued whole.
        Blocks while too many operations, or too many bytes
        (``rabbitry.sync._portal.MAX_PENDING_BYTES``, 16 MiB), are queued for the IO
        thread: the socket is slower than the caller, or the broker has blocked the
        connection (a resource alarm). Closing the connection wakes it.

        Args:
            exchange: the exchange (``""``: the default exchange, routing by queue name).
            routing_key: the routing key.
            body: the body; a ``str`` is sent as UTF-8.
            properties: the message's properties.
            mandatory: an unroutable message comes back to the return callbacks.

        Returns:
            In confirm mode a ``concurrent.futures.Future`` that resolves on the broker's
            ack and fails with :class:`Nacked`, :class:`PublishRefused` (the broker closed
            the channel because of this message) or :class:`PublishOutcomeUnknown`;
            otherwise ``None``.

        Raises:
            LocalProtocolError: invalid field, property or body; nothing was queued.
            InvalidStateError: the channel is closed, or its connection is closing after
                a protocol error (the error is the cause).
        """
        channel = self._async
        if channel.close_exc is not None:  # channel.is_closed, without the property call
            raise InvalidStateError(
                f"cannot publish: channel {self.channel_id} is closed"
            ) from channel.close_exc
        proto = self._pipe.protocol
        if proto.connection_error is not None:
            raise InvalidStateError(
                f"cannot publish: the connection is closing after a protocol error "
                f"({proto.connection_error})"
            ) from proto.connection_error
        frames = proto.encode_publish(
            exchange,
            routing_key,
            body,  # type: ignore[arg-type]
            properties,
            mandatory,
        )
        future: concurrent.futures.Future[None] | None = None
        if proto.confirm_mode:
            future = ConfirmFuture()
        self._portal.submit(self._pipe.publish, frames, future, size=sum(map(len, frames)))
        return future

    def basic_consume(
        self,
        queue: str,
        callback: Callable[[Message], Any],
        *,
        consumer_tag: str = "",
        no_local: bool = False,
        no_ack: bool = False,
        exclusive: bool = False,
        arguments: Mapping[str, Any] | None = None,
        on_cancel: Callable[[str], Any] | None = None,
        timeout: float | None = None,
    ) -> str:
        """Start a consumer; ``callback(message)`` runs on the dispatcher thread.

        The callback may block (heartbeats keep flowing: they are the IO thread's job);
        while it does, later deliveries wait in a bounded queue and then in the socket.

        Args:
            queue: the queue to consume from.
            callback: called with each :class:`Message`, in order.
            consumer_tag: our tag for it (``""`` lets the broker choose).
            no_local: not supported by RabbitMQ; sent as given.
            no_ack: automatic acknowledgement (at-most-once).
            exclusive: no other consumer may use the queue.
            arguments: e.g. ``{"x-priority": 10}``.
            on_cancel: called with the tag, on the dispatcher thread, if the broker
                cancels the consumer.
            timeout: seconds to wait for consume-ok (``None``: no limit).

        Returns:
            The consumer tag.
        """
        portal = self._portal
        post, dispatcher = portal.post_callback, portal.dispatcher
        assert dispatcher is not None
        post_delivery, engine = dispatcher.post_delivery, self._async

        def deliver(message: Message) -> None:
            message.settle_through(self)
            # Dropped if the channel closes first: no callback after close() returns.
            post_delivery(engine, callback, message)

        cancel_hook = None
        if on_cancel is not None:
            hook = on_cancel

            def cancel_hook(tag: str) -> None:
                post(hook, tag)

        return self._portal.call(
            self._async.basic_consume,
            queue,
            deliver,
            consumer_tag=consumer_tag,
            no_local=no_local,
            no_ack=no_ack,
            exclusive=exclusive,
            arguments=arguments,
            on_cancel=cancel_hook,
            timeout=timeout,
            wait=_wait(timeout),
        )

    def basic_cancel(
        self, consumer_tag: str, *, timeout: float | None = None
    ) -> spec.BasicCancelOk:
        """Stop a consumer.

        Args:
            consumer_tag: the tag :meth:`basic_consume` returned.
            timeout: seconds to wait for the broker's reply (``None``: no limit); then
                :class:`Timeout`.

        Returns:
            The broker's cancel-ok.
        """
        return self._portal.call(
            self._async.basic_cancel, consumer_tag, timeout=timeout, wait=_wait(timeout)
        )

    def consume(
        self,
        queue: str,
        *,
        prefetch: int | None = None,
        timeout: float | None = None,
        no_ack: bool = False,
        exclusive: bool = False,
        arguments: Mapping[str, Any] | None = None,
        unpack_batches: bool = True,
    ) -> Iterator[Message]:
        """Iterate over deliveries: ``for message in channel.consume("q", timeout=5): ...``.

        Args:
            queue: the queue.
            prefetch: if given, ``basic_qos(prefetch)`` first (it bounds memory).
            timeout: the iteration ends when no message arrives within this many
                seconds (``None``: wait forever).
            no_ack: automatic acknowledgement.
            exclusive: exclusive consumer.
            arguments: consumer arguments.
            unpack_batches: hand out the records of batch envelopes one by one
                (:mod:`rabbitry.batching`); ``False`` hands out every message as
                delivered (to move messages unchanged).

        The consumer is cancelled when the loop ends (also on ``break``).

        Yields:
            Each delivery, in order (with ``unpack_batches``, each record of a batch
            envelope as a message of its own).

        Raises:
            ConsumerCancelled: the broker cancelled the consumer.
            ChannelClosed / AMQPConnectionError: the channel or connection ended.
        """
        return _consume(
            self,
            self._async,
            self._portal,
            self._connection,
            queue,
            prefetch=prefetch,
            timeout=timeout,
            no_ack=no_ack,
            exclusive=exclusive,
            arguments=arguments,
            unpack_batches=unpack_batches,
        )

    def basic_get(
        self, queue: str, *, no_ack: bool = False, timeout: float | None = None
    ) -> Message | None:
        """Fetch one message (basic.get).

        Args:
            queue: the queue.
            no_ack: automatic acknowledgement.
            timeout: seconds to wait for the broker's reply (``None``: no limit); then
                :class:`Timeout`.

        Returns:
            The message, or ``None`` when the queue is empty.
        """
        message = self._portal.call(
            self._async.basic_get, queue, no_ack=no_ack, timeout=timeout, wait=_wait(timeout)
        )
        if message is not None:
            message.settle_through(self)
        return message

    def basic_ack(self, delivery_tag: int = 0, multiple: bool = False) -> None:
        """Acknowledge a delivery; from any thread, without waiting.

        Args:
            delivery_tag: the delivery's tag (0 with ``multiple``: every delivery so far).
            multiple: and every earlier unacknowledged delivery of this channel.

        Raises:
            InvalidStateError: the channel is closed.
        """
        self._check_open("basic.ack")
        self._portal.submit(self._async.basic_ack, delivery_tag, multiple)

    def basic_nack(
        self, delivery_tag: int = 0, multiple: bool = False, requeue: bool = True
    ) -> None:
        """Reject one or many deliveries; from any thread, without waiting.

        Args:
            delivery_tag: the delivery's tag (0 with ``multiple``: every delivery so far).
            multiple: and every earlier unacknowledged delivery of this channel.
            requeue: put them back in the queue; ``False`` dead-letters or drops them.

        Raises:
            InvalidStateError: the channel is closed.
        """
        self._check_open("basic.nack")
        self._portal.submit(self._async.basic_nack, delivery_tag, multiple, requeue)

    def basic_reject(self, delivery_tag: int, requeue: bool = True) -> None:
        """Reject one delivery; from any thread, without waiting.

        Args:
            delivery_tag: the delivery's tag.
            requeue: put it back in the queue; ``False`` dead-letters or drops it.

        Raises:
            InvalidStateError: the channel is closed.
        """
        self._check_open("basic.reject")
        self._portal.submit(self._async.basic_reject, delivery_tag, requeue)

    def basic_recover(
        self, requeue: bool = True, *, timeout: float | None = None
    ) -> spec.BasicRecoverOk:
        """Redeliver all unacknowledged messages of this channel.

        Args:
            requeue: redeliver to any consumer (RabbitMQ implements only ``True``).
            timeout: seconds to wait for the broker's reply (``None``: no limit); then
                :class:`Timeout`.

        Returns:
            The broker's recover-ok.
        """
        return self._portal.call(
            self._async.basic_recover, requeue, timeout=timeout, wait=_wait(timeout)
        )

    # ------------------------------------------------------------------ confirm, tx, flow

    def confirm_select(self, *, timeout: float | None = None) -> spec.ConfirmSelectOk:
        """Turn on publisher confirms: ``basic_publish`` then returns a future.

        Args:
            timeout: seconds to wait for the broker's reply (``None``: no limit); then
                :class:`Timeout`.

        Returns:
            The broker's select-ok.
        """
        return self._portal.call(self._async.confirm_select, timeout=timeout, wait=_wait(timeout))

    def tx_select(self, *, timeout: float | None = None) -> spec.TxSelectOk:
        """Make the channel transactional.

        Args:
            timeout: seconds to wait for the broker's reply (``None``: no limit); then
                :class:`Timeout`.

        Returns:
            The broker's select-ok.
        """
        return self._portal.call(self._async.tx_select, timeout=timeout, wait=_wait(timeout))

    def tx_commit(self, *, timeout: float | None = None) -> spec.TxCommitOk:
        """Commit the current transaction.

        Args:
            timeout: seconds to wait for the broker's reply (``None``: no limit); then
                :class:`Timeout`.

        Returns:
            The broker's commit-ok.
        """
        return self._portal.call(self._async.tx_commit, timeout=timeout, wait=_wait(timeout))

    def tx_rollback(self, *, timeout: float | None = None) -> spec.TxRollbackOk:
        """Abandon the current transaction.

        Args:
            timeout: seconds to wait for the broker's reply (``None``: no limit); then
                :class:`Timeout`.

        Returns:
            The broker's rollback-ok.
        """
        return self._portal.call(self._async.tx_rollback, timeout=timeout, wait=_wait(timeout))

    def flow(self, active: bool, *, timeout: float | None = None) -> bool:
        """Ask the broker to pause or resume deliveries.

        Args:
            active: ``False`` pauses, ``True`` resumes.
            timeout: seconds to wait for the broker's reply (``None``: no limit); then
                :class:`Timeout`.

        Returns:
            The state the broker answered (``True``: active).
        """
        return self._portal.call(self._async.flow, active, timeout=timeout, wait=_wait(timeout))

    def close(
        self,
        reply_code: int = 200,
        reply_text: str = "Normal shutdown",
        *,
        timeout: float | None = None,
    ) -> None:
        """Close the channel and wait for close-ok. Idempotent.

        Args:
            reply_code: the close code sent to the broker.
            reply_text: the close text sent to the broker.
            timeout: seconds to wait for the broker's reply (``None``: no limit); then
                :class:`Timeout`.
        """
        if self.is_closed or not self._connection.is_open:
            return
        self._portal.call(
            self._async.close, reply_code, reply_text, timeout=timeout, wait=_wait(timeout)
        )

    def _check_open(self, what: str) -> None:
        if self._async.is_closed:
            raise InvalidStateError(
                f"cannot send {what}: channel {self.channel_id} is closed"
            ) from self._async.close_exc
