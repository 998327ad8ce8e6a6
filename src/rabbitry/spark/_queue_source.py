"""The streaming source of classic and quorum queues (:class:`QueueStreamReader`).

It runs in the query's one long-lived source process on the driver, keeping a consumer
(:class:`~rabbitry.spark._core.QueueConsumer`) open between micro-batches and acking once
Spark has committed a batch. :mod:`rabbitry.spark.datasource` hands it to Spark.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Any

from pyspark.sql.datasource import SimpleDataSourceStreamReader

from ._arrow import ArrowRows
from ._compat import SupportsTriggerAvailableNow
from ._core import QueueConsumer
from ._metrics import Counts, enable_otel
from ._replay import replay_check
from ._restart import restart_check

if TYPE_CHECKING:
    from collections.abc import Iterator

    from pyarrow import RecordBatch

    from ._options import ReadOptions

__all__ = ["Offset", "QueueStreamReader"]

logger = logging.getLogger("rabbitry.spark")

#: A source offset as Spark stores it in its offset log (JSON).
Offset = dict[str, Any]


class QueueStreamReader(SimpleDataSourceStreamReader, SupportsTriggerAvailableNow):
    """Classic/quorum queues: one driver-side consumer, manual acks, at-least-once.

    Offsets are ``{"seq": n}`` (rows handed to Spark so far). ``read(start)`` first acks
    every batch ending at or before ``start``: Spark asks for the next batch only after the
    previous one is in its commit log. ``commit(end)`` acks too (idempotent). Acking only
    in ``commit`` would deadlock when prefetch ≤ batch size, because Spark commits batch N
    to the source only after planning a non-empty batch N+1, and it never commits the
    last batch of an AvailableNow run.
    """

    def __init__(self, options: ReadOptions) -> None:
        self.options = options
        self.consumer = QueueConsumer(options)
        #: What this source did (see :mod:`rabbitry.spark._metrics`).
        self.counts = Counts("source", options.queue)
        self._acked = 0
        if options.otel:
            enable_otel()

    def initialOffset(self) -> Offset:
        return {"seq": 0}

    def prepareForTriggerAvailableNow(self) -> None:
        target = self.consumer.prepare_available_now()
        logger.info(
            "rabbitmq source %r: AvailableNow reads %d message(s)", self.options.queue, target
        )

    def read(self, start: Offset) -> tuple[Iterator[RecordBatch], Offset]:
        """The next micro-batch, consumed in the driver; Spark calls it.

        Args:
            start: where the previous batch ended.

        Returns:
            The rows (record batches) and the offset after them (``start`` itself when
            nothing is new).
        """
        begin = int(start["seq"])
        rows = ArrowRows(self.options.queue)
        end = self.consumer.read_into(begin, rows)
        batches = rows.finish()
        self._count(rows, begin, end)
        if end == begin:
            return iter([]), start  # unchanged, so Spark sees that nothing is new
        # A list iterator: Spark copies cached iterators (a generator cannot be copied).
        # The session names the connection holding these deliveries (see replay_check);
        # on a quorum queue, count is their highest delivery count (see restart_check).
        offset: Offset = {"seq": end, "session": self.consumer.session}
        if self.consumer.batch_count is not None:
            offset["count"] = self.consumer.batch_count
        return iter(batches), offset

    def readBetweenOffsets(self, start: Offset, end: Offset) -> Iterator[RecordBatch]:
        """Replay a planned, uncommitted batch after a restart; Spark calls it.

        Args:
            start: the batch's first offset.
            end: the offset after it.

        Returns:
            No rows: the broker redelivers those messages through :meth:`read`.
        """
        # Called for a batch that was planned but not committed when the source has no
        # copy of it (after a restart), on an executor. Its messages are not readable
        # again here: they were held unacknowledged by the session that read them. Once
        # that session is gone the broker has requeued them (they come back through
        # read(), flagged redelivered) and the replay is rightly empty; if it is alive,
        # replay_check raises rather than commit an empty batch over them.
        first, last = int(start["seq"]), int(end["seq"])
        # A quorum queue's failed batch went back to the queue with its delivery counts
        # raised: refuse, before reading anything, a restart that could lose it.
        restart_check(self.options, first, last, end.get("count"))
        replay_check(self.options, first, last, end.get("session"))
        return iter([])

    def commit(self, end: Offset) -> None:
        """Acknowledge every message up to ``end``; Spark calls it once a batch is written.

        Args:
            end: the offset after the committed batch.
        """
        seq = int(end["seq"])
        self.consumer.ack_through(seq)
        self._count(None, seq, seq)

    def _count(self, rows: ArrowRows | None, begin: int, end: int) -> None:
        acks = self.consumer.acked - self._acked
        self._acked = self.consumer.acked
        count = rows.rows if rows is not None else 0
        if not count and not acks:
            return
        size = rows.bytes if rows is not None else 0
        redelivered = rows.redelivered if rows is not None else 0
        self.counts.add(rows=count, bytes=size, acks=acks, redelivered=redelivered)
        if not count:
            logger.info(
                "rabbitmq source %r commit through %d: %d ack(s)", self.options.queue, end, acks
            )
            return
        logger.info(
            "rabbitmq source %r batch [%d, %d): %d row(s), %d byte(s), %d ack(s), %d redelivered",
            self.options.queue,
            begin,
            end,
            count,
            size,
            acks,
            redelivered,
        )

    def stop(self) -> None:
        self.consumer.close()
