"""The pipeline: topology, confirmed publishing, the Spark job, retries, parking, totals."""

from __future__ import annotations

import asyncio
import math
import os
import shutil
import sys
import threading
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from rabbitry import (
    AsyncConnection,
    Binding,
    ConfigurationError,
    Connection,
    Exchange,
    OutgoingMessage,
    Properties,
    Publisher,
    Queue,
    RetryPolicy,
    Timeout,
    Topology,
    parse_urls,
)
from rabbitry.config import default_url
from rabbitry.topology import ATTEMPTS_HEADER, SuperStream

from ._events import FAULT_HEADER, RATES_TO_EUR, EventPlan, Mix, generate
from ._partitions import routing_key, super_stream_topology

if TYPE_CHECKING:
    from collections.abc import Callable, Mapping

    from pyspark.sql import Column, DataFrame, SparkSession
    from pyspark.sql.streaming.query import StreamingQuery

    from ._progress import Display

__all__ = ["Names", "PipelineConfig", "PipelineError", "Summary", "run"]

ORDER_DDL = (
    "order_id STRING, customer STRING, category STRING, amount DOUBLE, currency STRING, "
    "items INT, ts STRING, _corrupt STRING"
)
# Broker-set headers that must not be sent back: x-death is a table the broker owns
# (the Spark source hands it over as JSON text).
_BROKER_HEADERS = ("x-death", "x-first-death-", "x-last-death-")


class PipelineError(RuntimeError):
    """The pipeline could not finish: the query failed, a publish was refused, timeout."""


class InvalidOrder(ValueError):
    """A record that no retry can fix (bad JSON, a rule broken): parked at once."""

    retryable = False


class RateServiceUnavailable(ConnectionError):
    """The enrichment step's (simulated) FX rate service timed out: worth a retry."""


@dataclass(frozen=True)
class Names:
    """The broker entities of one run (all names start with ``<prefix>.<run_id>``)."""

    exchange: str
    unrouted_exchange: str
    work: str
    unrouted: str

    @classmethod
    def of(cls, prefix: str, run_id: str) -> Names:
        base = f"{prefix}.{run_id}"
        return cls(f"{base}.orders", f"{base}.unrouted", f"{base}.work", f"{base}.unrouted")


