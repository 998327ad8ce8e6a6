"""AsyncChannel's events, confirm settling, failure of pending work, suspension and close.

:class:`ChannelLifecycle` is a base of :class:`~rabbitry.aio.channel.AsyncChannel`:
what happens to a channel's waiters when the broker answers, returns or confirms, when
the connection drops and recovery suspends and resumes the channel, and when the channel
ends. :class:`ChannelHooks` is how the connection and its recovery drive a channel.
"""

from __future__ import annotations

import copy
import logging
from collections import deque
from dataclasses import dataclass
from functools import cached_property
from typing import TYPE_CHECKING, Any, Generic, TypeVar

from .._failure_log import RateLimitedLog
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
from ..publishing.pipe import Settleable

if TYPE_CHECKING:
    import asyncio
    from collections.abc import Awaitable, Callable, Mapping

    from .._waiters import Waiters
    from ..protocol.frames import Method
    from ..protocol.message import Message
    from ..protocol.publish import ConfirmTracker
    from ..protocol.tags import DeliveryTags
    from ..publishing.pipe import PublishPipe
    from ._consumers import Connection, Consumer

__all__ = ["ChannelHooks", "ChannelLifecycle", "Settleable"]

logger = logging.getLogger("rabbitry.channel")

C = TypeVar("C")


@dataclass(frozen=True, slots=True, kw_only=True)
class ChannelHooks(Generic[C]):
    """How the connection drives one channel: for the library's own use.

    Each :class:`~rabbitry.aio.channel.AsyncChannel` builds one from its own methods
    when it is created (:func:`~rabbitry.aio.channel.create_channel`), and its connection
    keeps it, by channel number, as long as the channel is open. The connection's event
    dispatch calls the ``on_*`` members once per event of the channel: they are the
    channel's bound methods, so the delivery and confirm paths gain no call. The
    connection and its recovery call the rest.
    """

    #: The channel these hooks drive.
    channel: C
    #: A delivery for one of the channel's consumers.
    on_delivery: Callable[[Message], None]
    #: basic.ack / basic.nack from the broker: ``(delivery_tag, multiple, ack)``.
    on_confirm: Callable[[int, bool, bool], None]
    #: The reply to the channel's oldest request, with its content if it has one.
    on_rpc_reply: Callable[[Method, Message | None], None]
    #: basic.return of an unroutable mandatory publish.
    on_return: Callable[[Message], None]
    #: basic.cancel from the broker, with the consumer tag.
    on_consumer_cancelled: Callable[[str], None]
    #: channel.flow from the broker: whether publishing may go on.
    on_flow: Callable[[bool], None]
    #: The connection dropped and will be recovered: keep the channel, fail its
    #: pending requests (recovery's own channels close instead).
    suspend: Callable[[AMQPError], None]
    #: The channel ended with this reason (idempotent).
    on_closed: Callable[[AMQPError], None]
    #: Wait for channel.open-ok, right after the connection created the channel.
    wait_open: Callable[[float | None], Awaitable[Any]]
    #: Recovery: adopt the channel re-opened on the new connection, replay QoS and modes.
    resume: Callable[[ChannelProtocol], Awaitable[None]]
    #: Recovery: the basic.consume of every live consumer, in subscription order.
    consumer_specs: Callable[[], list[spec.BasicConsume]]
    #: Recovery: subscribe one consumer again, following renamed queues (``old: new``).
    resubscribe_one: Callable[[spec.BasicConsume, Mapping[str, str]], Awaitable[None]]
    #: Recovery: this consumer could not be restored; end it through its cancel path.
    lose_consumer: Callable[[str, AMQPError], None]
    #: Recovery: the channel could not be restored; close it for good with the cause.
    mark_lost: Callable[[AMQPError], None]
    #: Recovery: send the kept unconfirmed publishes again; returns how many.
    republish: Callable[[], int]
    #: Whether the channel waits for the broker: a request's reply, or confirms.
    awaits_reply: Callable[[], bool]


