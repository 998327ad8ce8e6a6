"""The confirm-mode bookkeeping of one channel.

:class:`ConfirmBook` keeps a channel's unconfirmed publishes: it settles them with the
broker's confirms, tells which one a broker's refusal names, fails them when the channel
ends, and keeps those that ask for it to send again after recovery.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING

from .._support.waiters import Waiters
from ..exceptions import ChannelClosedByBroker, Nacked, PublishOutcomeUnknown, PublishRefused
from ..protocol._refusal import PublishSummary, is_publish_refusal, refused_index, summarize
from ..protocol.publish import ConfirmTracker
from ..publishing.pipe import Settleable

if TYPE_CHECKING:
    from collections.abc import Mapping

    from ..exceptions import AMQPError
    from ..protocol.channel import ChannelProtocol

__all__ = ["ConfirmBook", "Settleable", "settle"]

logger = logging.getLogger("rabbitry.channel")

#: How often (in publishes) the table of publish heads drops confirmed entries.
_HEADS_PRUNE = 1024


def settle(future: Settleable, tag: int, ack: bool) -> None:
    """Settle a publish with the broker's confirm of ``tag`` (unless it is settled).

    Args:
        future: the publish's waiter.
        tag: the confirmed sequence number.
        ack: the broker acked (else nacked) it.
    """
    if future.done():
        return
    if ack:
        future.set_result(None)
    else:
        future.set_exception(Nacked(tag))


class ConfirmBook:
    """A channel's publishes awaiting their confirm, and those kept to send again after
    recovery.

    Args:
        channel_id: the channel's number, for the log.
    """

    __slots__ = ("_channel_id", "_heads", "resend", "settled", "tracker")

    def __init__(self, channel_id: int) -> None:
        self._channel_id = channel_id
        #: The publishes awaiting their ack or nack, settled by :func:`settle`.
        self.tracker: ConfirmTracker[Settleable] = ConfirmTracker(settle)
        # The method frame and content header of confirm-mode publishes whose waiter
        # does not keep its frames: what tells which publish a refusal names (see
        # fail). Pruned every _HEADS_PRUNE publishes, not per confirm.
        self._heads: dict[int, tuple[bytes, bytes]] = {}
        #: Told when the confirm table becomes empty (the pipe's wait_settled waits here).
        self.settled: Waiters[None] = Waiters()
        #: Unconfirmed publishes to send again after recovery. The pipe shares the
        #: list: it is changed in place.
        self.resend: list[Settleable] = []

    def keep_head(self, seq: int, frames: list[bytes]) -> None:
        """Remember the head of the confirm-mode publish ``seq``.

        Args:
            seq: its sequence number.
            frames: its frames (method, header, body...).
        """
        heads = self._heads
        heads[seq] = (frames[0], frames[2])
        if not seq % _HEADS_PRUNE:
            unconfirmed = self.tracker.tags()
            self._heads = {s: h for s, h in heads.items() if s in unconfirmed}

    def on_confirm(self, tag: int, multiple: bool, ack: bool) -> None:
        """basic.ack / basic.nack from the broker.

        Args:
            tag: the confirmed sequence number.
            multiple: and every earlier one.
            ack: acked (else nacked).
        """
        if self.tracker.confirm(tag, multiple, ack):  # settles through settle
            # Nothing is unconfirmed: the heads kept for unconfirmed publishes (pruned
            # every _HEADS_PRUNE publishes otherwise) are all stale.
            if self._heads:
                self._heads = {}
            if self.settled:
                self.settled.wake_all(None)

    def fail(self, exc: AMQPError, *, keep_resendable: bool = False) -> None:
        """Fail the unconfirmed publishes with ``exc``.

        Args:
            exc: why the channel ended or the connection dropped.
            keep_resendable: unconfirmed publishes whose owner asked for it
                (``resend_on_recovery``) are kept for :meth:`republish`.
        """
        confirms = self.tracker.take_all()
        heads, self._heads = self._heads, {}
        refused = self._refused_seq(exc, confirms, heads)
        if not keep_resendable and self.resend:
            confirms.update((-i - 1, waiter) for i, waiter in enumerate(self.resend))
            self.resend.clear()  # in place: the pipe shares the list
        for seq, waiter in confirms.items():
            if waiter.done():
                continue
            if keep_resendable and getattr(waiter, "resend_on_recovery", False):
                self.resend.append(waiter)
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
        if self.settled:
            self.settled.wake_all(None)

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
                    self._channel_id,
                    len(order),
                    exc,
                )
            return None
        return order[index]

    def republish(self, protocol: ChannelProtocol) -> int:
        """Send again the unconfirmed messages kept at suspension, in order.

        They keep their ``message_id``; the broker may now hold two copies of some
        (at-least-once: the consumer's dedup store or idempotency handles them).

        Args:
            protocol: the channel's protocol object on the recovered connection.

        Returns:
            How many were sent.
        """
        resend = self.resend.copy()
        self.resend.clear()  # in place: the pipe shares the list
        sent = 0
        for record in resend:
            if record.done():
                continue
            # Registered in the confirm table under its new sequence number.
            record.seq = protocol.send_publish(record.frames, record)  # type: ignore[attr-defined]
            sent += 1
        return sent