@dataclass(frozen=True)
class PipelineConfig:
    """What to run. Every field has a default that ``make demo`` uses.

    Attributes:
        url: the broker (default: ``RABBITMQ_URL`` or ``amqp://guest:guest@127.0.0.1/``).
        events: messages to publish, deliberate duplicates included.
        batch_size: ``maxMessagesPerBatch`` of the Spark source. Spark's cost per
            micro-batch is mostly fixed (about a second here), so larger batches
            raise the rate; the default is the maximum.
        mix: the share of each fault, in percent.
        seed: seed of the event generator (same seed, same events).
        output_dir: where the run's directory (``<output_dir>/<run_id>``) is created.
        run_id: names the run's broker entities and output (default: random).
        prefix: first part of every entity name.
        retry_delays: the retry tiers in seconds (a :class:`RetryPolicy`).
        max_attempts: processing attempts before a failing record is parked.
        keep_topology: leave the exchanges and queues (and the parking lot's messages)
            on the broker for inspection instead of deleting them at the end.
        progress: show progress bars and the summary table (needs ``rich``).
        timeout: seconds the whole run may take.
        master: the Spark master when the pipeline creates its own session.
        partitions: ``None`` (the default): orders go through the work queue. A number
            N >= 1: through a super stream of N partitions instead, keyed by customer
            (:mod:`orders_pipeline._partitions`).
        dedup_window: seconds a (``message_id``, attempt) pair is remembered by the
            streaming deduplication, counted from the micro-batch that first saw it
            (Spark's ``dropDuplicatesWithinWatermark`` on the processing time). A copy
            that arrives later is not dropped by the stream; the final aggregation still
            counts each order once. Bounds the query's state to the pairs of about two
            windows.
    """

    url: str = field(default_factory=default_url)
    events: int = 100_000
    batch_size: int = 30_000
    mix: Mix = field(default_factory=Mix)
    seed: int = 7
    output_dir: Path | str = Path("demo-output")
    run_id: str = field(default_factory=lambda: uuid.uuid4().hex[:8])
    prefix: str = "rabbitry.demo"
    retry_delays: tuple[float, ...] = (1.0, 3.0)
    max_attempts: int = 3
    keep_topology: bool = False
    progress: bool = True
    timeout: float = 1800.0
    master: str = "local[2]"
    partitions: int | None = None
    dedup_window: float = 600.0

    def __post_init__(self) -> None:
        def bad(name: str, rule: str) -> ConfigurationError:
            return ConfigurationError(f"{name}: {rule}, got {getattr(self, name)!r}")

        object.__setattr__(self, "output_dir", Path(self.output_dir))
        if isinstance(self.events, bool) or not isinstance(self.events, int) or self.events < 1:
            raise bad("events", "must be an integer >= 1")
        if not isinstance(self.batch_size, int) or not 1 <= self.batch_size <= 30_000:
            raise bad("batch_size", "must be an integer in 1..30000 (prefetch is twice it)")
        for name in ("malformed", "invalid", "transient", "poison", "unroutable", "duplicates"):
            share = getattr(self.mix, name)
            if not isinstance(share, int | float) or not 0 <= share <= 100:
                raise ConfigurationError(f"mix.{name}: must be a percentage, got {share!r}")
        total = sum(getattr(self.mix, n) for n in ("malformed", "invalid", "transient", "poison"))
        if total + self.mix.unroutable > 100:
            raise ConfigurationError(f"mix: the fault shares add up to more than 100 ({total})")
        if not self.run_id or not all(c.isalnum() or c in "-_" for c in self.run_id):
            raise bad("run_id", "must be letters, digits, '-' or '_'")
        if not self.prefix:
            raise bad("prefix", "must not be empty")
        if not (isinstance(self.timeout, int | float) and self.timeout > 0):
            raise bad("timeout", "must be a positive number of seconds")
        if self.partitions is not None and (
            isinstance(self.partitions, bool)
            or not isinstance(self.partitions, int)
            or self.partitions < 1
        ):
            raise bad("partitions", "must be an integer >= 1 (partitions of the super stream)")
        if (
            isinstance(self.dedup_window, bool)
            or not isinstance(self.dedup_window, int | float)
            or not 1 <= self.dedup_window <= 7 * 86_400
        ):
            raise bad("dedup_window", "must be a number of seconds in 1..604800 (a week)")
        parse_urls(self.url)  # a bad URL fails here, with the URL parser's message
        RetryPolicy(delays=self.retry_delays, max_attempts=self.max_attempts)

    @property
    def names(self) -> Names:
        return Names.of(self.prefix, self.run_id)

    @property
    def policy(self) -> RetryPolicy:
        return RetryPolicy(
            delays=self.retry_delays, max_attempts=self.max_attempts, queue=self.names.work
        )

    @property
    def run_dir(self) -> Path:
        return Path(self.output_dir) / self.run_id

    @property
    def super_stream(self) -> SuperStream | None:
        """The super stream the orders go through, when ``partitions`` is set."""
        if self.partitions is None:
            return None
        return SuperStream(self.names.exchange, self.partitions)


@dataclass
class Summary:
    """What a run did; ``ok`` is true when every message is accounted for."""

    run_id: str
    names: Names
    published: int = 0
    confirmed: int = 0
    unroutable: int = 0
    consumed: int = 0
    duplicates_dropped: int = 0
    aggregated: int = 0
    recovered: int = 0
    retried: int = 0
    parked_invalid: int = 0
    parked_failing: int = 0
    lost: int = 0
    unexpected: int = 0
    batches: int = 0
    revenue_rows: int = 0
    revenue_eur: float = 0.0
    body_bytes: int = 0
    redelivered: int = 0
    moves_published: int = 0
    publish_seconds: float = 0.0
    first_batch_seconds: float = 0.0
    batch_seconds: float = 0.0
    # The micro-batches after the first one with rows (which carries Spark's start of
    # its Python workers and code generation).
    steady_rows: int = 0
    steady_seconds: float = 0.0
    elapsed_seconds: float = 0.0
    expected_duplicates: int = 0
    output_dir: Path = Path()
    orders_path: Path = Path()
    revenue_path: Path = Path()
    parked_ids: set[str] = field(default_factory=set, repr=False)
    partitions: int | None = None  # the super stream's, when the run used one

    @property
    def parked(self) -> int:
        return self.parked_invalid + self.parked_failing

    @property
    def ok(self) -> bool:
        return (
            self.published == self.confirmed
            and self.lost == 0
            and self.unexpected == 0
            and self.duplicates_dropped == self.expected_duplicates
        )


# --------------------------------------------------------------------------- topology


