"""Rows/s through format("rabbitmq") against the broker's own rate, in one run.

Usage (``make bench-spark`` runs it with ``SPARK_BENCH_ARGS``)::

    PYTHONPATH=src .venv/bin/python bench/spark_bench.py                 # 100,000 rows
    PYTHONPATH=src .venv/bin/python bench/spark_bench.py --rows 10000    # a quick run

One broker; the targets are measured on ``--master`` (default ``local[2]``), then on a
Spark standalone cluster of ``--cluster`` one-core workers (default 2; 0 leaves it out)
started on 127.0.0.1 for the run (``tests/support/spark_standalone.py``). In this order:

1. The reference, rabbitry's channel API on one connection: ROWS persistent messages
   published to a classic queue with pipelined confirms (window 1000, the sink's
   ``maxInFlight``), then consumed from it (prefetch as the source's, multiple acks).
2. On each master, a warm-up: a small write and a streaming read of a scratch queue, so
   that Spark's executors, Python workers and streaming machinery are started before
   anything is timed. Then, for each target (a classic queue, a stream queue, a super stream of each
   ``--partitions`` count): a batch write of ROWS rows (bodies of ``--body-bytes``,
   2 Spark partitions; a super stream is written by a key column,
   ``partitionKeyColumn``), then a streaming read of them with ``Trigger.AvailableNow``
   into the noop sink (``--batch`` rows per micro-batch: ``maxMessagesPerBatch`` of the
   queue, ``maxRecordsPerTrigger`` of the streams, shared by a super stream's partitions).

Rates are rows over wall-clock seconds: the write's ``save()``; the read from
``start()`` to the end of ``awaitTermination()`` (query start-up included). "steady" is
the read without its first micro-batch (rows over the later batches' triggerExecution).
The table is printed as Markdown with each rate's ratio to the reference, then, for
each master, the read rate of each super stream over the single stream's (what the
partitions scale to); nothing is written to a file. Every entity is deleted at the end.
"""

from __future__ import annotations

import argparse
import collections
import dataclasses
import os
import platform
import queue as queue_module
import sys
import tempfile
import time
import uuid
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from collections.abc import Sequence

    import rabbitry

ROOT = Path(__file__).resolve().parents[1]

#: Unconfirmed messages of the reference publisher: the sink's ``maxInFlight`` default.
CONFIRM_WINDOW = 1000
#: Rows of the warm-up write and read.
WARMUP_ROWS = 1000
#: Longest wait for one delivery of the reference consumer.
CONSUME_WAIT = 30.0


@dataclasses.dataclass(frozen=True)
class Options:
    """What to run (``parse_args``)."""

    rows: int = 100_000
    body_bytes: int = 128
    partitions: tuple[int, ...] = (2, 4)
    batch: int = 25_000
    master: str = "local[2]"
    cluster: int = 2
    url: str | None = None
    #: Added latency of the remote-broker row, each way, in ms (0: no such row).
    remote_ms: float = 2.0
    remote_partitions: tuple[int, ...] = (1, 2, 4)
    remote_master: str = "local[4]"
    #: Measure only the remote-broker row (no reference, no local/cluster targets).
    remote_only: bool = False


@dataclasses.dataclass(frozen=True)
class Target:
    """A destination written to and read back through the data source."""

    kind: str  # "classic", "stream" or "super"
    partitions: int = 0

    @property
    def label(self) -> str:
        if self.kind == "super":
            return f"super stream, {self.partitions} partitions"
        return "classic queue" if self.kind == "classic" else "stream queue"


@dataclasses.dataclass
class Result:
    """One line of the table: rates in rows (messages) per second."""

    label: str
    write: float
    read: float
    steady: float | None = None
    batches: int = 0


def targets(options: Options) -> list[Target]:
    """The targets of a run, in the order they are measured."""
    return [
        Target("classic"),
        Target("stream"),
        *(Target("super", n) for n in options.partitions),
    ]


def _positive(text: str) -> int:
    try:
        value = int(text.replace("_", ""))
    except ValueError:
        raise argparse.ArgumentTypeError(f"an integer >= 1 expected, got {text!r}") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be >= 1, got {value}")
    return value


