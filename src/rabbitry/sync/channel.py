"""Channel: the thread-safe twin of :class:`rabbitry.AsyncChannel`.

Every method has the async twin's name and parameters (a test checks it) and forwards to
it on the connection's IO thread; nothing here decides protocol rules. Blocking methods
take ``timeout=`` and raise :class:`rabbitry.Timeout` past it. The members that only
forward are generated from :class:`~rabbitry.AsyncChannel` into the base class
:class:`~rabbitry.sync._channel_forwarding.ChannelForwarding` (``tools/gen_twins.py``);
this module holds the ones that do more.

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
from ._channel_forwarding import ChannelForwarding
from ._consume import consume as _consume
from ._portal import ConfirmFuture
from ._portal import caller_timeout as caller_timeout  # re-exported: the twins import it from here

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


class Channel(ChannelForwarding):
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
    def close_exc(self) -> AMQPError | None:
        """Why the channel closed, once it has."""
        return self._async.close_exc

    @property
    def republished(self) -> int:
        """Unconfirmed messages this channel sent again after a recovery."""
        return self._async.republished

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

    # ------------------------------------------------------------------ basic

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
            wait=caller_timeout(timeout),
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
            self._async.basic_get,
            queue,
            no_ack=no_ack,
            timeout=timeout,
            wait=caller_timeout(timeout),
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

    # ------------------------------------------------------------------ close

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
            self._async.close, reply_code, reply_text, timeout=timeout, wait=caller_timeout(timeout)
        )

    def _check_open(self, what: str) -> None:
        if self._async.is_closed:
            raise InvalidStateError(
                f"cannot send {what}: channel {self.channel_id} is closed"
            ) from self._async.close_exc
