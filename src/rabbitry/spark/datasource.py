"""The PySpark classes of format ``rabbitmq``.

With the modules it takes its classes from (``_queue_source``, ``_writers`` and the
version stand-ins of ``_compat``), the only modules of the package that import pyspark.

Where each piece runs (Spark's Python Data Source API, 4.x):

* ``RabbitMQDataSource``: short-lived planner workers on the driver.
* ``QueueStreamReader`` (classic/quorum, a ``SimpleDataSourceStreamReader``): the one
  long-lived streaming-source process of the query on the driver; it keeps a consumer
  open between micro-batches and acks when Spark has committed a batch.
* ``StreamQueueReader`` (stream queues, and the partitions of a super stream): offsets
  are planned on the driver, offset ranges are read on executors (``read`` is stateless).
* Writers: ``write`` runs on executors, one connection per task.

Every reader hands Spark record batches (``pyarrow.RecordBatch``) built column by column
(:mod:`rabbitry.spark._arrow`). PySpark takes the output of ``DataSourceReader.read``,
``DataSourceStreamReader.read`` and ``SimpleDataSourceStreamReader.read`` (through its
prefetch cache) alike, passing record batches through as they are and converting tuples
value by value (``records_to_arrow_batches`` in PySpark 4.3), so no reader needs tuples.
The writers read Spark's Arrow batches column by column too.
"""

from __future__ import annotations

import dataclasses
import logging
import uuid
from typing import TYPE_CHECKING

from pyspark.errors import PySparkNotImplementedError
from pyspark.sql.datasource import (
    DataSource,
    DataSourceReader,
    DataSourceStreamReader,
    DataSourceStreamWriter,
    InputPartition,
    SimpleDataSourceStreamReader,
)

from ..exceptions import ConfigurationError
from ._batch import browse_share, consume_share
from ._batch_plan import plan_queue_read
from ._compat import ReadLimit, ReadMaxRows, SupportsTriggerAvailableNow
from ._core import (
    read_stream_range,
    resolve_start,
    split_range,
    stream_bounds,
    stream_first,
    stream_tail,
)
from ._options import ReadOptions, parse_read_options, parse_write_options
from ._queue_source import Offset, QueueStreamReader
from ._rows import READ_SCHEMA
from ._super import (
    check_partition_count,
    check_routing_type,
    check_write_schema,
    per_stream,
    share_limit,
)
from ._write import check_batch_columns
from ._writers import BatchWriter, PublishCommit, StreamWriter

if TYPE_CHECKING:
    from collections.abc import Iterator, Sequence

    from pyarrow import RecordBatch
    from pyspark.sql import SparkSession
    from pyspark.sql.types import StructType

    from ._limits import DeliveryLimit

__all__ = [
    "PublishCommit",
    "QueueStreamReader",
    "RabbitMQDataSource",
    "StreamQueueReader",
    "register",
]

logger = logging.getLogger("rabbitry.spark")