def _partition_counts(text: str) -> tuple[int, ...]:
    counts = tuple(_positive(part.strip()) for part in text.split(",") if part.strip())
    if not counts:
        raise argparse.ArgumentTypeError("give at least one partition count, e.g. 2,4")
    if len(set(counts)) != len(counts):
        raise argparse.ArgumentTypeError(f"each count once, got {text!r}")
    return counts


def parse_args(argv: Sequence[str] | None = None) -> Options:
    """The options of a run; exits with status 2 and the option's name on a bad value."""
    defaults = Options()
    parser = argparse.ArgumentParser(
        prog="bench/spark_bench.py",
        description="Rows/s written and read through format('rabbitmq') (classic queue, "
        "stream, super streams) next to rabbitry's own single-connection rate.",
    )
    parser.add_argument(
        "--rows", type=_positive, default=defaults.rows, help="rows per target (and reference)"
    )
    parser.add_argument(
        "--body-bytes", type=_positive, default=defaults.body_bytes, help="bytes per body"
    )
    parser.add_argument(
        "--partitions",
        type=_partition_counts,
        default=defaults.partitions,
        help="super stream partition counts, comma-separated (default 2,4)",
    )
    parser.add_argument(
        "--batch",
        type=_positive,
        default=defaults.batch,
        help="rows per micro-batch of the reads (at most 65535)",
    )
    parser.add_argument("--master", default=defaults.master, help="Spark master")
    parser.add_argument(
        "--cluster",
        type=int,
        default=defaults.cluster,
        help="workers (one core each) of the standalone cluster measured after --master; "
        "0: none (default 2)",
    )
    parser.add_argument("--url", help="broker URL (default: RABBITMQ_URL or the local broker)")
    parser.add_argument(
        "--remote-ms",
        type=float,
        default=defaults.remote_ms,
        help="latency added each way by a TCP proxy for the remote-broker row, in ms "
        "(default 2; 0 leaves the row out)",
    )
    parser.add_argument(
        "--remote-partitions",
        type=_partition_counts,
        default=defaults.remote_partitions,
        help="super stream partition counts of the remote-broker row (default 1,2,4)",
    )
    parser.add_argument(
        "--remote-master",
        default=defaults.remote_master,
        help="Spark master of the remote-broker row (default local[4]: a task slot per partition)",
    )
    parser.add_argument(
        "--remote-only", action="store_true", help="measure only the remote-broker row"
    )
    args = parser.parse_args(argv)
    if args.batch > 65535:
        # The queue read's prefetch must hold a whole micro-batch (prefetch <= 65535).
        parser.error(f"argument --batch: at most 65535 (the prefetch limit), got {args.batch}")
    if not args.master.strip():
        parser.error("argument --master: must not be empty")
    if args.cluster < 0:
        parser.error(f"argument --cluster: must be >= 0, got {args.cluster}")
    if not 0 <= args.remote_ms <= 1000:
        parser.error(f"argument --remote-ms: must be in 0..1000, got {args.remote_ms}")
    if not args.remote_master.strip():
        parser.error("argument --remote-master: must not be empty")
    if args.remote_only and args.remote_ms == 0:
        parser.error("argument --remote-only: needs --remote-ms above 0")
    return Options(
        rows=args.rows,
        body_bytes=args.body_bytes,
        partitions=args.partitions,
        batch=args.batch,
        master=args.master,
        cluster=args.cluster,
        url=args.url,
        remote_ms=args.remote_ms,
        remote_partitions=args.remote_partitions,
        remote_master=args.remote_master,
        remote_only=args.remote_only,
    )


def _ratio(rate: float, reference: float) -> str:
    return f"{rate / reference:.2f}" if reference > 0 else "-"


def _rate(value: float | None) -> str:
    if value is None:
        return "-"
    return f"{value / 1000:,.1f}k" if value >= 1000 else f"{value:,.0f}"


