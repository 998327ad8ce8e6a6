"""Cost of materialising rows in format("rabbitmq"): row tuples against Arrow batches.

Usage::

    PYTHONPATH=src .venv/bin/python bench/spark_arrow.py [ROWS]            # CPU only
    PYTHONPATH=src .venv/bin/python bench/spark_arrow.py --spark [ROWS]    # + local[2]

The first part needs neither Spark's JVM nor a broker. It builds ROWS deliveries (two
shapes: a bare 10-byte body, and a 100-byte body with headers, properties and a
timestamp) and times, per row:

* reads, before: :func:`~rabbitry.spark._rows.message_rows` tuples, then PySpark's own
  ``records_to_arrow_batches`` (what Spark's Python worker did with those tuples);
* reads, now: :class:`~rabbitry.spark._arrow.ArrowRows` record batches (Spark passes
  them through);
* writes, before: ``batch.to_pylist()`` and ``row_to_message`` per row dict;
* writes, now: ``batch_fields`` (one ``to_pylist`` per column) and ``fields_to_message``.

``--spark`` then publishes ROWS messages to a classic queue and reads them on
``local[2]`` into the noop sink: a streaming read (AvailableNow, 10,000 per micro-batch;
steady rate without the first micro-batch) and a batch read (``spark.read``, one
partition, leaves the queue as it was). It uses only the public format, so it can time an
older checkout too (``PYTHONPATH=<old>/src``). Results: docs/benchmarks.md "Spark".
"""

from __future__ import annotations

import os
import sys
import tempfile
import time
import uuid
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from collections.abc import Callable

os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")


def _deliveries(count: int, rich: bool) -> list[Any]:
    from rabbitry.protocol.message import Message
    from rabbitry.protocol.spec import BasicProperties

    when = datetime(2026, 1, 2, 3, 4, 5, tzinfo=UTC)
    messages = []
    for n in range(count):
        if rich:
            body = b'{"order": %08d, "sku": "A-1234", "qty": 3, "note": "%s"}' % (n, b"x" * 40)
            props = BasicProperties(
                content_type="application/json",
                delivery_mode=2,
                message_id=f"m-{n}",
                timestamp=when,
                app_id="bench",
                headers={"source": "bench", "attempt": 1, "trace": {"id": n}},
            )
        else:
            body = b'{"n": %05d}' % (n % 100_000)
            props = BasicProperties()
        messages.append(
            Message(body=body, properties=props, delivery_tag=n + 1, routing_key="bench-q")
        )
    return messages


def _best(run: Callable[[], object], repeat: int = 3) -> float:
    best = float("inf")
    for _ in range(repeat):
        start = time.perf_counter()
        run()
        best = min(best, time.perf_counter() - start)
    return best


def cpu(rows: int) -> None:
    import pyarrow as pa
    from pyspark.sql.datasource import DataSource
    from pyspark.sql.pandas.types import from_arrow_schema
    from pyspark.sql.worker.plan_data_source_read import records_to_arrow_batches

    from rabbitry.spark._arrow import READ_ARROW_SCHEMA, ArrowRows, batch_fields
    from rabbitry.spark._rows import fields_to_message, message_rows, row_to_message

    class Source(DataSource):
        @classmethod
        def name(cls) -> str:
            return "rabbitmq"

    spark_schema = from_arrow_schema(READ_ARROW_SCHEMA)
    source = Source({})

    print(f"{rows:,} rows, best of 3, µs per row (CPU only: no JVM, no broker)")
    print(
        "| deliveries | read: tuples | read: tuples → Spark's Arrow | read: Arrow batches "
        "| × | write: dict per row | write: columns | × |"
    )
    print("|---|---:|---:|---:|---:|---:|---:|---:|")
    for rich in (False, True):
        messages = _deliveries(rows, rich)

        def tuples(messages: list[Any] = messages) -> list[tuple[Any, ...]]:
            out: list[tuple[Any, ...]] = []
            for offset, message in enumerate(messages):
                out.extend(message_rows(message, "bench-q", offset, consecutive=True))
            return out

        def before() -> list[Any]:
            return list(records_to_arrow_batches(iter(tuples()), 10_000, spark_schema, source))

        def now(messages: list[Any] = messages) -> list[Any]:
            builder = ArrowRows("bench-q")
            batches = []
            for offset, message in enumerate(messages):
                builder.add(message, offset, consecutive=True)
                batches.extend(builder.ready())
            batches.extend(builder.finish())
            return batches

        old_batches, new_batches = before(), now()
        assert pa.Table.from_batches(old_batches).equals(pa.Table.from_batches(new_batches))
        t_tuples, t_before, t_now = _best(tuples), _best(before), _best(now)

        # The write side takes what a read gives: body, routing key, headers, properties.
        write_batches = [
            b.select(["body", "routing_key", "headers", "properties"]) for b in new_batches
        ]
        props = READ_ARROW_SCHEMA.field("properties").type
        assert all(b.schema.field("properties").type == props for b in write_batches)

        def write_before(write_batches: list[Any] = write_batches) -> None:
            for batch in write_batches:
                for index, row in enumerate(batch.to_pylist()):
                    row_to_message(row, "", "", f"j:0:{index}")

        def write_now(write_batches: list[Any] = write_batches) -> None:
            for index, fields in enumerate(batch_fields(write_batches)):
                fields_to_message(fields, "", "", f"j:0:{index}")

        w_before, w_now = _best(write_before), _best(write_now)
        us = 1e6 / rows
        print(
            f"| {'100 B, headers, properties' if rich else '10 B, bare'} "
            f"| {t_tuples * us:.2f} | {t_before * us:.2f} | {t_now * us:.2f} "
            f"| {t_before / t_now:.1f} | {w_before * us:.2f} | {w_now * us:.2f} "
            f"| {w_before / w_now:.1f} |",
            flush=True,
        )


