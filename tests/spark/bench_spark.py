"""Throughput of format("rabbitmq") on local[2] (not a test; docs/benchmarks.md "Spark").

Usage: .venv/bin/python tests/spark/bench_spark.py [ROWS]

Writes ROWS rows with confirms, drains a classic queue and reads a stream queue
(2 partitions) with AvailableNow into the noop sink. Steady-state rates exclude the first
micro-batch (Python workers and the streaming runner start there): sum of rows over sum
of triggerExecution of the later batches, from query.recentProgress.
"""

from __future__ import annotations

import os
import sys
import tempfile
import time
import uuid
from typing import TYPE_CHECKING, Any

os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")

import rabbitry
from rabbitry.config import default_url

if TYPE_CHECKING:
    from collections.abc import Sequence

URL = default_url()


def steady(progress: Sequence[Any]) -> tuple[float, float, int]:
    batches = [p for p in progress if p["numInputRows"]]
    rest = batches[1:] or batches
    rows = sum(p["numInputRows"] for p in rest)
    ms = sum(p["durationMs"]["triggerExecution"] for p in rest)
    total_ms = sum(p["durationMs"]["triggerExecution"] for p in batches)
    overall = sum(p["numInputRows"] for p in batches) / (total_ms / 1000)
    return rows / (ms / 1000), overall, len(batches)


def publish(conn: rabbitry.Connection, queue: str, count: int) -> float:
    start = time.perf_counter()
    with conn.publisher(max_in_flight=5000) as publisher:
        for low in range(0, count, 10_000):
            bodies = [b'{"n": %d}' % n for n in range(low, min(count, low + 10_000))]
            assert not any(publisher.publish_batch(bodies, routing_key=queue))
    return count / (time.perf_counter() - start)


def main() -> None:
    rows = int(sys.argv[1]) if len(sys.argv) > 1 else 100_000
    from pyspark.sql import SparkSession

    spark = (
        SparkSession.builder.master("local[2]")
        .config("spark.ui.enabled", "false")
        .config("spark.driver.host", "127.0.0.1")
        .config("spark.sql.shuffle.partitions", "2")
        .getOrCreate()
    )
    spark.sparkContext.setLogLevel("ERROR")
    conn = rabbitry.Connection(URL)
    conn.connect()
    channel = conn.channel()
    names = [f"bench-spark-{k}-{uuid.uuid4().hex[:6]}" for k in ("w", "c", "s")]
    wq, cq, sq = names
    channel.queue_declare(wq, durable=True)
    channel.queue_declare(cq, durable=True)
    channel.queue_declare(sq, durable=True, arguments={"x-queue-type": "stream"})
    try:
        df = spark.range(rows).repartition(2).selectExpr("cast(id as string) as body").cache()
        df.count()
        for attempt in ("cold", "warm"):
            channel.queue_purge(wq)
            start = time.perf_counter()
            df.write.format("rabbitmq").option("routingKey", wq).mode("append").save()
            rate = rows / (time.perf_counter() - start)
            print(f"write {attempt}: {rate:,.0f} rows/s (2 partitions, confirms)", flush=True)

        rate = publish(conn, cq, rows)
        print(f"broker publish (rabbitry Publisher.publish_batch, 1 thread): {rate:,.0f} msg/s")
        with tempfile.TemporaryDirectory() as tmp:
            query = (
                spark.readStream.format("rabbitmq")
                .option("queue", cq)
                .option("maxMessagesPerBatch", "20000")
                .option("prefetch", "40000")
                .load()
                .writeStream.format("noop")
                .option("checkpointLocation", tmp)
                .trigger(availableNow=True)
                .start()
            )
            query.awaitTermination()
            rate, overall, n = steady(query.recentProgress)
            print(f"classic read: steady {rate:,.0f} rows/s, overall {overall:,.0f} ({n} batches)")

        publish(conn, sq, rows)
        time.sleep(1)
        with tempfile.TemporaryDirectory() as tmp:
            query = (
                spark.readStream.format("rabbitmq")
                .option("queue", sq)
                .option("queueType", "stream")
                .option("maxRecordsPerTrigger", "25000")
                .option("numPartitions", "2")
                .option("prefetch", "5000")
                .load()
                .writeStream.format("noop")
                .option("checkpointLocation", tmp)
                .trigger(availableNow=True)
                .start()
            )
            query.awaitTermination()
            rate, overall, n = steady(query.recentProgress)
            print(f"stream read: steady {rate:,.0f} rows/s, overall {overall:,.0f} ({n} batches)")

        # Raw rate of the same stream through rabbitry (own connection, closed without
        # cancel: a reject on a stream queue closes the connection).
        import queue as queue_module

        inbox: queue_module.SimpleQueue[Any] = queue_module.SimpleQueue()
        raw = rabbitry.Connection(URL)
        raw.connect()
        consumer = raw.channel()
        consumer.basic_qos(5000)
        start = time.perf_counter()
        consumer.basic_consume(sq, inbox.put, arguments={"x-stream-offset": "first"})
        for seen in range(1, rows + 1):
            message = inbox.get(timeout=10)
            if seen % 2500 == 0:
                consumer.basic_ack(message.delivery_tag, multiple=True)
        rate = rows / (time.perf_counter() - start)
        raw.close()
        print(f"broker stream consume (rabbitry basic_consume, 1 thread): {rate:,.0f} msg/s")
    finally:
        for name in names:
            channel.queue_delete(name)
        conn.close()
        spark.stop()


if __name__ == "__main__":
    main()