def build_topology(names: Names, policy: RetryPolicy, partitions: int | None = None) -> Topology:
    """A topic exchange with an alternate exchange, the work queue and its retry tiers.

    With ``partitions``, a super stream of that many partitions replaces the exchange and
    the work queue (:func:`orders_pipeline._partitions.super_stream_topology`).
    """
    if partitions is not None:
        return super_stream_topology(names, policy, partitions)
    return Topology(
        exchanges=[
            Exchange(names.exchange, "topic", alternate_exchange=names.unrouted_exchange),
            Exchange(names.unrouted_exchange, "fanout"),
        ],
        queues=[Queue(names.work), Queue(names.unrouted)],
        bindings=[
            Binding(names.exchange, names.work, "order.created.*"),
            Binding(names.unrouted_exchange, names.unrouted),
        ],
    ).with_retry(names.work, policy)


# --------------------------------------------------------------------------- publishing


class _Publisher(threading.Thread):
    """Publishes the plan's events with confirms (asyncio API) on a thread of its own."""

    def __init__(
        self,
        url: str,
        names: Names,
        plan: EventPlan,
        display: Display,
        layout: SuperStream | None = None,
    ) -> None:
        super().__init__(name="orders-publisher", daemon=True)
        self.url, self.names, self.plan, self.display = url, names, plan, display
        self.layout = layout  # a super stream: orders go to their customer's partition
        self.confirmed = 0
        self.confirmed_unroutable = 0
        self.routed_ids: set[str] = set()  # confirmed and routed to the Spark job's source
        self.failures: list[BaseException] = []
        self.seconds = 0.0
        self.finished = threading.Event()

    def run(self) -> None:
        try:
            asyncio.run(self._publish())
        except BaseException as exc:
            self.failures.append(exc)
        finally:
            self.finished.set()

    async def _publish(self) -> None:
        started = time.perf_counter()
        events = self.plan.events
        async with AsyncConnection(self.url, connection_name="rabbitry-demo-publisher") as conn:
            publisher = await conn.publisher(max_in_flight=2000, timeout=60)
            try:
                for start in range(0, len(events), 1000):
                    chunk = events[start : start + 1000]
                    messages = [
                        OutgoingMessage(
                            event.body,
                            routing_key=(
                                event.routing_key
                                if self.layout is None
                                else routing_key(self.layout, event)
                            ),
                            properties=Properties(
                                message_id=event.message_id,
                                content_type="application/json",
                                headers={FAULT_HEADER: event.fault} if event.fault else None,
                            ),
                        )
                        for event in chunk
                    ]
                    outcomes = await publisher.publish_batch(
                        messages, exchange=self.names.exchange, persistent=True
                    )
                    for event, outcome in zip(chunk, outcomes, strict=True):
                        if outcome is None:
                            self.confirmed += 1
                            if event.kind == "unroutable":
                                self.confirmed_unroutable += 1
                            else:
                                self.routed_ids.add(event.message_id)
                        else:
                            self.failures.append(outcome)
                    self.display.published(start + len(chunk), len(events))
            finally:
                await publisher.close()
        self.seconds = time.perf_counter() - started


# --------------------------------------------------------------------------- Spark job


def _rate(currency: Column) -> Column:
    from pyspark.sql import functions as F

    (code, rate), *others = RATES_TO_EUR.items()
    expr = F.when(currency == F.lit(code), F.lit(rate))
    for code, rate in others:
        expr = expr.when(currency == F.lit(code), F.lit(rate))
    return expr  # null for any other currency


def source_options(config: PipelineConfig) -> list[dict[str, str]]:
    """Where the Spark job reads: one ``rabbitmq`` source per item, their union.

    Args:
        config: the run.

    Returns:
        The work queue's options; with a super stream, first those of every partition of
        it (the orders), then the work queue's (only the retries come back there).
    """
    work = {"queue": config.names.work, "maxMessagesPerBatch": str(config.batch_size)}
    layout = config.super_stream
    if layout is None:
        return [work]
    orders = {
        "superStream": layout.name,
        "superStreamPartitions": str(layout.partitions),
        # Offsets per micro-batch, shared by the partitions.
        "maxRecordsPerTrigger": str(config.batch_size),
    }
    return [orders, work]


@dataclass
class _Counters:
    lock: threading.Lock = field(default_factory=threading.Lock)
    rows: int = 0
    aggregated_rows: int = 0
    recovered: int = 0
    retried: int = 0
    parked_invalid: int = 0
    parked_failing: int = 0
    parked_ids: set[str] = field(default_factory=set)
    done_ids: set[str] = field(default_factory=set)  # aggregated or parked
    body_bytes: int = 0
    redelivered: int = 0
    moves_published: int = 0


