"""The interface between a channel and the code that publishes on it.

Two objects, both built by the engine (:mod:`rabbitry.aio`) and used by the publishing
code: ``AsyncChannel.basic_publish`` itself, the sync channel's ``basic_publish``,
:class:`~rabbitry.publisher.AsyncPublisher` (and through it the sync publisher and the
outbox publisher), and the channel pool.

* :class:`WritePath`, one per connection: writing the queued frames, the transport's
  back-pressure (publishers wait while its write buffer is above its high-water mark)
  and the wait for a recovering connection.
* :class:`PublishPipe`, one per channel: the channel's protocol object, its confirm
  table and the publishes kept for a resend after recovery, plus the connection's
  :class:`WritePath`.

Their data members are plain attributes and their callables bound methods, so a
publish that goes through them costs the same function calls as one that reached into
the connection and the channel directly. Everything here runs on the event loop's
thread.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Protocol

from .._support.waiters import Waiters
from ..exceptions import AMQPError
from ..protocol.channel import ChannelState

if TYPE_CHECKING:
    from collections.abc import Awaitable, Callable

    from ..protocol.channel import ChannelProtocol
    from ..protocol.publish import ConfirmTracker

__all__ = ["PublishPipe", "Settleable", "WritePath"]

_OPEN = ChannelState.OPEN


class Settleable(Protocol):
    """What confirms settle: an asyncio or a concurrent.futures future, or a record
    that stands for one (the publisher's)."""

    def done(self) -> bool:
        """Whether it is settled already (a settled waiter is never settled again).

        Returns:
            ``True`` once settled.
        """
        ...

    def set_result(self, result: None, /) -> None:
        """Settle it as a success (the broker's ack, or queued when not confirming).

        Args:
            result: always ``None``.
        """
        ...

    def set_exception(self, exception: BaseException, /) -> None:
        """Settle it as a failure.

        Args:
            exception: why (a nack, the channel's end, a refusal).
        """
        ...


class _FailPending(Protocol):
    def __call__(self, exc: AMQPError, *, keep_resendable: bool = False) -> None: ...


class WritePath:
    """The write side of one connection, shared by its channels and their publishers.

    The connection builds it with its own write functions and hands it to every
    channel it opens (:attr:`PublishPipe.writes`); the publisher and the thread-safe
    facade get it with :func:`rabbitry.aio.connection.writes_of`.

    Contract:

    * :attr:`kick` and :attr:`flush` never wait and never drop frames: what is queued
      is written, at once or at the end of the loop pass, paused or not (the
      transport buffers it). A pause only asks publishers to stop queuing more.
    * :attr:`paused` is set by the connection while the transport's write buffer is
      above its high-water mark; :meth:`resume` clears it when the buffer drains
      below the low-water mark or the transport goes away, and releases whoever waits
      (:meth:`wait_writable`, :meth:`defer`). When the connection discards a
      transport without a loss event (a connection attempt it abandons), it clears
      :attr:`paused` itself, so that later calls do not wait for a drain that cannot
      come.
    * :attr:`await_recovery` is what an operation calls when its channel is
      suspended by a recovery: it waits for the connection to be open again or fails
      at once, as the connection's recovery policy says.

    Args:
        kick: writes the queued frames now, or once at the end of this loop pass (a
            burst of publishes is one write); see ``AsyncConnection`` for the rules.
        flush: writes the queued frames now.
        await_recovery: ``await_recovery(timeout, what)`` waits (at most ``timeout``
            seconds) while the connection recovers, or raises ``ConnectionRecovering``
            naming ``what`` when the policy says to fail.
    """

    __slots__ = ("_hooks", "_waiters", "await_recovery", "flush", "kick", "paused")

    def __init__(
        self,
        kick: Callable[[], None],
        flush: Callable[[], None],
        await_recovery: Callable[[float | None, str], Awaitable[None]],
    ) -> None:
        #: Write the queued frames now, or at the end of this loop pass.
        self.kick = kick
        #: Write the queued frames now.
        self.flush = flush
        #: ``await await_recovery(timeout, what)``: wait out (or refuse) a recovery.
        self.await_recovery = await_recovery
        #: The transport's write buffer is above its high-water mark: wait before queuing.
        self.paused = False
        self._waiters: Waiters[None] = Waiters()
        self._hooks: list[Callable[[], None]] = []

    async def wait_writable(self) -> None:
        """Return once writes are not paused (at once when they are not).

        Cancelling the wait leaves nothing behind.
        """
        while self.paused:
            await self._waiters.wait()

    def defer(self, hook: Callable[[], None]) -> bool:
        """Call ``hook()`` at the next :meth:`resume` if writes are paused now.

        The thread-safe facade's write gate: its hand-off queue stops draining while
        the transport is full and starts again from the hook.

        Args:
            hook: called once, on the loop, when writes resume.

        Returns:
            ``True`` when writes are paused and ``hook`` was registered; ``False`` when
            they are not (``hook`` is not kept).
        """
        if self.paused:
            self._hooks.append(hook)
            return True
        return False

    def resume(self) -> None:
        """Writes may go on: clear :attr:`paused`, run the hooks, wake the waiters.

        Called by the connection when the transport drains, and when it goes away
        (the waiters then meet the closed or recovering connection).
        """
        self.paused = False
        hooks, self._hooks = self._hooks, []
        for hook in hooks:
            hook()
        self._waiters.wake_all(None)


class PublishPipe:
    """What publishing code uses of one channel: its protocol object, its confirm
    table and its connection's write path.

    The channel (:class:`rabbitry.aio.channel.AsyncChannel`) builds it and keeps it
    current; get it with :func:`rabbitry.aio.channel.pipe_of`. Its users are the
    channel's own ``basic_publish``, the thread-safe channel (which encodes in the
    calling thread and hands the frames to :meth:`publish` on the loop), the
    publisher (which sends on :attr:`protocol` and puts its own records in
    :attr:`confirms`), and the channel pool (which waits for a returned channel's
    confirms with :meth:`wait_settled`). Applications use the channel's methods.

    Contract, on the loop thread:

    * :attr:`protocol` is the channel's current sans-IO object: recovery gives the
      channel a new one and the channel sets it here before anything can use it.
      Sending on it queues frames; :attr:`kick` writes them.
    * A waiter put in :attr:`confirms` under the sequence number ``send_publish``
      returned is settled exactly once: ``set_result(None)`` on the broker's ack,
      ``set_exception`` with :class:`~rabbitry.Nacked` on a nack, and, when the
      channel ends first, with :class:`~rabbitry.PublishRefused` (the broker refused
      that publish) or :class:`~rabbitry.PublishOutcomeUnknown`. A waiter whose
      ``resend_on_recovery`` is true is kept instead while the connection recovers
      (see :meth:`unsettled`) and sent again once it has: its ``frames`` are sent and
      its ``seq`` set to the new sequence number.
    * Nothing here raises into the loop for a closed channel: :meth:`publish` fails
      the waiter, and :meth:`wait_settled` returns.

    Args:
        protocol: the channel's protocol object.
        confirms: the channel's confirm table.
        writes: the connection's write path.
        resend: the channel's list of publishes kept for a resend after recovery (the
            channel changes it in place, so the pipe always sees the current one).
        keep_head: ``keep_head(seq, frames)`` remembers the head of a confirm-mode
            publish whose waiter does not keep its frames, so that a refusal by the
            broker can be matched to it.
        settled: the channel's waiters told when its confirm table becomes empty.
        fail_pending: ``fail_pending(exc, keep_resendable=...)`` fails the channel's
            waiting requests and unconfirmed publishes.
    """

    __slots__ = (
        "_fail_pending",
        "_keep_head",
        "_resend",
        "_settled",
        "await_recovery",
        "confirms",
        "flush",
        "kick",
        "protocol",
        "writes",
    )

    def __init__(
        self,
        protocol: ChannelProtocol,
        confirms: ConfirmTracker[Settleable],
        writes: WritePath,
        resend: list[Settleable],
        keep_head: Callable[[int, list[bytes]], None],
        settled: Waiters[None],
        fail_pending: _FailPending,
    ) -> None:
        #: The channel's current protocol object (replaced when recovery re-opens it).
        self.protocol = protocol
        #: Unconfirmed publishes by sequence number; the channel settles them.
        self.confirms = confirms
        #: The connection's write path.
        self.writes = writes
        #: ``writes.kick``, ``writes.flush`` and ``writes.await_recovery``, one lookup
        #: closer.
        self.kick = writes.kick
        self.flush = writes.flush
        self.await_recovery = writes.await_recovery
        self._resend = resend
        self._keep_head = keep_head
        self._settled = settled
        self._fail_pending = fail_pending

    def publish(self, frames: list[bytes], waiter: Settleable | None) -> None:
        """Queue the encoded frames of one publish and write them (see :attr:`kick`).

        The thread-safe channel's hot path: it encodes in the calling thread and
        submits this call to the loop.

        Args:
            frames: one message's frames, addressed to this channel (as
                ``protocol.encode_publish`` returns them).
            waiter: settled by the broker's confirm in confirm mode (see the class
                docstring), resolved with ``None`` at once otherwise; ``None`` when the
                caller wants no outcome.

        Nothing is raised: when the channel is closed (or closing) nothing is sent
        and ``waiter`` fails with the error sending raised.
        """
        try:
            seq = self.protocol.send_publish(frames, waiter)  # registers it in confirm mode
        except AMQPError as exc:
            if waiter is not None:
                waiter.set_exception(exc)
            return
        self.kick()
        if waiter is None:
            return
        if seq:
            self._keep_head(seq, frames)
        else:
            waiter.set_result(None)

    def unsettled(self) -> list[Settleable]:
        """The publishes not confirmed yet, oldest first.

        Returns:
            The waiters kept for a resend after recovery (the connection is
            recovering), then those in the confirm table. A waiter may already be done
            (its owner gave up on it); its entry stays until the broker confirms it.
        """
        waiters = list(self._resend)
        waiters.extend(waiter for _, waiter in self.confirms)
        return waiters

    async def wait_settled(self) -> None:
        """Return once the confirm table is empty or the channel is no longer open.

        Every publish in it is then acked, nacked or failed with the channel. It waits
        for the table to empty, not for its waiters: one may be done already while
        its entry stays until the broker confirms it.
        """
        while self.confirms and self.protocol.state is _OPEN:
            await self._settled.wait()

    def fail_pending(self, exc: AMQPError, *, keep_resendable: bool = False) -> None:
        """Fail the channel's waiting requests and unconfirmed publishes with ``exc``.

        The publishes get :class:`~rabbitry.PublishOutcomeUnknown` (or
        :class:`~rabbitry.PublishRefused`) caused by ``exc``; the channel stays as it is.

        Args:
            exc: why they fail.
            keep_resendable: keep the publishes whose waiter asks for a resend after
                recovery (the connection is closing and may recover).
        """
        self._fail_pending(exc, keep_resendable=keep_resendable)
