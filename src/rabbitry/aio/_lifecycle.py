"""How the connection drives a channel: its events, suspension, recovery and end.

:class:`ChannelEvents` is what the connection and its recovery call on one channel;
:class:`ChannelDriver` implements it for :class:`~rabbitry.aio.channel.AsyncChannel`,
which creates one and hands it to its connection (``create_channel``).
"""

from __future__ import annotations

import logging
from functools import cached_property
from typing import TYPE_CHECKING, Any, Generic, Protocol, TypeVar

from .._support.failure_log import RateLimitedLog
from ..exceptions import AMQPError, ChannelClosedByClient
from ..protocol import spec
from ..protocol.channel import ChannelState
from ..publishing.pipe import PublishPipe

if TYPE_CHECKING:
    import asyncio
    from collections.abc import Callable, Mapping

    from ..protocol.channel import ChannelProtocol
    from ..protocol.frames import Method
    from ..protocol.message import Message
    from ..publishing.pipe import WritePath
    from ._confirm_book import ConfirmBook
    from ._consumers import ConsumerRegistry
    from ._link import ChannelLink
    from ._requests import Requests

__all__ = ["ChannelDriver", "ChannelEvents", "ChannelOutcomes"]

logger = logging.getLogger("rabbitry.channel")

C_co = TypeVar("C_co", covariant=True)


class ChannelEvents(Protocol[C_co]):
    """How the connection drives one channel: for the library's own use.

    The connection keeps one per channel, by channel number, as long as the channel is
    open (or suspended). Its event dispatch calls the ``on_*`` members once per event
    of the channel; the connection and its recovery call the rest.
    """

    @property
    def channel(self) -> C_co:
        """The channel driven."""
        ...

    def on_delivery(self, message: Message) -> None:
        """A delivery for one of the channel's consumers."""

    def on_confirm(self, tag: int, multiple: bool, ack: bool) -> None:
        """basic.ack / basic.nack from the broker."""

    def on_rpc_reply(self, method: Method, message: Message | None) -> None:
        """The reply to the channel's oldest request, with its content if it has one."""

    def on_return(self, message: Message) -> None:
        """basic.return of an unroutable mandatory publish."""

    def on_consumer_cancelled(self, tag: str) -> None:
        """basic.cancel from the broker, with the consumer tag."""

    def on_flow(self, active: bool) -> None:
        """channel.flow from the broker: whether publishing may go on."""

    def suspend(self, exc: AMQPError) -> None:
        """The connection dropped and will be recovered: keep the channel, fail its
        pending requests (recovery's own channels close instead)."""

    def on_closed(self, exc: AMQPError) -> None:
        """The channel ended with this reason (idempotent)."""

    async def wait_open(self, timeout: float | None) -> Any:
        """Wait for channel.open-ok, right after the connection created the channel."""

    async def resume(self, protocol: ChannelProtocol) -> None:
        """Recovery: adopt the channel re-opened on the new connection, replay QoS and
        modes."""

    def consumer_specs(self) -> list[spec.BasicConsume]:
        """Recovery: the basic.consume of every live consumer, in subscription order."""
        ...

    async def resubscribe_one(self, method: spec.BasicConsume, renamed: Mapping[str, str]) -> None:
        """Recovery: subscribe one consumer again, following renamed queues."""

    def lose_consumer(self, tag: str, exc: AMQPError) -> None:
        """Recovery: this consumer could not be restored; end it through its cancel path."""

    def mark_lost(self, exc: AMQPError) -> None:
        """Recovery: the channel could not be restored; close it for good with the cause."""

    def republish(self) -> int:
        """Recovery: send the kept unconfirmed publishes again; returns how many."""
        ...

    def awaits_reply(self) -> bool:
        """Whether the channel waits for the broker: a request's reply, or confirms."""
        ...


class ChannelOutcomes(Protocol):
    """The public attributes of a channel its driver keeps current."""

    close_exc: AMQPError | None
    republished: int


C = TypeVar("C", bound=ChannelOutcomes)