@dataclass
class _Failed:
    """A failed record as :meth:`RetryPolicy.plan` reads it."""

    headers: dict[str, Any]
    exchange: str
    routing_key: str


_NO_DATA_BATCHES = "spark.sql.streaming.noDataMicroBatches.enabled"


class _Job:
    """The streaming query and its ``foreachBatch`` step (runs in the driver)."""

    def __init__(self, spark: SparkSession, config: PipelineConfig) -> None:
        self.spark = spark
        self.config = config
        self.names = config.names
        self.policy = config.policy
        self.orders_path = config.run_dir / "orders"
        self.checkpoint = config.run_dir / "checkpoint"
        self.counters = _Counters()
        self.failure: BaseException | None = None
        self.layout = config.super_stream
        self._moves_lock = threading.Lock()
        self._moves_conn: Connection | None = None
        self._moves_publisher: Publisher | None = None

    def start(self) -> StreamingQuery:
        from pyspark.sql import functions as F

        config = self.config
        first, *others = [
            self.spark.readStream.format("rabbitmq")
            .option("url", config.url)
            .options(**options)
            .option("connectionName", "rabbitry-demo-pipeline")
            .load()
            for options in source_options(config)
        ]
        raw = first
        for other in others:
            raw = raw.unionByName(other)
        attempt = F.coalesce(
            F.expr(f"try_cast(headers['{ATTEMPTS_HEADER}'] AS INT)"), F.lit(0)
        ).alias("attempt")
        # A message without an id is still kept: it is keyed by its offset, unique in its
        # queue (each partition of a super stream, and the work queue, count their own).
        where = [] if self.layout is None else [F.col("queue"), F.lit(":")]
        key = F.coalesce(
            F.col("message_id"),
            F.concat(F.lit("no-id:"), *where, F.col("offset").cast("string")),
        ).alias("message_id")
        order = F.from_json(
            F.col("body").cast("string"), ORDER_DDL, {"columnNameOfCorruptRecord": "_corrupt"}
        ).alias("o")
        # The processing time of the micro-batch (fixed per batch, and logged with it,
        # so a replayed batch gets the same), not the message's own timestamp: a
        # watermark drops rows older than it, and a message can be old (a replay from
        # the parking lot, a backlog) without being a duplicate.
        seen_at = F.current_timestamp().alias("seen_at")
        staged = raw.select(
            key,
            attempt,
            "body",
            "headers",
            "exchange",
            "routing_key",
            "redelivered",
            order,
            seen_at,
        )
        # At-least-once in, dedup here: an id seen before at the same attempt number is a
        # duplicate (a re-published copy, or a redelivery after a crash). A retried
        # record comes back with attempt + 1, so retries are not mistaken for duplicates.
        # Within a window, so the state is bounded: plain dropDuplicates keeps every
        # pair forever (about 210 bytes each, 21 MB per 100,000 messages).
        deduped = staged.withWatermark(
            "seen_at", f"{int(config.dedup_window * 1000)} milliseconds"
        ).dropDuplicatesWithinWatermark(["message_id", "attempt"])
        writer = (
            deduped.writeStream.foreachBatch(self._batch)
            .option("checkpointLocation", str(self.checkpoint))
            .queryName(f"orders_{config.run_id}")
        )
        # Each advance of the watermark would otherwise add an empty micro-batch (to
        # evict state) after every batch with rows; expired pairs are evicted by the
        # next batch with rows instead. The query copies the session's settings when it
        # starts, so the session is left as it was.
        conf = self.spark.conf
        previous = conf.get(_NO_DATA_BATCHES, None)
        conf.set(_NO_DATA_BATCHES, "false")
        try:
            return writer.start()
        finally:
            if previous is None:
                conf.unset(_NO_DATA_BATCHES)
            else:
                conf.set(_NO_DATA_BATCHES, previous)

    def _classify(self, batch: DataFrame) -> DataFrame:
        from pyspark.sql import functions as F

        o = F.col("o")
        rate = _rate(o["currency"])
        ts = F.expr("try_to_timestamp(o.ts)")
        reason = (
            F.when(o.isNull() | o["_corrupt"].isNotNull(), F.lit("malformed JSON"))
            .when(o["order_id"].isNull(), F.lit("order_id is missing"))
            .when(o["category"].isNull(), F.lit("category is missing"))
            .when(o["amount"].isNull() | (o["amount"] <= 0), F.lit("amount must be > 0"))
            .when(
                rate.isNull(),
                F.concat(F.lit("unknown currency "), F.coalesce(o["currency"], F.lit("null"))),
            )
            .when(ts.isNull(), F.lit("ts is not an ISO-8601 timestamp"))
        )
        fault = F.col("headers")[FAULT_HEADER]
        # The enrichment step (FX rate lookup) is where transient failures happen.
        status = (
            F.when(reason.isNotNull(), F.lit("invalid"))
            .when(
                (fault == F.lit("poison"))
                | ((fault == F.lit("transient")) & (F.col("attempt") == 0)),
                F.lit("transient"),
            )
            .otherwise(F.lit("ok"))
        )
        return batch.select(
            "*",
            reason.alias("reason"),
            F.coalesce(status, F.lit("ok")).alias("status"),
            (o["amount"] * rate).alias("amount_eur"),
            ts.alias("ts"),
        )

    def _batch(self, batch: DataFrame, batch_id: int) -> None:
        try:
            self._process(batch, batch_id)
        except BaseException as exc:
            self.failure = exc
            raise

    def _process(self, batch: DataFrame, batch_id: int) -> None:
        import pyarrow.compute as pc
        from pyspark.sql import functions as F

        df = self._classify(batch).persist()
        try:
            good = df.filter(F.col("status") == "ok").select(
                "message_id",
                F.col("o.order_id").alias("order_id"),
                F.col("o.customer").alias("customer"),
                F.col("o.category").alias("category"),
                F.col("o.amount").alias("amount"),
                F.col("o.currency").alias("currency"),
                F.col("o.items").alias("items"),
                "amount_eur",
                "ts",
                "attempt",
                F.lit(batch_id).alias("batch_id"),
            )
            good.write.mode("append").parquet(str(self.orders_path))
            # One job for the rest, fetched as Arrow columns rather than Row objects: the
            # status of every row (to count), and the details a move needs, null except
            # on the failed rows (a few percent), the only ones that become Python dicts.
            failing = F.col("status") != "ok"
            details = [
                F.when(failing, column).alias(name)
                for name, column in (
                    ("body", F.col("body")),
                    ("headers", F.col("headers")),
                    ("exchange", F.col("exchange")),
                    ("routing_key", F.col("routing_key")),
                    ("status", F.col("status")),
                    ("reason", F.col("reason")),
                    ("currency", F.col("o.currency")),
                )
            ]
            table = df.select(
                "message_id",
                (~failing).alias("ok"),
                "attempt",
                F.octet_length("body").alias("size"),
                F.coalesce("redelivered", F.lit(False)).alias("redelivered"),
                *details,
            ).toArrow()
            ok_rows = table.filter(table["ok"])
            done: list[str] = ok_rows["message_id"].to_pylist()
            recovered = ok_rows.filter(pc.greater(ok_rows["attempt"], 0)).num_rows
            counts = {True: recovered, False: ok_rows.num_rows - recovered}
            failed = [
                {**row, "headers": dict(row["headers"] or ())}
                for row in table.filter(pc.invert(table["ok"])).to_pylist()
            ]
            body_bytes = int(pc.sum(table["size"]).as_py() or 0)
            redelivered = table.filter(table["redelivered"]).num_rows
            moves: list[OutgoingMessage] = []
            retried = parked_invalid = parked_failing = 0
            parked: list[str] = []
            for row in failed:
                move, kind = self._move(row)
                moves.append(move)
                if kind == "retry":
                    retried += 1
                else:
                    parked.append(row["message_id"])
                    if row["status"] == "invalid":
                        parked_invalid += 1
                    else:
                        parked_failing += 1
            if moves:
                self._publish_moves(moves)
        finally:
            df.unpersist()
        c = self.counters
        with c.lock:
            c.body_bytes += body_bytes
            c.redelivered += redelivered
            # _publish_moves raised unless the broker confirmed every move (routed).
            c.moves_published += len(moves)
            c.rows += sum(counts.values()) + len(failed)
            c.aggregated_rows += sum(counts.values())
            c.recovered += counts.get(True, 0)
            c.retried += retried
            c.parked_invalid += parked_invalid
            c.parked_failing += parked_failing
            c.parked_ids.update(parked)
            c.done_ids.update(done, parked)

    def _publish_moves(self, moves: list[OutgoingMessage]) -> None:
        """Send the batch's retries and parked records to the retry hub exchange.

        They are already in the driver, so one long-lived confirmed publisher sends
        them (a Spark write would start a job and Python processes for a few hundred
        messages). ``mandatory``: a move that no queue takes comes back as a failure.
        Returns only when the broker confirmed every one; the batch (and with it the
        acknowledgement of the originals) fails otherwise.
        """
        with self._moves_lock:
            if self._moves_publisher is None:
                conn = Connection(self.config.url, connection_name="rabbitry-demo-moves")
                conn.connect()
                self._moves_conn = conn
                self._moves_publisher = conn.publisher(mandatory=True, timeout=60)
            outcomes = self._moves_publisher.publish_batch(
                moves, exchange=self.policy.names().dlx, persistent=True
            )
        refused = [outcome for outcome in outcomes if outcome is not None]
        if refused:
            raise PipelineError(
                f"{len(refused)} of {len(moves)} retry or parking move(s) were not "
                f"confirmed: {refused[0]!r}"
            )

    def close(self) -> None:
        """Close the publisher of the moves (after the query stopped)."""
        with self._moves_lock:
            conn, self._moves_conn, self._moves_publisher = self._moves_conn, None, None
        if conn is not None:
            conn.close()

    def _move(self, row: Mapping[str, Any]) -> tuple[OutgoingMessage, str]:
        headers: dict[str, Any] = {
            k: v
            for k, v in (row["headers"] or {}).items()
            if not k.startswith(_BROKER_HEADERS) and k != ATTEMPTS_HEADER
        }
        if row["attempt"]:
            headers[ATTEMPTS_HEADER] = int(row["attempt"])
        exc: BaseException
        if row["status"] == "invalid":
            exc = InvalidOrder(row["reason"])
        else:
            exc = RateServiceUnavailable(
                f"FX rate service timed out for {row['currency'] or 'unknown'} "
                f"(attempt {row['attempt'] + 1})"
            )
        message = _Failed(headers, row["exchange"] or "", row["routing_key"] or "")
        decision = self.policy.plan(message, exc)
        if decision.kind == "drop":  # pragma: no cover - the demo policy has a parking lot
            raise PipelineError("the retry policy has no parking lot")
        move = OutgoingMessage(
            bytes(row["body"]),
            routing_key=decision.routing_key,
            properties=Properties(message_id=row["message_id"], headers=dict(decision.headers)),
        )
        return move, decision.kind