def spark(rows: int) -> None:
    from pyspark.sql import SparkSession

    import rabbitry
    from rabbitry.config import default_url

    print(f"\nlocal[2], {rows:,} messages of about 10 bytes, rabbitry from {rabbitry.__file__}")
    session = (
        SparkSession.builder.master("local[2]")
        .config("spark.ui.enabled", "false")
        .config("spark.ui.showConsoleProgress", "false")
        .config("spark.driver.host", "127.0.0.1")
        .config("spark.sql.shuffle.partitions", "2")
        .getOrCreate()
    )
    session.sparkContext.setLogLevel("ERROR")
    conn = rabbitry.Connection(default_url())
    conn.connect()
    channel = conn.channel()
    queue = f"bench-spark-arrow-{uuid.uuid4().hex[:6]}"
    channel.queue_declare(queue, durable=True)
    try:
        with conn.publisher(max_in_flight=5000) as publisher:
            for low in range(0, rows, 10_000):
                bodies = [b'{"n": %d}' % n for n in range(low, min(rows, low + 10_000))]
                assert not any(publisher.publish_batch(bodies, routing_key=queue))
        reader = session.read.format("rabbitmq").option("queue", queue)
        reader.load().write.format("noop").mode("overwrite").save()  # warm the workers
        start = time.perf_counter()
        reader.load().write.format("noop").mode("overwrite").save()
        rate = rows / (time.perf_counter() - start)
        print(f"batch read (1 partition, queue left as it was): {rate:,.0f} rows/s", flush=True)
        with tempfile.TemporaryDirectory() as tmp:
            query = (
                session.readStream.format("rabbitmq")
                .option("queue", queue)
                .option("maxMessagesPerBatch", "10000")
                .option("prefetch", "20000")
                .load()
                .writeStream.format("noop")
                .option("checkpointLocation", tmp)
                .trigger(availableNow=True)
                .start()
            )
            query.awaitTermination()
            batches = [p for p in query.recentProgress if p["numInputRows"]]
            rest = batches[1:] or batches
            steady = sum(p["numInputRows"] for p in rest) / (
                sum(p["durationMs"]["triggerExecution"] for p in rest) / 1000
            )
            total = sum(p["numInputRows"] for p in batches)
            print(
                f"streaming read (AvailableNow, 10,000 per batch): {total:,} rows, "
                f"steady {steady:,.0f} rows/s ({len(batches)} batches)",
                flush=True,
            )
            # Where a steady micro-batch spends its time (ms, mean): latestOffset is the
            # source's read (drain and build the rows), addBatch the sink's job.
            phases = sorted({k for p in rest for k in p["durationMs"]})
            spent = {k: sum(p["durationMs"].get(k, 0) for p in rest) / len(rest) for k in phases}
            print("  ms per batch: " + ", ".join(f"{k} {v:.0f}" for k, v in spent.items()))
    finally:
        channel.queue_delete(queue)
        conn.close()
        session.stop()


def main() -> None:
    args = [a for a in sys.argv[1:] if a != "--spark"]
    rows = int(args[0]) if args else 50_000
    if "--spark" in sys.argv[1:]:
        try:
            import rabbitry.spark._arrow  # noqa: F401
        except ImportError:  # an older checkout: only the Spark part applies
            spark(rows)
            return
        cpu(rows)
        spark(rows)
    else:
        cpu(rows)


if __name__ == "__main__":
    main()
