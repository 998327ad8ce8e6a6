"""The sinks of format ``rabbitmq``: the batch and streaming writers and the commit
message a write task sends the driver.

``write`` runs on executors, one connection per task (:mod:`rabbitry.spark._write`
publishes); ``commit`` and ``abort`` run on the driver and log the totals.
:mod:`rabbitry.spark.datasource` hands the writers to Spark.
"""

from __future__ import annotations

import dataclasses
import logging
from typing import TYPE_CHECKING, Any

from pyspark.sql.datasource import DataSourceArrowWriter, WriterCommitMessage

from ._compat import STREAM_ARROW, StreamWriterBase
from ._metrics import Counts, enable_otel
from ._write import PublishResult, publish_batches, publish_rows

if TYPE_CHECKING:
    from collections.abc import Iterator, Sequence

    from pyarrow import RecordBatch
    from pyspark.sql import Row

    from ._options import WriteOptions

__all__ = ["BatchWriter", "PublishCommit", "StreamWriter"]

logger = logging.getLogger("rabbitry.spark")


@dataclasses.dataclass
class PublishCommit(WriterCommitMessage):
    """Sent from a write task to the driver: what the task published (all confirmed)."""

    partition_id: int
    attempt: int
    published: int
    confirmed: int
    first_message_id: str | None
    last_message_id: str | None
    bytes: int = 0

    @classmethod
    def of(cls, result: PublishResult) -> PublishCommit:
        """The commit message of a task's publish result.

        Args:
            result: what the task published.

        Returns:
            The same counts and message ids.
        """
        return cls(**dataclasses.asdict(result))


def _task() -> tuple[int, int, Any]:
    from pyspark import TaskContext

    context = TaskContext.get()
    if context is None:  # pragma: no cover - only outside a Spark task
        return 0, 0, None
    return context.partitionId(), context.attemptNumber(), context


def _summary(messages: Sequence[WriterCommitMessage | None]) -> tuple[int, int]:
    done = [m for m in messages if isinstance(m, PublishCommit)]
    return len(done), sum(m.confirmed for m in done)


def _sink_counts(options: WriteOptions) -> Counts:
    if options.otel:
        enable_otel()
    return Counts("sink", options.exchange)


def _commit_totals(
    counts: Counts, messages: Sequence[WriterCommitMessage | None]
) -> tuple[int, int, int]:
    """Rows, bytes and confirmed rows of the successful tasks, added to ``counts.totals``
    (the executors' tasks report them to OTel, not the driver)."""
    done = [m for m in messages if isinstance(m, PublishCommit)]
    rows = sum(m.published for m in done)
    size = sum(m.bytes for m in done)
    confirmed = sum(m.confirmed for m in done)
    for name, value in (("rows", rows), ("bytes", size), ("confirmed", confirmed)):
        counts.totals[name] += value
    return rows, size, confirmed


class BatchWriter(DataSourceArrowWriter):
    """Batch write; message ids ``{jobId}:{partition}:{index}`` unless a column gives them."""

    def __init__(self, options: WriteOptions, job_id: str) -> None:
        self.options = options
        self.job_id = job_id
        #: What this sink did (see :mod:`rabbitry.spark._metrics`).
        self.counts = Counts("sink", options.exchange)

    def write(self, iterator: Iterator[RecordBatch]) -> PublishCommit:
        partition, attempt, _ = _task()
        prefix = f"{self.job_id}:{partition}"
        counts = _sink_counts(self.options)
        result = publish_batches(self.options, iterator, prefix, partition, attempt, counts)
        return PublishCommit.of(result)

    def commit(self, messages: list[WriterCommitMessage | None]) -> None:
        tasks = _summary(messages)[0]
        rows, size, confirmed = _commit_totals(self.counts, messages)
        logger.info(
            "rabbitmq write %s: %d task(s), %d row(s), %d byte(s), %d confirmed",
            self.job_id,
            tasks,
            rows,
            size,
            confirmed,
        )

    def abort(self, messages: list[WriterCommitMessage | None]) -> None:
        tasks, confirmed = _summary(messages)
        logger.warning(
            "rabbitmq write %s aborted: %d message(s) of %d successful task(s) were already "
            "confirmed and stay in RabbitMQ",
            self.job_id,
            confirmed,
            tasks,
        )


class StreamWriter(StreamWriterBase):
    """Streaming write; message ids ``{queryId}:{batchId}:{partition}:{index}``."""

    def __init__(self, options: WriteOptions) -> None:
        self.options = options
        #: What this sink did (see :mod:`rabbitry.spark._metrics`).
        self.counts = Counts("sink", options.exchange)

    def write(self, iterator: Iterator[Any]) -> PublishCommit:
        partition, attempt, context = _task()
        query_id = context.getLocalProperty("sql.streaming.queryId") if context else None
        batch_id = context.getLocalProperty("streaming.sql.batchId") if context else None
        prefix = f"{query_id or self.options.job_id or 'query'}:{batch_id or 0}:{partition}"
        counts = _sink_counts(self.options)
        if STREAM_ARROW:
            result = publish_batches(self.options, iterator, prefix, partition, attempt, counts)
        else:  # pragma: no cover - Spark 4.0 hands the stream writer Rows
            rows = _row_dicts(iterator)
            result = publish_rows(self.options, rows, prefix, partition, attempt, counts)
        return PublishCommit.of(result)

    def commit(self, messages: list[WriterCommitMessage | None], batchId: int) -> None:
        rows, size, confirmed = _commit_totals(self.counts, messages)
        logger.info(
            "rabbitmq stream write batch %d: %d row(s), %d byte(s), %d confirmed, 0 nacked",
            batchId,
            rows,
            size,
            confirmed,
        )

    def abort(self, messages: list[WriterCommitMessage | None], batchId: int) -> None:
        _tasks, confirmed = _summary(messages)
        logger.warning(
            "rabbitmq stream write batch %d aborted: %d message(s) already confirmed stay in "
            "RabbitMQ (the batch is re-run on restart with the same message ids)",
            batchId,
            confirmed,
        )


def _row_dicts(rows: Iterator[Row]) -> Iterator[dict[str, Any]]:  # pragma: no cover - 4.0
    for row in rows:
        yield row.asDict()
