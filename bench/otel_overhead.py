"""Client CPU per confirmed publish with and without rabbitry.observability.

Runs the same confirmed publish loop (``AsyncPublisher``, window 1000, 64-byte bodies,
to an exclusive queue capped at 1,000 messages) once per mode, each mode in a fresh
Python process (the OpenTelemetry global providers can be set only once):

* ``off``: not instrumented (the hot paths see ``_state.active is None``);
* ``noop``: ``instrument()`` with no SDK configured (the API's no-op providers);
* ``metrics``: ``instrument(meter_provider=...)`` with an SDK meter provider (an
  in-memory reader) and no tracer provider: metrics only;
* ``sdk``: ``instrument()`` with SDK providers: a tracer provider sampling every span
  into a ``BatchSpanProcessor`` whose exporter discards them, and a meter provider with
  an in-memory reader.

CPU is ``time.process_time()`` (all threads of the process) around the loop, divided by
the message count; the median of ``--repeats`` runs is printed. Usage::

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
                await publisher.publish(body, routing_key=ok.queue)
            await publisher.wait_for_confirms()
            start = time.process_time()
            for _ in range(messages):
                await publisher.publish(body, routing_key=ok.queue)
            await publisher.wait_for_confirms()
            return (time.process_time() - start) / messages


def child(mode: str, url: str, messages: int) -> None:
    keep = configure(mode)
    per_message = asyncio.run(publish_loop(url, messages))
    if keep is not None:
        for provider in keep:
            provider.shutdown()
    print(json.dumps({"mode": mode, "us_per_message": per_message * 1e6}))


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
    results: dict[str, list[float]] = {}
    modes = args.modes.split(",")
    for _ in range(args.repeats):
        for mode in modes:  # interleaved, so a busy moment hurts every mode alike
            out = subprocess.run(
                [sys.executable, __file__, "--child", mode, "--url", args.url,
                 "--messages", str(args.messages)],
                check=True, capture_output=True, text=True,
            )  # fmt: skip
            results.setdefault(mode, []).append(json.loads(out.stdout)["us_per_message"])
    base = statistics.median(results["off"]) if "off" in results else None
    print(f"{'mode':6} {'CPU µs/msg (median)':>20} {'runs':>30} {'vs off':>8}")
    for mode in modes:
        median = statistics.median(results[mode])
        runs = ", ".join(f"{v:.1f}" for v in results[mode])
        ratio = f"{median / base:.2f}×" if base else ""
        print(f"{mode:6} {median:20.1f} {runs:>30} {ratio:>8}")


if __name__ == "__main__":
    main()