class ChannelDriver(Generic[C]):
    """Drives one channel through the connection's events: settles and answers them,
    suspends and resumes the channel around a recovery, and ends it.

    The delivery, confirm and reply entry points are the consumer registry's, the
    confirm book's and the requests' own methods, so those paths gain no call.

    Args:
        channel: the channel driven.
        link: the channel's shared state.
        requests: the channel's requests.
        book: the channel's confirm book.
        consumers: the channel's consumers.
        writes: the connection's write path.
        internal: a channel of recovery itself (closed, not suspended, on a drop).
        forget: told the channel number when the channel ends.
    """

    def __init__(
        self,
        channel: C,
        link: ChannelLink,
        requests: Requests,
        book: ConfirmBook,
        consumers: ConsumerRegistry,
        writes: WritePath,
        *,
        internal: bool,
        forget: Callable[[int], object],
    ) -> None:
        self.channel = channel
        self._link = link
        self._requests = requests
        self._book = book
        self._consumers = consumers
        self._internal = internal
        self._forget = forget
        #: Called with each basic.return.
        self.return_callbacks: list[Callable[[Message], Any]] = []
        self.on_delivery = consumers.on_delivery
        self.on_confirm = book.on_confirm
        self.on_rpc_reply = requests.on_reply
        self.consumer_specs = consumers.specs
        self.resubscribe_one = consumers.resubscribe_one
        self.lose_consumer = consumers.lose
        self.on_consumer_cancelled = consumers.on_cancelled
        #: What publishing code uses of the channel (see ``pipe_of``).
        self.pipe = PublishPipe(
            link.protocol,
            book.tracker,
            writes,
            book.resend,
            book.keep_head,
            book.settled,
            self.fail_pending,
        )

    def on_return(self, message: Message) -> None:
        """basic.return of an unroutable mandatory publish: to the return callbacks.

        Args:
            message: the returned message.
        """
        if not self.return_callbacks:
            logger.warning(
                "channel %s: message returned (%s %s) and no return callback: exchange=%r "
                "routing_key=%r",
                self._link.channel_id,
                message.reply_code,
                message.reply_text,
                message.exchange,
                message.routing_key,
            )
        for callback in list(self.return_callbacks):
            try:
                callback(message)
            except Exception as exc:
                self._return_errors.log(
                    "raised", "return callback %r failed", callback, exc_info=exc
                )

    @cached_property
    def _return_errors(self) -> RateLimitedLog:
        """Return callbacks that raise: ERROR, rate-limited with counts."""
        return RateLimitedLog(
            logger, f"channel {self._link.channel_id}", "return callback failures"
        )

    def on_flow(self, active: bool) -> None:
        """channel.flow from the broker (logged; the protocol keeps the state).

        Args:
            active: publishing may go on.
        """
        logger.info("channel %s: broker flow %s", self._link.channel_id, "on" if active else "off")

    def awaits_reply(self) -> bool:
        """Whether the channel waits for the broker.

        Returns:
            A request awaits its reply, or a publish its confirm.
        """
        return bool(self._requests) or bool(self._book.tracker)

    async def wait_open(self, timeout: float | None) -> Any:
        """Wait for channel.open-ok, right after the connection created the channel.

        Args:
            timeout: seconds to wait (``None``: no limit).

        Returns:
            The broker's open-ok.
        """
        return await self._requests.wait(spec.ChannelOpen.NAME, timeout)

    def fail_pending(self, exc: AMQPError, *, keep_resendable: bool = False) -> None:
        """Fail waiting requests and unconfirmed publishes with ``exc``.

        Args:
            exc: why.
            keep_resendable: the connection is recovering: unconfirmed publishes whose
                owner asked for it (``resend_on_recovery``) are kept for
                :meth:`republish`.
        """
        self._requests.fail_all(exc)
        self._book.fail(exc, keep_resendable=keep_resendable)

    def suspend(self, exc: AMQPError) -> None:
        """The connection died and is recovering: keep the channel, fail what was pending.

        Consumers stay registered (recovery subscribes them again); a new epoch starts
        so that acks for the deliveries received so far are not sent on the new channel.

        Args:
            exc: why the connection dropped.
        """
        link = self._link
        if link.closed.done():
            return
        if self._internal:
            self.on_closed(exc)  # recovery's own channel: the next attempt opens another
            return
        link.suspended = True
        link.tags.new_epoch()  # every tag handed out so far died with the connection
        self.fail_pending(exc, keep_resendable=True)

    async def resume(self, protocol: ChannelProtocol) -> None:
        """Recovery: adopt the re-opened channel; replay QoS and confirm/tx modes.

        The modes are requested at once, queued behind channel.open, before the first
        await: the protocol is open as soon as channel.open-ok is read, and a publisher
        sending then (before this coroutine runs again) must find confirm mode (or the
        transaction) already selected, or its messages would go out unconfirmed. This
        also puts the modes on the new protocol before anything can fail, so a later
        attempt, if this one fails, reads them from it.

        Args:
            protocol: the channel's protocol object on the new connection.
        """
        link = self._link
        requests = self._requests
        confirm = link.protocol.confirm_mode
        transactional = link.protocol.transactional
        link.protocol = self.pipe.protocol = protocol
        protocol.use_confirms(self._book.tracker)
        replies = [("channel.open", requests.register(None))]  # queued by the protocol
        modes: list[Method] = []
        if link.qos is not None:
            count, size, global_ = link.qos
            modes.append(spec.BasicQos(prefetch_size=size, prefetch_count=count, global_=global_))
        if confirm:
            modes.append(spec.ConfirmSelect())
        if transactional:
            modes.append(spec.TxSelect())
        for method in modes:
            protocol.send_method(method)
            replies.append((method.NAME, requests.register(None)))
        for _, reply in replies:
            # If one fails, the connection failed them all; the first one is raised.
            reply.add_done_callback(_seen)
        # Still suspended until every reply is in: the application's requests wait.
        for name, reply in replies:
            await requests.wait(name, 30.0, reply)
        link.suspended = False

    def republish(self) -> int:
        """Recovery: send again the unconfirmed messages kept at suspension, in order.

        Returns:
            How many were sent.
        """
        sent = self._book.republish(self._link.protocol)
        if sent:
            self.channel.republished += sent
            self.pipe.kick()
        return sent

    def mark_lost(self, exc: AMQPError) -> None:
        """Recovery could not restore this channel: close it for good with ``exc``.

        Args:
            exc: why.
        """
        link = self._link
        link.lost_reason = exc
        if link.protocol.state is ChannelState.CLOSED:
            link.protocol.close_exc = exc  # what a later call on this channel names
        self.on_closed(exc)

    def on_closed(self, exc: AMQPError) -> None:
        """The channel ended (idempotent): fail what waits, end the consumers.

        Args:
            exc: why.
        """
        link = self._link
        if link.closed.done():
            return
        link.suspended = False
        self.channel.close_exc = exc
        link.closed.set_result(exc)
        self._forget(link.channel_id)
        self.fail_pending(exc)
        self._consumers.close_all(exc)
        if not isinstance(exc, ChannelClosedByClient):
            logger.debug("channel %s closed: %r", link.channel_id, exc)


def _seen(future: asyncio.Future[Any]) -> None:
    """Mark a reply's failure as retrieved (another reply's failure reports it)."""
    if not future.cancelled():
        future.exception()
