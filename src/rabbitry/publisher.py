"""AsyncPublisher: confirmed publishing with a bounded window, returns and deadlines.

Get one with ``await connection.publisher()``; it owns one channel in confirm mode.

Theory of operation
-------------------
``publish()`` encodes the message first (so invalid input raises
:class:`LocalProtocolError` before anything waits or is sent), then waits for the right
to send (``PublisherCore.acquire``): the connection must not be blocked by a broker
resource alarm, the window of ``max_in_flight`` unconfirmed messages must have room,
the socket's write buffer must be below its high-water mark, and the channel must be
open (a channel closed by the broker is replaced here, transparently). Then the frames
are queued on the channel and a :class:`Pending` record is put in the channel's confirm
table. The record is what the channel settles on ``basic.ack`` / ``basic.nack`` (in
O(confirmed) for multiple confirms) or fails when the channel ends; it resolves the
caller's future, frees its window slot and forgets its return correlation.

Window slots are handed over in FIFO order: a released slot goes straight to the
oldest waiter, so a burst of new publishes cannot starve one that has been waiting.

Returns: RabbitMQ sends ``basic.return`` before the ``basic.ack`` of the same message on
the same channel, but a multiple-ack makes the pairing ambiguous, so a return is matched
to its publish by ``message_id`` (generated for every message that has none; duplicates
are matched oldest first). The return fails the future with :class:`Unroutable`; the ack
that follows only frees the slot, because a settled future is never settled twice.

The outbox: until a message is settled its encoded frames stay in its record, so that
recovery can send them again (:meth:`AsyncPublisher.unconfirmed`). The window bounds
it: at most ``max_in_flight`` records exist per publisher.

The publisher is composed of collaborators: its :class:`MessageEncoder` (message ids,
properties, frames; any thread), its :class:`PublisherCore` (the channel, sending
within a :class:`SendWindow`, and the events; loop thread) and the
:class:`PublisherPort` through which the library's own objects drive those two. The
sync twin (:class:`rabbitry.Publisher`) encodes in the calling thread with the same
encoder and hands the frames to the core's ``send`` on the IO thread, bringing its own
window (a semaphore) and release hook.
"""

from __future__ import annotations

import asyncio
import copy
import logging
from typing import TYPE_CHECKING, Any

from ._publisher.core import PublisherCore
from ._publisher.port import PublisherPort
from .aio.connection import loop_of
from .exceptions import AMQPError, ConfigurationError, InvalidStateError, PublishTimeout
from .observability import _state as _obs
from .protocol.channel import ChannelState
from .protocol.spec import BasicProperties
from .publishing.encoding import MessageEncoder
from .publishing.messages import (
    Body,
    OutgoingMessage,
    UnconfirmedMessage,
    as_properties,
    expiration_ms,
)
from .publishing.records import Batch, Pending
from .recovery import NackRetry, State

if TYPE_CHECKING:
    from collections.abc import Iterable, Mapping
    from datetime import timedelta

    from .aio.connection import AsyncConnection
    from .protocol import spec

__all__ = [
    "AsyncPublisher",
    "Body",
    "OutgoingMessage",
    "UnconfirmedMessage",
    "as_properties",
    "expiration_ms",
]

logger = logging.getLogger("rabbitry.publisher")

_OPEN = ChannelState.OPEN


