"""The iteration of :meth:`rabbitry.sync.Channel.consume`: a consumer whose deliveries
the calling thread takes from a queue, cancelled when the iteration ends."""

from __future__ import annotations

import queue as queue_module
from typing import TYPE_CHECKING, Any, Protocol

from ..aio.channel import Subscription
from ..batching import BATCH_FORMAT_HEADER, RecordLedger, iter_delivery
from ..exceptions import AMQPError, ConsumerCancelled
from ..protocol.message import AckTarget, Message

if TYPE_CHECKING:
    from collections.abc import Iterator, Mapping

    from ..aio.channel import AsyncChannel
    from ..protocol import spec
    from ._portal import Portal


class _Open(Protocol):
    @property
    def is_open(self) -> bool: ...


class _Channel(AckTarget, Protocol):
    """What the iteration uses of its :class:`~rabbitry.sync.Channel` (its deliveries
    settle through it)."""

    @property
    def is_open(self) -> bool: ...

    @property
    def is_closed(self) -> bool: ...

    def basic_qos(
        self,
        prefetch_count: int = 0,
        *,
        prefetch_size: int = 0,
        global_: bool = False,
        timeout: float | None = None,
    ) -> spec.BasicQosOk: ...


def consume(
    channel: _Channel,
    engine: AsyncChannel,
    portal: Portal,
    connection: _Open,
    queue: str,
    *,
    prefetch: int | None,
    timeout: float | None,
    no_ack: bool,
    exclusive: bool,
    arguments: Mapping[str, Any] | None,
    unpack_batches: bool,
) -> Iterator[Message]:
    """The deliveries of ``channel.consume(queue, ...)``, in order; see there.

    ``engine`` is the channel's asyncio channel, ``portal`` its connection's way into the
    IO thread and ``connection`` its connection.
    """
    if prefetch is not None:
        channel.basic_qos(prefetch)
    inbox: queue_module.SimpleQueue[Message | BaseException] = queue_module.SimpleQueue()

    def deliver(message: Message) -> None:
        message.settle_through(channel)
        inbox.put(message)

    def cancelled(tag: str) -> None:
        inbox.put(ConsumerCancelled(tag))

    subscription = Subscription(
        queue,
        deliver,
        no_ack=no_ack,
        exclusive=exclusive,
        arguments=arguments,
        on_cancel=cancelled,
        on_close=inbox.put,
    )
    tag = portal.call(engine.start_consumer, subscription)
    ledger = RecordLedger()
    try:
        while True:
            try:
                item = inbox.get(timeout=timeout)
            except queue_module.Empty:
                return
            if isinstance(item, BaseException):
                raise item
            if unpack_batches:
                headers = item.properties.headers
                if headers is not None and BATCH_FORMAT_HEADER in headers:
                    yield from iter_delivery(item, no_ack, ledger)  # batch envelopes: records
                else:
                    ledger.last_plain = item
                    yield item  # (iter_delivery's own test, inlined: once per message)
            else:
                yield item
    finally:
        # Cancelled now if the channel is open; forgotten if the connection is
        # recovering, so recovery never subscribes it again into a dead inbox.
        if not channel.is_closed:
            try:
                portal.call(engine.abandon_consumer, tag, wait=30.0)
            except AMQPError:
                pass
        if channel.is_open and connection.is_open:
            # Deliveries that reached us but were never handed out go back to the
            # queue now, not when the channel closes (one by one: a multiple nack
            # would also hit messages the caller still holds).
            if not no_ack:
                while True:
                    try:
                        left = inbox.get_nowait()
                    except queue_module.Empty:
                        break
                    if isinstance(left, Message) and channel.is_open:
                        channel.basic_nack(left.delivery_tag, requeue=True)
