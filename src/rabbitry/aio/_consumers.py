"""AsyncChannel's consumers: their records, delivery dispatch and recovery hooks.

:class:`ConsumerMethods` is a base of :class:`~rabbitry.aio.channel.AsyncChannel`;
the public consume methods stay on the channel and call into it. A consumer starts from
a :class:`Subscription` (:meth:`ConsumerMethods.start_consumer`), which the library's
own consumers use too.
"""

from __future__ import annotations

import asyncio
import inspect
import logging
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol

from .._failure_log import RateLimitedLog
from ..exceptions import AMQPError
from ..protocol import spec
from ..protocol.message import Message
from ..protocol.streams import check_consume

if TYPE_CHECKING:
    from ..protocol.channel import ChannelProtocol
    from ..protocol.frames import Method
    from ..protocol.tags import DeliveryTags
    from ..record import TopologyRecord

__all__ = ["CancelCallback", "ConsumerCallback", "ConsumerMethods", "Subscription"]

logger = logging.getLogger("rabbitry.channel")

#: A consumer callback: a plain function or a coroutine function taking the message.
ConsumerCallback = Callable[[Message], Awaitable[None] | None]
CancelCallback = Callable[[str], Any]

_END = object()
#: Deliveries queued for a coroutine consumer callback, and their body bytes, before
#: the connection stops reading the socket (until the queue is half empty).
CONSUMER_QUEUE_MESSAGES = 1024
CONSUMER_QUEUE_BYTES = 16 * 1024 * 1024


@dataclass(frozen=True, slots=True)
class Subscription:
    """A consumer to start with :meth:`ConsumerMethods.start_consumer`: the basic.consume
    it sends and where its deliveries and its end go.

    Args:
        queue: the queue to consume from.
        callback: called with each delivered :class:`~rabbitry.Message`, in order (a
            plain function or a coroutine function, as for ``basic_consume``).
        consumer_tag: our tag for it ("" lets the broker choose).
        no_local: not supported by RabbitMQ; sent as given.
        no_ack: automatic acknowledgement (at-most-once).
        exclusive: no other consumer may use the queue.
        arguments: consumer arguments, e.g. ``{"x-priority": 10}``.
        on_cancel: called with the tag when the broker cancels the consumer, or when
            recovery cannot restore it.
        on_close: called with the reason when the channel ends under the consumer, or
            when recovery cannot restore it and there is no ``on_cancel``.
    """

    queue: str
    callback: ConsumerCallback
    consumer_tag: str = ""
    no_local: bool = False
    no_ack: bool = False
    exclusive: bool = False
    arguments: Mapping[str, Any] | None = None
    on_cancel: CancelCallback | None = None
    on_close: Callable[[AMQPError], None] | None = None

    def method(self) -> spec.BasicConsume:
        """A new basic.consume with these arguments.

        Returns:
            The method, a new object on each call: recovery keeps one of its own, in
            which it fills in the tag the broker chose.
        """
        return spec.BasicConsume(
            queue=self.queue,
            consumer_tag=self.consumer_tag,
            no_local=self.no_local,
            no_ack=self.no_ack,
            exclusive=self.exclusive,
            arguments=self.arguments,
        )


class Consumer:
    """A registered consumer: where its deliveries go."""

    __slots__ = (
        "callback",
        "errors",
        "is_async",
        "on_cancel",
        "on_close",
        "paused",
        "queue",
        "queued_bytes",
        "spec",
        "task",
    )

    def __init__(self, callback: ConsumerCallback, on_cancel: CancelCallback | None) -> None:
        self.callback = callback
        self.on_cancel = on_cancel
        # Told when the channel ends under the consumer (the iterator form uses it).
        self.on_close: Callable[[AMQPError], None] | None = None
        #: The basic.consume that made it, for recovery to send again.
        self.spec: spec.BasicConsume | None = None
        self.is_async = inspect.iscoroutinefunction(callback)
        # Async callbacks run one at a time, in delivery order, on a worker task. The
        # queue is bounded in messages and bytes: when full, the connection stops
        # reading the socket (``paused``) until the worker has drained it to half.
        self.queue: asyncio.Queue[Message | object] | None = None
        self.queued_bytes = 0
        self.paused = False
        self.task: asyncio.Task[None] | None = None
        # The rate-limited ERROR log of its callback's failures (made at the first one).
        self.errors: RateLimitedLog | None = None

    def failed(self, exc: Exception) -> None:
        """The callback raised: ERROR with the traceback, rate-limited with counts."""
        errors = self.errors
        if errors is None:
            errors = self.errors = RateLimitedLog(
                logger, f"consumer callback {self.callback!r}", "callback failures"
            )
        errors.log("raised", "consumer callback %r failed", self.callback, exc_info=exc)


