"""The records a publisher's channel settles: one per message sent with confirms.

A :class:`Pending` is put in the channel's confirm table with the message; the broker's
confirm (or the channel's end) settles it, and it resolves the caller's future and tells
its owner (:class:`RecordOwner`, the publisher's send machinery) to free the window
slot. A ``publish_batch`` call collects the outcomes of its members in a :class:`Batch`,
each member settled through a :class:`Slot`.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Protocol

from ..exceptions import Nacked, PublishTimeout

if TYPE_CHECKING:
    import asyncio
    from collections.abc import Callable

    from .pipe import Settleable
    from .unobserved import UnobservedLedger

__all__ = ["Batch", "Pending", "RecordOwner", "Slot"]

_UNSET: Any = object()


class RecordOwner(Protocol):
    """What a :class:`Pending` tells when it is settled: the publisher's send machinery.

    ``outstanding`` counts the records sent and unsettled; ``idle_waiters`` are told
    (through :meth:`check_idle`) when nothing is in flight any more.
    """

    republish: bool
    outstanding: int
    nack_attempts: dict[Any, int]
    ledger: UnobservedLedger

    @property
    def nack_retry(self) -> object | None:
        """The nack retry policy, or ``None``."""

    @property
    def idle_waiters(self) -> object:
        """Waiters told when nothing is in flight (truthy while someone waits)."""

    def finished(self, record: Pending) -> None:
        """``record`` was settled by the broker or by the channel's end."""

    def retry_nacked(self, record: Pending) -> bool:
        """A nack for ``record``: True when it is sent again later."""

    def check_idle(self) -> None:
        """Wake the idle waiters if nothing is in flight."""


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
        owner: RecordOwner,
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
        """The broker (or the channel's end) settled it.

        Returns:
            True once settled.
        """
        return self.settled

    @property
    def resend_on_recovery(self) -> bool:
        """Recovery keeps this message and sends it again (``republish_unconfirmed``)."""
        return self.owner.republish

    def set_result(self, _result: None, /) -> None:
        """The broker acked it: resolve the future and free the slot.

        Args:
            _result: ``None``.
        """
        self.settled = True
        future = self.future
        if not future.done():
            future.set_result(None)
        owner = self.owner
        if self.timer is not None or self.returnable or owner.nack_attempts:
            owner.finished(self)
            return
        # The common case of RecordOwner.finished, inlined: this runs once per ack.
        owner.outstanding -= 1
        release = self.release
        if release is not None:
            release()
        if not owner.outstanding and owner.idle_waiters:
            owner.check_idle()

    def set_exception(self, exception: BaseException, /) -> None:
        """The broker nacked it, or the channel ended: fail the future (or retry).

        Args:
            exception: what the future fails with.
        """
        future = self.future
        owner = self.owner
        if (
            isinstance(exception, Nacked)
            and owner.nack_retry is not None
            and not future.done()
            and owner.retry_nacked(self)
        ):
            return  # sent again later; this record is replaced by the next attempt's
        self.settled = True
        if not future.done():
            if isinstance(exception, Nacked) and exception.delivery_tag != self.seq:
                exception = Nacked(self.seq)  # a multiple nack names its highest tag
            owner.ledger.fail(future, exception)
        owner.finished(self)

    def expire(self) -> None:
        """The deadline passed: fail the future, keep the record until the confirm."""
        self.timer = None
        future = self.future
        if not future.done():
            self.owner.ledger.fail(
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
        """Record the outcome of member ``index`` (the first one counts).

        Args:
            index: the member's position in the batch.
            outcome: ``None`` (acked or sent) or the exception it failed with.
        """
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
        """The batch's deadline passed: the members without an outcome time out."""
        self.timer = None
        for index, outcome in enumerate(self.outcomes):
            if outcome is _UNSET:
                self.settle(
                    index, PublishTimeout("batch message not confirmed before its deadline")
                )


class Slot:
    """A batch member's stand-in for a future."""

    __slots__ = ("batch", "index")

    def __init__(self, batch: Batch, index: int) -> None:
        self.batch = batch
        self.index = index

    def done(self) -> bool:
        """The member has an outcome.

        Returns:
            True once settled.
        """
        return self.batch.outcomes[self.index] is not _UNSET

    def set_result(self, _result: None, /) -> None:
        """The member was acked (or sent, without confirms).

        Args:
            _result: ``None``.
        """
        self.batch.settle(self.index, None)

    def set_exception(self, exception: BaseException, /) -> None:
        """The member failed.

        Args:
            exception: its outcome.
        """
        self.batch.settle(self.index, exception)
