"""A Spark driver run as a subprocess by test_spark_crash.py (it gets SIGKILLed).

Usage: python crash_driver.py QUEUE QUEUE_TYPE CHECKPOINT OUTDIR SLOW_BATCH

Reads QUEUE with format("rabbitmq") in batches of 1000 (AvailableNow) and writes every
micro-batch to OUTDIR/batch-<id>.json, overwriting (an idempotent sink keyed by batch
id). With SLOW_BATCH >= 0 it writes OUTDIR/in-batch-<n> and sleeps when batch n starts,
so the test can kill it inside that batch.
"""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path
from typing import Any


def main() -> None:
    queue, queue_type, checkpoint, outdir, slow = sys.argv[1:6]
    out = Path(outdir)
    slow_batch = int(slow)
    from pyspark.sql import SparkSession

    spark = (
        SparkSession.builder.master("local[2]")
        .config("spark.ui.enabled", "false")
        .config("spark.sql.shuffle.partitions", "2")
        .config("spark.driver.host", "127.0.0.1")
        .getOrCreate()
    )
    spark.sparkContext.setLogLevel("ERROR")

    def sink(batch: Any, batch_id: int) -> None:
        if batch_id == slow_batch:
            (out / f"in-batch-{batch_id}").write_text("")
            time.sleep(600)
        rows = [[int(bytes(r.body)), r.redelivered, r.offset] for r in batch.collect()]
        tmp = out / f"batch-{batch_id}.json.tmp"
        tmp.write_text(json.dumps(rows))
        tmp.replace(out / f"batch-{batch_id}.json")

    reader = (
        spark.readStream.format("rabbitmq")
        .option("queue", queue)
        .option("queueType", queue_type)
        .option("maxMessagesPerBatch", "1000")
        .option("maxRecordsPerTrigger", "1000")
    )
    if queue_type == "stream":  # offset ranges read in parallel; a queue has one consumer
        reader = reader.option("numPartitions", "2")
    query = (
        reader.load()
        .writeStream.foreachBatch(sink)
        .option("checkpointLocation", checkpoint)
        .trigger(availableNow=True)
        .start()
    )
    query.awaitTermination()
    spark.stop()


if __name__ == "__main__":
    main()
