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
are queued on the channel and a :class:`_Pending` record is put in the channel's confirm
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
from dataclasses import dataclass
from datetime import timedelta
from typing import TYPE_CHECKING, Any, NamedTuple

from .exceptions import (
    AMQPError,
    ConfigurationError,
    InvalidStateError,
    LocalProtocolError,
    MessageTooLarge,
    Nacked,
    PublishOutcomeUnknown,
    PublishTimeout,
    Unroutable,
)
from .observability import _state as _obs
from .protocol.channel import ChannelState
from .protocol.publish import PublishEncoder, as_body, properties_prefix, retarget
from .recovery import NackRetry, State

if TYPE_CHECKING:
    from collections.abc import Callable, Iterable

    from .aio.channel import AsyncChannel, Settleable
    from .aio.connection import AsyncConnection
    from .protocol import spec
    from .protocol.message import Message

__all__ = ["AsyncPublisher", "Body", "OutgoingMessage", "UnconfirmedMessage", "expiration_ms"]

logger = logging.getLogger("rabbitry.publisher")

#: What a message body may be; ``str`` is sent as UTF-8.
Body = bytes | bytearray | memoryview | str

_OPEN = ChannelState.OPEN
_MAX_EXPIRATION = 2**32 - 1  # RabbitMQ: rabbit_misc:check_expiry, ?MAX_EXPIRY_TIMER
_ONE_MS = timedelta(milliseconds=1)
_CACHE_LIMIT = 512
_PLAIN_TEMPLATE = properties_prefix(None, None)
_UNSET: Any = object()


# --------------------------------------------------------------------------- messages


@dataclass(frozen=True, slots=True)
class OutgoingMessage:
    """One message of :meth:`AsyncPublisher.publish_batch`.

    Fields left at ``None`` take the value given to ``publish_batch`` itself.

    Attributes:
        body: the payload (``str`` is sent as UTF-8).
        exchange: the exchange to publish to.
        routing_key: the routing key.
        properties: the basic properties (``message_id`` is generated when absent).
        mandatory: ask the broker to return the message if no queue gets it.
        persistent: ``True`` sends delivery mode 2 (persistent), ``False`` mode 1.
        expiration: per-message TTL, int milliseconds or a ``timedelta``.
    """

    body: Body
    exchange: str | None = None
    routing_key: str | None = None
    properties: spec.BasicProperties | None = None
    mandatory: bool | None = None
    persistent: bool | None = None
    expiration: int | timedelta | None = None


class UnconfirmedMessage(NamedTuple):
    """A message sent and not yet settled, as kept in the outbox (for recovery).

    Attributes:
        seq: its publish sequence number on the channel it was sent on.
        message_id: its ``message_id`` (generated when the publisher set it).
        frames: the encoded frames as written (channel number included).
    """

    seq: int
    message_id: str | None
    frames: list[bytes]

    def frames_for(self, channel_id: int) -> list[bytes]:
        """The same frames addressed to channel ``channel_id`` (for a resend)."""
        return retarget(self.frames, channel_id)


def expiration_ms(value: int | timedelta | str, field: str = "expiration") -> str:
    """Convert a per-message TTL to the digit string RabbitMQ requires.

    Args:
        value: int milliseconds, a ``timedelta`` (whole milliseconds, rounded down) or a
            string of digits.
        field: the name used in the error message.

    Raises:
        LocalProtocolError: a bool, a float, a negative value, a value above
            2^32 - 1 ms (RabbitMQ's limit) or anything else.
    """
    if isinstance(value, bool) or not isinstance(value, int | timedelta | str):
        raise LocalProtocolError(
            f"{field}: must be int milliseconds or a timedelta, got {type(value).__name__}"
        )
    if isinstance(value, timedelta):
        ms = value // _ONE_MS
    elif isinstance(value, str):
        if not (value.isascii() and value.isdigit()):
            raise LocalProtocolError(f"{field}: must be a string of digits, got {value!r}")
        ms = int(value)
    else:
        ms = value
    if ms < 0:
        raise LocalProtocolError(f"{field}: must not be negative, got {ms} ms")
    if ms > _MAX_EXPIRATION:
        raise LocalProtocolError(f"{field}: at most {_MAX_EXPIRATION} ms, got {ms} ms")
    return str(ms)