def render(reference: Result, results: Sequence[Result], header: Sequence[str]) -> str:
    """The run as Markdown: the header lines, then one table row per target.

    Args:
        reference: the broker's own rates (``write``: publish, ``read``: consume).
        results: the data source's rates, one per target.
        header: lines printed above the table (what was run, where, the load).

    Returns:
        The text to print.
    """
    lines = [*header, ""]
    lines.append(
        "| target | write rows/s | ÷ broker publish | read rows/s | ÷ broker consume "
        "| read steady rows/s | micro-batches |"
    )
    lines.append("|---|---:|---:|---:|---:|---:|---:|")
    lines.append(
        f"| {reference.label} | {_rate(reference.write)} | 1.00 | {_rate(reference.read)} "
        "| 1.00 | - | - |"
    )
    for r in results:
        lines.append(
            f"| {r.label} | {_rate(r.write)} | {_ratio(r.write, reference.write)} "
            f"| {_rate(r.read)} | {_ratio(r.read, reference.read)} | {_rate(r.steady)} "
            f"| {r.batches} |"
        )
    scaling = [
        f"* {label}: read ÷ the stream queue's read {_ratio(r.read, single.read)}"
        for r in results
        for label, single in _single_stream_of(r, results)
    ]
    if scaling:
        lines += ["", *scaling]
    return "\n".join(lines)


@dataclasses.dataclass
class RemoteResult:
    """One partition count of the remote-broker row."""

    partitions: int
    read: float
    cpu_us_per_row: float
    steady: float | None = None
    batches: int = 0


def render_remote(results: Sequence[RemoteResult], latency_ms: float, master: str) -> str:
    """The remote-broker row as Markdown: each partition count's read rate, its ratio to
    one partition's, and the client's CPU per row.

    Args:
        results: one per partition count, in the order measured.
        latency_ms: the latency the proxy added each way.
        master: the Spark master of the reads.

    Returns:
        The text to print.
    """
    base = next((r.read for r in results if r.partitions == 1), 0.0)
    lines = [
        f"Remote broker: super streams read through a TCP proxy adding {latency_ms:g} ms "
        f"each way, on {master}",
        "",
        "| partitions | read rows/s | ÷ 1 partition | read steady rows/s | client CPU µs/row "
        "| micro-batches |",
        "|---:|---:|---:|---:|---:|---:|",
    ]
    for r in results:
        lines.append(
            f"| {r.partitions} | {_rate(r.read)} | {_ratio(r.read, base)} | {_rate(r.steady)} "
            f"| {r.cpu_us_per_row:,.1f} | {r.batches} |"
        )
    return "\n".join(lines)


def tree_cpu(root: int) -> float:
    """CPU seconds (user and system) used by the processes below ``root`` (Linux).

    Every descendant's own time and that of the children it reaped: Spark's JVM, its
    Python daemon and workers, not ``root`` itself (which runs the proxy).

    Args:
        root: a process id.

    Returns:
        Seconds; compare two readings.
    """
    parents: dict[int, int] = {}
    ticks: dict[int, int] = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            stat = Path(f"/proc/{entry}/stat").read_text()
        except OSError:
            continue  # gone meanwhile
        fields = stat.rsplit(")", 1)[1].split()
        parents[int(entry)] = int(fields[1])
        # utime, stime, cutime, cstime: fields 14-17 of proc(5), here from the state on.
        ticks[int(entry)] = sum(int(value) for value in fields[11:15])
    below: set[int] = set()
    frontier = [root]
    while frontier:
        parent = frontier.pop()
        children = [pid for pid, ppid in parents.items() if ppid == parent and pid not in below]
        below.update(children)
        frontier += children
    return sum(ticks[pid] for pid in below) / os.sysconf("SC_CLK_TCK")


