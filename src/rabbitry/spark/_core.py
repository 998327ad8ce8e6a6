"""The broker side of the data source, without pyspark: consuming, offsets, publishing.

Everything here uses rabbitry's thread-safe sync API and is unit-testable with fakes.
Connections are opened lazily in the process that uses them and never pickled.
The replay check of a planned batch is in :mod:`rabbitry.spark._replay`, the probes of
a queue's depth and type in :mod:`rabbitry.spark._queue_probe`.
"""

from __future__ import annotations

import logging
import queue as queue_module
import threading
import time
import uuid
from typing import TYPE_CHECKING, Any

from ..exceptions import (
    AMQPError,
    BrokerUnavailable,
    ConsumerCancelled,
    InvalidStateError,
    NotFound,
    PublishFailed,
    ReplayUnavailable,
    SourceCancelled,
    Timeout,
)
from ..recovery import State, is_permanent
from ..sync._connection import portal_of
from ._limits import delivery_count
from ._queue_probe import broker_queue_type as broker_queue_type
from ._queue_probe import check_queue_type
from ._replay import session_marker
from ._rows import TupleRows
from ._streams import (
    DataLossError,
    read_stream_range,
    resolve_start,
    split_range,
    stream_bounds,
    stream_first,
    stream_tail,
)

if TYPE_CHECKING:
    from collections.abc import Callable

    from ..protocol.message import Message
    from ..sync.channel import Channel
    from ..sync.connection import Connection
    from ._options import ConnectOptions, ReadOptions
    from ._rows import RowSink

__all__ = [
    "AckLedger",
    "BrokerUnavailable",
    "DataLossError",
    "PublishFailed",
    "QueueConsumer",
    "ReplayUnavailable",
    "SourceCancelled",
    "check_queue_type",
    "read_stream_range",
    "resolve_start",
    "split_range",
    "stream_bounds",
    "stream_first",
    "stream_tail",
]

logger = logging.getLogger("rabbitry.spark")

Row = tuple[Any, ...]

#: Seconds a read or commit waits for the broker to answer the round trip after its ack.
_ACK_APPLIED_TIMEOUT = 30.0

#: Seconds between two attempts to connect again during an outage (the first, doubled up
#: to the last).
_RECONNECT_DELAYS = (0.5, 5.0)


# ---------------------------------------------------------------- classic / quorum queues


class AckLedger:
    """Which delivery tag acknowledges which micro-batch (driver-side, one channel).

    Offsets of a queue read are ``{"seq": n}``: the number of rows handed to Spark so far.
    ``add(end, tag, epoch)`` records that the batch ending at ``end`` ended with delivery
    ``tag``, received in the channel's recovery ``epoch``; ``through(seq)`` pops every
    batch ending at or before ``seq``. A batch of an older epoch than the channel's must
    not be acked: its deliveries died with the old connection and the broker requeued
    them (they come back flagged ``redelivered``).
    """

    def __init__(self) -> None:
        self._batches: list[tuple[int, int, int]] = []

    def __len__(self) -> int:
        return len(self._batches)

    def add(self, end: int, tag: int, epoch: int = 0) -> None:
        """Batch ending at ``end`` (exclusive seq) ended with delivery ``tag`` of ``epoch``."""
        self._batches.append((end, tag, epoch))

    def through(self, seq: int, epoch: int = 0) -> tuple[int | None, int]:
        """Pop the batches ending ≤ ``seq``.

        Returns:
            The highest tag among the popped batches of ``epoch`` (``None`` when there is
            none), and how many popped batches were of another (older) epoch.
        """
        done = [(tag, batch_epoch) for end, tag, batch_epoch in self._batches if end <= seq]
        if not done:
            return None, 0
        self._batches = [batch for batch in self._batches if batch[0] > seq]
        current = [tag for tag, batch_epoch in done if batch_epoch == epoch]
        return (max(current) if current else None), len(done) - len(current)

    def reset(self) -> int:
        """Forget everything (the channel is gone, its tags are void); how many batches."""
        count = len(self._batches)
        self._batches = []
        return count


