"""AsyncPublisher: confirmed publishing with a bounded window, returns and deadlines.

Get one with ``await connection.publisher()``; it owns one channel in confirm mode.

Theory of operation
-------------------
``publish()`` encodes the message first (so invalid input raises
:class:`LocalProtocolError` before anything waits or is sent), then waits for the right
to send (:meth:`AsyncPublisher._acquire`): the connection must not be blocked by a broker
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

The sync twin (:class:`rabbitry.Publisher`) encodes in the calling thread with the same
:meth:`AsyncPublisher._encode` and hands the frames to :meth:`AsyncPublisher._send` on
the IO thread, bringing its own window (a semaphore) and release hook.
"""

from __future__ import annotations

import asyncio
import copy
import itertools
import logging
import secrets
from collections import deque
from typing import TYPE_CHECKING, Any

from ._publisher_core import Batch, Encoded, Pending, PublisherCore, PublisherPort
from ._waiters import Waiters
from .aio.connection import loop_of, writes_of
from .exceptions import (
    AMQPError,
    ConfigurationError,
    InvalidStateError,
    LocalProtocolError,
    MessageTooLarge,
    PublishTimeout,
)
from .observability import _state as _obs
from .protocol.channel import ChannelState
from .protocol.publish import PublishEncoder, as_body, properties_prefix
from .protocol.spec import BasicProperties
from .publishing.messages import (
    Body,
    OutgoingMessage,
    UnconfirmedMessage,
    as_properties,
    expiration_ms,
)
from .publishing.unobserved import UnobservedLedger
from .recovery import NackRetry, State

if TYPE_CHECKING:
    from collections.abc import Callable, Iterable, Mapping
    from datetime import timedelta

    from .aio.channel import AsyncChannel, Settleable
    from .aio.connection import AsyncConnection
    from .protocol import spec
    from .publishing.pipe import PublishPipe

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
_CACHE_LIMIT = 512
_PLAIN_TEMPLATE = properties_prefix(None, None)


# --------------------------------------------------------------------------- publisher


