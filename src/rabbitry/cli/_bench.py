"""``rabbitry bench``: publish/consume throughput and latency, in the spirit of PerfTest.

``--producers`` threads publish with confirms (each on a publisher of its own) to
``--queues`` fresh server-named, exclusive queues, round robin, while ``--consumers``
consumers (a channel each, manual acks) drain them; producer ``i`` and consumer ``i``
use queue ``i % queues``. The run publishes ``--count`` messages in all, or publishes for
``--duration`` seconds; ``--rate`` caps the total publish rate. Each message carries its
send time (``perf_counter_ns``) in a header; consumers compute the end-to-end latency.
Every ``--interval`` seconds a progress line shows the rates and latencies of the last
interval; a summary ends the run. The queues are deleted at the end (and, exclusive, by
the broker if the process dies).

``-u/--queue NAME`` (PerfTest's option) runs on one named queue instead: used as it is
when it exists (and left there), else declared durable and deleted at the end.
``--quorum-queue`` makes the queues it declares quorum queues (durable, not exclusive:
named ``rabbitry-bench-<random>-<i>`` when no ``--queue`` is given; deleted at the end,
but left behind if the process dies).
"""

from __future__ import annotations

import array
import math
import threading
import time
import uuid
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import click

from ..exceptions import AMQPError, NotFound
from ..protocol.frames import Int64
from ..protocol.spec import BasicProperties
from ._common import fail, get_state, handle_errors
from ._metrics import CommandMetrics, metrics_option, print_metrics

if TYPE_CHECKING:
    from ..message import Message
    from ..sync.connection import Connection
    from ._common import State

__all__ = ["bench", "percentile"]

_TS_HEADER = "x-rabbitry-bench-sent-ns"


def percentile(sorted_values: list[float], pct: float) -> float:
    """Nearest-rank percentile of already sorted values (0.0 when empty)."""
    if not sorted_values:
        return 0.0
    rank = max(1, math.ceil(pct / 100.0 * len(sorted_values)))
    return sorted_values[min(rank, len(sorted_values)) - 1]


@dataclass
class _Counters:
    """Shared by the producer, consumer and reporter threads (under ``lock``)."""

    lock: threading.Lock = field(default_factory=threading.Lock)
    sent: int = 0
    confirmed: int = 0
    failed: int = 0
    received: int = 0
    latencies: array.array[float] = field(default_factory=lambda: array.array("d"))
    first_error: BaseException | None = None


