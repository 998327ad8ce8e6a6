"""A Spark driver run as a subprocess by the crash tests (they SIGKILL it).

Usage: python crash_driver.py CONFIG.json

CONFIG holds ``master`` (``local[2]`` or a ``spark://`` URL), ``cores`` (the
application's ``spark.cores.max``), ``block_at`` (a batch id, or -1) and ``queries``: for
each, ``options`` of ``format("rabbitmq")``, a ``checkpoint`` directory and an ``out``
directory. Every query runs at once with
``Trigger.AvailableNow`` and writes each micro-batch to ``out/batch-<id>.json``,
overwriting it (an idempotent sink keyed by batch id): one row ``[body as int,
redelivered, offset, queue]`` per message. When batch ``block_at`` starts, a query writes
``out/in-batch-<id>`` and sleeps, so the test can kill the driver inside that batch.
"""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path
from typing import Any


def _sink(out: Path, block_at: int) -> Any:
    def sink(batch: Any, batch_id: int) -> None:
        if batch_id == block_at:
            (out / f"in-batch-{batch_id}").write_text("")
            time.sleep(600)
        rows = [[int(bytes(r.body)), r.redelivered, r.offset, r.queue] for r in batch.collect()]
        tmp = out / f"batch-{batch_id}.json.tmp"
        tmp.write_text(json.dumps(rows))
        tmp.replace(out / f"batch-{batch_id}.json")

    return sink


def main() -> None:
    config = json.loads(Path(sys.argv[1]).read_text())
    from pyspark.sql import SparkSession

    spark = (
        SparkSession.builder.master(config["master"])
        .appName("rabbitry-crash-driver")
        .config("spark.ui.enabled", "false")
        .config("spark.ui.showConsoleProgress", "false")
        .config("spark.sql.shuffle.partitions", "2")
        .config("spark.driver.host", "127.0.0.1")
        .config("spark.executor.memory", "512m")
        .config("spark.executor.cores", "1")
        .config("spark.cores.max", str(config.get("cores", 2)))
        .getOrCreate()
    )
    spark.sparkContext.setLogLevel("ERROR")
    queries = []
    for query in config["queries"]:
        out = Path(query["out"])
        frame = spark.readStream.format("rabbitmq").options(**query["options"]).load()
        queries.append(
            frame.writeStream.foreachBatch(_sink(out, config["block_at"]))
            .option("checkpointLocation", query["checkpoint"])
            .trigger(availableNow=True)
            .start()
        )
    for running in queries:
        running.awaitTermination()
    spark.stop()


if __name__ == "__main__":
    main()