class AsyncPublisher(PublisherCore):
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
        self._conn = connection
        self._loop = loop
        self._confirm = confirm
        self._max = max_in_flight
        self._mandatory = mandatory
        self._timeout = timeout
        self._republish = republish_unconfirmed
        self._nack_retry = nack_retry
        # Nack retry: re-sends waiting for their delay, and attempts per future.
        self._retrying = 0
        self._nack_attempts: dict[Any, int] = {}
        #: How many nacked messages were sent again (``nack_retry``).
        self.nack_resends = 0
        self._channel: AsyncChannel | None = None
        # What the publisher uses of its channel (set with it), and of its connection.
        self._pipe: PublishPipe | None = None
        self._writes = writes_of(connection)
        self._opening: asyncio.Task[AsyncChannel] | None = None
        # The encoder of the current channel, swapped as one object so that a thread
        # never mixes two channels (until a channel is open: number 0, no frame_max).
        self._encoder = PublishEncoder(0)
        self._cid_bytes = b"\x00\x00"
        self._max_size = connection.max_message_size
        self._templates: dict[tuple[Any, Any], bytes] = {}
        self._id_prefix = secrets.token_hex(8) + "-"
        self._ids = itertools.count(1)
        # Window: slots reserved by the async API, and the FIFO of those waiting (a slot
        # handed to a waiter cancelled meanwhile and taken by nobody else is freed).
        self._in_flight = 0
        self._room_waiters: Waiters[None] = Waiters(lambda _slot: self._release_slot())
        # Records sent and unsettled (both APIs), and frames waiting for a channel.
        self._outstanding = 0
        self._backlog: deque[
            tuple[
                list[bytes],
                Settleable | None,
                str | None,
                bool,
                float | None,
                Callable[[], None] | None,
            ]
        ] = deque()
        self._idle_waiters: Waiters[None] = Waiters()  # told when nothing is in flight
        self._returnable: dict[str, list[Pending]] = {}
        self._blocked_reason = connection.blocked_reason
        self._unblocked = asyncio.Event()
        if self._blocked_reason is None:
            self._unblocked.set()
        self._block_hooks: list[Callable[[str | None], None]] = []
        # Told (loop thread) when the publisher closes or its connection ends.
        self._close_hooks: list[Callable[[], None]] = []
        self._closing = False
        # Failed futures nobody looked at, reported when the publisher ends.
        self._ledger = UnobservedLedger("AsyncPublisher")
        # The members the sync twin and the outbox drive (closing mirrors _closing).
        self._port = PublisherPort(
            self, self._encode, self._encode_batch, self._new_message_id, self._shutdown
        )
        # The connection's end, when that is what closed the publisher.
        self._closed_by: AMQPError | None = None
        # close() has given up waiting (or opening failed): nothing will use or close a
        # channel that finishes opening from now on, so it is closed on arrival.
        self._detached = False
        self._release_slot_cb = self._release_slot
        connection.add_blocked_callback(self._on_blocked)
        connection.add_close_callback(self._on_connection_closed)

    async def _open(self, open_timeout: float | None) -> None:
        """Open the channel, within ``open_timeout`` seconds; on failure detach and raise."""
        scope = asyncio.timeout(open_timeout)
        try:
            async with scope:
                await self._ensure_channel()
        except BaseException as exc:
            self._detach()
            if isinstance(exc, TimeoutError) and scope.expired():
                raise PublishTimeout(
                    f"the publisher's channel did not open within {open_timeout} s"
                ) from None
            raise

    def __repr__(self) -> str:
        channel = self._channel.channel_id if self._channel is not None else None
        return (
            f"<AsyncPublisher channel={channel} confirm={self._confirm} "
            f"in_flight={self.in_flight}/{self._max}>"
        )

    async def __aenter__(self) -> AsyncPublisher:
        return self

    async def __aexit__(self, exc_type: object, *exc_info: object) -> None:
        await self._shutdown(None)
        await asyncio.sleep(0)  # done-callbacks already scheduled run first
        # A block that raised keeps its exception; the failures are logged then.
        self._ledger.report(raise_error=exc_type is None)

    # ------------------------------------------------------------------ state

    @property
    def confirm(self) -> bool:
        """Publisher confirms are on."""
        return self._confirm

    @property
    def max_in_flight(self) -> int:
        """The window: unconfirmed messages allowed before ``publish`` waits."""
        return self._max

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
        return self._republish

    @property
    def in_flight(self) -> int:
        """Messages sent (or waiting for a channel) and not settled yet."""
        return self._outstanding + len(self._backlog)

    @property
    def is_blocked(self) -> bool:
        """The broker blocked the connection (resource alarm); publishes wait."""
        return self._blocked_reason is not None

    @property
    def blocked_reason(self) -> str | None:
        """The broker's reason for the current block, or ``None``."""
        return self._blocked_reason

    @property
    def is_closed(self) -> bool:
        """``close()`` was called."""
        return self._closing

    @property
    def channel_id(self) -> int | None:
        """The number of the channel in use (it changes when a channel is replaced)."""
        return self._channel.channel_id if self._channel is not None else None

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
        frames, message_id = self._encode(
            body, exchange, routing_key, properties, mandatory, persistent, expiration
        )
        if timeout is None:
            timeout = self._timeout
        deadline = None if timeout is None else self._loop.time() + timeout
        confirm = self._confirm
        pipe = self._pipe
        if (
            self._blocked_reason is None
            and not self._writes.paused
            and not self._closing
            and pipe is not None
            and pipe.protocol.state is _OPEN
            and (not confirm or (self._in_flight < self._max and not self._room_waiters))
        ):
            if confirm:
                self._in_flight += 1
        else:
            await self._acquire(deadline, timeout)
        future: asyncio.Future[None] = self._loop.create_future()
        release = self._release_slot_cb if confirm else None
        pipe = self._pipe
        if pipe is not None and pipe.protocol.state is _OPEN and not self._backlog:
            self._send_now(pipe, frames, future, message_id, mandatory, deadline, release)
            pipe.kick()
        else:
            self._send(frames, future, message_id, mandatory, deadline, release)
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
        encoded = self._encode_batch(
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
        confirm = self._confirm
        release = self._release_slot_cb if confirm else None
        while start < total:
            try:
                await self._acquire(deadline, timeout)
            except AMQPError as exc:
                if not start and not isinstance(exc, PublishTimeout):
                    raise  # nothing was sent: report it as the call's error
                for index in range(start, total):
                    batch.settle(index, copy.copy(exc))
                break
            count = total - start
            if confirm:
                extra = 0 if self._room_waiters else min(count - 1, self._max - self._in_flight)
                self._in_flight += extra
                count = 1 + extra
            self._send_batch(encoded[start : start + count], batch, start, deadline, release)
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
        if not self._confirm:
            self._writes.kick()
            await self._writes.wait_writable()
            return
        if not self.in_flight:
            return
        try:
            async with asyncio.timeout(timeout):
                await self._idle_waiters.wait()
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
        if self._pipe is not None:
            # Those kept for the resend while the connection recovers come first, with
            # their sequence number on the channel before the outage.
            for record in self._pipe.unsettled():
                if isinstance(record, Pending) and not record.settled:
                    out.append(UnconfirmedMessage(record.seq, record.message_id, record.frames))
        for frames, _future, message_id, *_rest in self._backlog:
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
        self._ledger.report()

    async def _shutdown(self, timeout: float | None) -> None:
        """:meth:`close` without the report of the failures nobody looked at."""
        if self._closing:
            return
        self._closing = self._port.closing = True
        try:
            # While the connection recovers, the unconfirmed messages kept for the resend
            # are still ours: wait for them too instead of abandoning them.
            if self._confirm and (self._conn.is_open or self._conn.state is State.RECOVERING):
                try:
                    await self.wait_for_confirms(timeout=timeout)
                except PublishTimeout:
                    logger.warning("publisher closed with %d unconfirmed messages", self.in_flight)
        finally:
            self._detach()
            channel = self._channel
            if channel is not None and not channel.is_closed and self._conn.is_open:
                try:
                    await channel.close(timeout=timeout)
                except AMQPError:
                    pass

    # ------------------------------------------------------------------ encoding

    def _new_message_id(self) -> str:
        """A message_id as :meth:`_encode` generates them (unique to this publisher)."""
        return f"{self._id_prefix}{next(self._ids)}"

    def _encode(
        self,
        body: Body,
        exchange: str,
        routing_key: str,
        properties: spec.BasicProperties | Mapping[str, Any] | None,
        mandatory: bool,
        persistent: bool | None,
        expiration: int | timedelta | None,
    ) -> tuple[list[bytes], str | None]:
        """Encode one message for the current channel; safe from any thread.

        Returns the frames (laid out as :mod:`rabbitry.protocol.publish` describes) and the
        message_id.
        """
        encoder = self._encoder
        if type(body) is not bytes:
            body = as_body(body)
        max_size = self._max_size
        if max_size and len(body) > max_size:
            raise MessageTooLarge(len(body), max_size)
        message_id: str | None
        if properties is None:
            template = _PLAIN_TEMPLATE
            if persistent is not None or expiration is not None:
                cached = self._templates.get((persistent, expiration))
                if cached is None or (expiration is not None and type(expiration) is not int):
                    cached = self._template(persistent, expiration)
                template = cached
            message_id = f"{self._id_prefix}{next(self._ids)}"
            frames = encoder.frames(
                exchange, routing_key, mandatory, template, body, message_id.encode()
            )
        else:
            if type(properties) is not BasicProperties:
                properties = as_properties(properties)
            props, message_id = self._properties(properties, persistent, expiration)
            frames = encoder.frames(exchange, routing_key, mandatory, props, body)
        return frames, message_id

    def _encode_batch(
        self,
        messages: Iterable[OutgoingMessage | Body],
        exchange: str,
        routing_key: str,
        properties: spec.BasicProperties | Mapping[str, Any] | None,
        mandatory: bool | None,
        persistent: bool | None,
        expiration: int | timedelta | None,
    ) -> list[Encoded]:
        if isinstance(messages, bytes | bytearray | memoryview | str | OutgoingMessage):
            raise LocalProtocolError(
                "publish_batch.messages: must be an iterable of messages, got one message"
            )
        default_mandatory = self._mandatory if mandatory is None else mandatory
        encode = self._encode
        out: list[Encoded] = []
        for message in messages:
            if isinstance(message, OutgoingMessage):
                flag = default_mandatory if message.mandatory is None else message.mandatory
                frames, message_id = encode(
                    message.body,
                    exchange if message.exchange is None else message.exchange,
                    routing_key if message.routing_key is None else message.routing_key,
                    properties if message.properties is None else message.properties,
                    flag,
                    persistent if message.persistent is None else message.persistent,
                    expiration if message.expiration is None else message.expiration,
                )
            else:
                flag = default_mandatory
                frames, message_id = encode(
                    message, exchange, routing_key, properties, flag, persistent, expiration
                )
            out.append((frames, message_id, flag))
        return out

    def _template(self, persistent: bool | None, expiration: int | timedelta | None) -> bytes:
        """Encoded properties up to (not including) the message_id value."""
        text = None if expiration is None else expiration_ms(expiration)
        template = properties_prefix(persistent, text)
        if expiration is None or type(expiration) is int:
            if len(self._templates) >= _CACHE_LIMIT:
                self._templates.clear()
            self._templates[(persistent, expiration)] = template
        return template

    def _properties(
        self,
        properties: spec.BasicProperties,
        persistent: bool | None,
        expiration: int | timedelta | None,
    ) -> tuple[bytes, str | None]:
        message_id = properties.message_id
        if message_id is None or persistent is not None or expiration is not None:
            properties = copy.copy(properties)
            if message_id is None:
                message_id = properties.message_id = f"{self._id_prefix}{next(self._ids)}"
            if persistent is not None:
                properties.delivery_mode = 2 if persistent else 1
            if expiration is not None:
                properties.expiration = expiration_ms(expiration)
        return properties.encode(), message_id


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
