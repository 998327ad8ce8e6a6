"""AsyncChannel: the spec's channel methods for asyncio code.

Method and argument names are the AMQP 0-9-1 names in snake case. Synchronous methods
(declare, bind, qos, consume, get...) are coroutines that return the broker's reply;
they accept ``timeout=`` in seconds and raise :class:`rabbitry.Timeout` past it (the
reply, if it comes later, is matched and dropped). Acks, nacks and rejects are plain
methods: they only queue a frame.
"""

from __future__ import annotations

import asyncio
import copy
import inspect
import logging
from collections import deque
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping
from typing import TYPE_CHECKING, Any, Protocol, TypeVar

from ..batching import iter_delivery
from ..exceptions import (
    AMQPError,
    ChannelClosedByBroker,
    ChannelClosedByClient,
    ConnectionLost,
    ConsumerCancelled,
    Nacked,
    PublishOutcomeUnknown,
    PublishRefused,
    Timeout,
)
from ..message import Message
from ..protocol import spec
from ..protocol._refusal import PublishSummary, is_publish_refusal, refused_index, summarize
from ..protocol.channel import ChannelProtocol, ChannelState
from ..protocol.frames import Method
from ..protocol.publish import ConfirmTracker
from ..record import RecordedBinding, RecordedExchange, RecordedQueue
from ..streams import check_consume

if TYPE_CHECKING:
    from ..record import TopologyRecord

__all__ = ["AsyncChannel", "ConsumerCallback"]

logger = logging.getLogger("rabbitry.channel")

#: A consumer callback: a plain function or a coroutine function taking the message.
ConsumerCallback = Callable[[Message], Awaitable[None] | None]
ReturnCallback = Callable[[Message], Any]
CancelCallback = Callable[[str], Any]

M = TypeVar("M", bound=Method)


class _Connection(Protocol):
    """What a channel uses of its :class:`~rabbitry.aio.connection.AsyncConnection`.

    The connection creates its channels and imports this module; a channel knows it
    only through these members.
    """

    _loop: asyncio.AbstractEventLoop | None
    _channels: dict[int, AsyncChannel]
    _write_paused: bool
    topology_record: TopologyRecord

    async def _await_recovery(self, timeout: float | None, what: str) -> None: ...

    async def _wait_writable(self) -> None: ...

    def _kick(self) -> None: ...

    def _pause_reading(self) -> None: ...

    def _resume_reading(self) -> None: ...

    def _forget_if_auto_deleted(self, queue: str) -> None: ...

    def _records_channel_topology(self) -> bool: ...


class Settleable(Protocol):
    """What confirms settle: an asyncio or a concurrent.futures future."""

    def done(self) -> bool: ...

    def set_result(self, result: None, /) -> None: ...

    def set_exception(self, exception: BaseException, /) -> None: ...


_END = object()
#: Deliveries queued for a coroutine consumer callback, and their body bytes, before
#: the connection stops reading the socket (until the queue is half empty).
_CONSUMER_QUEUE_MESSAGES = 1024
_CONSUMER_QUEUE_BYTES = 16 * 1024 * 1024
#: How often (in publishes) the table of publish heads drops confirmed entries.
_HEADS_PRUNE = 1024


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