class AsyncPublisher:
    """Publishes on its own channel, with confirms, a bounded window and deadlines.

    Get one with ``await connection.publisher(...)``; usable as ``async with`` (closes
    on exit after waiting for outstanding confirms).

    Args:
        connection: an open :class:`AsyncConnection`.
        confirm: use publisher confirms (default). ``False`` is fire-and-forget: the
            future resolves once the frames are queued for the socket, and a message
            the broker drops is never reported.
        max_in_flight: at most this many unconfirmed messages; past it ``publish``
            waits for a confirm.
        mandatory: default of ``publish(mandatory=...)``.
        timeout: default per-publish deadline in seconds (``None``: none).
        republish_unconfirmed: keep unconfirmed messages for recovery to send again
            after a reconnect, with the same ``message_id`` (at-least-once). The resend
            is done by connection recovery.
        nack_retry: send a message the broker nacked again after a backoff (a
            :class:`rabbitry.NackRetry`; e.g. while a quorum queue elects a leader); its
            future then resolves on a later confirm. ``None``: a nack fails the future
            with :class:`Nacked`.

    Raises:
        ConfigurationError: an invalid option.
    """

    def __init__(
        self,
        connection: AsyncConnection,
        *,
        confirm: bool = True,
        max_in_flight: int = 1000,
        mandatory: bool = False,
        timeout: float | None = None,
        republish_unconfirmed: bool = False,
        nack_retry: NackRetry | None = None,
    ) -> None:
        if isinstance(max_in_flight, bool) or not isinstance(max_in_flight, int):
            raise ConfigurationError(f"max_in_flight: must be an int, got {max_in_flight!r}")
        if max_in_flight < 1:
            raise ConfigurationError(f"max_in_flight: must be at least 1, got {max_in_flight}")
        if timeout is not None and timeout < 0:
            raise ConfigurationError(f"timeout: must not be negative, got {timeout}")
        if republish_unconfirmed and not confirm:
            raise ConfigurationError("republish_unconfirmed needs confirm=True")
        if nack_retry is not None and not isinstance(nack_retry, NackRetry):
            raise ConfigurationError(
                f"nack_retry: must be a rabbitry.NackRetry or None, got {type(nack_retry).__name__}"
            )
        if nack_retry is not None and not confirm:
            raise ConfigurationError("nack_retry needs confirm=True (nacks are confirms)")
        loop = loop_of(connection)
        if loop is None:
            raise InvalidStateError("the connection is not open (call connect() first)")
        self._mandatory = mandatory
        self._timeout = timeout
        self._loop = loop
        # The collaborators: the encoder (any thread), the send machinery (loop thread)
        # and the port the library's own objects drive them through.
        self._encoder = MessageEncoder(mandatory, connection.max_message_size)
        self._core = core = PublisherCore(
            connection,
            loop,
            self._encoder,
            confirm=confirm,
            window=max_in_flight,
            republish=republish_unconfirmed,
            nack_retry=nack_retry,
        )
        self._port = core.closing_flag = PublisherPort(core, self._encoder, self._shutdown)

    async def _open(self, open_timeout: float | None) -> None:
        """Open the channel, within ``open_timeout`` seconds; on failure detach and raise."""
        scope = asyncio.timeout(open_timeout)
        try:
            async with scope:
                await self._core.ensure_channel()
        except BaseException as exc:
            self._core.detach()
            if isinstance(exc, TimeoutError) and scope.expired():
                raise PublishTimeout(
                    f"the publisher's channel did not open within {open_timeout} s"
                ) from None
            raise

    def __repr__(self) -> str:
        channel = self._core.channel.channel_id if self._core.channel is not None else None
        return (
            f"<AsyncPublisher channel={channel} confirm={self._core.confirm} "
            f"in_flight={self.in_flight}/{self._core.slots.size}>"
        )

    async def __aenter__(self) -> AsyncPublisher:
        return self

    async def __aexit__(self, exc_type: object, *exc_info: object) -> None:
        await self._shutdown(None)
        await asyncio.sleep(0)  # done-callbacks already scheduled run first
        # A block that raised keeps its exception; the failures are logged then.
        self._core.ledger.report(raise_error=exc_type is None)

    # ------------------------------------------------------------------ state

    @property
    def confirm(self) -> bool:
        """Publisher confirms are on."""
        return self._core.confirm

    @property
    def max_in_flight(self) -> int:
        """The window: unconfirmed messages allowed before ``publish`` waits."""
        return self._core.slots.size

    @property
    def mandatory(self) -> bool:
        """The default of ``publish(mandatory=...)``."""
        return self._mandatory

    @property
    def timeout(self) -> float | None:
        """The default per-publish deadline in seconds."""
        return self._timeout

    @property
    def republish_unconfirmed(self) -> bool:
        """Recovery re-sends unconfirmed messages (see the class docstring)."""
        return self._core.book.republish

    @property
    def nack_resends(self) -> int:
        """How many nacked messages were sent again (``nack_retry``)."""
        return self._core.book.nack_resends

    @property
    def in_flight(self) -> int:
        """Messages sent (or waiting for a channel) and not settled yet."""
        return self._core.book.outstanding + len(self._core.backlog)

    @property
    def is_blocked(self) -> bool:
        """The broker blocked the connection (resource alarm); publishes wait."""
        return self._core.blocked_reason is not None

    @property
    def blocked_reason(self) -> str | None:
        """The broker's reason for the current block, or ``None``."""
        return self._core.blocked_reason

    @property
    def is_closed(self) -> bool:
        """``close()`` was called."""
        return self._core.closing

    @property
    def channel_id(self) -> int | None:
        """The number of the channel in use (it changes when a channel is replaced)."""
        return self._core.channel.channel_id if self._core.channel is not None else None

    # ------------------------------------------------------------------ publishing

    async def publish(
        self,
        body: Body,
        *,
        exchange: str = "",
        routing_key: str = "",
        properties: spec.BasicProperties | Mapping[str, Any] | None = None,
        mandatory: bool | None = None,
        persistent: bool | None = None,
        expiration: int | timedelta | None = None,
        timeout: float | None = None,
    ) -> None:
        """Publish one message and wait until the broker has confirmed it.

        The call returns once the broker acked the message (with ``confirm=False``:
        once it is queued for the socket) and raises when it did not. One message at a
        time this way waits a round trip per message; for throughput, :meth:`send`
        returns the future at once, or use :meth:`publish_batch`.

        Args:
            body: the payload; ``str`` is sent as UTF-8.
            exchange: the exchange ("" is the default exchange).
            routing_key: the routing key (the queue name on the default exchange).
            properties: the basic properties, or a mapping of their fields
                (``{"message_id": "a"}``). ``message_id`` is generated when absent.
            mandatory: ask the broker to return the message when no queue gets it
                (``None``: the publisher's default).
            persistent: ``True`` sets delivery mode 2 (persistent), ``False`` mode 1.
            expiration: per-message TTL, int milliseconds or a ``timedelta``.
            timeout: the deadline in seconds (``None``: the publisher's default) for
                waiting while blocked, for room in the window and for the confirm.

        Raises:
            LocalProtocolError: an invalid argument; nothing was sent.
            Nacked: the broker refused the message.
            Unroutable: ``mandatory`` and no queue got it (``exc.message`` is the
                returned message).
            PublishRefused: the broker closed the channel because of this message
                (e.g. 404 for a missing exchange).
            PublishOutcomeUnknown: the channel or connection ended before the confirm.
            PublishTimeout: the deadline passed before the confirm.
            InvalidStateError: the publisher or its connection is closed.
        """
        await (
            await self.send(
                body,
                exchange=exchange,
                routing_key=routing_key,
                properties=properties,
                mandatory=mandatory,
                persistent=persistent,
                expiration=expiration,
                timeout=timeout,
            )
        )

    async def send(
        self,
        body: Body,
        *,
        exchange: str = "",
        routing_key: str = "",
        properties: spec.BasicProperties | Mapping[str, Any] | None = None,
        mandatory: bool | None = None,
        persistent: bool | None = None,
        expiration: int | timedelta | None = None,
        timeout: float | None = None,
    ) -> asyncio.Future[None]:
        """Publish one message without waiting for its confirm; returns its future.

        The pipelined form of :meth:`publish`: many messages are in flight at once (up
        to ``max_in_flight``). Look at each future (``await`` it, or its ``result()``):
        a failure nobody looked at is logged and raised as
        :class:`UnobservedPublishFailures` when the publisher closes.

        Waits (before sending) while the connection is blocked by the broker, while
        ``max_in_flight`` messages are unconfirmed, and while the socket's write buffer
        is full. The future resolves with ``None`` when the broker acks the message;
        with ``confirm=False`` it resolves once the message is queued for the socket.

        Args:
            body: the payload; ``str`` is sent as UTF-8.
            exchange: the exchange ("" is the default exchange).
            routing_key: the routing key (the queue name on the default exchange).
            properties: the basic properties, or a mapping of their fields.
                ``message_id`` is generated when absent, so that consumers can
                de-duplicate a message sent twice.
            mandatory: ask the broker to return the message when no queue gets it
                (``None``: the publisher's default).
            persistent: ``True`` sets delivery mode 2 (persistent), ``False`` mode 1.
            expiration: per-message TTL, int milliseconds or a ``timedelta``; sent as
                the digit string RabbitMQ requires.
            timeout: the deadline in seconds (``None``: the publisher's default). It
                starts now and covers, in total, waiting while blocked, waiting for room
                in the window and waiting for the confirm. Past it before the message
                was sent, this call raises :class:`PublishTimeout` and nothing is sent;
                after, the future fails with :class:`PublishTimeout` but the message
                stays in flight (and in the window) until the broker settles it.

        Returns:
            The future. It fails with :class:`Nacked` (the broker refused it),
            :class:`Unroutable` (mandatory and returned; ``exc.message`` is the returned
            message), :class:`PublishTimeout`, :class:`PublishRefused` when the broker
            closed the channel because of this message (e.g. 404 for a missing
            exchange; never resent), or :class:`PublishOutcomeUnknown` when the channel
            or connection ended before the confirm for another reason; ``__cause__``
            says why. The next publish then opens a fresh channel.

        Raises:
            LocalProtocolError: an invalid argument; nothing was sent.
            PublishTimeout: the deadline passed before the message could be sent.
            InvalidStateError: the publisher or its connection is closed.
        """
        if mandatory is None:
            mandatory = self._mandatory
        if properties is not None and type(properties) is not BasicProperties:
            properties = as_properties(properties)
        traced = _obs.active
        finish = None
        if traced is not None:  # rabbitry.observability: a span, its context in headers
            properties, finish = traced.publish(self, exchange, routing_key, properties)
        frames, message_id = self._encoder.encode(
            body, exchange, routing_key, properties, mandatory, persistent, expiration
        )
        if timeout is None:
            timeout = self._timeout
        deadline = None if timeout is None else self._loop.time() + timeout
        core = self._core
        confirm = core.confirm
        slots = core.slots
        pipe = core.pipe
        if (
            core.blocked_reason is None
            and not core.writes.paused
            and not core.closing
            and pipe is not None
            and pipe.protocol.state is _OPEN
            and (not confirm or (slots.reserved < slots.size and not slots.waiters))
        ):
            if confirm:
                slots.reserved += 1
        else:
            await core.acquire(deadline, timeout)
        future: asyncio.Future[None] = self._loop.create_future()
        release = core.release_slot_cb if confirm else None
        pipe = core.pipe
        if pipe is not None and pipe.protocol.state is _OPEN and not core.backlog:
            core.send_now(pipe, frames, future, message_id, mandatory, deadline, release)
            pipe.kick()
        else:
            core.send(frames, future, message_id, mandatory, deadline, release)
        if finish is not None:
            finish(future)
        return future

    async def publish_batch(
        self,
        messages: Iterable[OutgoingMessage | Body],
        *,
        exchange: str = "",
        routing_key: str = "",
        properties: spec.BasicProperties | Mapping[str, Any] | None = None,
        mandatory: bool | None = None,
        persistent: bool | None = None,
        expiration: int | timedelta | None = None,
        timeout: float | None = None,
    ) -> list[BaseException | None]:
        """Publish many messages in one write burst; returns their outcomes once settled.

        Every message is encoded (and validated) before anything is sent. They go out
        on the publisher's channel in order, written to the socket at once when the
        window has room for all of them; otherwise in chunks as room frees up.

        Args:
            messages: :class:`OutgoingMessage` objects, or bodies that use the arguments
                below; ``None`` fields of an ``OutgoingMessage`` use them too.
            exchange: as for :meth:`publish`, for the messages that do not set their own.
            routing_key: likewise.
            properties: likewise.
            mandatory: likewise (``None``: the publisher's default).
            persistent: likewise.
            expiration: likewise.
            timeout: one deadline for the whole batch, as for :meth:`publish`.

        Returns:
            One outcome per message, in order: ``None`` when acked (or sent, without
            confirms), else the exception its future would have failed with.
            Messages that could not be sent before the deadline get
            :class:`PublishTimeout`.

        Raises:
            LocalProtocolError: a message is invalid; nothing was sent.
            InvalidStateError: the publisher or its connection is closed before the
                first message was sent (later, the unsent messages get it as outcome).
        """
        if properties is not None and type(properties) is not BasicProperties:
            properties = as_properties(properties)
        traced = _obs.active
        finish = None
        if traced is not None:  # rabbitry.observability: a span per message
            messages, finish = traced.publish_batch(
                self, messages, exchange, routing_key, properties
            )
        encoded = self._encoder.encode_batch(
            messages, exchange, routing_key, properties, mandatory, persistent, expiration
        )
        if not encoded:
            return []
        if timeout is None:
            timeout = self._timeout
        deadline = None if timeout is None else self._loop.time() + timeout
        done: asyncio.Future[list[BaseException | None]] = self._loop.create_future()
        batch = Batch(len(encoded), done)
        total = len(encoded)
        start = 0
        core = self._core
        confirm = core.confirm
        release = core.release_slot_cb if confirm else None
        while start < total:
            try:
                await core.acquire(deadline, timeout)
            except AMQPError as exc:
                if not start and not isinstance(exc, PublishTimeout):
                    raise  # nothing was sent: report it as the call's error
                for index in range(start, total):
                    batch.settle(index, copy.copy(exc))
                break
            count = total - start
            if confirm:
                slots = core.slots
                extra = 0 if slots.waiters else min(count - 1, slots.size - slots.reserved)
                slots.reserved += extra
                count = 1 + extra
            core.send_batch(encoded[start : start + count], batch, start, deadline, release)
            start += count
        if finish is not None:
            finish(done)
        return await asyncio.shield(done)

    async def wait_for_confirms(self, *, timeout: float | None = None) -> None:
        """Wait until nothing this publisher sent is unsettled.

        The outcomes are on the futures ``publish`` returned; this only waits. Without
        confirms it waits until the socket's write buffer drains below its high-water
        mark.

        Args:
            timeout: seconds to wait (``None``: no limit; without confirms it is not
                used).

        Raises:
            PublishTimeout: messages were still unconfirmed after ``timeout`` seconds.
        """
        if not self._core.confirm:
            self._core.writes.kick()
            await self._core.writes.wait_writable()
            return
        if not self.in_flight:
            return
        try:
            async with asyncio.timeout(timeout):
                await self._core.book.idle_waiters.wait()
        except TimeoutError:
            raise PublishTimeout(
                f"{self.in_flight} messages still unconfirmed after {timeout} s"
            ) from None

    def unconfirmed(self) -> list[UnconfirmedMessage]:
        """The outbox: messages sent (or waiting for a channel) and not settled, oldest first.

        Their frames are kept as encoded; ``frames_for(channel_id)`` re-addresses them.
        Messages still waiting for a channel have ``seq`` 0.
        """
        out: list[UnconfirmedMessage] = []
        if self._core.pipe is not None:
            # Those kept for the resend while the connection recovers come first, with
            # their sequence number on the channel before the outage.
            for record in self._core.pipe.unsettled():
                if isinstance(record, Pending) and not record.settled:
                    out.append(UnconfirmedMessage(record.seq, record.message_id, record.frames))
        for frames, _future, message_id, *_rest in self._core.backlog:
            out.append(UnconfirmedMessage(0, message_id, frames))
        return out

    async def close(self, *, timeout: float | None = None) -> None:
        """Wait for outstanding confirms (up to ``timeout``), then close the channel.

        Idempotent. Messages still unconfirmed when the channel closes fail with
        :class:`PublishOutcomeUnknown`; later publishes raise :class:`InvalidStateError`.
        A timeout is logged, an error closing the channel ignored.

        Args:
            timeout: seconds to wait for the confirms, and then for the channel's
                close-ok (``None``: no limit).

        Raises:
            UnobservedPublishFailures: futures returned by :meth:`send` failed and
                nobody looked at them (they are logged at ERROR too); raised once.
        """
        await self._shutdown(timeout)
        # Done-callbacks scheduled by the last settles run first (a batching
        # publisher's records are failed in one of them).
        await asyncio.sleep(0)
        self._core.ledger.report()

    async def _shutdown(self, timeout: float | None) -> None:
        """:meth:`close` without the report of the failures nobody looked at."""
        if self._core.closing:
            return
        self._core.mark_closing()
        connection = self._core.connection
        try:
            # While the connection recovers, the unconfirmed messages kept for the resend
            # are still ours: wait for them too instead of abandoning them.
            if self._core.confirm and (connection.is_open or connection.state is State.RECOVERING):
                try:
                    await self.wait_for_confirms(timeout=timeout)
                except PublishTimeout:
                    logger.warning("publisher closed with %d unconfirmed messages", self.in_flight)
        finally:
            self._core.detach()
            channel = self._core.channel
            if channel is not None and not channel.is_closed and connection.is_open:
                try:
                    await channel.close(timeout=timeout)
                except AMQPError:
                    pass


def port_of(publisher: AsyncPublisher) -> PublisherPort:
    """The members of ``publisher`` that the library's own collaborators drive (the
    thread-safe twin, the durable outbox); not for applications."""
    return publisher._port


async def open_publisher(
    connection: AsyncConnection, *, open_timeout: float | None = None, **options: Any
) -> AsyncPublisher:
    """A publisher on ``connection`` with its channel open: what
    :meth:`AsyncConnection.publisher` returns (applications call that).

    Args:
        connection: the open connection.
        open_timeout: seconds to wait for the channel (``None``: no limit).
        options: the keyword arguments of :class:`AsyncPublisher`.

    Raises:
        PublishTimeout: the channel did not open within ``open_timeout``.
    """
    publisher = AsyncPublisher(connection, **options)
    await publisher._open(open_timeout)
    return publisher