# --------------------------------------------------------------------------- the run


# Spark's default log4j profile prints INFO lines and a banner on stderr before
# setLogLevel() can run; this one keeps the terminal for the progress bars.
_LOG4J2 = """\
rootLogger.level = error
rootLogger.appenderRef.stderr.ref = stderr
appender.console.type = Console
appender.console.name = stderr
appender.console.target = SYSTEM_ERR
appender.console.layout.type = PatternLayout
appender.console.layout.pattern = %d{HH:mm:ss} %p %c{1}: %m%n
"""


def _spark_session(master: str, work_dir: Path) -> SparkSession:
    log4j = work_dir / "log4j2.properties"
    log4j.write_text(_LOG4J2)
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    os.environ.setdefault("PYSPARK_DRIVER_PYTHON", sys.executable)
    os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
    from pyspark.sql import SparkSession

    spark = (
        SparkSession.builder.master(master)
        .appName("rabbitry-orders-pipeline")
        .config("spark.ui.enabled", "false")
        .config("spark.ui.showConsoleProgress", "false")
        .config("spark.driver.extraJavaOptions", f"-Dlog4j2.configurationFile={log4j.resolve()}")
        .config("spark.sql.shuffle.partitions", "2")
        .config("spark.driver.host", "127.0.0.1")
        .config("spark.sql.session.timeZone", "UTC")
        .config("spark.sql.streaming.stopTimeout", "30s")
        .getOrCreate()
    )
    spark.sparkContext.setLogLevel("ERROR")
    return spark


