"""The loop-thread half of :class:`rabbitry.publisher.AsyncPublisher`.

The records the channel's confirm table settles (one per message, or one per member of
a ``publish_batch``), and the publisher's machinery: waiting for the right to send (the
window, a blocked connection, the channel), sending, and the channel's and the
connection's events. :class:`AsyncPublisher` derives from :class:`PublisherCore`, which
declares the attributes ``AsyncPublisher.__init__`` sets and this half uses.
"""

from __future__ import annotations

import asyncio
import copy
import logging
from collections import deque
from typing import TYPE_CHECKING, Any

from .aio.channel import pipe_of
from .aio.connection import remove_callback
from .exceptions import (
    AMQPError,
    InvalidStateError,
    Nacked,
    PublishOutcomeUnknown,
    PublishTimeout,
    Unroutable,
)
from .protocol.channel import ChannelState
from .protocol.publish import PublishEncoder, retarget
from .recovery import State

if TYPE_CHECKING:
    from collections.abc import Callable, Coroutine

    from ._waiters import Waiters
    from .aio.channel import AsyncChannel, Settleable
    from .aio.connection import AsyncConnection
    from .protocol.message import Message
    from .publishing.pipe import PublishPipe, WritePath
    from .publishing.unobserved import UnobservedLedger
    from .recovery import NackRetry

logger = logging.getLogger("rabbitry.publisher")

_OPEN = ChannelState.OPEN
_UNSET: Any = object()


# --------------------------------------------------------------------------- records


class Pending:
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
        owner: PublisherCore,
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
            self.owner._ledger.fail(future, exception)
        self.owner._finished(self)

    def expire(self) -> None:
        """The deadline passed: fail the future, keep the record until the confirm."""
        self.timer = None
        future = self.future
        if not future.done():
            self.owner._ledger.fail(
                future,
                PublishTimeout(f"publish #{self.seq} was not confirmed before its deadline"),
            )


class Batch:
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

    def __init__(self, batch: Batch, index: int) -> None:
        self.batch = batch
        self.index = index

    def done(self) -> bool:
        return self.batch.outcomes[self.index] is not _UNSET

    def set_result(self, _result: None, /) -> None:
        self.batch.settle(self.index, None)

    def set_exception(self, exception: BaseException, /) -> None:
        self.batch.settle(self.index, exception)


#: One encoded message: frames, message_id, mandatory.
Encoded = tuple[list[bytes], str | None, bool]


