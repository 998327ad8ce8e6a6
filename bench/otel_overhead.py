"""Client CPU per message, publishing and consuming, with and without rabbitry.observability.

Runs the same two loops once per mode, each mode in a fresh Python process (the
OpenTelemetry global providers can be set only once): a confirmed publish loop
(``AsyncPublisher``, window 1000, 64-byte bodies, to an exclusive queue capped at 1,000
messages), then an ``AsyncConsumer`` (prefetch 1000, manual acks, a handler that only
counts) draining as many messages published beforehand. The modes:

* ``off``: not instrumented (the hot paths see ``_state.active is None``);
* ``noop``: ``instrument()`` with no SDK configured (the API's no-op providers);
* ``metrics``: ``instrument(meter_provider=...)`` with an SDK meter provider (an
  in-memory reader) and no tracer provider: metrics only;
* ``sdk``: ``instrument()`` with SDK providers: a tracer provider sampling every span
  into a ``BatchSpanProcessor`` whose exporter discards them, and a meter provider with
  an in-memory reader.

CPU is ``time.process_time()`` (all threads of the process) around each loop, divided
by the message count; the median of ``--repeats`` runs is printed. Usage::

    .venv/bin/python bench/otel_overhead.py                # all modes, 20,000 messages
    .venv/bin/python bench/otel_overhead.py --messages 5000 --repeats 1 --modes off,sdk
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import subprocess
import sys
import time
from typing import Any

MODES = ("off", "noop", "metrics", "sdk")


def configure(mode: str) -> Any:
    """Set up ``mode``; returns what must stay alive (the providers)."""
    from rabbitry import observability

    if mode == "off":
        return None
    if mode == "noop":
        observability.instrument()
        return None
    from opentelemetry.sdk.metrics import MeterProvider
    from opentelemetry.sdk.metrics.export import InMemoryMetricReader
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import BatchSpanProcessor, SpanExporter, SpanExportResult

    class Discard(SpanExporter):
        def export(self, spans: Any) -> SpanExportResult:
            return SpanExportResult.SUCCESS

    meter_provider = MeterProvider(metric_readers=[InMemoryMetricReader()])
    if mode == "metrics":
        observability.instrument(meter_provider=meter_provider)
        return (meter_provider,)
    tracer_provider = TracerProvider()
    tracer_provider.add_span_processor(BatchSpanProcessor(Discard()))
    observability.instrument(tracer_provider, meter_provider)
    return tracer_provider, meter_provider


async def publish_loop(url: str, messages: int) -> float:
    import rabbitry

    body = b"x" * 64
    async with rabbitry.AsyncConnection(url) as conn:
        channel = await conn.channel()
        ok = await channel.queue_declare(
            "", exclusive=True, arguments={"x-max-length": 1000, "x-overflow": "drop-head"}
        )
        async with await conn.publisher(max_in_flight=1000) as publisher:
            for _ in range(2000):  # warm-up: caches, the SDK's first spans
                await publisher.send(body, routing_key=ok.queue)
            await publisher.wait_for_confirms()
            start = time.process_time()
            for _ in range(messages):
                await publisher.send(body, routing_key=ok.queue)
            await publisher.wait_for_confirms()
            return (time.process_time() - start) / messages


async def consume_loop(url: str, messages: int) -> float:
    """Client CPU per message of an ``AsyncConsumer`` (prefetch 1000, a handler that
    only counts, manual acks) draining ``messages`` published beforehand."""
    import rabbitry

    async with rabbitry.AsyncConnection(url) as conn:
        channel = await conn.channel()
        ok = await channel.queue_declare("", exclusive=True)
        async with await conn.publisher(max_in_flight=1000) as publisher:
            await publisher.publish_batch([b"x" * 64] * messages, routing_key=ok.queue)
        done = asyncio.Event()
        seen = 0

        async def handler(message: rabbitry.Message) -> None:
            nonlocal seen
            seen += 1
            if seen == messages:
                done.set()

        consumer = conn.consumer(ok.queue, handler, prefetch=1000)
        start = time.process_time()
        async with consumer:
            await done.wait()
        return (time.process_time() - start) / messages


def child(mode: str, url: str, messages: int) -> None:
    keep = configure(mode)
    publish = asyncio.run(publish_loop(url, messages))
    consume = asyncio.run(consume_loop(url, messages))
    if keep is not None:
        for provider in keep:
            provider.shutdown()
    print(json.dumps({"publish": publish * 1e6, "consume": consume * 1e6}))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--url", default=os.environ.get("RABBITMQ_URL", "amqp://guest:guest@127.0.0.1:5672/")
    )
    parser.add_argument("--messages", type=int, default=20_000)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--modes", default=",".join(MODES))
    parser.add_argument("--child", choices=MODES, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        child(args.child, args.url, args.messages)
        return
    results: dict[tuple[str, str], list[float]] = {}
    modes = args.modes.split(",")
    for _ in range(args.repeats):
        for mode in modes:  # interleaved, so a busy moment hurts every mode alike
            out = subprocess.run(
                [sys.executable, __file__, "--child", mode, "--url", args.url,
                 "--messages", str(args.messages)],
                check=True, capture_output=True, text=True,
            )  # fmt: skip
            for loop, value in json.loads(out.stdout).items():
                results.setdefault((loop, mode), []).append(value)
    print(f"{'loop':8} {'mode':8} {'CPU µs/msg (median)':>20} {'runs':>30} {'vs off':>8}")
    for loop in ("publish", "consume"):
        base = results.get((loop, "off"))
        for mode in modes:
            values = results[(loop, mode)]
            median = statistics.median(values)
            runs = ", ".join(f"{v:.1f}" for v in values)
            ratio = f"{median / statistics.median(base):.2f}×" if base else ""
            print(f"{loop:8} {mode:8} {median:20.1f} {runs:>30} {ratio:>8}")


if __name__ == "__main__":
    main()
