"""PySpark data source ``rabbitmq`` (extra ``rabbitry[spark]``: pyspark ≥ 4.0 and pyarrow).

Usage::

    df = spark.read.format("rabbitmq").option("queue", "events").load()
    (spark.readStream.format("rabbitmq").option("queue", "events").load()
        .writeStream.option("checkpointLocation", "/chk").toTable("events"))
    df.write.format("rabbitmq").option("routingKey", "out").mode("append").save()

The format registers itself wherever rabbitry is installed (the top-level module
``pyspark_rabbitmq``); :func:`register` does it explicitly. Install the package on the
driver and on every executor. Guarantees and options: ``docs/spark.md``.
"""

from ._options import ConnectOptions, ReadOptions, WriteOptions
from .datasource import (
    PublishCommit,
    QueueStreamReader,
    RabbitMQDataSource,
    StreamQueueReader,
    register,
)

__all__ = [
    "ConnectOptions",
    "PublishCommit",
    "QueueStreamReader",
    "RabbitMQDataSource",
    "ReadOptions",
    "StreamQueueReader",
    "WriteOptions",
    "register",
]