def measure_remote(
    conn: rabbitry.Connection, url: str, options: Options, run_id: str
) -> list[RemoteResult]:
    """Read super streams of each ``--remote-partitions`` count through a latency proxy.

    The rows are written straight to the broker; only the reads go through the proxy,
    which adds ``--remote-ms`` to every chunk in each direction, like a broker a few
    hundred kilometres away. A warm-up read through the proxy, of as many partitions as
    the widest read, comes first (it starts the Python workers the reads use).
    """
    sys.path.insert(0, str(ROOT))
    from tests.support.proxy import TcpProxy

    from rabbitry.config import parse_urls

    params = parse_urls([url])[0]
    spark = _session(options.remote_master)
    results = []
    try:
        with TcpProxy(params.host, params.port) as proxy:
            proxy.latency(options.remote_ms / 1000.0)
            far = proxy.url(params.username, params.password)
            # As many partitions as the widest read: each starts a Python worker.
            warm = Target("super", max(options.remote_partitions))
            warm_name = f"bench-spark.{run_id}.remote.warmup"
            topology = _declare(conn, warm, warm_name)
            try:
                warm_frame = _frame(spark, WARMUP_ROWS, options.body_bytes)
                spark_write(warm_frame, WARMUP_ROWS, warm, warm_name, url)
                warm_options = dataclasses.replace(options, rows=WARMUP_ROWS)
                spark_read(spark, warm, warm_name, far, warm_options)
            finally:
                topology.delete(conn)
            frame = _frame(spark, options.rows, options.body_bytes)
            frame.count()
            for count in options.remote_partitions:
                target = Target("super", count)
                name = f"bench-spark.{run_id}.remote.super{count}"
                topology = _declare(conn, target, name)
                try:
                    spark_write(frame, options.rows, target, name, url)
                    cpu = tree_cpu(os.getpid())
                    read = spark_read(spark, target, name, far, options)
                    used = tree_cpu(os.getpid()) - cpu
                finally:
                    topology.delete(conn)
                result = RemoteResult(
                    count, read.read, used / options.rows * 1e6, read.steady, read.batches
                )
                results.append(result)
                print(
                    f"remote, {count} partition(s): read {_rate(result.read)}/s, "
                    f"{result.cpu_us_per_row:,.1f} µs CPU per row",
                    flush=True,
                )
    finally:
        spark.stop()
    return results


def _single_stream_of(result: Result, results: Sequence[Result]) -> list[tuple[str, Result]]:
    """``result`` (a super stream's) with the stream queue's of the same master, if any."""
    where, _, what = result.label.rpartition(": ")
    if not what.startswith("super stream"):
        return []
    prefix = f"{where}: " if where else ""
    single = [r for r in results if r.label == f"{prefix}stream queue"]
    return [(result.label, single[0])] if single else []


# ---------------------------------------------------------------- the broker's own rate


def _body(index: int, size: int) -> bytes:
    # The same bodies as the DataFrame's lpad(cast(id AS STRING), size, '0').
    return str(index).rjust(size, "0")[:size].encode()


def broker_publish(conn: rabbitry.Connection, queue: str, rows: int, size: int) -> float:
    """Publish ``rows`` persistent messages with pipelined confirms; messages/s."""
    from rabbitry.protocol.spec import BasicProperties

    channel = conn.channel()
    try:
        channel.confirm_select()
        window: collections.deque[Any] = collections.deque()
        start = time.perf_counter()
        for index in range(rows):
            props = BasicProperties(delivery_mode=2, message_id=f"ref:{index}")
            window.append(
                channel.basic_publish(
                    "", queue, _body(index, size), properties=props, mandatory=True
                )
            )
            if len(window) >= CONFIRM_WINDOW:
                window.popleft().result(timeout=60)
        for future in window:
            future.result(timeout=60)
        return rows / (time.perf_counter() - start)
    finally:
        channel.close()


