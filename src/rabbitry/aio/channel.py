"""AsyncChannel: the spec's channel methods for asyncio code.

Method and argument names are the AMQP 0-9-1 names in snake case. Synchronous methods
(declare, bind, qos, consume, get...) are coroutines that return the broker's reply;
they accept ``timeout=`` in seconds and raise :class:`rabbitry.Timeout` past it (the
reply, if it comes later, is matched and dropped). Acks, nacks and rejects are plain
methods: they only queue a frame.
"""

from __future__ import annotations

import asyncio
import logging
from collections import deque
from collections.abc import AsyncIterator, Callable, Mapping
from typing import Any, TypeVar

from ..batching import iter_delivery
from ..exceptions import AMQPError, ChannelClosedByClient, ConsumerCancelled, Timeout
from ..message import Message
from ..protocol import spec
from ..protocol.channel import ChannelProtocol, ChannelState
from ..protocol.frames import Method
from ..protocol.publish import ConfirmTracker
from ..record import RecordedBinding, RecordedExchange, RecordedQueue
from ._consumers import _CONSUMER_QUEUE_BYTES as _CONSUMER_QUEUE_BYTES
from ._consumers import _CONSUMER_QUEUE_MESSAGES as _CONSUMER_QUEUE_MESSAGES
from ._consumers import CancelCallback, ConsumerMethods, _Connection, _Consumer
from ._consumers import ConsumerCallback as ConsumerCallback
from ._lifecycle import ChannelLifecycle, _settle
from ._lifecycle import Settleable as Settleable

__all__ = ["AsyncChannel", "ConsumerCallback"]

logger = logging.getLogger("rabbitry.channel")

ReturnCallback = Callable[[Message], Any]

M = TypeVar("M", bound=Method)


#: How often (in publishes) the table of publish heads drops confirmed entries.
_HEADS_PRUNE = 1024


class AsyncChannel(ConsumerMethods, ChannelLifecycle):
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

    async def _await_rpc(
        self, name: str, timeout: float | None, future: asyncio.Future[Any] | None = None
    ) -> Any:
        """Wait for the reply to ``future`` (by default the last request registered)."""
        if future is None:
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
        return reply if isinstance(reply, Message) else None

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
        if message is not None:
            # basic.get-ok: the delivery belongs to the connection it arrived on, so it
            # gets that connection's epoch and tag numbering now; the connection may end
            # (and a new epoch start) before the caller runs again.
            message.channel = self
            message.epoch = self.epoch
            tag = message.delivery_tag = message.delivery_tag + self._tag_offset
            if tag > self._max_tag:
                self._max_tag = tag
        if hook is not None:
            try:
                hook(method)
            except Exception:
                logger.exception("channel %s: handling %s failed", self.channel_id, method.NAME)
        if not future.done():
            future.set_result(message if message is not None else method)

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