def _rows(progress: Mapping[int, tuple[int, float]]) -> int:
    return sum(rows for rows, _ in progress.values())


def steady_batches(progress: Mapping[int, tuple[int, float]]) -> tuple[int, float]:
    """Rows and seconds of the micro-batches with rows, leaving out the first of them.

    Args:
        progress: batch id: (input rows, seconds of its trigger).

    Returns:
        (rows, seconds); (0, 0) with fewer than two such micro-batches.
    """
    with_rows = [progress[batch] for batch in sorted(progress) if progress[batch][0]]
    return sum(rows for rows, _ in with_rows[1:]), sum(seconds for _, seconds in with_rows[1:])


def _wait(
    what: str,
    done: Callable[[], bool],
    deadline: float,
    tick: Callable[[], None],
) -> None:
    while not done():
        tick()
        if time.monotonic() > deadline:
            raise Timeout(f"orders pipeline: timed out waiting for {what}")
        time.sleep(0.25)
    tick()


def run(
    config: PipelineConfig | None = None,
    *,
    spark: SparkSession | None = None,
    display: Display | None = None,
) -> Summary:
    """Run the pipeline once and return its :class:`Summary`.

    Args:
        config: what to run (default: :class:`PipelineConfig()`, 100k events).
        spark: a SparkSession to use (default: a local one, stopped at the end).
        display: where progress goes (default: rich progress bars when
            ``config.progress``, else nothing).

    Raises:
        PipelineError: the streaming query failed or a publish was not confirmed.
        Timeout: the run took longer than ``config.timeout``.
    """
    from ._progress import make_display

    config = config or PipelineConfig()
    display = display or make_display(config.progress)
    names, policy = config.names, config.policy
    started = time.monotonic()
    deadline = started + config.timeout
    summary = Summary(config.run_id, names, partitions=config.partitions)
    plan = generate(config.events, run_id=config.run_id, seed=config.seed, mix=config.mix)
    summary.expected_duplicates = plan.duplicates
    topology = build_topology(names, policy, config.partitions)
    layout = config.super_stream
    config.run_dir.mkdir(parents=True, exist_ok=True)
    with Connection(config.url, connection_name="rabbitry-demo-admin") as admin:
        topology.apply(admin)
        retries = (
            f"retry tiers {', '.join(policy.names().retry_queues)}, parking lot "
            f"{policy.names().parking_lot!r}"
        )
        if layout is None:
            display.step(
                f"topology: exchange {names.exchange!r} (topic, alternate exchange "
                f"{names.unrouted_exchange!r}) -> {names.work!r}, {retries}"
            )
        else:
            display.step(
                f"topology: super stream {layout.name!r} ({layout.partitions} partitions "
                f"{layout.queues[0]!r} ..; alternate exchange {names.unrouted_exchange!r}), "
                f"{retries} back to {names.work!r}; Spark reads both"
            )
        own_spark = spark is None
        query: StreamingQuery | None = None
        job: _Job | None = None
        try:
            if spark is None:
                display.step(f"starting Spark ({config.master}) ...")
                spark = _spark_session(config.master, config.run_dir)
            job = _Job(spark, config)
            query = running = job.start()
            display.step(f"streaming query {query.name!r} started; publishing {len(plan.events)}")
            publisher = _Publisher(config.url, names, plan, display, layout)
            publisher.start()
            progress: dict[int, tuple[int, float]] = {}  # batch id: rows, seconds
            first_batch: list[float] = []

            def tick() -> None:
                for report in running.recentProgress:
                    rows = int(report.numInputRows)
                    if rows and not first_batch:
                        first_batch.append(time.monotonic() - started)
                    seconds = float(report.durationMs.get("triggerExecution", 0)) / 1000
                    progress[int(report.batchId)] = (rows, seconds)
                if job.failure is not None or running.exception() is not None:
                    raise PipelineError(
                        f"the streaming query failed: {job.failure or running.exception()}"
                    )
                if publisher.failures:
                    raise PipelineError(f"publishing failed: {publisher.failures[0]!r}")
                with job.counters.lock:
                    retried = job.counters.retried
                routed = publisher.confirmed - publisher.confirmed_unroutable
                display.consumed(_rows(progress), routed + retried, job.counters)

            def all_done() -> bool:
                # Every confirmed message that went to the work queue has reached its end:
                # aggregated or parked (not merely consumed: a retry is still under way).
                if not publisher.finished.is_set():
                    return False
                with job.counters.lock:
                    done = job.counters.done_ids
                    return len(done) >= len(publisher.routed_ids) and publisher.routed_ids <= done

            _wait("every message to be aggregated or parked", all_done, deadline, tick)
            # One more (empty) trigger: the source acks the last batch when Spark asks for
            # the next one, so nothing goes back to the queue when the query stops.
            query.processAllAvailable()
            query.stop()
            tick()
            display.close()
            display.step("stream done; aggregating revenue per category per minute ...")
            _finish(spark, job, plan, publisher, progress, summary, config)
            summary.first_batch_seconds = first_batch[0] if first_batch else 0.0
            summary.publish_seconds = publisher.seconds
            summary.elapsed_seconds = time.monotonic() - started
            left = admin.channel().queue_declare(names.work, passive=True).message_count
            if left:
                raise PipelineError(f"{left} message(s) left in {names.work!r} after the run")
            if layout is not None:
                _check_partitions_read(summary, layout)
        finally:
            display.close()
            if query is not None and query.isActive:
                query.stop()  # after a failure: the broker requeues what it did not ack
            if job is not None:
                job.close()
            if own_spark and spark is not None:
                spark.stop()
            if not config.keep_topology:
                topology.delete(admin)
    return summary