class RabbitMQDataSource(DataSource):
    """Format ``rabbitmq``: batch and streaming reads and writes of RabbitMQ queues.

    Options are documented in ``docs/spark.md``; they are validated when the query is
    planned, and errors name the option.
    """

    @classmethod
    def name(cls) -> str:
        return "rabbitmq"

    def schema(self) -> str:
        return READ_SCHEMA

    def _read_options(self) -> ReadOptions:
        return parse_read_options(self.options)

    def reader(self, schema: StructType) -> DataSourceReader:
        """The batch reader (``spark.read``); Spark calls it.

        Args:
            schema: the read schema (always this source's own).

        Returns:
            A reader of the messages ready in the queue.
        """
        return BatchReader(self._read_options())

    def streamReader(self, schema: StructType) -> DataSourceStreamReader:
        """The streaming reader of a stream queue (``spark.readStream``); Spark calls it.

        Args:
            schema: the read schema (always this source's own).

        Returns:
            A reader whose offsets are the stream's (exact replay).

        Raises:
            PySparkNotImplementedError: not a stream queue; Spark then calls
                :meth:`simpleStreamReader`.
        """
        options = self._read_options()
        if options.queue_type == "stream":
            return StreamQueueReader(options)
        # Spark falls back to simpleStreamReader() on exactly this exception type.
        raise PySparkNotImplementedError(
            errorClass="NOT_IMPLEMENTED",
            messageParameters={"feature": "streamReader for classic and quorum queues"},
        )

    def simpleStreamReader(self, schema: StructType) -> SimpleDataSourceStreamReader:
        """The streaming reader of a classic or quorum queue; Spark calls it.

        Args:
            schema: the read schema (always this source's own).

        Returns:
            A reader consuming in the driver, acknowledging on commit.

        Raises:
            PySparkNotImplementedError: a stream queue (:meth:`streamReader` reads it).
            ConfigurationError: ``numPartitions`` is not 1.
        """
        options = self._read_options()
        if options.queue_type == "stream":  # pragma: no cover - streamReader wins
            raise PySparkNotImplementedError(
                errorClass="NOT_IMPLEMENTED",
                messageParameters={"feature": "simpleStreamReader for stream queues"},
            )
        if options.num_partitions != 1:
            raise ConfigurationError(
                f"option numPartitions: a streaming read of a {options.queue_type} queue has "
                f"one consumer (in the driver), so numPartitions must be 1, got "
                f"{options.num_partitions}; repartition the stream, shard the queue into "
                "several queues (one query each), or use a stream queue"
            )
        return QueueStreamReader(options)

    def writer(self, schema: StructType, overwrite: bool) -> BatchWriter:
        """The batch writer (``df.write``); Spark calls it.

        Args:
            schema: the schema of the rows to publish.
            overwrite: Spark's overwrite flag; ignored (publishing only appends).

        Returns:
            A writer publishing each partition with confirms.
        """
        options = parse_write_options(self.options)
        check_write_schema(options, schema.fieldNames())
        check_batch_columns(options, schema.fieldNames())
        if options.super_stream is not None:
            check_routing_type(options, {f.name: f.dataType.simpleString() for f in schema.fields})
            check_partition_count(options.connect, options.super_stream)
        # One id for the whole job, made here on the driver and pickled into every task,
        # so a retried task publishes the same message ids as its failed attempt.
        job_id = options.job_id or uuid.uuid4().hex
        return BatchWriter(options, job_id)

    def streamWriter(self, schema: StructType, overwrite: bool) -> DataSourceStreamWriter:
        """The streaming writer (``df.writeStream``); Spark calls it.

        Args:
            schema: the schema of the rows to publish.
            overwrite: Spark's overwrite flag; ignored (publishing only appends).

        Returns:
            A writer publishing each micro-batch with confirms.
        """
        options = parse_write_options(self.options)
        check_write_schema(options, schema.fieldNames())
        check_batch_columns(options, schema.fieldNames())
        if options.super_stream is not None:
            check_routing_type(options, {f.name: f.dataType.simpleString() for f in schema.fields})
            check_partition_count(options.connect, options.super_stream)
        return StreamWriter(options)


def register(spark: SparkSession) -> None:
    """Register format ``rabbitmq`` in ``spark``.

    Not needed when the package is installed where Spark's Python runs:
    ``pyspark_rabbitmq`` registers it automatically.

    Args:
        spark: the session.
    """
    spark.dataSource.register(RabbitMQDataSource)


# ---------------------------------------------------------------- partitions


@dataclasses.dataclass
class OffsetRange(InputPartition):
    """Offsets ``[start, end)`` of a stream queue: ``stream``, or else the read's queue."""

    start: int
    end: int
    stream: str | None = None

    def __init__(self, start: int, end: int, stream: str | None = None) -> None:
        self.start = start
        self.end = end
        self.stream = stream


@dataclasses.dataclass
class QueueShare(InputPartition):
    """Positions ``[start, end)`` of a queue as planned (non-destructive batch read)."""

    start: int
    end: int
    #: Quorum queues: the delivery limit the planner learned.
    limit: DeliveryLimit | None = None

    def __init__(self, start: int, end: int, limit: DeliveryLimit | None = None) -> None:
        self.start = start
        self.end = end
        self.limit = limit


