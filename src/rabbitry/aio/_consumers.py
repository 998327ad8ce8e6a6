"""AsyncChannel's consumers: their records, delivery dispatch and recovery hooks.

:class:`ConsumerMethods` is a base of :class:`~rabbitry.aio.channel.AsyncChannel`;
the public consume methods stay on the channel and call into it.
"""

from __future__ import annotations

import asyncio
import inspect
import logging
from collections.abc import Awaitable, Callable, Mapping
from typing import TYPE_CHECKING, Any, Protocol

from ..exceptions import AMQPError
from ..message import Message
from ..protocol import spec
from ..streams import check_consume

if TYPE_CHECKING:
    from ..protocol.channel import ChannelProtocol
    from ..protocol.frames import Method
    from ..record import TopologyRecord

__all__ = ["CancelCallback", "ConsumerCallback", "ConsumerMethods"]

logger = logging.getLogger("rabbitry.channel")

#: A consumer callback: a plain function or a coroutine function taking the message.
ConsumerCallback = Callable[[Message], Awaitable[None] | None]
CancelCallback = Callable[[str], Any]

_END = object()
#: Deliveries queued for a coroutine consumer callback, and their body bytes, before
#: the connection stops reading the socket (until the queue is half empty).
_CONSUMER_QUEUE_MESSAGES = 1024
_CONSUMER_QUEUE_BYTES = 16 * 1024 * 1024


class _Consumer:
    """A registered consumer: where its deliveries go."""

    __slots__ = (
        "callback",
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


class _Connection(Protocol):
    """What a channel uses of its :class:`~rabbitry.aio.connection.AsyncConnection`.

    The connection creates its channels and imports their module; a channel knows it
    only through these members.
    """

    _loop: asyncio.AbstractEventLoop | None
    # AsyncChannel values (typed loosely: that module imports this one).
    _channels: dict[int, Any]
    topology_record: TopologyRecord

    def _pause_reading(self) -> None: ...

    def _resume_reading(self) -> None: ...

    def _forget_if_auto_deleted(self, queue: str) -> None: ...

    def _records_channel_topology(self) -> bool: ...


class ConsumerMethods:
    """The consumer half of :class:`~rabbitry.aio.channel.AsyncChannel`."""

    channel_id: int
    epoch: int
    _conn: _Connection
    _proto: ChannelProtocol
    _loop: asyncio.AbstractEventLoop
    _consumers: dict[str, _Consumer]
    _closed: asyncio.Future[AMQPError]
    _qos: tuple[int, int, bool] | None
    _suspended: bool
    _tag_offset: int
    _max_tag: int

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

        def basic_reject(self, delivery_tag: int, requeue: bool = True) -> None: ...

    async def _start_consumer(
        self,
        queue: str,
        callback: ConsumerCallback,
        *,
        consumer_tag: str = "",
        no_local: bool = False,
        no_ack: bool = False,
        exclusive: bool = False,
        arguments: Mapping[str, Any] | None = None,
        on_cancel: CancelCallback | None,
        on_close: Callable[[AMQPError], None] | None,
        timeout: float | None,
    ) -> str:
        check_consume(
            queue, arguments, no_ack=no_ack, qos=self._qos, record=self._conn.topology_record
        )
        consumer = _Consumer(callback, on_cancel)
        consumer.on_close = on_close
        # What recovery needs to subscribe again (the tag is filled in on consume-ok).
        consumer.spec = spec.BasicConsume(
            queue=queue,
            consumer_tag=consumer_tag,
            no_local=no_local,
            no_ack=no_ack,
            exclusive=exclusive,
            arguments=arguments,
        )

        def register(reply: spec.BasicConsumeOk) -> None:
            assert consumer.spec is not None
            consumer.spec.consumer_tag = reply.consumer_tag
            self._consumers[reply.consumer_tag] = consumer
            if consumer.is_async:
                consumer.queue = asyncio.Queue()
                consumer.task = self._loop.create_task(self._run_async_consumer(consumer))

        method = spec.BasicConsume(
            queue=queue,
            consumer_tag=consumer_tag,
            no_local=no_local,
            no_ack=no_ack,
            exclusive=exclusive,
            arguments=arguments,
        )
        reply: spec.BasicConsumeOk = await self._rpc(method, timeout, register)
        return reply.consumer_tag

    async def _abandon_consumer(self, tag: str, timeout: float = 10.0) -> None:
        """The consumer's owner is gone (an iterator ended, timed out or was dropped).

        Cancel it now if the channel is open; otherwise forget it at once, so recovery
        never subscribes it again into an inbox nobody reads.
        """
        if tag not in self._consumers:
            return
        if self._suspended or not self.is_open:
            consumer = self._drop_consumer(tag)
            if consumer is not None and consumer.spec is not None:
                self._conn._forget_if_auto_deleted(consumer.spec.queue)
            return
        try:
            await self.basic_cancel(tag, timeout=timeout)
        except AMQPError:
            # The channel ended or recovery began while cancelling: the broker's
            # consumer is gone with it, and ours must not come back.
            consumer = self._drop_consumer(tag)
            if consumer is not None and consumer.spec is not None:
                self._conn._forget_if_auto_deleted(consumer.spec.queue)

    def _on_delivery(self, message: Message) -> None:
        message.channel = self
        message.epoch = self.epoch
        tag = message.delivery_tag = message.delivery_tag + self._tag_offset
        if tag > self._max_tag:
            self._max_tag = tag
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
                queue.qsize() >= _CONSUMER_QUEUE_MESSAGES
                or consumer.queued_bytes >= _CONSUMER_QUEUE_BYTES
            ):
                # TCP back-pressure, as the sync dispatcher does: the broker keeps the
                # rest (no basic_qos means no other bound on what it sends).
                consumer.paused = True
                self._conn._pause_reading()
            return
        try:
            consumer.callback(message)
        except Exception:
            logger.exception("consumer callback %r failed", consumer.callback)

    async def _run_async_consumer(self, consumer: _Consumer) -> None:
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
                and queue.qsize() <= _CONSUMER_QUEUE_MESSAGES // 2
                and consumer.queued_bytes <= _CONSUMER_QUEUE_BYTES // 2
            ):
                self._release_consumer_pause(consumer)
            try:
                result = consumer.callback(item)
                if result is not None:
                    await result
            except Exception:
                logger.exception("consumer callback %r failed", consumer.callback)

    def _release_consumer_pause(self, consumer: _Consumer) -> None:
        if consumer.paused:
            consumer.paused = False
            self._conn._resume_reading()

    def _drop_consumer(self, tag: str) -> _Consumer | None:
        consumer = self._consumers.pop(tag, None)
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
