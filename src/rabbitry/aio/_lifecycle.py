"""AsyncChannel's confirm settling, failure of pending work, suspension and close.

:class:`ChannelLifecycle` is a base of :class:`~rabbitry.aio.channel.AsyncChannel`:
what happens to a channel's waiters when the broker confirms, when the connection
drops and recovery suspends and resumes the channel, and when the channel ends.
"""

from __future__ import annotations

import copy
import logging
from collections import deque
from typing import TYPE_CHECKING, Any, Protocol

from ..exceptions import (
    AMQPError,
    ChannelClosedByBroker,
    ChannelClosedByClient,
    ConnectionLost,
    Nacked,
    PublishOutcomeUnknown,
    PublishRefused,
)
from ..protocol import spec
from ..protocol._refusal import PublishSummary, is_publish_refusal, refused_index, summarize
from ..protocol.channel import ChannelProtocol, ChannelState

if TYPE_CHECKING:
    import asyncio
    from collections.abc import Callable, Mapping

    from ..protocol.frames import Method
    from ..protocol.publish import ConfirmTracker
    from ._consumers import _Connection, _Consumer

__all__ = ["ChannelLifecycle", "Settleable"]

logger = logging.getLogger("rabbitry.channel")


class Settleable(Protocol):
    """What confirms settle: an asyncio or a concurrent.futures future."""

    def done(self) -> bool: ...

    def set_result(self, result: None, /) -> None: ...

    def set_exception(self, exception: BaseException, /) -> None: ...


class ChannelLifecycle:
    """Confirms, suspension, recovery and close of :class:`~rabbitry.aio.channel.AsyncChannel`."""

    channel_id: int
    epoch: int
    close_exc: AMQPError | None
    republished: int
    _conn: _Connection
    _proto: ChannelProtocol
    _loop: asyncio.AbstractEventLoop
    _rpcs: deque[tuple[asyncio.Future[Any], Callable[[Any], None] | None]]
    _consumers: dict[str, _Consumer]
    _confirms: ConfirmTracker[Settleable]
    _heads: dict[int, tuple[bytes, bytes]]
    _settled_waiters: list[asyncio.Future[None]]
    _closed: asyncio.Future[AMQPError]
    _qos: tuple[int, int, bool] | None
    _suspended: bool
    _tag_offset: int
    _max_tag: int
    _lost_reason: AMQPError | None
    _internal: bool
    _resend: list[Settleable]

    if TYPE_CHECKING:

        def _register_rpc(self, hook: Callable[[Any], None] | None) -> asyncio.Future[Any]: ...

        async def _await_rpc(
            self, name: str, timeout: float | None, future: asyncio.Future[Any] | None = None
        ) -> Any: ...

        def _drop_consumer(self, tag: str) -> _Consumer | None: ...

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
        """Recovery: adopt the re-opened channel; replay QoS and confirm/tx modes.

        The modes are requested at once, queued behind channel.open, before the first
        await: the protocol is open as soon as channel.open-ok is read, and a publisher
        sending then (before this coroutine runs again) must find confirm mode (or the
        transaction) already selected, or its messages would go out unconfirmed. This
        also puts the modes on the new protocol before anything can fail, so a later
        attempt, if this one fails, reads them from it.
        """
        confirm = self._proto.confirm_mode
        transactional = self._proto.transactional
        self._proto = protocol
        replies = [("channel.open", self._register_rpc(None))]  # queued by the protocol
        modes: list[Method] = []
        if self._qos is not None:
            count, size, global_ = self._qos
            modes.append(spec.BasicQos(prefetch_size=size, prefetch_count=count, global_=global_))
        if confirm:
            modes.append(spec.ConfirmSelect())
        if transactional:
            modes.append(spec.TxSelect())
        for method in modes:
            protocol.send_method(method)
            replies.append((method.NAME, self._register_rpc(None)))
        for _, reply in replies:
            # If one fails, the connection failed them all; the first one is raised.
            reply.add_done_callback(_seen)
        # Still suspended until every reply is in: the application's requests wait.
        for name, reply in replies:
            await self._await_rpc(name, 30.0, reply)
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


def _seen(future: asyncio.Future[Any]) -> None:
    """Mark a reply's failure as retrieved (another reply's failure reports it)."""
    if not future.cancelled():
        future.exception()


def _settle(future: Settleable, tag: int, ack: bool) -> None:
    """Settle a publish with the broker's confirm of ``tag`` (unless it is settled)."""
    if future.done():
        return
    if ack:
        future.set_result(None)
    else:
        future.set_exception(Nacked(tag))
