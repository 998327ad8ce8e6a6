"""PySpark data source ``rabbitmq`` (extra ``rabbitry[spark]``: pyspark ≥ 4.0 and pyarrow).

Usage::

    # move a queue into a table: a streaming job, acked only after Spark commits
    (spark.readStream.format("rabbitmq").option("queue", "events").load()
        .writeStream.option("checkpointLocation", "/chk").trigger(availableNow=True)
        .toTable("events"))
    # look at a queue: a batch read returns what is ready and leaves it in the queue
    df = spark.read.format("rabbitmq").option("queue", "events").load()
    df.write.format("rabbitmq").option("routingKey", "out").mode("append").save()

The format registers itself wherever rabbitry is installed (the top-level module
``pyspark_rabbitmq``); :func:`register` does it explicitly. Install the package on the
driver and on every executor. Guarantees and options: ``docs/spark.md``.
"""

from ._batch import DeliveryCountRefused, DeliveryLimitReached, QueueBusy, ReadInterrupted
from ._core import (
    BrokerUnavailable,
    DataLossError,
    PublishFailed,
    ReplayUnavailable,
    SourceCancelled,
)
from ._options import ConnectOptions, ReadOptions, WriteOptions, trace_options
from ._restart import DeliveryLimitRefused
from ._write import UnroutableRows
from .datasource import (
    PublishCommit,
    QueueStreamReader,
    RabbitMQDataSource,
    StreamQueueReader,
    register,
)

__all__ = [
    "BrokerUnavailable",
    "ConnectOptions",
    "DataLossError",
    "DeliveryCountRefused",
    "DeliveryLimitReached",
    "DeliveryLimitRefused",
    "PublishCommit",
    "PublishFailed",
    "QueueBusy",
    "QueueStreamReader",
    "RabbitMQDataSource",
    "ReadInterrupted",
    "ReadOptions",
    "ReplayUnavailable",
    "SourceCancelled",
    "StreamQueueReader",
    "UnroutableRows",
    "WriteOptions",
    "register",
    "trace_options",
]