def broker_consume(conn: rabbitry.Connection, queue: str, rows: int, prefetch: int) -> float:
    """Consume ``rows`` messages, acknowledging in groups; messages/s."""
    channel = conn.channel()
    try:
        channel.basic_qos(prefetch)
        inbox: queue_module.SimpleQueue[Any] = queue_module.SimpleQueue()
        every = max(1, prefetch // 2)
        start = time.perf_counter()
        channel.basic_consume(queue, inbox.put)
        for seen in range(1, rows + 1):
            try:
                message = inbox.get(timeout=CONSUME_WAIT)
            except queue_module.Empty:
                raise SystemExit(
                    f"reference consume: only {seen - 1} of {rows} messages arrived"
                ) from None
            if seen % every == 0 or seen == rows:
                channel.basic_ack(message.delivery_tag, multiple=True)
        return rows / (time.perf_counter() - start)
    finally:
        channel.close()


# ---------------------------------------------------------------- through Spark


def _session(master: str) -> Any:
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    os.environ.setdefault("PYSPARK_DRIVER_PYTHON", sys.executable)
    os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
    from pyspark.sql import SparkSession

    spark = (
        SparkSession.builder.master(master)
        .appName("rabbitry-spark-bench")
        .config("spark.ui.enabled", "false")
        .config("spark.ui.showConsoleProgress", "false")
        .config("spark.driver.host", "127.0.0.1")
        .config("spark.sql.shuffle.partitions", "2")
        .config("spark.executor.memory", "512m")  # a cluster's executors (local: unused)
        .getOrCreate()
    )
    spark.sparkContext.setLogLevel("ERROR")
    return spark


def _target_options(target: Target, name: str) -> dict[str, str]:
    """Where a target's rows go and come from, as source and sink options."""
    if target.kind == "super":
        return {"superStream": name, "superStreamPartitions": str(target.partitions)}
    return {"queue": name}


def spark_write(frame: Any, rows: int, target: Target, name: str, url: str) -> float:
    """Write ``frame`` (``rows`` rows) to the target; rows/s."""
    writer = frame.write.format("rabbitmq").option("url", url).mode("append")
    if target.kind == "super":
        writer = writer.options(**_target_options(target, name)).option("partitionKeyColumn", "key")
    else:
        writer = writer.option("routingKey", name)
    start = time.perf_counter()
    writer.save()
    return rows / (time.perf_counter() - start)


def spark_read(spark: Any, target: Target, name: str, url: str, options: Options) -> Result:
    """Read the target to its end with AvailableNow into the noop sink."""
    reader = spark.readStream.format("rabbitmq").option("url", url)
    reader = reader.options(**_target_options(target, name))
    if target.kind == "classic":
        reader = reader.option("maxMessagesPerBatch", str(options.batch))
    else:
        reader = reader.option("queueType", "stream")
        reader = reader.option("maxRecordsPerTrigger", str(options.batch))
    with tempfile.TemporaryDirectory(prefix="rabbitry-spark-bench-") as checkpoint:
        start = time.perf_counter()
        query = (
            reader.load()
            .writeStream.format("noop")
            .option("checkpointLocation", checkpoint)
            .trigger(availableNow=True)
            .start()
        )
        query.awaitTermination()
        elapsed = time.perf_counter() - start
        if query.exception() is not None:
            raise SystemExit(f"{target.label}: the read failed: {query.exception()}")
        batches = [p for p in query.recentProgress if p["numInputRows"]]
    total = sum(int(p["numInputRows"]) for p in batches)
    if total != options.rows:
        raise SystemExit(f"{target.label}: read {total:,} rows, expected {options.rows:,}")
    later = batches[1:]
    later_ms = sum(p["durationMs"]["triggerExecution"] for p in later)
    steady = sum(p["numInputRows"] for p in later) / (later_ms / 1000) if later_ms else None
    return Result(target.label, 0.0, total / elapsed, steady, len(batches))


def _declare(conn: rabbitry.Connection, target: Target, name: str) -> Any:
    """Declare the target; returns the topology that deletes it."""
    from rabbitry import Queue, Topology
    from rabbitry.topology import super_stream

    if target.kind == "super":
        topology = super_stream(name, target.partitions)
    else:
        kind = "stream" if target.kind == "stream" else "classic"
        topology = Topology(queues=[Queue(name, queue_type=kind)])
    topology.apply(conn)
    return topology


def _frame(spark: Any, rows: int, size: int) -> Any:
    """``rows`` rows: ``key`` (the id as text) and ``body`` (``size`` bytes), 2 partitions."""
    frame = (
        spark.range(rows)
        .repartition(2)
        .selectExpr(
            "CAST(id AS STRING) AS key",
            f"encode(lpad(CAST(id AS STRING), {size}, '0'), 'UTF-8') AS body",
        )
    )
    return frame.cache()


def measure(
    master: str, where: str, conn: rabbitry.Connection, url: str, options: Options, run_id: str
) -> list[Result]:
    """Warm up a session on ``master``, then write and read every target with it."""
    spark = _session(master)
    try:
        warm = Target("classic")
        warm_name = f"bench-spark.{run_id}.{where}.warmup"
        topology = _declare(conn, warm, warm_name)
        try:
            warm_frame = _frame(spark, WARMUP_ROWS, options.body_bytes).select("body")
            spark_write(warm_frame, WARMUP_ROWS, warm, warm_name, url)
            warm_options = dataclasses.replace(options, rows=WARMUP_ROWS)
            spark_read(spark, warm, warm_name, url, warm_options)
        finally:
            topology.delete(conn)
        print(f"{where}: warm-up done", flush=True)
        frame = _frame(spark, options.rows, options.body_bytes)
        frame.count()
        results = []
        for target in targets(options):
            name = f"bench-spark.{run_id}.{where}.{target.kind}{target.partitions or ''}"
            topology = _declare(conn, target, name)
            try:
                rows = frame if target.kind == "super" else frame.select("body")
                write = spark_write(rows, options.rows, target, name, url)
                result = spark_read(spark, target, name, url, options)
            finally:
                topology.delete(conn)
            result.write = write
            result.label = f"{where}: {target.label}"
            results.append(result)
            print(
                f"{result.label}: write {_rate(write)}/s, read {_rate(result.read)}/s",
                flush=True,
            )
        return results
    finally:
        spark.stop()


def run(options: Options) -> str:
    """Run everything once; returns the table."""

    import rabbitry
    from rabbitry.config import default_url

    url = options.url or default_url()
    run_id = uuid.uuid4().hex[:8]
    load_before = os.getloadavg()
    started = time.monotonic()
    with rabbitry.Connection(url, connection_name="rabbitry-spark-bench") as conn:
        version = ".".join(map(str, conn.server_version)) or "?"
        if options.remote_only:
            remote = measure_remote(conn, url, options, run_id)
            load_after = os.getloadavg()
            return "\n".join(
                [
                    _header(options, [], started, version, load_before, load_after),
                    "",
                    render_remote(remote, options.remote_ms, options.remote_master),
                ]
            )
        ref_name = f"bench-spark.{run_id}.reference"
        topology = _declare(conn, Target("classic"), ref_name)
        try:
            publish = broker_publish(conn, ref_name, options.rows, options.body_bytes)
            prefetch = min(65535, max(2 * options.batch, 1000))  # the source's default
            consume = broker_consume(conn, ref_name, options.rows, prefetch)
        finally:
            topology.delete(conn)
        reference = Result("broker: rabbitry channel API, 1 connection", publish, consume)
        print(f"reference: publish {_rate(publish)}/s, consume {_rate(consume)}/s", flush=True)

        results = measure(options.master, options.master, conn, url, options, run_id)
        where = [options.master]
        if options.cluster:
            sys.path.insert(0, str(ROOT))
            from tests.support.spark_standalone import SparkStandalone

            label = f"cluster of {options.cluster}"
            with SparkStandalone(workers=options.cluster, cores=1) as cluster:
                results += measure(cluster.master_url, label, conn, url, options, run_id)
            where.append(f"{label} ({options.cluster} standalone workers of 1 core)")
        remote = []
        if options.remote_ms > 0:
            remote = measure_remote(conn, url, options, run_id)
            where.append(f"{options.remote_master} through the proxy")
    load_after = os.getloadavg()
    header = _header(options, where, started, version, load_before, load_after)
    text = render(reference, results, header.splitlines())
    if remote:
        text += "\n\n" + render_remote(remote, options.remote_ms, options.remote_master)
    return text


def _header(
    options: Options,
    where: Sequence[str],
    started: float,
    version: str,
    load_before: tuple[float, float, float],
    load_after: tuple[float, float, float],
) -> str:
    import pyspark

    places = " then ".join(where) if where else f"{options.remote_master} through the proxy"
    return "\n".join(
        [
            f"{options.rows:,} rows of {options.body_bytes} bytes per target, "
            f"{options.batch:,} rows per micro-batch, on {places}; "
            f"{time.monotonic() - started:.0f} s in all",
            f"pyspark {pyspark.__version__}, Python {platform.python_version()}, RabbitMQ "
            f"{version}, {os.cpu_count()} CPUs; load average {load_before[0]:.1f} at the "
            f"start, {load_after[0]:.1f} at the end",
        ]
    )


def main(argv: Sequence[str] | None = None) -> int:
    """Parse the arguments, run, print the table."""
    options = parse_args(argv)
    print(run(options), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