class _ReadFlow(Protocol):
    """The connection's back-pressure on its socket reads (``aio._events.ReadFlow``)."""

    def pause(self) -> None: ...

    def resume(self) -> None: ...

    def recheck(self) -> None: ...


class Connection(Protocol):
    """What a channel uses of its :class:`~rabbitry.aio.connection.AsyncConnection`.

    The connection creates its channels and imports their module; a channel knows it
    only through these members.
    """

    topology_record: TopologyRecord

    @property
    def read_flow(self) -> _ReadFlow: ...

    def consumer_cancelled(self, queue: str) -> None: ...


class ConsumerMethods:
    """The consumer half of :class:`~rabbitry.aio.channel.AsyncChannel`."""

    channel_id: int
    _conn: Connection
    _proto: ChannelProtocol
    _loop: asyncio.AbstractEventLoop
    _consumers: dict[str, Consumer]
    _closed: asyncio.Future[AMQPError]
    _qos: tuple[int, int, bool] | None
    _suspended: bool
    _tags: DeliveryTags

    if TYPE_CHECKING:

        @property
        def is_open(self) -> bool: ...

        async def _rpc(
            self,
            method: Method,
            timeout: float | None,
            hook: Callable[[Any], None] | None = None,
        ) -> Any: ...

        async def _replay_rpc(self, method: Method) -> Any: ...

        async def basic_cancel(
            self, consumer_tag: str, *, timeout: float | None = None
        ) -> spec.BasicCancelOk: ...

        def basic_ack(self, delivery_tag: int = 0, multiple: bool = False) -> None: ...

        def basic_nack(
            self, delivery_tag: int = 0, multiple: bool = False, requeue: bool = True
        ) -> None: ...

        def basic_reject(self, delivery_tag: int, requeue: bool = True) -> None: ...

    async def start_consumer(
        self, subscription: Subscription, *, timeout: float | None = None
    ) -> str:
        """Start the consumer that ``subscription`` describes; returns its consumer tag.

        What ``basic_consume`` and ``consume`` do, for the library's own consumers too
        (:class:`rabbitry.AsyncConsumer`, the RPC client, the thread-safe
        ``Channel.consume``), which also hear when the channel ends under the consumer
        (``on_close``); not for applications, which use ``basic_consume`` or ``consume``.

        Args:
            subscription: the queue, the basic.consume options and the callbacks.
            timeout: seconds to wait for consume-ok (``None``: no limit).

        Returns:
            The consumer tag (the broker's choice when ``consumer_tag`` is empty).
        """
        check_consume(
            subscription.queue,
            subscription.arguments,
            no_ack=subscription.no_ack,
            qos=self._qos,
            record=self._conn.topology_record,
        )
        consumer = Consumer(subscription.callback, subscription.on_cancel)
        consumer.on_close = subscription.on_close
        # What recovery needs to subscribe again (the tag is filled in on consume-ok).
        consumer.spec = subscription.method()

        def register(reply: spec.BasicConsumeOk) -> None:
            assert consumer.spec is not None
            consumer.spec.consumer_tag = reply.consumer_tag
            self._consumers[reply.consumer_tag] = consumer
            if consumer.is_async:
                consumer.queue = asyncio.Queue()
                consumer.task = self._loop.create_task(self._run_async_consumer(consumer))

        reply: spec.BasicConsumeOk = await self._rpc(subscription.method(), timeout, register)
        return reply.consumer_tag

    async def abandon_consumer(self, consumer_tag: str, *, timeout: float = 10.0) -> None:
        """End a consumer whose owner is gone (an iterator ended, timed out or was
        dropped; a consumer object stopped), for the library's own consumers; not for
        applications, which use ``basic_cancel``.

        It is cancelled now if the channel is open; otherwise (the channel closed, or the
        connection recovering) it is forgotten at once, so that recovery never subscribes
        it again into an inbox nobody reads. A channel that ends while the cancel waits
        for its answer does the same, without an error. An unknown tag is ignored.

        Args:
            consumer_tag: the consumer's tag.
            timeout: seconds to wait for cancel-ok.
        """
        if consumer_tag not in self._consumers:
            return
        if self._suspended or not self.is_open:
            consumer = self._drop_consumer(consumer_tag)
            if consumer is not None and consumer.spec is not None:
                self._conn.consumer_cancelled(consumer.spec.queue)
            return
        try:
            await self.basic_cancel(consumer_tag, timeout=timeout)
        except AMQPError:
            # The channel ended or recovery began while cancelling: the broker's
            # consumer is gone with it, and ours must not come back.
            consumer = self._drop_consumer(consumer_tag)
            if consumer is not None and consumer.spec is not None:
                self._conn.consumer_cancelled(consumer.spec.queue)

    def _on_delivery(self, message: Message) -> None:
        self._tags.stamp(message, self)
        consumer = self._consumers.get(message.consumer_tag)
        if consumer is None:
            logger.warning(
                "channel %s: delivery for unknown consumer %r; requeueing it",
                self.channel_id,
                message.consumer_tag,
            )
            self.basic_reject(message.delivery_tag, requeue=True)
            return
        if consumer.is_async:
            queue = consumer.queue
            assert queue is not None
            queue.put_nowait(message)
            consumer.queued_bytes += len(message.body)
            if not consumer.paused and (
                queue.qsize() >= CONSUMER_QUEUE_MESSAGES
                or consumer.queued_bytes >= CONSUMER_QUEUE_BYTES
            ):
                # TCP back-pressure, as the sync dispatcher does: the broker keeps the
                # rest (no basic_qos means no other bound on what it sends).
                consumer.paused = True
                self._conn.read_flow.pause()
            return
        try:
            consumer.callback(message)
        except Exception as exc:
            consumer.failed(exc)

    async def _run_async_consumer(self, consumer: Consumer) -> None:
        queue = consumer.queue
        assert queue is not None
        while True:
            item = await queue.get()
            if item is _END or self._closed.done():
                # Closed: what is still queued is dropped (the broker requeues it).
                self._release_consumer_pause(consumer)
                return
            assert isinstance(item, Message)
            consumer.queued_bytes -= len(item.body)
            if (
                consumer.paused
                and queue.qsize() <= CONSUMER_QUEUE_MESSAGES // 2
                and consumer.queued_bytes <= CONSUMER_QUEUE_BYTES // 2
            ):
                self._release_consumer_pause(consumer)
            try:
                result = consumer.callback(item)
                if result is not None:
                    await result
            except Exception as exc:
                consumer.failed(exc)

    def _release_consumer_pause(self, consumer: Consumer) -> None:
        if consumer.paused:
            consumer.paused = False
            self._conn.read_flow.resume()

    def _drop_consumer(self, tag: str) -> Consumer | None:
        consumer = self._consumers.pop(tag, None)
        if consumer is not None and consumer.errors is not None:
            consumer.errors.close()  # the summary of the failures only counted
        if consumer is not None and consumer.is_async and consumer.queue is not None:
            consumer.queue.put_nowait(_END)
            if self._closed.done():
                self._release_consumer_pause(consumer)
        return consumer

    def _on_consumer_cancelled(self, tag: str) -> None:
        consumer = self._drop_consumer(tag)
        logger.warning("channel %s: the broker cancelled consumer %r", self.channel_id, tag)
        if consumer is not None and consumer.on_cancel is not None:
            try:
                consumer.on_cancel(tag)
            except Exception:
                logger.exception("cancel callback %r failed", consumer.on_cancel)

    def _consumer_specs(self) -> list[spec.BasicConsume]:
        """Recovery: the basic.consume of every live consumer, in subscription order."""
        return [c.spec for c in self._consumers.values() if c.spec is not None]

    async def _resubscribe_one(self, method: spec.BasicConsume, renamed: Mapping[str, str]) -> None:
        """Recovery: subscribe one consumer again, same tag, following a renamed queue.

        Raises:
            ChannelClosedByBroker: the broker refused (the channel is closed).
        """
        tag = method.consumer_tag
        if tag not in self._consumers:
            return  # its owner ended it while recovery ran
        method.queue = renamed.get(method.queue, method.queue)
        await self._replay_rpc(method)
        if tag not in self._consumers and self.is_open:
            # Abandoned while the consume was on its way: cancel what the broker made.
            await self._replay_rpc(spec.BasicCancel(consumer_tag=tag))

    def _lose_consumer(self, tag: str, exc: AMQPError) -> None:
        """Recovery could not restore this consumer: end it through its cancel path."""
        consumer = self._drop_consumer(tag)
        if consumer is None:
            return
        if consumer.on_cancel is not None:
            try:
                consumer.on_cancel(tag)
            except Exception:
                logger.exception("cancel callback %r failed", consumer.on_cancel)
        elif consumer.on_close is not None:
            consumer.on_close(exc)