@dataclasses.dataclass
class QueueQuota(InputPartition):
    """Up to ``quota`` messages of a queue, consumed; row offsets from ``first_offset``."""

    quota: int
    first_offset: int

    def __init__(self, quota: int, first_offset: int) -> None:
        self.quota = quota
        self.first_offset = first_offset


# ---------------------------------------------------------------- batch read


class BatchReader(DataSourceReader):
    """Batch read: a stream's offset range, or the messages a queue held when planned.

    Queues are left as they were (``consume=requeue``, see :mod:`rabbitry.spark._batch`)
    unless ``consume=destructive``.
    """

    def __init__(self, options: ReadOptions) -> None:
        self.options = options

    def partitions(self) -> Sequence[InputPartition]:
        options = self.options
        if options.queue_type == "stream":
            if options.super_stream is not None:
                check_partition_count(options.connect, options.super_stream)
            # A super stream: each partition's range as a single stream's (maxMessages,
            # endingOffsets and numPartitions apply to each).
            result = []
            for stream, (start, end) in per_stream(options, stream_bounds).items():
                if options.max_messages is not None:
                    end = min(end, start + options.max_messages)
                ranges = split_range(start, end, options.num_partitions)
                result += [OffsetRange(low, high, stream) for low, high in ranges]
            return result or [OffsetRange(0, 0)]
        snapshot = plan_queue_read(options)
        total = snapshot.ready
        if options.max_messages is not None:
            total = min(total, options.max_messages)
        shares = split_range(0, total, options.num_partitions)
        logger.info(
            "rabbitmq batch read of %r: %d message(s) in %d partition(s) (consume=%s)",
            options.queue,
            total,
            len(shares),
            options.consume,
        )
        if options.consume == "destructive":
            return [QueueQuota(high - low, low) for low, high in shares] or [QueueQuota(0, 0)]
        limit = snapshot.delivery_limit
        return [QueueShare(low, high, limit) for low, high in shares] or [QueueShare(0, 0)]

    def read(self, partition: InputPartition) -> Iterator[RecordBatch]:
        if isinstance(partition, OffsetRange):
            options = self.options.for_stream(partition.stream or self.options.queue)
            return read_stream_range(options, partition.start, partition.end)
        if isinstance(partition, QueueShare):
            return browse_share(self.options, partition.start, partition.end, partition.limit)
        assert isinstance(partition, QueueQuota)
        return consume_share(self.options, partition.quota, partition.first_offset)


# ---------------------------------------------------------------- streaming: streams


