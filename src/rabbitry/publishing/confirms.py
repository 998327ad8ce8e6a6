"""The confirm book of an asyncio publisher: what it sent and the broker has not settled.

It is the :class:`~rabbitry.publishing.records.RecordOwner` of the publisher's
:class:`~rabbitry.publishing.records.Pending` records: it counts them, correlates the
broker's returns to them by ``message_id``, schedules the resend of nacked ones
(``nack_retry``), keeps the failed futures nobody looked at, and tells the waiters of
``wait_for_confirms`` when nothing is in flight any more.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Any, Protocol

from .._support.waiters import Waiters
from ..exceptions import Unroutable
from .unobserved import UnobservedLedger

if TYPE_CHECKING:
    import asyncio
    from collections.abc import Callable, Sized

    from ..protocol.message import Message
    from ..recovery import NackRetry
    from .pipe import Settleable
    from .records import Pending

__all__ = ["Resender", "SentMessages"]

logger = logging.getLogger("rabbitry.publisher")


class Resender(Protocol):
    """What the book needs of the publisher's send machinery."""

    @property
    def closing(self) -> bool:
        """The publisher is closing: a nacked message is not sent again."""

    @property
    def backlog(self) -> Sized:
        """The messages waiting for a channel (the publisher is not idle while any)."""

    def send(
        self,
        frames: list[bytes],
        future: Settleable | None,
        message_id: str | None,
        mandatory: bool,
        deadline: float | None,
        release: Callable[[], None] | None,
    ) -> None:
        """Queue one encoded message (a nacked one, sent again)."""


class SentMessages:
    """Keeps account of the sent, unsettled messages of one publisher until settled.

    ``outstanding`` counts the records sent and unsettled; ``returnable`` maps the
    ``message_id`` of mandatory ones to their records (oldest first); ``idle_waiters``
    are told when nothing is in flight; ``ledger`` holds the failed futures nobody
    looked at. The publisher's send path updates ``outstanding`` and ``returnable``
    inline when it sends a record.
    """

    def __init__(
        self,
        loop: asyncio.AbstractEventLoop,
        sender: Resender,
        *,
        republish: bool,
        nack_retry: NackRetry | None,
    ) -> None:
        self.loop = loop
        self._sender = sender
        self.republish = republish
        self.nack_retry = nack_retry
        # Nack retry: re-sends waiting for their delay, and attempts per future.
        self.retrying = 0
        self.nack_attempts: dict[Any, int] = {}
        #: How many nacked messages were sent again (``nack_retry``).
        self.nack_resends = 0
        self.outstanding = 0
        self.idle_waiters: Waiters[None] = Waiters()  # told when nothing is in flight
        self.returnable: dict[str, list[Pending]] = {}
        # Failed futures nobody looked at, reported when the publisher ends.
        self.ledger = UnobservedLedger("AsyncPublisher")

    def finished(self, record: Pending) -> None:
        """A record was settled by the broker or by the channel's end."""
        self.outstanding -= 1
        if self.nack_attempts:
            self.nack_attempts.pop(record.future, None)
        if record.timer is not None:
            record.timer.cancel()
            record.timer = None
        if record.returnable:
            self._forget_returnable(record)
        release = record.release
        if release is not None:
            release()
        if not self.outstanding and self.idle_waiters:
            self.check_idle()

    def _forget_returnable(self, record: Pending) -> None:
        record.returnable = False
        key = record.message_id
        assert key is not None
        same = self.returnable.get(key)
        if same is not None:
            if record in same:
                same.remove(record)
            if not same:
                del self.returnable[key]

    def retry_nacked(self, record: Pending) -> bool:
        """A nack for ``record``: schedule it again if the policy allows (loop thread)."""
        policy = self.nack_retry
        assert policy is not None
        if self._sender.closing:
            return False
        attempt = self.nack_attempts.get(record.future, 0)
        if attempt >= policy.max_attempts:
            self.nack_attempts.pop(record.future, None)
            return False
        self.nack_attempts[record.future] = attempt + 1
        record.settled = True  # this send is over; the next attempt gets a new record
        self.outstanding -= 1
        deadline: float | None = None
        if record.timer is not None:
            deadline = record.timer.when()
            record.timer.cancel()
            record.timer = None
        mandatory = record.returnable
        if mandatory:
            self._forget_returnable(record)
        self.retrying += 1
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
        self.loop.call_later(delay, self._resend_nacked, record, mandatory, deadline)
        return True

    def _resend_nacked(self, record: Pending, mandatory: bool, deadline: float | None) -> None:
        self.retrying -= 1
        future = record.future
        if future.done():  # e.g. its deadline passed while waiting
            self.nack_attempts.pop(future, None)
            if record.release is not None:
                record.release()
            self.check_idle()
            return
        self._sender.send(
            record.frames, future, record.message_id, mandatory, deadline, record.release
        )

    def check_idle(self) -> None:
        """Wake the waiters of ``wait_for_confirms`` if nothing is in flight any more."""
        if self.outstanding or self._sender.backlog or self.retrying:
            return
        self.idle_waiters.wake_all(None)

    def on_return(self, message: Message) -> None:
        """The broker returned a mandatory message: fail the oldest publish of its id.

        Args:
            message: the returned message (its ``message_id`` names the publish).
        """
        message_id = message.properties.message_id
        same = self.returnable.get(message_id) if message_id is not None else None
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
            self.ledger.fail(record.future, Unroutable(message))