def _check_partitions_read(summary: Summary, layout: SuperStream) -> None:
    """A super stream keeps what was read, so no depth says whether all of it was: the
    query must have read every order routed to a partition, and every retry."""
    routed = summary.confirmed - summary.unroutable + summary.retried
    if summary.consumed < routed:
        raise PipelineError(
            f"{routed - summary.consumed} of the {routed} message(s) routed to the "
            f"partitions of {layout.name!r} and to the work queue (orders and retries) "
            "were not read"
        )


def _finish(
    spark: SparkSession,
    job: _Job,
    plan: EventPlan,
    publisher: _Publisher,
    progress: Mapping[int, tuple[int, float]],
    summary: Summary,
    config: PipelineConfig,
) -> None:
    from pyspark.sql import functions as F

    revenue_path = config.run_dir / "revenue_per_category_minute"
    orders = spark.read.parquet(str(job.orders_path))
    # A second dedup: after a driver crash a batch can be written twice (the sink is
    # append-only); the aggregate must still count each order once.
    unique = orders.dropDuplicates(["message_id"])
    revenue = (
        unique.groupBy(F.window("ts", "1 minute").start.alias("minute"), "category")
        .agg(F.sum("amount_eur").alias("revenue_eur"), F.count("*").alias("orders"))
        .orderBy("minute", "category")
    )
    revenue.write.mode("overwrite").parquet(str(revenue_path))
    totals = spark.read.parquet(str(revenue_path)).agg(
        F.count("*").alias("rows"), F.sum("revenue_eur").alias("eur")
    )
    row = totals.collect()[0]
    aggregated_ids = {r["message_id"] for r in unique.select("message_id").collect()}
    c = job.counters
    summary.published = len(plan.events)
    summary.confirmed = publisher.confirmed
    summary.unroutable = publisher.confirmed_unroutable
    summary.consumed = _rows(progress)
    summary.batches = sum(1 for rows, _ in progress.values() if rows)
    summary.batch_seconds = sum(seconds for rows, seconds in progress.values() if rows)
    summary.steady_rows, summary.steady_seconds = steady_batches(progress)
    with c.lock:
        summary.duplicates_dropped = (
            summary.consumed - c.rows + (c.aggregated_rows - len(aggregated_ids))
        )
        summary.recovered = c.recovered
        summary.retried = c.retried
        summary.parked_invalid = c.parked_invalid
        summary.parked_failing = c.parked_failing
        summary.parked_ids = set(c.parked_ids)
        summary.body_bytes = c.body_bytes
        summary.redelivered = c.redelivered
        summary.moves_published = c.moves_published
    summary.aggregated = len(aggregated_ids)
    expected_valid, expected_parked = plan.valid_ids, plan.parked_ids
    summary.lost = len(expected_valid - aggregated_ids) + len(expected_parked - summary.parked_ids)
    summary.unexpected = len(aggregated_ids - expected_valid) + len(
        summary.parked_ids - expected_parked
    )
    summary.revenue_rows = int(row["rows"])
    summary.revenue_eur = float(row["eur"] or 0.0)
    summary.output_dir = config.run_dir.resolve()
    summary.orders_path = job.orders_path.resolve()
    summary.revenue_path = revenue_path.resolve()
    if not math.isfinite(summary.revenue_eur):  # pragma: no cover - defensive
        raise PipelineError("revenue total is not finite")


def java_problem() -> str | None:
    """Why Spark cannot start here (no Java), or ``None``."""
    home = os.environ.get("JAVA_HOME")
    if home and Path(home, "bin", "java").exists():
        return None
    if shutil.which("java"):
        return None
    return (
        "Spark needs a Java runtime (17 or newer) and none was found (no `java` on PATH, "
        "no JAVA_HOME). On Debian/Ubuntu: sudo apt-get install -y openjdk-17-jre-headless"
    )