class AsyncChannel:
    """An open AMQP channel. Get one with ``await connection.channel()``.

    Usable as ``async with`` (closes on exit). Callbacks run on the event loop; their
    exceptions are logged, never raised into the connection.
    """

    def __init__(self, connection: _Connection, protocol: ChannelProtocol) -> None:
        self._conn = connection
        self._proto = protocol
        self.channel_id = protocol.channel_id
        loop = connection._loop
        assert loop is not None
        self._loop = loop
        # One future per request sent, answered in order; the hook runs when the reply
        # is handled (before later deliveries), e.g. to register a consumer.
        self._rpcs: deque[tuple[asyncio.Future[Any], Callable[[Any], None] | None]] = deque()
        self._consumers: dict[str, _Consumer] = {}
        # Confirm mode: the publishes awaiting their ack or nack, settled by _settle.
        self._confirms: ConfirmTracker[Settleable] = ConfirmTracker(_settle)
        # The method frame and content header of confirm-mode publishes whose waiter
        # does not keep its frames: what tells which publish a refusal names (see
        # _fail_pending). Pruned every _HEADS_PRUNE publishes, not per confirm.
        self._heads: dict[int, tuple[bytes, bytes]] = {}
        # Told when the confirm table becomes empty (see _confirms_settled).
        self._settled_waiters: list[asyncio.Future[None]] = []
        self._return_callbacks: list[ReturnCallback] = []
        self._closed: asyncio.Future[AMQPError] = loop.create_future()
        self.close_exc: AMQPError | None = None
        # Recovery: the connection died under the channel and will bring it back with a
        # new protocol object. Delivery tags keep growing across recoveries: the broker
        # numbers the new channel's deliveries from 1 again, and we hand them out as
        # that number plus _tag_offset (the highest tag handed out before). A tag at or
        # below the offset belongs to a dead connection, so settling it is dropped: it
        # can never settle a delivery made after the recovery.
        self.epoch = 0
        self._suspended = False
        self._tag_offset = 0
        self._max_tag = 0
        #: Acks, nacks and rejects dropped because their delivery tag was stale.
        self.stale_settlements = 0
        # Set by recovery when it could not restore this channel; calls name it.
        self._lost_reason: AMQPError | None = None
        # Record what this channel declares, binds and deletes for recovery to replay
        # (off for the channels recovery and the topology layer use themselves).
        self._records = connection._records_channel_topology()
        # A channel of recovery itself: closed, not suspended, when the connection drops.
        self._internal = False
        #: Unconfirmed publishes to send again after recovery, and how many were.
        self._resend: list[Settleable] = []
        self.republished = 0
        self._qos: tuple[int, int, bool] | None = None
        self._register_rpc(None)  # channel.open, already queued by the protocol

    def __repr__(self) -> str:
        return f"<AsyncChannel {self.channel_id} {self._proto.state.value}>"

    async def __aenter__(self) -> AsyncChannel:
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.close()

    # ------------------------------------------------------------------ state

    @property
    def is_open(self) -> bool:
        """The channel is open (or opening) and usable."""
        return self._proto.state is ChannelState.OPEN

    @property
    def is_closed(self) -> bool:
        """The channel is closed, by us or by the broker (see :attr:`close_exc`)."""
        return self._closed.done()

    @property
    def confirm_mode(self) -> bool:
        """confirm.select was requested on this channel."""
        return self._proto.confirm_mode

    @property
    def flow_active(self) -> bool:
        """The broker's channel.flow allows publishing."""
        return self._proto.flow_active

    @property
    def connection(self) -> _Connection:
        """The connection this channel belongs to."""
        return self._conn

    def add_return_callback(self, callback: ReturnCallback) -> None:
        """Call ``callback(message)`` for every basic.return (unroutable mandatory publish)."""
        self._return_callbacks.append(callback)

    async def wait_closed(self, timeout: float | None = None) -> AMQPError:
        """Wait until the channel closes; returns the reason.

        Raises:
            Timeout: still open after ``timeout`` seconds.
        """
        try:
            async with asyncio.timeout(timeout):
                return await asyncio.shield(self._closed)
        except TimeoutError:
            raise Timeout(f"channel still open after {timeout} s") from None

    # ------------------------------------------------------------------ requests

    def _register_rpc(self, hook: Callable[[Any], None] | None) -> asyncio.Future[Any]:
        future: asyncio.Future[Any] = self._loop.create_future()
        self._rpcs.append((future, hook))
        return future

    async def _await_rpc(self, name: str, timeout: float | None) -> Any:
        future = self._rpcs[-1][0]
        self._conn._kick()
        if timeout is None:
            return await future
        try:
            async with asyncio.timeout(timeout):
                return await future
        except TimeoutError:
            raise Timeout(f"{name} got no answer within {timeout} s") from None

    async def _rpc(
        self,
        method: Method,
        timeout: float | None,
        hook: Callable[[Any], None] | None = None,
    ) -> Any:
        if self._suspended:
            await self._conn._await_recovery(timeout, method.NAME)
        self._proto.send_method(method)
        self._register_rpc(hook)
        return await self._await_rpc(method.NAME, timeout)

    def _send(self, method: Method) -> None:
        self._proto.send_method(method)
        self._conn._kick()

    # -- exchange

    async def exchange_declare(
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
        """Declare an exchange (``passive``: only check that it exists)."""
        method = spec.ExchangeDeclare(
            exchange=exchange,
            type=type,
            passive=passive,
            durable=durable,
            auto_delete=auto_delete,
            internal=internal,
            arguments=arguments,
        )
        result: spec.ExchangeDeclareOk = await self._rpc(method, timeout)
        if self._records and not passive:
            self._conn.topology_record.add_exchange(
                RecordedExchange(
                    exchange, type, durable, auto_delete, internal, dict(arguments or {})
                )
            )
        return result

    async def exchange_delete(
        self, exchange: str, *, if_unused: bool = False, timeout: float | None = None
    ) -> spec.ExchangeDeleteOk:
        """Delete an exchange."""
        method = spec.ExchangeDelete(exchange=exchange, if_unused=if_unused)
        result: spec.ExchangeDeleteOk = await self._rpc(method, timeout)
        if self._records:
            self._conn.topology_record.forget_exchange(exchange)
        return result

    async def exchange_bind(
        self,
        destination: str,
        source: str,
        routing_key: str = "",
        *,
        arguments: Mapping[str, Any] | None = None,
        timeout: float | None = None,
    ) -> spec.ExchangeBindOk:
        """Bind exchange ``destination`` to exchange ``source`` (RabbitMQ extension)."""
        method = spec.ExchangeBind(
            destination=destination, source=source, routing_key=routing_key, arguments=arguments
        )
        result: spec.ExchangeBindOk = await self._rpc(method, timeout)
        if self._records:
            self._conn.topology_record.add_binding(
                RecordedBinding(source, destination, routing_key, dict(arguments or {}), "exchange")
            )
        return result

    async def exchange_unbind(
        self,
        destination: str,
        source: str,
        routing_key: str = "",
        *,
        arguments: Mapping[str, Any] | None = None,
        timeout: float | None = None,
    ) -> spec.ExchangeUnbindOk:
        """Remove an exchange-to-exchange binding."""
        method = spec.ExchangeUnbind(
            destination=destination, source=source, routing_key=routing_key, arguments=arguments
        )
        result: spec.ExchangeUnbindOk = await self._rpc(method, timeout)
        if self._records:
            self._conn.topology_record.forget_binding(
                RecordedBinding(source, destination, routing_key, dict(arguments or {}), "exchange")
            )
        return result

    # -- queue

    async def queue_declare(
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

        Returns:
            The reply, with ``queue``, ``message_count`` and ``consumer_count``.
        """
        method = spec.QueueDeclare(
            queue=queue,
            passive=passive,
            durable=durable,
            exclusive=exclusive,
            auto_delete=auto_delete,
            arguments=arguments,
        )
        result: spec.QueueDeclareOk = await self._rpc(method, timeout)
        if self._records and not passive:
            self._conn.topology_record.add_queue(
                RecordedQueue(
                    result.queue,
                    durable,
                    exclusive,
                    auto_delete,
                    dict(arguments or {}),
                    server_named=not queue,
                )
            )
        return result

    async def queue_bind(
        self,
        queue: str,
        exchange: str,
        routing_key: str = "",
        *,
        arguments: Mapping[str, Any] | None = None,
        timeout: float | None = None,
    ) -> spec.QueueBindOk:
        """Bind a queue to an exchange."""
        method = spec.QueueBind(
            queue=queue, exchange=exchange, routing_key=routing_key, arguments=arguments
        )
        result: spec.QueueBindOk = await self._rpc(method, timeout)
        if self._records:
            self._conn.topology_record.add_binding(
                RecordedBinding(exchange, queue, routing_key, dict(arguments or {}))
            )
        return result

    async def queue_unbind(
        self,
        queue: str,
        exchange: str,
        routing_key: str = "",
        *,
        arguments: Mapping[str, Any] | None = None,
        timeout: float | None = None,
    ) -> spec.QueueUnbindOk:
        """Remove a queue binding."""
        method = spec.QueueUnbind(
            queue=queue, exchange=exchange, routing_key=routing_key, arguments=arguments
        )
        result: spec.QueueUnbindOk = await self._rpc(method, timeout)
        if self._records:
            self._conn.topology_record.forget_binding(
                RecordedBinding(exchange, queue, routing_key, dict(arguments or {}))
            )
        return result

    async def queue_purge(self, queue: str, *, timeout: float | None = None) -> spec.QueuePurgeOk:
        """Remove all ready messages from a queue; the reply has ``message_count``."""
        result: spec.QueuePurgeOk = await self._rpc(spec.QueuePurge(queue=queue), timeout)
        return result

    async def queue_delete(
        self,
        queue: str,
        *,
        if_unused: bool = False,
        if_empty: bool = False,
        timeout: float | None = None,
    ) -> spec.QueueDeleteOk:
        """Delete a queue; the reply has the ``message_count`` it held."""
        method = spec.QueueDelete(queue=queue, if_unused=if_unused, if_empty=if_empty)
        result: spec.QueueDeleteOk = await self._rpc(method, timeout)
        if self._records:
            self._conn.topology_record.forget_queue(queue)
        return result

    # -- basic

    async def basic_qos(
        self,
        prefetch_count: int = 0,
        *,
        prefetch_size: int = 0,
        global_: bool = False,
        timeout: float | None = None,
    ) -> spec.BasicQosOk:
        """Limit unacknowledged deliveries (per consumer; ``global_`` per channel)."""
        method = spec.BasicQos(
            prefetch_size=prefetch_size, prefetch_count=prefetch_count, global_=global_
        )
        result: spec.BasicQosOk = await self._rpc(method, timeout)
        self._qos = (prefetch_count, prefetch_size, global_)  # replayed by recovery
        return result

    async def basic_publish(
        self,
        exchange: str,
        routing_key: str,
        body: bytes | bytearray | memoryview | str,
        *,
        properties: spec.BasicProperties | None = None,
        mandatory: bool = False,
    ) -> asyncio.Future[None] | None:
        """Publish a message.

        Waits only while the socket's write buffer is full. In confirm mode returns a
        future that resolves when the broker acks the message and fails with
        :class:`Nacked`, :class:`PublishRefused` (the broker closed the channel because of
        this message) or :class:`PublishOutcomeUnknown`; otherwise returns ``None``.
        A ``str`` body is sent as UTF-8. Returned (unroutable mandatory) messages go to
        the return callbacks.

        Raises:
            LocalProtocolError: a field, a property or the body is invalid; nothing sent.
            InvalidStateError: the channel is closed.
        """
        conn = self._conn
        if self._suspended:
            await conn._await_recovery(None, "basic.publish")
        if conn._write_paused:
            await conn._wait_writable()
        proto = self._proto
        frames = proto.encode_publish(exchange, routing_key, body, properties, mandatory)  # type: ignore[arg-type]
        seq = proto.send_publish(frames)
        conn._kick()
        if not seq:
            return None
        future: asyncio.Future[None] = self._loop.create_future()
        self._confirms.add(seq, future)
        self._keep_head(seq, frames)
        return future

    def _keep_head(self, seq: int, frames: list[bytes]) -> None:
        heads = self._heads
        heads[seq] = (frames[0], frames[2])
        if not seq % _HEADS_PRUNE:
            unconfirmed = self._confirms.tags()
            self._heads = {s: h for s, h in heads.items() if s in unconfirmed}

    def _publish_encoded(self, frames: list[bytes], waiter: Settleable | None) -> None:
        """Queue pre-encoded publish frames (the sync facade's hot path; loop thread).

        ``waiter`` (a concurrent future) is settled by the confirm in confirm mode,
        resolved with ``None`` at once otherwise, and failed if the channel is closed.
        """
        try:
            seq = self._proto.send_publish(frames)
        except AMQPError as exc:
            if waiter is not None:
                waiter.set_exception(exc)
            return
        self._conn._kick()
        if waiter is None:
            return
        if seq:
            self._confirms.add(seq, waiter)
            self._keep_head(seq, frames)
        else:
            waiter.set_result(None)

    async def basic_consume(
        self,
        queue: str,
        callback: ConsumerCallback,
        *,
        consumer_tag: str = "",
        no_local: bool = False,
        no_ack: bool = False,
        exclusive: bool = False,
        arguments: Mapping[str, Any] | None = None,
        on_cancel: CancelCallback | None = None,
        timeout: float | None = None,
    ) -> str:
        """Start a consumer; returns its consumer tag.

        Args:
            queue: the queue to consume from.
            callback: called with each :class:`Message`, in order. A coroutine function
                is awaited one message at a time on a worker task; deliveries wait for it
                in a queue of at most 1,024 messages or 16 MiB of bodies, past which
                the connection stops
                reading the socket until the queue is half empty (so a callback that
                waits for a reply on the same connection while its queue is full waits
                for ever: set ``basic_qos`` below the bound). A plain function runs on
                the event loop and must not block. Once the channel has closed, queued
                deliveries are dropped (the broker requeues them).
            consumer_tag: our tag for it ("" lets the broker choose).
            no_local: not supported by RabbitMQ; sent as given.
            no_ack: automatic acknowledgement (at-most-once).
            exclusive: no other consumer may use the queue.
            arguments: e.g. ``{"x-priority": 10}``.
            on_cancel: called with the tag if the broker cancels the consumer.
            timeout: seconds to wait for consume-ok.
        """
        return await self._start_consumer(
            queue,
            callback,
            consumer_tag=consumer_tag,
            no_local=no_local,
            no_ack=no_ack,
            exclusive=exclusive,
            arguments=arguments,
            on_cancel=on_cancel,
            on_close=None,
            timeout=timeout,
        )

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

    async def basic_cancel(
        self, consumer_tag: str, *, timeout: float | None = None
    ) -> spec.BasicCancelOk:
        """Stop a consumer. Deliveries already sent still reach its callback."""

        def unregister(reply: spec.BasicCancelOk) -> None:
            consumer = self._drop_consumer(reply.consumer_tag)
            if consumer is not None and consumer.spec is not None:
                self._conn._forget_if_auto_deleted(consumer.spec.queue)

        result: spec.BasicCancelOk = await self._rpc(
            spec.BasicCancel(consumer_tag=consumer_tag), timeout, unregister
        )
        return result

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

    async def consume(
        self,
        queue: str,
        *,
        prefetch: int | None = None,
        timeout: float | None = None,
        no_ack: bool = False,
        exclusive: bool = False,
        arguments: Mapping[str, Any] | None = None,
        unpack_batches: bool = True,
    ) -> AsyncIterator[Message]:
        """Iterate over deliveries: ``async for message in channel.consume("q"): ...``.

        Args:
            queue: the queue.
            prefetch: if given, ``basic_qos(prefetch)`` first.
            timeout: the iteration ends when no message arrives within this many
                seconds (``None``: wait forever).
            no_ack: automatic acknowledgement.
            exclusive: exclusive consumer.
            arguments: consumer arguments.
            unpack_batches: hand out the records of batch envelopes one by one
                (:mod:`rabbitry.batching`); ``False`` hands out every message as
                delivered (to move messages unchanged).

        The consumer is cancelled when the iteration ends; to end it early and at once,
        wrap the iterator in ``contextlib.aclosing``.

        Raises:
            ConsumerCancelled: the broker cancelled the consumer.
            ChannelClosed / AMQPConnectionError: the channel or connection ended.
        """
        if prefetch is not None:
            await self.basic_qos(prefetch)
        inbox: asyncio.Queue[Message | BaseException] = asyncio.Queue()

        def deliver(message: Message) -> None:
            inbox.put_nowait(message)

        def cancelled(tag: str) -> None:
            inbox.put_nowait(ConsumerCancelled(tag))

        tag = await self._start_consumer(
            queue,
            deliver,
            no_ack=no_ack,
            exclusive=exclusive,
            arguments=arguments,
            on_cancel=cancelled,
            on_close=inbox.put_nowait,
            timeout=None,
        )
        try:
            while True:
                try:
                    async with asyncio.timeout(timeout):
                        item = await inbox.get()
                except TimeoutError:
                    return
                if isinstance(item, BaseException):
                    raise item
                if not unpack_batches:
                    yield item
                    continue
                records = iter_delivery(item, no_ack)  # batch envelopes: records
                try:
                    for handed in records:
                        yield handed
                finally:
                    records.close()  # an envelope left part-way goes back at once
        finally:
            await self._abandon_consumer(tag)
            # Deliveries that reached us but were never handed out go back to the queue
            # now (one by one: a multiple nack would hit messages the caller holds).
            while not no_ack and not inbox.empty() and self.is_open:
                left = inbox.get_nowait()
                if isinstance(left, Message):
                    self.basic_nack(left.delivery_tag, requeue=True)

    async def basic_get(
        self, queue: str, *, no_ack: bool = False, timeout: float | None = None
    ) -> Message | None:
        """Fetch one message, or ``None`` when the queue is empty."""
        reply = await self._rpc(spec.BasicGet(queue=queue, no_ack=no_ack), timeout)
        if isinstance(reply, Message):
            reply.channel = self
            reply.epoch = self.epoch
            tag = reply.delivery_tag = reply.delivery_tag + self._tag_offset
            if tag > self._max_tag:
                self._max_tag = tag
            return reply
        return None

    def basic_ack(self, delivery_tag: int = 0, multiple: bool = False) -> None:
        """Acknowledge a delivery (``multiple``: and every earlier one).

        Contiguous acks made before the next write leave as one ``multiple`` ack: the
        acks consumer callbacks make while one read of deliveries is handled, or the
        acks after the first in one loop iteration. The broker settles the same
        deliveries either way. A tag
        handed out before the connection recovered is dropped with a warning (the
        broker redelivers that message); ``multiple`` never reaches across a recovery.
        """
        offset = self._tag_offset
        if self._suspended or (delivery_tag and delivery_tag <= offset):
            self._drop_stale("basic.ack", delivery_tag)
            return
        self._proto.send_ack(delivery_tag - offset if delivery_tag else 0, multiple)
        self._conn._kick()

    def basic_nack(
        self, delivery_tag: int = 0, multiple: bool = False, requeue: bool = True
    ) -> None:
        """Reject one or (``multiple``) many deliveries; requeue or dead-letter them.

        A stale tag (from before a recovery) is dropped like in :meth:`basic_ack`.
        """
        offset = self._tag_offset
        if self._suspended or (delivery_tag and delivery_tag <= offset):
            self._drop_stale("basic.nack", delivery_tag)
            return
        wire = delivery_tag - offset if delivery_tag else 0
        self._send(spec.BasicNack(delivery_tag=wire, multiple=multiple, requeue=requeue))
        self._proto.settled(wire, multiple)

    def basic_reject(self, delivery_tag: int, requeue: bool = True) -> None:
        """Reject one delivery; requeue or dead-letter it (a stale tag is dropped)."""
        offset = self._tag_offset
        if self._suspended or (delivery_tag and delivery_tag <= offset):
            self._drop_stale("basic.reject", delivery_tag)
            return
        wire = delivery_tag - offset if delivery_tag else 0
        self._send(spec.BasicReject(delivery_tag=wire, requeue=requeue))
        self._proto.settled(wire, False)

    def _drop_stale(self, what: str, delivery_tag: int) -> None:
        """Refuse to settle a delivery of a connection that died (see ``_tag_offset``)."""
        self.stale_settlements += 1
        logger.warning(
            "channel %s: not sending %s for delivery %s: it arrived before the connection "
            "recovered, and the broker redelivers it",
            self.channel_id,
            what,
            delivery_tag,
        )

    async def basic_recover(
        self, requeue: bool = True, *, timeout: float | None = None
    ) -> spec.BasicRecoverOk:
        """Redeliver all unacknowledged messages of this channel."""
        result: spec.BasicRecoverOk = await self._rpc(spec.BasicRecover(requeue=requeue), timeout)
        return result

    # -- confirm, tx, flow

    async def confirm_select(self, *, timeout: float | None = None) -> spec.ConfirmSelectOk:
        """Turn on publisher confirms: from now on ``basic_publish`` returns a future."""
        result: spec.ConfirmSelectOk = await self._rpc(spec.ConfirmSelect(), timeout)
        return result

    async def tx_select(self, *, timeout: float | None = None) -> spec.TxSelectOk:
        """Make the channel transactional."""
        result: spec.TxSelectOk = await self._rpc(spec.TxSelect(), timeout)
        return result

    async def tx_commit(self, *, timeout: float | None = None) -> spec.TxCommitOk:
        """Commit the current transaction."""
        result: spec.TxCommitOk = await self._rpc(spec.TxCommit(), timeout)
        return result

    async def tx_rollback(self, *, timeout: float | None = None) -> spec.TxRollbackOk:
        """Abandon the current transaction."""
        result: spec.TxRollbackOk = await self._rpc(spec.TxRollback(), timeout)
        return result

    async def flow(self, active: bool, *, timeout: float | None = None) -> bool:
        """Ask the broker to pause (``False``) or resume deliveries; returns its answer."""
        reply: spec.ChannelFlowOk = await self._rpc(spec.ChannelFlow(active=active), timeout)
        return reply.active

    async def close(
        self,
        reply_code: int = 200,
        reply_text: str = "Normal shutdown",
        *,
        timeout: float | None = None,
    ) -> None:
        """Close the channel and wait for close-ok. Idempotent.

        While the connection is recovering the channel is closed at once (there is no
        broker channel to close), and recovery does not bring it back.
        """
        if self._closed.done():
            return
        if self._suspended:
            self._on_closed(ChannelClosedByClient(reply_code, reply_text))
            return
        self._proto.close(reply_code, reply_text)
        self._conn._kick()
        try:
            async with asyncio.timeout(timeout):
                await asyncio.shield(self._closed)
        except TimeoutError:
            raise Timeout(f"channel.close got no answer within {timeout} s") from None

    # ------------------------------------------------------------------ events (loop)

    def _on_rpc_reply(self, method: Method, message: Message | None) -> None:
        if not self._rpcs:
            logger.warning("channel %s: reply %s with no request", self.channel_id, method.NAME)
            return
        future, hook = self._rpcs.popleft()
        if hook is not None:
            try:
                hook(method)
            except Exception:
                logger.exception("channel %s: handling %s failed", self.channel_id, method.NAME)
        if not future.done():
            future.set_result(message if message is not None else method)

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

    def _on_confirm(self, tag: int, multiple: bool, ack: bool) -> None:
        confirms = self._confirms
        confirms.confirm(tag, multiple, ack)  # settles through _settle
        if self._settled_waiters and not confirms:
            self._notify_settled()

    def _confirms_settled(self) -> asyncio.Future[None]:
        """A future resolved once the confirm table is empty (every publish settled).

        The table also empties when the channel ends (its publishes fail).
        """
        future: asyncio.Future[None] = self._loop.create_future()
        if self._confirms:
            self._settled_waiters.append(future)
        else:
            future.set_result(None)
        return future

    def _notify_settled(self) -> None:
        waiters, self._settled_waiters = self._settled_waiters, []
        for waiter in waiters:
            if not waiter.done():
                waiter.set_result(None)

    def _on_return(self, message: Message) -> None:
        if not self._return_callbacks:
            logger.warning(
                "channel %s: message returned (%s %s) and no return callback: exchange=%r "
                "routing_key=%r",
                self.channel_id,
                message.reply_code,
                message.reply_text,
                message.exchange,
                message.routing_key,
            )
        for callback in list(self._return_callbacks):
            try:
                callback(message)
            except Exception:
                logger.exception("return callback %r failed", callback)

    def _on_flow(self, active: bool) -> None:
        logger.info("channel %s: broker flow %s", self.channel_id, "on" if active else "off")

    def _fail_pending(self, exc: AMQPError, *, keep_resendable: bool = False) -> None:
        """Fail waiting requests and unconfirmed publishes with ``exc``.

        With ``keep_resendable`` (the connection is recovering), unconfirmed publishes
        whose owner asked for it (``resend_on_recovery``) are kept for :meth:`_republish`.
        """
        rpcs, self._rpcs = self._rpcs, deque()
        for future, _ in rpcs:
            if not future.done():
                # A fresh instance per waiter: one exception object raised in several
                # tasks would collect all their tracebacks.
                future.set_exception(copy.copy(exc))
        confirms = self._confirms.take_all()
        heads, self._heads = self._heads, {}
        refused = self._refused_seq(exc, confirms, heads)
        if not keep_resendable and self._resend:
            resend, self._resend = self._resend, []
            confirms.update((-i - 1, waiter) for i, waiter in enumerate(resend))
        for seq, waiter in confirms.items():
            if waiter.done():
                continue
            if keep_resendable and getattr(waiter, "resend_on_recovery", False):
                self._resend.append(waiter)
                continue
            error: PublishOutcomeUnknown | PublishRefused
            if refused is None or seq < refused:
                error = PublishOutcomeUnknown(max(seq, 0))
            elif seq == refused:
                assert isinstance(exc, ChannelClosedByBroker)
                error = PublishRefused(seq, exc.reply_code, exc.reply_text)
            else:
                error = PublishOutcomeUnknown(
                    seq,
                    f"publish #{seq}: not processed: the broker discarded it after "
                    f"refusing publish #{refused} on the same channel",
                    discarded=True,
                )
            error.__cause__ = exc
            waiter.set_exception(error)
        if self._settled_waiters:
            self._notify_settled()

    def _refused_seq(
        self,
        exc: AMQPError,
        confirms: Mapping[int, Settleable],
        heads: Mapping[int, tuple[bytes, bytes]],
    ) -> int | None:
        """The sequence number of the publish a broker's channel.close refused, if any.

        See :mod:`rabbitry.protocol._refusal`: the broker closes the channel right after
        the offending basic.publish, earlier publishes may still await their confirm,
        later ones were discarded unprocessed.
        """
        if not isinstance(exc, ChannelClosedByBroker) or not is_publish_refusal(
            exc.reply_code, exc.class_id, exc.method_id
        ):
            return None
        order = sorted(seq for seq, waiter in confirms.items() if not waiter.done())
        candidates: list[PublishSummary | None] = []
        for seq in order:
            frames: list[bytes] | None = getattr(confirms[seq], "frames", None)
            head = (frames[0], frames[2]) if frames and len(frames) > 2 else heads.get(seq)
            candidates.append(summarize(*head) if head is not None else None)
        index = refused_index(exc.reply_text, candidates)
        if index is None:
            if order:
                logger.error(
                    "channel %s: the broker refused one of %d unconfirmed publishes (%s) and "
                    "its reply does not say which; they all fail as outcome unknown",
                    self.channel_id,
                    len(order),
                    exc,
                )
            return None
        return order[index]

    def _suspend(self, exc: AMQPError) -> None:
        """The connection died and is recovering: keep the channel, fail what was pending.

        Consumers stay registered (recovery subscribes them again); a new epoch starts
        so that acks for the deliveries received so far are not sent on the new channel.
        """
        if self._closed.done():
            return
        if self._internal:
            self._on_closed(exc)  # recovery's own channel: the next attempt opens another
            return
        self._suspended = True
        self.epoch += 1
        # Every tag handed out so far died with the connection.
        self._tag_offset = self._max_tag
        self._fail_pending(exc, keep_resendable=True)

    async def _resume(self, protocol: ChannelProtocol) -> None:
        """Recovery: adopt the re-opened channel; replay QoS and confirm/tx modes."""
        confirm = self._proto.confirm_mode
        transactional = self._proto.transactional
        self._proto = protocol
        self._register_rpc(None)  # channel.open, queued by the protocol
        await self._await_rpc("channel.open", 30.0)
        # Still suspended: the application's calls wait until the modes are back (a
        # publish in between would miss confirm mode).
        if self._qos is not None:
            count, size, global_ = self._qos
            qos = spec.BasicQos(prefetch_size=size, prefetch_count=count, global_=global_)
            await self._replay_rpc(qos)
        if confirm:
            await self._replay_rpc(spec.ConfirmSelect())
        if transactional:
            await self._replay_rpc(spec.TxSelect())
        self._suspended = False

    async def _replay_rpc(self, method: Method) -> Any:
        """A request of recovery itself: sent now, never waiting for recovery.

        Raises:
            ConnectionLost: the connection dropped again (recovery tries again).
        """
        if self._proto.state is not ChannelState.OPEN:
            raise ConnectionLost(f"the connection dropped before {method.NAME} was replayed")
        self._proto.send_method(method)
        self._register_rpc(None)
        return await self._await_rpc(method.NAME, 30.0)

    def _republish(self) -> int:
        """Recovery: send again the unconfirmed messages kept at suspension, in order.

        They keep their ``message_id``; the broker may now hold two copies of some
        (at-least-once: the consumer's dedup store or idempotency handles them).
        Returns how many were sent.
        """
        resend, self._resend = self._resend, []
        sent = 0
        for record in resend:
            if record.done():
                continue
            seq = self._proto.send_publish(record.frames)  # type: ignore[attr-defined]
            record.seq = seq  # type: ignore[attr-defined]
            self._confirms.add(seq, record)
            sent += 1
        if sent:
            self.republished += sent
            self._conn._kick()
        return sent

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

    def _mark_lost(self, exc: AMQPError) -> None:
        """Recovery could not restore this channel: close it for good with ``exc``."""
        self._lost_reason = exc
        if self._proto.state is ChannelState.CLOSED:
            self._proto.close_exc = exc  # what a later call on this channel names
        self._on_closed(exc)

    def _on_closed(self, exc: AMQPError) -> None:
        if self._closed.done():
            return
        self._suspended = False
        self.close_exc = exc
        self._closed.set_result(exc)
        self._conn._channels.pop(self.channel_id, None)
        self._fail_pending(exc)
        for tag in list(self._consumers):
            consumer = self._drop_consumer(tag)
            if consumer is not None and consumer.on_close is not None:
                consumer.on_close(exc)
        if not isinstance(exc, ChannelClosedByClient):
            logger.debug("channel %s closed: %r", self.channel_id, exc)


def _settle(future: Settleable, tag: int, ack: bool) -> None:
    """Settle a publish with the broker's confirm of ``tag`` (unless it is settled)."""
    if future.done():
        return
    if ack:
        future.set_result(None)
    else:
        future.set_exception(Nacked(tag))
