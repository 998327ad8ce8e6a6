"""The send machinery of :class:`rabbitry.publisher.AsyncPublisher` (loop thread).

Waiting for the right to send (the window, a blocked connection, the channel), sending
encoded messages on the publisher's channel (or keeping them until one is open), and
following the channel's and the connection's events. The records the channel's confirm
table settles are in :mod:`rabbitry.publishing.records`; they report to the core's
:class:`~rabbitry.publishing.confirms.SentMessages`, and the window of the async API is
a :class:`~rabbitry.publishing.window.SendWindow`.
"""

from __future__ import annotations

import asyncio
import copy
import logging
from collections import deque
from typing import TYPE_CHECKING, Any, Protocol

from ..aio.channel import pipe_of
from ..aio.connection import remove_callback, writes_of
from ..exceptions import (
    AMQPError,
    InvalidStateError,
    PublishOutcomeUnknown,
    PublishTimeout,
)
from ..protocol.channel import ChannelState
from ..protocol.publish import retarget
from ..publishing.confirms import SentMessages
from ..publishing.records import Pending, Slot
from ..publishing.window import SendWindow
from ..recovery import State

if TYPE_CHECKING:
    from collections.abc import Callable

    from ..aio.channel import AsyncChannel, Settleable
    from ..aio.connection import AsyncConnection
    from ..publishing.encoding import Encoded, MessageEncoder
    from ..publishing.pipe import PublishPipe, WritePath
    from ..publishing.records import Batch
    from ..publishing.unobserved import UnobservedLedger
    from ..recovery import NackRetry

logger = logging.getLogger("rabbitry.publisher")

_OPEN = ChannelState.OPEN

#: A message waiting for a channel: frames, future, message_id, mandatory, deadline,
#: release.
Queued = tuple[
    list[bytes],
    "Settleable | None",
    str | None,
    bool,
    float | None,
    "Callable[[], None] | None",
]


class ClosingFlag(Protocol):
    """Told when the publisher starts closing (the port mirrors the flag)."""

    closing: bool