@click.command()
@click.option(
    "-n", "--count", type=click.IntRange(min=1), default=None,
    help="Messages to publish in all (default 10000; not with --duration).",
)  # fmt: skip
@click.option(
    "-d", "--duration", type=click.FloatRange(min=0.1), default=None,
    help="Publish for this many seconds instead of a --count.",
)  # fmt: skip
@click.option(
    "-s", "--size", type=click.IntRange(min=0, max=128 * 1024 * 1024), default=1024,
    show_default=True, help="Body size in bytes.",
)  # fmt: skip
@click.option(
    "--producers", type=click.IntRange(min=1, max=256), default=1, show_default=True,
    help="Publishing threads, each with its own channel.",
)  # fmt: skip
@click.option(
    "--consumers", type=click.IntRange(min=1, max=256), default=1, show_default=True,
    help="Consumers, each on its own channel.",
)  # fmt: skip
@click.option(
    "--queues", type=click.IntRange(min=1, max=256), default=1, show_default=True,
    help="Queues; producers and consumers are spread over them round robin.",
)  # fmt: skip
@click.option(
    "-r", "--rate", type=click.FloatRange(min=0.001), default=None,
    help="At most this many messages/s in all (default: as fast as confirms allow).",
)  # fmt: skip
@click.option(
    "--interval", type=click.FloatRange(min=0.1), default=1.0, show_default=True,
    help="Seconds between progress lines (none with --json or --quiet).",
)  # fmt: skip
@click.option(
    "--max-in-flight", type=click.IntRange(min=1), default=1000, show_default=True,
    help="Unconfirmed publishes allowed at once, per producer.",
)  # fmt: skip
@click.option(
    "--prefetch", type=click.IntRange(min=1, max=65535), default=1000, show_default=True,
    help="Prefetch per consumer.",
)  # fmt: skip
@click.option(
    "-u", "--queue", "queue_name", default=None,
    help="Use this named queue (PerfTest's -u): as it is when it exists, else declared "
    "durable and deleted at the end. Only with --queues 1.",
)  # fmt: skip
@click.option(
    "--quorum-queue", is_flag=True, default=False,
    help="Declare quorum queues (x-queue-type=quorum; durable, not exclusive).",
)  # fmt: skip
@click.option("--persistent/--transient", default=False, show_default=True)
@metrics_option
@handle_errors
def bench(
    count: int | None,
    duration: float | None,
    size: int,
    producers: int,
    consumers: int,
    queues: int,
    rate: float | None,
    interval: float,
    max_in_flight: int,
    prefetch: int,
    queue_name: str | None,
    quorum_queue: bool,
    persistent: bool,
    metrics: bool,
) -> None:
    """Measure publish and consume throughput (msgs/s) and latency percentiles."""
    if count is not None and duration is not None:
        raise click.UsageError("give --count or --duration, not both")
    if queue_name is not None and queues != 1:
        raise click.UsageError(f"--queue names one queue; --queues is {queues}, give 1")
    if queue_name == "":
        raise click.UsageError("--queue: the name must not be empty")
    if count is None and duration is None:
        count = 10_000
    state = get_state()
    counters = _Counters()
    recorder = CommandMetrics() if metrics else None
    try:
        conn = state.connect()
    except BaseException:
        if recorder is not None:
            recorder.close()
        raise
    names: list[str] = []
    created: list[str] = []
    try:
        admin = conn.channel(timeout=state.timeout)
        prefix = f"rabbitry-bench-{uuid.uuid4().hex[:8]}"
        for index in range(queues):
            if queue_name is not None:
                probe = conn.channel(timeout=state.timeout)
                try:
                    probe.queue_declare(queue_name, passive=True, timeout=state.timeout)
                    probe.close()
                    names.append(queue_name)
                    continue
                except NotFound:
                    pass
            if queue_name is None and not quorum_queue:
                declared = admin.queue_declare(
                    "", exclusive=True, auto_delete=True, timeout=state.timeout
                )
            else:
                declared = admin.queue_declare(
                    queue_name or f"{prefix}-{index}",
                    durable=True,
                    arguments={"x-queue-type": "quorum"} if quorum_queue else None,
                    timeout=state.timeout,
                )
            names.append(declared.queue)
            created.append(declared.queue)
        result = _run(
            state, conn, counters, names,
            count=count, duration=duration, size=size, producers=producers,
            consumers=consumers, rate=rate, interval=interval,
            max_in_flight=max_in_flight, prefetch=prefetch, persistent=persistent,
        )  # fmt: skip
    finally:
        for name in created:
            try:
                conn.channel(timeout=state.timeout).queue_delete(name, timeout=state.timeout)
            except AMQPError:
                pass  # exclusive: the broker deletes it with the connection anyway
        conn.close()
        points = recorder.collect() if recorder is not None else None
        if recorder is not None:
            recorder.close()
    if points is not None:
        result["metrics"] = points
    _report(state, result)
    if points is not None:
        print_metrics(state, points)
    if result["publish_failed"]:
        reason = f": {counters.first_error!r}" if counters.first_error else ""
        fail(f"{result['publish_failed']} of {result['published']} publishes failed{reason}")
    if result["consumed"] < result["published"] - result["publish_failed"]:
        fail(f"consumed only {result['consumed']} of {result['published']} messages in time")