# --------------------------------------------------------------------------- records


class _Pending:
    """One sent, unsettled message: what the channel's confirm table settles.

    ``done()`` answers "has the broker (or the channel's end) settled it", not "has the
    caller's future an outcome": after a return the future has failed but the ack must
    still come through here to free the window slot.
    """

    __slots__ = (
        "frames",
        "future",
        "message_id",
        "owner",
        "release",
        "returnable",
        "seq",
        "settled",
        "timer",
    )

    def __init__(
        self,
        owner: AsyncPublisher,
        future: Settleable,
        frames: list[bytes],
        message_id: str | None,
        release: Callable[[], None] | None,
    ) -> None:
        self.owner = owner
        self.future = future
        self.frames = frames
        self.message_id = message_id
        self.release = release
        self.returnable = False
        self.seq = 0
        self.settled = False
        self.timer: asyncio.TimerHandle | None = None

    def done(self) -> bool:
        return self.settled

    @property
    def resend_on_recovery(self) -> bool:
        """Recovery keeps this message and sends it again (``republish_unconfirmed``)."""
        return self.owner._republish

    def set_result(self, _result: None, /) -> None:
        self.settled = True
        future = self.future
        if not future.done():
            future.set_result(None)
        owner = self.owner
        if self.timer is not None or self.returnable or owner._nack_attempts:
            owner._finished(self)
            return
        # The common case of AsyncPublisher._finished, inlined: this runs once per ack.
        owner._outstanding -= 1
        release = self.release
        if release is not None:
            release()
        if not owner._outstanding and owner._idle_waiters:
            owner._check_idle()

    def set_exception(self, exception: BaseException, /) -> None:
        future = self.future
        if (
            isinstance(exception, Nacked)
            and self.owner._nack_retry is not None
            and not future.done()
            and self.owner._retry_nacked(self)
        ):
            return  # sent again later; this record is replaced by the next attempt's
        self.settled = True
        if not future.done():
            if isinstance(exception, Nacked) and exception.delivery_tag != self.seq:
                exception = Nacked(self.seq)  # a multiple nack names its highest tag
            future.set_exception(exception)
        self.owner._finished(self)

    def expire(self) -> None:
        """The deadline passed: fail the future, keep the record until the confirm."""
        self.timer = None
        future = self.future
        if not future.done():
            future.set_exception(
                PublishTimeout(f"publish #{self.seq} was not confirmed before its deadline")
            )


class _Batch:
    """Collects the outcomes of one ``publish_batch`` call; completes ``target`` once."""

    __slots__ = ("outcomes", "remaining", "target", "timer")

    def __init__(self, size: int, target: Any) -> None:
        self.outcomes: list[BaseException | None] = [_UNSET] * size
        self.remaining = size
        self.target = target
        self.timer: asyncio.TimerHandle | None = None

    def settle(self, index: int, outcome: BaseException | None) -> None:
        if self.outcomes[index] is not _UNSET:
            return
        self.outcomes[index] = outcome
        self.remaining -= 1
        if not self.remaining:
            if self.timer is not None:
                self.timer.cancel()
                self.timer = None
            if not self.target.done():
                self.target.set_result(self.outcomes)

    def expire(self) -> None:
        self.timer = None
        for index, outcome in enumerate(self.outcomes):
            if outcome is _UNSET:
                self.settle(
                    index, PublishTimeout("batch message not confirmed before its deadline")
                )


class _Slot:
    """A batch member's stand-in for a future."""

    __slots__ = ("batch", "index")

    def __init__(self, batch: _Batch, index: int) -> None:
        self.batch = batch
        self.index = index

    def done(self) -> bool:
        return self.batch.outcomes[self.index] is not _UNSET

    def set_result(self, _result: None, /) -> None:
        self.batch.settle(self.index, None)

    def set_exception(self, exception: BaseException, /) -> None:
        self.batch.settle(self.index, exception)


