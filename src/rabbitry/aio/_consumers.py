"""AsyncChannel's consumers: their records, delivery dispatch and recovery.

:class:`ConsumerRegistry` is held by :class:`~rabbitry.aio.channel.AsyncChannel`; the
public consume methods stay on the channel and call into it. A consumer starts from a
:class:`Subscription` (``AsyncChannel.start_consumer``), which the library's own
consumers use too.
"""

from __future__ import annotations

import asyncio
import inspect
import logging
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol

from .._support.failure_log import RateLimitedLog
from ..exceptions import AMQPError
from ..protocol import spec
from ..protocol.channel import ChannelState
from ..protocol.message import Message
from ..protocol.streams import check_consume

if TYPE_CHECKING:
    from ..protocol.message import AckTarget
    from ..record import TopologyRecord
    from ._link import ChannelLink
    from ._requests import ReadFlow, Requests

__all__ = [
    "CancelCallback",
    "Connection",
    "Consumer",
    "ConsumerCallback",
    "ConsumerMethods",
    "ConsumerRegistry",
    "Subscription",
]

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
    """A consumer to start with ``AsyncChannel.start_consumer``: the basic.consume
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


class Connection(Protocol):
    """What a channel uses of its :class:`~rabbitry.aio.connection.AsyncConnection`.

    The connection creates its channels and imports their module; a channel knows it
    only through these members.
    """

    topology_record: TopologyRecord

    @property
    def read_flow(self) -> ReadFlow: ...

    def consumer_cancelled(self, queue: str) -> None: ...


class ConsumerRegistry:
    """A channel's consumers by tag: starts and ends them, hands each delivery to its
    consumer, and subscribes them again after recovery.

    Args:
        link: the channel's shared state.
        owner: the channel (deliveries settle through it; an unknown consumer's
            delivery is rejected on it).
        connection: the channel's connection.
        requests: the channel's requests (consume, cancel).
        loop: the connection's event loop.
    """

    __slots__ = ("_conn", "_link", "_loop", "_owner", "_requests", "consumers")

    def __init__(
        self,
        link: ChannelLink,
        owner: AckTarget,
        connection: Connection,
        requests: Requests,
        *,
        loop: asyncio.AbstractEventLoop,
    ) -> None:
        self._link = link
        self._owner = owner
        self._conn = connection
        self._requests = requests
        self._loop = loop
        #: The live consumers by consumer tag, in subscription order.
        self.consumers: dict[str, Consumer] = {}

    async def start(self, subscription: Subscription, timeout: float | None) -> str:
        """Start the consumer that ``subscription`` describes.

        Args:
            subscription: the queue, the basic.consume options and the callbacks.
            timeout: seconds to wait for consume-ok (``None``: no limit).

        Returns:
            The consumer tag.
        """
        check_consume(
            subscription.queue,
            subscription.arguments,
            no_ack=subscription.no_ack,
            qos=self._link.qos,
            record=self._conn.topology_record,
        )
        consumer = Consumer(subscription.callback, subscription.on_cancel)
        consumer.on_close = subscription.on_close
        # What recovery needs to subscribe again (the tag is filled in on consume-ok).
        consumer.spec = subscription.method()

        def register(reply: spec.BasicConsumeOk) -> None:
            assert consumer.spec is not None
            consumer.spec.consumer_tag = reply.consumer_tag
            self.consumers[reply.consumer_tag] = consumer
            if consumer.is_async:
                consumer.queue = asyncio.Queue()
                consumer.task = self._loop.create_task(self._run_async_consumer(consumer))

        reply: spec.BasicConsumeOk = await self._requests.call(
            subscription.method(), timeout, register
        )
        return reply.consumer_tag

    async def cancel(self, consumer_tag: str, timeout: float | None) -> spec.BasicCancelOk:
        """Send basic.cancel; the consumer is forgotten when cancel-ok is handled.

        Args:
            consumer_tag: the consumer's tag.
            timeout: seconds to wait for cancel-ok (``None``: no limit).

        Returns:
            The broker's cancel-ok.
        """
        result: spec.BasicCancelOk = await self._requests.call(
            spec.BasicCancel(consumer_tag=consumer_tag), timeout, self._unregister
        )
        return result

    def _unregister(self, reply: spec.BasicCancelOk) -> None:
        self.forget(reply.consumer_tag)

    def forget(self, consumer_tag: str) -> None:
        """Drop a consumer ended by us and tell the connection its queue lost it.

        Args:
            consumer_tag: the consumer's tag (an unknown one is ignored).
        """
        consumer = self.drop(consumer_tag)
        if consumer is not None and consumer.spec is not None:
            self._conn.consumer_cancelled(consumer.spec.queue)

    async def abandon(self, consumer_tag: str, timeout: float) -> None:
        """End a consumer whose owner is gone (see ``AsyncChannel.abandon_consumer``).

        Args:
            consumer_tag: the consumer's tag.
            timeout: seconds to wait for cancel-ok.
        """
        if consumer_tag not in self.consumers:
            return
        link = self._link
        if link.suspended or link.protocol.state is not ChannelState.OPEN:
            self.forget(consumer_tag)
            return
        try:
            await self.cancel(consumer_tag, timeout)
        except AMQPError:
            # The channel ended or recovery began while cancelling: the broker's
            # consumer is gone with it, and ours must not come back.
            self.forget(consumer_tag)

    def on_delivery(self, message: Message) -> None:
        """A delivery for one of the channel's consumers.

        Args:
            message: the delivery, as the protocol made it.
        """
        self._link.tags.stamp(message, self._owner)
        consumer = self.consumers.get(message.consumer_tag)
        if consumer is None:
            logger.warning(
                "channel %s: delivery for unknown consumer %r; requeueing it",
                self._link.channel_id,
                message.consumer_tag,
            )
            self._owner.basic_reject(message.delivery_tag, requeue=True)
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
        closed = self._link.closed
        while True:
            item = await queue.get()
            if item is _END or closed.done():
                # Closed: what is still queued is dropped (the broker requeues it).
                self._release_pause(consumer)
                return
            assert isinstance(item, Message)
            consumer.queued_bytes -= len(item.body)
            if (
                consumer.paused
                and queue.qsize() <= CONSUMER_QUEUE_MESSAGES // 2
                and consumer.queued_bytes <= CONSUMER_QUEUE_BYTES // 2
            ):
                self._release_pause(consumer)
            try:
                result = consumer.callback(item)
                if result is not None:
                    await result
            except Exception as exc:
                consumer.failed(exc)

    def _release_pause(self, consumer: Consumer) -> None:
        if consumer.paused:
            consumer.paused = False
            self._conn.read_flow.resume()

    def drop(self, tag: str) -> Consumer | None:
        """Forget a consumer and stop its worker.

        Args:
            tag: the consumer's tag.

        Returns:
            The consumer, or ``None`` for an unknown tag.
        """
        consumer = self.consumers.pop(tag, None)
        if consumer is not None and consumer.errors is not None:
            consumer.errors.close()  # the summary of the failures only counted
        if consumer is not None and consumer.is_async and consumer.queue is not None:
            consumer.queue.put_nowait(_END)
            if self._link.closed.done():
                self._release_pause(consumer)
        return consumer

    def on_cancelled(self, tag: str) -> None:
        """basic.cancel from the broker.

        Args:
            tag: the consumer's tag.
        """
        consumer = self.drop(tag)
        logger.warning("channel %s: the broker cancelled consumer %r", self._link.channel_id, tag)
        if consumer is not None and consumer.on_cancel is not None:
            try:
                consumer.on_cancel(tag)
            except Exception:
                logger.exception("cancel callback %r failed", consumer.on_cancel)

    def close_all(self, exc: AMQPError) -> None:
        """The channel ended: drop every consumer and tell those that listen.

        Args:
            exc: why the channel ended.
        """
        for tag in list(self.consumers):
            consumer = self.drop(tag)
            if consumer is not None and consumer.on_close is not None:
                consumer.on_close(exc)

    def specs(self) -> list[spec.BasicConsume]:
        """Recovery: the basic.consume of every live consumer, in subscription order.

        Returns:
            The methods, whose tags are the consumers' tags.
        """
        return [c.spec for c in self.consumers.values() if c.spec is not None]

    async def resubscribe_one(self, method: spec.BasicConsume, renamed: Mapping[str, str]) -> None:
        """Recovery: subscribe one consumer again, same tag, following a renamed queue.

        Args:
            method: the consumer's basic.consume (see :meth:`specs`).
            renamed: queues recovery declared under a new name, ``old: new``.

        Raises:
            ChannelClosedByBroker: the broker refused (the channel is closed).
        """
        tag = method.consumer_tag
        if tag not in self.consumers:
            return  # its owner ended it while recovery ran
        method.queue = renamed.get(method.queue, method.queue)
        await self._requests.replay(method)
        if tag not in self.consumers and self._link.protocol.state is ChannelState.OPEN:
            # Abandoned while the consume was on its way: cancel what the broker made.
            await self._requests.replay(spec.BasicCancel(consumer_tag=tag))

    def lose(self, tag: str, exc: AMQPError) -> None:
        """Recovery could not restore this consumer: end it through its cancel path.

        Args:
            tag: the consumer's tag.
            exc: why.
        """
        consumer = self.drop(tag)
        if consumer is None:
            return
        if consumer.on_cancel is not None:
            try:
                consumer.on_cancel(tag)
            except Exception:
                logger.exception("cancel callback %r failed", consumer.on_cancel)
        elif consumer.on_close is not None:
            consumer.on_close(exc)


class ConsumerMethods:
    """The consumer entry points of :class:`~rabbitry.aio.channel.AsyncChannel` that
    the library's own consumers use, over the channel's consumer registry.

    Args:
        consumers: the channel's consumer registry.
    """

    def __init__(self, consumers: ConsumerRegistry) -> None:
        self._consumer_registry = consumers

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
        return await self._consumer_registry.start(subscription, timeout)

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
        await self._consumer_registry.abandon(consumer_tag, timeout)