def _run(
    state: State,
    conn: Connection,
    counters: _Counters,
    names: list[str],
    *,
    count: int | None,
    duration: float | None,
    size: int,
    producers: int,
    consumers: int,
    rate: float | None,
    interval: float,
    max_in_flight: int,
    prefetch: int,
    persistent: bool,
) -> dict[str, Any]:
    body = b"x" * size
    ack_every = max(1, prefetch // 4)
    all_in = threading.Event()  # every published message was received
    publishing_done = threading.Event()
    first_received: list[float] = []
    last_received: list[float] = []

    unacked: dict[int, Message] = {}  # consumer index -> its last delivery not acked yet

    def consumer(index: int) -> Any:
        taken = 0

        def on_message(message: Message) -> None:
            nonlocal taken
            now = time.perf_counter_ns()
            sent = message.headers.get(_TS_HEADER)
            with counters.lock:
                if all_in.is_set():
                    return  # the run is over: stray redeliveries are not counted
                if isinstance(sent, int):
                    counters.latencies.append((now - sent) / 1e6)
                counters.received += 1
                if counters.received == 1:
                    first_received.append(time.perf_counter())
                last_received[:] = [time.perf_counter()]
                done = publishing_done.is_set() and counters.received >= counters.confirmed
                taken += 1
                if taken % ack_every == 0:
                    unacked.pop(index, None)
                    message.ack(multiple=True)  # this consumer's channel: every earlier one
                else:
                    unacked[index] = message
            if done:
                all_in.set()

        return on_message

    channels = []
    for index in range(consumers):
        channel = conn.channel(timeout=state.timeout)
        channel.basic_qos(prefetch, timeout=state.timeout)
        queue = names[index % len(names)]
        channel.basic_consume(queue, consumer(index), timeout=state.timeout)
        channels.append(channel)

    total = count or 0
    share = [total // producers + (1 if i < total % producers else 0) for i in range(producers)]
    per_producer_rate = rate / producers if rate else None
    started = time.perf_counter()
    deadline = started + duration if duration is not None else None
    threads = []
    for i in range(producers):
        work = (conn, counters, names[i % len(names)], body, share[i], deadline,
                per_producer_rate, max_in_flight, persistent, state.timeout)  # fmt: skip
        threads.append(
            threading.Thread(
                target=_produce, args=work, name=f"rabbitry-bench-producer-{i}", daemon=True
            )
        )
    for thread in threads:
        thread.start()
    reporter_stop = threading.Event()
    reporter = None
    if not state.json and not state.quiet:
        reporter = threading.Thread(
            target=_report_progress, args=(state, counters, started, interval, reporter_stop),
            name="rabbitry-bench-progress", daemon=True,
        )  # fmt: skip
        reporter.start()
    for thread in threads:
        thread.join()
    publish_seconds = time.perf_counter() - started
    with counters.lock:
        publishing_done.set()
        if counters.received >= counters.confirmed:
            all_in.set()
    all_in.wait(timeout=max(state.timeout, counters.confirmed / 1000))
    reporter_stop.set()
    if reporter is not None:
        reporter.join()
    with counters.lock:
        all_in.set()  # also after a timeout: nothing more is counted
        last = list(unacked.values())
    for message in last:  # settle what is left, so closing requeues nothing
        try:
            message.ack(multiple=True)
        except AMQPError:
            pass
    for channel in channels:
        try:
            channel.close(timeout=state.timeout)
        except AMQPError:
            pass
    with counters.lock:
        ordered = sorted(counters.latencies)
        received, sent, failed = counters.received, counters.sent, counters.failed
    consume_seconds = (last_received[0] if last_received else time.perf_counter()) - started
    return {
        "count": sent,
        "published": sent,
        "consumed": received,
        "size": size,
        "producers": producers,
        "consumers": consumers,
        "queue": names[0],
        "queues": list(names),
        "rate_limit": rate,
        "publish_failed": failed,
        "publish_rate": round(sent / publish_seconds, 1) if publish_seconds else None,
        "consume_rate": round(received / consume_seconds, 1) if consume_seconds > 0 else None,
        "latency_ms": _latency(ordered),
        "seconds": round(max(consume_seconds, publish_seconds), 3),
    }


def _produce(
    conn: Connection,
    counters: _Counters,
    queue: str,
    body: bytes,
    count: int,
    deadline: float | None,
    rate: float | None,
    max_in_flight: int,
    persistent: bool,
    timeout: float,
) -> None:
    def settled(future: Any) -> None:
        exc = future.exception()
        with counters.lock:
            if exc is None:
                counters.confirmed += 1
            else:
                counters.failed += 1
                counters.first_error = counters.first_error or exc

    try:
        with conn.publisher(confirm=True, max_in_flight=max_in_flight, timeout=timeout) as pub:
            started = time.perf_counter()
            index = 0
            while (index < count) if deadline is None else (time.perf_counter() < deadline):
                if rate is not None:
                    delay = started + index / rate - time.perf_counter()
                    if delay > 0:
                        time.sleep(delay)
                props = BasicProperties(headers={_TS_HEADER: Int64(time.perf_counter_ns())})
                future = pub.publish(
                    body, routing_key=queue, properties=props, persistent=persistent
                )
                with counters.lock:
                    counters.sent += 1
                future.add_done_callback(settled)
                index += 1
            pub.wait_for_confirms(timeout=max(timeout, index / 1000))
    except AMQPError as exc:
        with counters.lock:
            counters.first_error = counters.first_error or exc


def _latency(ordered: list[float]) -> dict[str, float | None]:
    return {
        "min": round(ordered[0], 3) if ordered else None,
        "p50": round(percentile(ordered, 50), 3),
        "p95": round(percentile(ordered, 95), 3),
        "p99": round(percentile(ordered, 99), 3),
        "max": round(ordered[-1], 3) if ordered else None,
    }


def _report_progress(
    state: State, counters: _Counters, started: float, interval: float, stop: threading.Event
) -> None:
    """A line per interval: what happened in it (rates, latency of its deliveries)."""
    last_sent = last_received = seen = 0
    last = started
    while not stop.wait(interval):
        now = time.perf_counter()
        with counters.lock:
            sent, received, confirmed = counters.sent, counters.received, counters.confirmed
            window = sorted(counters.latencies[seen:])
            seen = len(counters.latencies)
        span = now - last
        state.info(
            f"time {now - started:6.1f} s  sent {(sent - last_sent) / span:9,.0f} msg/s  "
            f"received {(received - last_received) / span:9,.0f} msg/s  "
            f"confirmed {confirmed:,}  latency p50 {percentile(window, 50):.2f} "
            f"p99 {percentile(window, 99):.2f} ms"
        )
        last, last_sent, last_received = now, sent, received


def _report(state: State, result: dict[str, Any]) -> None:
    if state.json:
        state.emit_json(result)
        return
    if state.quiet:
        return
    from rich.table import Table

    title = (
        f"bench: {result['published']:,} messages of {result['size']} bytes, "
        f"{result['producers']} producer(s), {result['consumers']} consumer(s), "
        f"{len(result['queues'])} queue(s)"
    )
    table = Table(title=title)
    table.add_column("metric")
    table.add_column("value", justify="right")
    table.add_row("publish (confirmed) msgs/s", f"{result['publish_rate']:,}")
    table.add_row("consume msgs/s", f"{result['consume_rate']:,}")
    for key in ("p50", "p95", "p99", "max"):
        table.add_row(f"latency {key} ms", f"{result['latency_ms'][key]}")
    table.add_row("publish failures", str(result["publish_failed"]))
    table.add_row("seconds", str(result["seconds"]))
    state.out.print(table)