class PublisherCore:
    """Sends a publisher's encoded messages on its channel, within its window.

    Its state is read (never written, but for the window's fast path) by the
    publisher's own methods: ``slots`` is the window, ``book.outstanding``
    records are sent and unsettled, ``backlog`` waits for a channel, ``closing`` says
    nothing may be handed over any more.
    """

    def __init__(
        self,
        connection: AsyncConnection,
        loop: asyncio.AbstractEventLoop,
        encoder: MessageEncoder,
        *,
        confirm: bool,
        window: int,
        republish: bool,
        nack_retry: NackRetry | None,
    ) -> None:
        self.connection = connection
        self.loop = loop
        self.encoder = encoder
        self.confirm = confirm
        # The records sent and unsettled, and what becomes of them.
        self.book = SentMessages(loop, self, republish=republish, nack_retry=nack_retry)
        self.channel: AsyncChannel | None = None
        # What the publisher uses of its channel (set with it), and of its connection.
        self.pipe: PublishPipe | None = None
        self.writes: WritePath = writes_of(connection)
        self.opening: asyncio.Task[AsyncChannel] | None = None
        # The channel number the frames are encoded for (retargeted when it differs).
        self.cid_bytes = b"\x00\x00"
        # The window of the async API (the sync twin brings its own).
        self.slots: SendWindow = SendWindow(window)
        # Records sent and unsettled (both APIs), and frames waiting for a channel.
        self.backlog: deque[Queued] = deque()
        self.blocked_reason = connection.blocked_reason
        self.unblocked = asyncio.Event()
        if self.blocked_reason is None:
            self.unblocked.set()
        self._block_hooks: list[Callable[[str | None], None]] = []
        # Told (loop thread) when the publisher closes or its connection ends.
        self._close_hooks: list[Callable[[], None]] = []
        self.closing: bool = False
        # Mirrors ``closing`` (the port of the publisher, set once it is built).
        self.closing_flag: ClosingFlag | None = None
        # Failed futures nobody looked at (the book's), reported when the publisher ends.
        self.ledger: UnobservedLedger = self.book.ledger
        # The connection's end, when that is what closed the publisher.
        self.closed_by: AMQPError | None = None
        # close() has given up waiting (or opening failed): nothing will use or close a
        # channel that finishes opening from now on, so it is closed on arrival.
        self.detached = False
        self.release_slot_cb = self.slots.release
        connection.add_blocked_callback(self._on_blocked)
        connection.add_close_callback(self._on_connection_closed)

    def mark_closing(self) -> None:
        """The publisher is closing: nothing may be handed over any more."""
        self.closing = True
        if self.closing_flag is not None:
            self.closing_flag.closing = True

    # ------------------------------------------------------------------ waiting (loop)

    async def acquire(self, deadline: float | None, timeout: float | None) -> None:
        """Wait until a message may be sent; reserves a window slot in confirm mode."""
        if self.closing:
            raise self.closed_state()
        reserved = False
        scope = asyncio.timeout_at(deadline)
        try:
            async with scope:
                while self.blocked_reason is not None:
                    await self.unblocked.wait()
                    if self.closing:
                        raise self.closed_state()
                if self.confirm:
                    slots = self.slots
                    if slots.reserved < slots.size and not slots.waiters:
                        slots.reserved += 1
                        reserved = True
                    else:
                        # A slot handed over as we are cancelled goes to the next waiter.
                        await slots.waiters.wait()
                        reserved = True
                if self.writes.paused:
                    await self.writes.wait_writable()
                await self.ensure_channel()
                if self.closing:
                    raise self.closed_state()
        except BaseException as exc:
            if reserved:
                self.slots.release()
            if isinstance(exc, TimeoutError) and scope.expired():
                what = (
                    f"connection blocked by the broker: {self.blocked_reason}"
                    if self.blocked_reason is not None
                    else f"no room in the window of {self.slots.size}"
                )
                raise PublishTimeout(f"could not publish within {timeout} s: {what}") from None
            raise

    def reserve_now(self) -> bool:
        """Reserve a window slot if a message can be sent at once (loop thread).

        True when the channel is open, nothing blocks publishing and the window has
        room; False reserves nothing (wait with :meth:`acquire` instead).
        """
        pipe = self.pipe
        slots = self.slots
        if (
            self.blocked_reason is None
            and not self.writes.paused
            and not self.closing
            and pipe is not None
            and pipe.protocol.state is _OPEN
            and slots.reserved < slots.size
            and not slots.waiters
        ):
            slots.reserved += 1
            return True
        return False

    async def ensure_channel(self) -> None:
        pipe = self.pipe
        if pipe is not None and pipe.protocol.state is _OPEN:
            return
        task = self.opening
        if task is None:
            task = self.opening = self.loop.create_task(self._open_channel())
            task.add_done_callback(_retrieve)
        await asyncio.shield(task)

    async def _open_channel(self) -> AsyncChannel:
        old, pipe = self.channel, self.pipe
        if old is not None and not old.is_closed and self.connection.state is State.RECOVERING:
            # The connection is recovering and brings this channel back (same number,
            # confirm mode, return callback): wait for it rather than open another.
            try:
                await self.connection.wait_recovered()
            except AMQPError:
                pass
            if pipe is not None and pipe.protocol.state is _OPEN:
                self.opening = None
                if self.backlog:
                    backlog, self.backlog = self.backlog, deque()
                    for item in backlog:
                        self.send_now(pipe, *item)
                    self.writes.kick()
                return old
        try:
            channel = await self.connection.channel()
            if self.confirm:
                await channel.confirm_select()
            channel.add_return_callback(self.book.on_return)
        except BaseException as exc:
            self.opening = None
            self._fail_backlog(exc)
            raise
        self.opening = None
        if self.detached:
            # close() is past waiting for confirms (it closed the channel it knew of):
            # adopting this one would leave it open forever.
            self._fail_backlog(InvalidStateError("the publisher is closed"), closing=True)
            if channel.is_open and self.connection.is_open:
                self.loop.create_task(channel.close()).add_done_callback(_retrieve)
            raise InvalidStateError("the publisher is closed")
        self.channel = channel
        pipe = self.pipe = pipe_of(channel)
        # The broker's limits are known now that the connection is open.
        self.encoder.use_channel(
            channel.channel_id, self.connection.frame_max, self.connection.max_message_size
        )
        self.cid_bytes = channel.channel_id.to_bytes(2, "big")
        if self.backlog:
            # Also while closing: publish() accepted these messages and close() waits for
            # their confirms (then closes this channel); only _detach fails what is left.
            backlog, self.backlog = self.backlog, deque()
            for item in backlog:
                self.send_now(pipe, *item)
            self.writes.kick()
        return channel

    # ------------------------------------------------------------------ sending (loop)

    def send(
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
        pipe = self.pipe
        if self.closing:
            if future is not None:
                self.ledger.fail(future, self._closed_error())
            if release is not None:
                release()
            return
        if pipe is None or pipe.protocol.state is not _OPEN or self.backlog:
            self.backlog.append((frames, future, message_id, mandatory, deadline, release))
            self._reopen_soon()
            return
        self.send_now(pipe, frames, future, message_id, mandatory, deadline, release)
        self.writes.kick()

    def send_reserved(
        self,
        frames: list[bytes],
        waiter: Settleable,
        message_id: str | None,
        mandatory: bool,
    ) -> None:
        """Queue one message whose window slot is reserved, without a flush when the
        channel is ready: the caller flushes (``kick`` of the port) after a run of them.
        The slot is freed when the message is settled (loop thread)."""
        pipe = self.pipe
        if (
            pipe is not None
            and pipe.protocol.state is _OPEN
            and not self.backlog
            and not self.closing
        ):
            self.send_now(pipe, frames, waiter, message_id, mandatory, None, self.release_slot_cb)
        else:
            self.send(frames, waiter, message_id, mandatory, None, self.release_slot_cb)

    def send_batch(
        self,
        items: list[Encoded],
        batch: Batch,
        start: int,
        deadline: float | None,
        release: Callable[[], None] | None,
    ) -> None:
        """Queue a chunk of a batch and write it with one flush (loop thread)."""
        pipe = self.pipe
        direct = not (
            self.closing or pipe is None or pipe.protocol.state is not _OPEN or self.backlog
        )
        index = start
        for frames, message_id, mandatory in items:
            slot = Slot(batch, index)
            if direct:
                assert pipe is not None
                self.send_now(pipe, frames, slot, message_id, mandatory, None, release)
            else:
                self.send(frames, slot, message_id, mandatory, None, release)
            index += 1
        if deadline is not None and batch.timer is None and batch.remaining:
            batch.timer = self.loop.call_at(deadline, batch.expire)
        if direct:
            self.writes.flush()

    def send_now(
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
        if frames[0][1:3] != self.cid_bytes:
            frames = retarget(frames, proto.channel_id)
        record: Pending | None = None
        if proto.confirm_mode:
            assert future is not None
            record = Pending(self.book, future, frames, message_id, release)
        try:
            # In confirm mode the channel's confirm table now holds the record: it
            # settles it, or fails it if the channel ends first.
            seq = proto.send_publish(frames, record)
        except AMQPError as exc:
            if future is not None:
                self.ledger.fail(future, exc)
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
        book = self.book
        book.outstanding += 1
        if mandatory and message_id is not None:
            record.returnable = True
            same = book.returnable.get(message_id)
            if same is None:
                book.returnable[message_id] = [record]
            else:
                same.append(record)
        if deadline is not None:
            record.timer = self.loop.call_at(deadline, record.expire)

    def _reopen_soon(self) -> None:
        if self.opening is None:
            task = self.opening = self.loop.create_task(self._open_channel())
            task.add_done_callback(_retrieve)

    def _fail_backlog(self, exc: BaseException, *, closing: bool = False) -> None:
        """Fail the messages that waited for a channel; they were never sent.

        They get :class:`PublishOutcomeUnknown` caused by ``exc`` (like every message
        lost with its channel), or ``exc`` itself when the publisher is closing.
        """
        backlog, self.backlog = self.backlog, deque()
        for _frames, future, _message_id, _mandatory, _deadline, release in backlog:
            if future is not None and not future.done():
                if closing:
                    error: BaseException = copy.copy(exc)
                else:
                    error = PublishOutcomeUnknown(
                        0, f"not sent: no channel could be opened ({exc!r})"
                    )
                    error.__cause__ = exc
                self.ledger.fail(future, error)
            if release is not None:
                release()
        self.book.check_idle()

    # ------------------------------------------------------------------ events (loop)

    def _on_blocked(self, reason: str | None) -> None:
        self.blocked_reason = reason
        if reason is None:
            self.unblocked.set()
        else:
            self.unblocked.clear()
        for hook in list(self._block_hooks):
            hook(reason)

    def add_block_hook(self, hook: Callable[[str | None], None]) -> None:
        """Call ``hook(reason)`` now and on every block change (loop thread)."""
        self._block_hooks.append(hook)
        hook(self.blocked_reason)

    def _closed_error(self) -> AMQPError:
        """What a message handed over after the close fails with: the connection's end
        when that closed the publisher, else :class:`InvalidStateError`."""
        if self.closed_by is not None:
            return copy.copy(self.closed_by)
        return InvalidStateError("the publisher is closed")

    def closed_state(self) -> InvalidStateError:
        """The error of a call made on the closed publisher (chained to the connection's
        end when that closed it)."""
        error = InvalidStateError("the publisher is closed")
        error.__cause__ = self.closed_by
        return error

    def add_close_hook(self, hook: Callable[[], None]) -> None:
        """Call ``hook()`` once the publisher is closed (loop thread; now if it is)."""
        if self.closing:
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
        if self.closing:
            self._run_close_hooks()
            return
        # The connection is gone for good (recovery, if any, has given up): the
        # publisher is closed with it, and whatever is handed over later fails at once.
        self.mark_closing()
        self.closed_by = exc
        error = InvalidStateError("the connection is closed")
        error.__cause__ = exc
        self.slots.waiters.fail_all(error)
        self._run_close_hooks()

    def detach(self) -> None:
        """Stop listening to the connection and release everyone waiting (closing)."""
        self.mark_closing()
        self.detached = True
        remove_callback(self.connection, self._on_blocked)
        remove_callback(self.connection, self._on_connection_closed)
        self.unblocked.set()
        self.slots.waiters.fail_all(InvalidStateError("the publisher is closed"))
        self._fail_backlog(InvalidStateError("the publisher is closed"), closing=True)
        self._run_close_hooks()


def _retrieve(task: asyncio.Task[Any]) -> None:
    """Mark a background task's exception as seen (its waiters got it already)."""
    if not task.cancelled():
        task.exception()
