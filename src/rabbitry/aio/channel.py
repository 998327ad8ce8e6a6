"""AsyncChannel: the spec's channel methods for asyncio code.

Method and argument names are the AMQP 0-9-1 names in snake case. Synchronous methods
(declare, bind, qos, consume, get...) are coroutines that return the broker's reply;
they accept ``timeout=`` in seconds and raise :class:`rabbitry.Timeout` past it (the
reply, if it comes later, is matched and dropped). Acks, nacks and rejects are plain
methods: they only queue a frame.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable, Mapping
from typing import TYPE_CHECKING, Any

from ..exceptions import AMQPError, ChannelClosedByClient, ConsumerCancelled, Timeout
from ..protocol import spec
from ..protocol.batching import RecordLedger, iter_delivery
from ..protocol.channel import ChannelProtocol, ChannelState
from ..protocol.message import Message
from ._confirm_book import ConfirmBook
from ._confirm_book import Settleable as Settleable
from ._consumers import CONSUMER_QUEUE_BYTES as CONSUMER_QUEUE_BYTES
from ._consumers import CONSUMER_QUEUE_MESSAGES as CONSUMER_QUEUE_MESSAGES
from ._consumers import CancelCallback, Connection, ConsumerMethods, ConsumerRegistry
from ._consumers import ConsumerCallback as ConsumerCallback
from ._consumers import Subscription as Subscription
from ._declare import DeclareMethods
from ._frames import FrameMethods
from ._lifecycle import ChannelDriver, ChannelEvents
from ._link import ChannelLink
from ._requests import Requests

if TYPE_CHECKING:
    from ..protocol.publish import ConfirmTracker
    from ..publishing.pipe import PublishPipe, WritePath
    from ._consumers import Consumer

__all__ = ["AsyncChannel", "ConsumerCallback", "Subscription"]

ReturnCallback = Callable[[Message], Any]


class AsyncChannel(DeclareMethods, ConsumerMethods, FrameMethods):
    """An open AMQP channel. Get one with ``await connection.channel()``.

    Usable as ``async with`` (closes on exit). Callbacks run on the event loop; their
    exceptions are logged, never raised into the connection.

    Requests (the coroutines that wait for the broker's reply) raise
    :class:`LocalProtocolError` for an argument that cannot be sent (before anything is
    sent), :class:`InvalidStateError` once the channel is closed, :class:`Timeout` past
    their ``timeout``, the broker's refusal (a :class:`ChannelClosedByBroker` such as
    :class:`NotFound` or :class:`PreconditionFailed`; the broker closes the channel), or
    the connection's error (an :class:`AMQPConnectionError`) when it ends or drops
    meanwhile. While the connection recovers they wait for it within their ``timeout``,
    or raise :class:`ConnectionRecovering` when the recovery policy says to fail.

    Args:
        connection: the connection creating the channel (applications do not).
        protocol: the channel's protocol state.
        writes: the connection's write path.
        loop: the connection's event loop.
        records: record what the channel declares, binds and deletes for recovery.
        internal: a channel of recovery itself (closed, not suspended, on a drop).
        forget: told the channel number when the channel ends.
    """

    def __init__(
        self,
        connection: Connection,
        protocol: ChannelProtocol,
        writes: WritePath,
        *,
        loop: asyncio.AbstractEventLoop,
        records: bool,
        internal: bool,
        forget: Callable[[int], object],
    ) -> None:
        self._conn = connection
        self.channel_id = protocol.channel_id
        self.close_exc: AMQPError | None = None
        #: Unconfirmed publishes sent again after recoveries.
        self.republished = 0
        # The collaborators: the state they share, the requests awaiting replies, the
        # confirm-mode bookkeeping, the consumers, and what drives them all through
        # the connection's events (the connection keeps the driver).
        link = ChannelLink(protocol, loop.create_future())
        book = ConfirmBook(self.channel_id)
        protocol.use_confirms(book.tracker)
        requests = Requests(
            link,
            self,
            loop=loop,
            read_flow=connection.read_flow,
            kick=writes.kick,
            await_recovery=writes.await_recovery,
        )
        consumers = ConsumerRegistry(link, self, connection, requests, loop=loop)
        self._driver: ChannelDriver[AsyncChannel] = ChannelDriver(
            self,
            link,
            requests,
            book,
            consumers,
            writes,
            internal=internal,
            forget=forget,
        )
        DeclareMethods.__init__(self, requests, connection.topology_record if records else None)
        ConsumerMethods.__init__(self, consumers)
        FrameMethods.__init__(self, link, self._driver.pipe, book, loop)
        requests.register(None)  # channel.open, already queued by the protocol

    def __repr__(self) -> str:
        return f"<AsyncChannel {self.channel_id} {self._link.protocol.state.value}>"

    async def __aenter__(self) -> AsyncChannel:
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.close()

    # ------------------------------------------------------------------ state

    @property
    def is_open(self) -> bool:
        """The channel is open (or opening) and usable."""
        return self._link.protocol.state is ChannelState.OPEN

    @property
    def is_closed(self) -> bool:
        """The channel is closed, by us or by the broker (see :attr:`close_exc`)."""
        return self._link.closed.done()

    @property
    def confirm_mode(self) -> bool:
        """confirm.select was requested on this channel."""
        return self._link.protocol.confirm_mode

    @property
    def flow_active(self) -> bool:
        """The broker's channel.flow allows publishing."""
        return self._link.protocol.flow_active

    @property
    def epoch(self) -> int:
        """The channel's recovery epoch: 0, then one more each time the connection
        recovers (a :class:`Message` of an older epoch can no longer be settled)."""
        return self._link.tags.epoch

    @property
    def stale_settlements(self) -> int:
        """Acks, nacks and rejects dropped because their delivery tag was stale."""
        return self._link.tags.stale

    @property
    def connection(self) -> Connection:
        """The connection this channel belongs to."""
        return self._conn

    def add_return_callback(self, callback: ReturnCallback) -> None:
        """Call ``callback(message)`` for every basic.return (unroutable mandatory publish).

        Args:
            callback: called on the event loop with each returned :class:`Message`.
        """
        self._driver.return_callbacks.append(callback)

    async def wait_closed(self, timeout: float | None = None) -> AMQPError:
        """Wait until the channel closes.

        Args:
            timeout: seconds to wait (``None``: no limit).

        Returns:
            Why it closed.

        Raises:
            Timeout: still open after ``timeout`` seconds.
        """
        try:
            async with asyncio.timeout(timeout):
                return await asyncio.shield(self._link.closed)
        except TimeoutError:
            raise Timeout(f"channel still open after {timeout} s") from None

    # Read-only views of the collaborators' state, for tests and debugging.

    @property
    def _proto(self) -> ChannelProtocol:
        return self._link.protocol

    @property
    def _suspended(self) -> bool:
        return self._link.suspended

    @property
    def _qos(self) -> tuple[int, int, bool] | None:
        return self._link.qos

    @property
    def _consumers(self) -> dict[str, Consumer]:
        return self._consumer_registry.consumers

    @property
    def _confirms(self) -> ConfirmTracker[Settleable]:
        return self._book.tracker

    def _consumer_specs(self) -> list[spec.BasicConsume]:
        return self._consumer_registry.specs()

    # -- basic

    async def basic_qos(
        self,
        prefetch_count: int = 0,
        *,
        prefetch_size: int = 0,
        global_: bool = False,
        timeout: float | None = None,
    ) -> spec.BasicQosOk:
        """Limit unacknowledged deliveries (per consumer; ``global_`` per channel).

        Recovery sets the same limit again on the recovered channel.

        Args:
            prefetch_count: deliveries a consumer may hold unacknowledged (0: no limit).
            prefetch_size: the same in bytes (0: no limit; RabbitMQ supports only 0).
            global_: the limit is per channel, not per consumer.
            timeout: seconds to wait for the broker's reply (``None``: no limit); then
                :class:`Timeout`.

        Returns:
            The broker's qos-ok.
        """
        method = spec.BasicQos(
            prefetch_size=prefetch_size, prefetch_count=prefetch_count, global_=global_
        )
        result: spec.BasicQosOk = await self._requests.call(method, timeout)
        self._link.qos = (prefetch_count, prefetch_size, global_)  # replayed by recovery
        return result

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
            timeout: seconds to wait for consume-ok (``None``: no limit); then
                :class:`Timeout`.

        Returns:
            The consumer tag (the broker's choice when ``consumer_tag`` is empty).

        Raises:
            ConfigurationError: a consumer a stream or quorum queue would refuse (e.g.
                a stream consumer with ``no_ack`` or without a prefetch); nothing sent.
            NotFound: there is no such queue (the channel closes).
            AccessRefused: another consumer holds the queue exclusively, or
                ``exclusive`` and it has consumers (the channel closes).
            ResourceLocked: the queue is exclusive to another connection (the channel
                closes).
        """
        subscription = Subscription(
            queue,
            callback,
            consumer_tag=consumer_tag,
            no_local=no_local,
            no_ack=no_ack,
            exclusive=exclusive,
            arguments=arguments,
            on_cancel=on_cancel,
        )
        return await self.start_consumer(subscription, timeout=timeout)

    async def basic_cancel(
        self, consumer_tag: str, *, timeout: float | None = None
    ) -> spec.BasicCancelOk:
        """Stop a consumer. Deliveries already sent still reach its callback.

        Args:
            consumer_tag: the tag :meth:`basic_consume` returned.
            timeout: seconds to wait for the broker's reply (``None``: no limit); then
                :class:`Timeout`.

        Returns:
            The broker's cancel-ok.
        """
        return await self._consumer_registry.cancel(consumer_tag, timeout)

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

        Yields:
            Each delivery, in order (with ``unpack_batches``, each record of a batch
            envelope as a message of its own).

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

        subscription = Subscription(
            queue,
            deliver,
            no_ack=no_ack,
            exclusive=exclusive,
            arguments=arguments,
            on_cancel=cancelled,
            on_close=inbox.put_nowait,
        )
        tag = await self.start_consumer(subscription)
        ledger = RecordLedger()
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
                records = iter_delivery(item, no_ack, ledger)  # batch envelopes: records
                try:
                    for handed in records:
                        yield handed
                finally:
                    records.close()  # an envelope left part-way goes back at once
        finally:
            await self.abandon_consumer(tag)
            # Deliveries that reached us but were never handed out go back to the queue
            # now (one by one: a multiple nack would hit messages the caller holds).
            while not no_ack and not inbox.empty() and self.is_open:
                left = inbox.get_nowait()
                if isinstance(left, Message):
                    self.basic_nack(left.delivery_tag, requeue=True)

    async def basic_get(
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

        Raises:
            NotFound: there is no such queue (the channel closes).
        """
        reply = await self._requests.call(spec.BasicGet(queue=queue, no_ack=no_ack), timeout)
        return reply if isinstance(reply, Message) else None

    async def basic_recover(
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
        result: spec.BasicRecoverOk = await self._requests.call(
            spec.BasicRecover(requeue=requeue), timeout
        )
        return result

    # -- confirm, tx, flow

    async def confirm_select(self, *, timeout: float | None = None) -> spec.ConfirmSelectOk:
        """Turn on publisher confirms: from now on ``basic_publish`` returns a future.

        Args:
            timeout: seconds to wait for the broker's reply (``None``: no limit); then
                :class:`Timeout`.

        Returns:
            The broker's select-ok.
        """
        result: spec.ConfirmSelectOk = await self._requests.call(spec.ConfirmSelect(), timeout)
        return result

    async def tx_select(self, *, timeout: float | None = None) -> spec.TxSelectOk:
        """Make the channel transactional.

        Args:
            timeout: seconds to wait for the broker's reply (``None``: no limit); then
                :class:`Timeout`.

        Returns:
            The broker's select-ok.
        """
        result: spec.TxSelectOk = await self._requests.call(spec.TxSelect(), timeout)
        return result

    async def tx_commit(self, *, timeout: float | None = None) -> spec.TxCommitOk:
        """Commit the current transaction.

        Args:
            timeout: seconds to wait for the broker's reply (``None``: no limit); then
                :class:`Timeout`.

        Returns:
            The broker's commit-ok.

        Raises:
            PreconditionFailed: the channel is not transactional (the channel closes).
        """
        result: spec.TxCommitOk = await self._requests.call(spec.TxCommit(), timeout)
        return result

    async def tx_rollback(self, *, timeout: float | None = None) -> spec.TxRollbackOk:
        """Abandon the current transaction.

        Args:
            timeout: seconds to wait for the broker's reply (``None``: no limit); then
                :class:`Timeout`.

        Returns:
            The broker's rollback-ok.

        Raises:
            PreconditionFailed: the channel is not transactional (the channel closes).
        """
        result: spec.TxRollbackOk = await self._requests.call(spec.TxRollback(), timeout)
        return result

    async def flow(self, active: bool, *, timeout: float | None = None) -> bool:
        """Ask the broker to pause or resume deliveries.

        Args:
            active: ``False`` pauses, ``True`` resumes.
            timeout: seconds to wait for the broker's reply (``None``: no limit); then
                :class:`Timeout`.

        Returns:
            The state the broker answered (``True``: active).
        """
        reply: spec.ChannelFlowOk = await self._requests.call(
            spec.ChannelFlow(active=active), timeout
        )
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

        Args:
            reply_code: the close code sent to the broker.
            reply_text: the close text sent to the broker.
            timeout: seconds to wait for close-ok (``None``: no limit).

        Raises:
            Timeout: no close-ok within ``timeout`` seconds.
        """
        link = self._link
        if link.closed.done():
            return
        if link.suspended:
            self._driver.on_closed(ChannelClosedByClient(reply_code, reply_text))
            return
        link.protocol.close(reply_code, reply_text)
        self._pipe.kick()
        try:
            async with asyncio.timeout(timeout):
                await asyncio.shield(link.closed)
        except TimeoutError:
            raise Timeout(f"channel.close got no answer within {timeout} s") from None


def create_channel(
    connection: Connection,
    protocol: ChannelProtocol,
    writes: WritePath,
    *,
    loop: asyncio.AbstractEventLoop,
    records: bool,
    internal: bool,
    forget: Callable[[int], object],
) -> ChannelEvents[AsyncChannel]:
    """Create the :class:`AsyncChannel` of a channel its connection just opened.

    For the connection only (the arguments are :class:`AsyncChannel`'s).

    Returns:
        What drives the channel, which the connection keeps while the channel is
        open (``events.channel`` is the channel).
    """
    channel = AsyncChannel(
        connection,
        protocol,
        writes,
        loop=loop,
        records=records,
        internal=internal,
        forget=forget,
    )
    return channel._driver


def pipe_of(channel: AsyncChannel) -> PublishPipe:
    """What publishing code uses of ``channel`` (its protocol object, confirm table and
    write path), for the library's publishers, pool and thread-safe channel; not for
    applications."""
    return channel._driver.pipe