class QueueConsumer:
    """The driver-side consumer of a classic or quorum queue for a streaming query.

    At-least-once: deliveries are acknowledged only once Spark has the batch that holds
    them in its commit log, i.e. when it asks for the next batch (``read(start)``) or
    calls ``commit(end)``. If the process or the connection dies first, the broker
    requeues them and they come back with ``redelivered=True``.
    """

    def __init__(
        self,
        options: ReadOptions,
        connect: Callable[[ConnectOptions], Connection] | None = None,
    ) -> None:
        self.options = options
        self._connect = connect or (lambda c: c.connect(" [spark source]"))
        self._conn: Connection | None = None
        self._channel: Channel | None = None
        self._inbox: queue_module.SimpleQueue[Message] | None = None
        self._consumer_tag: str | None = None
        self._ledger = AckLedger()
        # Deliveries per batch not yet acked: (batch end, deliveries, epoch).
        self._unacked: list[tuple[int, int, int]] = []
        #: Deliveries acknowledged so far.
        self.acked = 0
        self._budget: int | None = None
        self.reconnects = 0
        #: Committed batches whose acks were void (received before a recovery).
        self.stale_batches = 0
        #: Deliveries left out of a batch because they predate a recovery.
        self.stale_deliveries = 0
        self.cancelled: str | None = None
        #: Names the current connection; offsets of its batches carry it.
        self.session: str | None = None
        #: When the current outage ends the wait (``recoveryTimeoutMs`` after it was
        #: noticed), or None while the broker is reachable.
        self._outage_deadline: float | None = None
        #: Quorum queues: the consumer takes no more than the batch (see read_into).
        self._exact = options.queue_type == "quorum"
        #: The highest ``x-delivery-count`` of the last batch read (quorum queues).
        self.batch_count: int | None = None

    # state that must never be pickled (the reader is copied to executors for replays)
    def __getstate__(self) -> dict[str, Any]:
        state = self.__dict__.copy()
        state.update(
            _conn=None,
            _channel=None,
            _inbox=None,
            _consumer_tag=None,
            _ledger=AckLedger(),
            _unacked=[],
        )
        return state

    def _alive(self) -> bool:
        return (
            self._conn is not None
            and self._conn.is_open
            and self._channel is not None
            and self._channel.is_open
        )

    def _open(self) -> Channel:
        """The source's channel; through an outage, the same or a new one (bounded wait).

        The first connection fails at once (a wrong URL should not wait). Once the
        source has been connected, a lost broker is waited for up to
        ``recoveryTimeoutMs``: first for the connection's own recovery (the consumer is
        subscribed again by it, and the batches of the old connection are told apart by
        their recovery epoch), and if the connection ended for good, by connecting anew.

        Raises:
            BrokerUnavailable: the broker was not back within ``recoveryTimeoutMs``.
        """
        if self._alive():
            self._outage_deadline = None
            assert self._channel is not None
            return self._channel
        if self._conn is None:
            return self._connect_new()
        if self._outage_deadline is None:
            self._outage_deadline = time.monotonic() + self.options.recovery_timeout
        if self._conn.state is State.RECOVERING:
            try:
                self._conn.wait_recovered(timeout=self._left())
            except Timeout:
                raise self._unavailable(self._conn.close_exc) from None
            except InvalidStateError:
                pass  # the connection ended for good: connect anew below
            if self._alive():
                self._outage_deadline = None
                assert self._channel is not None
                return self._channel
        # The connection (or the channel) is gone: the broker requeued everything
        # unacked; those tags are void on any new channel.
        lost = self._ledger.reset()
        self._unacked = []
        self.reconnects += 1
        logger.warning(
            "rabbitmq source %r: connection lost (%s); %d unacknowledged batch(es) will "
            "be redelivered; connecting again (waiting up to recoveryTimeoutMs, %d ms)",
            self.options.queue,
            self._conn.close_exc,
            lost,
            round(self.options.recovery_timeout * 1000),
        )
        self._inbox = self._consumer_tag = None  # nothing to cancel on a dead connection
        self.close()
        delay = _RECONNECT_DELAYS[0]
        while True:
            try:
                channel = self._connect_new()
            except AMQPError as exc:
                if is_permanent(exc) or self._left() <= 0:
                    raise self._unavailable(exc) from exc
                time.sleep(min(delay, self._left()))
                delay = min(2 * delay, _RECONNECT_DELAYS[1])
                continue
            self._outage_deadline = None
            return channel

    def _left(self) -> float:
        """Seconds left of the current outage's wait."""
        assert self._outage_deadline is not None
        return max(0.0, self._outage_deadline - time.monotonic())

    def _unavailable(self, cause: BaseException | None) -> BrokerUnavailable:
        return BrokerUnavailable(
            f"rabbitmq source {self.options.queue!r}: the broker was not reachable again "
            f"within recoveryTimeoutMs ({round(self.options.recovery_timeout * 1000)} ms; "
            f"last error: {cause}); its unacknowledged messages are back in the queue: "
            "restart the query from its checkpoint, or raise recoveryTimeoutMs"
        )

    def _connect_new(self) -> Channel:
        if self._conn is not None:
            self.close()
        self._conn = self._connect(self.options.connect)
        self._channel = self._conn.channel()
        # The session marker lives exactly as long as this connection: while it exists,
        # the deliveries this session holds are not back in the queue (see replay_check).
        self.session = uuid.uuid4().hex
        self._channel.queue_declare(session_marker(self.session), exclusive=True, auto_delete=True)
        return self._channel

    def _subscribe(
        self, window: int | None = None
    ) -> tuple[Channel, queue_module.SimpleQueue[Message]]:
        """The channel and the inbox of a consumer of the queue (subscribed if there is
        none, with ``window`` as its prefetch, else option ``prefetch``)."""
        channel = self._open()
        if self._inbox is None:
            assert self._conn is not None
            check_queue_type(self._conn, self.options)
            self._inbox = queue_module.SimpleQueue()
            self._consumer_tag = None
        if self._consumer_tag is None:
            channel.basic_qos(window or self.options.prefetch)
            self._consumer_tag = channel.basic_consume(
                self.options.queue, self._inbox.put, on_cancel=self._on_cancel
            )
        return channel, self._inbox

    def _close_window(
        self, channel: Channel, inbox: queue_module.SimpleQueue[Message]
    ) -> list[Message]:
        """Cancel the consumer of a batch's window: the deliveries that arrived after the
        batch closed, which belong to it too.

        Once the broker's cancel-ok is in, it sends no more; the deliveries before it are
        all handed to the inbox once the dispatcher thread has run what the IO thread
        queued before (a barrier through the same queue).
        """
        tag, self._consumer_tag = self._consumer_tag, None
        if tag is None or not channel.is_open:
            return []
        epoch = channel.epoch
        try:
            channel.basic_cancel(tag, timeout=_ACK_APPLIED_TIMEOUT)
            if channel.epoch == epoch and self._conn is not None:
                _dispatched(self._conn, _ACK_APPLIED_TIMEOUT)
        except AMQPError as exc:
            # The connection is gone (its deliveries go back to the queue and the epoch
            # check leaves them out) or the broker did not answer in time.
            logger.warning(
                "rabbitmq source %r: cancelling the consumer of a closed batch failed: %r",
                self.options.queue,
                exc,
            )
        late: list[Message] = []
        while True:
            try:
                late.append(inbox.get_nowait())
            except queue_module.Empty:
                return late

    def _on_cancel(self, consumer_tag: str) -> None:
        self.cancelled = consumer_tag

    def _after_cancel(self, tag: str) -> None:
        """The consumer was ended by the broker, or by a recovery that could not subscribe
        it again (a quorum queue without a leader yet): the next read subscribes again,
        unless the queue is gone.

        Raises:
            SourceCancelled: the queue does not exist.
        """
        self._open()
        assert self._conn is not None
        probe = self._conn.channel()
        try:
            probe.queue_declare(self.options.queue, passive=True)
        except NotFound:
            raise SourceCancelled(
                f"rabbitmq source: the broker cancelled the consumer of queue "
                f"{self.options.queue!r}, and the queue does not exist (deleted)"
            ) from ConsumerCancelled(tag)
        finally:
            if probe.is_open:
                probe.close()
        logger.warning(
            "rabbitmq source %r: the consumer was cancelled (%s) and the queue exists; "
            "subscribing again",
            self.options.queue,
            tag,
        )
        self._inbox = self._consumer_tag = None
        self.cancelled = None

    def prepare_available_now(self) -> int:
        """Fix the number of messages an AvailableNow run reads: the queue depth now.

        Measured before consuming starts, otherwise prefetched deliveries would no
        longer count as ready.
        """
        if self._inbox is None:
            channel = self._open()
            ok = channel.queue_declare(self.options.queue, passive=True)
            self._budget = ok.message_count
            if ok.consumer_count:
                # Messages another consumer holds unacknowledged (e.g. the source of a
                # query that is still stopping) are not ready, so not in this run.
                logger.warning(
                    "rabbitmq source %r: AvailableNow counts %d ready message(s); %d other "
                    "consumer(s) hold unacknowledged ones, which a later run reads",
                    self.options.queue,
                    ok.message_count,
                    ok.consumer_count,
                )
        else:  # already consuming (not expected): take what is buffered as the target
            self._budget = self._inbox.qsize()
        return self._budget

    def ack_through(self, seq: int) -> None:
        """Acknowledge every batch ending at or before ``seq`` (idempotent).

        The ack is applied by the broker when this returns (a round trip on the channel
        follows it): Spark kills the source's process right after its last call, without
        calling ``stop()``. Batches received before the connection recovered are not
        acked (their tags are void; the broker requeued those deliveries and redelivers
        them).
        """
        done = [batch for batch in self._unacked if batch[0] <= seq]
        self._unacked = [batch for batch in self._unacked if batch[0] > seq]
        if not self._alive():
            # Void tags: those deliveries were requeued when the connection died.
            self._ledger.through(seq)
            return
        assert self._channel is not None
        epoch = self._channel.epoch
        tag, stale = self._ledger.through(seq, epoch)
        if stale:
            self.stale_batches += stale
            logger.warning(
                "rabbitmq source %r: %d committed batch(es) arrived before the connection "
                "recovered and cannot be acknowledged; the broker redelivers their messages "
                "(redelivered=true)",
                self.options.queue,
                stale,
            )
        if tag is None:
            return
        try:
            self._channel.basic_ack(tag, multiple=True)
            # Spark ends the source's process by killing it as soon as the last call
            # returned (its stop() never runs), so an ack still in this client's buffers
            # would die with it and the batch come back. A round trip on the same channel
            # settles that: the broker handles a channel's frames in order, so once it
            # answers, the ack is applied.
            self._channel.basic_qos(self.options.prefetch, timeout=_ACK_APPLIED_TIMEOUT)
        except AMQPError as exc:
            logger.warning(
                "rabbitmq source %r: ack of tag %d not confirmed as applied (%r); if it was "
                "lost its messages are redelivered (redelivered=true)",
                self.options.queue,
                tag,
                exc,
            )
            return
        if self._channel.epoch != epoch:
            return  # recovered in between: those deliveries were requeued if not acked
        self.acked += sum(count for _end, count, when in done if when == epoch)

    def read(self, start: int) -> tuple[list[Row], int]:
        """Ack through ``start``, then take up to one batch: ``(rows, end)`` as tuples.

        The source itself reads into Arrow batches (:meth:`read_into`).
        """
        rows = TupleRows(self.options.queue)
        end = self.read_into(start, rows)
        return rows.rows, end

    def read_into(self, start: int, rows: RowSink) -> int:
        """Ack through ``start``, then add up to one batch to ``rows``; the batch's end.

        Returns ``start`` when nothing is new.
        """
        self.ack_through(start)
        want = self.options.max_messages_per_batch
        if self._budget is not None:
            want = min(want, self._budget)
        if want <= 0:
            return start
        # A quorum queue counts every return of a delivery toward its delivery limit,
        # so the consumer of a quorum queue takes exactly one batch: its prefetch is the
        # batch, nothing is acknowledged while it runs (the previous batch was acked
        # above), and it is cancelled when the batch closes, taking what arrived since
        # into the batch. A failed run then returns only what Spark had.
        window = min(want, 65535) if self._exact else None
        if window is not None:
            want = window
        channel, inbox = self._subscribe(window)
        taken = _drain(
            inbox,
            want,
            self.options.poll_timeout,
            self.options.idle_timeout,
            self.options.max_batch_wait,
        )
        if window is not None:
            taken += self._close_window(channel, inbox)
        epoch = channel.epoch
        fresh = [m for m in taken if m.epoch == epoch]
        if len(fresh) != len(taken):
            # Delivered on the connection before it recovered: the broker requeued them
            # when that connection died and delivers them again on this one.
            self.stale_deliveries += len(taken) - len(fresh)
            logger.warning(
                "rabbitmq source %r: %d buffered delivery(ies) predate a connection "
                "recovery; left to the broker, which redelivers them",
                self.options.queue,
                len(taken) - len(fresh),
            )
            taken = fresh
        if not taken and self.cancelled is not None:
            self._after_cancel(self.cancelled)
        end = start
        for message in taken:  # a batch envelope gives one row per record
            end += rows.add(message, end, consecutive=True)
        if self._exact:
            self.batch_count = max((delivery_count(m) for m in taken), default=0)
        if taken:
            self._ledger.add(end, taken[-1].delivery_tag, epoch)
            self._unacked.append((end, len(taken), epoch))
            if self._budget is not None:
                self._budget -= len(taken)
        return end

    def close(self) -> None:
        """Close the connection; unacknowledged deliveries go back to the queue.

        Every ack was already applied when the read or commit that sent it returned
        (see :meth:`ack_through`). The consumer is cancelled first, and its cancel-ok
        awaited, so no delivery arrives while the connection closes.
        """
        conn, channel, tag = self._conn, self._channel, self._consumer_tag
        self._conn, self._channel, self._inbox, self._consumer_tag = None, None, None, None
        if conn is None:
            return
        if tag is not None and channel is not None and channel.is_open:
            try:
                channel.basic_cancel(tag, timeout=10)
            except AMQPError as exc:
                logger.warning(
                    "rabbitmq source %r: cancelling the consumer before closing failed: %r "
                    "(acknowledgements sent just before may not have reached the broker; "
                    "their messages would be redelivered)",
                    self.options.queue,
                    exc,
                )
        conn.close(timeout=5)


def _drain(
    inbox: queue_module.SimpleQueue[Message],
    want: int,
    poll: float,
    idle: float,
    max_wait: float = float("inf"),
) -> list[Message]:
    """Up to ``want`` messages for one micro-batch.

    Waits ``poll`` for the first message; then takes more until ``want``, a gap of
    ``idle`` without a message, or ``max_wait`` after the first message, whichever comes
    first. The last bound keeps a steady trickle (which never leaves an idle gap) from
    holding a batch open until it is full.
    """
    taken: list[Message] = []
    get = inbox.get
    try:
        taken.append(get(timeout=poll))
        deadline = time.monotonic() + max_wait
        while len(taken) < want:
            left = deadline - time.monotonic()
            if left <= 0:
                break
            taken.append(get(timeout=min(idle, left)))
    except queue_module.Empty:
        pass
    return taken


def _dispatched(conn: Connection, timeout: float) -> None:
    """Return once the dispatcher thread of ``conn`` has run every callback (deliveries
    included) its IO thread queued before this call."""
    done = threading.Event()
    portal = portal_of(conn)
    portal.submit(portal.post_callback, done.set)
    done.wait(timeout)