class PublisherCore:
    """Waiting, sending and events: the machinery under :class:`AsyncPublisher`."""

    # Set by AsyncPublisher.__init__.
    _conn: AsyncConnection
    _loop: asyncio.AbstractEventLoop
    _confirm: bool
    _max: int
    _republish: bool
    _nack_retry: NackRetry | None
    _retrying: int
    _nack_attempts: dict[Any, int]
    nack_resends: int
    _channel: AsyncChannel | None
    _pipe: PublishPipe | None
    _writes: WritePath
    _opening: asyncio.Task[AsyncChannel] | None
    _encoder: PublishEncoder
    _cid_bytes: bytes
    _max_size: int
    _in_flight: int
    _room_waiters: Waiters[None]
    _outstanding: int
    _backlog: deque[
        tuple[
            list[bytes],
            Settleable | None,
            str | None,
            bool,
            float | None,
            Callable[[], None] | None,
        ]
    ]
    _idle_waiters: Waiters[None]
    _returnable: dict[str, list[Pending]]
    _blocked_reason: str | None
    _unblocked: asyncio.Event
    _block_hooks: list[Callable[[str | None], None]]
    _close_hooks: list[Callable[[], None]]
    _closing: bool
    _port: PublisherPort
    _closed_by: AMQPError | None
    _detached: bool
    _release_slot_cb: Callable[[], None]
    _ledger: UnobservedLedger

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
                        # A slot handed over as we are cancelled goes to the next waiter.
                        await self._room_waiters.wait()
                        reserved = True
                if self._writes.paused:
                    await self._writes.wait_writable()
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
        pipe = self._pipe
        if (
            self._blocked_reason is None
            and not self._writes.paused
            and not self._closing
            and pipe is not None
            and pipe.protocol.state is _OPEN
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
        if not (self._room_waiters and self._room_waiters.hand(None)):
            self._in_flight -= 1

    async def _ensure_channel(self) -> None:
        pipe = self._pipe
        if pipe is not None and pipe.protocol.state is _OPEN:
            return
        task = self._opening
        if task is None:
            task = self._opening = self._loop.create_task(self._open_channel())
            task.add_done_callback(_retrieve)
        await asyncio.shield(task)

    async def _open_channel(self) -> AsyncChannel:
        old, pipe = self._channel, self._pipe
        if old is not None and not old.is_closed and self._conn.state is State.RECOVERING:
            # The connection is recovering and brings this channel back (same number,
            # confirm mode, return callback): wait for it rather than open another.
            try:
                await self._conn.wait_recovered()
            except AMQPError:
                pass
            if pipe is not None and pipe.protocol.state is _OPEN:
                self._opening = None
                if self._backlog:
                    backlog, self._backlog = self._backlog, deque()
                    for item in backlog:
                        self._send_now(pipe, *item)
                    self._writes.kick()
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
            if channel.is_open and self._conn.is_open:
                self._loop.create_task(channel.close()).add_done_callback(_retrieve)
            raise InvalidStateError("the publisher is closed")
        self._channel = channel
        pipe = self._pipe = pipe_of(channel)
        self._encoder = PublishEncoder(channel.channel_id, self._conn.frame_max)
        self._max_size = self._conn.max_message_size  # the broker's, now that it is known
        self._cid_bytes = channel.channel_id.to_bytes(2, "big")
        if self._backlog:
            # Also while closing: publish() accepted these messages and close() waits for
            # their confirms (then closes this channel); only _detach fails what is left.
            backlog, self._backlog = self._backlog, deque()
            for item in backlog:
                self._send_now(pipe, *item)
            self._writes.kick()
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
        pipe = self._pipe
        if self._closing:
            if future is not None:
                self._ledger.fail(future, self._closed_error())
            if release is not None:
                release()
            return
        if pipe is None or pipe.protocol.state is not _OPEN or self._backlog:
            self._backlog.append((frames, future, message_id, mandatory, deadline, release))
            self._reopen_soon()
            return
        self._send_now(pipe, frames, future, message_id, mandatory, deadline, release)
        self._writes.kick()

    def _frames(
        self,
        exchange: str,
        routing_key: str,
        mandatory: bool,
        properties: bytes,
        body: bytes,
    ) -> list[bytes]:
        """The frames of one message with encoded ``properties``, for the current channel."""
        return self._encoder.frames(exchange, routing_key, mandatory, properties, body)

    def _send_reserved(
        self,
        frames: list[bytes],
        waiter: Settleable,
        message_id: str | None,
        mandatory: bool,
    ) -> None:
        """Queue one message whose window slot is reserved, without a flush when the
        channel is ready: the caller flushes (``kick`` of the port) after a run of them.
        The slot is freed when the message is settled (loop thread)."""
        pipe = self._pipe
        if (
            pipe is not None
            and pipe.protocol.state is _OPEN
            and not self._backlog
            and not self._closing
        ):
            self._send_now(pipe, frames, waiter, message_id, mandatory, None, self._release_slot_cb)
        else:
            self._send(frames, waiter, message_id, mandatory, None, self._release_slot_cb)

    def _send_batch(
        self,
        items: list[Encoded],
        batch: Batch,
        start: int,
        deadline: float | None,
        release: Callable[[], None] | None,
    ) -> None:
        """Queue a chunk of a batch and write it with one flush (loop thread)."""
        pipe = self._pipe
        direct = not (
            self._closing or pipe is None or pipe.protocol.state is not _OPEN or self._backlog
        )
        index = start
        for frames, message_id, mandatory in items:
            slot = _Slot(batch, index)
            if direct:
                assert pipe is not None
                self._send_now(pipe, frames, slot, message_id, mandatory, None, release)
            else:
                self._send(frames, slot, message_id, mandatory, None, release)
            index += 1
        if deadline is not None and batch.timer is None and batch.remaining:
            batch.timer = self._loop.call_at(deadline, batch.expire)
        if direct:
            self._writes.flush()

    def _send_now(
        self,
        pipe: PublishPipe,
        frames: list[bytes],
        future: Settleable | None,
        message_id: str | None,
        mandatory: bool,
        deadline: float | None,
        release: Callable[[], None] | None,
    ) -> None:
        proto = pipe.protocol
        if frames[0][1:3] != self._cid_bytes:
            frames = retarget(frames, proto.channel_id)
        record: Pending | None = None
        if proto.confirm_mode:
            assert future is not None
            record = Pending(self, future, frames, message_id, release)
        try:
            # In confirm mode the channel's confirm table now holds the record: it
            # settles it, or fails it if the channel ends first.
            seq = proto.send_publish(frames, record)
        except AMQPError as exc:
            if future is not None:
                self._ledger.fail(future, exc)
            if release is not None:
                release()
            return
        if not seq:  # no confirms: queued is all we will know
            if future is not None and not future.done():
                future.set_result(None)
            if release is not None:
                release()
            return
        assert record is not None
        record.seq = seq
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
                self._ledger.fail(future, error)
            if release is not None:
                release()
        self._check_idle()

    # ------------------------------------------------------------------ events (loop)

    def _finished(self, record: Pending) -> None:
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

    def _forget_returnable(self, record: Pending) -> None:
        record.returnable = False
        key = record.message_id
        assert key is not None
        same = self._returnable.get(key)
        if same is not None:
            if record in same:
                same.remove(record)
            if not same:
                del self._returnable[key]

    def _retry_nacked(self, record: Pending) -> bool:
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

    def _resend_nacked(self, record: Pending, mandatory: bool, deadline: float | None) -> None:
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
        self._idle_waiters.wake_all(None)

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
            self._ledger.fail(record.future, Unroutable(message))

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
        self._closing = self._port.closing = True
        self._closed_by = exc
        error = InvalidStateError("the connection is closed")
        error.__cause__ = exc
        self._room_waiters.fail_all(error)
        self._run_close_hooks()

    def _detach(self) -> None:
        """Stop listening to the connection and release everyone waiting (closing)."""
        self._closing = self._port.closing = True
        self._detached = True
        remove_callback(self._conn, self._on_blocked)
        remove_callback(self._conn, self._on_connection_closed)
        self._unblocked.set()
        self._room_waiters.fail_all(InvalidStateError("the publisher is closed"))
        self._fail_backlog(InvalidStateError("the publisher is closed"), closing=True)
        self._run_close_hooks()


# --------------------------------------------------------------------------- port


class PublisherPort:
    """What the library's own collaborators of a publisher drive; not for applications.

    Its users are the thread-safe twin (:class:`rabbitry.sync.publisher.Publisher`) and
    the durable outbox (:class:`rabbitry.outbox_publisher.AsyncOutboxPublisher`), which
    encode and send through the publisher and share its window, and the OpenTelemetry
    hooks (``rabbitry.observability._otel``); applications use the publisher's own
    methods. ``AsyncPublisher.__init__`` builds it; get it with
    :func:`rabbitry.publisher.port_of`.

    Its members are plain attributes (bound methods and a flag), so using one costs the
    same calls as the publisher's method would. ``closing`` is set together with the
    publisher's own flag: the publisher is closing or closed, and nothing may be handed
    over any more.
    """

    __slots__ = (
        "acquire",
        "add_block_hook",
        "add_close_hook",
        "closed_state",
        "closing",
        "connection",
        "encode",
        "encode_batch",
        "frames",
        "kick",
        "ledger",
        "loop",
        "new_message_id",
        "release_slot",
        "reserve_more",
        "reserve_now",
        "send",
        "send_batch",
        "send_reserved",
        "shutdown",
    )

    def __init__(
        self,
        core: PublisherCore,
        encode: Callable[..., tuple[list[bytes], str | None]],
        encode_batch: Callable[..., list[Encoded]],
        new_message_id: Callable[[], str],
        shutdown: Callable[[float | None], Coroutine[Any, Any, None]],
    ) -> None:
        #: ``encode(body, exchange, routing_key, properties, mandatory, persistent,
        #: expiration)``: the frames and message_id of one message; any thread.
        self.encode = encode
        #: ``encode_batch(messages, exchange, routing_key, properties, mandatory,
        #: persistent, expiration)``: a list of (frames, message_id, mandatory).
        self.encode_batch = encode_batch
        #: ``new_message_id()``: a message_id as the publisher generates them.
        self.new_message_id = new_message_id
        #: ``await shutdown(timeout)``: close the publisher without the report of the
        #: failures nobody looked at (the caller reports them itself); on the loop.
        self.shutdown = shutdown
        #: The publisher's connection, and the event loop the publisher runs on.
        self.connection = core._conn
        self.loop = core._loop
        self.frames = core._frames
        self.send = core._send
        self.send_batch = core._send_batch
        self.send_reserved = core._send_reserved
        self.acquire = core._acquire
        self.reserve_now = core._reserve_now
        self.reserve_more = core._reserve_more
        self.release_slot = core._release_slot
        self.closed_state = core._closed_state
        #: ``kick()``: write what ``send_reserved`` queued (the connection's write path).
        self.kick = core._writes.kick
        self.add_block_hook = core._add_block_hook
        self.add_close_hook = core._add_close_hook
        #: The failed futures nobody looked at (reported when the publisher ends).
        self.ledger = core._ledger
        self.closing = False


def _retrieve(task: asyncio.Task[Any]) -> None:
    """Mark a background task's exception as seen (its waiters got it already)."""
    if not task.cancelled():
        task.exception()