class StreamQueueReader(DataSourceStreamReader, SupportsTriggerAvailableNow):
    """Stream queues: offsets planned on the driver, ranges read on executors, exact replay.

    One stream's offsets are ``{"offset": next}``. A super stream's (option
    ``superStream``) are ``{"partitions": {"<partition queue>": next, ...}}``: each
    partition is read as a single stream is, in its own input partitions, so its rows
    keep their order; ``maxRecordsPerTrigger`` is shared between the partitions
    (:func:`~rabbitry.spark._super.share_limit`).
    """

    def __init__(self, options: ReadOptions) -> None:
        self.options = options
        self._target: dict[str, int] | None = None
        #: First offsets found past removed ones when the last batch was planned.
        self._heads: dict[str, int] = {}
        if options.super_stream is not None:
            check_partition_count(options.connect, options.super_stream)

    def _offset(self, positions: dict[str, int]) -> Offset:
        if self.options.super_stream is None:
            return {"offset": positions[self.options.queue]}
        return {"partitions": positions}

    def _positions(self, offset: Offset) -> dict[str, int]:
        """``{stream: next offset}`` of an offset of this reader."""
        if self.options.super_stream is None:
            return {self.options.queue: int(offset["offset"])}
        given = offset.get("partitions")
        streams = self.options.streams
        if not isinstance(given, dict) or set(given) != set(streams):
            raise ConfigurationError(
                f"option superStream: the checkpoint's offsets are for partitions "
                f"{sorted(given) if isinstance(given, dict) else given!r}, not for "
                f"{list(streams)} (a checkpoint cannot be reused with other partitions)"
            )
        return {stream: int(given[stream]) for stream in streams}

    def initialOffset(self) -> Offset:
        return self._offset(per_stream(self.options, _start))

    def getDefaultReadLimit(self) -> ReadLimit:
        return ReadMaxRows(self.options.max_records_per_trigger)

    def prepareForTriggerAvailableNow(self) -> None:
        self._target = per_stream(self.options, stream_tail)

    def latestOffset(self, start: Offset | None = None, limit: ReadLimit | None = None) -> Offset:
        """Where the next micro-batch ends; Spark calls it.

        Args:
            start: where it starts (``None`` before Spark 4.2: no admission control).
            limit: the most rows it may hold (``maxRecordsPerTrigger``), shared between
                the partitions of a super stream.

        Returns:
            The stream offset after its last message (per partition).
        """
        tails = self._target if self._target is not None else per_stream(self.options, stream_tail)
        if start is None:  # Spark < 4.2: no admission control
            return self._offset(tails)
        begin = self._skip_removed(self._positions(start), tails)
        available = {s: max(0, tails[s] - begin[s]) for s in begin}
        max_rows = getattr(limit, "max_rows", None)
        if isinstance(max_rows, int):
            available = share_limit(available, max_rows)
        return self._offset({s: begin[s] + available[s] for s in begin})

    def _skip_removed(self, begin: dict[str, int], tails: dict[str, int]) -> dict[str, int]:
        """With ``failOnDataLoss=false``: where each stream's next batch really starts.

        Offsets that retention removed hold nothing to read; a batch planned from below
        a stream's first offset with a row limit would cover only removed offsets and
        come back empty, batch after batch, until its ranges reach the first offset
        still there. The first offset is probed instead and the batch starts from it
        (a WARNING names the offsets skipped); :meth:`partitions` splits only what is
        left. With ``failOnDataLoss=true`` the read of such a range fails instead.
        """
        self._heads = {}
        if self.options.fail_on_data_loss or all(begin[s] >= tails[s] for s in begin):
            return begin
        heads = per_stream(self.options, stream_first)
        moved = dict(begin)
        for stream, head in heads.items():
            if head > begin[stream] and begin[stream] < tails[stream]:
                logger.warning(
                    "rabbitmq source %r: offsets [%d, %d) are gone (retention: the stream "
                    "now starts at offset %d); skipped (failOnDataLoss=false)",
                    stream,
                    begin[stream],
                    head,
                    head,
                )
                moved[stream] = self._heads[stream] = min(head, tails[stream])
        return moved

    def partitions(self, start: Offset, end: Offset) -> Sequence[InputPartition]:
        """Split a micro-batch into offset ranges; Spark calls it.

        Args:
            start: the batch's first offset.
            end: the offset after it.

        Returns:
            ``numPartitions`` ranges per stream (each partition of a super stream),
            from the first offset still in the stream where the batch was planned
            past offsets retention removed (``failOnDataLoss=false``).
        """
        begin, finish = self._positions(start), self._positions(end)
        for stream, head in self._heads.items():
            begin[stream] = max(begin[stream], min(head, finish[stream]))
        n = self.options.num_partitions
        return [
            OffsetRange(low, high, stream)
            for stream in self.options.streams
            for low, high in split_range(begin[stream], finish[stream], n)
        ]

    def read(self, partition: InputPartition) -> Iterator[RecordBatch]:
        """Read one offset range, on an executor; Spark calls it.

        Args:
            partition: the range (from :meth:`partitions`).

        Returns:
            Its rows (record batches), in offset order.
        """
        assert isinstance(partition, OffsetRange)
        options = self.options.for_stream(partition.stream or self.options.queue)
        return read_stream_range(options, partition.start, partition.end)

    def commit(self, end: Offset) -> None:
        """Nothing to do: Spark's checkpoint is the source of truth for stream offsets.

        Args:
            end: the offset after the committed batch.
        """


def _start(options: ReadOptions) -> int:
    return resolve_start(options, options.starting_offsets)
