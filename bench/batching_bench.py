"""Micro-batching vs plain confirmed publishing, measured in the same run.

Usage (from the repository root, broker on 127.0.0.1:5672 or $RABBITMQ_URL)::

    PYTHONPATH=src .venv/bin/python bench/batching_bench.py [--records 40000]
        [--size 128] [--repeats 3] [--api async|sync|both]

Rows, each to a fresh queue (deleted afterwards), every record confirmed by the broker
before the timer stops:

- ``plain``: ``publish`` per record (``AsyncPublisher``/``Publisher``, window 1000),
  then ``wait_for_confirms``.
- ``batch 10`` / ``batch 100``: ``AsyncBatchingPublisher``/``BatchingPublisher`` with
  ``batch_records`` 10 / 100 (one future per record), then ``wait_for_confirms``.

Prints records/s, client CPU µs per record (process time of this process, IO thread
included for the sync API), envelopes/s and the ratio to ``plain`` of the same API; the
median of ``--repeats`` runs, rows interleaved in each repeat.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import sys
import time
import uuid

import rabbitry
from rabbitry import AsyncBatchingPublisher, AsyncConnection, BatchingPublisher

ROWS = (("plain", 0), ("batch 10", 10), ("batch 100", 100))


async def run_async(url: str, batch: int, records: int, body: bytes) -> tuple[float, float]:
    queue = f"bench-batching-{uuid.uuid4().hex[:8]}"
    async with AsyncConnection(url) as conn:
        channel = await conn.channel()
        await channel.queue_declare(queue, durable=False)
        publisher = await conn.publisher(max_in_flight=1000)
        try:
            started, cpu = time.perf_counter(), time.process_time()
            if batch == 0:
                for _ in range(records):
                    await publisher.send(body, routing_key=queue)
                await publisher.wait_for_confirms(timeout=120)
            else:
                batching = AsyncBatchingPublisher(publisher, batch_records=batch, linger=0.01)
                for _ in range(records):
                    await batching.publish(body, routing_key=queue)
                await batching.wait_for_confirms(timeout=120)
            elapsed, used = time.perf_counter() - started, time.process_time() - cpu
        finally:
            await publisher.close()
            await channel.queue_delete(queue)
    return elapsed, used


def run_sync(url: str, batch: int, records: int, body: bytes) -> tuple[float, float]:
    queue = f"bench-batching-{uuid.uuid4().hex[:8]}"
    with rabbitry.Connection(url) as conn:
        channel = conn.channel()
        channel.queue_declare(queue, durable=False)
        try:
            with conn.publisher(max_in_flight=1000) as publisher:
                started, cpu = time.perf_counter(), time.process_time()
                if batch == 0:
                    for _ in range(records):
                        publisher.publish(body, routing_key=queue)
                    publisher.wait_for_confirms(timeout=120)
                else:
                    with BatchingPublisher(publisher, batch_records=batch, linger=0.01) as batching:
                        for _ in range(records):
                            batching.publish(body, routing_key=queue)
                        batching.wait_for_confirms(timeout=120)
                elapsed, used = time.perf_counter() - started, time.process_time() - cpu
        finally:
            channel.queue_delete(queue)
    return elapsed, used


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--records", type=int, default=40_000)
    parser.add_argument("--size", type=int, default=128)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--api", choices=["async", "sync", "both"], default="both")
    args = parser.parse_args()
    url = os.environ.get("RABBITMQ_URL", "amqp://guest:guest@127.0.0.1:5672/")
    body = b"x" * args.size
    apis = ["async", "sync"] if args.api == "both" else [args.api]
    samples: dict[tuple[str, str], list[tuple[float, float]]] = {}
    for _ in range(args.repeats):
        for api in apis:
            for name, batch in ROWS:
                if api == "async":
                    result = asyncio.run(run_async(url, batch, args.records, body))
                else:
                    result = run_sync(url, batch, args.records, body)
                samples.setdefault((api, name), []).append(result)
    print(
        f"{args.records} records of {args.size} bytes, confirms on, median of {args.repeats}; "
        f"{os.cpu_count()} cores, load average {os.getloadavg()[0]:.1f}"
    )
    print("| API | row | records/s | client CPU µs/record | envelopes/s | × plain |")
    print("|---|---|---:|---:|---:|---:|")
    for api in apis:
        base = None
        for name, batch in ROWS:
            runs = samples[(api, name)]
            elapsed = statistics.median(r[0] for r in runs)
            cpu = statistics.median(r[1] for r in runs)
            rate = args.records / elapsed
            base = base or rate
            envelopes = rate / batch if batch else rate
            print(
                f"| {api} | {name} | {rate:,.0f} | {cpu / args.records * 1e6:.2f} | "
                f"{envelopes:,.0f} | {rate / base:.1f} |"
            )
    return 0


if __name__ == "__main__":
    sys.exit(main())
