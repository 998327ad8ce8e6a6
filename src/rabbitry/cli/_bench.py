"""``rabbitry bench``: publish/consume throughput and latency, in the spirit of PerfTest.

One connection publishes ``--count`` messages of ``--size`` bytes with confirms to a
fresh server-named, exclusive queue while a consumer on the same connection drains it.
Each message carries its send time (``perf_counter_ns``) in a header; the consumer
computes the end-to-end latency. The queue is deleted at the end (and, being exclusive,
by the broker if the process dies).
"""

from __future__ import annotations

import math
import threading
import time
from typing import TYPE_CHECKING, Any

import click

from ..exceptions import AMQPError
from ..protocol.frames import Int64
from ..protocol.spec import BasicProperties
from ._common import fail, get_state, handle_errors, progress

if TYPE_CHECKING:
    import concurrent.futures

    from ..message import Message

__all__ = ["bench", "percentile"]

_TS_HEADER = "x-rabbitry-bench-sent-ns"


def percentile(sorted_values: list[float], pct: float) -> float:
    """Nearest-rank percentile of already sorted values (0.0 when empty)."""
    if not sorted_values:
        return 0.0
    rank = max(1, math.ceil(pct / 100.0 * len(sorted_values)))
    return sorted_values[min(rank, len(sorted_values)) - 1]


@click.command()
@click.option(
    "-n", "--count", type=click.IntRange(min=1), default=10_000, show_default=True,
    help="Messages to publish and consume.",
)  # fmt: skip
@click.option(
    "-s", "--size", type=click.IntRange(min=0, max=128 * 1024 * 1024), default=1024,
    show_default=True, help="Body size in bytes.",
)  # fmt: skip
@click.option(
    "--max-in-flight", type=click.IntRange(min=1), default=1000, show_default=True,
    help="Unconfirmed publishes allowed at once.",
)  # fmt: skip
@click.option(
    "--prefetch", type=click.IntRange(min=1, max=65535), default=1000, show_default=True,
    help="Consumer prefetch.",
)  # fmt: skip
@click.option("--persistent/--transient", default=False, show_default=True)
@handle_errors
def bench(count: int, size: int, max_in_flight: int, prefetch: int, persistent: bool) -> None:
    """Measure publish and consume throughput (msgs/s) and latency percentiles."""
    state = get_state()
    body = b"x" * size
    latencies: list[float] = []
    lock = threading.Lock()
    finished = threading.Event()
    times: dict[str, float] = {}
    conn = state.connect()
    queue = ""
    try:
        admin = conn.channel(timeout=state.timeout)
        queue = admin.queue_declare(
            "", exclusive=True, auto_delete=True, timeout=state.timeout
        ).queue
        consumer_channel = conn.channel(timeout=state.timeout)
        consumer_channel.basic_qos(prefetch, timeout=state.timeout)
        ack_every = max(1, prefetch // 4)

        def on_message(message: Message) -> None:
            now = time.perf_counter_ns()
            sent = message.headers.get(_TS_HEADER)
            with lock:
                if isinstance(sent, int):
                    latencies.append((now - sent) / 1e6)
                received = len(latencies)
                if received == 1:
                    times["first"] = time.perf_counter()
                done = received >= count
                if done:
                    times["last"] = time.perf_counter()
            if done or received % ack_every == 0:
                message.ack(multiple=True)
            if done:
                finished.set()

        tag = consumer_channel.basic_consume(queue, on_message, timeout=state.timeout)
        futures: list[concurrent.futures.Future[None]] = []
        with conn.publisher(
            confirm=True, max_in_flight=max_in_flight, timeout=state.timeout
        ) as publisher:
            started = time.perf_counter()
            with progress(state, count, "bench: publishing") as advance:
                for _ in range(count):
                    props = BasicProperties(headers={_TS_HEADER: Int64(time.perf_counter_ns())})
                    futures.append(
                        publisher.publish(
                            body, routing_key=queue, properties=props, persistent=persistent
                        )
                    )
                    advance(1)
                publisher.wait_for_confirms(timeout=max(state.timeout, count / 1000))
            confirmed_at = time.perf_counter()
        failed = sum(1 for f in futures if f.exception() is not None)
        if not finished.wait(timeout=max(state.timeout, count / 1000)):
            with lock:
                got = len(latencies)
            fail(f"consumed only {got} of {count} messages in time")
        try:
            consumer_channel.basic_cancel(tag, timeout=state.timeout)
        except AMQPError:
            pass
    finally:
        if queue:
            try:
                conn.channel(timeout=state.timeout).queue_delete(queue, timeout=state.timeout)
            except AMQPError:
                pass  # exclusive: the broker deletes it with the connection anyway
        conn.close()
    publish_seconds = confirmed_at - started
    consume_seconds = times["last"] - started
    ordered = sorted(latencies)
    result: dict[str, Any] = {
        "count": count,
        "size": size,
        "queue": queue,
        "publish_failed": failed,
        "publish_rate": round(count / publish_seconds, 1) if publish_seconds else None,
        "consume_rate": round(count / consume_seconds, 1) if consume_seconds else None,
        "latency_ms": {
            "min": round(ordered[0], 3) if ordered else None,
            "p50": round(percentile(ordered, 50), 3),
            "p95": round(percentile(ordered, 95), 3),
            "p99": round(percentile(ordered, 99), 3),
            "max": round(ordered[-1], 3) if ordered else None,
        },
        "seconds": round(consume_seconds, 3),
    }
    if state.json:
        state.emit_json(result)
    elif not state.quiet:
        from rich.table import Table

        table = Table(title=f"bench: {count} messages of {size} bytes")
        table.add_column("metric")
        table.add_column("value", justify="right")
        table.add_row("publish (confirmed) msgs/s", f"{result['publish_rate']:,}")
        table.add_row("consume msgs/s", f"{result['consume_rate']:,}")
        for key in ("p50", "p95", "p99", "max"):
            table.add_row(f"latency {key} ms", f"{result['latency_ms'][key]}")
        table.add_row("publish failures", str(failed))
        state.out.print(table)
    if failed:
        fail(f"{failed} of {count} publishes were not confirmed")