class ChannelLifecycle:
    """Events, confirms, suspension, recovery and close of
    :class:`~rabbitry.aio.channel.AsyncChannel`."""

    channel_id: int
    close_exc: AMQPError | None
    republished: int
    _conn: Connection
    _proto: ChannelProtocol
    _loop: asyncio.AbstractEventLoop
    _rpcs: deque[tuple[asyncio.Future[Any], Callable[[Any], None] | None]]
    _return_callbacks: list[Callable[[Message], Any]]
    _consumers: dict[str, Consumer]
    _confirms: ConfirmTracker[Settleable]
    _heads: dict[int, tuple[bytes, bytes]]
    _settled_waiters: Waiters[None]
    _closed: asyncio.Future[AMQPError]
    _qos: tuple[int, int, bool] | None
    _suspended: bool
    _tags: DeliveryTags
    _lost_reason: AMQPError | None
    _internal: bool
    _forget: Callable[[int], object]
    _resend: list[Settleable]
    _pipe: PublishPipe

    if TYPE_CHECKING:

        def _register_rpc(self, hook: Callable[[Any], None] | None) -> asyncio.Future[Any]: ...

        async def _await_rpc(
            self, name: str, timeout: float | None, future: asyncio.Future[Any] | None = None
        ) -> Any: ...

        def _drop_consumer(self, tag: str) -> Consumer | None: ...

        def basic_ack(self, delivery_tag: int = 0, multiple: bool = False) -> None: ...

        def basic_nack(
            self, delivery_tag: int = 0, multiple: bool = False, requeue: bool = True
        ) -> None: ...

        def basic_reject(self, delivery_tag: int, requeue: bool = True) -> None: ...

    def _on_rpc_reply(self, method: Method, message: Message | None) -> None:
        if not self._rpcs:
            logger.warning("channel %s: reply %s with no request", self.channel_id, method.NAME)
            return
        future, hook = self._rpcs.popleft()
        if message is not None:
            # basic.get-ok: the delivery belongs to the connection it arrived on, so it
            # gets that connection's epoch and tag numbering now; the connection may end
            # (and a new epoch start) before the caller runs again.
            self._tags.stamp(message, self)
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
            except Exception as exc:
                self._return_errors.log(
                    "raised", "return callback %r failed", callback, exc_info=exc
                )

    @cached_property
    def _return_errors(self) -> RateLimitedLog:
        """Return callbacks that raise: ERROR, rate-limited with counts."""
        return RateLimitedLog(logger, f"channel {self.channel_id}", "return callback failures")

    def _on_flow(self, active: bool) -> None:
        logger.info("channel %s: broker flow %s", self.channel_id, "on" if active else "off")

    def _on_confirm(self, tag: int, multiple: bool, ack: bool) -> None:
        if self._confirms.confirm(tag, multiple, ack):  # settles through settle
            # Nothing is unconfirmed: the heads kept for unconfirmed publishes (pruned
            # every _HEADS_PRUNE publishes otherwise) are all stale.
            if self._heads:
                self._heads = {}
            if self._settled_waiters:
                self._notify_settled()

    def _notify_settled(self) -> None:
        """The confirm table is empty (every publish settled, or failed with the channel)."""
        self._settled_waiters.wake_all(None)

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
            confirms.update((-i - 1, waiter) for i, waiter in enumerate(self._resend))
            self._resend.clear()  # in place: the pipe shares the list
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
        self._tags.new_epoch()  # every tag handed out so far died with the connection
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
        self._proto = self._pipe.protocol = protocol
        protocol.use_confirms(self._confirms)
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
        resend = self._resend.copy()
        self._resend.clear()  # in place: the pipe shares the list
        sent = 0
        for record in resend:
            if record.done():
                continue
            # Registered in the confirm table under its new sequence number.
            record.seq = self._proto.send_publish(record.frames, record)  # type: ignore[attr-defined]
            sent += 1
        if sent:
            self.republished += sent
            self._pipe.kick()
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
        self._forget(self.channel_id)
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


def settle(future: Settleable, tag: int, ack: bool) -> None:
    """Settle a publish with the broker's confirm of ``tag`` (unless it is settled)."""
    if future.done():
        return
    if ack:
        future.set_result(None)
    else:
        future.set_exception(Nacked(tag))