#: One encoded message: frames, message_id, mandatory.
_Encoded = tuple[list[bytes], str | None, bool]


# --------------------------------------------------------------------------- publisher


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
        loop = connection._loop
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
        self._opening: asyncio.Task[AsyncChannel] | None = None
        # The encoder of the current channel, swapped as one object so that a thread
        # never mixes two channels (until a channel is open: number 0, no frame_max).
        self._encoder = PublishEncoder(0)
        self._cid_bytes = b"\x00\x00"
        self._max_size = connection.max_message_size
        self._templates: dict[tuple[Any, Any], bytes] = {}
        self._id_prefix = secrets.token_hex(8) + "-"
        self._ids = itertools.count(1)
        # Window: slots reserved by the async API, and the FIFO of those waiting.
        self._in_flight = 0
        self._room_waiters: deque[asyncio.Future[None]] = deque()
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
        self._idle_waiters: list[asyncio.Future[None]] = []
        self._returnable: dict[str, list[_Pending]] = {}
        self._blocked_reason = connection.blocked_reason
        self._unblocked = asyncio.Event()
        if self._blocked_reason is None:
            self._unblocked.set()
        self._block_hooks: list[Callable[[str | None], None]] = []
        # Told (loop thread) when the publisher closes or its connection ends.
        self._close_hooks: list[Callable[[], None]] = []
        self._closing = False
        # The connection's end, when that is what closed the publisher.
        self._closed_by: AMQPError | None = None
        # close() has given up waiting (or _create failed): nothing will use or close a
        # channel that finishes opening from now on, so it is closed on arrival.
        self._detached = False
        self._release_slot_cb = self._release_slot
        connection.add_blocked_callback(self._on_blocked)
        connection.add_close_callback(self._on_connection_closed)

    @classmethod
    async def _create(
        cls, connection: AsyncConnection, *, open_timeout: float | None = None, **options: Any
    ) -> AsyncPublisher:
        publisher = cls(connection, **options)
        scope = asyncio.timeout(open_timeout)
        try:
            async with scope:
                await publisher._ensure_channel()
        except BaseException as exc:
            publisher._detach()
            if isinstance(exc, TimeoutError) and scope.expired():
                raise PublishTimeout(
                    f"the publisher's channel did not open within {open_timeout} s"
                ) from None
            raise
        return publisher

    def __repr__(self) -> str:
        channel = self._channel.channel_id if self._channel is not None else None
        return (
            f"<AsyncPublisher channel={channel} confirm={self._confirm} "
            f"in_flight={self.in_flight}/{self._max}>"
        )

    async def __aenter__(self) -> AsyncPublisher:
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.close()

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
        properties: spec.BasicProperties | None = None,
        mandatory: bool | None = None,
        persistent: bool | None = None,
        expiration: int | timedelta | None = None,
        timeout: float | None = None,
    ) -> asyncio.Future[None]:
        """Publish one message; returns a future for its outcome.

        Waits (before sending) while the connection is blocked by the broker, while
        ``max_in_flight`` messages are unconfirmed, and while the socket's write buffer
        is full. The future resolves with ``None`` when the broker acks the message;
        with ``confirm=False`` it resolves once the message is queued for the socket.

        Args:
            body: the payload; ``str`` is sent as UTF-8.
            exchange: the exchange ("" is the default exchange).
            routing_key: the routing key (the queue name on the default exchange).
            properties: the basic properties. ``message_id`` is generated when absent,
                so that consumers can de-duplicate a message sent twice.
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
        channel = self._channel
        if (
            self._blocked_reason is None
            and not self._conn._write_paused
            and not self._closing
            and channel is not None
            and channel._proto.state is _OPEN
            and (not confirm or (self._in_flight < self._max and not self._room_waiters))
        ):
            if confirm:
                self._in_flight += 1
        else:
            await self._acquire(deadline, timeout)
        future: asyncio.Future[None] = self._loop.create_future()
        release = self._release_slot_cb if confirm else None
        channel = self._channel
        if channel is not None and channel._proto.state is _OPEN and not self._backlog:
            self._send_now(channel, frames, future, message_id, mandatory, deadline, release)
            self._conn._kick()
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
        properties: spec.BasicProperties | None = None,
        mandatory: bool | None = None,
        persistent: bool | None = None,
        expiration: int | timedelta | None = None,
        timeout: float | None = None,
    ) -> list[BaseException | None]:
        """Publish many messages in one write burst; returns their outcomes once settled.

        Every message is encoded (and validated) before anything is sent. They go out
        on the publisher's channel in order, written to the socket at once when the
        window has room for all of them; otherwise in chunks as room frees up.
        ``exchange``, ``routing_key``, ``properties``, ``mandatory``, ``persistent`` and
        ``expiration`` are as for :meth:`publish`, for the messages that do not set their own.

        Args:
            messages: :class:`OutgoingMessage` objects, or bodies that use the arguments
                above; ``None`` fields of an ``OutgoingMessage`` use them too.
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
        batch = _Batch(len(encoded), done)
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

        Raises:
            PublishTimeout: messages were still unconfirmed after ``timeout`` seconds.
        """
        if not self._confirm:
            self._conn._kick()
            await self._conn._wait_writable()
            return
        if not self.in_flight:
            return
        waiter: asyncio.Future[None] = self._loop.create_future()
        self._idle_waiters.append(waiter)
        try:
            async with asyncio.timeout(timeout):
                await waiter
        except TimeoutError:
            raise PublishTimeout(
                f"{self.in_flight} messages still unconfirmed after {timeout} s"
            ) from None
        finally:
            if waiter in self._idle_waiters:
                self._idle_waiters.remove(waiter)

    def unconfirmed(self) -> list[UnconfirmedMessage]:
        """The outbox: messages sent (or waiting for a channel) and not settled, oldest first.

        Their frames are kept as encoded; ``frames_for(channel_id)`` re-addresses them.
        Messages still waiting for a channel have ``seq`` 0.
        """
        out: list[UnconfirmedMessage] = []
        channel = self._channel
        if channel is not None:
            # Kept for the resend while the connection recovers (seq of the old channel).
            for kept in channel._resend:
                if isinstance(kept, _Pending) and not kept.settled:
                    out.append(UnconfirmedMessage(kept.seq, kept.message_id, kept.frames))
            for seq, record in channel._confirms:
                if isinstance(record, _Pending) and not record.settled:
                    out.append(UnconfirmedMessage(seq, record.message_id, record.frames))
        for frames, _future, message_id, *_rest in self._backlog:
            out.append(UnconfirmedMessage(0, message_id, frames))
        return out

    async def close(self, *, timeout: float | None = None) -> None:
        """Wait for outstanding confirms (up to ``timeout``), then close the channel.

        Idempotent. Messages still unconfirmed when the channel closes fail with
        :class:`PublishOutcomeUnknown`; later publishes raise :class:`InvalidStateError`.
        """
        if self._closing:
            return
        self._closing = True
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

    def _encode(
        self,
        body: Body,
        exchange: str,
        routing_key: str,
        properties: spec.BasicProperties | None,
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
            props, message_id = self._properties(properties, persistent, expiration)
            frames = encoder.frames(exchange, routing_key, mandatory, props, body)
        return frames, message_id

    def _encode_batch(
        self,
        messages: Iterable[OutgoingMessage | Body],
        exchange: str,
        routing_key: str,
        properties: spec.BasicProperties | None,
        mandatory: bool | None,
        persistent: bool | None,
        expiration: int | timedelta | None,
    ) -> list[_Encoded]:
        if isinstance(messages, bytes | bytearray | memoryview | str | OutgoingMessage):
            raise LocalProtocolError(
                "publish_batch.messages: must be an iterable of messages, got one message"
            )
        default_mandatory = self._mandatory if mandatory is None else mandatory
        encode = self._encode
        out: list[_Encoded] = []
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

    # ------------------------------------------------------------------ waiting (loop)

    async def _acquire(self, deadline: float | None, timeout: float | None) -> None:
        """Wait until a message may be sent; reserves a window slot in confirm mode."""
        if self._closing:
            raise self._closed_state()
        reserved = False
        scope = asyncio.timeout_at(deadline)
        try:
            async with scope:
                while self._blocked_reason is not None:
                    await self._unblocked.wait()
                    if self._closing:
                        raise self._closed_state()
                if self._confirm:
                    if self._in_flight < self._max and not self._room_waiters:
                        self._in_flight += 1
                        reserved = True
                    else:
                        waiter: asyncio.Future[None] = self._loop.create_future()
                        self._room_waiters.append(waiter)
                        try:
                            await waiter
                        except BaseException:
                            # The slot may have been handed over as we were cancelled.
                            if waiter.done() and not waiter.cancelled():
                                if waiter.exception() is None:
                                    self._release_slot()
                            else:
                                waiter.cancel()
                                try:
                                    self._room_waiters.remove(waiter)
                                except ValueError:
                                    pass
                            raise
                        reserved = True
                if self._conn._write_paused:
                    await self._conn._wait_writable()
                await self._ensure_channel()
                if self._closing:
                    raise self._closed_state()
        except BaseException as exc:
            if reserved:
                self._release_slot()
            if isinstance(exc, TimeoutError) and scope.expired():
                what = (
                    f"connection blocked by the broker: {self._blocked_reason}"
                    if self._blocked_reason is not None
                    else f"no room in the window of {self._max}"
                )
                raise PublishTimeout(f"could not publish within {timeout} s: {what}") from None
            raise

    def _reserve_now(self) -> bool:
        """Reserve a window slot if a message can be sent at once (loop thread).

        True when the channel is open, nothing blocks publishing and the window has
        room; False reserves nothing (wait with :meth:`_acquire` instead).
        """
        channel = self._channel
        if (
            self._blocked_reason is None
            and not self._conn._write_paused
            and not self._closing
            and channel is not None
            and channel._proto.state is _OPEN
            and self._in_flight < self._max
            and not self._room_waiters
        ):
            self._in_flight += 1
            return True
        return False

    def _reserve_more(self) -> bool:
        """Reserve one more window slot if there is room and nobody waits for one."""
        if self._in_flight < self._max and not self._room_waiters:
            self._in_flight += 1
            return True
        return False

    def _release_slot(self) -> None:
        """A confirm freed a window slot: hand it to the oldest waiter, or free it."""
        waiters = self._room_waiters
        while waiters:
            waiter = waiters.popleft()
            if not waiter.done():
                waiter.set_result(None)
                return
        self._in_flight -= 1

    def _wake_room_waiters(self, exc: BaseException) -> None:
        waiters, self._room_waiters = self._room_waiters, deque()
        for waiter in waiters:
            if not waiter.done():
                waiter.set_exception(copy.copy(exc))

    async def _ensure_channel(self) -> AsyncChannel:
        channel = self._channel
        if channel is not None and channel._proto.state is _OPEN:
            return channel
        task = self._opening
        if task is None:
            task = self._opening = self._loop.create_task(self._open_channel())
            task.add_done_callback(_retrieve)
        return await asyncio.shield(task)

    async def _open_channel(self) -> AsyncChannel:
        old = self._channel
        if old is not None and old._suspended and not old.is_closed:
            # The connection is recovering and brings this channel back (same number,
            # confirm mode, return callback): wait for it rather than open another.
            try:
                await self._conn.wait_recovered()
            except AMQPError:
                pass
            if old._proto.state is _OPEN:
                self._opening = None
                if self._backlog:
                    backlog, self._backlog = self._backlog, deque()
                    for item in backlog:
                        self._send_now(old, *item)
                    self._conn._kick()
                return old
        try:
            channel = await self._conn.channel()
            if self._confirm:
                await channel.confirm_select()
            channel.add_return_callback(self._on_return)
        except BaseException as exc:
            self._opening = None
            self._fail_backlog(exc)
            raise
        self._opening = None
        if self._detached:
            # close() is past waiting for confirms (it closed the channel it knew of):
            # adopting this one would leave it open forever.
            self._fail_backlog(InvalidStateError("the publisher is closed"), closing=True)
            if channel._proto.state is _OPEN and self._conn.is_open:
                self._loop.create_task(channel.close()).add_done_callback(_retrieve)
            raise InvalidStateError("the publisher is closed")
        self._channel = channel
        self._encoder = PublishEncoder(channel.channel_id, self._conn.frame_max)
        self._max_size = self._conn.max_message_size  # the broker's, now that it is known
        self._cid_bytes = channel.channel_id.to_bytes(2, "big")
        if self._backlog:
            # Also while closing: publish() accepted these messages and close() waits for
            # their confirms (then closes this channel); only _detach fails what is left.
            backlog, self._backlog = self._backlog, deque()
            for item in backlog:
                self._send_now(channel, *item)
            self._conn._kick()
        return channel

    # ------------------------------------------------------------------ sending (loop)

    def _send(
        self,
        frames: list[bytes],
        future: Settleable | None,
        message_id: str | None,
        mandatory: bool,
        deadline: float | None,
        release: Callable[[], None] | None,
    ) -> None:
        """Queue one encoded message (loop thread; the sync twin's hot path too).

        ``future`` may be ``None`` without confirms (the sync twin reports nothing then).
        """
        channel = self._channel
        if self._closing:
            if future is not None:
                future.set_exception(self._closed_error())
            if release is not None:
                release()
            return
        if channel is None or channel._proto.state is not _OPEN or self._backlog:
            self._backlog.append((frames, future, message_id, mandatory, deadline, release))
            self._reopen_soon()
            return
        self._send_now(channel, frames, future, message_id, mandatory, deadline, release)
        self._conn._kick()

    def _send_reserved(
        self,
        frames: list[bytes],
        waiter: Settleable,
        message_id: str | None,
        mandatory: bool,
    ) -> None:
        """Queue one message whose window slot is reserved, without a flush when the
        channel is ready: the caller flushes (``_conn._kick()``) after a run of them.
        The slot is freed when the message is settled (loop thread)."""
        channel = self._channel
        if (
            channel is not None
            and channel._proto.state is _OPEN
            and not self._backlog
            and not self._closing
        ):
            self._send_now(
                channel, frames, waiter, message_id, mandatory, None, self._release_slot_cb
            )
        else:
            self._send(frames, waiter, message_id, mandatory, None, self._release_slot_cb)

    def _send_batch(
        self,
        items: list[_Encoded],
        batch: _Batch,
        start: int,
        deadline: float | None,
        release: Callable[[], None] | None,
    ) -> None:
        """Queue a chunk of a batch and write it with one flush (loop thread)."""
        channel = self._channel
        direct = not (
            self._closing or channel is None or channel._proto.state is not _OPEN or self._backlog
        )
        index = start
        for frames, message_id, mandatory in items:
            slot = _Slot(batch, index)
            if direct:
                assert channel is not None
                self._send_now(channel, frames, slot, message_id, mandatory, None, release)
            else:
                self._send(frames, slot, message_id, mandatory, None, release)
            index += 1
        if deadline is not None and batch.timer is None and batch.remaining:
            batch.timer = self._loop.call_at(deadline, batch.expire)
        if direct:
            self._conn._flush()

    def _send_now(
        self,
        channel: AsyncChannel,
        frames: list[bytes],
        future: Settleable | None,
        message_id: str | None,
        mandatory: bool,
        deadline: float | None,
        release: Callable[[], None] | None,
    ) -> None:
        if frames[0][1:3] != self._cid_bytes:
            frames = retarget(frames, channel.channel_id)
        try:
            seq = channel._proto.send_publish(frames)
        except AMQPError as exc:
            if future is not None:
                future.set_exception(exc)
            if release is not None:
                release()
            return
        if not seq:  # no confirms: queued is all we will know
            if future is not None and not future.done():
                future.set_result(None)
            if release is not None:
                release()
            return
        assert future is not None
        record = _Pending(self, future, frames, message_id, release)
        record.seq = seq
        # The channel's confirm tracker settles it (AsyncChannel._on_confirm), and
        # AsyncChannel._on_closed fails it if the channel ends first.
        channel._confirms.add(seq, record)
        self._outstanding += 1
        if mandatory and message_id is not None:
            record.returnable = True
            same = self._returnable.get(message_id)
            if same is None:
                self._returnable[message_id] = [record]
            else:
                same.append(record)
        if deadline is not None:
            record.timer = self._loop.call_at(deadline, record.expire)

    def _reopen_soon(self) -> None:
        if self._opening is None:
            task = self._opening = self._loop.create_task(self._open_channel())
            task.add_done_callback(_retrieve)

    def _fail_backlog(self, exc: BaseException, *, closing: bool = False) -> None:
        """Fail the messages that waited for a channel; they were never sent.

        They get :class:`PublishOutcomeUnknown` caused by ``exc`` (like every message
        lost with its channel), or ``exc`` itself when the publisher is closing.
        """
        backlog, self._backlog = self._backlog, deque()
        for _frames, future, _message_id, _mandatory, _deadline, release in backlog:
            if future is not None and not future.done():
                if closing:
                    error: BaseException = copy.copy(exc)
                else:
                    error = PublishOutcomeUnknown(
                        0, f"not sent: no channel could be opened ({exc!r})"
                    )
                    error.__cause__ = exc
                future.set_exception(error)
            if release is not None:
                release()
        self._check_idle()

    # ------------------------------------------------------------------ events (loop)

    def _finished(self, record: _Pending) -> None:
        """A record was settled by the broker or by the channel's end."""
        self._outstanding -= 1
        if self._nack_attempts:
            self._nack_attempts.pop(record.future, None)
        if record.timer is not None:
            record.timer.cancel()
            record.timer = None
        if record.returnable:
            self._forget_returnable(record)
        release = record.release
        if release is not None:
            release()
        if not self._outstanding and self._idle_waiters:
            self._check_idle()

    def _forget_returnable(self, record: _Pending) -> None:
        record.returnable = False
        key = record.message_id
        assert key is not None
        same = self._returnable.get(key)
        if same is not None:
            if record in same:
                same.remove(record)
            if not same:
                del self._returnable[key]

    def _retry_nacked(self, record: _Pending) -> bool:
        """A nack for ``record``: schedule it again if the policy allows (loop thread)."""
        policy = self._nack_retry
        assert policy is not None
        if self._closing:
            return False
        attempt = self._nack_attempts.get(record.future, 0)
        if attempt >= policy.max_attempts:
            self._nack_attempts.pop(record.future, None)
            return False
        self._nack_attempts[record.future] = attempt + 1
        record.settled = True  # this send is over; the next attempt gets a new record
        self._outstanding -= 1
        deadline: float | None = None
        if record.timer is not None:
            deadline = record.timer.when()
            record.timer.cancel()
            record.timer = None
        mandatory = record.returnable
        if mandatory:
            self._forget_returnable(record)
        self._retrying += 1
        self.nack_resends += 1
        delay = policy.delay(attempt)
        logger.info(
            "publish #%d (message_id %s) nacked; sending again in %.3f s (attempt %d of %d)",
            record.seq,
            record.message_id,
            delay,
            attempt + 1,
            policy.max_attempts,
        )
        self._loop.call_later(delay, self._resend_nacked, record, mandatory, deadline)
        return True

    def _resend_nacked(self, record: _Pending, mandatory: bool, deadline: float | None) -> None:
        self._retrying -= 1
        future = record.future
        if future.done():  # e.g. its deadline passed while waiting
            self._nack_attempts.pop(future, None)
            if record.release is not None:
                record.release()
            self._check_idle()
            return
        self._send(record.frames, future, record.message_id, mandatory, deadline, record.release)

    def _check_idle(self) -> None:
        if self._outstanding or self._backlog or self._retrying:
            return
        waiters, self._idle_waiters = self._idle_waiters, []
        for waiter in waiters:
            if not waiter.done():
                waiter.set_result(None)

    def _on_return(self, message: Message) -> None:
        message_id = message.properties.message_id
        same = self._returnable.get(message_id) if message_id is not None else None
        if not same:
            logger.warning(
                "returned message matches no mandatory publish in flight (%s %s, "
                "exchange=%r routing_key=%r message_id=%r)",
                message.reply_code,
                message.reply_text,
                message.exchange,
                message.routing_key,
                message_id,
            )
            return
        record = same[0]  # duplicates: oldest first
        self._forget_returnable(record)
        if not record.future.done():
            record.future.set_exception(Unroutable(message))

    def _on_blocked(self, reason: str | None) -> None:
        self._blocked_reason = reason
        if reason is None:
            self._unblocked.set()
        else:
            self._unblocked.clear()
        for hook in list(self._block_hooks):
            hook(reason)

    def _add_block_hook(self, hook: Callable[[str | None], None]) -> None:
        """Call ``hook(reason)`` now and on every block change (loop thread)."""
        self._block_hooks.append(hook)
        hook(self._blocked_reason)

    def _closed_error(self) -> AMQPError:
        """What a message handed over after the close fails with: the connection's end
        when that closed the publisher, else :class:`InvalidStateError`."""
        if self._closed_by is not None:
            return copy.copy(self._closed_by)
        return InvalidStateError("the publisher is closed")

    def _closed_state(self) -> InvalidStateError:
        """The error of a call made on the closed publisher (chained to the connection's
        end when that closed it)."""
        error = InvalidStateError("the publisher is closed")
        error.__cause__ = self._closed_by
        return error

    def _add_close_hook(self, hook: Callable[[], None]) -> None:
        """Call ``hook()`` once the publisher is closed (loop thread; now if it is)."""
        if self._closing:
            hook()
        else:
            self._close_hooks.append(hook)

    def _run_close_hooks(self) -> None:
        hooks, self._close_hooks = self._close_hooks, []
        for hook in hooks:
            hook()

    def _on_connection_closed(self, exc: AMQPError) -> None:
        # Blocked state ends with the connection; waiters then fail on the channel.
        self._on_blocked(None)
        self._fail_backlog(exc)
        if self._closing:
            self._run_close_hooks()
            return
        # The connection is gone for good (recovery, if any, has given up): the
        # publisher is closed with it, and whatever is handed over later fails at once.
        self._closing = True
        self._closed_by = exc
        for waiter in self._room_waiters:
            if not waiter.done():
                error = InvalidStateError("the connection is closed")
                error.__cause__ = exc
                waiter.set_exception(error)
        self._room_waiters.clear()
        self._run_close_hooks()

    def _detach(self) -> None:
        """Stop listening to the connection and release everyone waiting (closing)."""
        self._closing = True
        self._detached = True
        for hooks, callback in (
            (self._conn._blocked_callbacks, self._on_blocked),
            (self._conn._close_callbacks, self._on_connection_closed),
        ):
            try:
                hooks.remove(callback)  # type: ignore[arg-type]
            except ValueError:
                pass
        self._unblocked.set()
        self._wake_room_waiters(InvalidStateError("the publisher is closed"))
        self._fail_backlog(InvalidStateError("the publisher is closed"), closing=True)
        self._run_close_hooks()


def _retrieve(task: asyncio.Task[Any]) -> None:
    """Mark a background task's exception as seen (its waiters got it already)."""
    if not task.cancelled():
        task.exception()
